"""Aggregation strategies: the factors each rule gives the round's sum, and the registry `[rules]` picks from.

A round under any strategy updates w <- w + sum_k c_k delta_k, and every strategy here
factors its coefficients as

    c_k = arrival_weight(s_k, E, p_k) * round_scale(s, E, p)

The first factor is known the moment device k's update arrives, the second only when the
round closes (it may depend on every device's s and p; s_k = 0 for a device that sent
nothing). coordinator.aggregation builds both forms of the round from these two factors:
the coefficients the simulator applies to its stacked updates, and the running sum the
live coordinator adds each update into; so the two cannot disagree, for any strategy.

Schemes A, B and C (paper Section 4.1) are strategies "scheme-a", "scheme-b", "scheme-c";
FedNova (Wang et al., NeurIPS 2020) is "fednova"; FedProx (Li et al., MLSys 2020) is
"fedprox"; MIFA (Gu et al., NeurIPS 2021) is "mifa". A strategy may also add a term to each
device's local objective (FedProx's mu/2 ||w - w_G||^2, Strategy.proximal_mu: the trainers
run it, edge_agent.trainer and the simulator's row trainers alike), keep a memory between
rounds that makes the round's model (Strategy.new_memory: MIFA's latest update of each
device, coordinator.memory), or count a device's work in its own unit (Strategy.counts_per_update:
FedNova's SGD steps). coordinator.round.Federation calls these hooks for both engines; a
plug-in has the same ones.

A strategy's parameters are the fields of its frozen dataclass (FedProx's mu), given beside its
name in [rules.strategy] (coordinator.rules.StrategyTable; Strategy.configure checks them).

A user's strategy is a plug-in ([rules.strategy] name = "mypkg.strategies:Mine", or an entry
point of `flexfl.strategies`, flexfl.plugins): a class (or an instance of one) with the two
factors' methods, ideally a Strategy subclass, with the same hooks and parameters.
get_strategy resolves it and wraps it in PluginStrategy (coordinator.plugin_strategy), which
checks what each call returns and turns an exception in it into one PluginError line.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from coordinator.choices import Scheme  # its owner: light, for parsers
from flexfl.config import replace_from_table
from flexfl.errors import AggregationError, ConfigError
from flexfl.plugins import STRATEGY, plugin_forms, resolve

if TYPE_CHECKING:  # torch is imported where a round runs, not where a config names a strategy
    import torch

    from coordinator.memory import StrategyMemory


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
        updates: coordinator.memory); None (the default): the round's model is its plain aggregate."""
        return None

    def counts_per_update(self, *, steps_per_update: np.ndarray, n_samples: np.ndarray) -> np.ndarray | None:
        """What one local update of each device counts as in this strategy's s and E, int64 [N]; None (the
        default): one, as the rules count it.

        steps_per_update[k] is device k's SGD steps in one of its updates (1 under unit = "step",
        ceil(n_k / B) under "epoch"), n_samples[k] its n_k. With counts m the strategy's two
        factors get s_k m_k for s_k and E max_k m_k for E (the bound every s_k m_k stays within),
        in both forms of the round (coordinator.round.Federation): FedNova counts SGD steps."""
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
_SCHEME_WEIGHT = {
    Scheme.A: lambda s, E, p: p * (s == E),
    Scheme.B: lambda s, E, p: np.where(s > 0, p, 0.0),
    Scheme.C: lambda s, E, p: p * np.divide(E, s, out=np.zeros(len(s), dtype=np.float64), where=s > 0),
}


@dataclass(frozen=True)
class SchemeStrategy(Strategy):
    """Scheme A, B or C (paper Section 4.1): p_tau^k = N p^k q_k / K_tau (A), p^k (B), (E/s_k) p^k (C).

    A keeps complete devices only (q_k = [s_k = E]) and discards a round with none (K_tau = 0);
    B and C accept incomplete work, C rescaling it by E/s_k; an inactive device gets 0 in each.
    """

    scheme: Scheme = field(metadata={"in_file": False})  # its name says it: not a parameter

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"scheme-{self.scheme.value.lower()}"

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.scheme.value

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"Scheme {self.scheme.value}"

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return _SCHEME_WEIGHT[self.scheme](s, E, p)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        if self.scheme is not Scheme.A:
            return 1.0
        n_complete = int((s == E).sum())
        return None if n_complete == 0 else len(s) / n_complete


