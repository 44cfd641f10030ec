"""Table 4: rounds to recover after an arrival, with and without fast-reboot (paper Section 5.3).

Setup (the paper's): N - 1 devices train from the start and the N-th arrives at tau_0 (the
first round it trains in: it arrives during round tau_0 - 1); N = 30 for SYNTHETIC(1, 1)
and N = 10 for non-IID MNIST; the first five traces; Scheme C; equal sample counts; the
rate restarts at eta_0 / (tau - tau_0 + 1); fast-reboot boosts the newcomer to 3 p^l,
decaying as O(r^-2). Each (dataset, seed, tau_0) pair of runs shares data, initial model,
s draws and minibatches, and differs only in fast-reboot.

The paper's metric, "rounds after tau_0 until the test accuracy bounces back to its value
at tau_0 - 1", leaves open on which test set that baseline is measured; the test set gains
the newcomer's holdout at the arrival. FlexFL reports three readings
(simulator.curves.rounds_to_recover, counted from the first round the newcomer trains in):
- acc/old: baseline = accuracy at tau_0 - 1 on the old test set (before the holdout joins);
- acc/new: baseline = accuracy at tau_0 - 1 on the new test set (with the holdout);
- loss/old: the same with the test loss falling back to its pre-arrival (old set) level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.aggregation import Scheme
from coordinator.rules import RulesConfig
from flexfl.errors import ConfigError
from simulator.curves import rounds_to_recover
from simulator.engine import ArrivalEvent, ExtraTest, ScheduleConfig, SimConfig, TracesConfig
from simulator.regime import Regime
from simulator.sweep import Executor, Group, Run, finished, read_metrics, run_sweep
from workloads.partition_spec import PartitionSpec, Sizes

# The paper's Table 4 ("fast | vanilla"); EMNIST is not run (no EMNIST data on this machine).
PAPER_TABLE4 = {
    "mnist": {10: (4, 4), 30: (22, 27), 50: (55, 63), 70: (59, 66)},
    "emnist": {10: (4, 3), 30: (11, 12), 50: (14, 19), 70: (21, 24)},
    "synthetic": {10: (1, 1), 30: (4, 6), 50: (7, 12), 70: (3, 8)},
}
TAU0 = (10, 30, 50, 70)
ROUNDS = 200
METRICS = ("acc/old", "acc/new", "loss/old")


def partition(dataset: str, seed: int) -> PartitionSpec:
    if dataset == "synthetic":
        return PartitionSpec(dataset="synthetic", n_devices=30, alpha=1.0, beta=1.0, sizes=Sizes.EQUAL, seed=seed)
    # Non-IID MNIST, one label per device; each device keeps 10 % as its holdout, so the
    # test set is the objective's devices' holdouts and gains the newcomer's at its arrival.
    return PartitionSpec(dataset="mnist", n_devices=10, sizes=Sizes.EQUAL, holdout_fraction=0.1, seed=seed)


def run_config(dataset: str, *, seed: int, tau0: int, fast_reboot: bool, regime: Regime = Regime()) -> SimConfig:
    p = partition(dataset, seed)
    return regime.apply(SimConfig(
        partition=p, rounds=ROUNDS, seed=seed, traces=TracesConfig(num_traces=5), extra_tests=(ExtraTest.START,),
        rules=RulesConfig(scheme=Scheme.C, fast_reboot=fast_reboot),
        schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=p.n_devices - 1, round=tau0 - 1),))))


def groups(dataset: str, *, seeds: Sequence[int], tau0s: Sequence[int] = TAU0,
           regime: Regime = Regime()) -> list[Group]:
    """One group per (seed, tau_0): the fast-reboot run and the vanilla one."""
    return [Group(tuple(
        Run(name=f"{dataset}_tau{t}_seed{seed}_{'fast' if fast else 'vanilla'}",
            config=run_config(dataset, seed=seed, tau0=t, fast_reboot=fast, regime=regime),
            labels={"dataset": dataset, "tau0": t, "seed": seed, "reboot": "fast" if fast else "vanilla"})
        for fast in (True, False))) for seed in seeds for t in tau0s]


def run_table4(dataset: str, *, seeds: Sequence[int], work_dir, executor: Executor | None = None,
               regime: Regime = Regime()) -> list[dict]:
    return run_sweep(groups(dataset, seeds=seeds, regime=regime), work_dir=work_dir, executor=executor)


@dataclass(frozen=True)
class Recoveries:
    """Rounds to recover of one run under each metric (None: not within the run)."""

    tau0: int
    seed: int
    reboot: str
    rounds: dict[str, int | None]


def recoveries(summary: dict, rows: list[dict]) -> Recoveries:
    tau0 = int(summary["tau0"])
    by = {r["round"]: r for r in rows}
    before = by[tau0 - 1]  # the round the newcomer arrived in: evaluated on the new set, and on the old
    acc = {r: by[r]["test_acc"] for r in by}
    loss = {r: by[r]["test_loss"] for r in by}
    old = before["extra_tests"]["start"]
    out = {
        "acc/old": rounds_to_recover(acc, first_round=tau0, baseline=old["acc"], higher_is_better=True).rounds,
        "acc/new": rounds_to_recover(acc, first_round=tau0, baseline=before["test_acc"], higher_is_better=True).rounds,
        "loss/old": rounds_to_recover(loss, first_round=tau0, baseline=old["loss"], higher_is_better=False).rounds,
    }
    return Recoveries(tau0=tau0, seed=int(summary["seed"]), reboot=summary["reboot"], rounds=out)


def collect(dataset: str, *, seeds: Sequence[int], work_dir, regime: Regime = Regime()) -> list[Recoveries]:
    return [recoveries(s, read_metrics(work_dir, s["name"]))
            for s in finished(groups(dataset, seeds=seeds, regime=regime), work_dir=work_dir)]


def cell_text(values: list[int | None], horizon: int) -> str:
    """median [min, max] over seeds; 'never' counts as beyond the run (> horizon) and is shown as n×never."""
    never = sum(v is None for v in values)
    got = [v for v in values if v is not None]
    if not got:
        return f"never ({never}/{len(values)})"
    arr = np.array([v if v is not None else horizon + 1 for v in values])
    text = f"{np.median(arr):g} [{min(got)}, {max(got) if not never else f'>{horizon}'}]"
    return text + (f" ({never}× never)" if never else "")


def write_page(out_dir, *, work_dirs: dict, seeds: Sequence[int], timing: dict[str, str], regime: Regime = Regime(),
               replace_page: bool = False):
    """results/table4.md: per dataset and tau_0, fast | vanilla under each metric, beside the paper's.

    If the committed table4_runs.csv lists runs not finished here, everything goes to
    <out_dir>/local instead (simulator.report.page_dir) unless `replace_page`."""
    from flexfl.files import atomic_file
    from simulator.report import page_dir, write_csv_atomic

    blocks, plots, rows = [], [], []
    runs = {dataset: collect(dataset, seeds=seeds, work_dir=work_dir, regime=regime)
            for dataset, work_dir in work_dirs.items()}
    for dataset, found in runs.items():
        rows += [{"dataset": dataset, "tau0": r.tau0, "seed": r.seed, "reboot": r.reboot,
                  **{m: ("never" if r.rounds[m] is None else r.rounds[m]) for m in METRICS}} for r in found]
    if rows:
        out_dir = page_dir(out_dir, "table4_runs.csv", rows, ("dataset", "tau0", "seed", "reboot"),
                           replace=replace_page)
    for dataset, work_dir in work_dirs.items():
        found = runs[dataset]
        if not found:
            continue
        n_seeds = len({r.seed for r in found})
        lines = ["| metric | " + " | ".join(f"tau_0 = {t}" for t in TAU0) + " |", "|---" * (len(TAU0) + 1) + "|"]
        for metric in METRICS:
            cells = []
            for t in TAU0:
                horizon = ROUNDS - t + 1
                fast = [r.rounds[metric] for r in found if r.tau0 == t and r.reboot == "fast"]
                van = [r.rounds[metric] for r in found if r.tau0 == t and r.reboot == "vanilla"]
                by_seed = zip(_by_seed(found, t, "fast", metric), _by_seed(found, t, "vanilla", metric))
                pairs = [(f, v) for f, v in by_seed if f is not None or v is not None]
                faster = sum(fast_sooner(f, v) for f, v in pairs)
                cells.append(f"{cell_text(fast, horizon)} \\| {cell_text(van, horizon)}"
                             + (f"; fast sooner in {faster}/{len(pairs)}" if pairs else ""))
            lines.append(f"| FlexFL {metric} | " + " | ".join(cells) + " |")
        paper = PAPER_TABLE4[dataset]
        lines.append("| paper (accuracy) | " + " | ".join(f"{paper[t][0]} \\| {paper[t][1]}" for t in TAU0) + " |")
        setup = partition(dataset, 0)
        blocks.append(f"### {dataset.upper()}: {setup.describe().replace(', seed 0', '')}, {n_seeds} seeds\n\n"
                      + "\n".join(lines) + "\n")
        plot = out_dir / f"table4_{dataset}.png"
        _plot(plot, dataset, work_dir, seeds)
        plots.append(f"![{dataset}]({plot.name})")
    if not blocks:
        raise ConfigError(f"no finished Table 4 runs in {', '.join(map(str, work_dirs.values())) or 'results/runs'} "
                          "(run without --report-only)")
    regimes = "; ".join(f"{d.upper()} {regime.describe(d)}" for d in work_dirs)
    page = f"""# Table 4: rounds to recover after an arrival, fast-reboot | vanilla

