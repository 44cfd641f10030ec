"""A sweep's unit of work: runs grouped by shared data, and the worker that computes a group.

simulator.sweep (the driver: what is finished on disk, what to compute, where results go)
hands GroupTasks to an executor (simulator.executors: a local process pool or Ray tasks),
whose workers call compute_group and send RunOutputs back. Both import these records from
here, so neither imports the other to name them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from flexfl.config import to_dict
from flexfl.errors import ConfigError, FlexFLError
from simulator.engine import SimConfig, SimResult, records_as_rows
from trace_recorder.format import TraceSet

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")
SUMMARY_KEYS = frozenset({"name", "config", "final_acc", "final_loss", "rounds", "wall_s", "device_updates",
                          "discarded_rounds", "final_params_sha256", "paired_with", "group_wall_s", "identical_to",
                          "cached"})


@dataclass(frozen=True)
class Run:
    """One run of a sweep: its file name stem, its config, and labels copied into its summary.

    `same_as` names an earlier run of the same group known to give the identical result
    (e.g. Schemes A/B/C when every device always completes): it is not computed; its files
    are the other run's, under its own config.
    """

    name: str
    config: SimConfig
    labels: Mapping[str, Any] = field(default_factory=dict)
    same_as: str | None = None

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ConfigError(f"sweep run name {self.name!r}: use letters, digits and _ . = + - (it names files)")
        clash = SUMMARY_KEYS & set(self.labels)
        if clash:
            raise ConfigError(f"sweep run {self.name}: labels {sorted(clash)} clash with summary fields")


@dataclass(frozen=True)
class Group:
    """Runs that share their data (one partition): the unit a worker computes."""

    runs: tuple[Run, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("a sweep group needs at least one run")
        first = self.runs[0]
        seen: dict[str, Run] = {}
        for run in self.runs:
            if run.config.partition != first.config.partition:
                raise ConfigError(f"sweep group of {first.name}: run {run.name} has partition "
                                  f"{run.config.partition.describe()}, {first.name} has "
                                  f"{first.config.partition.describe()}; a group shares its data")
            if run.same_as is not None:
                source = seen.get(run.same_as)
                if source is None or source.same_as is not None:
                    raise ConfigError(f"sweep run {run.name}: same_as {run.same_as!r} must name an earlier "
                                      "computed run of its group")
                if source.config.rounds != run.config.rounds:
                    raise ConfigError(f"sweep run {run.name}: same_as {run.same_as} runs "
                                      f"{source.config.rounds} rounds, it runs {run.config.rounds}")
            seen[run.name] = run


@dataclass(frozen=True)
class GroupTask:
    """What a worker gets: the runs to compute (with the sources of aliases) and the trace sets by path."""

    runs: tuple[Run, ...]
    wanted: frozenset[str]  # names whose results go back (a cached alias source is recomputed, not resent)
    trace_sets: Mapping[str, TraceSet]
    checkpoint: str | None = None  # where paired runs save their state as they go (a file system the worker sees)


@dataclass(frozen=True)
class RunOutput:
    """One run's results on their way from a worker to the driver (or why the run failed)."""

    name: str
    summary: dict[str, Any] = field(default_factory=dict)
    rounds_csv: list[dict] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    error: str | None = None


class Executor(Protocol):
    """Computes GroupTasks somewhere (simulator.executors) and yields each group's outputs as it finishes."""

    def describe(self) -> str: ...

    def run(self, tasks: Sequence[GroupTask]) -> Iterator[list[RunOutput]]: ...


def plain_config(cfg: SimConfig) -> dict:
    """The config as it reads back from a summary JSON."""
    return json.loads(json.dumps(to_dict(cfg)))


def params_sha256(params: Mapping[str, Any]) -> str:
    """SHA-256 over the parameters' names and float32 bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().contiguous().float().numpy().tobytes())
    return h.hexdigest()


# ---- the worker's side --------------------------------------------------------------------------

_DATA: dict = {}  # per worker process: the last group's data, reused by the next group with that partition


def compute_group(task: GroupTask) -> list[RunOutput]:
    """Run one group's configs (paired where they can be) and return the wanted runs' results."""
    import torch

    from simulator.engine import load_data, run_paired, run_simulation

    # One thread per worker: torch's default collapses when another job holds a core
    # (python -m benchmarks.threads); executors run one worker per core instead.
    torch.set_num_threads(1)
    computed = [r for r in task.runs if r.same_as is None]
    configs = [r.config for r in computed]
    started = time.perf_counter()
    try:
        partition = configs[0].partition
        if partition not in _DATA:
            _DATA.clear()
            _DATA[partition] = load_data(configs[0])  # e.g. DatasetNotFoundError on a node without MNIST
        data = _DATA[partition]
        pairable = (len({c.rules.batch_size_for(c.partition.dataset) for c in configs}) == 1
                    and len({c.trainer_kind for c in configs}) == 1 and configs[0].batched)
        if pairable:
            checkpoint = Path(task.checkpoint) if task.checkpoint else None
            results = run_paired(configs, data=data, traces=task.trace_sets, checkpoint=checkpoint)
        else:
            results = [run_simulation(c, data=data, traces=task.trace_sets[c.traces.set]) for c in configs]
    except FlexFLError as exc:
        return [RunOutput(name=r.name, error=str(exc)) for r in task.runs if r.name in task.wanted]
    group_s = time.perf_counter() - started
    if task.checkpoint:
        Path(task.checkpoint).unlink(missing_ok=True)  # the results go back now; a rerun would find them saved
    by_name = {r.name: res for r, res in zip(computed, results)}
    paired = [r.name for r in computed] if pairable and len(computed) > 1 else []
    out = []
    for run in task.runs:
        if run.name not in task.wanted:
            continue
        source = by_name[run.same_as or run.name]
        result = replace(source, config=run.config) if run.same_as else source
        summary = _summary(run, result, paired_with=[n for n in paired if n != run.name], group_s=group_s)
        out.append(RunOutput(name=run.name, summary=summary, rounds_csv=records_as_rows(result), metrics=result.rows))
    return out


def _summary(run: Run, result: SimResult, *, paired_with: list[str], group_s: float) -> dict:
    records = result.records
    alias = run.same_as is not None
    return {
        "name": run.name, "config": plain_config(run.config), **run.labels,
        "final_acc": records[-1].test_acc, "final_loss": records[-1].test_loss, "rounds": len(records),
        "wall_s": 0.0 if alias else result.wall_s, "device_updates": 0 if alias else result.device_updates,
        "discarded_rounds": sum(r.discarded for r in records),
        "final_params_sha256": params_sha256(result.final_params),
        "paired_with": paired_with, "group_wall_s": group_s,
        **({"identical_to": run.same_as} if alias else {}),
    }