@dataclass(frozen=True)
class FedNova(Strategy):
    """FedNova with plain local SGD: w <- w + tau_eff sum_k q_k delta_k / s_k, tau_eff = sum_k q_k s_k.

    Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
    Optimization", NeurIPS 2020. Their general update is w <- w - tau_eff sum_i w_i eta d_i
    with weights w_i summing to 1; FedNova takes w_i = p_i and tau_eff = sum_i p_i tau_i. With
    plain SGD (no momentum, no proximal term) the normalising vector a_i is all ones, so
    -eta d_i = delta_i / tau_i: device k's update averaged over its s_k local steps.

    Which devices, and how p is normalised: the sums run over the round's devices that did
    work (s_k > 0), with q_k = p_k / sum_{j: s_j > 0} p_j, p the objective's weights (n_k / n,
    fast-reboot boost included) renormalised to sum to 1 over them, as the paper's w_i must.
    A device with s_k = 0 sent no update: it has no d_k (delta_k / s_k is 0/0) and counts in
    neither sum, like a client the round did not select; keeping its p would shrink tau_eff
    and the direction twice over. So a departed device kept under `include` (p_k > 0, s_k = 0
    from then on) changes nothing here; include and exclude differ only in the rate restart.
    A round where nobody did work leaves the model as it is (not discarded: nothing arrived).

    tau_i counts local SGD steps, so s does too: under [rules].unit = "epoch" the round gives
    FedNova s_k ceil(n_k / B), device k's steps (its s_k epochs of ceil(n_k / B) batches), which
    is the heterogeneity FedNova was made for: devices of different sizes take different numbers
    of steps in E epochs (counts_per_update).

    When every device completes E steps, tau_eff = E and c_k = q_k: FedAvg, as Schemes A, B
    and C give when p sums to 1. It factors as arrival weight p_k / s_k and round scale
    (sum_{s_j>0} p_j s_j) / (sum_{s_j>0} p_j)^2 = tau_eff / sum_{s_j>0} p_j, both sums
    accumulated as updates arrive.
    """

    name: ClassVar[str] = "fednova"
    label: ClassVar[str] = "fednova"
    title: ClassVar[str] = "FedNova"

    def counts_per_update(self, *, steps_per_update: np.ndarray, n_samples: np.ndarray) -> np.ndarray | None:
        return steps_per_update  # tau_k counts SGD steps (class docstring)

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return p * np.divide(1.0, s, out=np.zeros(len(s), dtype=np.float64), where=s > 0)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        active = s > 0
        p_active = float(p[active].sum())
        if p_active == 0.0:
            return 1.0  # nobody did work (or all weights are 0): the sum is empty, any scale leaves w
        tau_eff = float(p[active] @ s[active]) / p_active
        return tau_eff / p_active


@dataclass(frozen=True)
class FedProx(Strategy):
    """FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

    Each device minimises F_k(w) + mu/2 ||w - w_G||^2 from the global model w_G: every
    local SGD step's gradient gains mu (w - w_G) (edge_agent.trainer.train_local, and the
    simulator's row trainers). The server accepts partial work as Scheme B does: c_k = p_k
    for every device with s_k > 0 (FedProx's "variable amounts of work" from stragglers,
    averaged at their base weights), 0 for an inactive one. mu = 0 is Scheme B. `mu` is
    [rules.strategy] mu, required there; the registry's instance has mu = 0.
    """

    name: ClassVar[str] = "fedprox"
    label: ClassVar[str] = "fedprox"
    title: ClassVar[str] = "FedProx"
    mu: float = field(default=0.0, metadata={"required": "the weight of its proximal term mu/2 ||w - w_G||^2 "
                                                          "(FedProx's grid: 0.001, 0.01, 0.1, 1)"})

    def __post_init__(self) -> None:
        if not (np.isfinite(self.mu) and self.mu >= 0):
            raise ConfigError(f"FedProx's mu must be a number >= 0, got {self.mu!r}")

    @property
    def proximal_mu(self) -> float:
        return float(self.mu)

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return _SCHEME_WEIGHT[Scheme.B](s, E, p)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        return 1.0


