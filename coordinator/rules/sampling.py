"""Client sampling: which K of the available devices train in a round, and how their weights expand.

One rule for both engines: coordinator.rules.round.Federation draws with it when a round opens
(the live coordinator offers the model to the drawn devices only; the simulator trains only
them) and weighs the round's updates with it at the close. [rules] sample_k = K turns it on
(left out: every available device trains, today's round); [rules] client_sampling chooses how.

The draw. The pool is the round's available devices A (the objective's members that still train:
not departed under include), N_A = |A|, sorted by device id so that both engines, whose
objectives list devices in join order, draw alike. It is a pure function of (run seed, round):
no stream state, so a resumed run, its simulation and a rerun draw the same devices.

- uniform: K' = min(K, N_A) distinct devices, uniformly without replacement (K above N_A is
  clamped: every available device). Each is drawn with probability pi = K' / N_A.
- weighted: K draws with replacement, device k with probability P_k = p_k / P_A (p_k its base
  weight this round, fast-reboot boost included; P_A = sum of p over A). m_k, the times k was
  drawn, has mean K P_k. A device drawn twice trains once; its update counts m_k times.

The weights. Let m_k be the times device k was drawn (uniform: 0 or 1) and g_k = m_k / E[m_k] its
expansion (uniform: N_A / K'; weighted: m_k P_A / (K p_k)), so that E[g_k] = 1. The strategy
weighs the drawn devices with p'_k = g_k p_k, beside the members not in the pool (s = 0, p kept);
an available device not drawn gets coefficient 0 and s = 0 (it did not take part).

Why the aggregate stays unbiased. A round's full-participation aggregate is D = sum_k c_k delta_k.
For the strategies whose coefficient is linear in the device's own p_k with round scale 1 (Schemes
B and C, FedProx: c_k = a(s_k, E) p_k), the sampled aggregate is D' = sum_k g_k a(s_k, E) p_k
delta_k. A device's s_k and update delta_k do not depend on the draw (s is seeded per device and
round, its training per device), so E[D'] = sum_k E[g_k] a(s_k, E) p_k delta_k = D: the
Horvitz-Thompson estimator (uniform) and the Hansen-Hurwitz one (weighted) of D.
- Scheme C, uniform: c_k = (N_A / K) (E / s_k) p_k, the N/K factor; weighted: c_k = (m_k / K)
  (E / s_k) P_A, which with full participation (P_A = 1) and s_k = E is FedAvg's 1/K average
  of the drawn updates (Li et al., ICLR 2020, sampling scheme I).
- Scheme B (and FedProx): the same with E / s_k replaced by [s_k > 0].
- Scheme A normalises by the count of complete devices, which sampling already shrinks: with
  the strategy over the drawn devices, its round scale K' / K^S (K^S = complete devices drawn)
  times the expansion N_A / K' gives c_k = N_A p_k q_k / K^S. Given K^S = j >= 1, uniform
  sampling draws each of the round's K_tau complete devices with probability j / K_tau, so
  E[D'_A | K^S = j] = (N_A / j)(j / K_tau) sum_complete p_k delta_k = D_A: unbiased given that
  the round is not discarded (it is when no complete device is drawn, which full participation
  would have kept). A member departed under include counts in full participation's N but not
  in N_A: with one, Scheme A's sampled rounds weigh (K' + U) N_A / (K' (N_A + U)) times too much
  (U such members); the weighted draw keeps the form but not the exact conditional argument.
- FedNova normalises by its own sums over the devices that did work (q_k = p_k / sum p): under
  uniform sampling p' is p times one constant, so it is FedNova over the drawn devices; it is a
  ratio estimator (consistent, not unbiased), as FedNova with client sampling is in its paper.
- MIFA's round coefficients are Scheme C's (expanded, as recorded); its model is its memory
  term over every member with a memory, p unexpanded: a device not drawn enters through its
  last update, MIFA's own answer to a device that sent nothing.

With K >= N_A, uniform sampling draws every available device and g_k = N_A / N_A = 1.0 exactly:
the round is today's, bit for bit (tests/unit/coordinator/test_sampling.py checks it). Weighted
sampling draws with replacement whatever K, so it never equals full participation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from flexfl.errors import ConfigError
from flexfl.vocabulary import ClientSampling

# A stream tag that keeps the draw's random numbers apart from every other seeded stream
# (trace_recorder.sampler uses 1, 2 and 7).
_CLIENTS = 11


@dataclass(frozen=True)
class ClientDraw:
    """The devices one round drew: `counts[d]` times drawn (uniform: 1) for each drawn d, in pool order.

    `expansion[d]` is g_d = m_d / E[m_d], the factor on the drawn device's base weight (module docstring).
    """

    round_index: int
    pool: tuple[str, ...]  # the available devices, sorted by id
    counts: Mapping[str, int]
    expansion: Mapping[str, float]

    @property
    def devices(self) -> tuple[str, ...]:
        """The drawn devices, each once, in pool order: the round's participants."""
        return tuple(self.counts)

    def weighed(self, members: Sequence[str], p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of the objective's `members` (p: their base weights, in order) the strategy weighs, and
        their weights: indices into members (the drawn devices and the members outside the pool, in
        members' order) and p there, each drawn device's times its expansion."""
        pool = set(self.pool)
        index = np.array([i for i, d in enumerate(members) if d in self.counts or d not in pool], dtype=np.int64)
        factor = np.array([self.expansion.get(members[i], 1.0) for i in index], dtype=np.float64)
        return index, np.asarray(p, dtype=np.float64)[index] * factor


@dataclass(frozen=True)
class ClientSampler:
    """Draws `k` devices per round under `how` (module docstring), seeded by the run's `seed` and the round."""

    k: int
    how: ClientSampling = ClientSampling.UNIFORM
    seed: int = 0

    def __post_init__(self) -> None:
        check_sample_k(self.k)
        object.__setattr__(self, "how", ClientSampling(self.how))

    def draw(self, *, round_index: int, pool: Sequence[str], p: Sequence[float] | np.ndarray) -> ClientDraw:
        """The devices of round `round_index` drawn from `pool` (the available devices; p: their base weights)."""
        weights = dict(zip(pool, np.asarray(p, dtype=np.float64).tolist(), strict=True))
        ids = tuple(sorted(pool))
        n = len(ids)
        if n == 0:
            return ClientDraw(round_index=round_index, pool=(), counts={}, expansion={})
        rng = np.random.default_rng([self.seed, _CLIENTS, round_index])
        if self.how is ClientSampling.UNIFORM:
            k = min(self.k, n)
            chosen = range(n) if k == n else sorted(rng.choice(n, size=k, replace=False).tolist())
            counts = {ids[i]: 1 for i in chosen}
            expansion = {d: n / k for d in counts}  # 1 / pi; exactly 1.0 when every device is drawn
        else:
            p_pool = np.array([weights[d] for d in ids], dtype=np.float64)
            p_total = float(p_pool.sum())
            if not (np.all(np.isfinite(p_pool)) and np.all(p_pool >= 0) and p_total > 0):
                raise ConfigError(f"round {round_index}: weighted client sampling needs weights >= 0 with a "
                                  f"positive sum, got {p_pool.tolist()}")
            drawn = np.bincount(rng.choice(n, size=self.k, replace=True, p=p_pool / p_total), minlength=n)
            counts = {ids[i]: int(m) for i, m in enumerate(drawn) if m > 0}
            # g = m / (K P_k) with P_k = p_k / P_A
            expansion = {d: m * p_total / (self.k * weights[d]) for d, m in counts.items()}
        return ClientDraw(round_index=round_index, pool=ids, counts=counts, expansion=expansion)


def check_sample_k(k: object) -> None:
    """[rules] sample_k is an integer >= 1 (left out: no sampling); else one ConfigError saying so."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"rules.sample_k (K, devices drawn per round) must be an integer >= 1, or left out for "
                          f"every available device; got {k!r}")
