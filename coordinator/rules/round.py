"""The federated round, written once: the live coordinator and the simulator both run it.

Round tau under the rules (paper Sections 4.1-4.3):

    open    participants = the objective's active members, or K of them drawn  (coordinator.rules.sampling)
            eta_tau = eta_0 / (tau - tau_0)                       (coordinator.rules.objective)
    ...     each participant k trains s_k local updates from w and returns delta_k
            (live: over gRPC until its deadline; simulated: s from the trace sampler)
    close   p^k   = n_k / n over the objective, boosted by fast-reboot for recent arrivals
            c_k   = strategy(s m, E max m, p): Scheme A/B/C, FedNova, ...  (coordinator.rules.strategies;
                    m_k = 1, or what the strategy counts an update as: FedNova's SGD steps)
                    under client sampling over the drawn devices (and the members not available to
                    draw), each drawn p_k times its expansion g_k (N_A / K uniformly): c_k = 0 for the others
            w    <- w + sum_k c_k delta_k
                    (a strategy with a memory makes w itself from the round and its memory:
                     MIFA's m_k <- (E/s_k) delta_k / eta_tau for each contributor, then
                     w <- w + eta_tau sum_k p_k m_k over every member with a memory)
            the contributors' (c_k > 0) updates feed the Gamma estimate (coordinator.rules.gamma)
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

from coordinator.rules.aggregation import Coefficients, RunningAggregate, apply_update, coefficients
from coordinator.rules.config import RulesConfig
from coordinator.rules.gamma import UpdateSketch, dissimilarities
from coordinator.rules.memory import ClosingRound, StrategyMemory
from coordinator.rules.objective import AutoDeparture, LearningRate, Objective, ThresholdDeparture
from coordinator.rules.sampling import ClientDraw
from edge_agent.trainer import steps_per_update
from flexfl.errors import AggregationError, ConfigError, RoundStateError
from flexfl.vocabulary import DeparturePolicy
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
    draw: ClientDraw | None = None  # under client sampling: who was drawn (the participants), how often


@dataclass(frozen=True)
class Weighing:
    """Base weights and coefficients of one round, over the objective's members in order."""

    round_index: int
    devices: tuple[str, ...]
    s: np.ndarray  # int64 [N]
    p: np.ndarray  # float64 [N], fast-reboot boost included (not the sampling's expansion)
    coefficients: Coefficients
    draw: ClientDraw | None = None  # client sampling's draw of this round; None: every available device

    @property
    def contributors(self) -> list[str]:
        """Devices whose update enters the aggregate (coefficient > 0); the only ones worth training."""
        return [self.devices[i] for i in self.coefficients.contributors]

    @property
    def weighed(self) -> tuple[str, ...]:
        """The devices the strategy weighed: every member, or under client sampling the drawn ones and the
        members outside the draw's pool (ClientDraw.weighed), in the objective's order."""
        if self.draw is None:
            return self.devices
        index, _ = self.draw.weighed(self.devices, self.p)
        return tuple(self.devices[i] for i in index)


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
    coordinator.rules.aggregation.RunningAggregate. An update that enters the sum (arrival weight
    > 0: a contributor) is also sketched for the Gamma estimate (coordinator.rules.gamma).
    """

    round_index: int
    running: RunningAggregate  # its p: the base weight of every objective member, fast-reboot boost included
    sketch: UpdateSketch
    s: dict[str, int] = field(default_factory=dict)
    sketches: dict[str, np.ndarray] = field(default_factory=dict)  # contributor -> C delta, float64 [m]
    # A strategy with a memory (MIFA): each contributor's update, copied (float32), for the close to hand it
    keep: bool = False
    kept: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # What one local update of each device counts as for the strategy (Strategy.counts_per_update); None: one
    counts: Mapping[str, int] | None = None

    def add(self, device: str, *, s: int, delta: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Add `device`'s update of s local updates; raises (and changes nothing) when it cannot enter."""
        self._check_drawn([device])
        self._entered(device, s=s, weight=self.running.add(device, s=self._counted(device, s), delta=delta),
                      delta=delta)

    def add_rows(self, devices: Sequence[str], *, s: Sequence[int], deltas: Mapping[str, torch.Tensor]) -> None:
        """Add the updates of `devices` at once (`deltas[name]` [len(devices), *shape], row i: devices[i]):
        add() for a stacked chunk of rows (the simulator's chunked close); raises, changing nothing, if any
        row cannot enter."""
        devices = list(devices)
        self._check_drawn(devices)
        weights = self.running.add_rows(devices, s=[self._counted(d, v) for d, v in zip(devices, s)], deltas=deltas)
        for i, (device, v) in enumerate(zip(devices, s)):
            self._entered(device, s=v, weight=float(weights[i]),
                          delta={name: d[i] for name, d in deltas.items()} if weights[i] > 0 else {})

    def _check_drawn(self, devices: Sequence[str]) -> None:
        for device in devices:
            if device not in self.running.p:
                raise RoundStateError(f"round {self.round_index}: an update from {device!r}, which is not in the "
                                      "objective or was not drawn for this round")

    def _counted(self, device: str, s: int) -> int:
        return int(s) if self.counts is None else int(s) * self.counts[device]

    def _entered(self, device: str, *, s: int, weight: float, delta: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """What the round keeps of an update the running sum took: its sketch (a contributor's) and s."""
        if weight > 0:
            self.sketches[device] = self.sketch.of(delta)
            if self.keep:  # the caller may reuse its buffers: a copy
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
    seed: int = 0  # the run's seed: client sampling's draws (coordinator.rules.sampling)
    # The strategy's state between rounds (Strategy.new_memory: MIFA's updates); None without one
    memory: StrategyMemory | None = field(default=None, init=False)

    @property
    def E(self) -> int:
        return self.rules.required_updates

    @cached_property
    def sketch(self) -> UpdateSketch:
        """The Gamma estimate's sketch of this model's updates (the same for every run of the model)."""
        return UpdateSketch(self.params)

    def __post_init__(self) -> None:
        rule = self.rules.aggregation
        if rule.asynchronous:
            raise ConfigError(f"{rule.title} has no rounds: its server steps every {rule.parameters.get('buffer')} "
                              "updates on the simulated clock (`flexfl sim run --scheme fedbuff` with --deadline-s or "
                              "--timeline: simulator.async_run); a round engine cannot run it")
        self.memory = rule.new_memory(like=self.params)

    def learning_rate(self, round_index: int) -> float:
        shift = self.objective.shift_round if self.rules.lr_restart else 0  # lr_restart=False: a diagnostic only
        return LearningRate(self.rules.eta0_for(self.dataset)).at(round_index=round_index, shift_round=shift)

    def open(self, round_index: int) -> RoundOpening:
        """Who trains in round `round_index` and at which rate."""
        if round_index != self.completed_round + 1:
            raise RoundStateError(f"round {round_index} cannot open after round {self.completed_round}")
        draw = self.draw(round_index)
        active = self.objective.active_members()
        participants = active if draw is None else [d for d in active if d in draw.counts]
        return RoundOpening(round_index=round_index, participants=tuple(participants),
                            lr=self.learning_rate(round_index), draw=draw)

    def draw(self, round_index: int) -> ClientDraw | None:
        """The devices round `round_index` draws to train (coordinator.rules.sampling); None without client sampling.

        A pure function of the run's seed, the round and the objective (which changes only at a close),
        so the opening and the close of a round, live or simulated, see the same draw."""
        sampler = self.rules.client_sampler(seed=self.seed)
        if sampler is None:
            return None
        pool = self.objective.active_members()
        p = (self.objective.weights(pool, round_index=round_index, fast_reboot=self.rules.fast_reboot_rule())
             if pool else np.zeros(0))
        return sampler.draw(round_index=round_index, pool=pool, p=p)

    def counts(self, devices: Sequence[str]) -> dict[str, int] | None:
        """What one local update of each device counts as in the strategy's s and E
        (Strategy.counts_per_update: FedNova's SGD steps); None: one, as the rules count it."""
        n = [self.objective.sample_counts[d] for d in devices]
        batch = self.rules.batch_size_for(self.dataset) if n else 1
        steps = np.array([steps_per_update(n_k, batch_size=batch, unit=self.rules.unit) for n_k in n], dtype=np.int64)
        counts = self.rules.aggregation.counts_per_update(steps_per_update=steps, n_samples=np.array(n, dtype=np.int64))
        if counts is None:
            return None
        counts = np.asarray(counts)
        if counts.shape != steps.shape or not np.issubdtype(counts.dtype, np.integer) or (counts < 1).any():
            raise AggregationError(f"strategy {self.rules.aggregation.name!r}: counts_per_update gave "
                                   f"{counts.tolist()} for {len(n)} devices; expected one integer >= 1 per device")
        return dict(zip(devices, counts.tolist()))

    def _counted_E(self, counts: Mapping[str, int] | None) -> int:
        return self.E if counts is None else self.E * max(counts.values(), default=1)

    def start_sum(self, opening: RoundOpening) -> RoundSum:
        """An empty RoundSum for the round `opening` opened; pass it to close_summed()."""
        devices = self.objective.members()
        p = self.objective.weights(devices, round_index=opening.round_index, fast_reboot=self.rules.fast_reboot_rule())
        counts = self.counts(devices)
        if opening.draw is not None:  # the strategy weighs the drawn devices (and those outside the pool) only
            index, p = opening.draw.weighed(devices, p)
            devices = [devices[i] for i in index]
        return RoundSum(round_index=opening.round_index,
                        running=RunningAggregate(strategy=self.rules.aggregation, E=self._counted_E(counts),
                                                 p=dict(zip(devices, p.tolist())), like=self.params),
                        sketch=self.sketch, keep=self.memory is not None, counts=counts)

    def weigh(self, round_index: int, s: Mapping[str, int]) -> Weighing:
        """p and the strategy's coefficients for the updates counts `s` (a member not in `s`: 0)."""
        unknown = set(s) - set(self.objective.sample_counts)
        if unknown:
            raise RoundStateError(f"round {round_index}: s given for devices outside the objective: {sorted(unknown)}")
        devices = tuple(self.objective.members())
        s_arr = np.array([int(s.get(d, 0)) for d in devices], dtype=np.int64)
        p = self.objective.weights(list(devices), round_index=round_index, fast_reboot=self.rules.fast_reboot_rule())
        counts = self.counts(devices)
        counted = s_arr if counts is None else s_arr * np.array([counts[d] for d in devices], dtype=np.int64)
        draw = self.draw(round_index)
        if draw is None:
            coef = coefficients(self.rules.aggregation, s=counted, E=self._counted_E(counts), p=p, devices=devices)
        else:
            coef = self._sampled_coefficients(draw, devices=devices, counted=counted, p=p, counts=counts)
        return Weighing(round_index=round_index, devices=devices, s=s_arr, p=p, coefficients=coef, draw=draw)

    def _sampled_coefficients(self, draw: ClientDraw, *, devices: tuple[str, ...], counted: np.ndarray,
                              p: np.ndarray, counts: Mapping[str, int] | None) -> Coefficients:
        """The strategy's coefficients over the devices the draw weighs (ClientDraw.weighed), 0 for the others."""
        undrawn = [d for d, v in zip(devices, counted) if v > 0 and d in draw.pool and d not in draw.counts]
        if undrawn:
            raise RoundStateError(f"round {draw.round_index}: s > 0 given for devices not drawn: {undrawn}")
        index, p_weighed = draw.weighed(devices, p)
        part = coefficients(self.rules.aggregation, s=counted[index], E=self._counted_E(counts), p=p_weighed,
                            devices=[devices[i] for i in index])
        values = np.zeros(len(devices), dtype=np.float64)
        values[index] = part.values
        return Coefficients(values=values, discarded=part.discarded)

    def close_stacked(self, weighing: Weighing, *, deltas: Mapping[str, torch.Tensor], rows: Sequence[str],
                      arrivals: Sequence[Arrival] = (), departures: Sequence[Departure] = ()) -> RoundOutcome:
        """Aggregate the round's updates stacked (the simulator), then apply the membership events.

        `deltas[name]` is [K, *shape] with row i the update of device rows[i]; it must hold (at
        least) every contributor of `weighing` (with none, pass rows=() and deltas={}: the
        model stays); other rows are ignored.
        """
        tau = weighing.round_index
        contributors = weighing.contributors
        index = {d: i for i, d in enumerate(weighing.devices)}
        missing = set(contributors) - set(rows)
        if missing:
            raise AggregationError(f"round {tau}: no update given for contributors {sorted(missing)}")
        try:
            device_rows = [index[d] for d in rows]
        except KeyError as exc:
            raise RoundStateError(f"round {tau}: an update from {exc.args[0]!r}, which is not in the "
                                  "objective") from None
        if device_rows:  # apply_update checks the deltas before they are sketched
            aggregated = apply_update(global_state=self.params, deltas=deltas, coefficients=weighing.coefficients,
                                      rows=device_rows)
        else:
            aggregated = {name: w.detach().clone() for name, w in self.params.items()}
        row_of = {d: i for i, d in enumerate(rows)}
        updates = {c: {name: d[row_of[c]] for name, d in deltas.items()} for c in contributors}
        sketches = np.array([self.sketch.of(updates[c]) for c in contributors], dtype=np.float64)
        return self._close(weighing, aggregated=aggregated, updates=updates, sketches=sketches,
                           arrivals=arrivals, departures=departures)

    def close_summed(self, weighing: Weighing, *, summed: RoundSum, arrivals: Sequence[Arrival] = (),
                     departures: Sequence[Departure] = ()) -> RoundOutcome:
        """Aggregate the round's updates summed as they arrived (the live coordinator: a RoundSum of this
        round, whose s `weighing` was made from), then apply the membership events."""
        self._check_sum(weighing, summed)
        contributors = weighing.contributors
        sketches = np.array([summed.sketches[d] for d in contributors], dtype=np.float64)
        updates = ({d: {name: torch.from_numpy(a) for name, a in summed.kept[d].items()} for d in contributors}
                   if self.memory is not None else {})
        return self._close(weighing, aggregated=summed.running.apply(global_state=self.params), updates=updates,
                           sketches=sketches, arrivals=arrivals, departures=departures)

    def _close(self, weighing: Weighing, *, aggregated: dict[str, torch.Tensor],
               updates: Mapping[str, Mapping[str, torch.Tensor]], sketches: np.ndarray,
               arrivals: Sequence[Arrival], departures: Sequence[Departure]) -> RoundOutcome:
        """Both forms from here on: the strategy's memory (if any) makes the model, the contributors'
        updates (sketches: row i contributors[i]) feed Objective.gamma, then the membership events."""
        tau = weighing.round_index
        lr = self.learning_rate(tau)
        if self.memory is not None:
            self.params = self.memory.close(ClosingRound(
                round_index=tau, lr=lr, E=self.E, devices=weighing.devices, s=weighing.s, p=weighing.p,
                coefficients=weighing.coefficients.values, n_samples=dict(self.objective.sample_counts),
                updates=updates, params=self.params, aggregated=aggregated))
        else:
            self.params = aggregated
        self._note_gamma(weighing, weighing.contributors, sketches, lr=lr)
        self.completed_round = tau
        remembered = self.memory.remembered if self.memory is not None else ()
        return RoundOutcome(weighing=weighing, lr=lr, params=self.params, remembered=remembered,
                            **self.apply_between_rounds(arrivals=arrivals, departures=departures))

    def apply_between_rounds(self, *, arrivals: Sequence[Arrival] = (),
                             departures: Sequence[Departure] = ()) -> dict:
        """Apply membership events after round `completed_round` (close_stacked and close_summed do, at each close).

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

    def _note_gamma(self, weighing: Weighing, contributors: list[str], sketches: np.ndarray, *, lr: float) -> None:
        """Feed the contributors' update sketches (row i: contributors[i]) to the Gamma estimate."""
        if len(contributors) < 2:
            return  # a lone contributor is its own aggregate direction (coordinator.rules.gamma)
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
        if s != summed.s or list(summed.running.p) != list(weighing.weighed):
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
