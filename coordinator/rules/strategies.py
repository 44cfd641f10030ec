"""Aggregation strategies: the factors each rule gives the round's sum, and the registry `[rules]` picks from.

A round under any strategy updates w <- w + sum_k c_k delta_k, and every strategy here
factors its coefficients as

    c_k = arrival_weight(s_k, E, p_k) * round_scale(s, E, p)

The first factor is known the moment device k's update arrives, the second only when the
round closes (it may depend on every device's s and p; s_k = 0 for a device that sent
nothing). coordinator.rules.aggregation builds both forms of the round from these two factors:
the coefficients the simulator applies to its stacked updates, and the running sum the
live coordinator adds each update into; so the two cannot disagree, for any strategy.

Schemes A, B and C (paper Section 4.1) are strategies "scheme-a", "scheme-b", "scheme-c";
FedNova (Wang et al., NeurIPS 2020) is "fednova"; FedProx (Li et al., MLSys 2020) is
"fedprox"; MIFA (Gu et al., NeurIPS 2021) is "mifa". A strategy may also add a term to each
device's local objective (FedProx's mu/2 ||w - w_G||^2, Strategy.proximal_mu: the trainers
run it, edge_agent.trainer and the simulator's row trainers alike), keep a memory between
rounds that makes the round's model (Strategy.new_memory: MIFA's latest update of each
device, coordinator.rules.memory), or count a device's work in its own unit (Strategy.counts_per_update:
FedNova's SGD steps). coordinator.rules.round.Federation calls these hooks for both engines; a
plug-in has the same ones.

A strategy's parameters are the fields of its frozen dataclass (FedProx's mu), given beside its
name in [rules.strategy] (coordinator.rules.config.StrategyTable; Strategy.configure checks them).

A user's strategy is a plug-in ([rules.strategy] name = "mypkg.strategies:Mine", or an entry
point of `flexfl.strategies`, flexfl.plugins): a class (or an instance of one) with the two
factors' methods, ideally a Strategy subclass, with the same hooks and parameters.
get_strategy resolves it and wraps it in PluginStrategy (coordinator.rules.plugin_strategy), which
checks what each call returns and turns an exception in it into one PluginError line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from coordinator.rules.plugin_strategy import PluginStrategy
from coordinator.rules.strategy import Strategy
from flexfl.errors import AggregationError, ConfigError
from flexfl.plugins import STRATEGY, plugin_forms, resolve
from flexfl.vocabulary import Scheme

if TYPE_CHECKING:  # torch is imported where a round runs, not where a config names a strategy
    import torch

    from coordinator.rules.memory import StrategyMemory


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

    What FlexFL keeps (coordinator.rules.memory.MIFAMemory, its new_memory, run by coordinator.rules.round.Federation):
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
        from coordinator.rules.memory import MIFAMemory

        return MIFAMemory(like=like)

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return _SCHEME_WEIGHT[Scheme.C](s, E, p)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        return 1.0  # never discarded: with no update at all the memories still move w


class Staleness(StrEnum):
    """FedBuff's staleness weight of an update that is `t` server steps old: 1 / sqrt(1 + t), or 1."""

    SQRT = "sqrt"
    CONSTANT = "constant"


