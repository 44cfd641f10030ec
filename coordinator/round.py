"""The federated round, written once: the live coordinator and the simulator both run it.

Round tau under the rules (paper Sections 4.1-4.3):

    open    participants = the objective's active members
            eta_tau = eta_0 / (tau - tau_0)                       (coordinator.objective)
    ...     each participant k trains s_k local updates from w and returns delta_k
            (live: over gRPC until its deadline; simulated: s from the trace sampler)
    close   p^k   = n_k / n over the objective, boosted by fast-reboot for recent arrivals
            c_k   = strategy(s, E, p): Scheme A/B/C, FedNova, ...  (coordinator.strategies)
            w    <- w + sum_k c_k delta_k
                    (MIFA instead: each contributor's memory m_k <- (E/s_k) delta_k / eta_tau,
                     then w <- w + eta_tau sum_k p_k m_k over every member with a memory)
            the contributors' (c_k > 0) updates feed the Gamma estimate (coordinator.gamma)
            then the membership events that took effect during tau change the objective:
            arrivals join it, departures leave it under their policy (include / exclude);
            a shift sets tau_0 = tau for the next rounds' learning rate.

`Federation` holds the state a round changes (the objective and the global model) and is
the only code that performs these steps. The live coordinator adds sockets, deadlines and
persistence around it (coordinator/engine.py); the simulator adds trace draws and
batched training (simulator/engine.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import torch

from coordinator.aggregation import Coefficients, RunningAggregate, apply_update, coefficients
from coordinator.gamma import UpdateSketch, dissimilarities
from coordinator.memory import UpdateMemory
from coordinator.objective import (AutoDeparture, DeparturePolicy, FastReboot, LearningRate, Objective,
                                   ThresholdDeparture)
from coordinator.strategies import FedProx, Scheme, SchemeStrategy, Strategy, configured_strategy, get_strategy
from edge_agent.trainer import Unit
from flexfl.config import coerce_enums
from flexfl.errors import ConfigError
from trace_recorder.sampler import Sampling, SRule
from workloads.federated import DEFAULTS
from workloads.models import MODEL_NAMES, model_plugin
from workloads.partition_spec import Dataset, is_builtin_dataset

# The constant of the auto departure rule: the grid value that picked the better policy most
# often on seeds 0-2 of the Table 5 grid in the headline regime (E in epochs, the protocol's
# eta_0), with coordinator.gamma's dissimilarity estimate: results/epoch-protocol/table5.md
# (`flexfl sim table5 --unit epoch --eta0 protocol`), which scores it on seeds 3-4. The earlier
# 23.7137 was chosen with the ||g_k||^2 estimate in the step reading (results/table5.md).
AUTO_C = 4.217
# The threshold rule's k (exclude iff T - tau_0 >= k): the value every leave-one-seed-out fold
# of results/epoch-protocol/table5.md chose (seeds 0-2); it does not depend on the Gamma
# estimate. The Table 5 sweep chooses it again.
THRESHOLD_K = 80.0


@dataclass(frozen=True)
class RulesConfig:
    """The experiment's rules, the `[rules]` table of coordinator, simulator and live configs.

    eta0 and batch_size left out are the paper's values for the dataset. trace_sampling and
    s_rule say how a device that follows a trace turns it into s (trace_recorder.sampler);
    the coordinator sends them to its agents with every round.

    The aggregation rule is `strategy` (coordinator.strategies), or when it is left out
    `scheme`, its older spelling for the paper's three: scheme = "A" is strategy =
    "scheme-a". A scheme strategy is kept as its `scheme` (strategy left out), so a config
    means one thing, written one way, and runs saved before strategies existed (whose files
    say scheme = "C") are the same runs (simulator.engine.runs_alike). With another
    strategy, `scheme` must stay at its default.

    `strategy` and `model` may name plug-ins (flexfl.plugins: "mypkg.strategies:Mine", or an
    installed entry point); they are imported and checked here. `model` left out is the
    paper's model for the dataset; a plug-in dataset has no paper values, so with one
    `model`, `eta0` and `batch_size` are required (check_for).
    """

    scheme: Scheme = Scheme.C
    strategy: str | None = None
    mu: float | None = None  # strategy = "fedprox": the weight of its proximal term (required there only)
    model: str | None = None  # mlp | cnn | logreg | a plug-in; None: the paper's model for the dataset
    required_updates: int = 20  # E
    eta0: float | None = None
    batch_size: int | None = None
    unit: Unit = Unit.STEP
    fast_reboot: bool = True
    fast_reboot_boost: float = 3.0
    fast_reboot_decay_power: float = 2.0
    departure_policy: DeparturePolicy = DeparturePolicy.EXCLUDE
    auto_c: float = AUTO_C  # departure_policy = auto: exclude when T - tau_0 >= auto_c sqrt(Gamma_l tau_0)
    threshold_k: float = THRESHOLD_K  # departure_policy = threshold: exclude when T - tau_0 >= threshold_k
    trace_sampling: Sampling = Sampling.IID
    s_rule: SRule = SRule.ROUND

    def __post_init__(self) -> None:
        coerce_enums(self)
        if self.strategy is not None:
            try:
                chosen = get_strategy(self.strategy)
            except ConfigError as exc:
                raise type(exc)(f"rules.strategy: {exc}") from None
            if isinstance(chosen, SchemeStrategy):
                if self.scheme not in (Scheme.C, chosen.scheme):
                    raise ConfigError(f"rules.scheme = {self.scheme.value!r} and rules.strategy = {self.strategy!r} "
                                      "name two strategies; give one")
                object.__setattr__(self, "scheme", chosen.scheme)
                object.__setattr__(self, "strategy", None)
            elif self.scheme is not Scheme.C:
                raise ConfigError(f"rules.scheme = {self.scheme.value!r} and rules.strategy = {self.strategy!r} name "
                                  f"two strategies; give one (scheme is the older spelling of strategy = "
                                  f"'scheme-{self.scheme.value.lower()}')")
        if self.model is not None and self.model not in MODEL_NAMES:
            try:
                model_plugin(self.model)  # importable and callable: it is built and checked with the data's shape
            except ConfigError as exc:
                raise type(exc)(f"rules.model: {exc}") from None
        if self.required_updates < 1:
            raise ConfigError(f"rules.required_updates (E) must be >= 1, got {self.required_updates}")
        if self.strategy == FedProx.name and self.mu is None:
            raise ConfigError("rules.strategy = 'fedprox' needs rules.mu, the weight of its proximal term "
                              "mu/2 ||w - w_G||^2 (FedProx's grid: 0.001, 0.01, 0.1, 1)")
        if self.strategy != FedProx.name and self.mu is not None:
            raise ConfigError(f"rules.mu = {self.mu!r} is FedProx's proximal weight, but the strategy is "
                              f"{self.aggregation.name!r}; leave mu out or use strategy = 'fedprox'")
        if self.aggregation.needs_steps and self.unit is not Unit.STEP:
            raise ConfigError(f"rules.strategy = {self.aggregation.name!r} normalises by local SGD steps: it needs "
                              f"rules.unit = 'step', got {self.unit.value!r} (an epoch's steps differ per device)")
        if self.eta0 is not None and not self.eta0 > 0:
            raise ConfigError(f"rules.eta0 must be > 0 (or left out for the paper's value), got {self.eta0}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"rules.batch_size must be >= 1 (or left out for the paper's value), got {self.batch_size}")
        FastReboot(boost=self.fast_reboot_boost, decay_power=self.fast_reboot_decay_power)  # validates
        AutoDeparture(c=self.auto_c)
        if not (np.isfinite(self.threshold_k) and self.threshold_k >= 0):
            raise ConfigError(f"rules.threshold_k (rounds left) must be a number >= 0, got {self.threshold_k!r}")

    @property
    def aggregation(self) -> Strategy:
        """The strategy these rules aggregate with: `strategy`, else `scheme`'s (FedProx with `mu`)."""
        return configured_strategy(self.strategy if self.strategy is not None else self.scheme, mu=self.mu)

    def with_strategy(self, name: str | Scheme, *, mu: float | None = None) -> RulesConfig:
        """These rules under another strategy (a name of coordinator.strategies, or a scheme); `mu` for FedProx."""
        if isinstance(name, Scheme) or name in {s.value for s in Scheme}:
            return replace(self, scheme=Scheme(name), strategy=None, mu=mu)
        return replace(self, scheme=Scheme.C, strategy=name, mu=mu)

    def check_for(self, dataset: Dataset | str) -> None:
        """These rules can run `dataset`: a plug-in one has no paper values, so model, eta0 and batch_size are given."""
        if is_builtin_dataset(dataset):
            return
        missing = [f"rules.{key}" for key in ("model", "eta0", "batch_size") if getattr(self, key) is None]
        if missing:
            raise ConfigError(f"{' and '.join(missing)} must be given with a plug-in dataset ({dataset!r}): "
                              f"FlexFL knows the paper's values for {', '.join(d.value for d in Dataset)} only")

    @property
    def plugin_model(self) -> bool:
        """The model is a plug-in (not one of workloads.models' built-in ones)."""
        return self.model is not None and self.model not in MODEL_NAMES

    def eta0_for(self, dataset: Dataset | str) -> float:
        return self.eta0 if self.eta0 is not None else self._paper(dataset).eta0

    def batch_size_for(self, dataset: Dataset | str) -> int:
        return self.batch_size if self.batch_size is not None else self._paper(dataset).batch_size

    def _paper(self, dataset: Dataset | str):
        self.check_for(dataset)  # a plug-in has no paper values: raises, naming what to give
        return DEFAULTS[Dataset(dataset)]

    def fast_reboot_rule(self) -> FastReboot | None:
        return FastReboot(boost=self.fast_reboot_boost, decay_power=self.fast_reboot_decay_power) if self.fast_reboot else None

    def in_effect(self, policies: Collection[DeparturePolicy]) -> RulesConfig:
        """These rules with the constants of departure policies not in `policies` (the ones
        a run's departures use) at a fixed value: two configs that differ only there train alike,
        so changing AUTO_C or THRESHOLD_K leaves runs that never use them the same runs."""
        return replace(self, auto_c=self.auto_c if DeparturePolicy.AUTO in policies else 1.0,
                       threshold_k=self.threshold_k if DeparturePolicy.THRESHOLD in policies else 0.0)


