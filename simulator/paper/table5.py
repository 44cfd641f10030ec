"""Table 5: rounds until the include and exclude test losses cross after a departure, and `auto`.

Setup (the paper's, Section 5.4 "as in Section 5.3"): SYNTHETIC(alpha, beta) with
(alpha, beta) in {(.1,.1), (.5,.5), (1,1)}, N = 30 devices, equal sample counts, the first
five traces, Scheme C; device 0 departs at tau_0 in {10, 15, ..., 50} (it trains in round
tau_0 and the objective shifts at its close). Per (alpha, beta, seed) one group holds the
include, exclude and auto runs of every tau_0: paired, identical until tau_0.

Crossing (simulator.paper.curves.rounds_until_cross): the paper's protocol tests "include" on its
own objective's test set (with the departed device's holdout) and "exclude" without it; the
page also gives the crossing with both tested without it (the "active" test set).

The auto policy (coordinator.rules.objective.AutoDeparture, Corollary 4.3) excludes when
T - tau_0 >= c sqrt(Gamma_l tau_0). Its constant c is chosen on seeds TUNE_SEEDS of this
grid and evaluated on the other seeds: at each remaining horizon T - tau_0 in HORIZONS, the
better policy is the one with the lower test loss at round T (each on its own test set, as
the paper compares them), and auto is right when it picks that one. Its baseline is the
threshold policy (ThresholdDeparture), which excludes when T - tau_0 >= k and knows nothing
of Gamma; both are also scored leave-one-seed-out: for each seed, c and k are chosen on the
other seeds and scored on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from coordinator.rules.config import AUTO_C, RulesConfig
from coordinator.rules.gamma import GAMMA_ROUNDS
from coordinator.rules.objective import AutoDeparture, ThresholdDeparture
from coordinator.rules.round_record import RoundRecord
from flexfl.csv_records import converted, read_records
from flexfl.errors import ConfigError
from flexfl.markdown import ranges, table
from flexfl.run_spec import RunSpec
from flexfl.vocabulary import DeparturePolicy, Scheme
from simulator.engine import DepartureEvent, ExtraTest, ScheduleConfig, SimConfig, TracesConfig
from simulator.groups import Group, Run
from simulator.paper.curves import rounds_until_cross
from simulator.paper.regime import Regime
from simulator.sweep import finished, read_metrics
from workloads.partition_spec import PartitionSpec, Sizes

PAPER_TABLE5 = {
    (0.1, 0.1): (2, 5, 3, 3, 9, 3, 10, 26, 40),
    (0.5, 0.5): (1, 3, 9, 14, 13, 7, 12, 36, 34),
    (1.0, 1.0): (10, 9, 27, 18, 34, 17, 28, 62, 77),
}
ALPHA_BETA = tuple(PAPER_TABLE5)
TAU0 = (10, 15, 20, 25, 30, 35, 40, 45, 50)
ROUNDS = 200
POLICIES = ("include", "exclude", "auto")
HORIZONS = (2, 5, 10, 20, 40, 80, 150)  # T - tau_0 at which auto is judged
TUNE_SEEDS = (0, 1, 2)
C_GRID = tuple(float(c) for c in np.round(np.logspace(-2, 2, 33), 4))
# Every distinct threshold decision over HORIZONS: exclude from horizon h on, or never (ROUNDS).
K_GRID = tuple(float(k) for k in (*HORIZONS, ROUNDS))


def _ab(ab: tuple[float, float]) -> str:
    return f"{ab[0]:g}-{ab[1]:g}"


def run_config(ab: tuple[float, float], *, seed: int, tau0: int, policy: str, regime: Regime = Regime()) -> SimConfig:
    # Choosing c or k (AUTO_C, THRESHOLD_K) leaves the saved include/exclude runs valid:
    # a run's saved config is compared where the run uses it (SimConfig.in_effect).
    return regime.apply(SimConfig(
        partition=PartitionSpec(dataset="synthetic", n_devices=30, alpha=ab[0], beta=ab[1], sizes=Sizes.EQUAL,
                                seed=seed),
        rules=RulesConfig(scheme=Scheme.C, departure_policy=DeparturePolicy(policy)),
        run=RunSpec(rounds=ROUNDS, seed=seed),
        traces=TracesConfig(num_traces=5), extra_tests=(ExtraTest.ACTIVE,),
        schedule=ScheduleConfig(departures=(DepartureEvent(device=0, round=tau0),))))


def groups(*, seeds: Sequence[int], alpha_beta: Sequence[tuple[float, float]] = ALPHA_BETA,
           tau0s: Sequence[int] = TAU0, regime: Regime = Regime()) -> list[Group]:
    return [Group(tuple(
        Run(name=f"ab{_ab(ab)}_tau{t}_seed{seed}_{policy}",
            config=run_config(ab, seed=seed, tau0=t, policy=policy, regime=regime),
            labels={"alpha": ab[0], "beta": ab[1], "tau0": t, "seed": seed, "policy": policy})
        for t in tau0s for policy in POLICIES)) for seed in seeds for ab in alpha_beta]



class Decided(Protocol):
    """A departure as the rules are scored on it: a Departure (with its curves) or a Crossing (a CSV row)."""

    @property
    def tau0(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def gamma(self) -> float | None: ...
    def better(self, horizon: int) -> str: ...


@dataclass(frozen=True)
class Departure:
    """One (alpha, beta, tau_0, seed): the paired include/exclude curves and what auto did."""

    ab: tuple[float, float]
    tau0: int
    seed: int
    include: dict[int, float]  # test loss per round, on the objective's test set
    exclude: dict[int, float]
    include_active: dict[int, float]  # include's loss without the departed device's holdout
    gamma: float | None  # the Gamma estimate at the departure
    auto_choice: str  # what the auto run decided (with T = ROUNDS)

    def cross(self, *, same_test_set: bool = False) -> int | None:
        return rounds_until_cross(self.include_active if same_test_set else self.include, self.exclude,
                                  departure_round=self.tau0).rounds

    def better(self, horizon: int) -> str:
        """The policy with the lower test loss at round tau_0 + horizon (ties: exclude)."""
        r = self.tau0 + horizon
        return "exclude" if self.exclude[r] <= self.include[r] else "include"


def collect(*, seeds: Sequence[int], work_dir, regime: Regime = Regime()) -> list[Departure]:
    runs: dict[tuple, dict[str, list[RoundRecord]]] = {}
    for s in finished(groups(seeds=seeds, regime=regime), work_dir=work_dir):
        key = ((float(s["alpha"]), float(s["beta"])), int(s["tau0"]), int(s["seed"]))
        runs.setdefault(key, {})[s["policy"]] = read_metrics(work_dir, s["name"])
    out = []
    for (ab, tau0, seed), by in sorted(runs.items()):
        if set(by) != set(POLICIES):
            continue
        inc, exc, auto = by["include"], by["exclude"], by["auto"]
        at = next(r for r in inc if r.round == tau0)
        auto_at = next(r for r in auto if r.round == tau0)
        out.append(Departure(
            ab=ab, tau0=tau0, seed=seed, include={r.round: r.test_loss for r in inc},
            exclude={r.round: r.test_loss for r in exc},
            include_active={r.round: (r.extra_tests or {})["active"]["loss"] for r in inc},
            gamma=at.departure_gammas.get("dev-0"), auto_choice=auto_at.departure_policies["dev-0"]))
    return out


def auto_accuracy(departures: Sequence[Decided], c: float) -> float:
    """Share of (departure, horizon) cases where the rule with constant c picks the better policy."""
    hits = [AutoDeparture(c=c).decide(tau0=d.tau0, horizon=d.tau0 + h, gamma=d.gamma) == d.better(h)
            for d in departures for h in HORIZONS if d.tau0 + h <= ROUNDS]
    return float(np.mean(hits)) if hits else float("nan")


def threshold_accuracy(departures: Sequence[Decided], k: float) -> float:
    """Share of (departure, horizon) cases where "exclude iff T - tau_0 >= k" picks the better policy."""
    hits = [ThresholdDeparture(k=k).decide(tau0=d.tau0, horizon=d.tau0 + h) == d.better(h)
            for d in departures for h in HORIZONS if d.tau0 + h <= ROUNDS]
    return float(np.mean(hits)) if hits else float("nan")


def baseline_accuracy(departures: Sequence[Decided], policy: str) -> float:
    hits = [d.better(h) == policy for d in departures for h in HORIZONS if d.tau0 + h <= ROUNDS]
    return float(np.mean(hits)) if hits else float("nan")


def choose_c(departures: Sequence[Decided]) -> tuple[float, float]:
    """The c of C_GRID with the best accuracy on `departures` (the smallest of equals) and that accuracy."""
    scored = [(auto_accuracy(departures, c), -c) for c in C_GRID]
    best, neg_c = max(scored)
    return -neg_c, best


def choose_k(departures: Sequence[Decided]) -> tuple[float, float]:
    """The k of K_GRID with the best threshold accuracy on `departures` (the smallest of equals) and that accuracy."""
    scored = [(threshold_accuracy(departures, k), -k) for k in K_GRID]
    best, neg_k = max(scored)
    return -neg_k, best


@dataclass(frozen=True)
class Fold:
    """One leave-one-seed-out fold: c and k chosen on the other seeds, accuracies on `seed`."""

    seed: int
    c: float
    auto: float
    k: float
    threshold: float
    include: float  # always include, on `seed`
    exclude: float


def leave_one_seed_out(departures: Sequence[Decided]) -> list[Fold]:
    """Per seed: auto's c and threshold's k chosen on the other seeds' departures, both scored on this seed's."""
    seeds = sorted({d.seed for d in departures})
    if len(seeds) < 2:
        raise ConfigError(f"leave-one-seed-out needs departures of two seeds or more, got seeds {seeds}")
    folds = []
    for seed in seeds:
        train = [d for d in departures if d.seed != seed]
        held = [d for d in departures if d.seed == seed]
        c, _ = choose_c(train)
        k, _ = choose_k(train)
        folds.append(Fold(seed=seed, c=c, auto=auto_accuracy(held, c), k=k, threshold=threshold_accuracy(held, k),
                          include=baseline_accuracy(held, "include"), exclude=baseline_accuracy(held, "exclude")))
    return folds


def loso_section(departures: Sequence[Decided]) -> str:
    """The page's "auto vs threshold, leave-one-seed-out" section (Markdown)."""
    folds = leave_one_seed_out(departures)
    lines = ["| held-out seed | auto: c | auto right | threshold: k | threshold right | always include "
             "| always exclude |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {f.seed} | {f.c:g} | {f.auto:.1%} | {f.k:g} | {f.threshold:.1%} | {f.include:.1%} | {f.exclude:.1%} |"
              for f in folds]
    mean = {name: float(np.mean([getattr(f, name) for f in folds]))
            for name in ("auto", "threshold", "include", "exclude")}
    lines.append(f"| mean | | **{mean['auto']:.1%}** | | **{mean['threshold']:.1%}** | {mean['include']:.1%} "
                 f"| {mean['exclude']:.1%} |")
    verdict = ("auto, which knows Gamma_l, beats the threshold rule, which does not"
               if mean["auto"] > mean["threshold"] else
               "auto does no better than the threshold rule: the Gamma estimate adds nothing here")
    return f"""## auto vs threshold, leave-one-seed-out

For each seed, auto's c (of {C_GRID_TEXT}) and the threshold rule's k (exclude iff T - tau_0 >= k,
k in {list(int(k) for k in K_GRID)}) are chosen on the other seeds, the smallest of equally
good values; "right" is the share of that seed's (departure, horizon) cases where the rule
picks the policy with the lower test loss at T.

Mean over the {len(folds)} folds: {verdict}.

""" + "\n".join(lines) + "\n"


