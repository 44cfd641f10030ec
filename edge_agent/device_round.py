"""One round on the device: the round's terms in, the update out (s, why it stopped, delta, times).

No gRPC here: the transport (edge_agent/transport.py) delivers the terms with the model
decoded and sends the update; this module trains under the deadline rule
(edge_agent.deadline) and says what the round did, so that it runs, and is tested, with no
coordinator. The round's cap (`RoundCaps`) is E, or less under a forced schedule or a
participation trace (the simulator's sampler, with the coordinator's seed and rules).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from edge_agent.config import ParticipationConfig
from edge_agent.deadline import Estimates, RoundBudget, UpdateGate
from edge_agent.trainer import device_rng, train_local
from flexfl.errors import ConfigError
from flexfl.exchange import Delta, RoundTerms, UpdateReport
from workloads.datasets import ArrayDataset

if TYPE_CHECKING:  # imported when a trace is used: most agents never load the trace modules
    from trace_recorder.format import Trace
    from trace_recorder.sampler import TraceSampler

# (E, seed, device_index, trace_sampling, s_rule): the terms a trace sampler is drawn under.
SamplerKey = tuple[int, int, int, str, str]


@dataclass(frozen=True)
class DeviceUpdate:
    """What the device's round gives back: its report, the delta ({} when s = 0) and the cap it ran under."""

    report: UpdateReport
    delta: Delta
    cap: int


class SlowDevicePadding:
    """participation.min_update_s: each local update lasts at least that long (an emulated slower device).

    Not part of the deadline rule (edge_agent.deadline): the rule sees padded updates
    through the clock and its update estimate, as it would see a slower CPU.
    """

    def __init__(self, min_update_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.min_update_s, self._clock, self._sleep = min_update_s, clock, sleep
        self._started = clock()

    def boundary(self, done: int) -> None:
        """Between updates: the one before (if any) is padded, the next one starts now."""
        if done:
            self.finish_update()  # before the rule looks at the clock: the padding is part of the update
        self._started = self._clock()

    def finish_update(self) -> None:
        """Sleep until the update started last has lasted min_update_s."""
        if self.min_update_s:
            self._sleep(max(0.0, self._started + self.min_update_s - self._clock()))


def expected_parameters(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{name: (shape, dtype)} of the model's parameters: what a delivered model must match (float32)."""
    return {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in model.named_parameters()}


def load_params(model: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Copy the round's global model into `model` (its names and shapes were checked on delivery)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])


def run_round(*, round_id: int, terms: RoundTerms, model: torch.nn.Module, shard: ArrayDataset | None, cap: int,
              deadline_at: float, estimates: Estimates, margin_s: float, participation: ParticipationConfig,
              stopping: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> DeviceUpdate:
    """Train round `round_id` under `terms` from the global model, at most `cap` updates, within the deadline.

    `deadline_at` is `clock`'s reading at the deadline; `estimates` (the rule's measurements)
    learn this round's update time here and its upload time from the caller; `stopping()`
    says the agent is shutting down.
    """
    load_params(model, terms.params)
    E = terms.required_updates
    budget = None if participation.forced_updates else RoundBudget(
        deadline_at=deadline_at, estimates=estimates, margin_s=margin_s, clock=clock)
    padding = SlowDevicePadding(participation.min_update_s, clock=clock, sleep=sleep)
    gate = UpdateGate(budget=budget, stopping=stopping, on_boundary=padding.boundary)
    started = clock()
    if participation.no_train:
        delta = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        s, samples, loss = cap, 0, 0.0
    elif shard is None:
        raise ConfigError("the device has no training data (its shard was not loaded) and participation.no_train "
                          "is not set")
    else:
        result = train_local(model, shard, updates=cap, lr=terms.learning_rate, batch_size=terms.batch_size,
                             rng=device_rng(terms.seed, round_id, terms.device_index), unit=terms.unit,
                             keep_going=gate, mu=terms.proximal_mu)
        delta, s, samples, loss = result.delta, result.updates_completed, result.samples_used, result.mean_loss
        model.zero_grad(set_to_none=True)  # the last step's gradients (the model's size), not kept between rounds
        if s and not gate.said_no:  # ended at its cap: the last update is still to pad (else the gate's
            padding.finish_update()  # boundary padded it, and padding again would delay the upload)
        if s:  # a round the budget cut short teaches the update estimate too (a compute-bound device's only rounds)
            estimates.measured_updates(updates=s, seconds=clock() - started)
    train_s = clock() - started
    report = UpdateReport(round_id=round_id, updates_completed=s, samples_used=samples, train_s=train_s,
                          local_loss=loss if math.isfinite(loss) else 0.0,
                          previous_upload_s=estimates.upload_s or 0.0, stop_reason=gate.why_stopped(s=s, E=E))
    return DeviceUpdate(report=report, delta={n: t.numpy() for n, t in delta.items()} if s else {}, cap=cap)


class RoundCaps:
    """Most updates each round may do: E, or what the forced schedule / participation trace allows."""

    def __init__(self, participation: ParticipationConfig) -> None:
        self._forced = participation.forced_updates
        self._trace = load_trace(participation.trace)
        self._samplers: dict[SamplerKey, TraceSampler] = {}

    def cap(self, *, round_id: int, terms: RoundTerms) -> int:
        E = terms.required_updates
        if self._forced:
            return min(E, self._forced[(round_id - 1) % len(self._forced)])
        if self._trace is None:
            return E
        key = (E, terms.seed, terms.device_index, terms.trace_sampling, terms.s_rule)
        if key not in self._samplers:  # the simulator's sampler, with the coordinator's seed and rules
            from trace_recorder.sampler import TraceSampler

            self._samplers[key] = TraceSampler(self._trace, E=E, seed=terms.seed, device_index=terms.device_index,
                                               sampling=terms.trace_sampling, s_rule=terms.s_rule)
        return self._samplers[key].draw(round_id)


def load_trace(spec: str) -> Trace | None:
    """The participation trace "FOLDER:NAME" (None for ""), read once when the agent starts."""
    if not spec:
        return None
    from trace_recorder.format import read_trace_set

    folder, _, name = spec.rpartition(":")
    return read_trace_set(Path(folder)).get(name)
