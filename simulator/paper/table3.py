"""Table 3 under several readings of what the paper leaves open: a sensitivity study.

The paper fixes Schemes A/B/C, |T| = 1..8, 200 rounds, the devices and the data, but not
(1) how Pareto(0.5) sample counts become counts for 100 devices and 60,000 images, nor
(2) how often a loaded device completes all E updates (E and the traces' mass at 1.0).
Each *reading* is one answer (workloads.partition_spec.Sizes for the counts, E for the
complete-round mass); for each, every cell of Table 3 runs over seeds as paired runs
(simulator.paper.schemes), and the page compares every reading with the paper:
- per cell, the median and the range over seeds of "B over A" and "C over B";
- the largest device's share of the data (median over seeds);
- an agreement score: the share of cells whose sign matches the paper's, and Spearman's
  rank correlation of the medians with the paper's values (per dataset, per column).

The headline reading is chosen by what the text supports (not by agreement): see HEADLINE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flexfl.errors import ConfigError
from flexfl.markdown import table
from flexfl.run_spec import RunSpec
from simulator.engine import SimConfig
from simulator.groups import Executor, Group
from simulator.paper.regime import Regime
from simulator.paper.schemes import comparison_groups
from simulator.paper_numbers import PAPER_DEVICES, PAPER_TABLE3
from simulator.report import Cell, table3_cells
from simulator.sweep import finished, run_sweep
from workloads.partition_spec import Dataset, PartitionSpec, Sizes


@dataclass(frozen=True)
class Reading:
    name: str
    sizes: Callable[[PartitionSpec], Sizes]  # the counts rule for a (dataset, IID or not) partition
    E: int
    text: str


def _per_label(p: PartitionSpec) -> Sizes:
    return Sizes.PARETO_PER_LABEL if p.dataset is not Dataset.SYNTHETIC and not p.iid else Sizes.PARETO_CAPPED


READINGS: dict[str, Reading] = {r.name: r for r in (
    Reading("per-label", _per_label, 20,
            "Pareto(0.5) shares with no device above one class's share of the data; for non-IID images, the "
            "devices of a label share that label's images in Pareto(0.5) proportions (never shrunk)"),
    Reading("scaled", lambda p: Sizes.PARETO, 20,
            "Pareto(0.5) draws (x_m = 1) scaled to the total: one device often holds most of the data; non-IID "
            "images shrink a label's devices to fit"),
    Reading("capped", lambda p: Sizes.PARETO_CAPPED, 20, "Pareto(0.5) shares, no device above one class's share"),
    Reading("truncated", lambda p: Sizes.PARETO_TRUNCATED, 20, "Pareto(0.5) truncated to [1, N], scaled"),
    Reading("lognormal", lambda p: Sizes.LOGNORMAL, 20, "FedProx's floor(LogNormal(4, 2)) + 50, scaled"),
    Reading("equal", lambda p: Sizes.EQUAL, 20, "equal counts (a control: no size heterogeneity)"),
    Reading("per-label-E10", _per_label, 10, "per-label sizes, E = 10: more complete rounds"),
    Reading("per-label-E5", _per_label, 5, "per-label sizes, E = 5: more complete rounds still"),
)}

# What the text supports best: "Type-I Pareto with index 0.5" shares, one label per device
# for non-IID images without anything said about shrinking (which the scaled reading needs),
# and Scheme A's failure explained by few complete devices (E[1/K_tau]), not by one device
# holding most of the data (which the scaled reading produces). E = 20 steps: see results/README.md.
HEADLINE = "per-label"

SETTINGS = ("iid", "niid")


def base_config(dataset: str, reading: Reading, regime: Regime = Regime()) -> SimConfig:
    """The reading's base config: the paper's devices, 200 rounds, the traces of traces/paper, in `regime`."""
    cfg = SimConfig(partition=PartitionSpec(dataset=dataset, n_devices=PAPER_DEVICES[dataset]), run=RunSpec(rounds=200))
    return regime.apply(replace(cfg, rules=replace(cfg.rules, required_updates=reading.E)))


def reading_groups(dataset: str, reading: Reading, *, seeds: Sequence[int], num_traces: Sequence[int],
                   settings: Sequence[str] = SETTINGS, regime: Regime = Regime()) -> list[Group]:
    """Every (setting, |T|, seed) group of one reading, its runs named <reading>_<setting>_T<j>_seed<s>_<scheme>."""
    def adjust(cfg: SimConfig) -> SimConfig:
        return replace(cfg, partition=replace(cfg.partition, sizes=reading.sizes(cfg.partition)))

    return comparison_groups(base_config(dataset, reading, regime), settings=settings, num_traces=num_traces,
                             seeds=seeds, prefix=f"{reading.name}_", adjust=adjust)


def run_table3(dataset: str, readings: Sequence[str], *, seeds: Sequence[int], num_traces: Sequence[int],
               work_dir: Path, executor: Executor | None = None, regime: Regime = Regime(),
               settings: Sequence[str] = SETTINGS, plan: tuple[Path, str] | None = None) -> list[dict]:
    """Run (resume) the groups; `plan` = (out_dir, command) first records them in the page's plan."""
    groups = [g for name in readings
              for g in reading_groups(dataset, READINGS[name], seeds=seeds, num_traces=num_traces, regime=regime,
                                      settings=settings)]
    if plan is not None:
        record_plan(plan[0], dataset, groups, command=plan[1])
    return run_sweep(groups, work_dir=work_dir, executor=executor)


