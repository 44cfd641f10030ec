"""Offers: a device's next round as wire messages, waited for without a thread, sent a bounded few at a time.

A pull parked until its device's next round holds a coroutine and a callback in the engine
(RoundEngine.offer), not a thread, so a thousand long polls cost little. A round's model
goes to every device as the same bytes: its data messages are serialised once per round
(encode_model), and the server's response serializers pass bytes through
(coordinator.server.add_servicer); gRPC would otherwise serialise the model afresh for every
stream. At most OFFERS_AT_ONCE streams are being sent the model at any moment; each turn is
handed back after OFFER_TURN_S even if its transfer goes on (coordinator.turns.Turn).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent import futures
from dataclasses import asdict

from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire

from coordinator.engine import RoundEngine
from coordinator.turns import Turn
from flexfl.exchange import OfferStatus, RoundOffer, RoundTerms

# At most this many streams are sent a round's model at once; the others wait their turn. With all of
# a thousand offers in flight together the coordinator's RSS rose by ~1.5 MB per stream while they
# were written (sampled every 10 ms; most of it in gRPC core, not Python objects). Measured with
# 1,000 light agents on this 2-core machine (interleaved with the code before): peak 3.0-3.3 GiB ->
# 2.0-2.4 with the model serialised once and 64 offers at a time, rounds no slower (3.9 -> 3.0 s).
# A lab fleet (5-50 devices) never waits here.
OFFERS_AT_ONCE = 64
# ... and an offer gives its turn back after this long even if it is still being written. On loopback
# gRPC accepted a whole 0.8 MB model for a device that read nothing, so an MNIST offer never holds
# its turn that long; a model larger than the peer's flow-control window and socket buffers would,
# for as long as its device stalls (until keepalive declares a dead link, ~40 s).
OFFER_TURN_S = 5.0

_STATUS = {OfferStatus.ROUND: pb.RoundHeader.ROUND, OfferStatus.WAIT: pb.RoundHeader.WAIT,
           OfferStatus.FINISHED: pb.RoundHeader.FINISHED}


class Offers:
    """The offers of one server (touched on the event loop's thread only)."""

    def __init__(self, engine: RoundEngine, *, pull_wait_s: float, work: futures.Executor) -> None:
        self.engine = engine
        self.pull_wait_s = pull_wait_s  # server.pull_wait_s: the longest a pull is held before WAIT
        self._work = work  # encoding the round's model, off the event loop
        self._offering = asyncio.Semaphore(OFFERS_AT_ONCE)  # turns to be sent a model
        self._encoded: tuple[int, asyncio.Future] | None = None  # (round, its model's messages), see _model

    async def pull(self, caller: str, *, wait_s: float) -> tuple[pb.RoundHeader, tuple[bytes, ...]]:
        """The device's next round (header, the model's data messages), waiting up to wait_s."""
        offer = await self._next_offer(caller, wait_s=wait_s)
        if offer.terms is None:
            return pb.RoundHeader(status=_STATUS[offer.status], round_id=offer.round_id), ()
        t = offer.terms
        payload, chunks = await self._model(offer.round_id, t)
        return pb.RoundHeader(
            status=_STATUS[offer.status], round_id=offer.round_id, required_updates=t.required_updates,
            learning_rate=t.learning_rate, batch_size=t.batch_size, deadline_s=t.deadline_s,
            model=pb.ModelDescription(**asdict(t.model)), payload=payload, seed=t.seed, unit=t.unit,
            device_index=t.device_index, trace_sampling=t.trace_sampling, s_rule=t.s_rule, proximal_mu=t.proximal_mu,
        ), chunks

    async def send(self, caller: str, header: pb.RoundHeader,
                   chunks: tuple[bytes, ...]) -> AsyncIterator[pb.RoundChunk | bytes]:
        """The messages of one offer: the header, then (a round) the model, which then counts as delivered."""
        first = pb.RoundChunk(header=header)
        yield first
        if header.status != pb.RoundHeader.ROUND:
            return
        sent = first.ByteSize()  # protobuf message bytes: header + chunks (HTTP/2 framing not counted)
        async with Turn(self._offering, hold_s=OFFER_TURN_S):
            for chunk in chunks:  # serialised RoundChunk messages, the same bytes for every device of the round
                yield chunk
                sent += len(chunk)
        # Reached once gRPC asked for more after the last chunk: the model is on its way.
        self.engine.delivered(caller, header.round_id, sent)

    async def _model(self, round_id: int, terms: RoundTerms) -> tuple[pb.Payload, tuple[bytes, ...]]:
        """The round's model: its payload description and data messages, the same for every device of
        the round, encoded once (on a work thread: checksumming a large model would stall the loop)."""
        if self._encoded is None or self._encoded[0] != round_id:
            encoding = asyncio.get_running_loop().run_in_executor(self._work, encode_model, terms.params)
            self._encoded = (round_id, encoding)
        return await asyncio.shield(self._encoded[1])  # one cancelled pull does not cancel the others' encoding

    async def _next_offer(self, caller: str, *, wait_s: float) -> RoundOffer:
        """The engine's offer to the device, waiting (parked in the engine, no thread held) up to wait_s."""
        loop = asyncio.get_running_loop()
        limit = loop.time() + max(0.0, min(wait_s, self.pull_wait_s))
        while True:
            woken = asyncio.Event()

            def wake() -> None:  # called by the engine under its lock, from another thread
                try:
                    # B023: the loop variable is read when the engine calls wake; kept as it was, since
                    # whether a wake can outlive its turn (ParkedPulls) is not settled here.
                    loop.call_soon_threadsafe(woken.set)  # noqa: B023
                except RuntimeError:  # the loop has closed: the server is gone, nobody waits
                    pass

            offered = self.engine.offer(caller, wake=wake)
            if offered is not None:
                return offered
            try:
                await asyncio.wait_for(woken.wait(), timeout=max(0.0, limit - loop.time()))
            except TimeoutError:
                return self.engine.waiting_reply()
            finally:
                self.engine.unpark(caller, wake)


def encode_model(params) -> tuple[pb.Payload, tuple[bytes, ...]]:
    """The model's payload description and its data messages, each a serialised RoundChunk.

    With a SHA-256 beside the CRC-32 for agents before protocol 3 (one hash per round)."""
    payload, data = wire.encode(params, sha256=True)
    return payload, tuple(pb.RoundChunk(data=piece).SerializeToString() for piece in wire.chunks(data))
