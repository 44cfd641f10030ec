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


MNIST = ["sim", "run", "--dataset", "mnist", "--iid", "--devices", "5", "--total-samples", "2000", "--scheme", "C"]


def test_mnist_with_its_defaults_trains_and_a_pair_known_not_to_train_is_warned_of(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`sim run --dataset mnist` sat at chance: its default eta_0 was the paper's 0.002, which goes with E in epochs."""
    import csv

    from coordinator.round import RulesConfig
    from flexfl.live import load_live_config
    from simulator.regime import Regime

    # One default per (dataset, unit), the same for sim run (RulesConfig), live and the sweeps' --eta0 default.
    steps, epochs = RulesConfig(), RulesConfig(unit="epoch")
    assert (steps.eta0_for("mnist"), epochs.eta0_for("mnist"), steps.eta0_for("synthetic")) == (0.1, 0.002, 1.0)
    live = load_live_config(None, overrides={"partition": {"dataset": "mnist"}})
    assert live.rules.eta0_for("mnist") == Regime().eta0_for("mnist") == steps.eta0_for("mnist")
    assert main([*MNIST, "--rounds", "5", "--out", str(tmp_path / "default")]) == 0
    accuracy = [float(r["test_acc"]) for r in csv.DictReader((tmp_path / "default" / "rounds.csv").open())]
    assert accuracy[-1] > 0.3  # at 0.002 it stays near 0.11
    assert "known not to train" not in caplog.text
    assert main([*MNIST, "--rounds", "1", "--eta0", "0.002", "--out", str(tmp_path / "paper")]) == 0
    assert "eta_0 = 0.002 with E in steps on mnist is known not to train" in caplog.text
    assert "the default is eta_0 = 0.1" in caplog.text