# ---- the plan: what was asked for, so a page of a long sweep says what remains ---------------

PLAN_FILE = "table3_plan.json"


def plan_path(out_dir: Path) -> Path:
    """Where the plan of `out_dir`'s page lives: `out_dir`/table3_plan.json if it is there already or
    `out_dir` holds no page's runs yet; else under `out_dir`/local (simulator.report.LOCAL_DIR), where
    the page of a small trial beside a committed page goes too, so the trial leaves no stray file."""
    from simulator.report import LOCAL_DIR

    path = Path(out_dir) / PLAN_FILE
    if path.exists() or not (Path(out_dir) / "table3_runs.csv").exists():
        return path
    return Path(out_dir) / LOCAL_DIR / PLAN_FILE


def record_plan(out_dir: Path, dataset: str, groups: Sequence[Group], *, command: str) -> None:
    """Add these groups (run names per group) and the command to the page's plan (plan_path)."""
    import json

    from flexfl.files import atomic_file

    path = plan_path(out_dir)
    plan = json.loads(path.read_text()) if path.exists() else {}
    entry = plan.setdefault(dataset, {"commands": [], "groups": []})
    known = {tuple(g) for g in entry["groups"]}
    entry["groups"] += [list(names) for g in groups if (names := tuple(r.name for r in g.runs)) not in known]
    if command not in entry["commands"]:
        entry["commands"].append(command)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        f.write(json.dumps(plan, indent=1))


def progress(out_dir: Path, dataset: str, work_dir: Path, summaries: Sequence[dict]) -> str | None:
    """One paragraph: planned vs finished runs, the groups with a mid-run checkpoint, and the
    rest's time at the median wall time of a finished group; None without a plan."""
    import json

    path = plan_path(out_dir)
    entry = json.loads(path.read_text()).get(dataset) if path.exists() else None
    if not entry:
        return None
    done = {s["name"] for s in summaries}
    planned = entry["groups"]
    names = {n for g in planned for n in g}
    open_groups = [g for g in planned if not set(g) <= done]
    n_runs = len(names)
    n_done = len(names & done)
    walls = [s["group_wall_s"] for s in summaries if s["name"] in names and s.get("group_wall_s")]
    started = [g for g in open_groups if (Path(work_dir) / f".{g[0]}.partial.pt").exists()]
    text = (f"{dataset.upper()}: **{n_done} of {n_runs} planned runs finished** ({len(planned) - len(open_groups)} "
            f"of {len(planned)} paired groups; planned by {'; '.join(f'`{c}`' for c in entry['commands'])}).")
    if not open_groups:
        return text + " Nothing remains."
    if started:
        text += (f" In progress, resumable from a checkpoint in `{Path(work_dir).name}/`: "
                 f"{', '.join(g[0].rsplit('_', 1)[0] for g in started)}.")
    text += f" Still to run: {', '.join(g[0].rsplit('_', 1)[0] for g in open_groups)}."
    if walls:
        median_h = float(np.median(walls)) / 3600
        text += (f" At the median wall time of a finished group here ({median_h:.2f} h over {len(walls) // 3} "
                 "finished; "
                 f"groups differ in steps with |T| and setting, and a resumed group counts its last part only) the "
                 f"rest would take about {median_h * len(open_groups):.1f} h on one worker.")
    else:
        text += " No group has finished yet, so there is no measured speed for this grid."
    return text


# ---- analysis --------------------------------------------------------------------------------