@dataclass(frozen=True)
class Arrival:
    """Device `device` joins the objective with `n_samples` (at the close of the round it arrived in)."""

    device: str
    n_samples: int
    # A device that joined while training was just starting (the live coordinator's founding
    # window): it enters the objective as if present from round 1, with no shift and no boost.
    founding: bool = False


@dataclass(frozen=True)
class Departure:
    """Device `device` leaves; `policy` None means the rules' departure policy."""

    device: str
    policy: DeparturePolicy | None = None


@dataclass(frozen=True)
class RoundOpening:
    round_index: int
    participants: tuple[str, ...]
    lr: float


@dataclass(frozen=True)
class Weighing:
    """Base weights and coefficients of one round, over the objective's members in order."""

    round_index: int
    devices: tuple[str, ...]
    s: np.ndarray  # int64 [N]
    p: np.ndarray  # float64 [N], fast-reboot boost included
    coefficients: Coefficients

    @property
    def contributors(self) -> list[str]:
        """Devices whose update enters the aggregate (coefficient > 0); the only ones worth training."""
        return [self.devices[i] for i in self.coefficients.contributors]


@dataclass(frozen=True)
class RoundOutcome:
    """What a closed round did: its weighing, rate, new model and the membership changes applied."""

    weighing: Weighing
    lr: float
    params: dict[str, torch.Tensor]
    arrivals: tuple[str, ...] = ()
    departures: tuple[tuple[str, DeparturePolicy], ...] = ()
    shifted: bool = False  # the objective changed (arrival, or a departure under exclude)
    departure_gammas: dict[str, float | None] = field(default_factory=dict)  # Gamma estimates at departure
    founded: tuple[str, ...] = ()  # founding members that entered at this close (Arrival.founding)
    # MIFA: the devices whose memory entered w (this round's contributors and the remembered others)
    remembered: tuple[str, ...] = ()


