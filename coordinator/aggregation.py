"""Aggregation Schemes A, B and C (paper Section 4.1) and the update w <- w + sum_k p_k (w_k - w).

The schemes are pure functions of the round's participation: s_k (local updates device k
completed, 0..E), E (updates required) and p_k (the device's base weight in the objective,
after any fast-reboot boost). They return the coefficients p_tau^k; applying them to model
deltas is a separate step so that the live coordinator and the simulator share both.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.choices import Scheme  # defined there so that parsers need no torch
from flexfl.errors import AggregationError


@dataclass(frozen=True)
class Coefficients:
    """Per-device aggregation coefficients p_tau^k for one round.

    `discarded` is True when Scheme A saw no complete device: the round must leave the
    global model unchanged. Under Scheme C the values may sum to more than 1 (intended).
    """

    values: np.ndarray  # float64 [N]
    discarded: bool = False

    @property
    def contributors(self) -> np.ndarray:
        """Indices of devices whose update enters the aggregate (coefficient > 0)."""
        return np.flatnonzero(self.values > 0)


def _checked(s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(E, (int, np.integer)) or E < 1:
        raise AggregationError(f"E (required local updates) must be an integer >= 1, got {E!r}")
    s_arr = np.asarray(s)
    p_arr = np.asarray(p, dtype=np.float64)
    if s_arr.ndim != 1 or p_arr.ndim != 1 or len(s_arr) != len(p_arr):
        raise AggregationError(
            f"s and p must be 1-D and of equal length, got shapes {s_arr.shape} and {p_arr.shape}"
        )
    if s_arr.size and not np.issubdtype(s_arr.dtype, np.integer):
        if not np.all(np.isfinite(s_arr)) or not np.all(s_arr == np.round(s_arr)):
            raise AggregationError(f"s must hold integers (updates completed), got {s_arr.tolist()}")
    s_arr = s_arr.astype(np.int64)
    bad = np.flatnonzero((s_arr < 0) | (s_arr > E))
    if bad.size:
        k = int(bad[0])
        raise AggregationError(f"s[{k}] = {s_arr[k]} is outside 0..E (E = {E})")
    bad = np.flatnonzero(~np.isfinite(p_arr) | (p_arr < 0))
    if bad.size:
        k = int(bad[0])
        raise AggregationError(f"p[{k}] = {p_arr[k]} must be finite and >= 0")
    return s_arr, p_arr


# Every scheme factors as c_k = f(s_k, E, p_k) * g(N, K): the first factor is known the
# moment device k's update arrives, the second only when the round closes (N devices in the
# objective, K of them complete). The batch form (coefficients) and the running one
# (RunningAggregate) are both built from these two functions, so they cannot disagree.
_ARRIVAL_WEIGHT = {
    Scheme.A: lambda s, E, p: p * (s == E),  # complete devices only
    Scheme.B: lambda s, E, p: np.where(s > 0, p, 0.0),  # any work at its base weight
    Scheme.C: lambda s, E, p: p * np.divide(E, s, out=np.zeros(len(s), dtype=np.float64), where=s > 0),
}


def _scheme(scheme: Scheme | str) -> Scheme:
    try:
        return Scheme(scheme)
    except ValueError:
        raise AggregationError(f"unknown scheme {scheme!r}; choose one of A, B, C") from None


def arrival_weights(scheme: Scheme | str, *, s: Sequence[int] | np.ndarray, E: int,
                    p: Sequence[float] | np.ndarray) -> np.ndarray:
    """The part of each coefficient known at the update's arrival: A p_k [s_k = E], B p_k [s_k > 0], C (E/s_k) p_k."""
    s_arr, p_arr = _checked(s, E, p)
    return _ARRIVAL_WEIGHT[_scheme(scheme)](s_arr, E, p_arr)


def round_scale(scheme: Scheme | str, *, n_devices: int, n_complete: int) -> float | None:
    """The part known at the round's close: A N / K_tau (None: discarded, K_tau = 0); B and C 1."""
    if _scheme(scheme) is not Scheme.A:
        return 1.0
    return None if n_complete == 0 else n_devices / n_complete


def _coefficients(scheme: Scheme, s, E, p) -> Coefficients:
    s_arr, p_arr = _checked(s, E, p)
    weights = _ARRIVAL_WEIGHT[scheme](s_arr, E, p_arr)
    scale = round_scale(scheme, n_devices=len(weights), n_complete=int((s_arr == E).sum()))
    if scale is None:
        return Coefficients(values=np.zeros_like(weights), discarded=True)
    return Coefficients(values=weights * scale)


