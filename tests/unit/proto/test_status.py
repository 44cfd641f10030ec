"""The Status call's record on both ends, and the view of it (proto/status.py, flexfl/fleet_view.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import pytest
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto.channel import TlsFiles, certificate_common_name
from flexfl.proto.status import STATUS_DEVICE_ID, Access, fleet_state, status_reply

from flexfl.exchange import DeviceRound, DeviceState, FleetState, RoundState
from flexfl.fleet_view import COLUMNS, device_state, render, state_json

TRAINING = DeviceState(device_id="pi-01", shard_index=0, departed=False, in_objective=True, joined_after_round=0,
                       connected=True, streaming=True, round_state=RoundState.TRAINING,
                       last_round=DeviceRound(round_id=6, s=13, stop_reason="compute", bytes_in=812_345,
                                              bytes_out=812_000, train_s=1.5),
                       resident_bytes=150 * 2**20, upload_bytes_per_s=625_000.0, seen_ago_s=0.25)
NEW = DeviceState(device_id="pi-02", shard_index=None, departed=False, in_objective=False, joined_after_round=6,
                  connected=True)
STATE = FleetState(run_id="3f2a9c1b0e12", completed_round=6, open_round=7, started=True, finished=False, rounds=30,
                   devices=(TRAINING, NEW), partition_json='{"dataset": "synthetic"}', required_updates=20,
                   deadline_s=2.0, round_open_s=1.25, round_closes_in_s=0.75)


def test_a_state_goes_through_the_wire_unchanged():
    wire = pb.StatusReply.FromString(status_reply(STATE).SerializeToString())
    assert fleet_state(wire) == STATE


def test_a_reply_of_a_coordinator_before_the_new_fields_reads_them_as_unknown():
    old = pb.StatusReply(run_id="r", completed_round=3, open_round=4, started=True, rounds=9, partition_json="{}",
                         devices=[pb.DeviceStatus(device_id="a", shard_index=0, connected=True),
                                  pb.DeviceStatus(device_id="b", departed=True)])
    state = fleet_state(old)
    assert (state.run_id, state.completed_round, state.open_round, state.started, state.finished,
            state.rounds) == ("r", 3, 4, True, False, 9)
    assert (state.required_updates, state.round_open_s, state.round_closes_in_s) == (0, None, None)
    assert [(d.device_id, d.shard_index, d.connected, d.departed) for d in state.devices] == [
        ("a", 0, True, False), ("b", None, False, True)]  # an unset shard is not shard 0
    a = state.devices[0]
    assert (a.round_state, a.last_round, a.resident_bytes, a.upload_bytes_per_s, a.seen_ago_s) == (
        RoundState.NONE, None, None, None, None)
    lines = render(state, address="coord:50051")
    assert lines[1] == "round 4 of 9 open" and "run r" in lines[0] and "E =" not in lines[0]
    assert lines[3].split()[3:] == ["-"] * 8  # nothing known past its state


def test_the_view_shows_the_round_its_time_left_and_each_device():
    lines = render(STATE, address="coord:50051")
    assert lines[0] == "coordinator coord:50051 | run 3f2a9c1b0e12 | E = 20 | deadline 2 s | 2 devices"
    assert lines[1] == "round 7 of 30 open for 1.2 s, closes in 0.8 s; 0 of 1 answered"
    assert lines[2].split() == list(COLUMNS)
    assert lines[3].split() == ["pi-01", "0", "training", "6", "13/20", "compute", "812", "kB", "812", "kB", "150",
                                "MiB", "5", "Mbit/s", "0.2", "s"]
    assert lines[4].split()[:4] == ["pi-02", "-", "arriving", "-"]
    assert len({len(line) for line in lines[2:4]}) == 1  # columns line up


@pytest.mark.parametrize("state, line", [
    (dict(finished=True, completed_round=30, open_round=0), "finished: 30 of 30 rounds"),
    (dict(started=False, completed_round=0, open_round=0), "not started: waiting for devices"),
    (dict(open_round=0), "between rounds: 6 of 30 done")])
def test_the_round_line_says_when_no_round_is_open(state, line):
    assert render(replace(STATE, **state), address="a:1")[1] == line


@pytest.mark.parametrize("fields, word", [
    (dict(departed=True), "departed"), (dict(round_state=RoundState.LATE), "late"),
    (dict(in_objective=False), "arriving"), (dict(streaming=True), "waiting"), (dict(), "away"),
    (dict(connected=False), "not seen")])
def test_a_devices_state_is_one_word(fields, word):
    base = replace(TRAINING, round_state=RoundState.NONE, streaming=False)
    assert device_state(replace(base, **fields)) == word


def test_the_json_is_the_record_with_its_partition_as_an_object():
    doc = json.loads(json.dumps(state_json(STATE)))
    assert doc["partition"] == {"dataset": "synthetic"} and "partition_json" not in doc
    assert (doc["open_round"], doc["required_updates"], doc["round_closes_in_s"]) == (7, 20, 0.75)
    pi01 = doc["devices"][0]
    assert (pi01["round_state"], pi01["last_round"]["s"], pi01["last_round"]["stop_reason"],
            pi01["resident_bytes"]) == ("training", 13, "compute", 150 * 2**20)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_a_call_with_a_client_certificate_claims_its_common_name(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/O=flexfl/CN=pi-07", "-keyout", "k.pem", "-out", "c.pem"], cwd=tmp_path, check=True,
                   capture_output=True)
    cert = str(tmp_path / "c.pem")
    assert certificate_common_name(cert) == "pi-07"
    assert certificate_common_name(str(tmp_path / "k.pem")) is None  # not a certificate
    mutual = TlsFiles(ca=cert, client_cert=cert, client_key=str(tmp_path / "k.pem"))
    assert Access(token="t", tls=mutual).claimed_id() == "pi-07"
    assert Access(token="t", device_id="ops", tls=mutual).claimed_id() == "ops"
    assert Access(token="t", tls=TlsFiles(ca=cert)).claimed_id() == STATUS_DEVICE_ID
