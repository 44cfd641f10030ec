"""FedBuff's server: the buffer of updates and its step every K of them, in the summed form.

The rule is coordinator.rules.strategies.FedBuff's (staleness weights, the E / s factor, the
server rate); this is its state, kept as the live coordinator keeps a round: each update enters
a running sum at its final coefficient when it arrives and is dropped, so the buffer holds one
model-sized sum whatever K is. A full buffer's coefficient of update i is

    c_i = g(t_i) [x E / s_i with es_factor] x server_lr / K,    t_i = steps - pulled_i,

known on arrival, and the step is w <- w + sum_i c_i delta_i, summed in arrival order.
simulator.async_run drives it on the simulated clock; a live coordinator without rounds would
take its agents' pushes into the same object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.rules.strategies import FedBuff
from flexfl.errors import AggregationError


@dataclass(frozen=True)
class BufferedUpdate:
    """One update the buffer took: who, how much work, how stale, and its share of the step."""

    device: str
    s: int
    staleness: int  # server steps between its pull and its arrival
    p: float  # its staleness weight g(staleness)
    coefficient: float  # c_i of the module docstring (0: it changes nothing, s = 0)


@dataclass(frozen=True)
class ServerStep:
    """A step the server took: its number (from 1) and the K updates it applied, in arrival order."""

    step: int
    updates: tuple[BufferedUpdate, ...]


class ServerBuffer:
    """FedBuff's server state: the model, the steps taken, and the running sum of the updates buffered since."""

    def __init__(self, rule: FedBuff, *, params: Mapping[str, torch.Tensor], E: int) -> None:
        self.rule, self.E = rule, E
        self.params = {name: w.detach().clone() for name, w in params.items()}
        self.steps = 0
        k = rule.buffer
        # The round scale of a full buffer (the step always has K updates): server_lr / K.
        self._scale = rule.round_scale(s=np.full(k, E, dtype=np.int64), E=E, p=np.ones(k)) or 0.0
        self._sum: dict[str, torch.Tensor] = {}
        self._taken: list[BufferedUpdate] = []

    @property
    def full(self) -> bool:
        return len(self._taken) >= self.rule.buffer

    def take(self, device: str, *, s: int, pulled: int, delta: Mapping[str, torch.Tensor]) -> BufferedUpdate:
        """Buffer `device`'s update of s local updates trained from the model of step `pulled`; raises
        AggregationError (changing nothing) for an update that cannot enter: a full buffer, s outside 0..E, a pull
        from a step not taken yet, or a delta that is not the model's shape or not finite."""
        if self.full:
            raise AggregationError(f"the buffer holds its {self.rule.buffer} updates: step before taking another")
        if not 0 <= s <= self.E:
            raise AggregationError(f"an update from {device!r} with s = {s}, outside 0..E (E = {self.E})")
        if not 0 <= pulled <= self.steps:
            raise AggregationError(f"an update from {device!r} pulled at server step {pulled}; the server has taken "
                                   f"{self.steps}")
        staleness = self.steps - pulled
        p = float(self.rule.staleness_weights(np.array([staleness]))[0])
        weight = float(self.rule.weights_for(s=np.array([s]), E=self.E, p=np.array([p]), devices=[device])[0])
        coefficient = weight * self._scale
        if coefficient > 0:
            self._check(device, delta)
            for name in self.params:
                term = coefficient * delta[name]
                self._sum[name] = term if name not in self._sum else self._sum[name] + term
        update = BufferedUpdate(device=device, s=int(s), staleness=staleness, p=p, coefficient=coefficient)
        self._taken.append(update)
        return update

    def step(self) -> ServerStep:
        """Apply the full buffer to the model (w + the sum) and empty it."""
        if not self.full:
            raise AggregationError(f"a server step needs {self.rule.buffer} buffered updates, there are "
                                   f"{len(self._taken)}")
        if self._sum:
            self.params = {name: w + self._sum[name] for name, w in self.params.items()}
        self.steps += 1
        taken, self._taken, self._sum = tuple(self._taken), [], {}
        return ServerStep(step=self.steps, updates=taken)

    def _check(self, device: str, delta: Mapping[str, torch.Tensor]) -> None:
        if set(delta) != set(self.params):
            raise AggregationError(f"the update from {device!r} has tensors {sorted(delta)}, the model "
                                   f"{sorted(self.params)}")
        for name, w in self.params.items():
            d = delta[name]
            if tuple(d.shape) != tuple(w.shape):
                raise AggregationError(f"the update from {device!r}: tensor '{name}' has shape {tuple(d.shape)}, "
                                       f"the model {tuple(w.shape)}")
            if not bool(torch.isfinite(d).all()):
                raise AggregationError(f"the update from {device!r}: tensor '{name}' is not finite (NaN or inf)")
