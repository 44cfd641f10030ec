"""Sweeps: many simulation runs, grouped by shared data, computed anywhere, resumable on disk.

A sweep is a list of `Group`s. A group is a set of `Run`s (a stable name + a SimConfig)
that share their data (one PartitionSpec) and differ only in what they compare (scheme,
fast-reboot, departure policy, seed of the model, |T|, ...). A group is the unit of work:
one worker builds its data once and runs its configs paired (simulator.engine.run_paired:
one row-trainer call per round for all of them), or one by one where they cannot be paired
(the plain trainer).

Where results live: the driver (the process that calls run_sweep) owns the work folder.
Workers (a local process pool, or Ray tasks on this machine or a cluster;
simulator.executors) receive the group's configs and trace sets, and send each run's
results back; the driver writes them, atomically, as each group finishes:

    <name>.csv            per-round records (simulator.engine.records_as_rows)
    <name>.metrics.jsonl.gz  per-round round records (coordinator.rules.round_record.RoundRecord:
                          s, p and coefficients of every device), gzip-compressed: ~1 MB a
                          200-round SYNTHETIC run as text, 20x less compressed (read_metrics
                          reads them back as RoundRecords)
    <name>.json           summary: the full config (flexfl.config.to_dict), final accuracy and
                          loss, a SHA-256 of the final parameters, time, the runs paired with it

So workers need no shared file system, the files are the same whichever executor ran them,
and the JSON (written last) marks a run finished: a rerun skips every run whose saved config
equals its config, and recomputes a run whose config changed.
"""

from __future__ import annotations

import gzip
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from coordinator.rules.round_record import RoundRecord
from flexfl.errors import ConfigError, SweepError
from flexfl.files import atomic_file
from simulator.engine import SimConfig, runs_alike
from simulator.executors import LocalExecutor
from simulator.groups import Executor, Group, GroupTask, Run, RunOutput, plain_config
from trace_recorder.format import TraceSet, read_trace_set

log = logging.getLogger(__name__)

METRICS_SUFFIX = ".metrics.jsonl.gz"
# ---- on disk ----------------------------------------------------------------------------------


def _same_config(saved: object, cfg: SimConfig) -> bool:
    """A saved config means `cfg` if it reads back equal where the run uses it (SimConfig.in_effect):
    fields added since, at their defaults, and constants of unused departure policies do not count."""
    return saved == plain_config(cfg) or runs_alike(saved, cfg)


def saved_summary(work_dir: Path, run: Run) -> dict | None:
    """The run's summary in `work_dir` if it finished there with exactly this config, else None."""
    path = Path(work_dir) / f"{run.name}.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(saved, dict) or not _same_config(saved.get("config"), run.config):
        return None
    if not all((Path(work_dir) / f"{run.name}{ext}").is_file() for ext in (".csv", METRICS_SUFFIX)):
        return None
    return saved


def write_run(work_dir: Path, out: RunOutput) -> None:
    """The run's per-round CSV and metrics, then its summary JSON (the finished mark), each atomically."""
    from coordinator.rules.round_record import clean_json
    from simulator.report import write_csv_atomic

    write_csv_atomic(work_dir / f"{out.name}.csv", out.rounds_csv)
    # mtime 0: same bytes for the same rows
    with (atomic_file(work_dir / f"{out.name}{METRICS_SUFFIX}", "wb") as raw,
          gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f):
        for row in out.metrics:
            f.write((json.dumps(clean_json(row)) + "\n").encode())
    with atomic_file(work_dir / f"{out.name}.json") as f:
        json.dump(out.summary, f, indent=1)


def read_metrics(work_dir: Path, name: str) -> list[RoundRecord]:
    """A finished run's round records (the round engine's rows), in round order."""
    path = Path(work_dir) / f"{name}{METRICS_SUFFIX}"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [RoundRecord.from_json(json.loads(line), where=f"{path}:{i}") for i, line in enumerate(f, start=1)]


# ---- the driver's side --------------------------------------------------------------------------


def run_sweep(
    groups: Sequence[Group],
    *,
    work_dir: Path,
    executor: Executor | None = None,
    report: Callable[[str], None] = print,
    failures: str = "raise",
) -> list[dict]:
    """Compute every run not yet finished in `work_dir`; returns each run's summary, in sweep order.

    `executor` is a simulator.executors executor (default: LocalExecutor(jobs=1)). Each
    summary dict is the run's JSON plus "cached" (True when it was already on disk).
    Runs that fail (e.g. a learning rate that makes the loss diverge) are reported; the
    others finish and are saved, then SweepError names the failed ones; with
    failures="return" a failed run's entry is {"name", "error", "labels"...} instead (not
    saved: a rerun tries it again), for sweeps where failing is a result (a rate that diverges).
    """
    if failures not in ("raise", "return"):
        raise ConfigError(f"run_sweep: failures must be 'raise' or 'return', got {failures!r}")
    runs = [r for g in groups for r in g.runs]
    names = [r.name for r in runs]
    dupes = sorted(n for n, count in Counter(names).items() if count > 1)
    if dupes:
        raise ConfigError(f"sweep run names must be unique; repeated: {dupes}")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict] = {}
    tasks = _pending_tasks(groups, work_dir=work_dir, summaries=summaries)
    executor = executor if executor is not None else LocalExecutor(jobs=1)
    if getattr(executor, "shares_files", False):
        # Long groups (MNIST with E in epochs: about an hour) survive an interruption mid-run.
        tasks = [replace(t, checkpoint=str((work_dir / f".{t.runs[0].name}.partial.pt").resolve())) for t in tasks]
    total, cached = len(runs), len(summaries)
    to_compute = total - cached
    report(f"sweep: {total} runs, {cached} already in {work_dir} (cached), {to_compute} to compute in "
           f"{len(tasks)} groups on {executor.describe()}")
    started = time.perf_counter()
    failed: dict[str, str] = {}
    results: Iterator[list[RunOutput]] = executor.run(tasks) if tasks else iter(())
    computed = _take_outputs(results, work_dir=work_dir, summaries=summaries, failed=failed, report=report,
                             total=total, cached=cached, started=started)
    elapsed = time.perf_counter() - started
    report(f"sweep: {total} runs in {_minutes(elapsed)}: {computed - len(failed)} computed, {cached} cached, "
           f"{len(failed)} failed; results in {work_dir}")
    if failed and failures == "return":
        by_name = {r.name: r for r in runs}
        summaries.update({n: {"name": n, **by_name[n].labels, "error": e, "cached": False} for n, e in failed.items()})
    elif failed:
        raise SweepError(f"{len(failed)} of {total} runs failed (the others are saved in {work_dir}): "
                         + "; ".join(f"{n}: {e}" for n, e in list(failed.items())[:5]))
    return [summaries[n] for n in names]


