"""`flexfl traces import-fedscale | import-flash | timeline`, through the real `flexfl` entry point."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from flexfl.app.cli import main
from trace_recorder.timeline import read_timeline

CAPACITY = {17: {"computation": 54.0, "communication": 800.0}, 99: {"computation": 27.0, "communication": 20000.0},
            3: {"computation": 108.0, "communication": 1500.0}}
BEHAVE = {1: {"duration": 100, "active": [0, 50], "inactive": [20, 80], "finish_time": 100, "model": "a"},
          2: {"duration": 100, "active": [10], "inactive": [100], "finish_time": 100, "model": "b"}}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    cap, beh = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    cap.write_bytes(pickle.dumps(CAPACITY))
    beh.write_bytes(pickle.dumps(BEHAVE))
    return cap, beh


def test_import_fedscale_writes_a_timeline_that_says_where_it_came_from(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cap, beh = _files(tmp_path)
    out = tmp_path / "timeline.csv"
    assert main(["traces", "import-fedscale", "--capacity", str(cap), "--behave", str(beh), "--out", str(out),
                 "--devices", "2", "--seed", "3", "--horizon-s", "200"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 2 devices, " in printed and f"flexfl sim run --timeline {out} --devices 2" in printed
    t = read_timeline(out)
    assert list(t.devices) == ["dev-0", "dev-1"] and t.end == 200
    head = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert head[0].startswith("# flexfl traces import-fedscale --capacity ") and "--seed 3" in head[0]
    assert head[1].startswith("# cpu_share 1.0 = ") and "--sample-s" in head[1]
    assert head[2].startswith("# dev-0: capacity client ") and ", behave client " in head[2]

    assert main(["traces", "timeline", str(out)]) == 0
    assert capsys.readouterr().out.startswith("2 devices, time in seconds, ends at 200, online ")


def test_import_flash_with_constant_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    states = tmp_path / "state_traces.json"
    states.write_text(json.dumps({"7": {"guid": "g", "model": "m", "messages":
                                        "2020-01-02 00:00:00\twifi\n2020-01-02 00:00:00\tbattery_charged_on\n"
                                        "2020-01-02 00:00:10\tscreen_lock\n2020-01-02 00:00:40\tscreen_unlock\n"}}))
    out = tmp_path / "flash.csv"
    assert main(["traces", "import-flash", "--states", str(states), "--up-kbit-s", "500", "--cpu-share", "0.5",
                 "--out", str(out), "--horizon-s", "80"]) == 0
    assert "--update-s SECONDS" in capsys.readouterr().out  # no trace-derived per-sample cost to offer
    rows = read_timeline(out).devices["dev-0"]
    assert [(r.start, r.end, r.conditions.online) for r in rows] == [(0.0, 10.0, False), (10.0, 40.0, True),
                                                                    (40.0, 50.0, False), (50.0, 80.0, True)]
    conditions = {(r.conditions.cpu_share, r.conditions.up_kbit_s, r.conditions.down_kbit_s) for r in rows}
    assert conditions == {(0.5, 500, 500)}


@pytest.mark.parametrize("argv, message", [
    (["import-flash", "--states", "s.json", "--out", "o.csv"], "give a FedScale capacity file (--capacity) or"),
    (["import-flash", "--states", "s.json", "--out", "o.csv", "--cpu-share", "0.5"], "need --up-kbit-s too"),
    (["import-flash", "--states", "s.json", "--out", "o.csv", "--up-kbit-s", "5", "--cpu-share", "2"],
     "--cpu-share must be a finite number > 0 and <= 1"),
    (["import-fedscale", "--capacity", "absent.pkl", "--out", "o.csv"], "absent.pkl: cannot read"),
    (["import-fedscale", "--capacity", "absent.pkl", "--out", "o.csv", "--time-scale", "0"], "time_scale must be"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], message: str) -> None:
    (tmp_path / "s.json").write_text("{}")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["traces", *argv]) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert err.startswith("flexfl: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o.csv").exists()


def test_a_malicious_pickle_stops_the_import_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    cap = tmp_path / "client_device_capacity"
    cap.write_bytes(pickle.dumps({1: Evil()}))
    assert main(["traces", "import-fedscale", "--capacity", str(cap), "--out", str(tmp_path / "o.csv")]) == 2
    assert "refused: the pickle names posix.system" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "o.csv").exists()


def test_checking_a_bad_timeline_names_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online\ndev-0,0,1,nan,1,1,1\n")
    assert main(["traces", "timeline", str(path)]) == 2
    assert capsys.readouterr().err == f"flexfl: error: {path}:2: field 'cpu_share': value 'nan' is not finite\n"