# The three metrics of a run (issue: final accuracy flips on the argmax margins of an
# under-trained model; the loss and a window of rounds do not).
METRICS = {"final_acc": "final test accuracy (round 200)",
           "last20_acc": "mean test accuracy over the last 20 rounds",
           "final_loss": "final test loss (improvement = relative reduction)"}
LAST_ROUNDS = 20


def with_window(summaries: Sequence[dict], work_dir: Path) -> list[dict]:
    """Summaries with "last20_acc", the mean test accuracy of the last LAST_ROUNDS rounds (from the run's CSV)."""
    from simulator.sim_rows import read_accuracy_curve

    out = []
    for s in summaries:
        acc = read_accuracy_curve(Path(work_dir) / f"{s['name']}.csv")
        out.append({**s, "last20_acc": float(np.mean(acc[-LAST_ROUNDS:]))})
    return out


def cells_by_reading(summaries: Sequence[dict], *, metric: str = "final_acc") -> dict[str, dict[tuple[str, int], Cell]]:
    """Table 3 cells per reading from run summaries (their "reading" label)."""
    by: dict[str, list[dict]] = {}
    for s in summaries:
        by.setdefault(s["reading"], []).append(s)
    return {name: table3_cells(rows, metric=metric) for name, rows in by.items()}


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); nan with fewer than 3 pairs."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    if len(x) < 3:
        return float("nan")
    ra, rb = _ranks(x), _ranks(y)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        tied = x == v
        ranks[tied] = ranks[tied].mean()
    return ranks


@dataclass(frozen=True)
class Agreement:
    cells: int
    sign_b_a: float  # share of cells whose "B over A" median has the paper's sign
    sign_c_b: float
    rank_b_a: float  # Spearman of medians vs the paper's values
    rank_c_b: float


def agreement(dataset: str, cells: dict[tuple[str, int], Cell], *, settings: Sequence[str] = SETTINGS) -> Agreement:
    """How well one reading's cells agree with the paper's Table 3 for `dataset`.

    Signs: np.sign of the median and of the paper's value (the paper's 0.0 counts as 0).
    """
    ours, paper = [], []
    for setting in settings:
        published = PAPER_TABLE3.get((dataset, setting), [])
        for j, (b_a, c_b) in enumerate(published, start=1):
            cell = cells.get((setting, j))
            if cell is None or len(cell.b_over_a) == 0:
                continue
            ours.append((float(np.median(cell.b_over_a)), float(np.median(cell.c_over_b))))
            paper.append((b_a, c_b))
    if not ours:
        return Agreement(0, float("nan"), float("nan"), float("nan"), float("nan"))
    o, p = np.array(ours), np.array(paper)
    sign = (np.sign(np.round(o, 1)) == np.sign(p)).mean(axis=0)
    return Agreement(cells=len(o), sign_b_a=float(sign[0]), sign_c_b=float(sign[1]),
                     rank_b_a=spearman(o[:, 0], p[:, 0]), rank_c_b=spearman(o[:, 1], p[:, 1]))


def largest_share(dataset: str, reading: Reading, *, setting: str, seeds: Sequence[int]) -> float:
    """Median over seeds of the largest device's share of the training data."""
    from workloads.federated import build_federated

    shares = []
    for seed in seeds:
        groups = reading_groups(dataset, reading, seeds=[seed], num_traces=[1], settings=[setting])
        counts = build_federated(groups[0].runs[0].config.partition).sample_counts
        shares.append(counts.max() / counts.sum())
    return float(np.median(shares))


def finished_summaries(dataset: str, readings: Sequence[str], *, seeds: Sequence[int], num_traces: Sequence[int],
                       work_dir: Path, regime: Regime = Regime()) -> list[dict]:
    groups = [g for name in readings
              for g in reading_groups(dataset, READINGS[name], seeds=seeds, num_traces=num_traces, regime=regime)]
    return finished(groups, work_dir=work_dir)


def elapsed(started: float) -> str:
    s = time.perf_counter() - started
    return f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.2f} h"


def wall_time(earlier: str | None, part: str, *, computed: int, cached: int) -> str | None:
    """The wall-time statement after a sweep that took `part`; None: keep `earlier` (nothing computed).

    A resumed sweep's time covers only the runs it computed, so it is added to the earlier
    parts' statement, never put in its place; a sweep that found nothing cached starts anew.
    """
    if not computed:
        return None
    return f"{earlier}; then {part}" if earlier and cached else part


# ---- the page ----------------------------------------------------------------------------------


