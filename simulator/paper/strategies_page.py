"""The strategies page: Schemes A/B/C, FedNova, FedProx and MIFA on the paper's traces.

`flexfl sim strategies --dataset D --unit U --eta0 SOURCE` runs (resumes) one section of
results/strategies.md: Table 3's headline setup for D (simulator.paper.table3: its per-label
sample sizes, the paper's devices and traces, 200 rounds) in the regime given, at
|T| = 2, 5, 8, IID and non-IID, seeds 0-4. The strategies of a (setting, |T|, seed) are one
paired group (simulator.paper.schemes.comparison_groups): they share data, initial model, trace
assignment, s draws and minibatches, and train together (FedProx's rows at their mu beside
the others' at 0). Every section the plan file lists goes on the page, so a section run in
another regime (e.g. MNIST under the step reading, for cost) stands beside it.

FedProx's mu: the protocol, written down before any run under it (2026-11-25) and never
changed to fit a result; the section's first step runs it when the mu file has no choice
for (regime, dataset):

1. Setup: the section's own (Table 3's headline setup for the dataset, the section's unit
   and eta_0), FedProx alone, at |T| = 5 (the middle of the page's |T| = 2, 5, 8: under
   |T| = 1 every device completes E and the proximal term would only regularise), IID and
   non-IID, on the operating point's seeds (simulator.paper.operating_point.PROTOCOL_SEEDS), which
   the page never uses.
2. Grid: FedProx's own candidate set, mu in {0.001, 0.01, 0.1, 1} (Li et al., MLSys 2020,
   Section 5: "we select the best mu from the limited candidate set {0.001, 0.01, 0.1, 1}").
   mu = 0 is not a candidate: it is Scheme B, already on the page.
3. Criterion: the lowest test loss after the last round, mean over the (setting, seed) runs;
   a run that diverges scores +inf; a tie goes to the smaller mu.
4. Horizon: the operating point's (simulator.paper.operating_point.horizon: 200 rounds, 20 for
   MNIST under the epoch reading).
It sees FedProx's runs only: nothing in it compares FedProx with another strategy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from coordinator.rules.strategies import MIFA, FedNova, FedProx
from flexfl.errors import ConfigError
from flexfl.files import atomic_file
from flexfl.markdown import fixed, table
from flexfl.vocabulary import Scheme
from simulator.groups import Executor, Group, Run
from simulator.paper.choices_file import read_choices, write_choice
from simulator.paper.operating_point import PROTOCOL_SEEDS, horizon
from simulator.paper.regime import Regime
from simulator.paper.schemes import cell_config, comparison_groups
from simulator.sweep import finished, run_sweep

STRATEGIES = (*(s.value for s in Scheme), FedNova.name, FedProx.name, MIFA.name)
FEDPROX = FedProx.name
NUM_TRACES = (2, 5, 8)
SETTINGS = ("iid", "niid")
MU_GRID = (0.001, 0.01, 0.1, 1.0)
MU_NUM_TRACES = 5
PAGE, RUNS_CSV, MU_FILE, PLAN_FILE, TIMING_FILE = ("strategies.md", "strategies_runs.csv", "strategies_mu.toml",
                                                   "strategies_plan.json", "strategies_timing.json")
RUN_KEY = ("dataset", "regime", "setting", "num_traces", "seed", "scheme")


def section_key(dataset: str, regime: Regime) -> str:
    """Names a section, its work folders and its entries in the plan and mu files: <dataset>_<regime tag>."""
    return f"{dataset}_{regime.tag}"


def work_dir(out_dir: Path, dataset: str, regime: Regime, *, mu: bool = False) -> Path:
    return Path(out_dir) / "runs" / f"strategies_{section_key(dataset, regime)}{'_mu' if mu else ''}"


def base_config(dataset: str, regime: Regime):
    """Table 3's headline setup for `dataset` in `regime`, and the sample-size rule of its reading."""
    from simulator.paper.table3 import HEADLINE, READINGS
    from simulator.paper.table3 import base_config as table3_base

    reading = READINGS[HEADLINE]
    return table3_base(dataset, reading, regime), reading


