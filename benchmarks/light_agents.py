"""Many light no-training agents in one process: asyncio with grpc.aio, one channel (TCP connection) each.

    python -m benchmarks.light_agents --coordinator 127.0.0.1:PORT --token-file TOKEN --first 0 --count 250

Each agent joins with its shard index, then takes rounds on one Session stream, as the edge
agent does (--per-round-rpcs: a PullRound and a PushUpdate call per round, as agents before
Session did): read the model, check it (wire.decode: size, checksum, finite values), answer
s = E with a zero delta of the model's size, as the edge agent's no_train mode does, without
loading data, torch or a trainer. The zero delta is encoded once per process
(--encode-every-round: every round). That is what lets one 2-core box hold a thousand of
them beside the coordinator. Exits when the coordinator says FINISHED; the exit code is the
number of agents that failed (0: all finished).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, GRPC_OPTIONS, PROTOCOL_VERSION

log = logging.getLogger("benchmarks.light_agents")

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Answer:
    """A no-training agent's answer: check the model as every agent must (sizes, checksum, finite
    values), then a zero delta of its size. The zero delta is the same every round, so it is
    encoded once per model layout unless `every_round` (then it costs what a trained one would)."""

    def __init__(self, *, every_round: bool) -> None:
        self.every_round = every_round
        self._encoded: dict[bytes, tuple[pb.Payload, tuple[pb.UpdateChunk, ...]]] = {}

    def __call__(self, header: pb.RoundHeader, pieces: list[bytes]) -> tuple[pb.Payload, tuple[pb.UpdateChunk, ...]]:
        """The delta's description and its data messages."""
        model = wire.decode(header.payload, wire.join(pieces, limit_bytes=header.payload.total_bytes))
        layout = b"".join(t.SerializeToString() for t in header.payload.tensors)
        if self.every_round or layout not in self._encoded:
            payload, body = wire.encode({name: np.zeros_like(v) for name, v in model.items()})
            self._encoded[layout] = payload, tuple(pb.UpdateChunk(data=piece)
                                                     for piece in wire.chunks(body, size=wire.UPLOAD_CHUNK_BYTES))
        return self._encoded[layout]


async def _answer(device_id: str, header: pb.RoundHeader, pieces: list[bytes],
                  answer: Answer) -> tuple[pb.UpdateChunk, ...]:
    """The messages of the answer to a round: the update's header, then its data."""
    # Checksums and copies release the GIL: off the event loop, they use the other core.
    payload, data_messages = await asyncio.to_thread(answer, header, pieces)
    update = pb.UpdateHeader(device_id=device_id, round_id=header.round_id,
                             updates_completed=header.required_updates, payload=payload)
    return (pb.UpdateChunk(header=update), *data_messages)


async def _session(stub: pb_grpc.FleetStub, md: tuple, device_id: str, pull_wait_s: float,
                   answer: Answer) -> AsyncIterator[int]:
    """Rounds on one Session stream, as the edge agent takes them; yields each round answered."""
    call = stub.Session(metadata=md)
    try:
        await call.write(pb.UpdateChunk(pull=pb.PullRequest(device_id=device_id, wait_s=pull_wait_s)))
        while True:
            header = (await _read(call, "header")).header
            if header.status == pb.RoundHeader.FINISHED:
                return
            if header.status != pb.RoundHeader.ROUND:
                continue
            pieces, received = [], 0
            while received < header.payload.total_bytes:
                pieces.append((await _read(call, "data")).data)
                received += len(pieces[-1])
            for message in await _answer(device_id, header, pieces, answer):
                await call.write(message)
            await _read(call, "reply")
            yield header.round_id
    finally:
        call.cancel()


async def _read(call: grpc.aio.StreamStreamCall, kind: str) -> pb.RoundChunk:
    message = await call.read()
    got = "the end of the stream" if message is grpc.aio.EOF else message.WhichOneof("kind")
    if got != kind:
        raise RuntimeError(f"session: expected a {kind} message, got {got}")
    return message


