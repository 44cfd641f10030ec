"""FlexFL's round as a Flower strategy: a ServerApp's `strategy.start(grid, ...)` aggregates with FlexFL's rules.

The round is coordinator.rules.round.Federation, the one the live coordinator and the simulator run:
Schemes A/B/C, FedNova, FedProx, MIFA and plug-in strategies ([rules] strategy), fast-reboot for
nodes that appear mid-run and the departure policies (include / exclude / auto / threshold) for
nodes that leave. This module is only the Flower edge, as coordinator/server.py is gRPC's: Flower
Messages in, FlexFL's records out. Needs the [flower] extra (flwr 1.42).

How a Flower run maps to FlexFL's membership events (each documented in docs/flower.md):
- a node is the device "node-<node id>"; its sample count n_k is its train reply's "num-examples";
- round 1's nodes that reply found the objective (no fast-reboot boost, as FlexFL's founding devices);
- a node first seen in round tau > 1 is sent that round's model like the others; its reply gives
  n_k, its update is not applied (it is not in the objective yet), and it arrives at the close of
  tau: fast-reboot from tau + 1, as a FlexFL agent that joins during a round;
- a node of the objective that is no longer among grid.get_node_ids() departs at the close of the
  round it vanished in, under [rules] departure_policy;
- an error reply, no reply within the round's timeout, or a reply that fails the checks: s = 0 in
  that round (inactive, FlexFL's "missed"); the node stays in the objective;
- a node that replies with "flexfl.leaving" = 1 leaves after that round: its update counts, and it
  departs at the round's close under [rules] departure_policy (a FlexFL agent's Leave after its upload).

What a client reports and what the train message carries: flexfl.flower_keys (metric-key convention
version 1), the table this module and edge_agent.flower_client share.

Each round's record has the live part a FlexFL coordinator's rows have (LiveRound), from what a Flower
round shows (docs/flower.md, "What a Flower round measures"): the records' payload bytes sent to each node
and of each taken reply (count_bytes of its Array/Config/MetricRecords, not Flower's wire bytes), each
reply's flexfl.train_s, the round's times, per node the time from its train message being pushed to its
reply being pulled (coordinator.flower_grid.TimedGrid, which start() puts around the grid), the close
reason ("all answered", or "timeout": Flower's round timeout passed first) and refused replies' reasons.
A node's upload time is not measured (Flower does not show it): previous_upload_s stays empty.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from coordinator.flower_grid import TimedGrid
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Departure, Federation, RoundOpening
from coordinator.rules.round_record import LiveRound, RoundRecord
from coordinator.uploading import stop_reason
from flexfl.errors import UpdateRejected
from flexfl.flower_keys import CONFIG_KEYS, METRIC_KEYS, METRICS, VERSION
from flexfl.vocabulary import StopReason

log = logging.getLogger(__name__)


def device_of(node_id: int) -> str:
    """The FlexFL device id of a Flower node."""
    return f"node-{node_id}"


@dataclass(frozen=True)
class _Reply:
    """One node's train reply, checked: its sample count, s and update (local model - global)."""

    device: str
    n_samples: int
    s: int
    delta: dict[str, torch.Tensor]
    stop_reason: StopReason
    leaving: bool  # it leaves after this round (flexfl.leaving = 1)
    train_s: float | None  # its local training's seconds, where it said (flexfl.train_s)
    payload_bytes: int  # the reply's records' bytes (_payload_bytes)


