"""`flexfl status` as a user types it, against a real coordinator and agents on loopback: plaintext and mutual TLS.

The command runs as a process; the coordinator and agents run in this one (conftest's Fleet).
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import write_config
from flexfl.vocabulary import AGENT_REASONS

from .conftest import TOKEN, free_port

# Each local update takes >= 0.1 s: a round of E = 5 lasts ~0.5 s, long enough for polls every 0.2 s to see it open.
SLOW = ParticipationConfig(min_update_s=0.1)


def _status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexfl.app.cli", "status", *args], capture_output=True, text=True,
                          timeout=60)


def _token(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / f"token-{len(list(tmp_path.glob('token-*')))}"
    path.write_text(token)
    return str(path)


def test_status_follows_a_run_to_its_end_and_shows_each_devices_round(live_config, fleet_factory, tmp_path, wait_for):
    fleet = fleet_factory(live_config(rounds=3, n_devices=2, min_devices=2))
    address, token = f"127.0.0.1:{fleet.port}", _token(tmp_path)
    watch = subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "status", address, "--token-file", token,
                              "--json", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        first = json.loads(watch.stdout.readline())  # no agent yet: the run has not started
        for i in range(2):
            fleet.start_agent(i, participation=SLOW)
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err  # it ends by itself once the run has finished
    docs = [first, *(json.loads(line) for line in out.splitlines())]
    assert (first["started"], first["devices"]) == (False, [])
    open_docs = [d for d in docs if d["open_round"]]
    assert open_docs, "no poll saw a round open"
    assert all(d["round_open_s"] >= 0 and d["round_closes_in_s"] >= 0 for d in open_docs)
    assert {dev["round_state"] for d in open_docs for dev in d["devices"]} & {"pending", "training", "answered"}
    final = docs[-1]
    assert (final["finished"], final["completed_round"], final["rounds"], final["required_updates"]) == (True, 3, 3, 5)
    assert sorted(d["device_id"] for d in final["devices"]) == ["dev-0", "dev-1"]  # in join order
    for dev in final["devices"]:
        last = dev["last_round"]
        assert (last["round_id"], last["s"], last["stop_reason"]) == (3, 5, "complete"), dev
        assert last["bytes_in"] > 0 and last["bytes_out"] > 0 and last["train_s"] >= 0.5
        assert dev["resident_bytes"] > 0 and dev["upload_bytes_per_s"] > 0 and dev["seen_ago_s"] >= 0

    # The same, once, as text (stdout is a pipe: no screen control), as a user reads it.
    shown = _status(address, "--token-file", token, "--once")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"coordinator {address} | run ") and lines[1] == "finished: 3 of 3 rounds"
    assert "\x1b" not in shown.stdout
    rows = {line.split()[0]: line.split() for line in lines[3:5]}
    assert rows["dev-0"][3:6] == ["3", "5/5", "complete"] and rows["dev-1"][3:6] == ["3", "5/5", "complete"]

    refused = _status(address, "--token-file", _token(tmp_path, "wrong"), "--once")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"flexfl: error: coordinator {address} refused Status: UNAUTHENTICATED: missing or wrong fleet token"]


def test_an_unreachable_coordinator_is_one_error_line_naming_it(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    result = _status(address, "--token-file", _token(tmp_path), "--json", "--once")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"flexfl: error: cannot reach coordinator {address}: connection refused: nothing listens on port "
        f"{address.rpartition(':')[2]} of 127.0.0.1"]


def test_in_a_terminal_it_redraws_until_ctrl_c(live_config, fleet_factory, tmp_path):
    fleet = fleet_factory(live_config())  # no agent joins: it stays "not started"
    leader, follower = pty.openpty()
    watch = subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "status", f"127.0.0.1:{fleet.port}",
                              "--token-file", _token(tmp_path), "--interval", "0.1"], stdout=follower,
                             stderr=subprocess.PIPE, text=True)
    os.close(follower)
    try:
        screen = b""
        while screen.count(b"\x1b[H\x1b[2J") < 2:  # two screens drawn: it redraws
            screen += os.read(leader, 4096)
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
    finally:
        watch.kill()
        os.close(leader)
    assert watch.returncode == 0 and err == ""  # Ctrl-C ends it quietly
    assert b"not started: waiting for devices" in screen and b"Ctrl-C stops" in screen


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")
def test_status_under_mutual_tls_with_an_agents_config(live_config, fleet_factory, pki, tmp_path, wait_for):
    cfg = live_config(rounds=2, n_devices=2, min_devices=2)
    fleet = fleet_factory(replace(cfg, server=replace(cfg.server, tls_cert=str(pki / "server.pem"),
                                                      tls_key=str(pki / "server.key"),
                                                      tls_client_ca=str(pki / "ca.pem"))))
    for i in range(2):
        fleet.start_agent(i, tls_ca=str(pki / "ca.pem"), tls_client_cert=str(pki / f"dev-{i}.pem"),
                          tls_client_key=str(pki / f"dev-{i}.key"))
    wait_for(lambda: fleet.coordinator.engine.finished, timeout=60, what="the run to finish")
    address, token = f"127.0.0.1:{fleet.port}", _token(tmp_path)
    # A device's own config, as provisioning writes it: its certificate names dev-1, the id it claims.
    agent_toml = write_config(tmp_path / "agent.toml", AgentConfig(
        coordinator=address, device_id="dev-1", fleet_token_file=token, tls_ca=str(pki / "ca.pem"),
        tls_client_cert=str(pki / "dev-1.pem"), tls_client_key=str(pki / "dev-1.key")))
    shown = _status("--config", str(agent_toml), "--json", "--once")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert (doc["finished"], doc["completed_round"]) == (True, 2)
    for dev in doc["devices"]:
        assert dev["last_round"]["round_id"] == 2 and dev["last_round"]["stop_reason"] in AGENT_REASONS, dev
        assert dev["resident_bytes"] > 0
    # TLS without a client certificate: the coordinator refuses the handshake.
    no_cert = _status(address, "--token-file", token, "--tls-ca", str(pki / "ca.pem"), "--once")
    assert no_cert.returncode == 2 and len(no_cert.stderr.splitlines()) == 1
    assert no_cert.stderr.startswith(f"flexfl: error: cannot reach coordinator {address}: {address} accepts TCP "
                                     "connections, but the gRPC call failed (TLS settings"), no_cert.stderr
