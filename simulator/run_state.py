"""One simulated run between rounds: its Federation, its source of s and its records; the caller trains.

`RunState.begin(tau)` opens round tau and says what to train (RoundWork); `RunState.end` closes
it with the trained deltas, evaluates and records. simulator.engine drives one or several runs
through these in lock-step; simulator.device_steps counts a run's work through them untrained.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.rules.round import Arrival, Departure, Federation, RoundOpening, RoundSum, Weighing
from coordinator.rules.round_record import RoundRecord, rules_record
from edge_agent.trainer import steps_per_update
from flexfl.errors import ConfigError, DivergenceError
from simulator.clock import clock_of
from simulator.evaluation import evaluate_round
from simulator.participation import Participation, WaitForAll, round_draws
from simulator.sim_config import ExtraTest, SimConfig
from simulator.sim_rows import SimResult, round_record
from workloads.federated import FederatedData, initial_model, model_spec
from workloads.partition_spec import device_id


@dataclass(frozen=True)
class RoundWork:
    """What one run needs trained in a round: its contributors' shards and s, at the round's rate."""

    opening: RoundOpening
    s: dict[str, int]
    weighing: Weighing
    rows: list[str]  # contributors, in the order of shards/steps
    shards: list[int]
    steps: list[int]  # SGD steps: s x steps_per_update of the device
    reasons: dict[str, str] | None = None  # why each s is what it is, where the participation knows (a timeline)


class RunState:
    """One run's state between rounds: its Federation, s draws and records; the caller trains."""

    def __init__(self, cfg: SimConfig, data: FederatedData, participation: Participation) -> None:
        n = cfg.partition.n_devices
        if len(data.train) != n:
            raise ConfigError(f"data has {len(data.train)} devices, config asks for {n}")
        if cfg.clock is not None and cfg.clock.wait_all:  # FedAvg waiting for everyone: no deadline
            participation = WaitForAll(participation, E=cfg.rules.required_updates)
        self.cfg, self.data, self.participation = cfg, data, participation
        self.model, params = initial_model(model_spec(cfg.partition.dataset, model=cfg.rules.model), seed=cfg.seed)
        self.fed = Federation(rules=cfg.rules, dataset=cfg.partition.dataset, params=params, horizon=cfg.rounds,
                              seed=cfg.seed)
        late = {a.device for a in cfg.schedule.arrivals}
        self.start_shards = [k for k in range(n) if k not in late]
        self.fed.apply_events(arrivals=[Arrival(device_id(k), int(data.sample_counts[k]))
                                        for k in range(n) if k not in late])
        self.shard = {device_id(k): k for k in range(n)}
        batch = cfg.rules.batch_size_for(cfg.partition.dataset)
        self.steps_per_update = [steps_per_update(len(d), batch_size=batch, unit=cfg.rules.unit) for d in data.train]
        self.result = SimResult(config=cfg, trace_assignment=list(participation.trace_names))
        # In every record, as a live run's rows have them: eta0 and the batch size as trained (the dataset's
        # default where the config leaves them out), so a run's rows say which operating point it ran at.
        self.rules = rules_record(cfg.rules, dataset=cfg.partition.dataset)
        self.clock = clock_of(participation)  # the simulated clock (simulator.clock); None: the rows have no clock_s

    def going(self, tau: int) -> bool:
        """Whether round tau is run: within [run] rounds and before the clock's horizon ([clock] until_s)."""
        if tau > self.cfg.rounds:
            return False
        records, clock = self.result.records, self.cfg.clock
        return not (records and clock is not None and clock.ended(records[-1].clock_s))

    def begin(self, tau: int) -> RoundWork:
        opening = self.fed.open(tau)
        devices = list(opening.participants)
        draws = round_draws(self.participation, [self.shard[d] for d in devices], tau)
        s = dict(zip(devices, draws.s))
        reasons = None if draws.why is None else dict(zip(devices, draws.why))
        weighing = self.fed.weigh(tau, s)
        rows = weighing.contributors  # only these change the model: train just them
        shards = [self.shard[d] for d in rows]
        return RoundWork(opening=opening, s=s, weighing=weighing, rows=rows, shards=shards,
                         steps=[s[d] * self.steps_per_update[k] for d, k in zip(rows, shards)], reasons=reasons)

    def end(self, work: RoundWork, deltas: Mapping[str, torch.Tensor] | RoundSum, losses: np.ndarray, *,
            train_s: float) -> RoundRecord:
        """Close the round with the contributors' deltas (row i: work.rows[i]), evaluate, record.

        `deltas` may instead be the round's RoundSum they were added to (a round trained in chunks:
        simulator.local_training.RunTrainer). `losses` is each row's mean minibatch loss. The
        record's seconds are `train_s` (the round's time so far) plus this close and evaluation.
        """
        t0 = time.perf_counter()
        cfg, fed, tau = self.cfg, self.fed, work.opening.round_index
        arrivals = [Arrival(device_id(a.device), int(self.data.sample_counts[a.device]))
                    for a in cfg.schedule.arrivals if a.round == tau]
        departures = [Departure(device_id(d.device), d.policy) for d in cfg.schedule.departures if d.round == tau]
        if isinstance(deltas, RoundSum):
            outcome = fed.close_summed(work.weighing, summed=deltas, arrivals=arrivals, departures=departures)
        else:
            outcome = fed.close_stacked(work.weighing, deltas=deltas, rows=work.rows, arrivals=arrivals,
                                        departures=departures)
        acc, loss, extra = evaluate_round(self.model, fed.params, self.data,
                                          members=[self.shard[d] for d in fed.objective.members()],
                                          extra={str(name): self._extra_shards(name) for name in cfg.extra_tests})
        if not math.isfinite(loss):
            self._diverged(tau, loss, lr=work.opening.lr)
        self.result.device_updates += sum(work.steps)
        record = round_record(opening=work.opening, weighing=work.weighing, outcome=outcome, rules=self.rules,
                              losses=losses, test_acc=acc, test_loss=loss, seconds=train_s + time.perf_counter() - t0,
                              members=len(fed.objective.members()), extra=extra, reasons=work.reasons,
                              clock_s=None if self.clock is None else self.clock.closes_s(tau))
        self.result.records.append(record)
        return record

    def _extra_shards(self, name: ExtraTest) -> list[int]:
        if name is ExtraTest.START:
            return self.start_shards
        return [self.shard[d] for d in self.fed.objective.active_members()]

    def _diverged(self, tau: int, loss: float, *, lr: float) -> None:
        cfg = self.cfg
        # Which run, too: paired runs train several configs in one loop (simulator.engine.run_paired).
        raise DivergenceError(f"round {tau} of the {cfg.partition.dataset} run "
                              f"({cfg.rules.aggregation.description}, E = {self.fed.E} {cfg.rules.unit}s, "
                              f"seed {cfg.seed}): test loss became {loss}; "
                              f"the learning rate {lr:g} is too high for this setup")
