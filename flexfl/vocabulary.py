"""The rules' vocabulary: the names every layer uses for the rules' choices and outcomes.

Light (no torch, no numpy), in the ground floor, so that command-line parsers (`flexfl --help`,
the loadgen daemon on a Pi), the config layer, both engines and the pages name a choice the same
way. The rules themselves live beside their code: schemes in coordinator.rules.aggregation,
departures in coordinator.rules.objective, the trace sampler in trace_recorder.sampler, the
deadline rule in edge_agent.deadline and trace_recorder.deadline.
"""

from __future__ import annotations

from enum import StrEnum


class Scheme(StrEnum):
    """A: complete devices only. B: incomplete work at weight p_k. C: incomplete work at (E/s_k) p_k."""

    A = "A"
    B = "B"
    C = "C"


class DeparturePolicy(StrEnum):
    """include: keep a departed device's p^k (it contributes nothing); exclude: drop and renormalise;
    auto: decide per departure by Corollary 4.3 (AutoDeparture); threshold: by the time left
    alone (ThresholdDeparture)."""

    INCLUDE = "include"
    EXCLUDE = "exclude"
    AUTO = "auto"
    THRESHOLD = "threshold"

    @property
    def decided_at_departure(self) -> bool:
        """auto and threshold are rules, resolved to include or exclude when the departure takes effect."""
        return self in (DeparturePolicy.AUTO, DeparturePolicy.THRESHOLD)


class Unit(StrEnum):
    """What one local update is: one minibatch SGD step (the paper's eq. (1)) or one epoch, ceil(n_k / B) steps."""

    STEP = "step"
    EPOCH = "epoch"


class Sampling(StrEnum):
    """How a device following a trace draws each round's fraction (trace_recorder.sampler): independently, or in
    order."""

    IID = "iid"
    REPLAY = "replay"


class ClientSampling(StrEnum):
    """How a round draws its K devices when [rules] sample_k is set (coordinator.rules.sampling): K distinct
    devices uniformly, or K draws with replacement in proportion to p_k."""

    UNIFORM = "uniform"
    WEIGHTED = "weighted"


class SRule(StrEnum):
    """How a fraction of E becomes s: round half up, or only updates finished in full (trace_recorder.sampler)."""

    ROUND = "round"
    FLOOR = "floor"


class StopReason(StrEnum):
    """Why a device's s in a round is what it is: one vocabulary for the live agent
    (edge_agent.deadline.why_stopped), the coordinator's metrics rows (`stop_reason`, per device)
    and the deadline rule's closed form (trace_recorder.deadline), so that live and simulated
    rounds can be compared reason by reason.

    The agent decides the first five when its round ends; the coordinator the last three, for
    a device whose update it did not take or whose agent did not say
    (coordinator.open_round.OpenRound.stop_reasons); the closed form gives complete, compute,
    upload and offline.
    """

    COMPLETE = "complete"  # s = E
    COMPUTE = "compute"  # the budget stopped it: training took the room
    UPLOAD = "upload"  # the budget stopped it: the upload (and download) took the room
    TRACE = "trace"  # its participation trace (or forced schedule, participation.forced_updates) capped s below E
    STOPPED = "stopped"  # the agent was shutting down during the round
    MISSED = "missed"  # its model was delivered, but no update was taken by its deadline (late, refused, lost)
    OFFLINE = "offline"  # its model was never delivered (not connected, departed, offline in its timeline)
    UNKNOWN = "unknown"  # an update from an agent that does not send the reason (older than the field)


# The reasons an agent sends; the others are the coordinator's.
AGENT_REASONS = (StopReason.COMPLETE, StopReason.COMPUTE, StopReason.UPLOAD, StopReason.TRACE, StopReason.STOPPED)