def _median_range(v: np.ndarray) -> str:
    if len(v) == 0:
        return "n/a"
    return f"{np.median(v):.1f} [{np.min(v):.1f}, {np.max(v):.1f}]"


def _agreement_row(label: list[str], a: Agreement) -> list[str]:
    return [*label, f"{a.cells}/16", f"{a.sign_b_a:.0%}", f"{a.sign_c_b:.0%}", f"{a.rank_b_a:+.2f}",
            f"{a.rank_c_b:+.2f}"]


def metric_tables(dataset: str, summaries: Sequence[dict], reading: str) -> str:
    """One table per metric, then the sign and rank agreement of each metric with the paper's "% improvement"."""
    blocks, rows = [], []
    for metric, text in METRICS.items():
        cells = cells_by_reading(summaries, metric=metric).get(reading, {})
        blocks.append(f"**{text}**\n\n{cells_markdown(dataset, cells)}")
        rows.append(_agreement_row([text], agreement(dataset, cells)))
    return ("\n".join(blocks) + "\n**Agreement with the paper, per metric** (share of cells whose median has the "
            "paper's sign; Spearman's rank correlation of the medians with the paper's values):\n\n"
            + table(["metric", "cells", "sign B/A", "sign C/B", "rank B/A", "rank C/B"], rows))


def cells_markdown(dataset: str, cells: dict[tuple[str, int], Cell], *, settings: Sequence[str] = SETTINGS) -> str:
    """Rows per setting (FlexFL: median [min, max] over seeds; paper), columns |T| = 1..8, "B/A | C/B"."""
    rows = []
    for setting in settings:
        label = f"{dataset.upper()} {setting.upper()}"
        ours = [f"{_median_range(cells[(setting, j)].b_over_a)} \\| {_median_range(cells[(setting, j)].c_over_b)}"
                if (setting, j) in cells else "not run" for j in range(1, 9)]
        paper = [f"{a} \\| {c}" for a, c in PAPER_TABLE3.get((dataset, setting), [])] or ["-"] * 8
        rows += [[f"{label} (FlexFL)", *ours], [f"{label} (paper)", *paper]]
    return table(["data", *(f"\\|T\\|={j}" for j in range(1, 9))], rows)


RUN_KEY = ("dataset", "reading", "setting", "num_traces", "seed", "scheme")
RUN_FIELDS = ("reading", "setting", "num_traces", "seed", "scheme", "final_acc", "last20_acc", "final_loss", "wall_s")


@dataclass(frozen=True)
class ReadingResult:
    """One reading's cells on one dataset, its agreement with the paper and its largest device's share."""

    dataset: str
    reading: Reading
    cells: dict[tuple[str, int], Cell]
    agreement: Agreement
    seeds: int  # seeds with runs
    largest: dict[str, float]  # per setting: the largest device's share of the data (median over seeds)


@dataclass(frozen=True)
class Headline:
    """The headline reading on one dataset: its table per metric and its plots (file names)."""

    dataset: str
    tables: str
    plots: tuple[tuple[str, str], ...]  # (label, file name)


@dataclass(frozen=True)
class Table3Page:
    """Everything results/table3.md says, computed; render() writes it out."""

    seeds: tuple[int, ...]
    timing: dict[str, str]
    regime: str
    progress: tuple[str, ...]
    headlines: tuple[Headline, ...]
    readings: tuple[ReadingResult, ...]


def reading_results(dataset: str, summaries: Sequence[dict], *, seeds: Sequence[int]) -> list[ReadingResult]:
    by_reading = cells_by_reading(summaries)
    out = []
    for name, reading in READINGS.items():
        cells = by_reading.get(name, {})
        if cells:
            out.append(ReadingResult(
                dataset=dataset, reading=reading, cells=cells, agreement=agreement(dataset, cells),
                seeds=len({s["seed"] for s in summaries if s["reading"] == name}),
                largest={st: largest_share(dataset, reading, setting=st, seeds=seeds[:3]) for st in SETTINGS}))
    return out


def _score_row(r: ReadingResult) -> list[str]:
    label = [f"{r.reading.name}{' (headline)' if r.reading.name == HEADLINE else ''}", r.dataset.upper()]
    row = _agreement_row(label, r.agreement)
    return [*row[:3], str(r.seeds), *row[3:], f"{100 * r.largest['iid']:.1f} % / {100 * r.largest['niid']:.1f} %"]


def _other_readings(page: Table3Page) -> str:
    return "\n".join(f"### {r.reading.name}, {r.dataset.upper()}\n\n{r.reading.text}; E = {r.reading.E}.\n\n"
                     f"{cells_markdown(r.dataset, r.cells)}" for r in page.readings if r.reading.name != HEADLINE)


