"""Aggregation Schemes A, B and C (paper Section 4.1) and the update w <- w + sum_k p_k (w_k - w).

The schemes are pure functions of the round's participation: s_k (local updates device k
completed, 0..E), E (updates required) and p_k (the device's base weight in the objective,
after any fast-reboot boost). They return the coefficients p_tau^k; applying them to model
deltas is a separate step so that the live coordinator and the simulator share both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from flexfl.errors import AggregationError


class Scheme(StrEnum):
    """A: complete devices only. B: incomplete work at weight p_k. C: incomplete work at (E/s_k) p_k."""

    A = "A"
    B = "B"
    C = "C"


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


def scheme_a(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = N p^k q_k / K_tau with q_k = [s_k == E]; the round is discarded when K_tau = 0."""
    s_arr, p_arr = _checked(s, E, p)
    complete = s_arr == E
    n_complete = int(complete.sum())
    if n_complete == 0:
        return Coefficients(values=np.zeros_like(p_arr), discarded=True)
    return Coefficients(values=len(p_arr) * p_arr * complete / n_complete)


def scheme_b(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = p^k for every device that did any work (s_k > 0); an inactive device sends nothing."""
    s_arr, p_arr = _checked(s, E, p)
    return Coefficients(values=np.where(s_arr > 0, p_arr, 0.0))


def scheme_c(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = (E / s_k) p^k, and 0 for an inactive device (s_k = 0)."""
    s_arr, p_arr = _checked(s, E, p)
    scale = np.divide(E, s_arr, out=np.zeros(len(s_arr), dtype=np.float64), where=s_arr > 0)
    return Coefficients(values=scale * p_arr)


_SCHEMES = {Scheme.A: scheme_a, Scheme.B: scheme_b, Scheme.C: scheme_c}


def coefficients(
    scheme: Scheme | str, *, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray
) -> Coefficients:
    """Coefficients of the named scheme; see scheme_a/scheme_b/scheme_c."""
    try:
        rule = _SCHEMES[Scheme(scheme)]
    except ValueError:
        raise AggregationError(f"unknown scheme {scheme!r}; choose one of A, B, C") from None
    return rule(s=s, E=E, p=p)


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


def stack_deltas(deltas: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack per-device delta dicts into {name: [K, *shape]} for apply_update."""
    if not deltas:
        raise AggregationError("no deltas to stack")
    names = list(deltas[0])
    for i, d in enumerate(deltas):
        if list(d) != names and set(d) != set(names):
            raise AggregationError(f"delta {i} has tensors {sorted(d)}, expected {sorted(names)}")
    return {name: torch.stack([d[name] for d in deltas]) for name in names}
