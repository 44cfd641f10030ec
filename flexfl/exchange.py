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


Delta = Mapping[str, np.ndarray]  # name -> w_k - w, checked against the model's shapes; {} for s = 0


@dataclass(frozen=True)
class Accepted:
    round_id: int
    message: str


@dataclass(frozen=True)
class DeviceState:
    device_id: str
    shard_index: int | None
    departed: bool  # announced its departure (and has not come back)
    in_objective: bool  # its data is in the global objective (departed under include too)
    joined_after_round: int
    connected: bool  # called in since this coordinator process started


@dataclass(frozen=True)
class FleetState:
    run_id: str
    completed_round: int
    open_round: int  # 0: none
    started: bool
    finished: bool
    rounds: int
    devices: tuple[DeviceState, ...]
    partition_json: str
