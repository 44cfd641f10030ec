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
(simulator.paper.curves.rounds_to_recover, counted from the first round the newcomer trains in):
- acc/old: baseline = accuracy at tau_0 - 1 on the old test set (before the holdout joins);
- acc/new: baseline = accuracy at tau_0 - 1 on the new test set (with the holdout);
- loss/old: the same with the test loss falling back to its pre-arrival (old set) level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from coordinator.rules.config import RulesConfig
from coordinator.rules.round_record import RoundRecord
from flexfl.csv_records import converted, read_records
from flexfl.errors import ConfigError
from flexfl.markdown import table
from flexfl.run_spec import RunSpec
from flexfl.text import count
from flexfl.vocabulary import Scheme
from simulator.engine import ArrivalEvent, ExtraTest, ScheduleConfig, SimConfig, TracesConfig
from simulator.groups import Executor, Group, Run
from simulator.paper.curves import rounds_to_recover
from simulator.paper.regime import Regime
from simulator.sweep import finished, read_metrics, run_sweep
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


# The diagnostic (issue 33 item 12), never the paper's rule: the rate kept at eta_0 / tau through the
# arrival instead of restarting at eta_0 / (tau - tau_0 + 1) (RulesConfig.lr_restart). Its runs sit
# beside the paper-rule runs, named with this suffix, and get their own section and CSV.
NO_RESTART = "no-restart"


def run_config(dataset: str, *, seed: int, tau0: int, fast_reboot: bool, regime: Regime = Regime(),
               lr_restart: bool = True) -> SimConfig:
    p = partition(dataset, seed)
    return regime.apply(SimConfig(
        partition=p, run=RunSpec(rounds=ROUNDS, seed=seed), traces=TracesConfig(num_traces=5),
        extra_tests=(ExtraTest.START,),
        rules=RulesConfig(scheme=Scheme.C, fast_reboot=fast_reboot, lr_restart=lr_restart),
        schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=p.n_devices - 1, round=tau0 - 1),))))


def groups(dataset: str, *, seeds: Sequence[int], tau0s: Sequence[int] = TAU0,
           regime: Regime = Regime(), lr_restart: bool = True) -> list[Group]:
    """One group per (seed, tau_0): the fast-reboot run and the vanilla one (lr_restart=False: the diagnostic's)."""
    suffix = "" if lr_restart else f"_{NO_RESTART}"
    return [Group(tuple(
        Run(name=f"{dataset}_tau{t}_seed{seed}_{'fast' if fast else 'vanilla'}{suffix}",
            config=run_config(dataset, seed=seed, tau0=t, fast_reboot=fast, regime=regime, lr_restart=lr_restart),
            labels={"dataset": dataset, "tau0": t, "seed": seed, "reboot": "fast" if fast else "vanilla"})
        for fast in (True, False))) for seed in seeds for t in tau0s]


def run_table4(dataset: str, *, seeds: Sequence[int], work_dir, executor: Executor | None = None,
               regime: Regime = Regime(), lr_restart: bool = True) -> list[dict]:
    return run_sweep(groups(dataset, seeds=seeds, regime=regime, lr_restart=lr_restart), work_dir=work_dir,
                     executor=executor)


NEVER = "never"  # the CSV's cell for a run that did not recover within its rounds


def _rounds_by_metric(texts: tuple[str, ...]) -> dict[str, int | None]:
    return {m: None if text == NEVER else int(text) for m, text in zip(METRICS, texts)}


@dataclass(frozen=True)
class Recoveries:
    """Rounds to recover of one run under each metric (None: not within the run); in table4_runs.csv, a
    column per metric."""

    tau0: int
    seed: int
    reboot: str
    rounds: dict[str, int | None] = field(metadata=converted(
        _rounds_by_metric, columns=METRICS, expected=f"a round count or '{NEVER}' per metric"))


@dataclass(frozen=True)
class RecoveriesLine:
    """One line of table4_runs.csv (or of its no-restart diagnostic's): the dataset and a run's recoveries."""

    dataset: str
    run: Recoveries


