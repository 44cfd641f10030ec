"""The multi-arrival figure (paper Figure 6): seven devices, then three arrivals, with and without fast-reboot.

Non-IID MNIST (the paper's; `--dataset synthetic`: SYNTHETIC(1,1)), N = 10 devices with
equal sample counts and 10 % holdouts, the first five traces, Scheme C. Devices 7, 8 and 9
first train in rounds 100, 150 and 200 (they arrive during the round before); the test set
gains each newcomer's holdout at its arrival and the rate restarts each time. Paired runs per
seed: fast-reboot on and off.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.aggregation import Scheme
from coordinator.rules import RulesConfig
from flexfl.errors import ConfigError
from simulator.engine import ArrivalEvent, ScheduleConfig, SimConfig, TracesConfig
from simulator.paper import SWEEP_DATASETS
from simulator.regime import Regime
from simulator.sweep import Group, Run, finished, read_metrics
from workloads.partition_spec import PartitionSpec, Sizes

FIRST_ROUNDS = (100, 150, 200)  # the paper's: "after 100 global epochs ... at 50 epoch intervals"
ROUNDS = 300


def partition(dataset: str, seed: int) -> PartitionSpec:
    if dataset == "mnist":  # one label per device (non-IID is the default split)
        return PartitionSpec(dataset="mnist", n_devices=10, sizes=Sizes.EQUAL, holdout_fraction=0.1, seed=seed)
    if dataset == "synthetic":
        return PartitionSpec(dataset="synthetic", n_devices=10, alpha=1.0, beta=1.0, sizes=Sizes.EQUAL,
                             holdout_fraction=0.1, seed=seed)
    raise ConfigError(f"multi-arrival figure: dataset must be one of {', '.join(SWEEP_DATASETS)}, got {dataset!r}")


def file_stem(dataset: str) -> str:
    """figure_arrivals for the paper's MNIST, figure_arrivals_<dataset> otherwise (page, plot, CSV, work dir)."""
    return "figure_arrivals" if dataset == "mnist" else f"figure_arrivals_{dataset}"


def run_config(*, seed: int, fast_reboot: bool, dataset: str = "mnist", regime: Regime = Regime()) -> SimConfig:
    return regime.apply(SimConfig(
        partition=partition(dataset, seed),
        rules=RulesConfig(scheme=Scheme.C, fast_reboot=fast_reboot), rounds=ROUNDS, seed=seed,
        traces=TracesConfig(num_traces=5),
        schedule=ScheduleConfig(arrivals=tuple(ArrivalEvent(device=7 + i, round=r - 1)
                                               for i, r in enumerate(FIRST_ROUNDS)))))


def groups(*, seeds: Sequence[int], dataset: str = "mnist", regime: Regime = Regime()) -> list[Group]:
    return [Group(tuple(Run(name=f"seed{seed}_{'fast' if fast else 'vanilla'}",
                            config=run_config(seed=seed, fast_reboot=fast, dataset=dataset, regime=regime),
                            labels={"seed": seed, "reboot": "fast" if fast else "vanilla"})
                        for fast in (True, False))) for seed in seeds]



