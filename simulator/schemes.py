"""The paper's scheme comparison (Table 3): Schemes A, B, C over |T| = 1..8, IID and non-IID, seeds.

Each (setting, seed) builds its data once; for each |T| the three schemes then run on the
same data, initial model, trace assignment and s draws, so "B over A" and "C over B" are
paired comparisons. Every finished run is written to the work folder at once (per-round
CSV + JSON summary), so an interrupted comparison resumes where it stopped.
"""

from __future__ import annotations

import csv
import json
import logging
import multiprocessing as mp
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flexfl.config import to_dict
from simulator.engine import SimConfig, load_data, records_as_rows, run_simulation
from simulator.paper import SETTINGS
from simulator.report import plot_accuracy_curves, table3_cells, table3_markdown, write_csv_atomic
from trace_recorder.format import read_trace_set

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Job:
    """One (setting, seed, |T|) group: the three schemes share its data."""

    setting: str
    seed: int
    num_traces: int
    schemes: tuple[str, ...]
    base: SimConfig


def _run_name(setting: str, num_traces: int, seed: int, scheme: str) -> str:
    return f"{setting}_T{num_traces}_seed{seed}_{scheme}"


def cell_config(base: SimConfig, *, setting: str, seed: int, num_traces: int, scheme: str | None = None) -> SimConfig:
    """The config of one run of the grid: the setting's data, the seed (data and model), |T|, the scheme."""
    setting_fields = SETTINGS[str(base.partition.dataset)][setting]
    return replace(base, seed=seed, partition=replace(base.partition, seed=seed, **setting_fields),
                   traces=replace(base.traces, num_traces=num_traces),
                   rules=replace(base.rules, scheme=scheme) if scheme else base.rules)


def _done(work_dir: Path, name: str, cfg: SimConfig) -> dict | None:
    summary = work_dir / f"{name}.json"
    if not summary.exists():
        return None
    try:
        saved = json.loads(summary.read_text())
    except json.JSONDecodeError:
        return None
    return saved if saved.get("config") == to_dict(cfg) else None


_DATA_CACHE: dict = {}


def _run_job(args: tuple[Job, str, int]) -> list[dict]:
    job, work_dir_str, threads = args
    import torch

    torch.set_num_threads(threads)
    work_dir = Path(work_dir_str)
    cfg0 = cell_config(job.base, setting=job.setting, seed=job.seed, num_traces=job.num_traces)
    key = cfg0.partition
    if key not in _DATA_CACHE:  # per worker process: one (setting, seed) data set at a time
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_data(cfg0)
    data = _DATA_CACHE[key]
    traces = read_trace_set(Path(cfg0.traces.set))
    # With only always-complete traces (|T| = 1 is T0) every s equals E, so A, B and C give
    # identical coefficients (p) and identical runs: compute the first scheme, reuse it.
    all_complete = all(bool(np.all(t.fraction == 1.0)) for t in traces.first(job.num_traces))
    out = []
    first_result = None
    for scheme in job.schemes:
        cfg = replace(cfg0, rules=replace(cfg0.rules, scheme=scheme))
        name = _run_name(job.setting, job.num_traces, job.seed, scheme)
        saved = _done(work_dir, name, cfg)
        if saved is None and all_complete and first_result is not None:
            src_name, src = first_result
            (work_dir / f"{name}.csv").write_text((work_dir / f"{src_name}.csv").read_text().replace(
                f",{src['scheme']},", f",{scheme},"))
            saved = {**src, "config": to_dict(cfg), "scheme": scheme, "identical_to": src["scheme"], "wall_s": 0.0,
                     "device_updates": 0, "resumed": False}
            tmp = work_dir / f".{name}.json.tmp"
            tmp.write_text(json.dumps(saved, indent=1))
            tmp.replace(work_dir / f"{name}.json")
        elif saved is None:
            result = run_simulation(cfg, data=data, traces=traces)
            write_csv_atomic(work_dir / f"{name}.csv", records_as_rows(result))
            saved = {
                "config": to_dict(cfg), "setting": job.setting, "num_traces": job.num_traces,
                "seed": job.seed, "scheme": scheme, "final_acc": result.final_accuracy,
                "final_loss": result.records[-1].test_loss, "wall_s": result.wall_s,
                "device_updates": result.device_updates,
                "discarded_rounds": sum(r.discarded for r in result.records),
                "resumed": False,
            }
            tmp = work_dir / f".{name}.json.tmp"
            tmp.write_text(json.dumps(saved, indent=1))
            tmp.replace(work_dir / f"{name}.json")
        else:
            saved = {**saved, "resumed": True}
        if first_result is None:
            first_result = (name, saved)
        out.append(saved)
    return out


