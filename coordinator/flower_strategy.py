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
  that round (inactive, FlexFL's "missed"); the node stays in the objective.

What a client reports, metric-key convention version 1 (METRIC_KEYS): in its train reply's
MetricRecord, "num-examples" (n_k), "flexfl.s" (local updates completed, 0..E; absent: E, a
client that ran all of them), and optionally "flexfl.stop_reason" (why s is what it is, as the number
fleet.proto's StopReason gives it: 1 complete, 2 compute, 3 upload, 4 trace, 5 stopped; a MetricRecord holds
numbers only); its "arrays" are its local model after training (Flower's
convention), the update is that minus the round's global model. The train ConfigRecord carries the
round's terms: "flexfl.round", "flexfl.E", "flexfl.lr", "flexfl.mu", "flexfl.deadline_s".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Departure, Federation, RoundOpening
from coordinator.rules.round_record import RoundRecord
from coordinator.uploading import stop_reason
from flexfl.errors import UpdateRejected
from flexfl.vocabulary import StopReason

log = logging.getLogger(__name__)

METRIC_KEYS_VERSION = 1
METRIC_KEYS = {"samples": "num-examples", "s": "flexfl.s", "stop_reason": "flexfl.stop_reason"}
CONFIG_KEYS = {"round": "flexfl.round", "E": "flexfl.E", "lr": "flexfl.lr", "mu": "flexfl.mu",
               "deadline_s": "flexfl.deadline_s", "keys_version": "flexfl.keys_version"}


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

    def summary(self) -> None:
        log.info("FlexFL strategy: %s, E = %d, eta0 = %s, fast-reboot %s, departures %s", self.rules.aggregation.title,
                 self.rules.required_updates, self.rules.eta0, self.rules.fast_reboot, self.rules.departure_policy)

    # ---- train -------------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.federation is None:
            self.federation = Federation(rules=self.rules, dataset=self.dataset, params=_tensors(arrays),
                                         horizon=self.num_rounds, seed=self.seed)
        fed = self.federation
        self._global = _tensors(arrays)
        nodes = {device_of(n): n for n in grid.get_node_ids()}
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
        config[CONFIG_KEYS["keys_version"]] = METRIC_KEYS_VERSION
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=nodes[d])
                for d in [*training, *newcomers]]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        fed = self.federation
        if fed is None:
            raise RuntimeError("aggregate_train before configure_train")
        checked: dict[str, _Reply] = {}
        for message in replies:
            device = device_of(message.metadata.src_node_id)
            if message.has_error():
                log.warning("round %d: %s answered with an error (s = 0): %s", server_round, device,
                            str(message.error.reason).splitlines()[-1][:300])
                continue
            try:
                checked[device] = _check(message, device=device, like=self._global, E=fed.E,
                                         arrays_key=self.arrayrecord_key, metrics_key="metrics")
            except UpdateRejected as exc:
                log.warning("round %d: %s's reply refused (s = 0): %s", server_round, device, exc)
        opening = self._opening
        arrivals = [Arrival(d, r.n_samples) for d, r in checked.items() if d in self._newcomers]
        founded: tuple[str, ...] = ()
        if opening is None:  # a founding round: the nodes that answered found the objective, no boost, and train in it
            if not arrivals:  # nobody answered: nothing to found the objective with; the model stays
                log.warning("round %d: no node answered; the objective is still empty and the model stays",
                            server_round)
                fed.completed_round = server_round  # Flower's next round is server_round + 1 all the same
                return None, None
            # Founding members enter as at round 0 (Objective.add_initial), also after rounds nobody answered.
            events = fed.apply_between_rounds(arrivals=[Arrival(a.device, a.n_samples, founding=True)
                                                        for a in arrivals])
            opening, founded, arrivals = fed.open(server_round), events["founded"], []
        taken = {d: checked[d] for d in opening.participants if d in checked}
        weighing = fed.weigh(server_round, {d: r.s for d, r in taken.items()})
        rows = [d for d in weighing.contributors]
        deltas = {name: torch.stack([taken[d].delta[name] for d in rows]) for name in self._global} if rows else {}
        outcome = fed.close_stacked(weighing, deltas=deltas, rows=rows, arrivals=arrivals,
                                    departures=[Departure(d) for d in self._vanished])
        why = {d: str(taken[d].stop_reason if d in taken else StopReason.MISSED) for d in opening.participants}
        record = replace(RoundRecord.of(opening, outcome, test_acc=math.nan, test_loss=math.nan), stop_reason=why,
                         founded=founded or outcome.founded)
        self.records.append(record)
        s = [r.s for r in taken.values()]
        metrics = MetricRecord({"flexfl.active": sum(1 for v in s if v > 0), "flexfl.members": len(weighing.devices),
                                "flexfl.mean_s": float(sum(s) / len(s)) if s else 0.0,
                                "flexfl.lr": float(outcome.lr)})
        return ArrayRecord({name: t.detach().clone() for name, t in outcome.params.items()}), metrics


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
    return _Reply(device=device, n_samples=n, s=s, delta=delta, stop_reason=why)