def recoveries(summary: dict, rows: list[RoundRecord]) -> Recoveries:
    tau0 = int(summary["tau0"])
    by = {r.round: r for r in rows}
    before = by[tau0 - 1]  # the round the newcomer arrived in: evaluated on the new set, and on the old
    acc = {r: by[r].test_acc for r in by}
    loss = {r: by[r].test_loss for r in by}
    old = (before.extra_tests or {})["start"]
    out = {
        "acc/old": rounds_to_recover(acc, first_round=tau0, baseline=old["acc"], higher_is_better=True).rounds,
        "acc/new": rounds_to_recover(acc, first_round=tau0, baseline=before.test_acc, higher_is_better=True).rounds,
        "loss/old": rounds_to_recover(loss, first_round=tau0, baseline=old["loss"], higher_is_better=False).rounds,
    }
    return Recoveries(tau0=tau0, seed=int(summary["seed"]), reboot=summary["reboot"], rounds=out)


def collect(dataset: str, *, seeds: Sequence[int], work_dir, regime: Regime = Regime(),
            lr_restart: bool = True) -> list[Recoveries]:
    return [recoveries(s, read_metrics(work_dir, s["name"]))
            for s in finished(groups(dataset, seeds=seeds, regime=regime, lr_restart=lr_restart), work_dir=work_dir)]


def cell_text(values: list[int | None], horizon: int) -> str:
    """median [min, max] over seeds; 'never' counts as beyond the run (> horizon) and is shown as n×never."""
    never = sum(v is None for v in values)
    got = [v for v in values if v is not None]
    if not got:
        return f"never ({never}/{len(values)})"
    arr = np.array([v if v is not None else horizon + 1 for v in values])
    text = f"{np.median(arr):g} [{min(got)}, {max(got) if not never else f'>{horizon}'}]"
    return text + (f" ({never}× never)" if never else "")


RUN_KEY = ("dataset", "tau0", "seed", "reboot")
DIAGNOSTIC_CSV = "table4_no_restart_runs.csv"


@dataclass(frozen=True)
class DatasetResult:
    """One dataset's recoveries under the paper's rule, and under the no-restart diagnostic if it ran."""

    dataset: str
    found: tuple[Recoveries, ...]
    no_restart: tuple[Recoveries, ...] = ()
    plot: str = ""  # file name beside the page

    def rows(self, found: Sequence[Recoveries]) -> list[dict]:
        return [{"dataset": self.dataset, "tau0": r.tau0, "seed": r.seed, "reboot": r.reboot,
                 **{m: (NEVER if r.rounds[m] is None else r.rounds[m]) for m in METRICS}} for r in found]


def _cell(found: Sequence[Recoveries], t: int, metric: str) -> str:
    horizon = ROUNDS - t + 1
    fast = [r.rounds[metric] for r in found if r.tau0 == t and r.reboot == "fast"]
    van = [r.rounds[metric] for r in found if r.tau0 == t and r.reboot == "vanilla"]
    by_seed = zip(_by_seed(found, t, "fast", metric), _by_seed(found, t, "vanilla", metric))
    pairs = [(f, v) for f, v in by_seed if f is not None or v is not None]
    faster = sum(fast_sooner(f, v) for f, v in pairs)
    return f"{cell_text(fast, horizon)} \\| {cell_text(van, horizon)}" + (
        f"; fast sooner in {faster}/{len(pairs)}" if pairs else "")


def recovery_table(dataset: str, *series: tuple[str, Sequence[Recoveries]]) -> str:
    """Per metric and (label, recoveries) series, "fast | vanilla" per tau_0; then the paper's accuracy row."""
    rows: list[list[str]] = [[f"{label} {metric}", *(_cell(found, t, metric) for t in TAU0)]
                             for metric in METRICS for label, found in series]
    paper = PAPER_TABLE4[dataset]
    rows.append(["paper (accuracy)", *(f"{paper[t][0]} \\| {paper[t][1]}" for t in TAU0)])
    return table(["metric", *(f"tau_0 = {t}" for t in TAU0)], rows)


