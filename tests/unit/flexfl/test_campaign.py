"""Campaign files read into their runs, each run's folder says what to do with it, and the page's medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flexfl.app.campaign.runner import Plan, plan_run
from flexfl.app.campaign.spec import read_campaign
from flexfl.app.live import CONFIG_NAME
from flexfl.campaign_index import CampaignIndex, RunResult, RunState, groups, page
from flexfl.config import write_config
from flexfl.errors import ConfigError

BASE = """
[campaign]
name = "c1"

[base]
arrive_round = 0
depart_round = 0
[base.run]
rounds = 4
[base.traces]
set = ""
[base.partition]
dataset = "synthetic"
n_devices = 3
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_runs_are_the_product_of_the_axes_first_axis_outermost_named_by_their_values(tmp_path: Path) -> None:
    c = read_campaign(_file(tmp_path, BASE + '[axes]\n"rules.strategy" = ["scheme-a", "fednova"]\n'
                                             '"run.seed" = [0, 1]\n"run.deadline_s" = [1.5]\n'))
    assert [r.name for r in c.runs] == ["strategy-scheme-a__seed-0__deadline_s-1.5",
                                        "strategy-scheme-a__seed-1__deadline_s-1.5",
                                        "strategy-fednova__seed-0__deadline_s-1.5",
                                        "strategy-fednova__seed-1__deadline_s-1.5"]
    cfg = c.config(c.runs[3], out=tmp_path / "r", settings={"emulate": {"enabled": True}})
    assert (cfg.rules.aggregation.name, cfg.seed, cfg.deadline_s, cfg.rounds) == ("fednova", 1, 1.5, 4)
    assert cfg.emulate.enabled and cfg.out == str(tmp_path / "r") and cfg.devices == 3


def test_a_relative_path_in_base_or_an_axis_is_relative_to_the_campaign_file(tmp_path: Path) -> None:
    text = BASE + '[axes]\n"traces.set" = ["traces/b"]\n'
    (tmp_path / "traces").mkdir()
    c = read_campaign(_file(tmp_path, text.replace('[base.traces]\nset = ""\n', "")))
    assert c.runs[0].overrides == {"traces": {"set": str(tmp_path.resolve() / "traces" / "b")}}
    assert c.runs[0].name == "set-b"


@pytest.mark.parametrize(("axes", "message"), [
    ('"run.seed" = []\n', "[axes] run.seed must be a non-empty list of values"),
    ('"run.seed" = 3\n', "[axes] run.seed must be a non-empty list of values"),
    ('"run.seed" = [1, 1]\n', "[axes] run.seed repeats a value"),
    ('out = ["a", "b"]\n', "[axes] out is set by the campaign itself"),
    ('fleet = ["a.toml"]\n', "[axes] fleet is set by the campaign itself"),
    ('"run.rounds" = [3, 0]\n', "run 2 (rounds-0): "),
    ('"rules.strategy" = ["scheme-c", "nope"]\n', "run 2 (strategy-nope): "),
])
def test_bad_axes_fail_when_the_file_is_read_naming_the_axis_or_the_run(tmp_path: Path, axes: str,
                                                                        message: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_campaign(_file(tmp_path, BASE + "[axes]\n" + axes))
    assert message in str(err.value), err.value


def test_an_unknown_table_or_campaign_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown table\(s\) axis; a campaign has \[campaign\], \[base\]"):
        read_campaign(_file(tmp_path, BASE + "[axis]\nrounds = [1]\n"))
    with pytest.raises(ConfigError, match=r"\[campaign\] has unknown key\(s\) rounds"):
        read_campaign(_file(tmp_path, BASE.replace('name = "c1"', 'name = "c1"\nrounds = 3')))


def test_a_runs_folder_says_whether_it_ended_was_interrupted_or_holds_another_config(tmp_path: Path) -> None:
    c = read_campaign(_file(tmp_path, BASE + '[axes]\n"run.seed" = [0, 1]\n'))
    run_dir = tmp_path / "runs" / c.runs[0].name
    cfg = c.config(c.runs[0], out=run_dir)
    assert plan_run(run_dir, cfg) is Plan.START  # no folder
    run_dir.mkdir(parents=True)
    write_config(run_dir / CONFIG_NAME, cfg)
    assert plan_run(run_dir, cfg) is Plan.RESTART  # started, but nothing to continue
    (run_dir / "coordinator").mkdir()
    (run_dir / "coordinator" / "checkpoint.pt").write_bytes(b"x")
    assert plan_run(run_dir, cfg) is Plan.RESUME
    (run_dir / "summary.json").write_text("{}")
    assert plan_run(run_dir, cfg) is Plan.SKIP
    # The same folder under another seed (the campaign file changed): started again, never skipped.
    other = c.config(c.runs[1], out=run_dir)
    assert plan_run(run_dir, other) is Plan.RESTART
    # Moved elsewhere, a folder still holds the same run.
    moved = c.config(c.runs[0], out=tmp_path / "elsewhere")
    assert plan_run(run_dir, moved) is Plan.SKIP


def _result(i: int, strategy: str, seed: int, acc: float | None, state: RunState = RunState.DONE) -> RunResult:
    return RunResult(index=i, name=f"{strategy}-{seed}", values={"rules.strategy": strategy, "run.seed": seed},
                     state=state, rounds=None if acc is None else 4, final_acc=acc, last20_acc=acc,
                     final_loss=None if acc is None else 1 - acc)


def test_the_page_shows_medians_and_ranges_over_seeds_per_group_and_the_index_reads_back() -> None:
    index = CampaignIndex(name="c1", file="c.toml", target="loopback",
                          axes={"rules.strategy": ["a", "b"], "run.seed": [0, 1, 2]},
                          runs=(_result(0, "a", 0, 0.5), _result(1, "a", 1, 0.9), _result(2, "a", 2, 0.6),
                                _result(3, "b", 0, 0.7), _result(4, "b", 1, None, RunState.PENDING),
                                _result(5, "b", 2, 0.8, RunState.FAILED)))
    assert [g.values for g in groups(index, seed_key="run.seed")] == [{"rules.strategy": "a"}, {"rules.strategy": "b"}]
    text = page(index, seed_key="run.seed")
    assert "| a | 60.0 [50.0, 90.0] (n=3) |" in text
    assert "| b | 75.0 [70.0, 80.0] (n=2) |" in text  # the pending run is not counted, the failed one is
    assert "| b | 0.250 [0.200, 0.300] (n=2) |" in text  # the loss at three decimals, unscaled
    assert "5 of 6 runs ended, on loopback" in text
    again = CampaignIndex.from_json(index.to_json(), where="x")
    assert again == index
    with pytest.raises(ConfigError, match=r"^x: not a campaign index"):
        CampaignIndex.from_json(json.dumps({"name": "c1"}), where="x")
