"""The objective and its shifts: learning-rate schedule, fast-reboot for arrivals, departure policies.

Paper Sections 4.2-4.3. The objective is F = sum_k p^k F_k over the devices it contains,
p^k = n_k / n over those devices. An arrival always shifts the objective; a departure
shifts it only under the `exclude` policy. After a shift at round tau_0 the staircase
learning rate restarts: eta_tau = eta_0 / (tau - tau_0) (rounds counted from 1, so the
first round after a shift at tau_0 uses eta_0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.rules.gamma import GammaEstimates
from flexfl.errors import ConfigError, RoundStateError
from flexfl.vocabulary import DeparturePolicy


@dataclass(frozen=True)
class AutoDeparture:
    """Corollary 4.3: exclude a device departing at tau_0 when T - tau_0 >= c * sqrt(Gamma_l * tau_0).

    T is the run's last round; Gamma_l = F_l(w*) - F_l* measures how non-IID the departing
    device is, estimated by `Objective.gamma` (coordinator.rules.gamma). The corollary fixes the
    rule up to the constant c, chosen on the Table 5 grid (results/table5.md, `flexfl sim
    table5`); c depends on the estimate's scale, so it must be chosen again whenever the
    estimate changes. Without a Gamma estimate (fewer than two contributing rounds) it includes.
    """

    c: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.c) and self.c > 0):
            raise ConfigError(f"the auto departure constant c must be > 0, got {self.c!r}")

    def decide(self, *, tau0: int, horizon: int, gamma: float | None) -> DeparturePolicy:
        if gamma is None:
            return DeparturePolicy.INCLUDE
        return (DeparturePolicy.EXCLUDE if horizon - tau0 >= self.c * np.sqrt(max(gamma, 0.0) * tau0)
                else DeparturePolicy.INCLUDE)


@dataclass(frozen=True)
class ThresholdDeparture:
    """Exclude a device departing at tau_0 iff T - tau_0 >= k: the time left alone, no Gamma.

    The baseline the auto rule must beat: if knowing how non-IID the device is (Gamma_l) is
    worth anything, auto decides better than this rule, which ignores it. k is chosen on the
    Table 5 grid, like auto's c (simulator/paper/table5.py, results/table5.md).
    """

    k: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.k) and self.k >= 0):
            raise ConfigError(f"the threshold departure rule's k must be a number >= 0, got {self.k!r}")

    def decide(self, *, tau0: int, horizon: int) -> DeparturePolicy:
        return DeparturePolicy.EXCLUDE if horizon - tau0 >= self.k else DeparturePolicy.INCLUDE


@dataclass(frozen=True)
class LearningRate:
    """Staircase eta_0 / (tau - tau_0), where tau_0 is the round of the last objective shift (0 at start)."""

    eta0: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.eta0) and self.eta0 > 0):
            raise ConfigError(f"eta0 must be a positive number, got {self.eta0!r}")

    def at(self, *, round_index: int, shift_round: int = 0) -> float:
        if round_index <= shift_round:
            raise ConfigError(
                f"round {round_index} is not after the last objective shift at round {shift_round}"
            )
        return self.eta0 / (round_index - shift_round)


@dataclass(frozen=True)
class FastReboot:
    """Boost of an arriving device's weight: p^l * (1 + (boost - 1) / (r + 1)^decay_power).

    r = rounds since the arrival took effect (0 in the first round the newcomer trains),
    so the multiplier starts at `boost` (paper: 3) and returns to 1 as O(r^-decay_power)
    (paper: O(tau^-2)). boost = 1 turns fast-reboot off.
    """

    boost: float = 3.0
    decay_power: float = 2.0

    def __post_init__(self) -> None:
        if not (self.boost >= 1.0 and np.isfinite(self.boost)):
            raise ConfigError(f"fast-reboot boost must be >= 1, got {self.boost!r}")
        if not (self.decay_power > 0 and np.isfinite(self.decay_power)):
            raise ConfigError(f"fast-reboot decay power must be > 0, got {self.decay_power!r}")

    def multiplier(self, *, rounds_since_arrival: int) -> float:
        if rounds_since_arrival < 0:
            return 1.0
        return 1.0 + (self.boost - 1.0) / (rounds_since_arrival + 1) ** self.decay_power


@dataclass
class Objective:
    """Which devices the global objective contains, with their sample counts, and its shifts.

    Device ids are strings (the live registry's ids; the simulator uses "0", "1", ...).
    Mutable on purpose: it is the coordinator's schedule state, saved in checkpoints via
    to_dict/from_dict.
    """

    sample_counts: dict[str, int] = field(default_factory=dict)
    departed_included: set[str] = field(default_factory=set)
    arrivals: dict[str, int] = field(default_factory=dict)  # device -> round of its arrival shift
    shift_round: int = 0
    gammas: GammaEstimates = field(default_factory=GammaEstimates)

    def note_round(self, devices: Sequence[str], dissimilarity: np.ndarray) -> None:
        """Record a round's dissimilarity sketches (coordinator.rules.gamma.dissimilarities), row i devices[i]'s."""
        self.gammas.note_round(devices, dissimilarity)

    def gamma(self, device_id: str) -> float | None:
        """Estimate of Gamma_l = F_l(w*) - F_l* for a device (None before its second contributing round).

        Half the mean product of the device's gradient dissimilarity g_k - g_bar in
        consecutive contributing rounds, which has no minibatch-noise floor; see coordinator.rules.gamma.
        """
        return self.gammas.value(device_id)

    def add_initial(self, device_id: str, n_samples: int) -> None:
        """A device present from the start: no shift."""
        self._check_new(device_id, n_samples)
        self.sample_counts[device_id] = n_samples

    def arrive(self, device_id: str, n_samples: int, *, round_index: int) -> None:
        """A device joins after training started (at the end of round `round_index`): objective shift."""
        self._check_new(device_id, n_samples)
        self.sample_counts[device_id] = n_samples
        self.arrivals[device_id] = round_index
        self.shift_round = max(self.shift_round, round_index)

    def depart(self, device_id: str, *, round_index: int, policy: DeparturePolicy | str) -> None:
        """An announced departure after round `round_index`; only `exclude` shifts the objective."""
        if device_id not in self.sample_counts:
            raise RoundStateError(f"device {device_id!r} is not in the objective")
        policy = DeparturePolicy(policy)
        if policy.decided_at_departure:
            raise ConfigError(f"resolve the {policy} departure policy (Federation.departure_policy) before applying it")
        if policy is DeparturePolicy.EXCLUDE:
            del self.sample_counts[device_id]
            self.gammas.forget(device_id)
            self.departed_included.discard(device_id)
            self.arrivals.pop(device_id, None)
            self.shift_round = max(self.shift_round, round_index)
        else:
            self.departed_included.add(device_id)
            if self.arrivals.get(device_id) == round_index:
                # Arrived and departed at one close: it never trained, so fast-reboot has nothing to
                # speed up; its boost would only inflate the share of a device that sends nothing.
                del self.arrivals[device_id]

    def rejoin(self, device_id: str) -> None:
        """A departed-but-included device is back: it trains again; the objective did not change."""
        if device_id not in self.departed_included:
            raise RoundStateError(f"device {device_id!r} has not departed under include")
        self.departed_included.discard(device_id)

    def members(self) -> list[str]:
        """Devices in the objective, in insertion order (departed-but-included ones too)."""
        return list(self.sample_counts)

    def active_members(self) -> list[str]:
        """Members that still train: departed-but-included devices are in F but send nothing."""
        return [d for d in self.sample_counts if d not in self.departed_included]

    def weights(
        self, device_ids: list[str], *, round_index: int, fast_reboot: FastReboot | None = None
    ) -> np.ndarray:
        """Base weights p^k for `device_ids` in round `round_index`, boosted for recent arrivals.

        p^k = n_k / n over the whole objective (a departed-but-included device keeps its
        share of n, which is what makes `include` biased). Devices not in the objective get 0.
        """
        total = sum(self.sample_counts.values())
        if total <= 0:
            raise RoundStateError("the objective holds no samples")
        p = np.array([self.sample_counts.get(d, 0) / total for d in device_ids], dtype=np.float64)
        if fast_reboot is not None:
            for i, d in enumerate(device_ids):
                if d in self.arrivals:
                    r = round_index - self.arrivals[d] - 1
                    p[i] *= fast_reboot.multiplier(rounds_since_arrival=r)
        return p

    def to_dict(self) -> dict:
        return {
            "sample_counts": dict(self.sample_counts),
            "departed_included": sorted(self.departed_included),
            "arrivals": dict(self.arrivals),
            "shift_round": self.shift_round,
            "gammas": self.gammas.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Objective:
        try:
            return cls(
                sample_counts={str(k): int(v) for k, v in d["sample_counts"].items()},
                departed_included=set(map(str, d["departed_included"])),
                arrivals={str(k): int(v) for k, v in d["arrivals"].items()},
                shift_round=int(d["shift_round"]),
                # A checkpoint from before coordinator.rules.gamma holds "grad_sq" instead: a fresh start.
                gammas=GammaEstimates.from_dict(d.get("gammas", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"objective state is malformed: {exc!r}") from exc

    def _check_new(self, device_id: str, n_samples: int) -> None:
        if device_id in self.sample_counts:
            raise RoundStateError(f"device {device_id!r} is already in the objective")
        if not isinstance(n_samples, (int, np.integer)) or n_samples <= 0:
            raise ConfigError(f"device {device_id!r}: sample count must be a positive integer, got {n_samples!r}")
