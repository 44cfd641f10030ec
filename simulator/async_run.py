"""Asynchronous runs on the simulated clock: a strategy without rounds (FedBuff) as an event loop (issue 36).

The rule is the strategy's (coordinator.rules.strategies.FedBuff: staleness weights, the E / s
factor, the server step as factors of the strategy interface), its state the server's buffer
(coordinator.rules.buffer.ServerBuffer: each update summed at its coefficient on arrival, the
live coordinator's summed form); the times are the clock's
(simulator.clock: a timeline's conditions, or a trace's fraction of its deadline). This module
is the loop between them:

- At time 0 up to `concurrency` devices (0: all) drawn uniformly from the run's devices pull the
  model (server step 0) and start a task. A device's j-th task (j = 1, 2, ...) is:
  - from a trace set: its draw s_j for "round" j, as a synchronous run draws round j. With
    `budget`, the task ends at the deadline D with s_j updates; without, it does E updates in
    D E / s_j (its speed: simulator.clock). s_j = 0: the device is unavailable for D and tries
    again with task j + 1.
  - from a timeline in seconds: the conditions at the task's start. With `budget`, the deadline
    rule's s within D (trace_recorder.deadline.updates_before_deadline) and the time those s take
    (download, s updates, upload); without, E updates. Offline (or s = 0 within the budget, or
    a CPU share of 0): unavailable until the clock's next round start (round_s) and tries again.
- The task's local training starts from the model it pulled, at the rate the synchronous
  schedule has after as many accepted updates: eta_0 / (1 + floor(accepted / N)), N the
  devices (a synchronous round accepts one update per device), and its minibatches are
  edge_agent.trainer.device_rng(seed, j, k), as round j's of device k. The update is trained
  when the task starts and held until it arrives.
- When a task's update arrives, it enters the buffer with its staleness t = server steps since
  its pull; at K updates the server steps (FedBuff's formula, the strategy's factors), evaluates
  and records a row; the device then pulls the newest model and starts its next task, or, if
  a slot is short (concurrency), a device drawn from the idle ones takes the slot.
- Ties in time are broken by the order the tasks started (a heap of (time, sequence)).
- The run ends after `rounds` server steps ([run] rounds counts server steps here), or at the
  first step at or after [clock] until_s.

A row (coordinator.rules.round_record.RoundRecord) per server step: round = the step, s and
coefficients per device summed over its updates in the buffer (a fast device can push twice
into one buffer), p its staleness weights summed, staleness the oldest of its updates,
clock_s the step's time, lr the rate of the buffer's last update.

Arrivals and departures ([schedule]; their `round` counts server steps): a device arriving at
step r is absent until step r is taken, then joins the idle devices and the objective the model
is tested on (no fast-reboot boost: that is a rule of rounds). A device departing at step r
starts no task after step r, and an update of its still on the way is not taken; under exclude
it leaves the tested objective, under include it stays in it (auto and threshold decide from
the rounds left, and are refused). The step's row lists them as a round's close does.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from coordinator.rules.buffer import ServerBuffer, ServerStep
from coordinator.rules.objective import LearningRate
from coordinator.rules.round_record import RoundRecord, rules_record
from coordinator.rules.strategies import FedBuff
from edge_agent.trainer import steps_per_update
from flexfl.errors import ConfigError, DivergenceError
from flexfl.vocabulary import DeparturePolicy
from simulator.clock import clock_of, plan_task
from simulator.evaluation import evaluate_round
from simulator.local_training import RunTrainer
from simulator.participation import Participation
from simulator.sim_config import SimConfig
from simulator.sim_rows import SimResult
from workloads.federated import FederatedData, initial_model, model_spec
from workloads.partition_spec import device_id

OnRound = Callable[[RoundRecord], None]

# Consecutive starts without a task (every device offline or idle) before the run is declared stuck.
_MAX_IDLE_TRIES = 1000


@dataclass(frozen=True)
class _Pending:
    shard: int
    ordinal: int
    pulled: int  # server steps at the pull
    s: int
    lr: float
    delta: dict[str, torch.Tensor]
    loss: float


def run_async(cfg: SimConfig, *, data: FederatedData, participation: Participation,
              on_round: OnRound | None = None) -> SimResult:
    """Run `cfg.rounds` server steps of cfg's asynchronous strategy on the clock of `participation`."""
    return AsyncRun(cfg, data, participation).run(on_round)