@dataclass
class RoundSum:
    """A round's updates summed as they arrive (the live coordinator), instead of stacked at its close.

    p is fixed when the round opens (membership events wait for its close), so each update
    enters the sum at its final weight up to the strategy's round scale; see
    coordinator.aggregation.RunningAggregate. An update that enters the sum (arrival weight
    > 0: a contributor) is also sketched for the Gamma estimate (coordinator.gamma).
    """

    round_index: int
    running: RunningAggregate  # its p: the base weight of every objective member, fast-reboot boost included
    sketch: UpdateSketch
    s: dict[str, int] = field(default_factory=dict)
    sketches: dict[str, np.ndarray] = field(default_factory=dict)  # contributor -> C delta, float64 [m]
    # A strategy with a memory (MIFA): each contributor's update, copied (float32), for the close to remember
    kept: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def add(self, device: str, *, s: int, delta: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Add `device`'s update of s local updates; raises (and changes nothing) when it cannot enter."""
        if device not in self.running.p:
            raise ConfigError(f"round {self.round_index}: an update from {device!r}, which is not in the objective")
        if self.running.add(device, s=s, delta=delta) > 0:
            self.sketches[device] = self.sketch.of(delta)
            if self.running.strategy.memory:  # the caller may reuse its buffers: a copy
                self.kept[device] = {name: np.array(d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else d,
                                                    dtype=np.float32) for name, d in delta.items()}
        self.s[device] = int(s)


@dataclass
class Federation:
    """The objective and the global model, advanced one round at a time under `rules`."""

    rules: RulesConfig
    dataset: Dataset
    params: dict[str, torch.Tensor]
    objective: Objective = field(default_factory=Objective)
    completed_round: int = 0
    horizon: int | None = None  # T, the run's last round (the auto departure rule needs it)
    memory: UpdateMemory | None = field(default=None, init=False)

    @property
    def E(self) -> int:
        return self.rules.required_updates

    @cached_property
    def sketch(self) -> UpdateSketch:
        """The Gamma estimate's sketch of this model's updates (the same for every run of the model)."""
        return UpdateSketch(self.params)

    def __post_init__(self) -> None:
        # Each device's latest update, for a strategy that applies them every round (MIFA)
        self.memory = UpdateMemory(like=self.params) if self.rules.aggregation.memory else None

    def learning_rate(self, round_index: int) -> float:
        return LearningRate(self.rules.eta0_for(self.dataset)).at(round_index=round_index,
                                                                   shift_round=self.objective.shift_round)

    def open(self, round_index: int) -> RoundOpening:
        """Who trains in round `round_index` and at which rate."""
        if round_index != self.completed_round + 1:
            raise ConfigError(f"round {round_index} cannot open after round {self.completed_round}")
        return RoundOpening(round_index=round_index, participants=tuple(self.objective.active_members()),
                            lr=self.learning_rate(round_index))

    def start_sum(self, opening: RoundOpening) -> RoundSum:
        """An empty RoundSum for the round `opening` opened; pass it to close() as `summed`."""
        devices = self.objective.members()
        p = self.objective.weights(devices, round_index=opening.round_index, fast_reboot=self.rules.fast_reboot_rule())
        return RoundSum(round_index=opening.round_index,
                        running=RunningAggregate(strategy=self.rules.aggregation, E=self.E,
                                                 p=dict(zip(devices, p.tolist())), like=self.params),
                        sketch=self.sketch)

    def weigh(self, round_index: int, s: Mapping[str, int]) -> Weighing:
        """p and the strategy's coefficients for the updates counts `s` (a member not in `s`: 0)."""
        unknown = set(s) - set(self.objective.sample_counts)
        if unknown:
            raise ConfigError(f"round {round_index}: s given for devices outside the objective: {sorted(unknown)}")
        devices = tuple(self.objective.members())
        s_arr = np.array([int(s.get(d, 0)) for d in devices], dtype=np.int64)
        p = self.objective.weights(list(devices), round_index=round_index, fast_reboot=self.rules.fast_reboot_rule())
        coef = coefficients(self.rules.aggregation, s=s_arr, E=self.E, p=p)
        return Weighing(round_index=round_index, devices=devices, s=s_arr, p=p, coefficients=coef)

    def close(self, weighing: Weighing, *, deltas: Mapping[str, torch.Tensor] | None = None,
              rows: Sequence[str] = (), summed: RoundSum | None = None,
              arrivals: Sequence[Arrival] = (), departures: Sequence[Departure] = ()) -> RoundOutcome:
        """Aggregate, then apply the membership events; returns what happened.

        The updates come either stacked or summed. Stacked: `deltas[name]` is [K, *shape]
        with row i the update of device rows[i]; it must hold (at least) every contributor of
        `weighing` (with none, pass rows=() and deltas={}: the model stays). Summed: a
        RoundSum of this round, whose s `weighing` was made from. The contributors' updates
        also feed Objective.gamma (how non-IID a device is: the auto departure rule), the
        same ones either way (other rows are ignored).
        """
        tau = weighing.round_index
        lr = self.learning_rate(tau)
        contributors = weighing.contributors
        if summed is not None:
            if deltas is not None or rows:
                raise ConfigError(f"round {tau}: give the updates stacked (deltas, rows) or summed, not both")
            self._check_sum(weighing, summed)
            sketches = np.array([summed.sketches[d] for d in contributors], dtype=np.float64)
            if self.memory is not None:
                self.params = self._remember(weighing, {d: summed.kept[d] for d in contributors}, lr=lr)
            else:
                self.params = summed.running.apply(global_state=self.params)
        else:
            index = {d: i for i, d in enumerate(weighing.devices)}
            missing = set(contributors) - set(rows)
            if missing:
                raise ConfigError(f"round {tau}: no update given for contributors {sorted(missing)}")
            try:
                device_rows = [index[d] for d in rows]
            except KeyError as exc:
                raise ConfigError(f"round {tau}: an update from {exc.args[0]!r}, which is not in the objective") from None
            params = self.params
            row_of = {d: i for i, d in enumerate(rows)}
            if self.memory is not None:
                params = self._remember(weighing, {c: {name: d[row_of[c]] for name, d in (deltas or {}).items()}
                                                   for c in contributors}, lr=lr)
            elif device_rows:  # apply_update checks the deltas before they are sketched
                params = apply_update(global_state=self.params, deltas=deltas or {},
                                      coefficients=weighing.coefficients, rows=device_rows)
            sketches = np.array([self.sketch.of({name: d[row_of[c]] for name, d in deltas.items()})
                                 for c in contributors], dtype=np.float64)
            self.params = params
        self._note_gamma(weighing, contributors, sketches, lr=lr)
        self.completed_round = tau
        remembered = tuple(self.memory.memories) if self.memory is not None else ()
        return RoundOutcome(weighing=weighing, lr=lr, params=self.params, remembered=remembered,
                            **self.apply_between_rounds(arrivals=arrivals, departures=departures))

    def apply_between_rounds(self, *, arrivals: Sequence[Arrival] = (),
                             departures: Sequence[Departure] = ()) -> dict:
        """Apply membership events after round `completed_round` (close() does, at each close).

        Called on its own by a live coordinator whose objective emptied (every device left):
        no round can run, so a device that joins then takes effect without one. Returns the
        RoundOutcome fields that describe what changed.
        """
        tau = self.completed_round
        shifted_before = self.objective.shift_round
        arrived, founded = [], []
        for a in arrivals:
            if a.device in self.objective.departed_included:
                self.objective.rejoin(a.device)
                arrived.append(a.device)
            elif a.founding:
                self.objective.add_initial(a.device, a.n_samples)
                founded.append(a.device)
            else:
                self.objective.arrive(a.device, a.n_samples, round_index=tau)
                arrived.append(a.device)
        applied, gammas = [], {}
        for d in departures:
            if d.device not in self.objective.sample_counts:
                continue  # already gone (e.g. excluded earlier)
            gammas[d.device] = self.objective.gamma(d.device)
            policy = self.departure_policy(d, tau0=tau)
            self.objective.depart(d.device, round_index=tau, policy=policy)
            applied.append((d.device, policy))
        if self.memory is not None:  # an excluded device's memory leaves with it; an included one's stays
            self.memory.keep_only(set(self.objective.sample_counts))
        return {"arrivals": tuple(arrived), "founded": tuple(founded), "departures": tuple(applied),
                "shifted": self.objective.shift_round != shifted_before, "departure_gammas": gammas}

    def _remember(self, weighing: Weighing, updates: Mapping[str, Mapping[str, np.ndarray | torch.Tensor]], *,
                  lr: float) -> dict[str, torch.Tensor]:
        """MIFA's close (coordinator.strategies.MIFA): each contributor's m_k <- (E / s_k) delta_k / lr, then
        w + lr sum_k p_k m_k over every memory, from the memories' running sum."""
        memory = self.memory
        if memory is None:
            raise ConfigError(f"strategy {self.rules.aggregation.name!r} keeps no update memory")
        s = {d: int(v) for d, v in zip(weighing.devices, weighing.s)}
        for device, update in updates.items():
            memory.replace(device, n_samples=self.objective.sample_counts[device], update=update,
                                scale=self.E / (s[device] * lr))
        term = memory.term(p=dict(zip(weighing.devices, weighing.p.tolist())),
                                n_total=sum(self.objective.sample_counts.values()))
        return {name: w.detach() + (term[name] * lr).to(w.dtype) for name, w in self.params.items()}

    def _note_gamma(self, weighing: Weighing, contributors: list[str], sketches: np.ndarray, *, lr: float) -> None:
        """Feed the contributors' update sketches (row i: contributors[i]) to the Gamma estimate."""
        if len(contributors) < 2:
            return  # a lone contributor is its own aggregate direction (coordinator.gamma)
        s = {d: int(v) for d, v in zip(weighing.devices, weighing.s)}
        x = dissimilarities(sketches=sketches, s=[s[d] for d in contributors], lr=lr,
                            p=[self.objective.sample_counts[d] for d in contributors])  # n_k: p^k unboosted
        self.objective.note_round(contributors, x)

    def departure_policy(self, departure: Departure, *, tau0: int) -> DeparturePolicy:
        """The policy a departure at the close of round tau0 gets: its own, else the rules'; rules resolved."""
        policy = DeparturePolicy(departure.policy or self.rules.departure_policy)
        if not policy.decided_at_departure:
            return policy
        if self.horizon is None:
            raise ConfigError(f"the {policy} departure policy needs the run's last round (Federation.horizon)")
        if policy is DeparturePolicy.THRESHOLD:
            return ThresholdDeparture(k=self.rules.threshold_k).decide(tau0=tau0, horizon=self.horizon)
        return AutoDeparture(c=self.rules.auto_c).decide(tau0=tau0, horizon=self.horizon,
                                                         gamma=self.objective.gamma(departure.device))

    def _check_sum(self, weighing: Weighing, summed: RoundSum) -> None:
        """The sum was built with this round's p and s: its weights times the round's scale are the coefficients."""
        tau = weighing.round_index
        if summed.round_index != tau:
            raise ConfigError(f"round {tau}: the updates were summed for round {summed.round_index}")
        s = {d: int(v) for d, v in zip(weighing.devices, weighing.s) if v or d in summed.s}
        if s != summed.s or list(summed.running.p) != list(weighing.devices):
            raise ConfigError(f"round {tau}: the summed updates (devices {sorted(summed.s)}) are not the ones weighed")
        scale = summed.running.scale() or 0.0
        weights = summed.running.weights
        expected = np.array([weights.get(d, 0.0) * scale for d in weighing.devices])
        if not np.allclose(expected, weighing.coefficients.values, rtol=1e-9, atol=0.0):
            raise ConfigError(f"round {tau}: the running sum's weights disagree with the strategy's coefficients")

    def apply_events(self, *, arrivals: Sequence[Arrival] = (), departures: Sequence[Departure] = ()) -> None:
        """Membership changes before training starts (round 0): initial members, early departures."""
        if self.completed_round:
            raise ConfigError("apply_events is for changes before the first round; rounds apply theirs at close")
        for a in arrivals:
            self.objective.add_initial(a.device, a.n_samples)
        for d in departures:
            if d.device in self.objective.sample_counts:
                self.objective.depart(d.device, round_index=0, policy=self.departure_policy(d, tau0=0))