RUNS_CSV = "table5_runs.csv"  # beside the page: one row per departure
RUN_KEY = ("alpha", "beta", "tau0", "seed")
NEVER = "never"
# table5_runs.csv's columns for Crossing fields named otherwise (read_records' `columns`).
AUTO_CHOICE_COLUMN = f"auto_choice_T{ROUNDS}"


def _better_at_column(horizon: int) -> str:
    return f"better_at_T-tau0={horizon}"


def _rounds(text: str) -> int | None:
    return None if text == NEVER else int(text)


def _alpha_beta(texts: tuple[str, ...]) -> tuple[float, float]:
    alpha, beta = texts
    return float(alpha), float(beta)


def _better_at(texts: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    """(T - tau_0, policy) per horizon; the cells of horizons past the run (tau_0 + h > ROUNDS) are empty."""
    return tuple((h, policy) for h, policy in zip(HORIZONS, texts) if policy)


_ROUNDS_OR_NEVER = f"a round count or '{NEVER}'"


@dataclass(frozen=True)
class Crossing:
    """What the page says of one departure, and its row of table5_runs.csv: the crossings, the
    Gamma estimate, what auto decided and the better policy per horizon. The page is rendered
    from these alone, so it can be rendered again from the committed CSV (read_crossings)."""

    ab: tuple[float, float] = field(metadata=converted(_alpha_beta, columns=("alpha", "beta"), expected="two numbers"))
    tau0: int
    seed: int
    gamma: float | None
    cross: int | None = field(metadata=converted(_rounds, expected=_ROUNDS_OR_NEVER))  # None: never within the run
    cross_same_test_set: int | None = field(metadata=converted(_rounds, expected=_ROUNDS_OR_NEVER))
    auto_choice: str
    # (T - tau_0, the policy with the lower test loss at T)
    better_at: tuple[tuple[int, str], ...] = field(metadata=converted(
        _better_at, columns=tuple(map(_better_at_column, HORIZONS)), expected="include, exclude or empty per horizon"))

    def better(self, horizon: int) -> str:
        return dict(self.better_at)[horizon]

    def to_row(self) -> dict:
        return {"alpha": self.ab[0], "beta": self.ab[1], "tau0": self.tau0, "seed": self.seed, "gamma": self.gamma,
                "cross": NEVER if self.cross is None else self.cross,
                "cross_same_test_set": NEVER if self.cross_same_test_set is None else self.cross_same_test_set,
                AUTO_CHOICE_COLUMN: self.auto_choice,
                **{_better_at_column(h): p for h, p in self.better_at}}


def read_crossings(path) -> tuple[Crossing, ...]:
    """The lines of a table5_runs.csv; a ReportError names the file, line and column of a bad one."""
    return tuple(read_records(path, Crossing, columns={"auto_choice": AUTO_CHOICE_COLUMN}))


def summarise(d: Departure) -> Crossing:
    return Crossing(ab=d.ab, tau0=d.tau0, seed=d.seed, gamma=d.gamma, cross=d.cross(),
                    cross_same_test_set=d.cross(same_test_set=True), auto_choice=d.auto_choice,
                    better_at=tuple((h, d.better(h)) for h in HORIZONS if d.tau0 + h <= ROUNDS))


def crossing_cell(rounds: Sequence[int | None]) -> str:
    """Median [min, max] over seeds of the rounds until the crossing; a seed that never crosses
    counts as later than any round. Where the median is such a seed the cell says "never" and how
    many seeds crossed: a median read off a run that ended before it is no figure."""
    got = sorted(x for x in rounds if x is not None)
    never = len(rounds) - len(got)
    if not rounds:
        return "n/a"
    if not got:
        return NEVER
    median = float(np.median([*got, *[np.inf] * never]))
    span = f"{got[0]}" if len(got) == 1 else f"{got[0]}-{got[-1]}"
    if not np.isfinite(median):
        return f"{NEVER} ({len(got)} of {len(rounds)} seeds crossed: {span})"
    return f"{median:g} [{got[0]}, {got[-1]}]" + (f" ({never}× never)" if never else "")


def crossing_table(crossings: Sequence[Crossing], *, same_test_set: bool) -> str:
    """FlexFL's row (crossing_cell per tau_0) and the paper's per (alpha, beta), then the medians' range."""
    rows: list[list[object]] = []
    medians: list[float] = []
    never = 0
    for ab in ALPHA_BETA:
        cells = []
        for t in TAU0:
            v = [d.cross_same_test_set if same_test_set else d.cross for d in crossings if d.ab == ab and d.tau0 == t]
            cells.append(crossing_cell(v))
            if cells[-1].startswith(NEVER):
                never += 1
            elif v:
                medians.append(float(cells[-1].split()[0]))
        rows += [[f"({ab[0]:g}, {ab[1]:g}) FlexFL", *cells], [f"({ab[0]:g}, {ab[1]:g}) paper", *PAPER_TABLE5[ab]]]
    n_cells = len(ALPHA_BETA) * len(TAU0)
    summary = (f"No cell's median seed crossed within the {ROUNDS}-round run.\n" if not medians else
               f"Medians of the cells: {ranges(medians)} rounds after tau_0"
               + (f"; never at the median in {never} of {n_cells} cells" if never else "") + ".\n")
    return table(["(alpha, beta)", *map(str, TAU0)], rows) + "\n" + summary


def _words(items: Sequence[object]) -> str:
    """'0', '0 and 1', '0, 1 and 2'."""
    text = [str(x) for x in items]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


def _seeds(items: Sequence[int]) -> str:
    return f"seed{'s' if len(items) > 1 else ''} {_words(items)}"


C_GRID_TEXT = f"{len(C_GRID)} values log-spaced from {C_GRID[0]:g} to {C_GRID[-1]:g}"


@dataclass(frozen=True)
class Tuning:
    """auto's constant c chosen on the tuning seeds that finished, scored on the other seeds."""

    tuned_on: tuple[int, ...]
    c: float
    tune_acc: float
    held: int  # departures scored
    held_acc: float
    base: dict[str, float]  # always include / always exclude on the held-out departures
    exclude_better: dict[int, float]  # per horizon, share of held-out cases where excluding was better

    @classmethod
    def of(cls, crossings: Sequence[Crossing]) -> Tuning:
        tune = [d for d in crossings if d.seed in TUNE_SEEDS]
        held = [d for d in crossings if d.seed not in TUNE_SEEDS]
        c, tune_acc = choose_c(tune) if tune else (float("nan"), float("nan"))
        scored = bool(tune and held)
        return cls(tuned_on=tuple(sorted({d.seed for d in tune})), c=c, tune_acc=tune_acc, held=len(held),
                   held_acc=auto_accuracy(held, c) if scored else float("nan"),
                   base={p: baseline_accuracy(held, p) for p in ("include", "exclude")} if scored else {},
                   exclude_better={h: float(np.mean([d.better(h) == "exclude" for d in held if d.tau0 + h <= ROUNDS]))
                                   for h in HORIZONS} if scored else {})

    def text(self, seeds: Sequence[int]) -> str:
        missing = [s for s in TUNE_SEEDS if s not in self.tuned_on]
        if not self.tuned_on:
            return (f"- c not chosen: none of the tuning seeds ({_words(TUNE_SEEDS)}) has finished here.")
        lines = [f"- c chosen on {_seeds(self.tuned_on)} (of {C_GRID_TEXT}): **c = {self.c:g}**"
                 + (f"; the other tuning {_seeds(missing)} ha{'ve' if len(missing) > 1 else 's'} not finished here"
                    if missing else "")
                 + f"\n  (right in {self.tune_acc:.1%} of their cases); the default `rules.auto_c` is {AUTO_C:g} "
                 "(AUTO_C in coordinator/rules/config.py), changed only by a commit that cites this page."]
        if not self.held:
            lines.append(f"- Not evaluated yet: no seed outside the tuning seeds ({_words(TUNE_SEEDS)}) has finished "
                         f"(this page's seeds: {_words(seeds)}); rerun the sweep with them to score c on held-out "
                         "seeds.")
            return "\n".join(lines)
        horizons = list(HORIZONS)
        lines.append(f"""- Evaluated on the other seeds ({self.held} departures x horizons T - tau_0 in {horizons}):
  auto picks the policy with the lower final test loss in **{self.held_acc:.1%}** of cases;
  always include: {self.base['include']:.1%}; always exclude: {self.base['exclude']:.1%}.
- Share of held-out cases where excluding was better, per remaining horizon:
  {", ".join(f"{h}: {v:.0%}" for h, v in self.exclude_better.items())}.""")
        return "\n".join(lines)


@dataclass(frozen=True)
class Table5Page:
    """Everything results/table5.md says, computed; render() writes it out."""

    crossings: tuple[Crossing, ...]
    seeds: tuple[int, ...]
    timing: str
    regime: str  # the regime in words, with its note
    plot: str  # the loss plot's file name, beside the page

    @property
    def n_seeds(self) -> int:
        return len({d.seed for d in self.crossings})

    @property
    def tuning(self) -> Tuning:
        return Tuning.of(self.crossings)


def _setup_text() -> str:
    """The setup paragraphs of the page: the module's docstring with its constants said in words."""
    doc = (__doc__ or "").split(chr(10), 2)[2]
    return (doc.replace("seeds TUNE_SEEDS", _seeds(TUNE_SEEDS))
            .replace("horizon T - tau_0 in HORIZONS", f"horizon T - tau_0 in {{{', '.join(map(str, HORIZONS))}}}"))


def render(page: Table5Page) -> str:
    """The Markdown of results/table5.md."""
    deps = page.crossings
    gammas = {ab: [d.gamma for d in deps if d.ab == ab and d.gamma is not None] for ab in ALPHA_BETA}
    auto_runs = {ab: sum(d.auto_choice == "exclude" for d in deps if d.ab == ab) for ab in ALPHA_BETA}
    return f"""# Table 5: rounds until the include and exclude losses cross, and the `auto` rule

Generated by `flexfl sim table5` (`make paper-table5`); {page.n_seeds} seeds per cell. Wall time: {page.timing}.

Regime: {page.regime}.
Every departure's figures (crossings, Gamma estimate, the better policy per horizon): `table5_runs.csv`.

![include vs exclude after a departure]({page.plot})

{_setup_text()}
## Crossing, the paper's protocol (include on its own test set)

Median [min, max] over seeds of the rounds after tau_0 until exclude's test loss is at or
below include's (1 = one round after the shift); "never" = not within the {ROUNDS}-round run
(where the median seed never crosses, the cell says never and how many seeds crossed).

{crossing_table(deps, same_test_set=False)}
## Crossing with both tested without the departed device

{crossing_table(deps, same_test_set=True)}
## The auto departure rule (Corollary 4.3)

`departure_policy = "auto"` (coordinator/rules/objective.py AutoDeparture): exclude when
T - tau_0 >= c sqrt(Gamma_l tau_0). Gamma_l is estimated from what the coordinator receives,
the updates (coordinator/rules/gamma.py): the device's mean local gradient g_l = -delta_l / (lr s)
minus the round's p-weighted mean of those of all contributors is its gradient
dissimilarity, grad F_l - grad F, whose square near w* brackets Gamma_l for the paper's
strongly convex, smooth objectives. Half the product of two consecutive rounds' values,
which unlike the square has no minibatch-noise floor (it would grow as 1/s), averaged over
the device's last {GAMMA_ROUNDS} pairs. Median Gamma estimate at the departure:
{", ".join(f"({ab[0]:g},{ab[1]:g}): {np.median(g):.3f}" for ab, g in gammas.items() if g)}.

{page.tuning.text(page.seeds)}
- The auto runs of the grid (T = {ROUNDS}, so T - tau_0 >= 150): excluded in
  {", ".join(f"({ab[0]:g},{ab[1]:g}): {auto_runs[ab]}/{sum(1 for d in deps if d.ab == ab)}" for ab in ALPHA_BETA)}.

{loso_section(deps) if page.n_seeds > 1 else ""}"""


def write_page(out_dir, *, work_dir, seeds: Sequence[int], timing: str, regime: Regime = Regime(),
               replace_page: bool = False):
    """results/table5.md: crossing rounds per (alpha, beta, tau_0) beside the paper's, and the auto rule.

    If the committed table5_runs.csv lists departures not finished here, everything goes to
    <out_dir>/local instead (simulator.report.page_dir) unless `replace_page`."""
    from simulator.report import page_dir

    deps = collect(seeds=seeds, work_dir=work_dir, regime=regime)
    if not deps:
        raise ConfigError(f"no finished Table 5 runs in {work_dir} (run without --report-only)")
    crossings = tuple(summarise(d) for d in deps)
    out_dir = page_dir(out_dir, RUNS_CSV, [d.to_row() for d in crossings], RUN_KEY, replace=replace_page)
    plot = _plot_losses(out_dir / "table5_losses.png", deps)
    page = Table5Page(crossings=crossings, seeds=tuple(seeds), timing=timing, plot=plot.name,
                      regime=f"{regime.describe('synthetic')} ({regime.reading_note('Table 5')})")
    path = _write(out_dir, page)
    return path, page.tuning.c, page.tuning.held_acc


def _write(out_dir, page: Table5Page):
    from pathlib import Path

    from flexfl.files import atomic_file
    from simulator.report import write_csv_atomic

    write_csv_atomic(Path(out_dir) / RUNS_CSV, [d.to_row() for d in page.crossings])
    path = Path(out_dir) / "table5.md"
    with atomic_file(path) as f:
        f.write(render(page))
    return path


def page_from_csv(out_dir, *, regime: Regime):
    """Render out_dir/table5.md again from the table5_runs.csv and table5_timing.json beside it (the
    committed figures; the loss plot, which needs every run's curves, is left as it is)."""
    import json
    from pathlib import Path

    crossings = read_crossings(Path(out_dir) / RUNS_CSV)
    timing = json.loads((Path(out_dir) / "table5_timing.json").read_text())
    page = Table5Page(crossings=crossings, seeds=tuple(sorted({d.seed for d in crossings})),
                      timing="; ".join(timing.values()), plot="table5_losses.png",
                      regime=f"{regime.describe('synthetic')} ({regime.reading_note('Table 5')})")
    return _write(out_dir, page)


PLOT_TAU0 = (10, 30, 50)


def _plot_losses(path, deps: Sequence[Departure]):
    """Test loss after the departure, include (solid) vs exclude (dashed), mean over seeds, per (alpha, beta)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ALPHA_BETA), figsize=(4.2 * len(ALPHA_BETA), 3.6), sharey=False)
    for ax, ab in zip(np.atleast_1d(axes), ALPHA_BETA):
        for t, color in zip(PLOT_TAU0, ("tab:blue", "tab:green", "tab:red")):
            runs = [d for d in deps if d.ab == ab and d.tau0 == t]
            if not runs:
                continue
            rounds = np.arange(t, ROUNDS + 1)
            for policy, style in (("include", "-"), ("exclude", "--")):
                loss = np.mean([[getattr(d, policy)[r] for r in rounds] for d in runs], axis=0)
                ax.plot(rounds, loss, style, color=color, lw=1.2, label=f"tau_0 = {t}, {policy}")
        ax.set_title(f"SYNTHETIC({ab[0]:g}, {ab[1]:g})")
        ax.set_xlabel("round")
        ax.set_ylabel("test loss (mean over seeds)")
        ax.grid(alpha=0.3)
    labelled = [ax for ax in np.atleast_1d(axes) if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

