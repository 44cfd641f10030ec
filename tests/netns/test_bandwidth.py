"""A TCP transfer between two namespaces through a tbf qdisc runs at the configured rate."""

import json
import subprocess
import sys

import pytest

from loadgen import bandwidth, netns
from loadgen.errors import ShapingError

RATE_KBIT = 4000
SHAPED_BYTES = 1_750_000  # 3.5 s at 4 Mbit/s
UNSHAPED_BYTES = 20_000_000

# Receiver: print the port, take one connection, time first to last byte. Rate counts the
# bytes after the first chunk, which arrived before the clock started.
_RECEIVER = """
import json, socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
srv.settimeout(30)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(30)
total, first_len, first_t, last_t = 0, 0, None, None
while True:
    data = conn.recv(1 << 16)
    if not data:
        break
    now = time.monotonic()
    if first_t is None:
        first_t, first_len = now, len(data)
    total, last_t = total + len(data), now
print(json.dumps({"bytes": total, "timed_bytes": total - first_len, "seconds": last_t - first_t}))
"""

_SENDER = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
sock.sendall(b"x" * int(sys.argv[3]))
sock.shutdown(socket.SHUT_WR)
sock.close()
"""


@pytest.fixture
def link(namespaces):
    """Sender and receiver namespaces joined by a veth pair: (sender ns, sender dev, receiver ns)."""
    tx, rx = namespaces.create("s"), namespaces.create("r")
    dev = namespaces.name("s")  # the veth end in the sender's namespace
    netns.add_veth(dev, namespaces.name("r"), netns=tx, peer_netns=rx,
                   address="10.123.1.1/24", peer_address="10.123.1.2/24")
    return tx, dev, rx


def transfer_kbit(processes, tx: str, rx: str, nbytes: int) -> float:
    """Payload rate in kbit/s (1000 bit/s) of one transfer, as the receiver saw it."""
    receiver = processes.start(netns.exec_argv(rx, [sys.executable, "-c", _RECEIVER, "10.123.1.2"]),
                               stdout=subprocess.PIPE, text=True)
    port = receiver.stdout.readline().strip()
    sender = processes.start(netns.exec_argv(tx, [sys.executable, "-c", _SENDER, "10.123.1.2", port,
                                                  str(nbytes)]))
    assert sender.wait(timeout=60) == 0
    result = json.loads(receiver.stdout.readline())
    assert receiver.wait(timeout=10) == 0
    assert result["bytes"] == nbytes
    return result["timed_bytes"] * 8 / 1000 / result["seconds"]


def test_tbf_limits_transfer_and_clear_restores_speed(link, processes):
    tx, dev, rx = link
    settings = bandwidth.set_rate(dev, rate_kbit=RATE_KBIT, netns=tx)
    shown = bandwidth.show(dev, netns=tx)
    assert shown["kind"] == "tbf"
    assert shown["tbf"] == {"rate_kbit": RATE_KBIT, "burst_bytes": settings.burst_bytes, "latency_ms": 50.0}

    shaped = transfer_kbit(processes, tx, rx, SHAPED_BYTES)
    print(f"shaped: {shaped:.0f} kbit/s = {100 * shaped / RATE_KBIT:.1f} % of {RATE_KBIT}")
    assert 0.80 * RATE_KBIT <= shaped <= 1.05 * RATE_KBIT

    assert bandwidth.clear(dev, netns=tx) is True
    assert bandwidth.clear(dev, netns=tx) is False  # idempotent
    assert bandwidth.show(dev, netns=tx)["kind"] != "tbf"
    unshaped = transfer_kbit(processes, tx, rx, UNSHAPED_BYTES)
    print(f"unshaped: {unshaped:.0f} kbit/s")
    assert unshaped > 3 * RATE_KBIT


def test_rate_change_replaces_the_qdisc(link):
    tx, dev, _ = link
    bandwidth.set_rate(dev, rate_kbit=1000, netns=tx)
    bandwidth.set_rate(dev, rate_kbit=8000, burst_bytes=20000, latency_ms=20, netns=tx)
    shown = bandwidth.show(dev, netns=tx)
    assert shown["tbf"] == {"rate_kbit": 8000, "burst_bytes": 20000, "latency_ms": 20.0}
    assert [q["kind"] for q in shown["qdiscs"] if q.get("root")] == ["tbf"]


# As _RECEIVER, and says "first" on its first byte, so that a test can change the link mid-transfer.
_FIRST_BYTE_RECEIVER = _RECEIVER.replace("first_t, first_len = now, len(data)",
                                         "first_t, first_len = now, len(data)\n        print('first', flush=True)")


def test_lowering_the_rate_mid_transfer_does_not_stall_it(link, processes):
    """tbf keeps the packets it queued under the old bucket: a queued TCP segment (GSO, up to 64 kB) larger than
    the new, smaller bucket can never gather its tokens, and the link stalled for good (a 0.8 MB transfer at
    100 -> 8 Mbit/s never finished). set_rate flushes the queue when the bucket shrinks; TCP resends."""
    tx, dev, rx = link
    bandwidth.set_rate(dev, rate_kbit=100_000, netns=tx)
    receiver = processes.start(netns.exec_argv(rx, [sys.executable, "-c", _FIRST_BYTE_RECEIVER, "10.123.1.2"]),
                               stdout=subprocess.PIPE, text=True)
    port = receiver.stdout.readline().strip()
    nbytes = 3_000_000  # 0.24 s at 100 Mbit/s, up to 3 s at 8 Mbit/s
    sender = processes.start(netns.exec_argv(tx, [sys.executable, "-c", _SENDER, "10.123.1.2", port, str(nbytes)]))
    assert receiver.stdout.readline().strip() == "first"
    bandwidth.set_rate(dev, rate_kbit=8000, netns=tx)
    assert bandwidth.show(dev, netns=tx)["tbf"]["rate_kbit"] == 8000
    assert sender.wait(timeout=60) == 0
    result = json.loads(receiver.stdout.readline())
    assert result["bytes"] == nbytes


def test_bad_interface_name_is_a_clear_error(link):
    tx, _, _ = link
    missing = f"{tx[:11]}zz"
    with pytest.raises(ShapingError, match=f"no such interface '{missing}' in network namespace '{tx}'"):
        bandwidth.set_rate(missing, rate_kbit=RATE_KBIT, netns=tx)
    with pytest.raises(ShapingError, match=f"no such interface '{missing}'"):
        bandwidth.clear(missing, netns=tx)
    with pytest.raises(ShapingError, match="no such network namespace"):
        bandwidth.show("lo", netns=f"{tx}-missing")


def test_netns_helpers_are_idempotent(namespaces):
    ns = namespaces.create("i")
    dev = namespaces.name("i")
    netns.add_veth(dev, f"{dev}p", netns=ns, peer_netns=ns)
    assert netns.link_exists(dev, netns=ns) and netns.link_exists(f"{dev}p", netns=ns)
    netns.set_link(dev, up=False, netns=ns)
    netns.delete_link(dev, netns=ns)
    assert not netns.link_exists(f"{dev}p", netns=ns)  # one end takes the other with it
    netns.delete_link(dev, netns=ns)
    netns.create_netns(ns, exist_ok=True)
    netns.delete_netns(ns)
    netns.delete_netns(ns)
    assert not netns.netns_exists(ns)
