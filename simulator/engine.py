"""One simulated federated run: traces -> s per device -> local SGD -> the shared round -> metrics.

The round itself (participants, learning rate, coefficients, update, arrivals and
departures) is coordinator.rules.round.Federation, the same object the live coordinator runs.
The simulator's rooms around it:
- simulator.sim_config: SimConfig, what determines a run (with the seed, exactly);
- simulator.participation: where s comes from (the Participation protocol: a fixed table,
  traces through trace_recorder.sampler as live agents draw, shared draws, a device timeline);
- simulator.run_state: one run's Federation between rounds (open and weigh, close and record);
- simulator.local_training: the contributors' local SGD (simulator.trainers.fast_trainer or
  simulator.trainers.cache_trainer for all rows at once, or edge_agent.trainer per device);
- simulator.evaluation: the objective's test set (workloads.federated.FederatedData.test_for);
- simulator.sim_rows: what a run records per round (coordinator.rules.round_record.RoundRecord, as live).
This module is the loop that drives them, the same for one run and for paired runs.

A run is a pure function of its config: data, initial model, trace assignment, s draws
and minibatches are seeded per (seed, device, round), so runs that differ only in a policy
(scheme, fast-reboot, departure policy) are paired. `run_paired` runs such configs in
lock-step and trains the rows of all of them in one row-trainer call per round (cache or fast).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from coordinator.rules.round_record import RoundRecord
from flexfl.errors import ConfigError
from simulator.local_training import ROW_TRAINERS, PairedTrainer, RoundTrainer, RunTrainer
from simulator.participation import FixedParticipation, Participation, SharedDraws, TraceParticipation
from simulator.run_state import RoundWork, RunState
from simulator.sim_checkpoint import Checkpointer, _same_configs, _state_key, restore
from simulator.sim_config import (
    DEFAULT_TRACE_SET,
    ArrivalEvent,
    DepartureEvent,
    ExtraTest,
    ScheduleConfig,
    SimConfig,
    TracesConfig,
    runs_alike,
)
from simulator.sim_rows import SimResult, records_as_rows
from simulator.trainers.trainer_kind import TrainerKind, cache_trainer_available
from trace_recorder.format import TraceSet, read_trace_set
from workloads.federated import FederatedData, build_federated
from workloads.partition_spec import device_id

# The rooms' names, importable from here as before the engine was split (pages, tests, benchmarks).
__all__ = [
    "DEFAULT_TRACE_SET",
    "ROW_TRAINERS",
    "ArrivalEvent",
    "DepartureEvent",
    "ExtraTest",
    "FixedParticipation",
    "Participation",
    "RoundRecord",
    "RoundWork",
    "RunState",
    "ScheduleConfig",
    "SimConfig",
    "SimResult",
    "TraceParticipation",
    "TracesConfig",
    "TrainerKind",
    "_RoundWork",
    "_Run",
    "_same_configs",
    "_state_key",
    "cache_trainer_available",
    "device_id",
    "load_data",
    "records_as_rows",
    "run_paired",
    "run_simulation",
    "runs_alike",
]
_Run, _RoundWork = RunState, RoundWork  # the names simulator.device_steps and tests patch

OnRound = Callable[[RoundRecord], None]
OnModel = Callable[[int, Mapping[str, torch.Tensor]], None]


def load_data(cfg: SimConfig) -> FederatedData:
    return build_federated(cfg.partition)


def run_simulation(
    cfg: SimConfig,
    *,
    data: FederatedData | None = None,
    traces: TraceSet | None = None,
    participation: Participation | None = None,
    on_round: OnRound | None = None,
    on_model: OnModel | None = None,
    chunk_rows: int | None = None,
) -> SimResult:
    """Run `cfg.rounds` rounds and return per-round metrics and the final model.

    `participation` overrides the trace-driven s draws (e.g. FixedParticipation). `on_model(tau,
    params)` sees the global model after each round (e.g. to hold it beside another engine's).
    `chunk_rows`: the most deltas a round stacks before it trains and sums in chunks (default:
    simulator.local_training.STACK_BUDGET_BYTES' worth).
    """
    started = time.perf_counter()
    data = data if data is not None else load_data(cfg)
    if participation is None:
        participation = TraceParticipation(traces if traces is not None else read_trace_set(Path(cfg.traces.set)), cfg)
    if cfg.rules.aggregation.asynchronous:  # no rounds: server steps on the simulated clock
        from simulator.async_run import run_async

        if on_model is not None:
            raise ConfigError(f"{cfg.rules.aggregation.title}: on_model sees rounds' models; an asynchronous run has "
                              "none")
        return run_async(cfg, data=data, participation=participation, on_round=on_round)
    run = _Run(cfg, data, participation)
    _lockstep([run], RunTrainer(cfg, run.model, data, chunk_rows=chunk_rows), first_round=1, on_round=on_round,
              after_round=None if on_model is None else lambda tau: on_model(tau, run.fed.params))
    run.result.final_params = run.fed.params
    run.result.wall_s = time.perf_counter() - started
    return run.result


def run_paired(
    configs: Sequence[SimConfig],
    *,
    data: FederatedData | None = None,
    traces: Mapping[str, TraceSet] | None = None,
    checkpoint: Path | None = None,
    checkpoint_every_s: float = 300.0,
    on_round: OnRound | None = None,
) -> list[SimResult]:
    """Run configs that share their data in lock-step, training each round's rows of all runs together.

    `checkpoint`: a file where the runs' state (each Federation and its records) is
    saved atomically every `checkpoint_every_s` seconds; a later call with the same configs
    resumes from it after its last saved round (every draw is seeded per round, so the
    result is the uninterrupted one: tests/unit/simulator/test_paired.py). A file saved for
    other configs is ignored. The caller deletes it once the results are safe.

    Each config keeps its own Federation, model, s draws and minibatches, so result i
    equals run_simulation(configs[i]) to float tolerance (tests/unit/simulator/test_paired.py);
    only the local training of a round is one row-trainer call over every run's
    contributors (each row starts from its run's model, at its run's learning rate).
    The configs must share the partition and the row trainer's batch size; they may differ
    in anything else (scheme, fast-reboot, departure policy, schedule, seed, |T|, rounds).
    `traces` maps a config's traces.set to its trace set (read from disk when missing).
    A record's seconds are its run's share of the round: the shared training split evenly
    over the runs still going, plus its own close and evaluation; so the results' wall_s
    add up to the group's time.
    """
    _check_paired(configs)
    data = data if data is not None else load_data(configs[0])
    runs = _paired_runs(configs, data, dict(traces or {}))
    first_round = restore(checkpoint, configs, runs) + 1
    saver = None if checkpoint is None else Checkpointer(checkpoint, configs, runs, every_s=checkpoint_every_s)
    _lockstep(runs, PairedTrainer(runs, data), first_round=first_round, on_round=on_round,
              after_round=saver.after_round if saver else None)
    for run in runs:
        run.result.final_params = run.fed.params
        run.result.wall_s = sum(r.seconds or 0.0 for r in run.result.records)
    return [run.result for run in runs]


def _lockstep(runs: Sequence[RunState], trainer: RoundTrainer, *, first_round: int, on_round: OnRound | None,
              after_round: Callable[[int], None] | None = None) -> None:
    """Rounds first_round.. of every run, each round trained in one trainer call for the runs still going."""
    for tau in range(first_round, max(run.cfg.rounds for run in runs) + 1):
        t0 = time.perf_counter()
        going = [run for run in runs if run.going(tau)]
        if not going:
            break
        works = [run.begin(tau) for run in going]
        trained = trainer.train_round(going, works, round_index=tau)
        # The shared training is split evenly; each run's close and evaluation is its own.
        share = (time.perf_counter() - t0) / len(going)
        for run, work, (deltas, losses) in zip(going, works, trained):
            record = run.end(work, deltas, losses, train_s=share)
            if on_round is not None:
                on_round(record)
        if after_round is not None:
            after_round(tau)


def _check_paired(configs: Sequence[SimConfig]) -> None:
    """Paired runs share their data and one row trainer: same partition, trainer and batch size."""
    if not configs:
        raise ConfigError("run_paired needs at least one config")
    first = configs[0]
    for i, cfg in enumerate(configs):
        if cfg.partition != first.partition:
            raise ConfigError(f"run_paired: config {i} has partition {cfg.partition.describe()}, config 0 has "
                              f"{first.partition.describe()}; paired runs share their data")
        if cfg.trainer_kind is not first.trainer_kind or not cfg.batched:
            raise ConfigError(f"run_paired: config {i} uses the {cfg.trainer_kind} trainer, config 0 the "
                              f"{first.trainer_kind}; paired runs train together in one row trainer (cache or fast; "
                              "run the plain one alone with run_simulation)")
        mine = cfg.rules.batch_size_for(cfg.partition.dataset)
        theirs = first.rules.batch_size_for(first.partition.dataset)
        if mine != theirs:
            raise ConfigError(f"run_paired: config {i} has batch size {mine}, config 0 {theirs}; "
                              "one trainer call needs one")


def _paired_runs(configs: Sequence[SimConfig], data: FederatedData, sets: dict[str, TraceSet]) -> list[RunState]:
    """One RunState per config; runs with the same draws (the schemes of a seed) share one SharedDraws."""
    for cfg in configs:
        if cfg.traces.set not in sets:
            sets[cfg.traces.set] = read_trace_set(Path(cfg.traces.set))
    draws: dict[tuple, SharedDraws] = {}
    runs = []
    for cfg in configs:
        r = cfg.rules
        key = (cfg.traces.set, cfg.traces.num_traces, cfg.seed, r.required_updates, r.trace_sampling, r.s_rule)
        if key not in draws:
            draws[key] = SharedDraws(TraceParticipation(sets[cfg.traces.set], cfg))
        runs.append(_Run(cfg, data, draws[key]))
    return runs
