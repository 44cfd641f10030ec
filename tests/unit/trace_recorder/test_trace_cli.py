"""`flexfl traces calibrate | show | validate`, driven through argparse."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from flexfl.app import traces_cli as cli
from flexfl.errors import ConfigError, TraceFormatError


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="flexfl")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["traces", *argv])
    return args.func(args)


def test_calibrate_then_show_then_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "paper"
    assert _run("calibrate", "--out", str(out), "--rounds", "250") == 0
    printed = capsys.readouterr().out
    assert "wrote 8 calibrated traces x 250 rounds" in printed
    assert "Tlo" in printed and "51.2" in printed  # the paper's value beside ours

    assert _run("show", str(out)) == 0
    shown = capsys.readouterr().out
    assert "calibrated" in shown and "cpu_load_pct=90" in shown and "bandwidth=lo" in shown

    assert _run("validate", str(out)) == 0
    assert capsys.readouterr().out.strip() == "ok: 8 traces, 250 rounds"


def test_validate_reports_the_format_error(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    _run("calibrate", "--out", str(out))
    (out / "T50.csv").write_text("round,fraction\n0,0.5\n1,1.5\n")
    with pytest.raises(TraceFormatError, match=r"T50.csv:3: field 'fraction': value '1.5' outside 0..1"):
        _run("validate", str(out))  # `flexfl` prints it as one error line and exits 2


def test_calibrate_refuses_a_folder_holding_another_set(tmp_path: Path) -> None:
    (tmp_path / "other.csv").write_text("round,fraction\n0,1.0\n")
    with pytest.raises(ConfigError, match=r"other.csv"):
        _run("calibrate", "--out", str(tmp_path))
