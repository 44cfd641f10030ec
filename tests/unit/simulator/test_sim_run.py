"""`flexfl sim run`'s folder: an earlier run is never overwritten silently (refused, or moved aside with --fresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexfl.cli import main

TINY = ["sim", "run", "--dataset", "synthetic", "--devices", "4", "--total-samples", "400", "--num-traces", "3",
        "--E", "3", "--scheme", "C"]


def test_a_folder_holding_a_run_is_refused_and_fresh_moves_it_aside(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    assert main([*TINY, "--rounds", "2", "--depart", "0@1:include", "--out", str(out)]) == 0
    first = (out / "rounds.csv").read_text()
    capsys.readouterr()
    # As `make sim-run` after a run of one's own: refused, the first run untouched.
    assert main([*TINY, "--rounds", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds an earlier run" in err and "--fresh" in err and "--resume" not in err
    assert (out / "rounds.csv").read_text() == first
    # --fresh: the earlier run is moved beside the folder, whole, and the new one written.
    assert main([*TINY, "--rounds", "3", "--out", str(out), "--fresh"]) == 0
    assert "was moved to" in capsys.readouterr().out
    (aside,) = tmp_path.glob("sim.previous-*")
    assert (aside / "rounds.csv").read_text() == first and (aside / "C" / "metrics.jsonl").is_file()
    assert len((out / "rounds.csv").read_text().splitlines()) == 1 + 3
