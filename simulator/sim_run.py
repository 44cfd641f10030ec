"""`flexfl sim run`'s work: several strategies' runs on the same data and s, and the files they leave.

flexfl.app.sim_cli turns the command line into a SimRunPlan; `simulate(plan)` claims the output
folder (flexfl.run_folder: an earlier run there is refused, or moved aside with --fresh), runs
each strategy's config with simulator.engine, and writes OUT/rounds.csv, accuracy.png,
summary.json and OUT/<strategy>/{metrics.jsonl, sim.toml, run.json}.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexfl.files import atomic_file
from simulator.sim_config import SimConfig

if TYPE_CHECKING:
    from simulator.participation import Participation
    from simulator.sim_rows import RoundRecord, SimResult
    from simulator.timeline_source import TimelineRun
    from trace_recorder.format import TraceSet
    from workloads.federated import FederatedData

log = logging.getLogger(__name__)
Emit = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)  # progress lines show as they happen, also through a pipe


@dataclass(frozen=True)
class SimRunPlan:
    """What `flexfl sim run` runs: one config per strategy label (in run order), from one base config."""

    base: SimConfig
    configs: Mapping[str, SimConfig]
    out: Path
    timeline: TimelineRun | None = None
    progress_every: int = 0  # 0: rounds / 10
    fresh: bool = False  # move an earlier run in `out` aside instead of refusing


def simulate(plan: SimRunPlan, *, emit: Emit = _print) -> dict[str, Any]:
    """Run every config of `plan` and write its files; returns summary.json's content."""
    import torch

    from flexfl.run_folder import claim_run_folder, entries_besides_lock

    # One compute thread: torch's default two collapse when another job holds a core
    # (python -m benchmarks.threads); sweeps run one such process per core instead.
    torch.set_num_threads(1)
    for warning in dict.fromkeys(_eta0_warnings(plan)):
        log.warning("%s", warning)
    inputs = _inputs(plan)  # what can fail (the data, the traces, a plug-in model) fails before the folder is claimed
    folder = claim_run_folder(plan.out, what="flexfl sim run", holds_run=entries_besides_lock, fresh=plan.fresh,
                              resumable=False)
    try:
        if folder.moved_aside is not None:
            emit(f"the earlier run in {plan.out} was moved to {folder.moved_aside}")
        return _simulate(plan, inputs, emit)
    finally:
        folder.release()


def _eta0_warnings(plan: SimRunPlan) -> list[str]:
    """A warning for each run whose (dataset, unit, eta_0) is known not to train (workloads.defaults)."""
    from workloads.defaults import eta0_warning
    from workloads.partition_spec import is_builtin_dataset

    dataset = plan.base.partition.dataset
    if not is_builtin_dataset(dataset):
        return []
    found = (eta0_warning(dataset, c.rules.unit, c.rules.eta0_for(dataset), c.rules.required_updates)
             for c in plan.configs.values())
    return [w for w in found if w is not None]


@dataclass(frozen=True)
class _Inputs:
    data: FederatedData
    traces: TraceSet | None
    participation: Participation | None
    source: str  # where s comes from, for the banner


def _inputs(plan: SimRunPlan) -> _Inputs:
    """The run's data and s source, each config's model built once (a plug-in's probe runs here)."""
    from simulator.engine import load_data
    from workloads.federated import initial_model, model_spec

    data = load_data(plan.base)
    traces, participation, source = _participation(plan, data.sample_counts)
    for c in plan.configs.values():
        initial_model(model_spec(c.partition.dataset, model=c.rules.model), seed=c.seed)
    return _Inputs(data=data, traces=traces, participation=participation, source=source)


def _simulate(plan: SimRunPlan, inputs: _Inputs, emit: Emit) -> dict[str, Any]:
    from simulator.engine import records_as_rows, run_simulation
    from simulator.report import write_csv_atomic

    started = time.perf_counter()
    data, traces, participation = inputs.data, inputs.traces, inputs.participation
    emit(_banner(plan, inputs.source))
    rows: list[dict] = []
    results: dict[str, SimResult] = {}
    for label, c in plan.configs.items():
        results[label] = run_simulation(c, data=data, traces=traces, participation=participation,
                                        on_round=_progress(c, plan.progress_every, emit))
        rows.extend(records_as_rows(results[label]))
        _write_run(plan.out / label, c, results[label], plan.timeline, label=label)
    write_csv_atomic(plan.out / "rounds.csv", rows)
    summary = _write_summary(plan, results, wall_s=time.perf_counter() - started)
    _emit_finals(plan, results, summary, emit)
    return summary


def _participation(plan: SimRunPlan, sample_counts) -> tuple[TraceSet | None, Participation | None, str]:
    """The trace set (or the timeline's participation) every run shares, and how the banner names it."""
    cfg = plan.base
    if plan.timeline is None:
        from trace_recorder.format import read_trace_set

        traces = read_trace_set(Path(cfg.traces.set))
        return traces, None, f"|T|={cfg.traces.num_traces} of {traces.path}"
    from simulator.timeline_source import timeline_participation

    participation = timeline_participation(cfg, plan.timeline, sample_counts=[int(n) for n in sample_counts])
    if participation.rounds_covered() < cfg.rounds:
        log.warning("the timeline covers rounds 1..%d of %d; after it every device is offline (s = 0)",
                    participation.rounds_covered(), cfg.rounds)
    return None, participation, f"timeline {plan.timeline.path} (deadline {plan.timeline.deadline_s:g} s)"


