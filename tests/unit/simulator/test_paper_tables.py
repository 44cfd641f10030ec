"""Tables 4 and 5 from hand-made rounds: the recovery readings, the crossing, and choosing auto's constant."""

import pytest

from coordinator.rules.round_record import RoundRecord
from simulator.paper.table3 import wall_time
from simulator.paper.table4 import recoveries
from simulator.paper.table5 import ROUNDS, Departure, auto_accuracy, baseline_accuracy, choose_c


def test_table4_readings_of_the_baseline():
    # The newcomer arrives during round 4 and trains from round 5 (tau_0 = 5). Round 4 is
    # evaluated on the new test set (0.70) and on the old one (0.80, loss 0.5).
    rows = [RoundRecord(round=r, lr=0.1, participants=(), devices=(), s={}, p={}, coefficients={}, discarded=False,
                        test_acc=a, test_loss=loss, extra_tests={"start": {"acc": sa, "loss": sl}})
            for r, a, loss, sa, sl in [(3, 0.80, 0.5, 0.80, 0.5), (4, 0.70, 0.9, 0.80, 0.5), (5, 0.60, 1.4, 0, 0),
                                    (6, 0.72, 0.8, 0, 0), (7, 0.79, 0.55, 0, 0), (8, 0.81, 0.45, 0, 0)]]
    rec = recoveries({"tau0": 5, "seed": 0, "reboot": "fast"}, rows)
    assert rec.rounds == {"acc/old": 4, "acc/new": 2, "loss/old": 4}


def _dep(gamma, *, tau0=20, crossing_after=10, seed=0):
    """Exclude is worse for `crossing_after` rounds after tau0, then better."""
    include = {r: 1.0 for r in range(1, ROUNDS + 1)}
    exclude = {r: (1.5 if tau0 < r < tau0 + crossing_after else 0.9) for r in range(1, ROUNDS + 1)}
    return Departure(ab=(1.0, 1.0), tau0=tau0, seed=seed, include=include, exclude=exclude, include_active=include,
                     gamma=gamma, auto_choice="exclude")


def test_auto_accuracy_and_the_chosen_constant():
    deps = [_dep(1.0, crossing_after=10), _dep(1.0, crossing_after=10, seed=1)]
    # Horizons 2 and 5 favour include, 10 and more exclude. With Gamma = 1 and tau_0 = 20,
    # auto excludes when T - tau_0 >= c sqrt(20): c between 5/4.47 and 10/4.47 is always right.
    assert baseline_accuracy(deps, "exclude") == pytest.approx(5 / 7)
    assert auto_accuracy(deps, 1.5) == 1.0
    assert auto_accuracy(deps, 0.01) == pytest.approx(5 / 7)  # always excludes
    c, acc = choose_c(deps)
    assert acc == 1.0 and 5 / 20 ** 0.5 < c <= 10 / 20 ** 0.5
    assert auto_accuracy([_dep(None)], 1.0) == pytest.approx(2 / 7)  # no estimate: include


def test_a_resumed_sweeps_time_is_added_to_the_earlier_parts_not_put_in_their_place() -> None:
    first = wall_time(None, "1.3 h for seeds 0-1 (96 runs computed, 0 cached)", computed=96, cached=0)
    assert first == "1.3 h for seeds 0-1 (96 runs computed, 0 cached)"
    resumed = wall_time(first, "31 min for seeds 0-2 (48 runs computed, 96 cached)", computed=48, cached=96)
    assert resumed == f"{first}; then 31 min for seeds 0-2 (48 runs computed, 96 cached)"
    assert wall_time(resumed, "0.1 min (0 runs computed, 144 cached)", computed=0, cached=144) is None
    anew = "2 h anew (144 runs computed, 0 cached)"
    assert wall_time(resumed, anew, computed=144, cached=0) == anew