Generated by `flexfl sim table4` (`make paper-table4`). Wall time: {"; ".join(timing.values())}.

{__doc__.split(chr(10), 2)[2]}
Cells: "fast \\| vanilla", each the median [min, max] over seeds of the rounds the newcomer
trained until the curve was back (1 = already at the first round it trained in); "never"
= not within the {ROUNDS}-round run (counted as beyond it in the median). "fast sooner in
k/n": seeds where fast-reboot recovered in fewer rounds than its paired vanilla run.
Every run's counts: `table4_runs.csv`.
EMNIST is not run here (its data cannot be downloaded on this machine; `--emnist-root`
runs it where a copy exists). Regime: {regimes} ({regime.headline_note}).

{chr(10).join(blocks)}
Accuracy and loss around the arrival (seed 0; dashed: the newcomer's first round, tau_0):

{chr(10).join(plots)}
"""
    write_csv_atomic(out_dir / "table4_runs.csv", rows)
    path = out_dir / "table4.md"
    with atomic_file(path) as f:
        f.write(page)
    return path


def fast_sooner(fast: int | None, vanilla: int | None) -> bool:
    """Did fast-reboot recover in fewer rounds than its paired vanilla run? A run that never recovers
    (None) counts as later than any that does, so a seed where only one variant recovers is counted."""
    never = float("inf")
    return (never if fast is None else fast) < (never if vanilla is None else vanilla)


def _by_seed(found: list[Recoveries], tau0: int, reboot: str, metric: str) -> list[int | None]:
    return [r.rounds[metric] for r in sorted(found, key=lambda r: r.seed) if r.tau0 == tau0 and r.reboot == reboot]


def _plot(path, dataset: str, work_dir, seeds: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(TAU0), figsize=(3.4 * len(TAU0), 5.4), sharey="row")
    for col, t in enumerate(TAU0):
        for reboot, style in (("fast", "-"), ("vanilla", "--")):
            name = f"{dataset}_tau{t}_seed{seeds[0]}_{reboot}"
            try:
                rows = read_metrics(work_dir, name)
            except FileNotFoundError:
                continue
            window = [r for r in rows if t - 10 <= r["round"] <= t + 60]
            x = [r["round"] for r in window]
            axes[0, col].plot(x, [100 * r["test_acc"] for r in window], style, label=reboot)
            axes[1, col].plot(x, [r["test_loss"] for r in window], style, label=reboot)
        for row in (0, 1):
            axes[row, col].axvline(t, color="gray", ls=":", lw=1)
            axes[row, col].grid(alpha=0.3)
        axes[0, col].set_title(f"tau_0 = {t}", fontsize=10)
        axes[1, col].set_xlabel("round")
    axes[0, 0].set_ylabel("test accuracy (%)")
    axes[1, 0].set_ylabel("test loss")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{dataset.upper()}: an arrival at tau_0, with and without fast-reboot (seed {seeds[0]})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
