"""`flexfl traces from-run` (flexfl.app.run_traces): which rounds a device's trace holds, and the folders that cannot
become a trace set, each with an error that says why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coordinator.metrics import MetricsWriter, write_run_info
from coordinator.rules.round_record import LiveRound, RoundRecord
from flexfl.app.cli import main
from flexfl.app.run_traces import RunTracesError, run_trace_set
from flexfl.errors import ERROR_PREFIX, FlexFLError
from trace_recorder.format import read_trace_set

E = 10


def row(k: int, s: dict[str, int], *, sent: tuple[str, ...] | None = None, departures: tuple[str, ...] = (),
        live: bool = True) -> RoundRecord:
    """Round k of a live run: `s` per participant, an update from each one with s > 0, the model sent to `sent`."""
    sent = tuple(s) if sent is None else sent
    came = [d for d, v in s.items() if v > 0]
    measured = LiveRound(time=0.0, close_reason="deadline", bytes_out={d: 900 for d in sent},
                         bytes_in={d: 800 for d in came}, train_s={d: 0.1 * s[d] for d in came}, local_loss={},
                         rejected={}, round_s=1.0, aggregate_eval_s=0.0, overhead_s=None,
                         previous_upload_s={d: 0.02 for d in came})
    return RoundRecord(round=k, lr=0.1, participants=tuple(s), devices=tuple(s), s=s, p={}, coefficients={},
                       discarded=False, test_acc=0.5, test_loss=1.0, departures=departures,
                       stop_reason={d: "complete" if v == E else "compute" if v else "missed" for d, v in s.items()},
                       live=measured if live else None)


def write_run(path: Path, rows: list[RoundRecord], *, deadline_s: float | None = 2.0, flower: bool = False) -> Path:
    write_run_info(path, kind="live", config={"flower": {}} if flower else {}, devices={}, deadline_s=deadline_s,
                   required_updates=E)
    writer = MetricsWriter(path / "metrics.jsonl", append=False)
    writer.write_many([r.to_json() for r in rows])
    writer.close()
    return path


def test_a_devices_trace_holds_the_rounds_it_was_asked_to_train_in(tmp_path: Path) -> None:
    # dev-2 arrives after round 2 (trains from 3); dev-1 is gone before round 4 and departs at its close
    rows = [row(1, {"dev-0": 10, "dev-1": 4}), row(2, {"dev-0": 10, "dev-1": 0}),
            row(3, {"dev-0": 10, "dev-1": 6, "dev-2": 3}),
            row(4, {"dev-0": 8, "dev-1": 0, "dev-2": 10}, sent=("dev-0", "dev-2"), departures=("dev-1",))]
    manifest, traces = run_trace_set(write_run(tmp_path / "run", rows), name="mine")
    by = {t.name: t for t in traces}
    assert manifest.traces == ("dev-0", "dev-1", "dev-2") and manifest.kind == "recorded"
    assert (manifest.required_updates, manifest.deadline_s, manifest.name) == (E, 2.0, "mine")
    assert list(by["dev-2"].round) == [3, 4] and list(by["dev-2"].fraction) == [0.3, 1.0]
    # dev-1's round 2 (asked, nothing came) is an inactive round; round 4 (gone before it) is not in its trace
    assert list(by["dev-1"].round) == [1, 2, 3] and list(by["dev-1"].fraction) == [0.4, 0.0, 0.6]
    assert list(by["dev-1"].extra["arrived"]) == [1, 0, 1] and list(by["dev-1"].extra["stop_reason"]) == [2, 0, 2]
    # upload_s comes from the next row's header: the last round's is unknown (0)
    assert list(by["dev-0"].extra["upload_s"]) == [0.02, 0.02, 0.02, 0.0]
    assert list(by["dev-0"].extra["stop_reason"]) == [1, 1, 1, 2]


def test_the_cli_writes_a_set_that_reads_back(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "run", [row(k, {"node-17": 10, "node-42": 3 + k}) for k in (1, 2, 3)], flower=True,
                    deadline_s=None)
    assert main(["traces", "from-run", str(run), "--out", str(tmp_path / "set"), "--name", "fleet"]) == 0
    assert "wrote 2 traces (3 rounds, no deadline, E = 10)" in capsys.readouterr().out
    back = read_trace_set(tmp_path / "set")
    assert back.manifest.name == "fleet" and back.manifest.deadline_s is None
    assert "Flower" in back.manifest.description and back.manifest.source["engine"] == "flower"
    assert list(back.get("node-42").fraction) == [0.4, 0.5, 0.6]


@pytest.mark.parametrize(("case", "message"), [
    ("nothing", "not a run"),
    ("trace set", "holds a trace set, not a run"),
    ("empty", "an empty run: no rounds in run.json, metrics.jsonl"),
    ("simulation", "round 1's row holds no live measurements"),
    ("nobody asked", "no device was asked to train in any of its 1 rounds"),
    ("no E", "E (required updates) is in neither run.json nor the rows' rules"),
])
def test_a_folder_that_cannot_become_a_trace_set_says_why(tmp_path: Path, case: str, message: str) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    if case == "trace set":
        assert main(["traces", "calibrate", "--out", str(folder), "--rounds", "5"]) == 0
    elif case == "empty":
        write_run(folder, [])
    elif case == "simulation":
        write_run(folder, [row(1, {"dev-0": 5}, live=False), row(2, {"dev-0": 5})])
    elif case == "nobody asked":
        write_run(folder, [row(1, {})])
    elif case == "no E":
        (folder / "metrics.jsonl").write_text(json.dumps(row(1, {"dev-0": 5}).to_json()) + "\n")
    with pytest.raises(FlexFLError, match=re.escape(message)):
        run_trace_set(folder, name="x")


def test_the_cli_reports_the_error_in_one_line_and_exits_2(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "run", [row(1, {"dev-0": 5}, live=False)])
    assert main(["traces", "from-run", str(tmp_path / "run"), "--out", str(tmp_path / "set")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(ERROR_PREFIX) and err.count("\n") == 1 and "no live measurements" in err
    assert not (tmp_path / "set").exists()


def test_a_device_id_that_cannot_name_a_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RunTracesError, match="device id 'dev 0' cannot name a trace"):
        run_trace_set(write_run(tmp_path / "run", [row(1, {"dev 0": 5})]), name="x")
