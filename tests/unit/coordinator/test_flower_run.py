"""coordinator.flower_run: a Flower run's rows land in a run folder that FlexFL's own readers read (metrics.jsonl
as RoundRecords, the report's run reader with its E and deadline), each written once, and an earlier run in the
folder is refused, not overwritten."""

from __future__ import annotations

import math

import pytest

from coordinator.flower_run import FlowerRunFolder
from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from coordinator.rules.round_record import RoundRecord
from flexfl.app.report.data import read_run
from flexfl.run_folder import RunFolderTaken

RULES = RulesConfig(required_updates=40, eta0=0.5, batch_size=20)


def record(tau: int) -> RoundRecord:
    s = {"node-1": 40, "node-2": 10}
    return RoundRecord(round=tau, lr=0.5 / tau, participants=tuple(s), devices=tuple(s), s=s,
                       p={"node-1": 0.5, "node-2": 0.5}, coefficients={"node-1": 0.5, "node-2": 2.0},
                       discarded=False, test_acc=math.nan, test_loss=math.nan,
                       stop_reason={"node-1": "complete", "node-2": "compute"})


def test_rows_are_written_once_each_with_the_rules_and_the_central_test_of_their_round(tmp_path) -> None:
    out = tmp_path / "run-7"
    folder = FlowerRunFolder.claim(out, rules=RULES, dataset="synthetic", deadline_s=1.5, config={"seed": 0})
    records = [record(1)]
    assert [r.round for r in folder.write_new(records, evaluated_round=1, test_acc=0.5, test_loss=1.2)] == [1]
    records += [record(2), record(3)]  # round 2's evaluation came late: it is written with round 3's
    assert [r.round for r in folder.write_new(records, evaluated_round=3, test_acc=0.7, test_loss=0.9)] == [2, 3]
    assert folder.write_new(records, evaluated_round=4, test_acc=0.8, test_loss=0.8) == []
    folder.close()

    rows = read_metrics(out / "metrics.jsonl")
    assert [(r.round, r.test_acc) for r in rows[::2]] == [(1, 0.5), (3, 0.7)] and math.isnan(rows[1].test_acc)
    assert all(r.E == 40 and r.stop_reason == {"node-1": "complete", "node-2": "compute"} for r in rows)
    assert rows[0].coefficients == {"node-1": 0.5, "node-2": 2.0}
    run = read_run(out)  # what flexfl report shows
    assert (run.kind, run.required_updates, run.deadline_s) == ("live", 40, 1.5)
    assert [r.round for r in run.rounds] == [1, 2, 3] and run.config["flower"] == {"seed": 0}


def test_a_folder_that_holds_an_earlier_run_is_refused(tmp_path) -> None:
    FlowerRunFolder.claim(tmp_path / "run", rules=RULES, dataset="synthetic", deadline_s=0.0, config={}).close()
    with pytest.raises(RunFolderTaken, match="holds an earlier run"):
        FlowerRunFolder.claim(tmp_path / "run", rules=RULES, dataset="synthetic", deadline_s=0.0, config={})