def test_the_table3_page_says_what_remains_of_a_planned_sweep(tmp_path):
    from simulator.paper.regime import Regime
    from simulator.paper.table3 import READINGS, progress, reading_groups, record_plan

    groups = reading_groups("mnist", READINGS["per-label"], seeds=[0, 1], num_traces=[2, 4], settings=["niid"],
                            regime=Regime())
    assert len(groups) == 4
    record_plan(tmp_path, "mnist", groups, command="cmd one")
    record_plan(tmp_path, "mnist", groups[:2], command="cmd one")  # recorded again: no duplicates
    work = tmp_path / "runs"
    work.mkdir()
    assert progress(tmp_path, "synthetic", work, []) is None  # nothing planned for it
    first = [r.name for r in groups[0].runs]
    (work / f".{next(r.name for r in groups[1].runs)}.partial.pt").write_bytes(b"x")
    summaries = [{"name": n, "group_wall_s": 7200.0} for n in first]
    text = progress(tmp_path, "mnist", work, summaries)
    assert "3 of 12 planned runs finished" in text and "1 of 4 paired groups" in text and "`cmd one`" in text
    second = groups[1].runs[0].name.rsplit("_", 1)[0]
    assert f"In progress, resumable from a checkpoint in `runs/`: {second}." in text
    assert "about 6.0 h on one worker" in text  # 3 open groups x the 2.00 h of the finished one
    everything = [{"name": r.name, "group_wall_s": 1.0} for g in groups for r in g.runs]
    assert progress(tmp_path, "mnist", work, everything).endswith("Nothing remains.")


def test_a_small_rerun_does_not_erase_a_committed_table3_page(tmp_path, capsys):
    import csv as csv_module

    from flexfl.app.cli import main

    out = tmp_path / "results"
    args = ["sim", "table3", "--dataset", "synthetic", "--readings", "per-label", "--settings", "iid",
            "--num-traces-list", "1", "--seeds", "0", "--jobs", "1", "--out", str(out)]
    assert main(args) == 0
    rows = list(csv_module.DictReader(open(out / "table3_runs.csv")))
    assert len(rows) == 3
    # The committed CSV also lists a run this checkout does not have (as on a fresh clone).
    committed = [*rows, {**rows[0], "dataset": "mnist"}]
    with open(out / "table3_runs.csv", "w", newline="") as f:
        w = csv_module.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(committed)
    page = (out / "table3.md").read_text()
    assert main([*args, "--report-only"]) == 0
    assert (out / "table3.md").read_text() == page  # untouched
    assert len(list(csv_module.DictReader(open(out / "table3_runs.csv")))) == 4
    assert (out / "local" / "table3.md").is_file() and (out / "local" / "table3_synthetic_iid.png").is_file()
    assert main([*args, "--report-only", "--replace-page"]) == 0
    assert len(list(csv_module.DictReader(open(out / "table3_runs.csv")))) == 3


def test_table3_with_no_finished_runs_or_backwards_seeds_is_refused(tmp_path, capsys):
    from flexfl.app.cli import main

    out = tmp_path / "results"
    assert main(["sim", "table3", "--dataset", "synthetic", "--seeds", "9-1", "--out", str(out)]) == 2
    assert "runs backwards" in capsys.readouterr().err
    assert main(["sim", "table3", "--dataset", "synthetic", "--report-only", "--out", str(out)]) == 2
    assert "no finished Table 3 runs" in capsys.readouterr().err
    assert not (out / "table3.md").exists()


def test_a_small_rerun_does_not_erase_a_committed_table4_page(tmp_path, monkeypatch):
    import csv as csv_module

    from simulator.paper import table4
    monkeypatch.setattr(table4, "ROUNDS", 80)  # every tau_0 (up to 70) still arrives
    out, work = tmp_path / "results", tmp_path / "runs"
    out.mkdir()
    table4.run_table4("synthetic", seeds=[0], work_dir=work)
    committed = [{"dataset": "mnist", "tau0": 10, "seed": 0, "reboot": "fast", "acc/old": 3, "acc/new": 3,
                  "loss/old": 3}]
    with open(out / "table4_runs.csv", "w", newline="") as f:
        w = csv_module.DictWriter(f, fieldnames=list(committed[0]))
        w.writeheader()
        w.writerows(committed)
    path = table4.write_page(out, work_dirs={"synthetic": work}, seeds=[0], timing={})
    assert path == out / "local" / "table4.md" and (out / "local" / "table4_synthetic.png").is_file()
    assert next(iter(csv_module.DictReader(open(out / "table4_runs.csv"))))["dataset"] == "mnist"  # untouched
    path = table4.write_page(out, work_dirs={"synthetic": work}, seeds=[0], timing={}, replace_page=True)
    assert path == out / "table4.md"
    assert {r["dataset"] for r in csv_module.DictReader(open(out / "table4_runs.csv"))} == {"synthetic"}
