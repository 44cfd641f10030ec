"""Benchmark: the coordinator's memory while one device's large uploads are refused.

    python -m benchmarks.refused_uploads                      # 100 refused 63 MiB uploads, five at a time
    python -m benchmarks.refused_uploads --uploads 20 --mib 3.5 --limit-mib 4

A real coordinator process (`flexfl coordinator`, through loadgen.harness) on loopback with
one round open for a long time. One authenticated device joins, receives the model, then
sends --uploads updates of --mib MiB each whose checksum is wrong, --parallel at a time: the
coordinator receives every one in full (it is under the server.max_update_mib limit), then
refuses it with INVALID_ARGUMENT. The coordinator's resident memory (RSS) is printed before
the first upload and after each group of uploads; then, once the last refusal is in, it is
sampled until it is within the goal (or --settle-s have passed): after <= start + 2 x the
upload limit (what the uploads in flight at once take, not every refused one). What stays
resident then is the C allocator's working set (freed 1 MiB message buffers of gRPC and
Python), which does not grow with the number of refusals.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, GRPC_OPTIONS, PROTOCOL_VERSION

from benchmarks.report import Output, machine
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from flexfl.config import write_config
from flexfl.files import atomic_file
from loadgen.harness import Harness, free_port
from workloads.partition_spec import PartitionSpec

TOKEN = "refused-uploads-bench"
DEVICE = "big-sender"
REFUSED = "INVALID_ARGUMENT: payload checksum (CRC-32) mismatch: the transfer was corrupted"


@dataclass(frozen=True)
class Figures:
    limit_mib: float
    upload_mib: float
    start_mib: float  # coordinator RSS after the device received the model, before any upload
    after_mib: list[tuple[int, float]]  # (uploads refused so far, RSS) after each group
    settled_mib: float  # RSS once within the bound after the last group, or when settle_s ran out
    settled_s: float  # how long after the last group that was
    outcomes: dict[str, int]  # "CODE: details" -> uploads that ended so

    @property
    def as_planned(self) -> bool:
        """Every upload was received in full and refused for its checksum (else the figures measure something else)."""
        return set(self.outcomes) == {REFUSED}

    @property
    def bound_mib(self) -> float:
        return self.start_mib + 2 * self.limit_mib


def _config(tmp: Path, *, limit_mib: float) -> tuple[Path, str]:
    with atomic_file(tmp / "token", perms=0o600) as f:
        f.write(TOKEN)
    address = f"127.0.0.1:{free_port()}"
    cfg = CoordinatorConfig(
        server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token"), max_update_mib=limit_mib),
        partition=PartitionSpec(n_devices=2, total_samples=400),
        # One round, open (and the device's deadline running) for as long as the uploads take.
        run=RunConfig(rounds=1, deadline_s=3600.0, min_devices=1, evaluate=False),
        output=OutputConfig(dir=str(tmp / "out")))
    return write_config(tmp / "coordinator.toml", cfg, header="benchmarks.refused_uploads"), address


def _corrupt_update(round_id: int, nbytes: int) -> tuple[pb.UpdateHeader, bytes]:
    """An update of `nbytes` whose description is right but whose checksum is not (refused after receipt)."""
    data = bytes(nbytes)
    payload = pb.Payload(tensors=[pb.TensorSpec(name="w", shape=[nbytes // 4], dtype=pb.FLOAT32, nbytes=nbytes)],
                         total_bytes=nbytes, crc32=zlib.crc32(b"not the data"))
    return pb.UpdateHeader(device_id=DEVICE, round_id=round_id, updates_completed=1, payload=payload), data


def run(*, uploads: int = 100, parallel: int = 5, upload_mib: float = 63.0, limit_mib: float = 64.0,
        every: int = 20, settle_s: float = 5.0, log=print) -> Figures:
    """Start a coordinator, refuse `uploads` corrupt uploads of `upload_mib` MiB; its RSS along the way."""
    nbytes = int(upload_mib * 2**20) // 4 * 4
    with tempfile.TemporaryDirectory(prefix="flexfl-refused-") as d, Harness(Path(d)) as harness:
        config, address = _config(Path(d), limit_mib=limit_mib)
        coordinator = harness.start_coordinator(config, address=address, token=TOKEN)
        harness.wait_ready()
        proc = psutil.Process(coordinator.proc.pid)
        channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        stub = pb_grpc.FleetStub(channel)
        md = ((AUTH_HEADER, f"Bearer {TOKEN}"), (DEVICE_HEADER, DEVICE))
        try:
            stub.Join(pb.JoinRequest(device_id=DEVICE, sample_count=100, protocol_version=PROTOCOL_VERSION),
                      metadata=md, timeout=30)
            header = None
            while header is None or header.status != pb.RoundHeader.ROUND:
                # Read to the end: the model counts as delivered (and the deadline runs) once it is all sent.
                # The whole stream is read, not its first message: the coordinator counts the model as
                # delivered only once every chunk has gone out, and refuses uploads before that.
                pulled = list(stub.PullRound(pb.PullRequest(device_id=DEVICE, wait_s=5), metadata=md, timeout=60))
                header = pulled[0].header
            update, data = _corrupt_update(header.round_id, nbytes)

            def push(_: int) -> str:
                def messages():
                    yield pb.UpdateChunk(header=update)
                    for piece in wire.chunks(data):
                        yield pb.UpdateChunk(data=piece)
                try:
                    stub.PushUpdate(messages(), metadata=md, timeout=600)
                    return "OK"
                except grpc.RpcError as exc:
                    return f"{exc.code().name}: {exc.details()}"

            def rss_mib() -> float:
                return proc.memory_info().rss / 2**20

            start = rss_mib()
            log(f"coordinator RSS before the first upload: {start:.0f} MiB")
            after, outcomes, done = [], {}, 0
            t0 = time.monotonic()
            with futures.ThreadPoolExecutor(parallel) as pool:
                while done < uploads:
                    group = min(every, uploads - done)
                    for outcome in pool.map(push, range(group)):
                        outcomes[outcome] = outcomes.get(outcome, 0) + 1
                    done += group
                    after.append((done, rss_mib()))
                    log(f"  after {done:4d} refused uploads: {after[-1][1]:6.0f} MiB ({time.monotonic() - t0:.0f} s)")
            # The last calls' buffers are released a moment after their status reaches this process.
            t1 = time.monotonic()
            settled = rss_mib()
            while settled > start + 2 * limit_mib and time.monotonic() - t1 < settle_s:
                time.sleep(0.05)
                settled = rss_mib()
            settled_s = time.monotonic() - t1
        finally:
            channel.close()
    return Figures(limit_mib=limit_mib, upload_mib=nbytes / 2**20, start_mib=start, after_mib=after,
                   settled_mib=settled, settled_s=settled_s, outcomes=outcomes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=5, help="uploads in flight at once")
    ap.add_argument("--mib", type=float, default=63.0, help="size of each upload")
    ap.add_argument("--limit-mib", type=float, default=64.0, help="server.max_update_mib (default: the default)")
    ap.add_argument("--every", type=int, default=20, help="print the RSS after this many uploads")
    ap.add_argument("--settle-s", type=float, default=5.0, help="longest wait for the RSS to come within the goal")
    args = ap.parse_args()
    say = Output()
    say(f"refused uploads: {args.uploads} uploads of {args.mib:g} MiB with a wrong checksum, {args.parallel} at a "
        f"time, upload limit {args.limit_mib:g} MiB; {machine()}")
    f = run(uploads=args.uploads, parallel=args.parallel, upload_mib=args.mib, limit_mib=args.limit_mib,
            every=args.every, settle_s=args.settle_s, log=say)
    say("outcomes: " + "; ".join(f"{n} x {outcome}" for outcome, n in f.outcomes.items()))
    if not f.as_planned:
        say(f"NOT the scenario: every upload should end with {REFUSED!r}; the figures below measure something else")
    say(f"coordinator RSS: start {f.start_mib:.0f} MiB, after {f.after_mib[-1][0]} refused uploads "
        f"{f.after_mib[-1][1]:.0f} MiB, {f.settled_s:.1f} s later {f.settled_mib:.0f} MiB "
        f"(+{f.settled_mib - f.start_mib:.0f}); goal <= start + 2 x {f.limit_mib:g} = {f.bound_mib:.0f} MiB: "
        f"{'met' if f.as_planned and f.settled_mib <= f.bound_mib else 'NOT met'}")


if __name__ == "__main__":
    main()