def _banner(plan: SimRunPlan, source: str) -> str:
    cfg = plan.base
    events = ", ".join([f"device {a.device} arrives in round {a.round}" for a in cfg.schedule.arrivals]
                       + [f"device {d.device} departs after round {d.round} ({d.policy or cfg.rules.departure_policy})"
                          for d in cfg.schedule.departures])
    return (f"flexfl sim: {cfg.partition.describe()}, {source}, E={cfg.rules.required_updates}, {cfg.rounds} rounds, "
            f"{', '.join(c.rules.aggregation.description for c in plan.configs.values())}"
            f"{'; ' + events if events else ''}")


def _progress(c: SimConfig, every: int, emit: Emit) -> Callable[[RoundRecord], None]:
    """A line every `every` rounds (0: rounds / 10), at the last round and at membership events."""
    every = every or max(1, c.rounds // 10)
    title, t0 = c.rules.aggregation.title, time.perf_counter()

    def progress(r: RoundRecord) -> None:
        if r.round % every == 0 or r.round == c.rounds or r.events:
            emit(f"  {title} round {r.round}/{c.rounds}: test acc {100 * r.test_acc:.2f}% "
                 f"loss {r.test_loss:.3f} lr {r.lr:.4g} active {r.active}/{r.members}"
                 f"{'  ' + r.events if r.events else ''} ({time.perf_counter() - t0:.1f} s)")

    return progress


def _write_run(run_dir: Path, c: SimConfig, result: SimResult, timeline: TimelineRun | None, *, label: str) -> None:
    """OUT/<label>/: the rows (metrics.jsonl), the config (sim.toml) and run.json, as a live run has them."""
    from coordinator.metrics import write_run_info
    from coordinator.rules.round_record import rules_record
    from flexfl.config import to_dict, write_config
    from simulator.report import write_jsonl_atomic
    from workloads.partition_spec import device_id

    write_jsonl_atomic(run_dir / "metrics.jsonl", result.rows)
    write_config(run_dir / "sim.toml", c, header=f"flexfl sim run, scheme {label}")
    # The rules as trained (eta0 and batch size filled in, as in its rows): the report's configuration shows them.
    config = {**to_dict(c), "rules": rules_record(c.rules, dataset=c.partition.dataset)}
    deadline_s = timeline.deadline_s if timeline else (c.clock.deadline_s if c.clock else None)
    write_run_info(run_dir, kind="sim", config=config, deadline_s=deadline_s,
                   required_updates=c.rules.required_updates,
                   devices={device_id(k): {"trace": t, "shard": k} for k, t in enumerate(result.trace_assignment)})


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _write_summary(plan: SimRunPlan, results: Mapping[str, SimResult], *, wall_s: float) -> dict[str, Any]:
    """accuracy.png (one curve per strategy) and summary.json."""
    import numpy as np

    from flexfl.config import to_dict
    from simulator.report import plot_accuracy_curves

    cfg = plan.base
    curves = {label: np.array([r.test_acc for r in res.records]) for label, res in results.items()}
    panel = f"|T| = {cfg.traces.num_traces}" if plan.timeline is None else "timeline"
    if _has_matplotlib():
        plot_accuracy_curves(plan.out / "accuracy.png", {panel: curves}, title=f"{cfg.partition.describe()}")
    else:  # an install without extras (an edge device's) still simulates; the curves are in rounds.csv
        log.warning("matplotlib is not installed (pip install -e '.[plot]'): accuracy.png not drawn")
    updates = sum(res.device_updates for res in results.values())
    sim_s = sum(res.wall_s for res in results.values())
    summary = {"config": to_dict(cfg), "final_acc": {label: res.final_accuracy for label, res in results.items()},
               "wall_s": wall_s, "device_updates": updates, "device_updates_per_s": updates / sim_s if sim_s else None,
               **({"timeline": asdict(plan.timeline)} if plan.timeline else {})}
    with atomic_file(plan.out / "summary.json") as f:
        json.dump(summary, f, indent=1)
    return summary


def _emit_finals(plan: SimRunPlan, results: Mapping[str, SimResult], summary: Mapping[str, Any], emit: Emit) -> None:
    out = plan.out
    accs = ", ".join(f"{plan.configs[k].rules.aggregation.title} {100 * res.final_accuracy:.2f}%"
                     for k, res in results.items())
    sim_s = sum(res.wall_s for res in results.values())
    plot = ", accuracy.png" if (out / "accuracy.png").exists() else ""
    emit(f"final test accuracy: {accs} | {summary['wall_s']:.1f} s, {summary['device_updates'] / sim_s:.0f} "
         f"device-updates/s | results in {out}/ (rounds.csv{plot}, summary.json, <scheme>/metrics.jsonl)")
