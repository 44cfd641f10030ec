"""The paper's scheme comparison (Table 3): Schemes A, B, C over |T| = 1..8, IID and non-IID, seeds.

Each (setting, seed, |T|) is one sweep group (simulator.sweep): its three schemes share
data, initial model, trace assignment and s draws, so "B over A" and "C over B" are paired
comparisons, and they train together (simulator.engine.run_paired). Every finished run is
written to the work folder at once, so an interrupted comparison resumes where it stopped;
groups run on a local process pool or on Ray (simulator.executors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from flexfl.vocabulary import Scheme
from simulator.engine import SimConfig
from simulator.groups import Executor, Group, Run
from simulator.paper_numbers import SETTINGS
from simulator.report import plot_accuracy_curves, table3_cells, table3_markdown, write_csv_atomic
from simulator.sim_rows import read_rounds_csv
from simulator.sweep import finished, run_sweep
from trace_recorder.format import read_trace_set

# The paper's schemes: identical runs when every device completes E (see comparison_groups)
PAPER_SCHEMES = frozenset(s.value for s in Scheme)


def _run_name(setting: str, num_traces: int, seed: int, scheme: str) -> str:
    return f"{setting}_T{num_traces}_seed{seed}_{scheme}"


def cell_config(base: SimConfig, *, setting: str, seed: int, num_traces: int, scheme: str | None = None,
                mu: float | None = None) -> SimConfig:
    """The config of one run of the grid: the setting's data, the seed (data and model), |T|, the scheme or
    strategy (`mu`: FedProx's)."""
    setting_fields = SETTINGS[str(base.partition.dataset)][setting]
    return replace(base.with_run(seed=seed), partition=replace(base.partition, seed=seed, **setting_fields),
                   traces=replace(base.traces, num_traces=num_traces),
                   rules=base.rules.with_strategy(scheme, mu=mu) if scheme else base.rules)


def comparison_groups(
    base: SimConfig, *, settings: Sequence[str], num_traces: Sequence[int], seeds: Sequence[int],
    schemes: Sequence[str] = ("A", "B", "C"), prefix: str = "",
    adjust: Callable[[SimConfig], SimConfig] | None = None, mu_of: Mapping[str, float] | None = None,
) -> list[Group]:
    """One group per (seed, setting, |T|), seeds outermost: an interrupted comparison has every cell of the first seeds.

    `schemes` are the paper's letters or strategy names (coordinator.rules.strategies); `mu_of` gives
    a strategy's mu ({"fedprox": 0.01}). `prefix` goes before every run name (and, without its
    trailing "_", into the runs' "reading" label); `adjust` changes each cell's config after
    the setting is applied (e.g. a sample-size rule that depends on IID or not: simulator.paper.table3).
    """
    mu_of = mu_of or {}
    traces = read_trace_set(Path(base.traces.set))
    adjust = adjust or (lambda cfg: cfg)
    extra = {"reading": prefix.rstrip("_")} if prefix else {}
    groups = []
    for seed in seeds:
        for setting in settings:
            for j in num_traces:
                # With only always-complete traces (|T| = 1 is T0) every s equals E, so A, B and C
                # give identical coefficients and identical runs: compute the first, reuse it
                # (the paper's schemes only: FedProx trains differently whatever s is).
                all_complete = all(bool(np.all(t.fraction == 1.0)) for t in traces.first(j))
                first = prefix + _run_name(setting, j, seed, schemes[0])
                groups.append(Group(tuple(
                    Run(name=prefix + _run_name(setting, j, seed, scheme),
                        config=adjust(cell_config(base, setting=setting, seed=seed, num_traces=j, scheme=scheme,
                                                  mu=mu_of.get(scheme))),
                        labels={"setting": setting, "num_traces": j, "seed": seed, "scheme": scheme, **extra},
                        same_as=first if all_complete and i and {schemes[0], scheme} <= PAPER_SCHEMES else None)
                    for i, scheme in enumerate(schemes))))
    return groups


def run_comparison(
    base: SimConfig, *, settings: Sequence[str], num_traces: Sequence[int], seeds: Sequence[int],
    schemes: Sequence[str] = ("A", "B", "C"), work_dir: Path, executor: Executor | None = None,
) -> list[dict]:
    """Run every (setting, |T|, seed, scheme) not yet in `work_dir`; returns one summary dict per run."""
    groups = comparison_groups(base, settings=settings, num_traces=num_traces, seeds=seeds, schemes=schemes)
    return run_sweep(groups, work_dir=work_dir, executor=executor)


RUN_KEY = ("setting", "num_traces", "seed", "scheme")


def write_outputs(dataset: str, summaries: list[dict], *, work_dir: Path, out_dir: Path, settings: Sequence[str],
                  replace_page: bool = False) -> dict[str, Path | str]:
    """Final-accuracy CSV, accuracy-curve plots (mean over seeds), and the Table 3 markdown body.

    paths["dir"] is where they went: `out_dir`, or <out_dir>/local if the committed final CSV
    lists runs not finished here (simulator.report.page_dir) and not `replace_page`."""
    from simulator.report import page_dir

    final_rows = [
        {k: s[k] for k in (*RUN_KEY, "final_acc", "final_loss", "wall_s", "device_updates", "discarded_rounds")}
        for s in sorted(summaries, key=lambda s: tuple(s[k] for k in RUN_KEY))
    ]
    final_csv = f"schemes_{dataset}_final.csv"
    out_dir = page_dir(out_dir, final_csv, final_rows, RUN_KEY, replace=replace_page)
    paths: dict[str, Path | str] = {"dir": out_dir, "final_csv": out_dir / final_csv}
    write_csv_atomic(out_dir / final_csv, final_rows)
    curves: dict[str, dict[str, dict[str, list]]] = {st: {} for st in settings}
    for r in final_rows:
        name = _run_name(r["setting"], r["num_traces"], r["seed"], r["scheme"])
        acc = [np.nan if r.test_acc is None else r.test_acc for r in read_rounds_csv(work_dir / f"{name}.csv")]
        curves[r["setting"]].setdefault(f"|T| = {r['num_traces']}", {}).setdefault(r["scheme"], []).append(acc)
    for setting in settings:
        if curves[setting]:
            mean_curves = {panel: {sc: np.mean(v, axis=0) for sc, v in by.items()}
                           for panel, by in curves[setting].items()}
            p = out_dir / f"schemes_{dataset}_{setting}.png"
            title = f"{dataset.upper()} {setting.upper()}: test accuracy per round (mean over seeds)"
            plot_accuracy_curves(p, mean_curves, title=title)
            paths[f"plot_{setting}"] = p
    paths["table"] = table3_markdown(dataset, table3_cells(final_rows), settings=settings)
    return paths


def finished_runs(
    base: SimConfig, *, settings: Sequence[str], num_traces: Sequence[int], seeds: Sequence[int],
    schemes: Sequence[str] = ("A", "B", "C"), work_dir: Path,
) -> list[dict]:
    """Summaries of the grid's runs already in `work_dir` with the identical config (nothing is computed)."""
    return finished(comparison_groups(base, settings=settings, num_traces=num_traces, seeds=seeds, schemes=schemes),
                    work_dir=work_dir)

