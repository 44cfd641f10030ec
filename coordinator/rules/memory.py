"""A strategy's memory between rounds: the hooks Federation calls, and MIFA's per-device update memory.

StrategyMemory is what a strategy with state between rounds gives (Strategy.new_memory):
coordinator.rules.round.Federation hands it every closing round (ClosingRound: the contributors'
updates, s, p, the rate, the model before and after the plain aggregate) and takes the model
it returns; it is told who is still in the objective after the membership events, and its
snapshot() goes into the live coordinator's checkpoints. The live coordinator (updates
summed as they arrive) and the simulator (updates stacked) build the same ClosingRound, so
a memory, built in or a plug-in's, cannot tell them apart.

MIFA's memory (MIFAMemory) is an UpdateMemory:

A memory m_k is one model-sized set of float32 tensors per device that has sent an update
and is still in the objective (MNIST's MLP: 199,210 parameters, 0.8 MB a device; 100
devices, 80 MB). The sum S = sum_k n_k m_k over the memories is kept beside them, so a new
update replaces a device's old one in O(model) work (S += n_k (m_new - m_old)) and the
round's term sum_k p_k m_k costs O(model) plus O(model) per device whose p_k is not its
n_k / n (a fast-reboot boost): it never restacks every memory. `stacked_term` computes the
same term from every memory at once; tests hold the two equal.

Tensors are replaced, never changed in place, so `snapshot()` (a shallow copy) is a
consistent state for a checkpoint written while the next round runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flexfl.errors import AggregationError

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClosingRound:
    """What a strategy's memory is given of a closing round (Federation.close_stacked and close_summed alike)."""

    round_index: int
    lr: float  # eta_tau, the round's learning rate
    E: int  # the rules' E (updates required), not a strategy's own count
    devices: tuple[str, ...]  # the objective's members, in order
    s: np.ndarray  # int64 [N]: updates completed, as the rules count them (0: sent nothing)
    p: np.ndarray  # float64 [N]: base weights, fast-reboot boost included
    coefficients: np.ndarray  # float64 [N]: c_k of this round's own updates
    n_samples: Mapping[str, int]  # every member's n_k
    # Each contributor's (c_k > 0) update delta_k, in `devices` order. Views of the caller's
    # buffers: a memory copies what it keeps.
    updates: Mapping[str, Mapping[str, torch.Tensor]]
    params: Mapping[str, torch.Tensor]  # w before the round
    aggregated: Mapping[str, torch.Tensor]  # w + sum_k c_k delta_k: the round's model without a memory


class StrategyMemory(ABC):
    """A strategy's state between rounds (MIFA's updates, a plug-in's own): one per run, from Strategy.new_memory.

    close() is called once per round, after the round's updates are in (summed or stacked),
    and returns the new global model; keep_only() after each close's membership events;
    snapshot() must return plain data (dicts, lists, numbers, strings, tensors) that later
    closes do not change: the live coordinator writes it to its checkpoint on another thread,
    and restore() gets it back in a resumed run.
    """

    @abstractmethod
    def close(self, round: ClosingRound) -> dict[str, torch.Tensor]:
        """The global model after round `round`: each tensor shaped like round.params'."""

    def keep_only(self, devices: set[str]) -> None:  # noqa: B027 - optional: a memory of every device ever seen
        """The objective's members after the close's membership events (a device left under exclude is gone)."""

    @property
    def remembered(self) -> tuple[str, ...]:
        """The devices whose state entered this close's model (recorded in each round's row)."""
        return ()

    @abstractmethod
    def snapshot(self) -> dict:
        """The state after the last close, for a checkpoint."""

    @abstractmethod
    def restore(self, state: Mapping[str, Any]) -> None:
        """Back to a snapshot() (a resumed coordinator)."""