class FlexFLStrategy(FedAvg):
    """A Flower strategy whose training rounds are FlexFL's (Federation); evaluation as Flower's FedAvg does it.

    `rules` are FlexFL's [rules] (strategy, E = required_updates, eta0, fast_reboot, departure_policy, ...); a
    Flower app's data is not one of FlexFL's datasets, so give eta0 (and batch_size for FedNova under unit
    "epoch"). `num_rounds` is the run's T (the auto and threshold departure rules need it); `deadline_s` is
    sent to clients (FlexFL's deadline Mods budget their training to it; 0: none). `records` keeps what each
    round did as FlexFL's RoundRecord (flexfl report and the tables read them).
    """

    def __init__(self, *, rules: RulesConfig, num_rounds: int, deadline_s: float = 0.0, seed: int = 0,
                 dataset: str = "flower", fraction_evaluate: float = 0.0, min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=fraction_evaluate,
                         min_available_nodes=min_available_nodes, min_train_nodes=1)
        self.rules = rules
        self.num_rounds = num_rounds
        self.deadline_s = deadline_s
        self.seed = seed
        self.dataset = dataset
        self.federation: Federation | None = None
        self.records: list[RoundRecord] = []
        self._global: dict[str, torch.Tensor] = {}
        self._opening: RoundOpening | None = None  # the open round (None in a founding round: nobody is in yet)
        self._vanished: list[str] = []  # objective members not among the grid's nodes when the round opened
        self._newcomers: set[str] = set()  # nodes not training in the objective when the round opened (arrivals)
        # The open round's measurements (time.monotonic() seconds): see _live
        self._grid: TimedGrid | None = None
        self._opened_at = 0.0
        self._closed_at: float | None = None  # the last round's aggregation ended
        self._overhead_s: float | None = None
        self._sent: dict[str, int] = {}  # device -> payload bytes of the train message sent to it
        self._nodes: dict[str, int] = {}  # device -> its node id

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Flower's strategy loop, on `grid` timed (TimedGrid): each round's record gets its nodes' reply times."""
        self._grid = grid if isinstance(grid, TimedGrid) else TimedGrid(grid)
        return super().start(grid=self._grid, initial_arrays=initial_arrays, num_rounds=num_rounds, timeout=timeout,
                             train_config=train_config, evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    def summary(self) -> None:
        log.info("FlexFL strategy: %s, E = %d, eta0 = %s, fast-reboot %s, departures %s", self.rules.aggregation.title,
                 self.rules.required_updates, self.rules.eta0, self.rules.fast_reboot, self.rules.departure_policy)

    # ---- train -------------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        now = time.monotonic()
        self._opened_at, self._overhead_s = now, None if self._closed_at is None else now - self._closed_at
        if self.federation is None:
            self.federation = Federation(rules=self.rules, dataset=self.dataset, params=_tensors(arrays),
                                         horizon=self.num_rounds, seed=self.seed)
        fed = self.federation
        self._global = _tensors(arrays)
        # As Flower's own strategies do, wait until min_available_nodes are connected: on the Simulation Engine the
        # ServerApp starts before the nodes are registered, and a first round opened on none founds nothing.
        nodes = {device_of(n): n for n in sample_nodes(grid, self.min_available_nodes, 0)[1]}
        members = fed.objective.active_members()
        self._vanished = [d for d in members if d not in nodes]
        self._opening = fed.open(server_round) if fed.objective.sample_counts else None
        training = [d for d in (self._opening.participants if self._opening else []) if d in nodes]
        # Nodes not in the objective, or back after leaving under include: their reply gives n_k, and they arrive.
        newcomers = [d for d in nodes if d not in members]
        self._newcomers = set(newcomers)
        config[CONFIG_KEYS["round"]] = server_round
        config[CONFIG_KEYS["E"]] = fed.E
        config[CONFIG_KEYS["lr"]] = fed.learning_rate(server_round)
        config[CONFIG_KEYS["mu"]] = float(self.rules.aggregation.proximal_mu)
        config[CONFIG_KEYS["deadline_s"]] = float(self.deadline_s)
        config[CONFIG_KEYS["seed"]] = self.seed
        config[CONFIG_KEYS["trace_sampling"]] = str(self.rules.trace_sampling)
        config[CONFIG_KEYS["s_rule"]] = str(self.rules.s_rule)
        config[CONFIG_KEYS["keys_version"]] = VERSION
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        self._nodes, size = nodes, _payload_bytes(record)
        self._sent = {d: size for d in [*training, *newcomers]}
        return [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=nodes[d]) for d in self._sent]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        closed_at = time.monotonic()
        fed = self.federation
        if fed is None:
            raise RuntimeError("aggregate_train before configure_train")
        checked: dict[str, _Reply] = {}
        answered: set[str] = set()
        rejected: dict[str, tuple[str, ...]] = {}
        for message in replies:
            device = device_of(message.metadata.src_node_id)
            answered.add(device)
            if message.has_error():
                error = f"error reply (code {message.error.code}): " \
                        f"{(str(message.error.reason).splitlines() or [''])[-1][:300]}"
                log.warning("round %d: %s answered with an error (s = 0): %s", server_round, device, error)
                rejected[device] = (error,)
                continue
            try:
                checked[device] = _check(message, device=device, like=self._global, E=fed.E,
                                         arrays_key=self.arrayrecord_key, metrics_key=METRICS)
            except UpdateRejected as exc:
                log.warning("round %d: %s's reply refused (s = 0): %s", server_round, device, exc)
                rejected[device] = (str(exc),)
        opening = self._opening
        arrivals = [Arrival(d, r.n_samples) for d, r in checked.items() if d in self._newcomers]
        founded: tuple[str, ...] = ()
        if opening is None:  # a founding round: the nodes that answered found the objective, no boost, and train in it
            if not arrivals:  # nobody answered: nothing to found the objective with; the model stays
                log.warning("round %d: no node answered; the objective is still empty and the model stays",
                            server_round)
                fed.completed_round = server_round  # Flower's next round is server_round + 1 all the same
                self._closed_at = time.monotonic()
                return None, None
            # Founding members enter as at round 0 (Objective.add_initial), also after rounds nobody answered.
            events = fed.apply_between_rounds(arrivals=[Arrival(a.device, a.n_samples, founding=True)
                                                        for a in arrivals])
            opening, founded, arrivals = fed.open(server_round), events["founded"], []
        taken = {d: checked[d] for d in opening.participants if d in checked}
        weighing = fed.weigh(server_round, {d: r.s for d, r in taken.items()})
        rows = [d for d in weighing.contributors]
        deltas = {name: torch.stack([taken[d].delta[name] for d in rows]) for name in self._global} if rows else {}
        leaving = [d for d, r in taken.items() if r.leaving]  # their work counts; they depart at the close
        outcome = fed.close_stacked(weighing, deltas=deltas, rows=rows, arrivals=arrivals,
                                    departures=[Departure(d) for d in [*self._vanished, *leaving]])
        why = {d: str(taken[d].stop_reason if d in taken else StopReason.MISSED) for d in opening.participants}
        self._closed_at = time.monotonic()
        live = self._live(checked, rejected=rejected, answered=answered, closed_at=closed_at,
                          aggregated_at=self._closed_at)
        record = replace(RoundRecord.of(opening, outcome, test_acc=math.nan, test_loss=math.nan), stop_reason=why,
                         founded=founded or outcome.founded, live=live)
        self.records.append(record)
        s = [r.s for r in taken.values()]
        metrics = MetricRecord({"flexfl.active": sum(1 for v in s if v > 0), "flexfl.members": len(weighing.devices),
                                "flexfl.mean_s": float(sum(s) / len(s)) if s else 0.0,
                                "flexfl.lr": float(outcome.lr)})
        return ArrayRecord({name: t.detach().clone() for name, t in outcome.params.items()}), metrics

    def _live(self, checked: Mapping[str, _Reply], *, rejected: Mapping[str, tuple[str, ...]], answered: set[str],
              closed_at: float, aggregated_at: float) -> LiveRound:
        """The round's live part, as a FlexFL coordinator's rows have it, from what the Flower round showed.

        Opening is configure_train, the close is aggregate_train (every reply is in, or the timeout
        passed); the model is "delivered" when the grid has taken the train messages (pushed them),
        as FlexFL's coordinator counts a device's deadline from handing its model to gRPC. Per-node
        times need the TimedGrid of start(): without it (configure/aggregate called by hand) they are empty.
        """
        exchange = self._grid.last if self._grid is not None else None
        if exchange is not None and exchange.pushed_at < self._opened_at:
            exchange = None  # an earlier round's
        arrived = {} if exchange is None else {
            d: exchange.replied_at[self._nodes[d]] - exchange.pushed_at for d in checked
            if self._nodes.get(d) in exchange.replied_at}
        return LiveRound(
            time=time.time(), close_reason="all answered" if answered >= set(self._sent) else "timeout",
            bytes_out=dict(self._sent), bytes_in={d: r.payload_bytes for d, r in checked.items()},
            train_s={d: r.train_s for d, r in checked.items() if r.train_s is not None}, local_loss={},
            rejected=dict(rejected), round_s=closed_at - self._opened_at,
            aggregate_eval_s=aggregated_at - closed_at, aggregate_s=aggregated_at - closed_at,
            overhead_s=self._overhead_s, arrived_after_s=arrived,
            delivered_after_s={} if exchange is None else {d: exchange.pushed_at - self._opened_at for d in self._sent})


