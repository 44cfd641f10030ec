"""The round record: every old metrics row still reads, today's rows read back to themselves, bad rows say where."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from coordinator.rules.round_record import LiveRound, RoundRecord, RoundRecordError

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parents[3]
# Real files written by the code before the record existed (6b186a0): `flexfl live --dataset synthetic
# --devices 3 --rounds 4 --arrive-round 2 --depart-round 3 --deadline-s 1`, and a MIFA run of 3 rounds.
LIVE = DATA / "live_metrics_6b186a0.jsonl"
MIFA = DATA / "live_mifa_metrics_6b186a0.jsonl"


def _objects(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _records(path: Path) -> list[RoundRecord]:
    return [RoundRecord.from_json(obj, where=f"{path}:{i}") for i, obj in enumerate(_objects(path), 1)]


@pytest.mark.parametrize("path", [LIVE, MIFA], ids=["live", "mifa"])
def test_a_live_row_written_before_the_record_reads_back_to_the_same_json(path) -> None:
    objects = _objects(path)
    records = _records(path)
    assert [r.to_json() for r in records] == objects
    assert all(r.live is not None and r.live.close_reason == "all answered" for r in records)


def test_the_live_fixture_reads_its_events_counts_and_live_part() -> None:
    r1, r2, r3, r4 = _records(LIVE)
    assert (r1.round, r1.lr, r1.participants, dict(r1.s)) == (1, 1.0, ("dev-0", "dev-1"), {"dev-0": 13, "dev-1": 12})
    assert r2.arrivals == ("dev-2",) and r2.events == "+dev-2"
    assert r3.departures == ("dev-0",) and r3.events == "-dev-0(exclude)" and r3.active == 3
    assert r4.devices == ("dev-1", "dev-2") and r4.mean_s == pytest.approx(11.5)
    assert r1.coef_sum == pytest.approx(0.7692307692307693 + 0.8333333333333334)
    assert r1.live is not None and r1.live.overhead_s is None and r1.live.pull_wakeups == 2
    assert r1.stop_reason == {"dev-0": "trace", "dev-1": "trace"}
    assert r1.rules is None and r1.E is None and r1.complete is None  # these rows did not record the rules


def test_a_mifa_row_keeps_its_remembered_devices() -> None:
    remembered = [r.remembered for r in _records(MIFA)]
    assert remembered[-1] and all(isinstance(d, str) for d in remembered[-1])


def test_a_committed_simulation_row_from_before_founded_existed_reads() -> None:
    path = ROOT / "results/runs/operating_point_mnist/epoch_iid_seed100_k+0.metrics.jsonl.gz"
    objects = _objects(path)
    assert "founded" not in objects[0]  # an older row than today's writer makes
    records = _records(path)
    assert [r.round for r in records] == [o["round"] for o in objects]
    assert records[0].founded == () and records[0].live is None
    assert records[0].s == objects[0]["s"] and records[-1].test_acc == pytest.approx(objects[-1]["test_acc"])


def test_counts_follow_from_s_and_the_rules_E() -> None:
    r = RoundRecord(round=3, lr=0.1, participants=("a", "b", "c"), devices=("a", "b", "c"),
                    s={"a": 0, "b": 5, "c": 20}, p={"a": 0.2, "b": 0.3, "c": 0.5},
                    coefficients={"a": 0.0, "b": 1.2, "c": 0.5}, discarded=False, test_acc=0.5, test_loss=1.0,
                    rules={"required_updates": 20, "eta0": 0.1})
    assert (r.E, r.active, r.complete, r.mean_s, r.coef_sum) == (20, 2, 1, pytest.approx(25 / 3), pytest.approx(1.7))


def test_a_simulated_record_with_its_own_fields_and_a_rule_change_round_trips() -> None:
    r = RoundRecord(round=1, lr=0.5, participants=("dev-0",), devices=("dev-0",), s={"dev-0": 4}, p={"dev-0": 1.0},
                    coefficients={"dev-0": 1.0}, discarded=False, test_acc=math.nan, test_loss=math.inf,
                    arrivals=("dev-1",), departures=("dev-0",), departure_policies={"dev-0": "auto"},
                    departure_gammas={"dev-0": 0.25}, remembered=("dev-0",), extra_tests={"start": {"acc": 0.9}},
                    train_loss=0.7, seconds=1.5, members=1, rules={"required_updates": 5},
                    rule_changes={"eta0": (0.5, 0.1), "required_updates": (5, 7)})
    obj = json.loads(json.dumps(r.to_json()))  # through real JSON: NaN and Inf are written as null
    assert obj["test_acc"] is None and obj["test_loss"] is None and "close_reason" not in obj
    back = RoundRecord.from_json(obj, where="x:1")
    assert math.isnan(back.test_acc) and math.isnan(back.test_loss)
    assert back.rule_changes == {"eta0": (0.5, 0.1), "required_updates": (5, 7)}
    assert (back.train_loss, back.seconds, back.members, back.extra_tests) == (0.7, 1.5, 1, {"start": {"acc": 0.9}})
    assert back.events == "+dev-1 -dev-0(auto)" and back.live is None


def test_a_live_part_without_the_fields_added_later_reads_with_them_left_out() -> None:
    first = {"round": 1, "time": 1.0, "lr": 0.1, "close_reason": "deadline", "participants": ["a"], "devices": ["a"],
             "s": {"a": 2}, "p": {"a": 1.0}, "coefficients": {"a": 1.0}, "discarded": False, "test_acc": 0.1,
             "test_loss": 2.0, "bytes_out": {"a": 10}, "bytes_in": {}, "train_s": {}, "local_loss": {},
             "rejected": {"a": ["late"]}, "arrivals": [], "departures": [], "round_s": 2.0, "aggregate_eval_s": 0.1,
             "overhead_s": None}  # the keys of the first live rows (e14278d)
    r = RoundRecord.from_json(first, where="old.jsonl:1")
    assert r.live == LiveRound(time=1.0, close_reason="deadline", bytes_out={"a": 10}, bytes_in={}, train_s={},
                               local_loss={}, rejected={"a": ("late",)}, round_s=2.0, aggregate_eval_s=0.1,
                               overhead_s=None)
    assert r.departure_policies == {} and r.founded == ()


@pytest.mark.parametrize(("change", "message"), [
    ({"lr": "fast"}, "runs/metrics.jsonl:7: field 'lr': expected a number, got 'fast'"),
    ({"s": {"dev-0": 1.5}}, "runs/metrics.jsonl:7: field 's': at key 'dev-0': expected an integer, got 1.5"),
    ({"participants": "dev-0"}, "runs/metrics.jsonl:7: field 'participants': expected a list of strings"),
    ({"discarded": 0}, "runs/metrics.jsonl:7: field 'discarded': expected true or false, got 0"),
])
def test_a_malformed_row_names_the_file_line_and_field(change, message) -> None:
    obj = _objects(LIVE)[0] | change
    with pytest.raises(RoundRecordError) as err:
        RoundRecord.from_json(obj, where="runs/metrics.jsonl:7")
    assert message in str(err.value)


def test_a_row_without_a_required_field_or_not_an_object_is_refused() -> None:
    obj = _objects(LIVE)[0]
    del obj["devices"]
    with pytest.raises(RoundRecordError, match=r"m\.jsonl:2: field 'devices': missing"):
        RoundRecord.from_json(obj, where="m.jsonl:2")
    with pytest.raises(RoundRecordError, match=r"m\.jsonl:3: expected a JSON object per line, got list"):
        RoundRecord.from_json([1, 2], where="m.jsonl:3")


def test_the_rules_record_fills_in_the_papers_eta0_so_naming_that_value_on_resume_changes_nothing() -> None:
    from coordinator.rules.config import RulesConfig
    from coordinator.rules.round_record import rule_changes, rules_record

    left_out = rules_record(RulesConfig(), dataset="mnist")
    assert left_out["eta0"] == RulesConfig().eta0_for("mnist") and left_out["required_updates"] == 20
    assert rule_changes(left_out, rules_record(RulesConfig(eta0=left_out["eta0"]), dataset="mnist")) == {}
    assert rule_changes(left_out, rules_record(RulesConfig(eta0=0.5, unit="epoch"), dataset="mnist")) == {
        "eta0": (left_out["eta0"], 0.5), "unit": ("step", "epoch")}


def test_rule_changes_name_a_nested_table_setting_by_its_dotted_name() -> None:
    from coordinator.rules.round_record import rule_changes

    old = {"strategy": {"name": "fedprox", "mu": 0.1}, "fast_reboot": True}
    new = {"strategy": {"name": "fedprox", "mu": 0.5}, "fast_reboot": True, "batch_size": 32}
    assert rule_changes(old, new) == {"batch_size": (None, 32), "strategy.mu": (0.1, 0.5)}


def test_a_changed_resume_is_refused_with_each_change_unless_allowed(tmp_path, caplog) -> None:
    from coordinator.checkpoint import Checkpoint
    from coordinator.resume import changed_rules
    from flexfl.errors import ConfigError

    def ckpt(rules):
        return Checkpoint(params={}, completed_round=3, run_id="r", registry={}, objective={}, rules=rules)

    old, new = {"eta0": 0.5, "required_updates": 5}, {"eta0": 0.1, "required_updates": 5}
    path = tmp_path / "out" / "checkpoint.pt"
    with pytest.raises(ConfigError, match=r"--resume: the rules differ .* \(eta0: 0\.5 -> 0\.1\).*--allow-rule-change"):
        changed_rules(ckpt(old), new, path=path, allow_rule_change=False)
    assert changed_rules(ckpt(old), new, path=path, allow_rule_change=True) == {"eta0": (0.5, 0.1)}
    assert changed_rules(ckpt(old), dict(old), path=path, allow_rule_change=False) == {}
    assert changed_rules(ckpt(None), new, path=path, allow_rule_change=False) == {}  # an older checkpoint
    assert "records no rules" in caplog.text


def test_a_checkpoint_keeps_the_resumed_rules_until_a_row_has_recorded_their_change(tmp_path) -> None:
    """A resume allowed to change the rules and stopped before its first round: the next resume must
    still see the old rules (and be refused, or record the change), not the new ones as if nothing changed."""
    import torch

    from coordinator.checkpoint import Checkpoint, load_checkpoint
    from coordinator.finisher import Finisher
    from coordinator.metrics import MetricsWriter

    params = {"w": torch.zeros(2)}
    finisher = Finisher(model=torch.nn.Linear(2, 2), data=None, evaluate=False,
                        metrics=MetricsWriter(tmp_path / "metrics.jsonl", append=True),
                        checkpoint_path=tmp_path / "checkpoint.pt", rules={"eta0": 0.1}, resumed_rules={"eta0": 0.5})
    finisher.save(Checkpoint(params=params, completed_round=3, run_id="r", registry={}, objective={}))
    assert load_checkpoint(tmp_path / "checkpoint.pt", expected={"w": ((2,), None)}).rules == {"eta0": 0.5}
    unchanged = Finisher(model=torch.nn.Linear(2, 2), data=None, evaluate=False,
                         metrics=MetricsWriter(tmp_path / "metrics.jsonl", append=True),
                         checkpoint_path=tmp_path / "checkpoint.pt", rules={"eta0": 0.1}, resumed_rules={"eta0": 0.1})
    unchanged.save(Checkpoint(params=params, completed_round=3, run_id="r", registry={}, objective={}))
    assert load_checkpoint(tmp_path / "checkpoint.pt", expected={"w": ((2,), None)}).rules == {"eta0": 0.1}
