"""Per-device update memory (MIFA): each device's latest update, and their running sum.

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

from collections.abc import Mapping

import numpy as np
import torch

from flexfl.errors import AggregationError

Tensors = dict[str, torch.Tensor]


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
