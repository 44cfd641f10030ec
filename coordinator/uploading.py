"""Uploads: one update read from its stream, checked and summed, a bounded number at a time.

What takes CPU per upload (checksum, checks, adding the delta to the round's sum) runs in a
small thread pool, where hashing and numpy release the GIL, so the event loop keeps serving
meanwhile; when only a few uploads are in progress and each is small, it runs on the loop
itself (INLINE_UPLOADS). At most UPLOADS_AT_ONCE updates are being read (agents send them in
pieces of proto.tensors.UPLOAD_CHUNK_BYTES, so a stream waiting for its turn holds little);
each turn is handed back after UPLOAD_TURN_S even if its transfer goes on
(coordinator.turns.Turn), so a stalled device cannot hold the others up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from concurrent import futures

from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire

from coordinator.callers import same_device
from coordinator.engine import RoundEngine
from coordinator.turns import Turn
from edge_agent.memory import release_freed
from flexfl.errors import IdentityMismatch, UpdateRejected, WrongRoundState
from flexfl.exchange import UpdateReport
from flexfl.vocabulary import AGENT_REASONS, StopReason

log = logging.getLogger(__name__)

# An upload's CPU work was ~0.6 ms for the 0.8 MB MNIST MLP with SHA-256, less with CRC-32.
# Handing it to a work thread and back costs about as much (future chaining, a self-pipe wake-up, the GIL),
# and with few devices that hop sits on the round's critical path: a 5-agent round took
# ~12 % longer through the pool (A/B, interleaved). With up to INLINE_UPLOADS uploads in
# progress and none above INLINE_MAX_BYTES the loop does the work itself, stalling other
# calls for at most a few ms; a busier server uses the pool, where the work runs in parallel.
INLINE_UPLOADS = 8
INLINE_MAX_BYTES = 4 << 20
# A large upload reaches the coordinator in many small blocks that gRPC's threads allocate and free
# once read; glibc keeps freed blocks in the allocating thread's arena, to reuse. After 100
# refused 63 MiB uploads (five at a time) 40-390 MiB of them stayed resident, the more the busier
# the machine (gRPC buffers more while the loop lags), and malloc_trim brought the coordinator
# back to where it started (benchmarks/refused_uploads.py). A refused upload of this size has no
# steady state to reuse them for: refusing it hands them back (edge_agent.memory.release_freed, as
# agents do after each round), on a work thread: one pass over the arenas, 0.4 ms with little
# to return, ~90 ms for 540 MiB on this 2-core box.
TRIM_AFTER_BYTES = 8 << 20
# At most this many updates are read at once; the others wait their turn, their pieces held back
# by gRPC's flow control. Together with the agents' 256 KiB pieces this took the peak with 1,000
# light agents from joined + 1.8 GiB to joined + 0.8-0.9 GiB (proto/tensors.py, UPLOAD_CHUNK_BYTES,
# has the figures). 256 rather than 64: peak 1,097-1,153 against 1,195-1,220 MiB, rounds 0.99x
# (6 interleaved runs each at 1,000 agents).
UPLOADS_AT_ONCE = 256
# ... and an upload gives its turn back after this long even if it is still arriving: a 0.8 MB
# update takes ~0.6 s at 10 Mbit/s; a device slower than that, or one that stalls, lets the
# next in while its own upload goes on.
UPLOAD_TURN_S = 5.0


class Uploads:
    """The uploads of one server (their counting and turns touched on the event loop's thread only)."""

    def __init__(self, engine: RoundEngine, *, max_update_bytes: int, work: futures.Executor) -> None:
        self.engine = engine
        self.max_update_bytes = max_update_bytes
        self._work = work  # uploads' checksums, checks and summing, off the event loop
        self._uploading = asyncio.Semaphore(UPLOADS_AT_ONCE)  # turns to have an update read
        self._uploads = 0  # uploads past their header check

    def refused(self, caller: str, round_id: int, exc: Exception) -> Exception:
        """Log a refusal of `caller`'s update for round `round_id` and keep it in the round's row; returns `exc`."""
        # The text, not the exception: a log record that keeps the exception keeps its traceback's
        # frames and the upload they hold (pytest's log capture does).
        log.log(logging.INFO if isinstance(exc, WrongRoundState) else logging.WARNING, "refused an update from %s: %s",
                caller, str(exc))
        self.engine.note_rejection(caller, round_id, str(exc))
        return exc

    async def take(self, caller: str, first: pb.UpdateChunk, rest: AsyncIterator[pb.UpdateChunk], *,
                   to_end: bool) -> pb.PushReply:
        """Receive, check and sum one update whose header is `first`; its data follows in `rest`.

        to_end: the data runs to the end of the stream (PushUpdate); else it is exactly the
        declared payload (Session, where the stream goes on).
        """
        header = first.header
        buffer = None
        try:
            same_device(caller, header.device_id, "update header")
            report = UpdateReport(round_id=header.round_id, updates_completed=header.updates_completed,
                                  samples_used=header.samples_used, train_s=header.train_s,
                                  local_loss=header.local_loss, previous_upload_s=header.previous_upload_s,
                                  stop_reason=stop_reason(header.stop_reason), resident_bytes=header.resident_bytes)
            self.engine.check_update(caller, report)
            declared = header.payload.total_bytes
            if declared > self.max_update_bytes:
                raise UpdateRejected(f"payload of {declared} bytes exceeds the limit of {self.max_update_bytes}")
            async with Turn(self._uploading, hold_s=UPLOAD_TURN_S):
                buffer = wire.PayloadBuffer(declared)
                self._uploads += 1
                try:
                    message_bytes = await _receive(buffer, first.ByteSize(), rest, to_end=to_end)
                    push = functools.partial(self._push, caller, report, header.payload, buffer.data(),
                                             message_bytes=message_bytes)
                    if self._uploads <= INLINE_UPLOADS and declared <= INLINE_MAX_BYTES:
                        return push()
                    return await asyncio.get_running_loop().run_in_executor(self._work, push)
                finally:
                    self._uploads -= 1
        except (UpdateRejected, IdentityMismatch) as exc:
            self.refused(caller, header.round_id, exc)
            if buffer is not None and buffer.received_bytes >= TRIM_AFTER_BYTES:
                await asyncio.get_running_loop().run_in_executor(self._work, release_freed)
            raise

    def _push(self, caller: str, report: UpdateReport, payload: pb.Payload, data: memoryview, *,
              message_bytes: int) -> pb.PushReply:
        """On a work thread (or the loop: INLINE_UPLOADS): decode and check the delta, sum the update."""
        if payload.total_bytes == 0 and (report.updates_completed == 0 or not payload.tensors):
            delta = {}  # s = 0 needs no delta; s > 0 without one is refused by the engine, which says so
        else:
            delta = wire.decode(payload, data, expected=self.engine.expected)  # views of `data`, checked
        accepted = self.engine.push(caller, report, delta, bytes_in=message_bytes)
        return pb.PushReply(round_id=accepted.round_id, accepted=True, message=accepted.message)


async def _receive(buffer: wire.PayloadBuffer, first_bytes: int, rest: AsyncIterator[pb.UpdateChunk], *,
                   to_end: bool) -> int:
    """Fill `buffer` with the payload, refused as soon as it exceeds its declared size; returns the
    protobuf bytes of the messages, `first_bytes` (the header's) included.

    to_end: read to the end of the stream; else exactly the declared size.
    """
    declared, message_bytes = buffer.declared_bytes, first_bytes
    while to_end or buffer.received_bytes < declared:
        chunk = await anext(rest, None)
        if chunk is None:
            if to_end:
                break
            raise UpdateRejected(f"the stream ended after {buffer.received_bytes} of the update's {declared} bytes")
        if chunk.WhichOneof("kind") not in ("data", None):
            raise UpdateRejected(f"a {kind(chunk)} message arrived inside the update's data")
        buffer.add(chunk.data)
        message_bytes += chunk.ByteSize()
    return message_bytes


def stop_reason(value: int) -> StopReason:
    """An update header's stop_reason as the agent's StopReason (fleet.proto names each value after its member).

    Unset (an older agent), a coordinator-side reason or a number this coordinator does not
    know (a newer agent) is UNKNOWN: the update is taken, its reason is not claimed.
    """
    name = pb.StopReason.Name(value).removeprefix("STOP_REASON_") if value in pb.StopReason.values() else ""
    reason = StopReason.__members__.get(name)
    return reason if reason in AGENT_REASONS else StopReason.UNKNOWN


def kind(message: pb.UpdateChunk) -> str:
    """What an update-stream message is, for errors: 'header', 'data', 'pull' or 'empty'."""
    return message.WhichOneof("kind") or "empty"
