"""The devices' logs reach the run's folder (SendLog): agents as processes send theirs after each round and at the
end; malformed batches and ids that cannot name a file are refused with INVALID_ARGUMENT, and nothing is written."""

from __future__ import annotations

import math
from dataclasses import replace

import grpc
import pytest
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, ErrorReason, error_reason

from coordinator.agent_logs import AGENT_LOGS_DIR, MAX_BATCH_LINES, format_line
from coordinator.metrics import read_metrics
from flexfl.config import write_config
from flexfl.exchange import LogLine

from .conftest import TOKEN, flexfl_process, with_server


def _send(port: int, device_id: str, lines: list[pb.LogLine], *, dropped: int = 0, token: str = TOKEN):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.FleetStub(channel).SendLog(
            pb.LogBatch(lines=lines, dropped=dropped),
            metadata=[(AUTH_HEADER, f"Bearer {token}"), (DEVICE_HEADER, device_id)], timeout=10)


def _line(message: str, *, level: str = "INFO", time_s: float = 1.7e9) -> pb.LogLine:
    return pb.LogLine(time_s=time_s, level=level, logger="test", message=message)


def test_agent_processes_logs_land_in_the_coordinators_folder(live_config, fleet_factory, tmp_path, procs):
    """Two `flexfl agent` processes train 3 rounds; each one's log, as the coordinator keeps it, holds its join, a
    line per round with its s, and the end of training, in the order they happened."""
    fleet = fleet_factory(live_config(rounds=3, n_devices=2, min_devices=2))
    (tmp_path / "token").write_text(TOKEN)
    agents = []
    for k in range(2):
        cfg = replace(fleet.agent_config(k), fleet_token="", fleet_token_file=str(tmp_path / "token"))
        agents.append(flexfl_process("agent", "--config", str(write_config(tmp_path / f"agent-{k}.toml", cfg)),
                                     log=tmp_path / f"agent-{k}.out"))
    procs.extend(agents)
    assert fleet.coordinator.wait(timeout=120)
    for k, agent in enumerate(agents):
        assert agent.wait(timeout=60) == 0, (tmp_path / f"agent-{k}.out").read_text()[-2000:]
    rows = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")
    for k in range(2):
        text = (fleet.coordinator.out_dir / AGENT_LOGS_DIR / f"dev-{k}.log").read_text()
        lines = text.splitlines()
        joined = next(i for i, x in enumerate(lines) if f"INFO edge_agent.agent: dev-{k} joined as index {k}" in x)
        per_round = [i for i, x in enumerate(lines) if f"edge_agent.agent: dev-{k} round " in x]
        finished = next(i for i, x in enumerate(lines) if "training finished" in x)
        assert joined < per_round[0] and per_round[-1] < finished and len(per_round) == 3, text
        for rnd, i in zip((1, 2, 3), per_round):
            assert f"round {rnd}: s = {rows[rnd - 1].s[f'dev-{k}']}/5" in lines[i], lines[i]
        # What the agent printed at INFO and above is what the coordinator kept: same messages, same order.
        printed = [x.split(" INFO ", 1)[1] for x in (tmp_path / f"agent-{k}.out").read_text().splitlines()
                   if " INFO edge_agent.agent: " in x]
        kept = [x.split(" INFO ", 1)[1] for x in lines if " INFO edge_agent.agent: " in x]
        assert kept == printed


def test_malformed_batches_and_unsafe_ids_are_refused_and_nothing_is_written(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=99))
    port, folder = fleet.port, fleet.coordinator.out_dir / AGENT_LOGS_DIR
    cases = {
        "../escape": [_line("x")],
        ".hidden": [_line("x")],
        "dev-nan": [_line("ok"), _line("bad", time_s=math.nan)],
        "dev-level": [_line("bad", level="LOUD")],
        "dev-many": [_line(str(i)) for i in range(MAX_BATCH_LINES + 1)],
    }
    for device, lines in cases.items():
        with pytest.raises(grpc.RpcError) as err:
            _send(port, device, lines)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (device, err.value.details())
        assert error_reason(err.value) == ErrorReason.INVALID_ARGUMENT
    assert "log line 1: time_s nan is not a Unix time" in _details(port, "dev-nan", cases["dev-nan"])
    assert not folder.exists() or list(folder.iterdir()) == []
    assert not (fleet.coordinator.out_dir.parent / "escape.log").exists()
    with pytest.raises(grpc.RpcError) as err:
        _send(port, "dev-0", [_line("x")], token="wrong")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # A good batch after all that is kept, a long message cut with its length said.
    reply = _send(port, "dev-0", [_line("first\nsecond"), _line("y" * 9000, level="WARNING")], dropped=3)
    assert (reply.kept, reply.dropped) == (2, 3)
    text = (folder / "dev-0.log").read_text()
    assert text.startswith("2023-11-14T22:13:20.000Z INFO test: first\n    second\n")
    assert "WARNING test: " + "y" * 8192 + " ... [cut: 9000 characters]" in text
    assert "the device dropped 3 log records before sending them" in text


def _details(port: int, device: str, lines: list[pb.LogLine]) -> str:
    try:
        _send(port, device, lines)
    except grpc.RpcError as exc:
        return exc.details()
    raise AssertionError("the batch was accepted")


def test_a_devices_log_stops_at_its_cap_and_says_so_once(live_config, fleet_factory):
    one = len(format_line(LogLine(time_s=1.7e9, level="INFO", logger="test", message="z" * 100)))
    cap = int(16.5 * one)  # room for 16 lines
    fleet = fleet_factory(with_server(live_config(rounds=1, n_devices=2, min_devices=99),
                                      max_agent_log_mib=cap / 2**20))
    replies = [_send(fleet.port, "dev-1", [_line("z" * 100)] * 10) for _ in range(3)]
    assert [(r.kept, r.dropped) for r in replies] == [(10, 0), (6, 4), (0, 10)]
    text = (fleet.coordinator.out_dir / AGENT_LOGS_DIR / "dev-1.log").read_text()
    assert text.count("z" * 100) == 16 and text.count("reached server.max_agent_log_mib") == 1
    # Another device's share is its own.
    assert _send(fleet.port, "dev-0", [_line("a")]).kept == 1


def test_an_agent_that_cannot_take_part_sends_why(live_config, fleet_factory, tmp_path, procs):
    """The log of a device that stops on an error ends with the reason, at the coordinator too (here a device set
    up with another partition than the coordinator's, which it finds before joining)."""
    from workloads.partition_spec import PartitionSpec

    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=99))
    (tmp_path / "token").write_text(TOKEN)
    cfg = replace(fleet.agent_config(0), fleet_token="", fleet_token_file=str(tmp_path / "token"),
                  partition=PartitionSpec(dataset="synthetic", n_devices=2, total_samples=999))
    agent = flexfl_process("agent", "--config", str(write_config(tmp_path / "agent.toml", cfg)),
                           log=tmp_path / "agent.out")
    procs.append(agent)
    assert agent.wait(timeout=60) == 2
    printed = (tmp_path / "agent.out").read_text()
    assert printed.count("differs from the coordinator's") == 1, printed  # said once on the terminal
    kept = (fleet.coordinator.out_dir / AGENT_LOGS_DIR / "dev-0.log").read_text()
    assert "ERROR edge_agent.agent: dev-0: stopping: dev-0: this device's partition" in kept, kept