def write_page(out_dir, *, work_dir, seeds: Sequence[int], timing: str, dataset: str = "mnist",
               regime: Regime = Regime(), replace_page: bool = False):
    """results/figure_arrivals[_<dataset>].md and .png: mean accuracy over seeds (band: min-max), and what it shows.

    If the committed <stem>_runs.csv lists runs not finished here, everything goes to
    <out_dir>/local instead (simulator.report.page_dir) unless `replace_page`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flexfl.files import atomic_file
    from simulator.report import page_dir, write_csv_atomic

    curves: dict[str, list[np.ndarray]] = {"fast": [], "vanilla": []}
    run_seeds: dict[str, list[int]] = {"fast": [], "vanilla": []}
    stem = file_stem(dataset)
    for s in finished(groups(seeds=seeds, dataset=dataset, regime=regime), work_dir=work_dir):
        curves[s["reboot"]].append(np.array([r["test_acc"] for r in read_metrics(work_dir, s["name"])]))
        run_seeds[s["reboot"]].append(int(s["seed"]))
    if not curves["fast"] or not curves["vanilla"]:
        raise ConfigError(f"no finished multi-arrival runs in {work_dir} (run without --report-only)")
    if run_seeds["fast"] != run_seeds["vanilla"]:
        raise ConfigError(f"multi-arrival runs in {work_dir}: fast-reboot finished for seeds {run_seeds['fast']}, "
                          f"vanilla for {run_seeds['vanilla']}; rerun to finish the pairs")
    stats = {reboot: 100 * np.stack(curves[reboot]) for reboot in ("fast", "vanilla")}
    # Every number of the page, per run: the 20-round window means from each newcomer's first round.
    rows = [{"seed": seed, "reboot": reboot, "first_round": r,
             "mean_acc_20": float(stats[reboot][i, r - 1:r + 19].mean()), "final_acc": float(stats[reboot][i, -1])}
            for reboot in ("fast", "vanilla") for i, seed in enumerate(run_seeds[reboot]) for r in FIRST_ROUNDS]
    out_dir = page_dir(out_dir, f"{stem}_runs.csv", rows, ("seed", "reboot", "first_round"), replace=replace_page)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = np.arange(1, ROUNDS + 1)
    for reboot, color in (("fast", "tab:green"), ("vanilla", "tab:orange")):
        acc = stats[reboot]
        ax.plot(x, acc.mean(axis=0), color=color, label=f"{'fast-reboot' if reboot == 'fast' else 'vanilla'} "
                f"(mean of {len(acc)} seeds)")
        ax.fill_between(x, acc.min(axis=0), acc.max(axis=0), color=color, alpha=0.15)
    for r in FIRST_ROUNDS:
        ax.axvline(r, color="gray", ls="--", lw=1)
    ax.set_ylim(0, 100)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    name = "Non-IID MNIST" if dataset == "mnist" else "SYNTHETIC(1,1)"
    ax.set_title(f"{name}: 7 devices, then arrivals first training in rounds 100, 150, 200")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    png = out_dir / f"{stem}.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    write_csv_atomic(out_dir / f"{stem}_runs.csv", rows)
    windows = []
    for r in FIRST_ROUNDS:
        w = slice(r - 1, r + 19)  # the 20 rounds from the newcomer's first
        diff = stats["fast"][:, w].mean(axis=1) - stats["vanilla"][:, w].mean(axis=1)
        windows.append(f"| {r} | {stats['fast'][:, w].mean():.1f} | {stats['vanilla'][:, w].mean():.1f} | "
                       f"{np.median(diff):+.1f} [{diff.min():+.1f}, {diff.max():+.1f}] |")
    command = "flexfl sim arrivals-figure" + ("" if dataset == "mnist" else f" --dataset {dataset}")
    target = "paper-figure" if dataset == "mnist" else "paper-epoch-synthetic"
    page = f"""# Multi-arrival figure (paper Figure 6){"" if dataset == "mnist" else f" on {name}"}

Generated by `{command}` (`make {target}`); seeds {list(seeds)}. Wall time: {timing}.

Regime: {regime.describe(dataset)} ({regime.headline_note}).

{__doc__.split(chr(10), 2)[2]}
![multi-arrival]({png.name})

Mean test accuracy (%) over the 20 rounds from each newcomer's first round, and the paired
difference fast - vanilla per seed (median [min, max]); per run in `{stem}_runs.csv`:

| first round | fast-reboot | vanilla | fast - vanilla |
|---|---|---|---|
{chr(10).join(windows)}
"""
    path = out_dir / f"{stem}.md"
    with atomic_file(path) as f:
        f.write(page)
    return path