def render(page: Table3Page) -> str:
    """The Markdown of results/table3.md; the "Every reading" section only when a reading beside the headline ran."""
    readings_text = "\n".join(f"- **{r.name}**: {r.text}; E = {r.E}." for r in READINGS.values())
    wall = "; ".join(f"{k}: {v}" for k, v in page.timing.items())
    plan_text = (f"\nProgress of the planned sweeps (`{PLAN_FILE}`):\n\n" + "\n".join(page.progress) + "\n"
                 if page.progress else "")
    headline = "\n".join(f"### {h.dataset.upper()}\n\n{h.tables}" + "".join(
        f"\n![{key}]({name})" for key, name in h.plots) for h in page.headlines)
    scores = table(["reading", "data", "cells", "seeds", "sign B/A", "sign C/B", "rank B/A", "rank C/B",
                    "largest device"], [_score_row(r) for r in page.readings])
    others = _other_readings(page)
    return PAGE.format(seeds=list(page.seeds), wall=wall, plan_text=plan_text, regime=page.regime,
                       readings_text=readings_text, headline_name=HEADLINE, headline=headline,
                       scores=scores, every=f"\n## Every reading\n\n{others}\n" if others else "")


PAGE = """# Table 3 under several readings of the paper's setup

Generated by `flexfl sim table3` (`make paper-table3`). % improvement, "B over A \\| C over B",
of the final test accuracy after round 200 (the paper's metric: "the differences in the test
accuracies ... after 200 global epochs"); the headline table also gives the mean accuracy
over the last 20 rounds and the final test loss (relative reduction), which do not flip on
the argmax margins of an under-trained model. FlexFL's cells give the median and the
[min, max] of per-seed improvements over the seeds of {seeds} that have finished (the
agreement table gives how many per dataset; the three schemes of a seed share data, initial
model, trace assignment, s draws and minibatches; they train together).
Rows marked (paper) are the published values; every run's final accuracy is in
`table3_runs.csv`. The paper's EMNIST rows are not run: EMNIST cannot be downloaded on this
machine (`--emnist-root DIR` loads a local copy; the loader is tested on files the tests write). Wall time: {wall}
(2-core machine, shared with other work).
{plan_text}
Regime: {regime}.

## The readings

The paper fixes schemes, traces, rounds, devices and data, not how Pareto(0.5) sample
counts become counts, nor how often a loaded device completes all E updates:

{readings_text}

**Headline: {headline_name}.** It is what the text supports best: sample counts follow
Type-I Pareto(0.5) shares; non-IID MNIST gives each device one label and the text says
nothing of shrinking devices to fit (the scaled reading must shrink them: one label has at
most 6,742 images, 11 %); and the paper explains Scheme A's failure by few complete devices
(E[1/K_tau]), not by one device holding most of the data, which is what the scaled reading
produces (its largest device holds a median of ~67 % of MNIST). E = 20 local updates, counted as the
regime above says (results/README.md). It was chosen before its results were seen;
the agreement scores below are reported, not optimised.

## Headline table ({headline_name})

{headline}

## Agreement with the paper, per reading

Share of cells whose median has the paper's sign ("B over A", "C over B"), Spearman's rank
correlation of the medians with the paper's values over the cells run, and the largest
device's share of the data (median over the first seeds, IID / non-IID).

{scores}{every}"""


def write_page(out_dir: Path, *, work_dirs: dict[str, Path], seeds: Sequence[int], timing: dict[str, str],
               plots: Callable[[str, dict], dict[str, Path]] | None = None, regime: Regime = Regime(),
               replace_page: bool = False) -> Path:
    """results/table3.md from every finished run of every reading in `work_dirs` ({dataset: folder}).

    If the page's committed table3_runs.csv lists runs not finished here, everything goes to
    <out_dir>/local instead (simulator.report.page_dir) unless `replace_page`; `plots` gets
    the folder chosen as info["out_dir"]."""
    from simulator.report import page_dir, write_csv_atomic

    found = {dataset: with_window(finished_summaries(dataset, list(READINGS), seeds=seeds, num_traces=range(1, 9),
                                                     work_dir=work_dir, regime=regime), work_dir)
             for dataset, work_dir in work_dirs.items()}
    run_rows = [{"dataset": dataset, **{k: s[k] for k in RUN_FIELDS}} for dataset, found_ in found.items()
                for s in found_]
    if not run_rows:
        raise ConfigError(f"no finished Table 3 runs in {', '.join(map(str, work_dirs.values())) or 'no folder'} "
                          f"for seeds {list(seeds)}: nothing to write (run without --report-only)")
    plan_dir = Path(out_dir)
    out_dir = page_dir(out_dir, "table3_runs.csv", run_rows, RUN_KEY, replace=replace_page)

    def drawn(dataset: str, headline: list[dict]) -> tuple[tuple[str, str], ...]:
        info = {"work_dir": work_dirs[dataset], "out_dir": out_dir, "summaries": headline}
        return () if plots is None else tuple((key, path.name) for key, path in plots(dataset, info).items())

    page = _page(plan_dir, found=found, work_dirs=work_dirs, seeds=seeds, timing=timing, regime=regime, plots=drawn)
    write_csv_atomic(out_dir / "table3_runs.csv", run_rows)
    return _write(out_dir / "table3.md", page)