def _block(r: DatasetResult) -> str:
    setup = partition(r.dataset, 0)
    text = (f"### {r.dataset.upper()}: {setup.describe().replace(', seed 0', '')}, "
            f"{len({x.seed for x in r.found})} seeds\n\n" + recovery_table(r.dataset, ("FlexFL", r.found)))
    if not r.no_restart:
        return text
    seeds = sorted({x.seed for x in r.no_restart})
    same = [x for x in r.found if x.seed in seeds]
    return text + f"""
#### Diagnostic, not the paper's rule: no learning-rate restart after the arrival

The same runs with the rate kept at eta_0 / tau through the arrival (`lr_restart = false`)
instead of the paper's restart at eta_0 / (tau - tau_0 + 1), on {count(len(seeds), "seed")} ({seeds}),
beside the paper's rule on the same seeds: how much of the recovery time above is the
restart's. Every run's counts: `{DIAGNOSTIC_CSV}`.

{recovery_table(r.dataset, ("paper's rule", same), ("no restart", r.no_restart))}"""


def render(results: Sequence[DatasetResult], *, timing: dict[str, str], regimes: str, note: str) -> str:
    """The Markdown of results/table4.md."""
    return f"""# Table 4: rounds to recover after an arrival, fast-reboot | vanilla

Generated by `flexfl sim table4` (`make paper-table4`). Wall time: {"; ".join(timing.values())}.

{(__doc__ or "").split(chr(10), 2)[2]}
Cells: "fast \\| vanilla", each the median [min, max] over seeds of the rounds the newcomer
trained until the curve was back (1 = already at the first round it trained in); "never"
= not within the {ROUNDS}-round run (counted as beyond it in the median). "fast sooner in
k/n": seeds where fast-reboot recovered in fewer rounds than its paired vanilla run.
Every run's counts: `table4_runs.csv`.
EMNIST is not run here (its data cannot be downloaded on this machine; `--emnist-root`
runs it where a copy exists). Regime: {regimes} ({note}).

{chr(10).join(_block(r) for r in results)}
Accuracy and loss around the arrival (seed 0; dashed: the newcomer's first round, tau_0):

{chr(10).join(f"![{r.dataset}]({r.plot})" for r in results)}
"""


def write_page(out_dir, *, work_dirs: dict, seeds: Sequence[int], timing: dict[str, str], regime: Regime = Regime(),
               replace_page: bool = False):
    """results/table4.md: per dataset and tau_0, fast | vanilla under each metric, beside the paper's; and the
    no-restart diagnostic where its runs are in the work folder (`python -m simulator.paper.table4 --no-lr-restart`).

    If the committed table4_runs.csv lists runs not finished here, everything goes to
    <out_dir>/local instead (simulator.report.page_dir) unless `replace_page`."""
    from flexfl.files import atomic_file
    from simulator.report import page_dir, write_csv_atomic

    results = [DatasetResult(dataset=d, found=tuple(collect(d, seeds=seeds, work_dir=w, regime=regime)),
                             no_restart=tuple(collect(d, seeds=seeds, work_dir=w, regime=regime, lr_restart=False)))
               for d, w in work_dirs.items()]
    rows = [row for r in results for row in r.rows(r.found)]
    diagnostic = [row for r in results for row in r.rows(r.no_restart)]
    if rows:
        out_dir = page_dir(out_dir, "table4_runs.csv", rows, RUN_KEY, replace=replace_page)
    results = [replace(r, plot=f"table4_{r.dataset}.png") for r in results if r.found]
    if not results:
        raise ConfigError(f"no finished Table 4 runs in {', '.join(map(str, work_dirs.values())) or 'results/runs'} "
                          "(run without --report-only)")
    for r in results:
        _plot(out_dir / r.plot, r.dataset, work_dirs[r.dataset], seeds)
    page = render(results, timing=timing, regimes="; ".join(f"{d.upper()} {regime.describe(d)}" for d in work_dirs),
                  note=regime.reading_note("Table 4"))
    write_csv_atomic(out_dir / "table4_runs.csv", rows)
    if diagnostic:
        write_csv_atomic(out_dir / DIAGNOSTIC_CSV, diagnostic)
    path = out_dir / "table4.md"
    with atomic_file(path) as f:
        f.write(page)
    return path


def _read_recoveries(path) -> dict[str, list[Recoveries]]:
    out: dict[str, list[Recoveries]] = {}
    for line in read_records(path, RecoveriesLine):
        out.setdefault(line.dataset, []).append(line.run)
    return out


