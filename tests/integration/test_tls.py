"""TLS and mutual TLS between agents and the coordinator, with certificates made by openssl."""

from __future__ import annotations

import shutil
import threading
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.metrics import read_metrics
from edge_agent.agent import EdgeAgent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=flexfl-test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    return d


def _tls_config(live_config, pki: Path, *, mutual: bool):
    cfg = live_config(rounds=2, n_devices=2, min_devices=2)
    server = replace(cfg.server, tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"),
                     tls_client_ca=str(pki / "ca.pem") if mutual else "")
    return replace(cfg, server=server)


@pytest.mark.parametrize("mutual", [False, True])
def test_rounds_complete_over_tls(live_config, fleet_factory, pki, mutual):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=mutual))
    client = dict(tls_client_cert=str(pki / "client.pem"), tls_client_key=str(pki / "client.key")) if mutual else {}
    for i in range(2):
        fleet.start_agent(i, tls_ca=str(pki / "ca.pem"), **client)
    assert fleet.coordinator.wait(timeout=60)
    rows = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2] and all(v == 5 for v in rows[-1]["s"].values())


def test_plaintext_agent_and_agent_without_client_cert_are_refused(live_config, fleet_factory, pki):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=True))
    for kwargs in ({}, {"tls_ca": str(pki / "ca.pem")}):  # no TLS at all; TLS but no client certificate
        cfg = replace(fleet.agent_config(0, **kwargs), backoff_max_s=0.2, rpc_timeout_s=2.0)
        agent = EdgeAgent(cfg)
        outcome: list = []
        t = threading.Thread(target=lambda: outcome.append(agent.run()), daemon=True)
        t.start()
        t.join(timeout=3)
        assert t.is_alive(), "the agent should still be retrying a handshake that cannot succeed"
        agent.stop(announce=False)
        t.join(timeout=10)
        assert outcome == [0]
    assert len(fleet.coordinator.engine.registry.devices) == 0