def _payload_bytes(content: RecordDict) -> int:
    """The bytes a message's records hold (arrays' data and keys, configs', metrics'), Flower's count_bytes."""
    return sum(record.count_bytes() for record in content.values())


def _tensors(arrays: ArrayRecord) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in arrays.to_torch_state_dict().items()}


def _check(message: Message, *, device: str, like: Mapping[str, torch.Tensor], E: int, arrays_key: str,
           metrics_key: str) -> _Reply:
    """A train reply as a FlexFL update; UpdateRejected names what is wrong with it."""
    content = message.content
    if arrays_key not in content.array_records or metrics_key not in content.metric_records:
        raise UpdateRejected(f"{device}: a train reply needs ArrayRecord {arrays_key!r} and MetricRecord "
                             f"{metrics_key!r}, got {sorted(content.keys())}")
    metrics = content.metric_records[metrics_key]
    n = metrics.get(METRIC_KEYS["samples"])
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UpdateRejected(f"{device}: {METRIC_KEYS['samples']!r} must be an integer >= 1, got {n!r}")
    s = metrics.get(METRIC_KEYS["s"], E)
    if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= E:
        raise UpdateRejected(f"{device}: {METRIC_KEYS['s']!r} must be an integer in 0..E ({E}), got {s!r}")
    code = metrics.get(METRIC_KEYS["stop_reason"])
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise UpdateRejected(f"{device}: {METRIC_KEYS['stop_reason']!r} must be fleet.proto's StopReason number, "
                             f"got {code!r}")
    why = stop_reason(code) if code is not None else StopReason.COMPLETE if s == E else StopReason.UNKNOWN
    leaving = metrics.get(METRIC_KEYS["leaving"], 0)
    if leaving not in (0, 1) or isinstance(leaving, bool):
        raise UpdateRejected(f"{device}: {METRIC_KEYS['leaving']!r} must be 0 or 1, got {leaving!r}")
    train_s = metrics.get(METRIC_KEYS["train_s"])
    if train_s is not None and (isinstance(train_s, bool) or not isinstance(train_s, int | float)
                                or not math.isfinite(train_s) or train_s < 0):
        raise UpdateRejected(f"{device}: {METRIC_KEYS['train_s']!r} must be seconds >= 0, got {train_s!r}")
    local = content.array_records[arrays_key].to_torch_state_dict()
    if set(local) != set(like):
        raise UpdateRejected(f"{device}: arrays {sorted(local)} are not the model's {sorted(like)}")
    delta = {}
    for name, w in like.items():
        got = local[name]
        if tuple(got.shape) != tuple(w.shape):
            raise UpdateRejected(f"{device}: {name} has shape {tuple(got.shape)}, the model's is {tuple(w.shape)}")
        d = got.to(w.dtype) - w
        if not torch.isfinite(d).all():
            raise UpdateRejected(f"{device}: {name} holds NaN or Inf")
        delta[name] = d
    return _Reply(device=device, n_samples=n, s=s, delta=delta, stop_reason=why, leaving=leaving == 1,
                  train_s=None if train_s is None else float(train_s), payload_bytes=_payload_bytes(content))