def page_from_csv(out_dir, *, regime: Regime):
    """Render out_dir/table4.md again from the table4_runs.csv (and the diagnostic's CSV, if there) and
    table4_timing.json beside it; the plots, which need every run's curves, are named as they are."""
    import json
    from pathlib import Path

    from flexfl.files import atomic_file

    out_dir = Path(out_dir)
    found = _read_recoveries(out_dir / "table4_runs.csv")
    no_restart = _read_recoveries(out_dir / DIAGNOSTIC_CSV) if (out_dir / DIAGNOSTIC_CSV).exists() else {}
    timing = json.loads((out_dir / "table4_timing.json").read_text())
    results = [DatasetResult(dataset=d, found=tuple(found[d]), no_restart=tuple(no_restart.get(d, ())),
                             plot=f"table4_{d}.png") for d in found]
    page = render(results, timing=timing, regimes="; ".join(f"{d.upper()} {regime.describe(d)}" for d in found),
                  note=regime.reading_note("Table 4"))
    path = out_dir / "table4.md"
    with atomic_file(path) as f:
        f.write(page)
    return path


def fast_sooner(fast: int | None, vanilla: int | None) -> bool:
    """Did fast-reboot recover in fewer rounds than its paired vanilla run? A run that never recovers
    (None) counts as later than any that does, so a seed where only one variant recovers is counted."""
    never = float("inf")
    return (never if fast is None else fast) < (never if vanilla is None else vanilla)


def _by_seed(found: Sequence[Recoveries], tau0: int, reboot: str, metric: str) -> list[int | None]:
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
            window = [r for r in rows if t - 10 <= r.round <= t + 60]
            x = [r.round for r in window]
            axes[0, col].plot(x, [100 * r.test_acc for r in window], style, label=reboot)
            axes[1, col].plot(x, [r.test_loss for r in window], style, label=reboot)
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m simulator.paper.table4 --no-lr-restart --datasets synthetic --seeds 0-4 --unit epoch --eta0 protocol`:
    run (resume) the no-restart diagnostic beside the paper-rule runs of `flexfl sim table4`, then write the page."""
    import argparse
    import json
    import time
    from pathlib import Path

    from flexfl.files import atomic_file
    from simulator.executors import executor_for
    from simulator.paper.regime import out_dir, regime_from_args
    from simulator.paper.table3 import elapsed

    p = argparse.ArgumentParser(prog="python -m simulator.paper.table4", description=main.__doc__)
    p.add_argument("--no-lr-restart", action="store_true", required=True,
                   help="the diagnostic (not the paper's rule): eta_0 / tau kept through the arrival")
    p.add_argument("--datasets", default="synthetic")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,2")
    p.add_argument("--unit", default="step")
    p.add_argument("--eta0", default="default")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--jobs", type=int, default=None)
    args = p.parse_args(argv)
    seeds = [s for part in args.seeds.split(",") for s in (
        range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [int(part)])]
    regime = regime_from_args(args)
    out = out_dir(args, regime)
    work_dirs = {ds: out / "runs" / f"table4_{ds}" for ds in args.datasets.split(",")}
    timing_path = out / "table4_timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    for ds, work_dir in work_dirs.items():
        started = time.perf_counter()
        done = run_table4(ds, seeds=seeds, work_dir=work_dir, regime=regime, lr_restart=False,
                          executor=executor_for(jobs=args.jobs, ray_address=None))
        command = (f"python -m simulator.paper.table4 --no-lr-restart --datasets {ds} --seeds {args.seeds} "
                   f"--unit {args.unit} --eta0 {args.eta0}")
        if any(not s.get("cached") for s in done):
            timing[command] = f"{elapsed(started)} for `{command}` (the diagnostic)"
    # The paper-rule runs behind the committed page need not be here: its figures are in table4_runs.csv.
    from simulator.report import write_csv_atomic

    found = [DatasetResult(dataset=ds, found=(), no_restart=tuple(collect(ds, seeds=seeds, work_dir=w, regime=regime,
                                                                           lr_restart=False)))
             for ds, w in work_dirs.items()]
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out / DIAGNOSTIC_CSV, [row for r in found for row in r.rows(r.no_restart)])
    with atomic_file(out / "table4_timing.json") as f:
        f.write(json.dumps(timing, indent=1))
    if not (out / "table4_runs.csv").exists():
        print(f"no-restart diagnostic: {out / DIAGNOSTIC_CSV}; no Table 4 page in {out} to add it to")
        return 0
    page = page_from_csv(out, regime=regime)
    print(f"Table 4 page with the no-restart diagnostic: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