def scheme_a(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = N p^k q_k / K_tau with q_k = [s_k == E]; the round is discarded when K_tau = 0."""
    return _coefficients(Scheme.A, s, E, p)


def scheme_b(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = p^k for every device that did any work (s_k > 0); an inactive device sends nothing."""
    return _coefficients(Scheme.B, s, E, p)


def scheme_c(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = (E / s_k) p^k, and 0 for an inactive device (s_k = 0)."""
    return _coefficients(Scheme.C, s, E, p)


def coefficients(
    scheme: Scheme | str, *, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray
) -> Coefficients:
    """Coefficients of the named scheme; see scheme_a/scheme_b/scheme_c."""
    return _coefficients(_scheme(scheme), s, E, p)


def apply_update(
    *,
    global_state: Mapping[str, torch.Tensor],
    deltas: Mapping[str, torch.Tensor],
    coefficients: Coefficients,
    rows: Sequence[int] | np.ndarray | None = None,
) -> dict[str, torch.Tensor]:
    """Return w + sum_k c_k delta_k, with `deltas[name]` stacked as [K, *shape].

    `rows` maps delta row i to device index rows[i] in `coefficients` (default: row i is
    device i), so callers may stack only the devices that trained. A discarded round
    returns the global state unchanged (copied).
    """
    if rows is None:
        rows = np.arange(len(coefficients.values))
    rows = np.asarray(rows, dtype=np.int64)
    if set(deltas) != set(global_state):
        raise AggregationError(
            f"delta tensors {sorted(deltas)} do not match model tensors {sorted(global_state)}"
        )
    weights = coefficients.values[rows]
    if not np.all(np.isfinite(weights)):
        raise AggregationError(f"non-finite aggregation coefficients: {weights.tolist()}")
    new_state: dict[str, torch.Tensor] = {}
    for name, w in global_state.items():
        d = deltas[name]
        if d.shape[1:] != w.shape or d.shape[0] != len(rows):
            raise AggregationError(
                f"delta '{name}' has shape {tuple(d.shape)}, expected ({len(rows)}, {', '.join(map(str, w.shape))})"
            )
        if coefficients.discarded or len(rows) == 0:
            new_state[name] = w.detach().clone()
            continue
        c = torch.as_tensor(weights, dtype=d.dtype, device=d.device)
        # tensordot over the device axis: sum_k c_k * delta_k, shape = w.shape
        new_state[name] = w.detach() + torch.tensordot(c, d.detach(), dims=1)
    return new_state


class RunningAggregate:
    """sum_k c_k delta_k accumulated one update at a time, finished by apply() at the round's close.

    Each update enters at its arrival weight (arrival_weights: A p_k [s_k = E], B p_k [s_k > 0],
    C (E/s_k) p_k); apply() scales the sum by round_scale (Scheme A: N / K_tau, or the round
    is discarded) and adds it to the global model. Equal to apply_update with the scheme's
    coefficients up to float32 rounding. Holds one model-sized sum, never the deltas.
    """

    def __init__(self, *, scheme: Scheme | str, E: int, like: Mapping[str, torch.Tensor]) -> None:
        self.scheme = _scheme(scheme)
        self.E = E
        self._sum = {name: torch.zeros_like(w, dtype=torch.float32) for name, w in like.items()}
        self._scratch = {name: np.empty(tuple(w.shape), dtype=np.float32) for name, w in like.items()}
        self.weights: dict[Hashable, float] = {}  # key -> arrival weight (0: not in the sum)
        self.n_complete = 0

    def add(self, key: Hashable, *, s: int, p: float, delta: Mapping[str, np.ndarray | torch.Tensor]) -> float:
        """Add `key`'s update (s updates done, base weight p); returns its arrival weight."""
        if key in self.weights:
            raise AggregationError(f"an update from {key!r} is already in the sum")
        weight = float(arrival_weights(self.scheme, s=[s], E=self.E, p=[p])[0])
        if weight > 0:
            if set(delta) != set(self._sum):
                raise AggregationError(f"update from {key!r} has tensors {sorted(delta)}, expected {sorted(self._sum)}")
            arrays = {name: d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)
                      for name, d in delta.items()}
            for name, d in arrays.items():  # all checked before any is added: a refused update changes nothing
                if d.shape != self._scratch[name].shape:
                    raise AggregationError(f"update from {key!r}: tensor '{name}' has shape {d.shape}, "
                                           f"expected {self._scratch[name].shape}")
            for name, acc in self._sum.items():
                d, scratch = arrays[name], self._scratch[name]
                np.multiply(d, np.float32(weight), out=scratch)  # float32, as apply_update casts c_k
                np.add(acc.numpy(), scratch, out=acc.numpy())
        self.weights[key] = weight
        self.n_complete += int(s == self.E)
        return weight

    def scale(self, *, n_devices: int) -> float | None:
        """round_scale for a round of `n_devices` (None: the round is discarded)."""
        return round_scale(self.scheme, n_devices=n_devices, n_complete=self.n_complete)

    def apply(self, *, global_state: Mapping[str, torch.Tensor], n_devices: int) -> dict[str, torch.Tensor]:
        """w + scale * sum over a round of `n_devices` (the objective's members); w copied when discarded or empty."""
        scale = self.scale(n_devices=n_devices)
        if scale is None or not any(v > 0 for v in self.weights.values()):
            return {name: w.detach().clone() for name, w in global_state.items()}
        return {name: w.detach() + self._sum[name].to(w.dtype) * scale for name, w in global_state.items()}


def stack_deltas(deltas: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack per-device delta dicts into {name: [K, *shape]} for apply_update."""
    if not deltas:
        raise AggregationError("no deltas to stack")
    names = list(deltas[0])
    for i, d in enumerate(deltas):
        if list(d) != names and set(d) != set(names):
            raise AggregationError(f"delta {i} has tensors {sorted(d)}, expected {sorted(names)}")
    return {name: torch.stack([d[name] for d in deltas]) for name in names}
