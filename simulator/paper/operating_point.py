"""The operating-point protocol: eta_0 for each (dataset, E's unit), fixed before any scheme comparison.

The protocol, written down before any run under it (2026-11-24) and never changed to fit a
result; `flexfl sim operating-point --dataset D --unit U` runs it and writes
results/operating_point.md (the page) and results/operating_point.toml (the choices, read
by `--eta0 protocol`, simulator.paper.regime):

1. Setup: Table 3's headline setup for the dataset (its per-label sample sizes, the paper's
   device count: 50 SYNTHETIC, 100 MNIST; batch 20 / 10; E = 20 in the given unit; 200
   rounds; eta_tau = eta_0 / tau), with full participation: |T| = 1, trace T0, in which every
   device completes all E updates every round. Schemes A, B and C are then one and the same
   FedAvg run, so nothing the protocol sees can favour one scheme over another.
2. Settings and seeds: IID and non-IID (both rows of Table 3), on seeds the tables never use
   (PROTOCOL_SEEDS: 100 and 101; MNIST 100 only, for cost).
3. Grid: the paper's eta_0 times 10^(k/2), k = -2..4 (x0.1 .. x100; the step reading's
   former MNIST value 0.1 = 50 x 2e-3 lies inside). If the winner is at an edge of the grid,
   the grid grows by one point beyond that edge and the protocol runs again, up to
   MAX_EXTENSIONS times.
4. Criterion: the lowest test loss after the last round, mean over the (setting, seed) runs
   (test loss, not accuracy: accuracy flips on argmax margins of an under-trained model). A
   run whose loss becomes NaN or infinite (diverges) scores +inf.
5. Horizon: the tables' 200 rounds, except MNIST under the epoch reading: 20 rounds, for
   cost (each full-participation round is 120,000 SGD steps there; 200 rounds of the grid
   would take days on 2 cores). The first 20 rounds carry 61 % of a 200-round run's sum of
   learning rates (H_20 / H_200 = 3.60 / 5.88).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from flexfl.csv_records import read_records
from flexfl.errors import ConfigError
from flexfl.files import atomic_file
from flexfl.markdown import table
from flexfl.vocabulary import Unit
from simulator.groups import Executor, Group, Run
from simulator.paper.choices_file import read_choices, write_choice
from simulator.paper.regime import OPERATING_POINT_FILE
from simulator.paper.schemes import cell_config
from simulator.sweep import run_sweep
from workloads.federated import DEFAULTS
from workloads.partition_spec import Dataset

SETTINGS = ("iid", "niid")
PROTOCOL_SEEDS = {"synthetic": (100, 101), "mnist": (100,)}
GRID_K = tuple(range(-2, 5))  # eta_0 = paper x 10^(k/2)
MAX_EXTENSIONS = 3
ROUNDS = 200
ROUNDS_MNIST_EPOCH = 20


@dataclass(frozen=True)
class Candidate:
    k: int  # eta_0 = paper's x 10^(k/2)
    eta0: float
    losses: tuple[float, ...]  # one per (setting, seed) run; inf where it diverged
    accs: tuple[float, ...]

    @property
    def score(self) -> float:
        return float(np.mean(self.losses)) if self.losses else math.inf


def horizon(dataset: str, unit: Unit | str) -> int:
    return ROUNDS_MNIST_EPOCH if (dataset, Unit(unit)) == ("mnist", Unit.EPOCH) else ROUNDS


def eta0_at(dataset: str, k: int) -> float:
    return float(f"{DEFAULTS[Dataset(dataset)].eta0 * 10 ** (k / 2):.3g}")


def base_config(dataset: str, unit: Unit | str):
    """Table 3's headline setup for `dataset` in `unit`, over the protocol's horizon; and its reading."""
    from simulator.paper.table3 import HEADLINE, READINGS
    from simulator.paper.table3 import base_config as table3_base

    reading = READINGS[HEADLINE]
    cfg = table3_base(dataset, reading)
    cfg = replace(cfg.with_run(rounds=horizon(dataset, unit)),
                  rules=replace(cfg.rules.with_strategy("C"), unit=Unit(unit)))
    return cfg, reading


def groups(dataset: str, unit: Unit | str, ks: Sequence[int]) -> list[Group]:
    """One group per (setting, seed, k): a run that diverges fails alone."""
    base, reading = base_config(dataset, unit)
    out = []
    for seed in PROTOCOL_SEEDS[dataset]:
        for setting in SETTINGS:
            cfg = cell_config(base, setting=setting, seed=seed, num_traces=1)
            cfg = replace(cfg, partition=replace(cfg.partition, sizes=reading.sizes(cfg.partition)))
            for k in ks:
                eta0 = eta0_at(dataset, k)
                out.append(Group((Run(name=f"{unit}_{setting}_seed{seed}_k{k:+d}",
                                      config=replace(cfg, rules=replace(cfg.rules, eta0=eta0)),
                                      labels={"setting": setting, "seed": seed, "k": k, "eta0": eta0}),)))
    return out


def candidates(summaries: Sequence[dict]) -> list[Candidate]:
    by_k: dict[int, list[dict]] = {}
    for s in summaries:
        by_k.setdefault(int(s["k"]), []).append(s)
    out = []
    for k, runs in sorted(by_k.items()):
        losses = tuple(math.inf if "error" in r or not math.isfinite(r["final_loss"]) else float(r["final_loss"])
                       for r in runs)
        accs = tuple(math.nan if "error" in r else float(r["final_acc"]) for r in runs)
        out.append(Candidate(k=k, eta0=float(runs[0]["eta0"]), losses=losses, accs=accs))
    return out


def choose(cands: Sequence[Candidate]) -> tuple[Candidate, int]:
    """The winner, and -1 / +1 if it sits at the low / high edge of the grid (0 inside)."""
    if not cands or all(math.isinf(c.score) for c in cands):
        raise ConfigError("operating point: every eta_0 of the grid diverged")
    best = min(cands, key=lambda c: (c.score, c.k))
    ks = [c.k for c in cands]
    edge = -1 if best.k == min(ks) else (1 if best.k == max(ks) else 0)
    return best, edge


def run_protocol(dataset: str, unit: Unit | str, *, work_dir: Path, executor: Executor | None = None,
                 report=print) -> tuple[Candidate, list[Candidate], list[dict]]:
    """Run the grid (growing it past an edge winner) and return the winner, every candidate and the runs."""
    if dataset not in PROTOCOL_SEEDS:
        raise ConfigError(f"operating point: no protocol for dataset {dataset!r}; choose from "
                          f"{', '.join(PROTOCOL_SEEDS)}")
    ks = list(GRID_K)
    computed: set[str] = set()
    for _ in range(MAX_EXTENSIONS + 1):
        summaries = run_sweep(groups(dataset, unit, ks), work_dir=work_dir, executor=executor, report=report,
                              failures="return")
        computed |= {s["name"] for s in summaries if not s.get("cached")}
        cands = candidates(summaries)
        best, edge = choose(cands)
        if edge == 0:
            break
        ks = [*ks, max(ks) + 1] if edge > 0 else [min(ks) - 1, *ks]
        report(f"operating point: the winner eta_0 = {best.eta0:g} is at the grid's edge; adding k = "
               f"{ks[-1] if edge > 0 else ks[0]:+d}")
    # A run computed by an earlier pass of the grid counts as computed by this command.
    return best, cands, [{**s, "cached": s.get("cached") and s["name"] not in computed} for s in summaries]


def record_choice(dataset: str, unit: Unit | str, best: Candidate, *, table: Path = OPERATING_POINT_FILE,
                  timing: str | None = "", base: Path | None = None) -> None:
    """Merge (dataset, unit) -> eta0 into the choices of `base` (default: `table`) and write them to `table`,
    atomically. `timing` None keeps the wall time recorded before (a rerun that computed nothing)."""
    base = table if base is None else base
    if timing is None:
        timing = read_choices(base).get(dataset, {}).get(str(Unit(unit)), {}).get("timing", "")
    write_choice(table, (dataset, str(Unit(unit))), {
        "eta0": best.eta0, "k": best.k, "mean_final_test_loss": best.score, "rounds": horizon(dataset, unit),
        "seeds": list(PROTOCOL_SEEDS[dataset]), "paper_eta0": DEFAULTS[Dataset(dataset)].eta0, "timing": timing},
        base=base)


@dataclass(frozen=True)
class ProtocolRun:
    """One line of results/operating_point_runs.csv: a protocol run and how it ended."""

    dataset: str
    unit: str
    setting: str
    seed: int
    k: int  # the candidate's place on the eta_0 grid
    eta0: float
    final_loss: float | None  # None: diverged
    final_acc: float | None
    diverged: bool


RUN_FIELDS = tuple(f.name for f in fields(ProtocolRun))
RUN_KEY = RUN_FIELDS[:5]  # one protocol run
RUNS_CSV, CHOICES_FILE, PAGE = "operating_point_runs.csv", OPERATING_POINT_FILE.name, "operating_point.md"


def run_rows(dataset: str, unit: Unit | str, summaries: Sequence[dict]) -> list[dict]:
    """One CSV row per protocol run (results/operating_point_runs.csv)."""
    return [{"dataset": dataset, "unit": str(Unit(unit)), "setting": s["setting"], "seed": s["seed"], "k": s["k"],
             "eta0": s["eta0"], "final_loss": "" if "error" in s else s["final_loss"],
             "final_acc": "" if "error" in s else s["final_acc"], "diverged": int("error" in s)} for s in summaries]


def merge_rows(path: Path, dataset: str, unit: Unit | str, rows: Sequence[dict]) -> list[dict]:
    """The runs CSV with (dataset, unit)'s rows replaced by `rows`, where they stood (a rerun that
    finds the same runs leaves the file byte for byte as it was)."""
    import csv

    old = list(csv.DictReader(path.open(newline=""))) if path.exists() else []

    def ours(r: dict) -> bool:
        return (r["dataset"], r["unit"]) == (dataset, str(Unit(unit)))

    at = next((i for i, r in enumerate(old) if ours(r)), len(old))
    return old[:at] + [{k: str(v) for k, v in r.items()} for r in rows] + [r for r in old[at:] if not ours(r)]


def read_runs(path: Path) -> list[ProtocolRun]:
    """The lines of an operating_point_runs.csv; a ReportError names the file, line and column of a bad one."""
    return read_records(path, ProtocolRun)


def _as_summary(run: ProtocolRun) -> dict:
    """The run as the sweep summarised it (what candidates() scores)."""
    out = {"setting": run.setting, "seed": run.seed, "k": run.k, "eta0": run.eta0}
    if run.diverged:
        return {**out, "error": "diverged"}
    return {**out, "final_loss": run.final_loss, "final_acc": run.final_acc}


def section(dataset: str, unit: str, protocol_runs: Sequence[ProtocolRun], *, timing: str) -> str:
    """The page's section for one (dataset, unit): every candidate's runs, the score, the choice."""
    summaries = [_as_summary(r) for r in protocol_runs]
    cands = candidates(summaries)
    best, edge = choose(cands)
    paper = DEFAULTS[Dataset(dataset)].eta0
    runs = sorted({(s["setting"], s["seed"]) for s in summaries})
    by = {(s["setting"], s["seed"], s["k"]): s for s in summaries}
    rows_out = []
    for c in cands:
        cells = []
        for st, sd in runs:
            s = by.get((st, sd, c.k))
            cells.append("not run" if s is None else "diverged" if "error" in s else
                         f"{s['final_loss']:.4f} / {100 * s['final_acc']:.1f} %")
        mark = " **chosen**" if c.k == best.k else ""
        rows_out.append([f"{c.eta0:g}{mark}", f"{c.eta0 / paper:.3g}", *cells, f"{c.score:.4f}"])
    grid = table(["eta_0", "x paper", *(f"{st} seed {sd}: loss / acc" for st, sd in runs), "mean loss"], rows_out)
    warn = ("" if edge == 0 else f" The winner is still at the grid's {'low' if edge < 0 else 'high'} edge after "
            f"{MAX_EXTENSIONS} extensions.")
    return (f"## {dataset.upper()}, E = 20 {unit}s\n\n"
            f"Chosen: **eta_0 = {best.eta0:g}** ({best.eta0 / paper:.3g} x the paper's {paper:g}); "
            f"{horizon(dataset, unit)} rounds, seeds {', '.join(map(str, PROTOCOL_SEEDS[dataset]))}.{warn} "
            f"{timing}\n\n" + grid)


def write_outputs(out_dir: Path, dataset: str, unit: Unit | str, summaries: Sequence[dict], best: Candidate, *,
                  timing: str | None, replace_page: bool = False) -> Path:
    """Update results/operating_point_runs.csv, .toml and .md with (dataset, unit)'s runs and choice.

    `timing` None keeps the wall time already recorded. If the committed runs CSV lists runs
    this one lacks, the three files go to <out_dir>/local instead (simulator.report.page_dir)
    unless `replace_page`: `--eta0 protocol` reads results/operating_point.toml only."""
    from simulator.report import page_dir, write_csv_atomic

    committed = Path(out_dir)
    rows = merge_rows(committed / RUNS_CSV, dataset, unit, run_rows(dataset, unit, summaries))
    out_dir = page_dir(committed, RUNS_CSV, rows, RUN_KEY, replace=replace_page)
    write_csv_atomic(out_dir / RUNS_CSV, rows)
    choices = out_dir / CHOICES_FILE
    record_choice(dataset, unit, best, table=choices, timing=timing, base=committed / CHOICES_FILE)
    return page_from_csv(out_dir)


def render(runs: Sequence[ProtocolRun], chosen: dict) -> str:
    """The Markdown of results/operating_point.md: a section per (dataset, unit) of the runs CSV's lines."""
    import simulator.paper.operating_point as me

    sections = []
    for ds in sorted({r.dataset for r in runs}):
        for u in sorted({r.unit for r in runs if r.dataset == ds}):
            t = chosen.get(ds, {}).get(u, {}).get("timing", "")
            sections.append(section(ds, u, [r for r in runs if (r.dataset, r.unit) == (ds, u)], timing=t))
    protocol = "\n".join((me.__doc__ or "").splitlines()[2:])
    return (f"# The operating point: eta_0 per dataset and reading of E\n\n"
            f"Generated by `flexfl sim operating-point` (simulator/paper/operating_point.py); every run is in "
            f"`{RUNS_CSV}`, the choices in `{CHOICES_FILE}` (read by `--eta0 "
            f"protocol`).\n\n## The protocol\n{protocol}\n\n" + "\n".join(sections))


def page_from_csv(out_dir: Path) -> Path:
    """Render out_dir/operating_point.md from the runs CSV and the choices file beside it (write_outputs
    writes them first, so the page is always what the committed files say)."""
    page = Path(out_dir) / PAGE
    runs = read_runs(Path(out_dir) / RUNS_CSV)
    with atomic_file(page) as f:
        f.write(render(runs, read_choices(Path(out_dir) / CHOICES_FILE)))
    return page
