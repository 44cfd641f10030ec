"""`flexfl sim run`'s folder: an earlier run is never overwritten silently (refused, or moved aside with --fresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexfl.app.cli import main

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

    from coordinator.rules.round import RulesConfig
    from flexfl.app.live import load_live_config
    from simulator.paper.regime import Regime

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
    assert "eta_0 = 0.002 with E = 20 steps on mnist is known not to train" in caplog.text
    assert "the default is eta_0 = 0.1" in caplog.text


def test_the_command_a_timeline_run_prints_parses_to_the_live_runs_setup() -> None:
    """The hint gave only --timeline, --deadline-s and --update-s: run as printed it simulated another setup."""
    import re
    import shlex
    from dataclasses import replace

    from flexfl.app.cli import build_parser
    from flexfl.app.live import load_live_config
    from flexfl.app.sim_cli import _schemes, _timeline_run, config_from_args
    from flexfl.config import to_dict
    from simulator.timeline_source import TimelineRun, sim_run_argv, sim_run_hint

    # README's emulated timeline run: MNIST, 3 devices, 12 rounds, E = 1000 at eta_0 0.002; and events.
    live = load_live_config(None, overrides={"partition": {"dataset": "mnist", "n_devices": 3},
                                             "rules": {"required_updates": 1000, "eta0": 0.002, "strategy": "fednova"},
                                             "run": {"rounds": 12}, "arrive_round": 4, "depart_round": 8})
    run = TimelineRun(path="traces/timelines/live example.csv", deadline_s=2.0, update_s=0.000585, round_s=2.5)
    argv = sim_run_argv(partition=live.partition, rules=live.rules, rounds=live.rounds, seed=live.seed, run=run,
                        arrivals=[(2, live.arrival)], departures=[(0, live.departure)])
    line = sim_run_hint(argv, update_s=0.000585, device_rounds=33)
    (printed,) = re.findall(r"`([^`]*)`", line)
    words = shlex.split(printed)
    assert words[:3] == ["flexfl", "sim", "run"]
    args = build_parser().parse_args(words[1:])
    cfg = config_from_args(args)
    assert cfg.partition == live.partition and cfg.rounds == 12 and cfg.seed == live.seed
    assert to_dict(replace(cfg.rules, strategy="fednova")) == to_dict(live.rules) and _schemes(args) == ["fednova"]
    assert _timeline_run(args) == run
    assert [(a.device, a.round) for a in cfg.schedule.arrivals] == [(2, 4)]
    assert [(d.device, d.round) for d in cfg.schedule.departures] == [(0, 8)]


def test_sim_run_help_states_its_partition_defaults_and_names_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--mu named a --strategy flag that sim run lacks; --dataset and --devices had no help or default."""
    from simulator.sim_config import SimConfig

    with pytest.raises(SystemExit):
        main(["sim", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    default = SimConfig().partition
    assert (f"--dataset {{mnist,emnist,synthetic}} the dataset to split over the devices (default {default.dataset})"
            in text)
    assert f"--devices N number of devices (shards) (default {default.n_devices})" in text
    # --strategy is sim run's own spelling of --scheme (one or more runs), not the rules' flag of `flexfl live`
    assert "--mu MU --scheme fedprox: mu" in text and "--scheme NAME, --strategy NAME" in text


def test_rounds_csv_reads_back_as_typed_rows_with_a_field_per_column(tmp_path: Path) -> None:
    """rounds.csv's reader (simulator.sim_rows.read_rounds_csv) has a field for each column records_as_rows
    writes, in order, and reads a run's file back; a bad cell names the file, line and column."""
    import dataclasses

    from flexfl.errors import ReportError
    from simulator.sim_rows import CSV_FIELDS, IDENT_FIELDS, RoundsCsvRow, read_rounds_csv

    out = tmp_path / "sim"
    assert main([*TINY, "--rounds", "2", "--out", str(out)]) == 0
    text = (out / "rounds.csv").read_text()
    header = text.splitlines()[0].split(",")
    assert header == [f.name for f in dataclasses.fields(RoundsCsvRow)] == [*IDENT_FIELDS, *CSV_FIELDS]
    rows = read_rounds_csv(out / "rounds.csv")
    assert [(r.round, r.scheme, r.dataset, r.num_traces) for r in rows] == [(1, "C", "synthetic", 3),
                                                                             (2, "C", "synthetic", 3)]
    assert all(r.discarded is False and r.test_acc is not None and 0 <= r.test_acc <= 1 for r in rows)
    (out / "rounds.csv").write_text(text.replace(",False,", ",maybe,", 1))
    with pytest.raises(ReportError, match=r"rounds\.csv:2: column 'discarded': expected True or False or empty, "
                                          r"got 'maybe'"):
        read_rounds_csv(out / "rounds.csv")


def test_accuracy_curve_reads_each_rounds_accuracy_and_refuses_a_line_without_one(tmp_path: Path) -> None:
    """The pages' curves (simulator.sim_rows.read_accuracy_curve) are the CSV's test_acc column, round by round;
    a line with an empty test_acc is named, not read as a gap or a zero."""
    from flexfl.errors import ReportError
    from simulator.sim_rows import read_accuracy_curve, read_rounds_csv

    out = tmp_path / "sim"
    assert main([*TINY, "--rounds", "3", "--out", str(out)]) == 0
    assert read_accuracy_curve(out / "rounds.csv") == [r.test_acc for r in read_rounds_csv(out / "rounds.csv")]
    lines = (out / "rounds.csv").read_text().splitlines()
    header = lines[0].split(",")
    second = lines[2].split(",")
    second[header.index("test_acc")] = ""
    (out / "rounds.csv").write_text("\n".join([*lines[:2], ",".join(second), *lines[3:]]) + "\n")
    with pytest.raises(ReportError, match=r"no test_acc in round\(s\) \[2\]"):
        read_accuracy_curve(out / "rounds.csv")


def test_a_runs_rows_and_run_json_say_the_eta0_and_batch_size_it_trained_with(tmp_path: Path) -> None:
    """A simulated run records its operating point as a live run does (issue 33: sim rows had no eta0): the dataset's
    default eta0 and batch size where the config leaves them out, the given ones otherwise; the report shows them."""
    import json

    from coordinator.metrics import read_metrics
    from coordinator.rules.config import RulesConfig
    from flexfl.app.report.sections import config_rows

    default = RulesConfig(required_updates=3)
    for extra, eta0, batch in (([], default.eta0_for("synthetic"), default.batch_size_for("synthetic")),
                               (["--eta0", "0.05"], 0.05, default.batch_size_for("synthetic"))):
        out = tmp_path / f"sim{len(extra)}"
        assert main([*TINY, "--rounds", "2", "--out", str(out), *extra]) == 0
        rows = read_metrics(out / "C" / "metrics.jsonl")
        assert all(r.rules is not None and (r.rules["eta0"], r.rules["batch_size"]) == (eta0, batch) for r in rows)
        config = json.loads((out / "C" / "run.json").read_text())["config"]
        shown = dict(config_rows(config, out / "C"))
        assert (shown["rules.eta0"], shown["rules.batch_size"]) == (str(eta0), str(batch))
