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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from coordinator.aggregation import Coefficients, RunningAggregate, apply_update, coefficients
from coordinator.gamma import UpdateSketch, dissimilarities
from coordinator.memory import UpdateMemory
from coordinator.objective import AutoDeparture, DeparturePolicy, LearningRate, Objective, ThresholdDeparture

# The rules a Federation runs under; importers of RulesConfig and AUTO_C from here predate coordinator/rules.py.
from coordinator.rules import AUTO_C, THRESHOLD_K, RulesConfig  # noqa: F401
from edge_agent.trainer import steps_per_update
from edge_agent.units import Unit
from flexfl.errors import AggregationError, ConfigError, RoundStateError
from workloads.partition_spec import Dataset


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
    # SGD steps per local update of each device, for a strategy that counts steps (Federation.counted)
    steps_per_update: Mapping[str, int] | None = None

    def add(self, device: str, *, s: int, delta: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Add `device`'s update of s local updates; raises (and changes nothing) when it cannot enter."""
        if device not in self.running.p:
            raise RoundStateError(f"round {self.round_index}: an update from {device!r}, which is not in the objective")
        counted = s if self.steps_per_update is None else s * self.steps_per_update[device]
        if self.running.add(device, s=counted, delta=delta) > 0:
            self.sketches[device] = self.sketch.of(delta)
            if self.running.strategy.memory:  # the caller may reuse its buffers: a copy
                self.kept[device] = {name: np.array(d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else d,
                                                    dtype=np.float32) for name, d in delta.items()}
        self.s[device] = int(s)


@dataclass
class Federation:
    """The objective and the global model, advanced one round at a time under `rules`."""

    rules: RulesConfig
    dataset: Dataset | str  # or a plug-in dataset's name
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
        shift = self.objective.shift_round if self.rules.lr_restart else 0  # lr_restart=False: a diagnostic only
        return LearningRate(self.rules.eta0_for(self.dataset)).at(round_index=round_index, shift_round=shift)

    def open(self, round_index: int) -> RoundOpening:
        """Who trains in round `round_index` and at which rate."""
        if round_index != self.completed_round + 1:
            raise RoundStateError(f"round {round_index} cannot open after round {self.completed_round}")
        return RoundOpening(round_index=round_index, participants=tuple(self.objective.active_members()),
                            lr=self.learning_rate(round_index))

    def steps_per_update(self, devices: Sequence[str]) -> dict[str, int] | None:
        """SGD steps in one local update of each device, when the strategy counts steps (FedNova) and an
        update is an epoch (ceil(n_k / B) steps); None when the strategy reads s as the rules count it.

        Such a strategy gets s_k x ceil(n_k / B) for s_k and E x the largest ceil(n_k / B) for E
        (the bound every s_k stays within: FedNova's formula does not read E)."""
        if not self.rules.aggregation.needs_steps or self.rules.unit is Unit.STEP:
            return None
        batch = self.rules.batch_size_for(self.dataset)
        return {d: steps_per_update(self.objective.sample_counts[d], batch_size=batch, unit=self.rules.unit)
                for d in devices}

    def _counted_E(self, steps: Mapping[str, int] | None) -> int:
        return self.E if steps is None else self.E * max(steps.values(), default=1)

    def start_sum(self, opening: RoundOpening) -> RoundSum:
        """An empty RoundSum for the round `opening` opened; pass it to close() as `summed`."""
        devices = self.objective.members()
        p = self.objective.weights(devices, round_index=opening.round_index, fast_reboot=self.rules.fast_reboot_rule())
        steps = self.steps_per_update(devices)
        return RoundSum(round_index=opening.round_index,
                        running=RunningAggregate(strategy=self.rules.aggregation, E=self._counted_E(steps),
                                                 p=dict(zip(devices, p.tolist())), like=self.params),
                        sketch=self.sketch, steps_per_update=steps)

    def weigh(self, round_index: int, s: Mapping[str, int]) -> Weighing:
        """p and the strategy's coefficients for the updates counts `s` (a member not in `s`: 0)."""
        unknown = set(s) - set(self.objective.sample_counts)
        if unknown:
            raise RoundStateError(f"round {round_index}: s given for devices outside the objective: {sorted(unknown)}")
        devices = tuple(self.objective.members())
        s_arr = np.array([int(s.get(d, 0)) for d in devices], dtype=np.int64)
        p = self.objective.weights(list(devices), round_index=round_index, fast_reboot=self.rules.fast_reboot_rule())
        steps = self.steps_per_update(devices)
        counted = s_arr if steps is None else s_arr * np.array([steps[d] for d in devices], dtype=np.int64)
        coef = coefficients(self.rules.aggregation, s=counted, E=self._counted_E(steps), p=p)
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
                raise TypeError(f"round {tau}: give the updates stacked (deltas, rows) or summed, not both")
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
                raise AggregationError(f"round {tau}: no update given for contributors {sorted(missing)}")
            try:
                device_rows = [index[d] for d in rows]
            except KeyError as exc:
                raise RoundStateError(f"round {tau}: an update from {exc.args[0]!r}, which is not in the "
                                      "objective") from None
            params = self.params
            row_of = {d: i for i, d in enumerate(rows)}
            if self.memory is not None:
                params = self._remember(weighing, {c: {name: d[row_of[c]] for name, d in (deltas or {}).items()}
                                                   for c in contributors}, lr=lr)
            elif device_rows:  # apply_update checks the deltas before they are sketched
                params = apply_update(global_state=self.params, deltas=deltas or {},
                                      coefficients=weighing.coefficients, rows=device_rows)
            sketches = np.array([self.sketch.of({name: d[row_of[c]] for name, d in (deltas or {}).items()})
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
            raise RoundStateError(f"strategy {self.rules.aggregation.name!r} keeps no update memory")
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
            raise RoundStateError(f"round {tau}: the updates were summed for round {summed.round_index}")
        s = {d: int(v) for d, v in zip(weighing.devices, weighing.s) if v or d in summed.s}
        if s != summed.s or list(summed.running.p) != list(weighing.devices):
            raise RoundStateError(f"round {tau}: the summed updates (devices {sorted(summed.s)}) are not the ones "
                                  "weighed")
        scale = summed.running.scale() or 0.0
        weights = summed.running.weights
        expected = np.array([weights.get(d, 0.0) * scale for d in weighing.devices])
        if not np.allclose(expected, weighing.coefficients.values, rtol=1e-9, atol=0.0):
            raise AggregationError(f"round {tau}: the running sum's weights disagree with the strategy's coefficients")

    def apply_events(self, *, arrivals: Sequence[Arrival] = (), departures: Sequence[Departure] = ()) -> None:
        """Membership changes before training starts (round 0): initial members, early departures."""
        if self.completed_round:
            raise RoundStateError("apply_events is for changes before the first round; rounds apply theirs at close")
        for a in arrivals:
            if a.device in self.objective.departed_included:
                self.objective.rejoin(a.device)  # left under include and came back before training began
            else:
                self.objective.add_initial(a.device, a.n_samples)
        for d in departures:
            if d.device in self.objective.sample_counts:
                self.objective.depart(d.device, round_index=0, policy=self.departure_policy(d, tau0=0))