def run_comparison(
    base: SimConfig,
    *,
    settings: Sequence[str],
    num_traces: Sequence[int],
    seeds: Sequence[int],
    schemes: Sequence[str] = ("A", "B", "C"),
    work_dir: Path,
    jobs: int = 1,
) -> list[dict]:
    """Run every (setting, |T|, seed, scheme); returns one summary dict per run."""
    work_dir.mkdir(parents=True, exist_ok=True)
    # Seeds outermost: an interrupted comparison has every cell for the first seeds.
    todo = [Job(st, sd, j, tuple(schemes), base) for sd in seeds for st in settings for j in num_traces]
    total_runs = len(todo) * len(schemes)
    threads = max(1, (mp.cpu_count() or 1) // max(1, jobs))
    summaries: list[dict] = []
    started = time.perf_counter()
    computed = 0
    ctx = mp.get_context("fork")
    pool = ctx.Pool(jobs) if jobs > 1 else None
    try:
        results = (pool.imap(_run_job, [(j, str(work_dir), threads) for j in todo]) if pool
                   else (_run_job((j, str(work_dir), threads)) for j in todo))
        for group in results:
            for s in group:
                summaries.append(s)
                computed += not s["resumed"]
                elapsed = time.perf_counter() - started
                left = total_runs - len(summaries)
                eta = elapsed / computed * left if computed else float("nan")
                took = ("cached" if s["resumed"] else f"same run as {s['identical_to']}: all complete"
                        if s.get("identical_to") else f"{s['wall_s']:.1f} s")
                print(
                    f"[{len(summaries)}/{total_runs}] {base.partition.dataset} {s['setting']} |T|={s['num_traces']} "
                    f"seed {s['seed']} scheme {s['scheme']}: acc {100 * s['final_acc']:.2f}% "
                    f"({took}), ETA {eta / 60:.1f} min",
                    flush=True,
                )
    finally:
        if pool:
            pool.close()
            pool.join()
    return summaries


def write_outputs(dataset: str, summaries: list[dict], *, work_dir: Path, out_dir: Path, settings: Sequence[str]) -> dict[str, Path | str]:
    """Final-accuracy CSV, accuracy-curve plots (mean over seeds), and the Table 3 markdown body."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final_rows = [
        {k: s[k] for k in ("setting", "num_traces", "seed", "scheme", "final_acc", "final_loss", "wall_s", "device_updates", "discarded_rounds")}
        for s in sorted(summaries, key=lambda s: (s["setting"], s["num_traces"], s["seed"], s["scheme"]))
    ]
    paths: dict[str, Path | str] = {"final_csv": out_dir / f"schemes_{dataset}_final.csv"}
    write_csv_atomic(paths["final_csv"], final_rows)
    curves: dict[str, dict[str, dict[str, list]]] = {st: {} for st in settings}
    for r in final_rows:
        name = _run_name(r["setting"], r["num_traces"], r["seed"], r["scheme"])
        with open(work_dir / f"{name}.csv", newline="") as f:
            acc = [float(row["test_acc"]) for row in csv.DictReader(f)]
        curves[r["setting"]].setdefault(f"|T| = {r['num_traces']}", {}).setdefault(r["scheme"], []).append(acc)
    for setting in settings:
        if curves[setting]:
            mean_curves = {panel: {sc: np.mean(v, axis=0) for sc, v in by.items()} for panel, by in curves[setting].items()}
            p = out_dir / f"schemes_{dataset}_{setting}.png"
            plot_accuracy_curves(p, mean_curves, title=f"{dataset.upper()} {setting.upper()}: test accuracy per round (mean over seeds)")
            paths[f"plot_{setting}"] = p
    paths["table"] = table3_markdown(dataset, table3_cells(final_rows), settings=settings)
    return paths


def finished_runs(
    base: SimConfig, *, settings: Sequence[str], num_traces: Sequence[int], seeds: Sequence[int],
    schemes: Sequence[str] = ("A", "B", "C"), work_dir: Path,
) -> list[dict]:
    """Summaries of the grid's runs already in `work_dir` with the identical config (nothing is computed)."""
    out = []
    for seed in seeds:
        for setting in settings:
            for j in num_traces:
                for scheme in schemes:
                    cfg = cell_config(base, setting=setting, seed=seed, num_traces=j, scheme=scheme)
                    saved = _done(work_dir, _run_name(setting, j, seed, scheme), cfg)
                    if saved is not None:
                        out.append({**saved, "resumed": True})
    return out


def speed_figures(summaries: list[dict]) -> tuple[float, float]:
    """Mean wall seconds of one run and simulated device-updates (SGD steps) per second."""
    computed = [s for s in summaries if not s.get("identical_to")]  # shared runs cost nothing
    fresh = [s for s in computed if not s["resumed"]] or computed
    wall = np.array([s["wall_s"] for s in fresh])
    updates = np.array([s["device_updates"] for s in fresh])
    return float(wall.mean()), float(updates.sum() / wall.sum())