# ---- FedProx's mu ------------------------------------------------------------------------------


def mu_groups(dataset: str, regime: Regime) -> list[Group]:
    """One group per (protocol seed, setting): FedProx at every mu of the grid, trained together."""
    base, reading = base_config(dataset, regime)
    base = base.with_run(rounds=horizon(dataset, regime.unit))
    groups = []
    for seed in PROTOCOL_SEEDS[dataset]:
        for setting in SETTINGS:
            runs = []
            for mu in MU_GRID:
                cfg = cell_config(base, setting=setting, seed=seed, num_traces=MU_NUM_TRACES, scheme=FEDPROX, mu=mu)
                cfg = replace(cfg, partition=replace(cfg.partition, sizes=reading.sizes(cfg.partition)))
                runs.append(Run(name=f"mu_{setting}_seed{seed}_mu{mu:g}", config=cfg,
                                labels={"setting": setting, "seed": seed, "mu": mu}))
            groups.append(Group(tuple(runs)))
    return groups


def mu_scores(summaries: Sequence[dict]) -> dict[float, float]:
    """{mu: mean final test loss over its (setting, seed) runs}, +inf where a run diverged."""
    by: dict[float, list[float]] = {}
    for s in summaries:
        loss = math.inf if "error" in s or not math.isfinite(s["final_loss"]) else float(s["final_loss"])
        by.setdefault(float(s["mu"]), []).append(loss)
    return {mu: float(np.mean(v)) for mu, v in sorted(by.items())}


def choose_mu(scores: dict[float, float]) -> float:
    if not scores or all(math.isinf(v) for v in scores.values()):
        raise ConfigError("FedProx's mu protocol: every mu of the grid diverged")
    return min(scores, key=lambda mu: (scores[mu], mu))


def chosen_mu(out_dir: Path, dataset: str, regime: Regime) -> float | None:
    """The mu the protocol chose for (regime, dataset), or None if it has not run."""
    path = Path(out_dir) / MU_FILE
    entry = read_choices(path).get(section_key(dataset, regime))
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("mu"), (int, float)) or not entry["mu"] > 0:
        raise ConfigError(f"{path}: [{section_key(dataset, regime)}] needs mu, a number > 0; got {entry!r}")
    return float(entry["mu"])


def run_mu_protocol(out_dir: Path, dataset: str, regime: Regime, *, executor: Executor | None = None,
                    report: Callable[[str], None] = print) -> float:
    """Run (resume) the mu grid and record the choice in the mu file; returns it."""
    import time

    from simulator.paper.table3 import elapsed

    started = time.perf_counter()
    summaries = run_sweep(mu_groups(dataset, regime), work_dir=work_dir(out_dir, dataset, regime, mu=True),
                          executor=executor, report=report, failures="return")
    scores = mu_scores(summaries)
    mu = choose_mu(scores)
    computed = sum(not s.get("cached") for s in summaries)
    write_choice(Path(out_dir) / MU_FILE, (section_key(dataset, regime),), {
        "mu": mu, "mean_final_test_loss": {f"{m:g}": v for m, v in scores.items()},
        "seeds": list(PROTOCOL_SEEDS[dataset]), "num_traces": MU_NUM_TRACES, "rounds": horizon(dataset, regime.unit),
        "timing": f"{elapsed(started)} ({computed} of {len(summaries)} runs computed)"})
    report(f"FedProx's mu for {section_key(dataset, regime)}: {mu:g} (mean final test loss per mu: "
           + ", ".join(f"{m:g}: {v:.4f}" for m, v in scores.items()) + ")")
    return mu


# ---- the comparison ------------------------------------------------------------------------------