class UpdateMemory:
    """Each device's latest (scaled) update m_k and S = sum_k n_k m_k, for a model shaped like `like`."""

    def __init__(self, *, like: Mapping[str, torch.Tensor]) -> None:
        self.shapes = {name: tuple(w.shape) for name, w in like.items()}
        self.memories: dict[str, Tensors] = {}
        self.samples: dict[str, int] = {}  # n_k each memory entered S with
        # float64: S is updated by subtraction for as long as the run lasts; in float32 the
        # rounding of every replacement would stay in it.
        self._sum: Tensors = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in self.shapes.items()}

    def replace(self, device: str, *, n_samples: int, update: Mapping[str, np.ndarray | torch.Tensor],
                scale: float) -> None:
        """m_device <- scale * update (its old memory, if any, leaves S); raises, changing nothing, if malformed."""
        if set(update) != set(self.shapes):
            raise AggregationError(f"update from {device!r} has tensors {sorted(update)}, expected "
                                   f"{sorted(self.shapes)}")
        new: Tensors = {}
        for name, d in update.items():
            t = torch.as_tensor(d).detach().to("cpu", torch.float32)
            if tuple(t.shape) != self.shapes[name]:
                raise AggregationError(f"update from {device!r}: tensor '{name}' has shape {tuple(t.shape)}, "
                                       f"expected {self.shapes[name]}")
            new[name] = t * float(np.float32(scale))  # scale rounded to float32, the tensor's dtype
        if not all(torch.isfinite(t).all() for t in new.values()):
            raise AggregationError(f"update from {device!r} scaled by {scale!r} is not finite")
        self.forget(device)
        self.memories[device] = new
        self.samples[device] = int(n_samples)
        self._sum = {name: s + n_samples * new[name].double() for name, s in self._sum.items()}

    def forget(self, device: str) -> None:
        """Drop `device`'s memory (a device excluded from the objective); nothing if it has none."""
        old = self.memories.pop(device, None)
        if old is not None:
            n = self.samples.pop(device)
            self._sum = {name: s - n * old[name].double() for name, s in self._sum.items()}

    def keep_only(self, devices: set[str]) -> None:
        """Forget every memory of a device not in `devices` (the objective's members)."""
        for device in [d for d in self.memories if d not in devices]:
            self.forget(device)

    def term(self, *, p: Mapping[str, float], n_total: int) -> Tensors:
        """sum_k p_k m_k over the memories, from S: p_k = n_k / n_total, plus (p_k - n_k / n_total) m_k where not.

        `p` holds every device with a memory (a device missing from it would be silently
        dropped from S's total; refused instead)."""
        missing = set(self.memories) - set(p)
        if missing:
            raise AggregationError(f"no weight given for the memories of {sorted(missing)}")
        out = {name: s / n_total for name, s in self._sum.items()}
        for device, m in self.memories.items():
            extra = p[device] - self.samples[device] / n_total
            if extra != 0.0:  # a fast-reboot boost (or a changed n_k): O(model) for this device only
                out = {name: o + extra * m[name].double() for name, o in out.items()}
        return {name: o.float() for name, o in out.items()}

    def stacked_term(self, *, p: Mapping[str, float]) -> Tensors:
        """The same sum as `term`, from every memory stacked (O(devices x model)): the check of `term`."""
        devices = list(self.memories)
        if not devices:
            return {name: torch.zeros(shape, dtype=torch.float32) for name, shape in self.shapes.items()}
        c = torch.tensor([p[d] for d in devices], dtype=torch.float64)
        return {name: torch.tensordot(c, torch.stack([self.memories[d][name].double() for d in devices]),
                                      dims=1).float()
                for name in self.shapes}

    def snapshot(self) -> dict[str, dict]:
        """{"memories": {device: tensors}, "samples": {device: n_k}}: what a checkpoint keeps (S is rebuilt)."""
        return {"memories": dict(self.memories), "samples": dict(self.samples)}

    def restore(self, state: Mapping[str, Mapping]) -> None:
        """Back to a snapshot() (a resumed coordinator); S is recomputed from the memories."""
        self.memories, self.samples = {}, {}
        self._sum = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in self.shapes.items()}
        for device, m in dict(state.get("memories", {})).items():
            self.replace(str(device), n_samples=int(state["samples"][device]), update=m, scale=1.0)


class MIFAMemory(UpdateMemory, StrategyMemory):
    """MIFA's close (coordinator.rules.strategies.MIFA): each contributor's m_k <- (E / s_k) delta_k / eta_tau, then
    w + eta_tau sum_k p_k m_k over every memory, from the memories' running sum."""

    def close(self, round: ClosingRound) -> dict[str, torch.Tensor]:
        s = dict(zip(round.devices, round.s.tolist()))
        for device, update in round.updates.items():
            self.replace(device, n_samples=round.n_samples[device], update=update,
                         scale=round.E / (s[device] * round.lr))
        term = self.term(p=dict(zip(round.devices, round.p.tolist())), n_total=sum(round.n_samples.values()))
        return {name: w.detach() + (term[name] * round.lr).to(w.dtype) for name, w in round.params.items()}

    @property
    def remembered(self) -> tuple[str, ...]:
        return tuple(self.memories)