@dataclass(frozen=True)
class FedBuff(Strategy):
    """Buffered asynchronous aggregation, FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous
    Aggregation", AISTATS 2022): no rounds. A device pulls the latest model when it is free, trains, and pushes its
    update delta_i; the server keeps a buffer and, every `buffer` (K) updates, steps

        w <- w + server_lr (1 / K) sum_i g(t_i) delta_i,     t_i = steps the server took since i pulled,

    with g(t) = 1 / sqrt(1 + t) (staleness = "sqrt", the paper's) or 1 ("constant"). At most `concurrency` devices
    train at once (0: every device present); a freed slot goes to a device drawn uniformly from those idle.

    Partial work inside asynchrony (issue 36): with `budget`, a device's task ends at the round deadline of the run's
    clock, with the s the deadline rule gives (the sync runs' s); without it a device always does its E updates and
    takes as long as they take. With `es_factor`, an update of s < E local updates enters at E / s times its weight:
    Scheme C's unbiasing of incomplete work, which there makes each device's expected contribution that of a full
    E-update delta at its sample weight; here it makes a cut-short update count as a full one in the buffer's
    average. Without a budget every s is E and the factor is 1.

    As factors of the interface (Strategy): the buffer step is a "round" over the K buffered updates whose p_i is
    g(t_i) (staleness_weights); arrival weight p_i (E / s_i with es_factor; 0 at s_i = 0), round scale
    server_lr / K. FedBuff weighs updates uniformly, not by the device's samples: that is the paper's rule.
    It runs on the simulated clock (simulator.async_run); a round engine refuses it (asynchronous).
    """

    name: ClassVar[str] = "fedbuff"
    label: ClassVar[str] = "fedbuff"
    title: ClassVar[str] = "FedBuff"
    buffer: int = 10
    staleness: Staleness = Staleness.SQRT
    server_lr: float = 1.0
    concurrency: int = 0
    budget: bool = False
    es_factor: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "staleness", Staleness(self.staleness))
        if isinstance(self.buffer, bool) or not isinstance(self.buffer, int) or self.buffer < 1:
            raise ConfigError(f"FedBuff's buffer (K, updates per server step) must be an integer >= 1, got "
                              f"{self.buffer!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 0:
            raise ConfigError(f"FedBuff's concurrency (devices training at once, 0: all) must be an integer >= 0, got "
                              f"{self.concurrency!r}")
        if not (np.isfinite(self.server_lr) and self.server_lr > 0):
            raise ConfigError(f"FedBuff's server_lr must be a number > 0, got {self.server_lr!r}")

    @property
    def asynchronous(self) -> bool:
        return True

    def staleness_weights(self, staleness: np.ndarray) -> np.ndarray:
        """g(t) per update, float64 [K], for staleness t (server steps since the pull, int >= 0)."""
        t = np.asarray(staleness)
        if t.size and (not np.issubdtype(t.dtype, np.integer) or t.min() < 0):
            raise AggregationError(f"staleness must be integers >= 0 (server steps since the pull), got {t.tolist()}")
        if self.staleness is Staleness.CONSTANT:
            return np.ones(t.shape, dtype=np.float64)
        return 1.0 / np.sqrt(1.0 + t.astype(np.float64))

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        if self.es_factor:
            return _SCHEME_WEIGHT[Scheme.C](s, E, p)
        return _SCHEME_WEIGHT[Scheme.B](s, E, p)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        return self.server_lr / len(s) if len(s) else 1.0


STRATEGIES: dict[str, Strategy] = {
    **{SchemeStrategy(scheme).name: SchemeStrategy(scheme) for scheme in Scheme},
    FedNova.name: FedNova(),
    FedProx.name: FedProx(),
    MIFA.name: MIFA(),
}
# Strategies without rounds (Strategy.asynchronous): their server steps every K updates (simulator.async_run).
ASYNC_STRATEGIES: dict[str, Strategy] = {FedBuff.name: FedBuff()}


def strategy_names(*, asynchronous: bool = False) -> list[str]:
    """The registered strategies' names ([rules.strategy] names, CLI choices; plug-ins aside): those of rounds, and
    with `asynchronous` those without rounds too."""
    return [*STRATEGIES, *(ASYNC_STRATEGIES if asynchronous else {})]


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
    if isinstance(name, str) and name in ASYNC_STRATEGIES:
        return ASYNC_STRATEGIES[name]
    if isinstance(name, str) and name in _PLUGINS:
        return _PLUGINS[name]
    plugin = resolve(STRATEGY, name) if isinstance(name, str) else None
    if plugin is None:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(strategy_names(asynchronous=True))} "
                          f"(or a scheme: {', '.join(s.value for s in Scheme)}), {plugin_forms(STRATEGY)}")
    wrapped = PluginStrategy(plugin)
    if wrapped.label in {s.label for s in STRATEGIES.values()}:
        raise plugin.error(f"has label {wrapped.label!r}, a built-in strategy's; give it a label of its own")
    _PLUGINS[name] = wrapped
    return wrapped


def title_of(label: str) -> str:
    """The title of the strategy whose run-table label is `label` ("C" -> "Scheme C"); an unknown label as it is.

    Run tables and folders name a strategy by its label, which carries no parameters (FedProx's
    mu): use Strategy.description where the run's config is at hand."""
    try:
        return get_strategy(label).title
    except ConfigError:
        return label
