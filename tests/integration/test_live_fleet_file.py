"""`flexfl live --fleet FILE` under mutual TLS: only the coordinator runs here, with the fleet file's [server]
(certificate, key, client CA); agents started elsewhere (here: by the test, as a device's service starts them)
join it; flexfl live watches it over TLS with a device's certificate ([watch]) and says how to, and a fleet file
that does not fit the run is refused before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.metrics import read_metrics
from edge_agent.config import AgentConfig
from flexfl.config import write_config
from loadgen.harness import Harness, free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")


def _live(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flexfl.app.cli", "live", "--dataset", "synthetic", "--devices", "2",
                           "--rounds", "2", "--E", "5", "--arrive-round", "0", "--depart-round", "0", *args],
                          capture_output=True, text=True, timeout=300)


def test_live_with_a_fleet_file_runs_only_its_coordinator_here_over_mutual_tls(pki: Path, tmp_path: Path) -> None:
    token = tmp_path / "fleet_token"
    token.write_text("fleet-file-token\n")
    address = f"localhost:{free_port()}"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f"""devices = ["dev-0", "dev-1"]
[server]
listen = "{address}"
fleet_token_file = "{token}"
tls_cert = "{pki / 'server.pem'}"
tls_key = "{pki / 'server.key'}"
tls_client_ca = "{pki / 'ca.pem'}"
[watch]
tls_ca = "{pki / 'ca.pem'}"
tls_client_cert = "{pki / 'dev-1.pem'}"
tls_client_key = "{pki / 'dev-1.key'}"
""")
    with Harness(tmp_path / "devices") as devices:
        for i in range(2):
            write_config(tmp_path / f"dev-{i}.toml", AgentConfig(
                coordinator=address, device_id=f"dev-{i}", shard_index=i, fleet_token_file=str(token),
                tls_ca=str(pki / "ca.pem"), tls_client_cert=str(pki / f"dev-{i}.pem"),
                tls_client_key=str(pki / f"dev-{i}.key"), pull_wait_s=0.5, backoff_max_s=1.0, serve_runs=True))
            devices.start_agent(f"dev-{i}", tmp_path / f"dev-{i}.toml")
        run = _live("--fleet", str(fleet), "--out", str(tmp_path / "run"))
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr)
        assert devices.procs["dev-0"].proc.poll() is None  # the device's agent serves on
    assert (f"watch the fleet: flexfl status {address} --token-file {token} --tls-ca {pki / 'ca.pem'} "
            f"--tls-client-cert {pki / 'dev-1.pem'} --tls-client-key {pki / 'dev-1.key'}") in run.stdout
    rows = read_metrics(tmp_path / "run" / "coordinator" / "metrics.jsonl")
    assert [sorted(r.s) for r in rows] == [["dev-0", "dev-1"]] * 2 and all(v > 0 for r in rows for v in r.s.values())
    assert not list((tmp_path / "run").glob("agent-*.toml"))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["problems"] == []

    three = _live("--fleet", str(fleet), "--devices", "3", "--out", str(tmp_path / "three"))
    assert three.returncode == 2 and three.stderr.strip().splitlines()[-1] == (
        f"flexfl: error: --fleet {fleet} lists 2 devices but the partition has 3 (partition.n_devices): "
        "one shard per device"), three.stderr
    scripted = _live("--fleet", str(fleet), "--depart-round", "1", "--out", str(tmp_path / "scripted"))
    assert scripted.returncode == 2 and "--fleet" in scripted.stderr and "--depart-round 0" in scripted.stderr
    assert not (tmp_path / "three").exists() and not (tmp_path / "scripted").exists()
