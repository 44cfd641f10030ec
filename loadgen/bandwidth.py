"""Limit a link's egress rate with a root tc token-bucket (tbf) qdisc.

tbf shapes what leaves an interface; to limit a device's upload, shape the device's own
end of its link. Every call can run inside a network namespace (`ip netns exec NS tc ...`).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
from dataclasses import dataclass

from loadgen._run import failure, in_netns, run
from loadgen.errors import ShapingError
from loadgen.netns import is_valid_ifname

log = logging.getLogger(__name__)

MAX_RATE_KBIT = 100_000_000  # 100 Gbit/s: anything above is a typo
MIN_BURST_BYTES = 2 * 1514  # two full Ethernet frames: tbf drops packets larger than its bucket
BURST_WINDOW_S = 0.01  # default bucket holds 10 ms of traffic at the configured rate


@dataclass(frozen=True)
class TbfSettings:
    """What `set_rate` installed."""

    dev: str
    rate_kbit: int
    burst_bytes: int
    latency_ms: float
    netns: str | None = None


def default_burst_bytes(rate_kbit: int) -> int:
    """Bucket size for a rate: 10 ms of traffic, at least two full frames.

    The bucket must hold at least one packet or tbf drops it; it must also refill faster
    than the timer granularity, hence a time window (1/HZ at HZ=100) rather than a constant.
    A small bucket keeps short bursts close to the configured rate.
    """
    return max(math.ceil(rate_kbit * 1000 / 8 * BURST_WINDOW_S), MIN_BURST_BYTES)


def set_rate(
    dev: str,
    *,
    rate_kbit: int,
    burst_bytes: int | None = None,
    latency_ms: float = 50,
    netns: str | None = None,
) -> TbfSettings:
    """Install (or replace) a root tbf qdisc on `dev` limiting its egress to `rate_kbit`.

    kbit is 1000 bit/s, as in tc. `latency_ms` bounds how long a packet may wait in the
    queue before tbf drops it.
    """
    _check_dev(dev)
    if isinstance(rate_kbit, bool) or not isinstance(rate_kbit, int) or not 0 < rate_kbit <= MAX_RATE_KBIT:
        raise ShapingError(f"rate_kbit must be an integer in [1, {MAX_RATE_KBIT}], got {rate_kbit!r}")
    if burst_bytes is None:
        burst_bytes = default_burst_bytes(rate_kbit)
    elif isinstance(burst_bytes, bool) or not isinstance(burst_bytes, int) or burst_bytes < MIN_BURST_BYTES:
        raise ShapingError(f"burst_bytes must be an integer >= {MIN_BURST_BYTES}, got {burst_bytes!r}")
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)) \
            or not math.isfinite(latency_ms) or not 0 < latency_ms <= 60_000:
        raise ShapingError(f"latency_ms must be in (0, 60000], got {latency_ms!r}")
    argv = in_netns(
        ["tc", "qdisc", "replace", "dev", dev, "root", "tbf",
         "rate", f"{rate_kbit}kbit", "burst", str(burst_bytes), "latency", f"{latency_ms:g}ms"],
        netns,
    )
    if _shrinks_a_bucket(dev, netns=netns, burst_bytes=burst_bytes):
        # tbf keeps what it queued under the old bucket, and a queued segment larger than the new one
        # (GSO: up to 64 kB) never gathers its tokens: the link stalls for good (a TCP transfer did, going
        # from 100 to 8 Mbit/s: tests/netns/test_bandwidth.py). Flushed first, the queue's packets are
        # dropped (TCP sends them again) and the link is unshaped for the few ms until the replace.
        clear(dev, netns=netns)
    _tc(argv, dev=dev, netns=netns)
    settings = TbfSettings(dev, rate_kbit, burst_bytes, float(latency_ms), netns)
    log.info("tbf on %s%s: %d kbit/s, burst %d B, latency %g ms",
             dev, f" (netns {netns})" if netns else "", rate_kbit, burst_bytes, latency_ms)
    return settings


def _shrinks_a_bucket(dev: str, *, netns: str | None, burst_bytes: int) -> bool:
    """Whether `dev`'s root qdisc is a tbf with a bucket larger than `burst_bytes` (whatever it holds now: a
    queue read empty may fill before the change). Unreadable (no such device, no permission) counts as no:
    the replace that follows says why."""
    proc = run(in_netns(["tc", "-j", "qdisc", "show", "dev", dev], netns), error=ShapingError, check=False)
    try:
        qdiscs = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
    except json.JSONDecodeError:
        return False
    root = next((q for q in qdiscs if isinstance(q, dict) and q.get("root")), None)
    return root is not None and root.get("kind") == "tbf" and root.get("options", {}).get("burst", 0) > burst_bytes


def clear(dev: str, *, netns: str | None = None) -> bool:
    """Remove `dev`'s root qdisc (the kernel's default comes back); True if one was removed.

    Idempotent: a device with only its default qdisc is left as it is.
    """
    _check_dev(dev)
    argv = in_netns(["tc", "qdisc", "del", "dev", dev, "root"], netns)
    proc = run(argv, error=ShapingError, check=False)
    if proc.returncode == 0:
        log.info("removed root qdisc of %s%s", dev, f" (netns {netns})" if netns else "")
        return True
    # Older kernels say "No such file or directory", newer "handle of zero".
    missing_ns = "network namespace" in proc.stderr
    if "handle of zero" in proc.stderr or ("No such file or directory" in proc.stderr and not missing_ns):
        return False
    raise _classify(proc, dev=dev, netns=netns)


def show(dev: str, *, netns: str | None = None) -> dict:
    """The root qdisc of `dev` as a dict.

    Keys: `dev`, `netns`, `kind` (e.g. "tbf", "noqueue", or None), `tbf` ({rate_kbit,
    burst_bytes, latency_ms} when kind is tbf, else None) and `qdiscs` (tc's own JSON list).
    """
    _check_dev(dev)
    proc = _tc(in_netns(["tc", "-j", "qdisc", "show", "dev", dev], netns), dev=dev, netns=netns)
    try:
        qdiscs = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as exc:
        raise ShapingError(f"cannot parse `tc -j qdisc show dev {dev}` output: {exc}") from exc
    root = next((q for q in qdiscs if q.get("root")), None)
    tbf = None
    if root is not None and root.get("kind") == "tbf":
        opts = root.get("options", {})
        tbf = {
            "rate_kbit": round(opts.get("rate", 0) * 8 / 1000),  # tc reports bytes/s
            "burst_bytes": opts.get("burst"),
            "latency_ms": opts["lat"] / 1000 if "lat" in opts else None,  # tc reports us
        }
    return {"dev": dev, "netns": netns, "kind": root.get("kind") if root else None,
            "tbf": tbf, "qdiscs": qdiscs}


def _check_dev(dev: str) -> None:
    if not is_valid_ifname(dev):
        raise ShapingError(f"bad interface name {dev!r} (1-15 characters, no '/', ':' or spaces)")


def _tc(argv: list[str], *, dev: str, netns: str | None) -> subprocess.CompletedProcess[str]:
    proc = run(argv, error=ShapingError, check=False)
    if proc.returncode != 0:
        raise _classify(proc, dev=dev, netns=netns)
    return proc


def _classify(proc: subprocess.CompletedProcess[str], *, dev: str, netns: str | None) -> ShapingError:
    """Turn tc's stderr into an error that says what to fix."""
    err = proc.stderr
    where = f" in network namespace {netns!r}" if netns else ""
    if "Cannot open network namespace" in err:
        hint = f"no such network namespace {netns!r}"
    elif "Cannot find device" in err:
        hint = f"no such interface {dev!r}{where}"
    elif "Operation not permitted" in err or "Permission denied" in err:
        hint = f"changing qdiscs on {dev!r} needs root or CAP_NET_ADMIN"
    elif "kind is unknown" in err or "Unknown qdisc" in err:
        hint = "the kernel lacks the tbf qdisc (module sch_tbf; try `modprobe sch_tbf`)"
    else:
        hint = f"tc failed on {dev!r}{where}"
    return failure(ShapingError, proc, hint=hint)