def page_from_csv(out_dir: Path, *, regime: Regime) -> Path:
    """Render out_dir/table3.md again from the table3_runs.csv, table3_timing.json and table3_plan.json
    beside it (nothing is trained); the plots, which need every run's curves, are named as they are.

    The largest device's share is recomputed from the partitions (no training); the plan's
    time estimate for unfinished groups needs the runs' wall times per group and is left out."""
    import csv
    import json

    out_dir = Path(out_dir)
    found: dict[str, list[dict]] = {}
    with open(out_dir / "table3_runs.csv", newline="", encoding="utf-8") as f:
        for run in csv.DictReader(f):  # a run's summary (the page takes summaries as dicts), not a round's row
            missing = [k for k in RUN_FIELDS if not run.get(k)]
            if missing:
                raise ConfigError(f"{out_dir / 'table3_runs.csv'}: a row without {', '.join(missing)} (a page from an "
                                  "older writer): it cannot be rendered from its CSV")
            s = {**run, "num_traces": int(run["num_traces"]), "seed": int(run["seed"]),
                 **{k: float(run[k]) for k in ("final_acc", "last20_acc", "final_loss", "wall_s")}}
            s["name"] = f"{s['reading']}_{s['setting']}_T{s['num_traces']}_seed{s['seed']}_{s['scheme']}"
            found.setdefault(run["dataset"], []).append(s)
    seeds = sorted({s["seed"] for rows in found.values() for s in rows})
    timing = json.loads((out_dir / "table3_timing.json").read_text())

    def existing(dataset: str, _headline: list[dict]) -> tuple[tuple[str, str], ...]:
        return tuple((f"{dataset}_{st}", name) for st in SETTINGS
                     if (out_dir / (name := f"table3_{dataset}_{st}.png")).exists())

    work_dirs = {dataset: out_dir / "runs" / f"table3_{dataset}" for dataset in found}  # the sweep's default
    page = _page(out_dir, found=found, work_dirs=work_dirs, seeds=seeds, timing=timing, regime=regime,
                 plots=existing)
    return _write(out_dir / "table3.md", page)


def _page(plan_dir: Path, *, found: dict[str, list[dict]], work_dirs: dict[str, Path], seeds: Sequence[int],
          timing: dict[str, str], regime: Regime,
          plots: Callable[[str, list[dict]], tuple[tuple[str, str], ...]]) -> Table3Page:
    """The page of the run summaries `found` ({dataset: summaries}); `plots` names the headline's plots."""
    progress_lines, headlines, readings = [], [], []
    for dataset, summaries in found.items():
        line = progress(plan_dir, dataset, work_dirs[dataset], summaries)
        if line is not None:
            progress_lines.append(f"- {line}")
        results = reading_results(dataset, summaries, seeds=seeds)
        readings += results
        if any(r.reading.name == HEADLINE for r in results):
            headlines.append(Headline(dataset=dataset, tables=metric_tables(dataset, summaries, HEADLINE),
                                      plots=plots(dataset, [s for s in summaries if s["reading"] == HEADLINE])))
    return Table3Page(seeds=tuple(seeds), timing=dict(timing), progress=tuple(progress_lines),
                      regime=(f"{'; '.join(f'{d.upper()} {regime.describe(d)}' for d in found)} "
                              f"({regime.reading_note('Table 3')})"),
                      headlines=tuple(headlines), readings=tuple(readings))


def _write(path: Path, page: Table3Page) -> Path:
    from flexfl.files import atomic_file

    with atomic_file(path) as f:
        f.write(render(page))
    return path