def page_groups(dataset: str, regime: Regime, *, mu: float, seeds: Sequence[int],
                num_traces: Sequence[int] = NUM_TRACES, settings: Sequence[str] = SETTINGS) -> list[Group]:
    base, reading = base_config(dataset, regime)

    def adjust(cfg):
        return replace(cfg, partition=replace(cfg.partition, sizes=reading.sizes(cfg.partition)))

    return comparison_groups(base, settings=settings, num_traces=num_traces, seeds=seeds, schemes=STRATEGIES,
                             adjust=adjust, mu_of={FEDPROX: mu})


def record_plan(out_dir: Path, dataset: str, regime: Regime, *, seeds: Sequence[int], num_traces: Sequence[int],
                settings: Sequence[str], command: str) -> None:
    """Add this section's grid to the plan file: the page lists every planned section and what remains."""
    path = Path(out_dir) / PLAN_FILE
    plan = json.loads(path.read_text()) if path.exists() else {}
    entry = plan.setdefault(section_key(dataset, regime), {"dataset": dataset, "unit": str(regime.unit),
                                                           "eta0": regime.eta0, "seeds": [], "num_traces": [],
                                                           "settings": [], "commands": []})
    for key, values in (("seeds", seeds), ("num_traces", num_traces), ("settings", settings)):
        entry[key] = sorted(set(entry[key]) | set(values), key=lambda v: (str(type(v)), v))
    if command not in entry["commands"]:
        entry["commands"].append(command)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        f.write(json.dumps(plan, indent=1))


def run_section(out_dir: Path, dataset: str, regime: Regime, *, seeds: Sequence[int],
                num_traces: Sequence[int] = NUM_TRACES, settings: Sequence[str] = SETTINGS, command: str,
                executor: Executor | None = None, report: Callable[[str], None] = print) -> list[dict]:
    """mu by the protocol (if not chosen yet), then every group of the section not yet finished."""
    mu = chosen_mu(out_dir, dataset, regime)
    if mu is None:
        mu = run_mu_protocol(out_dir, dataset, regime, executor=executor, report=report)
    record_plan(out_dir, dataset, regime, seeds=seeds, num_traces=num_traces, settings=settings, command=command)
    groups = page_groups(dataset, regime, mu=mu, seeds=seeds, num_traces=num_traces, settings=settings)
    return run_sweep(groups, work_dir=work_dir(out_dir, dataset, regime), executor=executor, report=report)


# ---- the page --------------------------------------------------------------------------------------

METRICS = (("final_acc", "final test accuracy (%)", 100.0), ("last20_acc", "mean test accuracy over the last 20 "
           "rounds (%)", 100.0), ("final_loss", "final test loss", 1.0))


def _median_range(values: Sequence[float], scale: float) -> str:
    if not values:
        return "not run"
    v = np.asarray(values, float)
    digits, times = (1, int(scale)) if scale != 1.0 else (3, 1)
    # fixed(): a figure of the runs CSV rounds on the page as a reader rounds the CSV's value, once.
    return " ".join([fixed(float(np.median(v)), digits, scale=times),
                     f"[{fixed(v.min(), digits, scale=times)}, {fixed(v.max(), digits, scale=times)}]"])


def metric_table(summaries: Sequence[dict], metric: str, scale: float, *, settings: Sequence[str],
                 num_traces: Sequence[int]) -> str:
    """Rows: strategies; columns: (setting, |T|); cells: median [min, max] over seeds."""
    from coordinator.rules.strategies import title_of

    cols = [(st, j) for st in settings for j in num_traces]
    rows = [[title_of(name), *(_median_range([s[metric] for s in summaries if (s["setting"], s["num_traces"],
                                                                               s["scheme"]) == (st, j, name)], scale)
                                for st, j in cols)] for name in STRATEGIES]
    return table(["strategy", *(f"{st.upper()} \\|T\\|={j}" for st, j in cols)], rows)


# Final test losses closer than this are a tie: half the last digit the loss table prints (3
# decimals), so two losses it shows equal, or one apart in the last digit, are never ranked.
# MIFA equals Scheme C in every round where every member sends an update, and on MNIST their
# final losses differ by <= 2e-4 in most groups.
TIE_TOLERANCE = 5e-4