@dataclass(frozen=True)
class MIFA(Strategy):
    """MIFA (Gu et al., "Fast Federated Learning in the Presence of Arbitrary Device Unavailability", NeurIPS 2021).

    The server keeps each device's latest update and applies the weighted average of all of
    them every round, so a device that sent nothing this round contributes its last update
    instead of nothing. With plain local SGD, MIFA's memory G^k = (w - w_k) / eta_t is the sum
    of the K gradients device k took from w in the round t it last trained, and the server
    steps w <- w - eta_tau (1/N) sum_k G^k with the *current* rate eta_tau.

    What FlexFL keeps (coordinator.memory.MIFAMemory, its new_memory, run by coordinator.round.Federation):
    m_k = (E / s_k) delta_k / eta_t, delta_k = w_k - w the update of s_k steps made at rate
    eta_t, i.e. -G^k scaled to E steps: MIFA assumes every active device completes its K = E
    steps; an incomplete update (0 < s_k < E) is scaled up by E / s_k as Scheme C scales it, so
    every memory estimates a full round's work. The round is then

        w <- w + eta_tau sum_k p_k m_k     over every objective member k with a memory,

    p_k the objective's weight (n_k / n, fast-reboot boost included): MIFA's 1/N is its
    uniform objective; FlexFL's objective weighs devices by their samples. A device that
    updated this round thus enters at (E / s_k) p_k delta_k, Scheme C's coefficient (these
    are the arrival weights and Weighing's coefficients; the memory term of the others is
    beside them). A device before its first update (a founding member that has not yet
    sent one, an arrival) has no memory and contributes nothing: its G^k starts at 0, as
    MIFA's Algorithm 1 starts it (as recalled: check against the paper before relying on it).
    A departed device under `include` stays in the objective and keeps contributing its last
    update every round (MIFA's answer to a device that went silent); under `exclude` it
    leaves the objective and its memory is dropped. A device that rejoins keeps its memory
    until its next update replaces it. Checkpoints of the live coordinator hold the memories
    (coordinator.checkpoint), so a restarted coordinator resumes with them (the simulator's
    checkpoints pickle the whole Federation, memory included). Memory costs one float32 model
    per device with a memory, plus, live, a copy of each update received in the open round;
    there is no budget check. A round's recorded coefficients (metrics rows, the report's
    heatmap) are those of its own updates; rows list the devices whose memory entered w as "remembered".
    """

    name: ClassVar[str] = "mifa"
    label: ClassVar[str] = "mifa"
    title: ClassVar[str] = "MIFA"

    def new_memory(self, *, like: Mapping[str, torch.Tensor]) -> StrategyMemory | None:
        from coordinator.memory import MIFAMemory

        return MIFAMemory(like=like)

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return _SCHEME_WEIGHT[Scheme.C](s, E, p)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        return 1.0  # never discarded: with no update at all the memories still move w


STRATEGIES: dict[str, Strategy] = {
    **{SchemeStrategy(scheme).name: SchemeStrategy(scheme) for scheme in Scheme},
    FedNova.name: FedNova(),
    FedProx.name: FedProx(),
    MIFA.name: MIFA(),
}


def strategy_names() -> list[str]:
    """The registered strategies' names ([rules.strategy] names, CLI choices; plug-ins aside)."""
    return list(STRATEGIES)


# Strategies with parameters made so far, by name and parameters: RulesConfig.aggregation is read every round.
_CONFIGURED: dict[tuple[str, str], Strategy] = {}


def configured(name: str | Scheme | Strategy, params: Mapping[str, Any] | None = None, *, where: str = "config",
               table: str = "rules.strategy", check_required: bool = True) -> Strategy:
    """The strategy `name` (get_strategy) with its parameters `params` (Strategy.configure), as a run uses it."""
    rule = get_strategy(name)
    key = (rule.name, repr(sorted((params or {}).items())))
    if key not in _CONFIGURED or not check_required:
        made = rule.configure(dict(params or {}), where=where, table=table, check_required=check_required)
        if not check_required:
            return made
        _CONFIGURED[key] = made
    return _CONFIGURED[key]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


# Plug-in strategies resolved so far, by name: a plug-in is imported, instantiated and probed once per process.
_PLUGINS: dict[str, Strategy] = {}


def get_strategy(name: str | Scheme | Strategy) -> Strategy:
    """The strategy registered as `name`, or the plug-in it names; a Scheme or its letter names its scheme's one."""
    if isinstance(name, Strategy):
        return name
    if isinstance(name, Scheme) or name in {s.value for s in Scheme}:
        return STRATEGIES[f"scheme-{Scheme(name).value.lower()}"]
    if isinstance(name, str) and name in STRATEGIES:
        return STRATEGIES[name]
    if isinstance(name, str) and name in _PLUGINS:
        return _PLUGINS[name]
    plugin = resolve(STRATEGY, name) if isinstance(name, str) else None
    if plugin is None:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)} "
                          f"(or a scheme: {', '.join(s.value for s in Scheme)}), {plugin_forms(STRATEGY)}")
    from coordinator.plugin_strategy import PluginStrategy  # it subclasses Strategy: imported once that exists

    _PLUGINS[name] = PluginStrategy(plugin)
    return _PLUGINS[name]


def title_of(label: str) -> str:
    """The title of the strategy whose run-table label is `label` ("C" -> "Scheme C"); an unknown label as it is.

    Run tables and folders name a strategy by its label, which carries no parameters (FedProx's
    mu): use Strategy.description where the run's config is at hand."""
    try:
        return get_strategy(label).title
    except ConfigError:
        return label