class AsyncRun:
    """One asynchronous run: the server's model and buffer, the devices' tasks, the event heap."""

    def __init__(self, cfg: SimConfig, data: FederatedData, participation: Participation) -> None:
        rule = cfg.rules.aggregation
        if not isinstance(rule, FedBuff):
            raise ConfigError(f"{rule.title} is not an asynchronous strategy (run it with rounds: run_simulation)")
        clock = clock_of(participation)
        if clock is None:
            raise ConfigError(f"{rule.title} runs on the simulated clock, and this source of s gives none: a trace "
                              "set needs a deadline (a recorded set's own, or --deadline-s SECONDS) or use a timeline "
                              "(--timeline FILE --deadline-s SECONDS)")
        if cfg.clock is not None and cfg.clock.wait_all:
            raise ConfigError(f"{rule.title} has no rounds to wait in: drop --wait-all ([clock] wait_all)")
        for d in cfg.schedule.departures:
            policy = d.policy or cfg.rules.departure_policy
            if policy not in (DeparturePolicy.INCLUDE, DeparturePolicy.EXCLUDE):
                raise ConfigError(f"{rule.title}: device {d.device} departs under {policy}, which decides from the "
                                  "rounds left; an asynchronous run takes include or exclude")
        n = cfg.partition.n_devices
        if len(data.train) != n:
            raise ConfigError(f"data has {len(data.train)} devices, config asks for {n}")
        self.cfg, self.data, self.participation, self.rule, self.clock = cfg, data, participation, rule, clock
        self.E = cfg.rules.required_updates
        self.model, params = initial_model(model_spec(cfg.partition.dataset, model=cfg.rules.model), seed=cfg.seed)
        self.server = ServerBuffer(rule, params=params, E=self.E)  # the model, the steps taken, the buffer's sum
        self.trainer = RunTrainer(cfg, self.model, data)
        batch = cfg.rules.batch_size_for(cfg.partition.dataset)
        self.steps_per_update = [steps_per_update(len(d), batch_size=batch, unit=cfg.rules.unit) for d in data.train]
        self.rate = LearningRate(cfg.rules.eta0_for(cfg.partition.dataset))
        self.rng = np.random.default_rng([cfg.seed, 0xFB])  # who takes a free slot
        self.concurrency = rule.concurrency or n
        self.result = SimResult(config=cfg, trace_assignment=list(participation.trace_names))
        self.rules = rules_record(cfg.rules, dataset=cfg.partition.dataset)
        self.accepted = 0  # updates accepted into a buffer
        self.ordinal = [0] * n
        late = {a.device for a in cfg.schedule.arrivals}
        self.idle = [k for k in range(n) if k not in late]
        self.members = [k for k in range(n) if k not in late]  # the objective the model is tested on
        self.gone: set[int] = set()  # departed: no more tasks, an update still on its way is dropped
        self.heap: list[tuple[float, int, _Pending | int]] = []  # (time, sequence, an update or a waiting device)
        self.seq = 0
        self.buffered: list[_Pending] = []  # the buffer's updates (their deltas are in the server's sum)
        self.busy = 0
        self.idle_tries = 0

    @property
    def steps(self) -> int:
        return self.server.steps

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self.server.params

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, on_round: OnRound | None = None) -> SimResult:
        started = time.perf_counter()
        self._fill(0.0)
        clock = self.cfg.clock
        while self.steps < self.cfg.rounds and not (clock is not None and self.result.records
                                                   and clock.ended(self.result.records[-1].clock_s)):
            if not self.heap:
                raise ConfigError("asynchronous run: no device is training and none is waiting to (the source of s "
                                  "has no device at all)")
            now, _, payload = heapq.heappop(self.heap)
            if isinstance(payload, _Pending):  # an update arrives
                self.busy -= 1
                if payload.shard in self.gone:
                    continue  # it left while training: its update is not taken
                self._arrive(payload, now, on_round)
                if payload.shard not in self.gone:  # (it may leave at the step its own update completed)
                    self.idle.append(payload.shard)
            elif payload not in self.gone:  # a device that was unavailable tries again
                self.idle.append(payload)
            self._fill(now)
        self.result.final_params = self.params
        self.result.wall_s = time.perf_counter() - started
        return self.result

    def _push(self, at_s: float, payload: _Pending | int) -> None:
        heapq.heappush(self.heap, (at_s, self.seq, payload))
        self.seq += 1

    def _fill(self, now: float) -> None:
        """Idle devices drawn uniformly take the free slots; one unavailable waits for the clock's next round start."""
        while self.busy < self.concurrency and self.idle:
            shard = self.idle.pop(int(self.rng.integers(len(self.idle))))
            self.ordinal[shard] += 1
            plan = plan_task(self.participation, self.clock, shard=shard, ordinal=self.ordinal[shard], at_s=now,
                             E=self.E, budget=self.rule.budget)
            if plan is None or not math.isfinite(plan.duration_s):
                self.idle_tries += 1
                if self.idle_tries > _MAX_IDLE_TRIES * self.cfg.partition.n_devices:
                    raise ConfigError(f"asynchronous run: no device could start a task for {self.idle_tries} tries "
                                      f"(clock {now:g} s, after {self.steps} server steps): the source of s has every "
                                      "device unavailable (a timeline that has ended?)")
                self._push(self._next_start(now), shard)
                continue
            self.idle_tries = 0
            self.busy += 1
            self._push(now + plan.duration_s, self._train(shard, plan.s))

    def _next_start(self, now: float) -> float:
        every = self.clock.every_s
        return (math.floor(now / every + 1e-9) + 1) * every

    def _train(self, shard: int, s: int) -> _Pending:
        lr = self.rate.at(round_index=1 + self.accepted // self.cfg.partition.n_devices)
        ordinal = self.ordinal[shard]
        deltas, losses = self.trainer.train(self.params, [shard], [s * self.steps_per_update[shard]], lr=lr,
                                            round_index=ordinal)
        delta = {name: d[0].clone() for name, d in deltas.items()}  # the row trainer reuses its buffers
        self.result.device_updates += s * self.steps_per_update[shard]
        return _Pending(shard=shard, ordinal=ordinal, pulled=self.steps, s=s, lr=lr, delta=delta,
                        loss=float(losses[0]))

    def _arrive(self, update: _Pending, now: float, on_round: OnRound | None) -> None:
        self.server.take(device_id(update.shard), s=update.s, pulled=update.pulled, delta=update.delta)
        self.buffered.append(replace(update, delta={}))  # summed: its delta is not kept
        self.accepted += 1
        if self.server.full:
            record = self._step(now)
            if on_round is not None:
                on_round(record)

    def _events(self) -> tuple[list[str], list[str], dict[str, str]]:
        """The arrivals and departures scheduled at the server step just taken (the module docstring)."""
        cfg, step = self.cfg, self.steps
        arrived = [a.device for a in cfg.schedule.arrivals if a.round == step]
        for k in arrived:
            self.idle.append(k)
            self.members.append(k)
        policies = {}
        for d in (d for d in cfg.schedule.departures if d.round == step):
            self.gone.add(d.device)
            if d.device in self.idle:
                self.idle.remove(d.device)
            policy = d.policy or cfg.rules.departure_policy
            if policy is DeparturePolicy.EXCLUDE and d.device in self.members:
                self.members.remove(d.device)
            policies[device_id(d.device)] = str(policy)
        return [device_id(k) for k in arrived], list(policies), policies

    # -- the server step ---------------------------------------------------------------------------

    def _step(self, now: float) -> RoundRecord:
        t0 = time.perf_counter()
        buf, self.buffered = self.buffered, []
        step = self.server.step()
        arrivals, departures, policies = self._events()
        acc, loss, _ = evaluate_round(self.model, self.params, self.data, members=sorted(self.members), extra={})
        if not math.isfinite(loss):
            raise DivergenceError(f"server step {self.steps} of the {self.cfg.partition.dataset} run "
                                  f"({self.rule.description}, seed {self.cfg.seed}): test loss became {loss}; the "
                                  f"learning rate {buf[-1].lr:g} (or server_lr {self.rule.server_lr:g}) is too high")
        record = _step_record(step, buf, acc=acc, loss=loss, clock_s=now, rules=self.rules,
                              members=len(self.members))
        record = replace(record, seconds=time.perf_counter() - t0, arrivals=tuple(arrivals),
                         departures=tuple(departures), departure_policies=policies)
        self.result.records.append(record)
        return record


def _step_record(step: ServerStep, buf: list[_Pending], *, acc: float, loss: float, clock_s: float, rules: Mapping,
                 members: int) -> RoundRecord:
    """A server step's row (the module docstring: per device, sums over its updates in the buffer)."""
    updates = step.updates
    order = list(dict.fromkeys(u.device for u in updates))
    s_of = dict.fromkeys(order, 0)
    p_of = dict.fromkeys(order, 0.0)
    c_of = dict.fromkeys(order, 0.0)
    stale_of = dict.fromkeys(order, 0)
    for u in updates:
        s_of[u.device] += u.s
        p_of[u.device] += u.p
        c_of[u.device] += u.coefficient
        stale_of[u.device] = max(stale_of[u.device], u.staleness)
    c = np.array([u.coefficient for u in updates], dtype=np.float64)
    total = float(c.sum())
    train_loss = float(np.dot(c, [b.loss for b in buf]) / total) if total > 0 else float("nan")
    return RoundRecord(round=step.step, lr=buf[-1].lr, participants=tuple(order), devices=tuple(order), s=s_of,
                       p=p_of, coefficients=c_of, discarded=False, test_acc=acc, test_loss=loss, train_loss=train_loss,
                       members=members, rules=rules, clock_s=clock_s, staleness=stale_of)
