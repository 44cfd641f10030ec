"""The strategy interface: what a rule gives the round (two factors of its coefficients) and its hooks.

coordinator.rules.strategies holds the built-in strategies and the registry, and explains the
factoring; coordinator.rules.plugin_strategy wraps a user's class in this interface. Both import
it from here, so that neither imports the other's module to name the base class.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from flexfl.config import replace_from_table
from flexfl.errors import AggregationError, ConfigError

if TYPE_CHECKING:  # torch is imported where a round runs, not where a config names a strategy
    import torch

    from coordinator.rules.memory import StrategyMemory


def checked_round(s: Sequence[int] | np.ndarray, E: int,
                  p: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s as int64 and p as float64 arrays of one round, or an AggregationError naming the bad index and value."""
    if not isinstance(E, (int, np.integer)) or E < 1:
        raise AggregationError(f"E (required local updates) must be an integer >= 1, got {E!r}")
    s_arr = np.asarray(s)
    p_arr = np.asarray(p, dtype=np.float64)
    if s_arr.ndim != 1 or p_arr.ndim != 1 or len(s_arr) != len(p_arr):
        raise AggregationError(
            f"s and p must be 1-D and of equal length, got shapes {s_arr.shape} and {p_arr.shape}"
        )
    if s_arr.size and not np.issubdtype(s_arr.dtype, np.integer) and (
            not np.all(np.isfinite(s_arr)) or not np.all(s_arr == np.round(s_arr))):
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


class Strategy(ABC):
    """One aggregation rule as the two factors of its coefficients (module docstring).

    Both methods take one round's checked arrays (checked_round): s (int64 [N], 0 for a
    device that sent nothing) and p (float64 [N], the objective's weights with the
    fast-reboot boost). A weight of 0 keeps a device's update out of the round.
    """

    name: ClassVar[str]  # its value of [rules.strategy] name
    label: ClassVar[str]  # its value in run tables' "scheme" column (the schemes' letters, as before)
    title: ClassVar[str]  # how printed lines and plots name it

    @property
    def asynchronous(self) -> bool:
        """A strategy without rounds (FedBuff): its server steps every K updates on a clock (simulator.async_run),
        and a round engine (coordinator.rules.round.Federation) refuses it. False (the default): rounds."""
        return False

    @property
    def proximal_mu(self) -> float:
        """mu of the term mu/2 ||w - w_G||^2 in every device's local objective (0: none)."""
        return 0.0

    @property
    def parameters(self) -> dict[str, Any]:
        """The strategy's own settings by their [rules.strategy] key (FedProx: mu): its dataclass fields; empty when
        it has none."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("in_file", True)}

    @property
    def description(self) -> str:
        """Its title with its parameters, as reports and printed lines name a run's strategy: "FedProx (mu = 0.01)"."""
        params = ", ".join(f"{key} = {_shown(value)}" for key, value in self.parameters.items())
        return f"{self.title} ({params})" if params else self.title

    def configure(self, params: Mapping[str, Any], *, where: str = "config", table: str = "rules.strategy",
                  check_required: bool = True) -> Strategy:
        """This strategy with the parameters `params` ([rules.strategy]'s keys beside name), checked as config keys
        are: a strategy's parameters are the fields of its frozen dataclass (FedProx: mu)."""
        if dataclasses.is_dataclass(self):
            return replace_from_table(self, params, where=where, table=table, check_required=check_required)
        if params:
            raise ConfigError(f"{where}: [{table}].{next(iter(params))}: unknown key; {self.title} has no parameters")
        return self

    def new_memory(self, *, like: Mapping[str, torch.Tensor]) -> StrategyMemory | None:
        """This strategy's state between rounds for a new run of a model shaped like `like` (MIFA's
        updates: coordinator.rules.memory); None (the default): the round's model is its plain aggregate."""
        return None

    def counts_per_update(self, *, steps_per_update: np.ndarray, n_samples: np.ndarray) -> np.ndarray | None:
        """What one local update of each device counts as in this strategy's s and E, int64 [N]; None (the
        default): one, as the rules count it.

        steps_per_update[k] is device k's SGD steps in one of its updates (1 under unit = "step",
        ceil(n_k / B) under "epoch"), n_samples[k] its n_k. With counts m the strategy's two
        factors get s_k m_k for s_k and E max_k m_k for E (the bound every s_k m_k stays within),
        in both forms of the round (coordinator.rules.round.Federation): FedNova counts SGD steps."""
        return None

    @abstractmethod
    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        """Each device's factor known at its update's arrival, float64 [N]."""

    def weights_for(self, *, s: np.ndarray, E: int, p: np.ndarray,
                    devices: Sequence[Hashable] | None = None) -> np.ndarray:
        """arrival_weights, for callers that know the devices: an error names devices[k], not index k
        (PluginStrategy's checks; the live coordinator calls it for one device at a time)."""
        return self.arrival_weights(s=s, E=E, p=p)

    @abstractmethod
    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        """The factor known at the round's close; None: the round is discarded (the model stays)."""


# The paper's schemes' arrival weights, p_k times: A [s_k = E], B [s_k > 0], C E/s_k (0 at s_k = 0).


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