@dataclass(frozen=True)
class LowestLoss:
    """Per strategy, the complete (setting, |T|, seed) groups where its final test loss is the lowest
    by more than TIE_TOLERANCE; the groups where several are within it of the lowest, per tied set."""

    wins: dict[str, int]
    ties: dict[tuple[str, ...], int]

    @property
    def groups(self) -> int:
        return sum(self.wins.values()) + sum(self.ties.values())

    def text(self) -> str:
        ties = "; tied: " + ", ".join(f"{' = '.join(names)} {n}" for names, n in self.ties.items()) if self.ties else ""
        return (f"Lowest final test loss, per (setting, |T|, seed) group (losses within {TIE_TOLERANCE:g} of the "
                "lowest, half the last digit printed above, tie with it): "
                + ", ".join(f"{n} {c}" for n, c in self.wins.items()) + f"{ties} (of {self.groups} complete groups).\n")


def lowest_loss_counts(summaries: Sequence[dict]) -> LowestLoss:
    """Which strategy has the lowest final test loss in each (setting, |T|, seed) group run in full."""
    by: dict[tuple, dict[str, float]] = {}
    for s in summaries:
        by.setdefault((s["setting"], s["num_traces"], s["seed"]), {})[s["scheme"]] = float(s["final_loss"])
    wins = dict.fromkeys(STRATEGIES, 0)
    ties: dict[tuple[str, ...], int] = {}
    for losses in by.values():
        if set(losses) >= set(STRATEGIES):
            low = min(losses[n] for n in STRATEGIES)
            best = tuple(n for n in STRATEGIES if losses[n] - low <= TIE_TOLERANCE)
            if len(best) == 1:
                wins[best[0]] += 1
            else:
                ties[best] = ties.get(best, 0) + 1
    return LowestLoss(wins=wins, ties=dict(sorted(ties.items(), key=lambda kv: (-kv[1], kv[0]))))


def _plots(out_dir: Path, key: str, title: str, summaries: Sequence[dict], run_dir: Path,
           settings: Sequence[str]) -> list[Path]:
    from simulator.report import plot_accuracy_curves
    from simulator.sim_rows import read_accuracy_curve

    paths = []
    for setting in settings:
        curves: dict[str, dict[str, list]] = {}
        for s in summaries:
            if s["setting"] == setting:
                acc = read_accuracy_curve(run_dir / f"{s['name']}.csv")
                curves.setdefault(f"|T| = {s['num_traces']}", {}).setdefault(s["scheme"], []).append(acc)
        if curves:
            path = Path(out_dir) / f"strategies_{key}_{setting}.png"
            plot_accuracy_curves(path, {k: {sc: np.mean(v, axis=0) for sc, v in by.items()}
                                        for k, by in sorted(curves.items(), key=lambda kv: int(kv[0].split()[-1]))},
                                 title=f"{title} {setting.upper()}: test accuracy, mean over seeds")
            paths.append(path)
    return paths


def _mu_section(out_dir: Path, key: str) -> str:
    entry = read_choices(Path(out_dir) / MU_FILE).get(key, {})
    if not entry:
        return "FedProx's mu: the protocol has not run for this section.\n"
    scores = entry["mean_final_test_loss"]
    return (f"FedProx's mu by the protocol: **mu = {entry['mu']:g}** (|T| = {entry['num_traces']}, seeds "
            f"{', '.join(map(str, entry['seeds']))}, {entry['rounds']} rounds; {entry['timing']}):\n\n"
            + table(["mu", *scores], [["mean final test loss", *(f"{v:.4f}" for v in scores.values())]]))


@dataclass(frozen=True)
class Section:
    """One section of the page: a (dataset, regime) of the plan, its finished runs and its plots."""

    key: str
    title: str
    entry: dict  # the plan's entry: commands, settings, num_traces, ...
    planned: int  # runs the plan asks for
    summaries: tuple[dict, ...]
    timing: str
    mu_text: str
    plots: tuple[str, ...]  # file names beside the page