def _pending_tasks(groups: Sequence[Group], *, work_dir: Path, summaries: dict[str, dict]) -> list[GroupTask]:
    """A task per group with runs not finished in `work_dir`; the finished runs' summaries go to `summaries`."""
    tasks = []
    trace_sets: dict[str, TraceSet] = {}
    for group in groups:
        todo = []
        for run in group.runs:
            saved = saved_summary(work_dir, run)
            if saved is not None:
                summaries[run.name] = {**saved, "cached": True}
            else:
                todo.append(run)
        if not todo:
            continue
        wanted = {r.name for r in todo}
        sources = {r.same_as for r in todo if r.same_as}
        task_runs = tuple(r for r in group.runs if r.name in wanted or r.name in sources)
        for r in task_runs:
            if r.config.traces.set not in trace_sets:  # read here: workers may not see this file system
                trace_sets[r.config.traces.set] = read_trace_set(Path(r.config.traces.set))
        tasks.append(GroupTask(runs=task_runs, wanted=frozenset(wanted),
                               trace_sets={r.config.traces.set: trace_sets[r.config.traces.set] for r in task_runs}))
    return tasks


def _take_outputs(results: Iterator[list[RunOutput]], *, work_dir: Path, summaries: dict[str, dict],
                  failed: dict[str, str], report: Callable[[str], None], total: int, cached: int,
                  started: float) -> int:
    """Save and report each run as its group comes back (failures into `failed`); returns the runs computed."""
    computed, to_compute = 0, total - cached
    try:
        for outputs in results:
            first = computed  # a group's runs finish together: the ETA counts them all at once
            computed += len(outputs)
            eta = (time.perf_counter() - started) / computed * (to_compute - computed)
            for i, out in enumerate(outputs, start=1):
                done = f"[{cached + first + i}/{total}] {out.name}"
                if out.error is not None:
                    failed[out.name] = out.error
                    report(f"{done}: FAILED: {out.error} | ETA {_minutes(eta)}")
                    continue
                write_run(work_dir, out)
                s = out.summary
                summaries[out.name] = {**s, "cached": False}
                paired = f", paired with {len(s['paired_with'])}" if s["paired_with"] else ""
                how = f"same run as {s['identical_to']}" if "identical_to" in s else f"{s['wall_s']:.1f} s{paired}"
                report(f"{done}: acc {100 * s['final_acc']:.2f}%, loss {s['final_loss']:.4g} ({how}) | "
                       f"{cached} cached | ETA {_minutes(eta)}")
    except KeyboardInterrupt:
        # Ctrl-C (its workers ignore it: simulator.executors): stop them now, wherever it hit the driver,
        # and say in one line what is kept (flexfl.app.cli prints it, no traceback).
        close = getattr(results, "close", None)  # a generator: its finally blocks stop the workers
        if close is not None:
            close()
        kept = sum(not s["cached"] for s in summaries.values())
        raise KeyboardInterrupt(f"the sweep in {work_dir}, after {kept} of its {to_compute} runs to compute; "
                                "finished runs are saved there (long groups also keep a checkpoint): rerun the same "
                                "command to resume") from None
    return computed


def finished(groups: Iterable[Group], *, work_dir: Path) -> list[dict]:
    """Summaries of the sweep's runs already in `work_dir` with their exact config (nothing is computed)."""
    out = []
    for group in groups:
        for run in group.runs:
            saved = saved_summary(work_dir, run)
            if saved is not None:
                out.append({**saved, "cached": True})
    return out


def mean_run_seconds(summaries: Sequence[dict]) -> tuple[float, float]:
    """Mean wall seconds of one computed run (its share of its group) and device-updates (SGD steps) per second."""
    computed = [s for s in summaries if "identical_to" not in s]  # shared runs cost nothing
    fresh = [s for s in computed if not s["cached"]] or computed  # this machine, now, where there are any
    if not fresh:
        return float("nan"), float("nan")
    wall = np.array([s["wall_s"] for s in fresh])
    updates = np.array([s["device_updates"] for s in fresh])
    return float(wall.mean()), float(updates.sum() / wall.sum()) if wall.sum() > 0 else float("nan")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
