"""A round's coefficients and the update w <- w + sum_k c_k (w_k - w), stacked or summed as updates arrive.

The coefficients are a strategy's (coordinator.rules.strategies: Schemes A, B, C, FedNova, FedProx,
MIFA, or a plug-in's), pure
functions of the round's participation: s_k (local updates device k completed, 0..E), E
(updates required) and p_k (the device's base weight in the objective, after any
fast-reboot boost). Applying them to model deltas is a separate step, in two forms built
from the same two factors of each strategy: apply_update on stacked deltas (the simulator)
and RunningAggregate, one update at a time (the live coordinator).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.rules.strategies import get_strategy
from coordinator.rules.strategy import Strategy, checked_round
from flexfl.errors import AggregationError
from flexfl.vocabulary import Scheme

__all__ = ["Coefficients", "RunningAggregate", "Scheme", "Strategy", "apply_update", "coefficients", "scheme_a",
           "scheme_b", "scheme_c", "stack_deltas"]


@dataclass(frozen=True)
class Coefficients:
    """Per-device aggregation coefficients p_tau^k for one round.

    `discarded` is True when the strategy's round scale is None (Scheme A saw no complete
    device): the round must leave the global model unchanged. Under Scheme C the values may
    sum to more than 1 (intended).
    """

    values: np.ndarray  # float64 [N]
    discarded: bool = False

    @property
    def contributors(self) -> np.ndarray:
        """Indices of devices whose update enters the aggregate (coefficient > 0)."""
        return np.flatnonzero(self.values > 0)


StrategyLike = Strategy | Scheme | str  # a Strategy, or a name get_strategy knows ("fednova", "scheme-c", "C")


def coefficients(strategy: StrategyLike, *, s: Sequence[int] | np.ndarray, E: int,
                 p: Sequence[float] | np.ndarray, devices: Sequence[Hashable] | None = None) -> Coefficients:
    """c_k = arrival weight x round scale of `strategy` (coordinator.rules.strategies) for one round.

    `devices` names the round's devices in order, for errors (a plug-in's bad weight); default: their index."""
    rule = get_strategy(strategy)
    s_arr, p_arr = checked_round(s, E, p)
    scale = rule.round_scale(s=s_arr, E=E, p=p_arr)
    weights = rule.weights_for(s=s_arr, E=E, p=p_arr, devices=devices)
    if scale is None:
        return Coefficients(values=np.zeros_like(weights), discarded=True)
    return Coefficients(values=weights * scale)


def scheme_a(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = N p^k q_k / K_tau with q_k = [s_k == E]; the round is discarded when K_tau = 0."""
    return coefficients(Scheme.A, s=s, E=E, p=p)


def scheme_b(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = p^k for every device that did any work (s_k > 0); an inactive device sends nothing."""
    return coefficients(Scheme.B, s=s, E=E, p=p)


def scheme_c(*, s: Sequence[int] | np.ndarray, E: int, p: Sequence[float] | np.ndarray) -> Coefficients:
    """p_tau^k = (E / s_k) p^k, and 0 for an inactive device (s_k = 0)."""
    return coefficients(Scheme.C, s=s, E=E, p=p)


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

    `p` is the base weight of every device of the round (its keys are the round's devices).
    Each update enters at its strategy's arrival weight (Scheme C: (E/s_k) p_k; FedNova:
    p_k / s_k); apply() scales the sum by the strategy's round scale, computed from the s of
    the updates that arrived (0 for the others) and p (Scheme A: N / K_tau, or the round is
    discarded; FedNova: tau_eff / sum p over s > 0), and adds it to the global model. Equal
    to apply_update with the strategy's coefficients up to float32 rounding. Holds one
    model-sized sum, never the deltas.
    """

    def __init__(self, *, strategy: StrategyLike, E: int, p: Mapping[Hashable, float],
                 like: Mapping[str, torch.Tensor]) -> None:
        self.strategy = get_strategy(strategy)
        self.E = E
        self.p = dict(p)
        checked_round([0] * len(self.p), E, list(self.p.values()))
        self._sum = {name: torch.zeros_like(w, dtype=torch.float32) for name, w in like.items()}
        self._scratch = {name: np.empty(tuple(w.shape), dtype=np.float32) for name, w in like.items()}
        self.weights: dict[Hashable, float] = {}  # key -> arrival weight (0: not in the sum)
        self.s: dict[Hashable, int] = {}

    def add(self, key: Hashable, *, s: int, delta: Mapping[str, np.ndarray | torch.Tensor]) -> float:
        """Add `key`'s update of s local updates; returns its arrival weight (raises, changing nothing, if refused)."""
        self._check_new([key])
        s_arr, p_arr = checked_round([s], self.E, [self.p[key]])
        weight = float(self.strategy.weights_for(s=s_arr, E=self.E, p=p_arr, devices=[key])[0])
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
        self.s[key] = int(s_arr[0])
        return weight

    def add_rows(self, keys: Sequence[Hashable], *, s: Sequence[int] | np.ndarray,
                 deltas: Mapping[str, torch.Tensor]) -> np.ndarray:
        """Add the updates of `keys` at once, `deltas[name]` stacked [len(keys), *shape] (row i: keys[i]);
        returns their arrival weights. The same sum as add() per key, up to float32 rounding (one
        tensordot per tensor instead of a multiply-add per update): the simulator's chunked close.
        Raises, changing nothing, if any row is refused."""
        keys = list(keys)
        self._check_new(keys)
        s_arr, p_arr = checked_round(s, self.E, [self.p[k] for k in keys])
        weights = np.asarray(self.strategy.weights_for(s=s_arr, E=self.E, p=p_arr, devices=keys), dtype=np.float64)
        if (weights > 0).any():
            if set(deltas) != set(self._sum):
                raise AggregationError(f"updates from {keys[0]!r}..: tensors {sorted(deltas)}, expected "
                                       f"{sorted(self._sum)}")
            for name, d in deltas.items():
                if tuple(d.shape) != (len(keys), *self._scratch[name].shape):
                    raise AggregationError(f"updates from {len(keys)} devices: tensor '{name}' has shape "
                                           f"{tuple(d.shape)}, expected ({len(keys)}, "
                                           f"{', '.join(map(str, self._scratch[name].shape))})")
            c = torch.from_numpy(weights.astype(np.float32))  # float32, as apply_update casts c_k
            for name, acc in self._sum.items():
                acc.add_(torch.tensordot(c, deltas[name].detach().to(torch.float32), dims=1))
        self.weights.update(zip(keys, weights.tolist()))
        self.s.update(zip(keys, (int(v) for v in s_arr)))
        return weights

    def _check_new(self, keys: Sequence[Hashable]) -> None:
        """Each key a device of this round, not in the sum yet and not twice in `keys`."""
        seen: set[Hashable] = set()
        for key in keys:
            if key in self.weights or key in seen:
                raise AggregationError(f"an update from {key!r} is already in the sum")
            if key not in self.p:
                raise AggregationError(f"an update from {key!r}, which is not a device of this round")
            seen.add(key)

    def scale(self) -> float | None:
        """The strategy's round scale over the round's devices (None: the round is discarded)."""
        s = np.array([self.s.get(key, 0) for key in self.p], dtype=np.int64)
        return self.strategy.round_scale(s=s, E=self.E, p=np.array(list(self.p.values()), dtype=np.float64))

    def apply(self, *, global_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """w + scale * sum; w copied when the round is discarded or the sum empty."""
        scale = self.scale()
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
