"""What a device and the coordinator exchange: small domain records, free of the wire format.

Both ends convert protobuf (proto/fleet.proto) to these at their edge, the coordinator in its
servicer (coordinator/server.py), the agent in its transport (edge_agent/transport.py), so that
the coordinator's round engine and the device's round run, and are tested, without gRPC. The
payload (the model sent, a device's delta) travels here as named tensors, encoded and checked
at the edge. One module for both ends, in the ground floor: a field is named once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

from flexfl.vocabulary import StopReason

if TYPE_CHECKING:  # the agent on a Pi imports this module; torch is only a type here
    import torch





@dataclass(frozen=True)
class Join:
    """A device's join (or re-join after a restart): who it is and the data it holds."""

    device_id: str
    sample_count: int = 0  # 0 with a shard: the shard's count (benchmark agents hold no data)
    shard_index: int | None = None
    partition_json: str = ""  # the device's partition (canonical JSON), or empty to adopt the coordinator's
    hardware: Mapping[str, object] = field(default_factory=dict)
    agent_version: str = ""
    resident_bytes: int = 0


@dataclass(frozen=True)
class Joined:
    device_id: str
    device_index: int  # seeds the device's streams: its shard, else its join order
    arrival: bool  # joined after training started: an objective shift, fast-reboot
    current_round: int  # the last completed round
    run_id: str
    partition_json: str  # the coordinator's: the device trains on its shard of it


@dataclass(frozen=True)
class ModelDescription:
    architecture: str  # "mlp", "cnn", "logreg"
    num_classes: int
    in_features: int


class OfferStatus(StrEnum):
    ROUND = "round"  # a round for this device: the terms and the model
    WAIT = "wait"  # nothing yet: ask again
    FINISHED = "finished"  # training is over


@dataclass(frozen=True)
class RoundTerms:
    """What a device trains a round under, and the model it starts from."""

    required_updates: int  # E
    learning_rate: float
    batch_size: int
    deadline_s: float  # seconds from the receipt of the whole model
    model: ModelDescription
    params: Mapping[str, torch.Tensor]  # the global model; the same tensors for every device of the round
    seed: int
    unit: str
    device_index: int
    trace_sampling: str
    s_rule: str
    proximal_mu: float


@dataclass(frozen=True)
class RoundOffer:
    """The answer to a device that asks for its next round; `terms` with ROUND only."""

    status: OfferStatus
    round_id: int  # ROUND: the round; else the last completed one
    terms: RoundTerms | None = None


@dataclass(frozen=True)
class UpdateReport:
    """A device's account of its round, which its delta (if any) follows."""

    round_id: int
    updates_completed: int  # s
    samples_used: int = 0
    train_s: float = 0.0
    local_loss: float = 0.0
    previous_upload_s: float = 0.0  # the device's own measure of its previous upload (0: none yet)
    stop_reason: StopReason = StopReason.UNKNOWN  # why s is what it is (edge_agent.deadline.why_stopped)
    resident_bytes: int = 0  # the agent's resident memory as it sends the update (0: not reported)


Delta = Mapping[str, np.ndarray]  # name -> w_k - w, checked against the model's shapes; {} for s = 0


@dataclass(frozen=True)
class LogLine:
    """One record of a device's own log, as it sends it to the coordinator (SendLog: the run folder keeps it)."""

    time_s: float  # Unix time of the record
    level: str  # logging's level name: INFO, WARNING, ...
    logger: str  # the logger's name (edge_agent.agent, ...)
    message: str  # the formatted message, a traceback's lines included


@dataclass(frozen=True)
class LogKept:
    """What the coordinator did with a batch of log lines."""

    kept: int
    dropped: int  # past the device's share of the run folder (server.max_agent_log_mib), or the device's own count


@dataclass(frozen=True)
class Accepted:
    round_id: int
    message: str


class RoundState(StrEnum):
    """A device's part in the open round (Status): what the round waits for from it."""

    NONE = ""  # no round open, or it does not take part
    PENDING = "pending"  # its model is not delivered yet
    TRAINING = "training"  # it has the model; its deadline has not passed
    LATE = "late"  # its deadline passed without an update (it counts as s = 0 unless one comes in the grace)
    ANSWERED = "answered"  # its update was taken
    LEFT = "left"  # it departed during the round


@dataclass(frozen=True)
class DeviceRound:
    """A device's part in the last closed round that counted it (in that round's metrics row)."""

    round_id: int
    s: int
    stop_reason: str  # a flexfl.vocabulary.StopReason value
    bytes_in: int  # its update as received (0: none taken)
    bytes_out: int  # the model sent to it (0: none delivered)
    train_s: float  # as the device measured it (0: no update taken)


@dataclass(frozen=True)
class DeviceState:
    device_id: str
    shard_index: int | None
    departed: bool  # announced its departure (and has not come back)
    in_objective: bool  # its data is in the global objective (departed under include too)
    joined_after_round: int
    connected: bool  # called in since this coordinator process started
    streaming: bool = False  # holds a live Session or PullRound call now
    round_state: RoundState = RoundState.NONE
    last_round: DeviceRound | None = None  # None: no closed round has counted it since this process started
    resident_bytes: int | None = None  # the agent's resident memory as it last reported it (join or update)
    upload_bytes_per_s: float | None = None  # its link as it measured it (coordinator.device_rounds)
    seen_ago_s: float | None = None  # since it last called in (None: not since this process started)


@dataclass(frozen=True)
class FleetState:
    """The coordinator's state as its Status call gives it: the run, the open round, every device."""

    run_id: str
    completed_round: int
    open_round: int  # 0: none
    started: bool
    finished: bool
    rounds: int
    devices: tuple[DeviceState, ...]
    partition_json: str
    required_updates: int = 0  # E (0: a coordinator that does not say)
    deadline_s: float = 0.0
    round_open_s: float | None = None  # since the open round opened (None: none open)
    round_closes_in_s: float | None = None  # until it closes unless all answer first (None: none open)
