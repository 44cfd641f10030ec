"""Who makes a gRPC call: the fleet token, the device it claims to be, and that device's one live stream.

Every call carries the fleet token and the id of the device that makes it (proto/fleet.proto);
under mutual TLS a call may only claim the device its client certificate names
(coordinator/identity.py). A device holds at most one Session or PullRound call at a time.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER

from coordinator import identity
from flexfl.errors import DeviceBusy, DeviceConflict, IdentityMismatch, MissingDevice, Unauthenticated

log = logging.getLogger(__name__)


class Callers:
    """Authenticates calls and holds each device's live stream (touched on the event loop's thread only)."""

    def __init__(self, token: str, *, certificate_identity: bool = False) -> None:
        self._token = token.encode()
        self.certificate_identity = certificate_identity  # mutual TLS: the certificate's CN is the device id
        self._streams: dict[str, grpc.aio.ServicerContext] = {}  # device -> its live Session or PullRound

    def identify(self, context: grpc.aio.ServicerContext) -> str:
        """Check the fleet token; return the device id the call claims to come from."""
        md = dict(context.invocation_metadata())
        presented = md.get(AUTH_HEADER, "")
        token = presented[len("Bearer "):] if presented.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), self._token):
            raise Unauthenticated("missing or wrong fleet token")
        device_id = md.get(DEVICE_HEADER, "")
        if not device_id:
            raise MissingDevice(f"missing {DEVICE_HEADER} metadata: every call says which device makes it")
        if self.certificate_identity:
            try:
                identity.check_claim(context.auth_context(), device_id)
            except IdentityMismatch as exc:
                log.warning("refused a call: %s", str(exc))
                raise
        return device_id

    def check_join(self, caller: str) -> None:
        """Refuse (DeviceConflict) a join from `caller` while it holds a live stream: a second agent.

        An agent joins once, before it opens its stream (and again only once that stream has
        ended with UNKNOWN_DEVICE), so a join while the device's stream is live comes from another
        agent with the same id, even one with the same data. Taken for a reconnection it would be
        handed the running device's rounds. A restarted agent whose old connection the server has
        not yet seen end (a dead link: keepalive's ~40 s) is refused too; its supervisor's restart
        (systemd's, every 5 s) joins once the old stream is gone.
        """
        if caller in self._streams:
            raise DeviceConflict(f"device {caller!r} is connected (it holds a live Session or PullRound call); "
                                 "this join under the same id is a second agent. Each agent needs its own device "
                                 "id; an agent that restarted may join once its old connection has ended")

    def streaming(self) -> frozenset[str]:
        """The devices that hold a live Session or PullRound call now."""
        return frozenset(self._streams)

    @contextmanager
    def live_stream(self, caller: str, context: grpc.aio.ServicerContext) -> Iterator[None]:
        """Hold this call as `caller`'s one live Session or PullRound; DeviceBusy while it has another.

        One at a time: each parked stream would be sent the model when a round opens, so a device
        holding many would have the coordinator send it the model many times over. The second is
        refused rather than replacing the first, so that a second agent under the same id cannot
        take the running device's stream; an agent that reconnects retries until the coordinator
        has seen its old stream end (at once on a closed connection, within keepalive's ~40 s on
        a dead one).
        """
        if caller in self._streams:
            raise DeviceBusy(f"device {caller!r} already has a live Session or PullRound call; a device holds one "
                             "at a time (retry once that one has ended)")
        self._streams[caller] = context
        # Released however the call ends: also when its cancellation never reaches this frame.
        context.add_done_callback(lambda _: self._release(caller, context))
        try:
            yield
        finally:
            self._release(caller, context)

    def _release(self, caller: str, context: grpc.aio.ServicerContext) -> None:
        if self._streams.get(caller) is context:
            del self._streams[caller]


def same_device(caller: str, claimed: str, what: str) -> None:
    """Refuse (IdentityMismatch) a message that names another device than the caller (an empty name: none)."""
    if claimed and claimed != caller:
        raise IdentityMismatch(f"{what} for {claimed!r} from {caller!r}")
