"""TLS and mutual TLS between agents and the coordinator, with certificates made by openssl.

Under mutual TLS a client certificate's CN is the one device id it may claim
(coordinator/identity.py): each agent gets its own certificate, CN=dev-<i>.
"""

from __future__ import annotations

import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, PROTOCOL_VERSION

from coordinator.metrics import read_metrics
from edge_agent.agent import EdgeAgent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")


def _tls_config(live_config, pki: Path, *, mutual: bool):
    cfg = live_config(rounds=2, n_devices=2, min_devices=2)
    server = replace(cfg.server, tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"),
                     tls_client_ca=str(pki / "ca.pem") if mutual else "")
    return replace(cfg, server=server)


@pytest.mark.parametrize("mutual", [False, True])
def test_rounds_complete_over_tls(live_config, fleet_factory, pki, mutual):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=mutual))
    for i in range(2):
        client = dict(tls_client_cert=str(pki / f"dev-{i}.pem"),
                      tls_client_key=str(pki / f"dev-{i}.key")) if mutual else {}
        fleet.start_agent(i, tls_ca=str(pki / "ca.pem"), **client)
    assert fleet.coordinator.wait(timeout=60)
    rows = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2] and all(v == 5 for v in rows[-1].s.values())


def test_plaintext_agent_and_agent_without_client_cert_are_refused(live_config, fleet_factory, pki):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=True))
    for kwargs in ({}, {"tls_ca": str(pki / "ca.pem")}):  # no TLS at all; TLS but no client certificate
        cfg = replace(fleet.agent_config(0, **kwargs), backoff_max_s=0.2, rpc_timeout_s=2.0)
        agent = EdgeAgent(cfg)
        outcome: list = []
        t = threading.Thread(target=lambda agent=agent, outcome=outcome: outcome.append(agent.run()), daemon=True)
        t.start()
        t.join(timeout=3)
        assert t.is_alive(), "the agent should still be retrying a handshake that cannot succeed"
        agent.stop(announce=False)
        t.join(timeout=10)
        assert outcome == [0]
    assert len(fleet.coordinator.engine.registry.devices) == 0


def _mutual_channel(port: int, pki: Path, cert: str) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), (pki / f"{cert}.key").read_bytes(),
                                         (pki / f"{cert}.pem").read_bytes())
    return grpc.secure_channel(f"localhost:{port}", creds)


def _join(channel: grpc.Channel, device_id: str, *, token: str) -> pb.JoinReply:
    request = pb.JoinRequest(device_id=device_id, sample_count=100, protocol_version=PROTOCOL_VERSION)
    metadata = [(AUTH_HEADER, f"Bearer {token}"), (DEVICE_HEADER, device_id)]
    return pb_grpc.FleetStub(channel).Join(request, metadata=metadata, timeout=10)


def test_certificate_of_one_device_cannot_claim_another(live_config, fleet_factory, pki):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=True))
    with _mutual_channel(fleet.port, pki, "dev-1") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            _join(channel, "dev-2", token=fleet.cfg.server.fleet_token)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'dev-1'" in refused.value.details() and "'dev-2'" in refused.value.details()
        assert "dev-2" not in fleet.coordinator.engine.registry.devices
        # The same certificate on the same channel is accepted for the device it names: registered, and
        # told its index (join order: it holds no shard, and is the first device to join).
        joined = _join(channel, "dev-1", token=fleet.cfg.server.fleet_token)
        assert (joined.device_id, joined.device_index) == ("dev-1", 0)
        assert fleet.coordinator.engine.registry.devices["dev-1"].index == joined.device_index
    assert set(fleet.coordinator.engine.registry.devices) == {"dev-1"}


def test_certificate_without_common_name_is_refused(live_config, fleet_factory, pki):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=True))
    with _mutual_channel(fleet.port, pki, "no-cn") as channel, pytest.raises(grpc.RpcError) as refused:
        _join(channel, "dev-0", token=fleet.cfg.server.fleet_token)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "without a common name" in refused.value.details() and "CN=dev-0" in refused.value.details()
    assert len(fleet.coordinator.engine.registry.devices) == 0


def test_agent_with_another_devices_certificate_stops_with_the_reason(live_config, fleet_factory, pki):
    fleet = fleet_factory(_tls_config(live_config, pki, mutual=True))
    cfg = replace(fleet.agent_config(0, tls_ca=str(pki / "ca.pem"), tls_client_cert=str(pki / "dev-1.pem"),
                                     tls_client_key=str(pki / "dev-1.key")), rpc_timeout_s=5.0)
    agent = EdgeAgent(cfg)
    outcome: list[BaseException | int] = []

    def run() -> None:
        try:
            outcome.append(agent.run())
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():
        agent.stop(announce=False)
        t.join(timeout=10)
    # PERMISSION_DENIED is not retried: the agent gives up at once and says why.
    assert len(outcome) == 1 and isinstance(outcome[0], Exception), outcome
    # Its first call (Status, to learn the partition) is already refused.
    refused = r"dev-0: status refused by coordinator [^:]+:\d+: PERMISSION_DENIED: .*'dev-1'.*'dev-0'"
    assert re.search(refused, str(outcome[0])), outcome
    assert len(fleet.coordinator.engine.registry.devices) == 0


def test_a_recording_on_an_inventory_of_tls_agents_runs_its_coordinator_with_tls(tmp_path, pki, fleet_factory,
                                                                                live_config, wait_for):
    """`flexfl traces record --inventory` on provisioned agents (TLS by default): its coordinator was plaintext, so
    the agents' handshakes failed and the recording waited for them forever. With the inventory's TLS files the
    coordinator listens with TLS and mutual TLS, the recorder watches it over mutual TLS, and a TLS agent joins."""
    from loadgen.harness import Harness, connect_address
    from trace_recorder.recording.profiles import Inventory, InventoryDevice, load_profile
    from trace_recorder.recording.recorder import CoordinatorProcess, InventoryBackend, write_fleet_configs

    from .conftest import TOKEN, free_port

    profile = load_profile()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    inventory = Inventory(
        coordinator_listen=f"127.0.0.1:{free_port()}", fleet_token_file=str(token),
        devices=(InventoryDevice(device_id="dev-0", trace=profile.traces[0].name, loadgen="tcp://127.0.0.1:1"),),
        tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_client_ca=str(pki / "ca.pem"),
        watch_tls_ca=str(pki / "ca.pem"), watch_tls_client_cert=str(pki / "dev-1.pem"),
        watch_tls_client_key=str(pki / "dev-1.key"))
    backend = InventoryBackend(profile, inventory)
    coord_cfg, _ = write_fleet_configs(profile, backend, tmp_path, token_file=token, rounds=1, deadline_s=5.0,
                                       header="test")
    with Harness(tmp_path / "procs") as harness:
        coordinator = CoordinatorProcess(harness, coord_cfg, address=connect_address(inventory.coordinator_listen),
                                         token=TOKEN, tls=backend.watch_tls)
        coordinator.start(resume=False)  # ready: its Status answered over mutual TLS
        helper = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=99))
        helper.port = int(inventory.coordinator_listen.rsplit(":", 1)[1])
        helper.start_agent(0, tls_ca=str(pki / "ca.pem"), tls_client_cert=str(pki / "dev-0.pem"),
                           tls_client_key=str(pki / "dev-0.key"), partition=None)
        wait_for(lambda: any(d.device_id == "dev-0" and d.connected for d in harness.status().devices),
                 timeout=60, what="the TLS agent to join the recording's coordinator")
        coordinator.stop()
