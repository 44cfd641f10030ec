"""What the round engine takes and gives: small domain records, free of the wire format.

The gRPC servicer (coordinator/server.py) turns each request's protobuf message into one of
these and each answer back, so the engine runs, and is tested, without gRPC. The records are
the agent's too (its transport converts the same messages): they live in flexfl/exchange.py,
and are named here for the coordinator's modules.
"""

from __future__ import annotations

from flexfl.exchange import (
    Accepted,
    Delta,
    DeviceState,
    FleetState,
    Join,
    Joined,
    ModelDescription,
    OfferStatus,
    RoundOffer,
    RoundTerms,
    UpdateReport,
)

__all__ = ["Accepted", "Delta", "DeviceState", "FleetState", "Join", "Joined", "ModelDescription", "OfferStatus",
           "RoundOffer", "RoundTerms", "UpdateReport"]