def render_section(sec: Section) -> str:
    seeds_done = sorted({s["seed"] for s in sec.summaries})
    body = [f"## {sec.title}\n", f"Planned by {'; '.join(f'`{c}`' for c in sec.entry['commands'])}: "
            f"**{len(sec.summaries)} of {sec.planned} runs finished** (seeds with runs: {seeds_done or 'none'}). "
            f"Wall time: {sec.timing}.\n", sec.mu_text]
    if sec.summaries:
        for metric, text, scale in METRICS:
            body.append(f"**{text}**, median [min, max] over seeds:\n\n" + metric_table(
                sec.summaries, metric, scale, settings=sec.entry["settings"], num_traces=sec.entry["num_traces"]))
        body.append(lowest_loss_counts(sec.summaries).text())
        body += [f"![{Path(name).stem}]({name})" for name in sec.plots]
    return "\n".join(body)


def render(sections: Sequence[Section]) -> str:
    """The Markdown of results/strategies.md."""
    import simulator.paper.strategies_page as me

    protocol = "The protocol" + (me.__doc__ or "").split("FedProx's mu: the protocol", 1)[1]
    return (PAGE_HEAD + f"\n## FedProx's mu: the protocol\n\n{protocol}\n"
            + "\n\n".join(render_section(sec) for sec in sections) + "\n")


def _plan(out_dir: Path) -> dict:
    plan_path = Path(out_dir) / PLAN_FILE
    if not plan_path.exists():
        raise ConfigError(f"{plan_path} does not exist: no strategies section has run (run without --report-only)")
    return json.loads(plan_path.read_text())


def _sections(out_dir: Path, timing: dict[str, str], runs: Callable[[str, dict, Regime, list[Group]], list[dict]],
              plots: Callable[[str, dict, Regime, list[dict]], list[str]]) -> list[Section]:
    """Every section of the plan whose mu is chosen, with the runs `runs` finds and the plots `plots` names."""
    sections = []
    for key, entry in _plan(out_dir).items():
        regime = Regime(unit=entry["unit"], eta0=entry["eta0"])
        mu = chosen_mu(out_dir, entry["dataset"], regime)
        if mu is None:
            continue
        groups = page_groups(entry["dataset"], regime, mu=mu, seeds=entry["seeds"], num_traces=entry["num_traces"],
                             settings=entry["settings"])
        summaries = runs(key, entry, regime, groups)
        sections.append(Section(key=key, title=f"{entry['dataset'].upper()}, {regime.describe(entry['dataset'])}",
                                entry=entry, planned=sum(len(g.runs) for g in groups), summaries=tuple(summaries),
                                timing=timing.get(key, "not recorded"), mu_text=_mu_section(out_dir, key),
                                plots=tuple(plots(key, entry, regime, summaries)) if summaries else ()))
    return sections


def _row(entry: dict, regime: Regime, s: dict) -> dict:
    return {"dataset": entry["dataset"], "regime": regime.tag, **{k: s[k] for k in (
        "setting", "num_traces", "seed", "scheme", "final_acc", "last20_acc", "final_loss", "wall_s")}}


def write_page(out_dir: Path, *, timing: dict[str, str], replace_page: bool = False) -> Path:
    """results/strategies.md from every finished run of every section in the plan file."""
    from simulator.paper.table3 import with_window
    from simulator.report import page_dir, write_csv_atomic

    def runs(key: str, entry: dict, regime: Regime, groups: list[Group]) -> list[dict]:
        run_dir = work_dir(out_dir, entry["dataset"], regime)
        return with_window(finished(groups, work_dir=run_dir), run_dir) if run_dir.exists() else []

    found = _sections(out_dir, timing, runs, lambda *a: [])
    rows = [_row(sec.entry, Regime(unit=sec.entry["unit"], eta0=sec.entry["eta0"]), s)
            for sec in found for s in sec.summaries]
    out = page_dir(out_dir, RUNS_CSV, rows, RUN_KEY, replace=replace_page)
    sections = [replace(sec, plots=tuple(p.name for p in _plots(
        out, sec.key, sec.entry["dataset"].upper(), sec.summaries,
        work_dir(out_dir, sec.entry["dataset"], Regime(unit=sec.entry["unit"], eta0=sec.entry["eta0"])),
        sec.entry["settings"]))) if sec.summaries else sec for sec in found]
    write_csv_atomic(out / RUNS_CSV, rows)
    return _write(out, sections)


