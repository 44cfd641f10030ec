"""One config dialect (docs/config.md): coordinator, `flexfl live` and `flexfl sim run` files share tables and keys.

Issue 34 item 5: `rounds` sat under [run] in a coordinator file and at the top level of a live
file; `sim run --config` ran A, B and C whatever [rules] said; scheme and strategy together were
accepted silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.config import load_coordinator_config
from flexfl.app.cli import build_parser, main
from flexfl.app.live import load_live_config
from flexfl.app.sim_cli import config_from_args
from flexfl.config import to_dict
from flexfl.errors import ConfigError
from flexfl.vocabulary import Scheme

SHARED = """
[run]
rounds = 7
seed = 3

[partition]
dataset = "synthetic"
n_devices = 4
total_samples = 400
sizes = "equal"

[rules]
required_updates = 3
eta0 = 0.05

[rules.strategy]
name = "fedprox"
mu = 0.01
"""


def _file(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _sim(path: Path, *flags: str):
    return config_from_args(build_parser().parse_args(["sim", "run", "--config", str(path), *flags]))


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flexfl: error: ") and "\n" not in err, err
    return err


def test_the_same_file_reads_alike_in_the_coordinator_live_and_the_simulator(tmp_path):
    path = _file(tmp_path, SHARED)
    coordinator, live, sim = load_coordinator_config(path), load_live_config(path), _sim(path)
    for cfg in (coordinator, live, sim):
        assert (cfg.run.rounds, cfg.run.seed) == (7, 3)
        assert to_dict(cfg.partition) == to_dict(coordinator.partition)
        assert cfg.rules == coordinator.rules and cfg.rules.aggregation.name == "fedprox"
        assert cfg.rules.aggregation.parameters == {"mu": 0.01}
    assert (live.rounds, live.seed, sim.rounds, sim.seed) == (7, 3, 7, 3)  # what the run logic reads
    with_deadline = _file(tmp_path, SHARED.replace("seed = 3", "seed = 3\ndeadline_s = 4.5"), "deadline.toml")
    assert load_coordinator_config(with_deadline).run.deadline_s == load_live_config(with_deadline).deadline_s == 4.5
    with pytest.raises(ConfigError, match=r"\[run\]\.deadline_s: unknown key; .*valid keys: rounds, seed"):
        _sim(with_deadline)  # a simulation has no deadline in its file: --deadline-s goes with --timeline


def test_traces_are_one_table_in_live_and_sim_files(tmp_path):
    path = _file(tmp_path, SHARED + '\n[traces]\nset = "sets/mine"\nnum_traces = 2\n')
    live, sim = load_live_config(path), _sim(path)
    assert live.traces == sim.traces and (live.trace_set, live.num_traces) == (str(tmp_path / "sets/mine"), 2)
    assert (load_live_config(None).num_traces, _sim(_file(tmp_path, SHARED, "no_traces.toml")).traces.num_traces) \
        == (5, 8)  # each program keeps its own default


@pytest.mark.parametrize("command", [["coordinator", "--config"], ["live", "--config"], ["sim", "run", "--config"]])
def test_scheme_and_strategy_together_are_refused_with_one_line(tmp_path, capsys, command):
    path = _file(tmp_path, SHARED.replace("eta0 = 0.05", 'eta0 = 0.05\nscheme = "C"'))
    err = _one_line_error([*command, str(path), *(["--out", str(tmp_path / "o")] if command[0] != "coordinator"
                                                   else [])], capsys)
    assert err.endswith(f"{path}: [rules] scheme and strategy both given; give one (scheme is the older spelling of "
                        "[rules.strategy] name = 'scheme-a' | 'scheme-b' | 'scheme-c')")
    assert not (tmp_path / "o").exists()


def test_a_flag_naming_the_other_one_replaces_the_files_and_a_written_file_names_one(tmp_path):
    path = _file(tmp_path, SHARED)
    assert load_coordinator_config(path, overrides={"rules": {"scheme": "A"}}).rules.aggregation.name == "scheme-a"
    scheme_file = _file(tmp_path, '[rules]\nscheme = "B"\n', "scheme.toml")
    flagged = load_coordinator_config(scheme_file, overrides={"rules": {"strategy": "fednova"}})
    assert flagged.rules.aggregation.name == "fednova" and flagged.rules.scheme is Scheme.C
    written = to_dict(load_coordinator_config(path).rules)
    assert "scheme" not in written and written["strategy"] == {"name": "fedprox", "mu": 0.01}
    by_scheme = to_dict(load_coordinator_config(scheme_file).rules)
    assert by_scheme["scheme"] == "B" and "strategy" not in by_scheme


def test_a_key_in_its_old_and_its_new_place_is_refused_with_one_line(tmp_path, capsys):
    path = _file(tmp_path, "rounds = 5\n" + SHARED)
    err = _one_line_error(["sim", "run", "--config", str(path), "--out", str(tmp_path / "o")], capsys)
    assert err.endswith(f"{path}: rounds and [run].rounds both given (the first is the older place of the second); "
                        "keep [run].rounds")
    err = _one_line_error(["live", "--config", str(path), "--out", str(tmp_path / "o")], capsys)
    assert "rounds and [run].rounds both given" in err


def test_an_older_live_file_is_refused_with_the_new_form_shown(tmp_path, capsys):
    path = _file(tmp_path, 'rounds = 12\ndeadline_s = 2.5\nnum_traces = 3\n[partition]\nn_devices = 5\n')
    with pytest.raises(ConfigError) as caught:
        load_live_config(path)
    assert str(caught.value) == (f"{path}: rounds, deadline_s, num_traces at the top level moved to [run] and "
                                 "[traces] (docs/config.md); write\n[run]\nrounds = 12\ndeadline_s = 2.5\n[traces]\n"
                                 "num_traces = 3")
    written = tmp_path / "fixed.toml"
    written.write_text(str(caught.value).partition("write\n")[2] + "\n[partition]\nn_devices = 5\n")
    fixed = load_live_config(written)  # the form shown reads, with the same values
    assert (fixed.rounds, fixed.deadline_s, fixed.num_traces) == (12, 2.5, 3)


def test_an_older_sim_file_still_reads_with_the_same_values(tmp_path):
    old = _file(tmp_path, SHARED.replace("[run]\nrounds = 7\nseed = 3\n", "rounds = 7\nseed = 3\n"), "old.toml")
    assert "[run]" not in old.read_text()
    assert _sim(old) == _sim(_file(tmp_path, SHARED))


def test_an_unknown_key_is_refused_naming_the_valid_ones(tmp_path, capsys):
    path = _file(tmp_path, SHARED.replace("seed = 3", "seed = 3\nroundz = 4"))
    err = _one_line_error(["live", "--config", str(path), "--out", str(tmp_path / "o")], capsys)
    assert "[run].roundz: unknown key; did you mean 'rounds'? valid keys: rounds, seed, deadline_s" in err


def test_sim_run_with_a_config_runs_the_strategy_its_rules_name(tmp_path, capsys):
    """It ran Schemes A, B and C whatever [rules] said; `flexfl live` runs the file's strategy."""
    path = _file(tmp_path, SHARED.replace("rounds = 7", "rounds = 2"))
    out = tmp_path / "out"
    assert main(["sim", "run", "--config", str(path), "--out", str(out), "--num-traces", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["final_acc"]) == ["fedprox"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["fedprox"]
    run_info = json.loads((out / "fedprox" / "run.json").read_text())
    assert run_info["config"]["rules"]["strategy"] == {"name": "fedprox", "mu": 0.01}
    assert run_info["config"]["run"] == {"rounds": 2, "seed": 3}
    assert "FedProx" in capsys.readouterr().out