async def _per_round_calls(stub: pb_grpc.FleetStub, md: tuple, device_id: str, pull_wait_s: float,
                           answer: Answer) -> AsyncIterator[int]:
    """Rounds through a PullRound and a PushUpdate call each (agents before Session); yields each round answered."""
    while True:
        call = stub.PullRound(pb.PullRequest(device_id=device_id, wait_s=pull_wait_s), metadata=md,
                              timeout=pull_wait_s + 30)
        header, pieces = None, []
        async for chunk in call:
            if header is None:
                header = chunk.header
                if header.status != pb.RoundHeader.ROUND:
                    call.cancel()
                    break
            else:
                pieces.append(chunk.data)
        if header is None or header.status == pb.RoundHeader.WAIT:
            continue
        if header.status == pb.RoundHeader.FINISHED:
            return
        await stub.PushUpdate(iter(await _answer(device_id, header, pieces, answer)), metadata=md, timeout=60)
        yield header.round_id


async def agent(address: str, token: str, device_id: str, shard_index: int, *, pull_wait_s: float,
                shared: grpc.aio.Channel | None, answer: Answer, per_round_rpcs: bool = False) -> int:
    """One agent until FINISHED; returns the rounds it answered."""
    # A local subchannel pool gives every agent its own TCP connection, as separate devices have.
    channel = shared or grpc.aio.insecure_channel(address,
                                                  options=[*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
    stub = pb_grpc.FleetStub(channel)
    md = ((AUTH_HEADER, f"Bearer {token}"), (DEVICE_HEADER, device_id))
    answered = 0
    try:
        for attempt in range(100):
            try:
                join = pb.JoinRequest(device_id=device_id, shard_index=shard_index, protocol_version=PROTOCOL_VERSION)
                await stub.Join(join, metadata=md, timeout=30)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or attempt == 99:
                    raise
                await asyncio.sleep(0.2)
        rounds = _per_round_calls(stub, md, device_id, pull_wait_s, answer) if per_round_rpcs else \
            _session(stub, md, device_id, pull_wait_s, answer)
        async for _ in rounds:
            answered += 1
        return answered
    finally:
        if shared is None:
            await channel.close()


async def run(args: argparse.Namespace) -> int:
    token = Path(args.token_file).read_text().strip()
    shared = (grpc.aio.insecure_channel(args.coordinator, options=GRPC_OPTIONS) if args.shared_connection else None)
    answer = Answer(every_round=args.encode_every_round)
    tasks = [asyncio.create_task(agent(args.coordinator, token, f"{args.prefix}{i}", i, pull_wait_s=args.pull_wait_s,
                                       shared=shared, answer=answer, per_round_rpcs=args.per_round_rpcs))
             for i in range(args.first, args.first + args.count)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [(i, r) for i, r in zip(range(args.first, args.first + args.count), results)
              if isinstance(r, BaseException)]
    for i, exc in failed[:5]:
        log.error("agent %s%d failed: %r", args.prefix, i, exc)
    if shared is not None:
        await shared.close()
    return len(failed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", required=True, help="HOST:PORT")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--first", type=int, default=0, help="shard index of the first agent")
    ap.add_argument("--count", type=int, required=True, help="agents in this process")
    ap.add_argument("--prefix", default="bench-", help="device ids are PREFIX + shard index")
    ap.add_argument("--pull-wait-s", type=float, default=30.0)
    ap.add_argument("--shared-connection", action="store_true", help="all agents of this process on one channel")
    ap.add_argument("--per-round-rpcs", action="store_true",
                    help="a PullRound and a PushUpdate call per round instead of one Session stream (older agents)")
    ap.add_argument("--encode-every-round", action="store_true",
                    help="encode the zero delta every round (checksum and copies, as a trained delta costs)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(min(asyncio.run(run(args)), 125))


if __name__ == "__main__":
    main()