def _write(out: Path, sections: Sequence[Section]) -> Path:
    page = out / PAGE
    with atomic_file(page) as f:
        f.write(render(sections))
    return page


def page_from_csv(out_dir: Path) -> Path:
    """Render out_dir/strategies.md again from the strategies_runs.csv, plan, mu and timing files beside
    it (the committed figures; the plots, which need every run's curves, are named as they are)."""
    import csv

    with open(Path(out_dir) / RUNS_CSV, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    timing_path = Path(out_dir) / TIMING_FILE
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    ints, floats = ("num_traces", "seed"), ("final_acc", "last20_acc", "final_loss", "wall_s")

    def runs(key: str, entry: dict, regime: Regime, groups: list[Group]) -> list[dict]:
        return [{**r, **{k: int(r[k]) for k in ints}, **{k: float(r[k]) for k in floats}} for r in rows
                if (r["dataset"], r["regime"]) == (entry["dataset"], regime.tag)]

    def plots(key: str, entry: dict, regime: Regime, summaries: list[dict]) -> list[str]:
        return [f"strategies_{key}_{st}.png" for st in entry["settings"] if any(s["setting"] == st for s in summaries)]

    return _write(Path(out_dir), _sections(out_dir, timing, runs, plots))


PAGE_HEAD = """# Strategies beside Scheme C: FedNova, FedProx and MIFA on the paper's traces

Generated by `flexfl sim strategies` (`make strategies`; simulator/paper/strategies_page.py). Every
run is in `strategies_runs.csv`; FedProx's mu choices are in `strategies_mu.toml`.

The strategies (coordinator/rules/strategies.py; all accept partial work, s_k < E):
- **Scheme A**: complete devices only, rescaled by N / K_tau (the paper's baseline).
- **Scheme B**: every update at weight p_k, whatever its s_k.
- **Scheme C**: every update at (E / s_k) p_k, the paper's unbiased scheme.
- **FedNova** (Wang et al., NeurIPS 2020): tau_eff * sum_k p_k delta_k / s_k, tau_eff = sum_k p_k s_k.
- **FedProx** (Li et al., MLSys 2020): each device's local objective gains mu/2 ||w - w_G||^2; partial
  work aggregated as Scheme B.
- **MIFA** (Gu et al., NeurIPS 2021): the server keeps each device's latest update (an incomplete one
  scaled to E steps as Scheme C scales it) and applies all of them every round, so a silent device
  contributes its last update (one model of memory per device).

Setup of every section: Table 3's headline setup (simulator/paper/table3.py: per-label Pareto(0.5)
sample sizes, the paper's device count, traces `traces/paper`, E = 20, 200 rounds,
eta_tau = eta_0 / tau), at |T| = 2, 5, 8, IID and non-IID. The strategies of a (setting, |T|,
seed) share data, initial model, trace assignment, s draws and minibatches. Cells give the
median and the [min, max] over the seeds that finished; no cell is compared with a paper
value (the paper has none for FedNova, FedProx or MIFA). Two identities to read them by: MIFA
is Scheme C in every round where every member sends an update (its memories are then exactly
the round's own updates), so the two differ only through rounds where a device sends nothing
(s_k = 0); and under the epoch reading FedNova's tau_k are SGD steps, s_k ceil(n_k / B), so it
differs from FedAvg even when every device completes E epochs (devices of different sizes take
different numbers of steps), unlike Schemes A, B and C.
"""
