"""The report's adapter: every run format it reads, and clear errors for what it cannot."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from flexfl.app.report.data import DeviceInfo, detect, natural_key, read_run, read_sweep, read_sweep_curve
from flexfl.errors import ReportError

REPO = Path(__file__).resolve().parents[3]


def test_todays_live_folder_gets_deadline_E_and_traces_from_its_tomls(live_dir):
    run = read_run(live_dir)
    assert run.kind == "live"
    assert run.deadline_s == 2.0 and run.required_updates == 10
    assert run.devices == {"dev-0": DeviceInfo("T0", 0), "dev-1": DeviceInfo("T30", 1),
                           "dev-2": DeviceInfo("T50", 2), "dev-3": DeviceInfo(None, 3)}
    assert run.config["traces"]["set"] == "/somewhere/traces/paper"  # as a live or sim file says it
    assert run.sources[:2] == ("coordinator/metrics.jsonl", "coordinator.toml")
    assert [r.round for r in run.rounds] == [1, 2, 3, 4]
    r2 = run.rounds[1]
    assert r2.s == {"dev-0": 10, "dev-1": 0, "dev-2": 6}
    assert r2.rejected == {"dev-1": ("tensor 'fc.weight' has shape (3,) not (10, 5)",)}
    assert r2.arrivals == ("dev-3",) and r2.departures == ()
    assert r2.bytes_out == {"dev-0": 1000, "dev-1": 1000, "dev-2": 1000}
    assert run.rounds[0].overhead_s is None and run.rounds[1].overhead_s == 0.01


def test_run_json_wins_and_missing_fields_are_none(sim_dir):
    run = read_run(sim_dir)
    assert run.kind == "sim" and run.sources == ("run.json", "metrics.jsonl")
    assert run.deadline_s is None and run.required_updates == 10
    assert run.devices["dev-2"] == DeviceInfo(None, 2) and run.devices["dev-3"].trace == "Tlo"
    r = run.rounds[2]
    assert r.s["dev-3"] == 2
    assert r.bytes_in is None and r.round_s is None and r.rejected is None and r.close_reason is None


def test_metrics_at_the_top_win_over_coordinator_subfolder(live_dir):
    shutil.copy(live_dir / "coordinator" / "metrics.jsonl", live_dir / "metrics.jsonl")
    lines = (live_dir / "metrics.jsonl").read_text().splitlines()[:2]
    (live_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert len(read_run(live_dir).rounds) == 2


def test_a_torn_last_line_is_skipped_but_a_bad_middle_line_is_an_error(live_dir):
    path = live_dir / "coordinator" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + '\n{"round": 5, "s": {"dev-1"')
    assert [r.round for r in read_run(live_dir).rounds] == [1, 2, 3, 4]
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(ReportError, match=r"metrics\.jsonl:2: not valid JSON"):
        read_run(live_dir)


@pytest.mark.parametrize("field, value, message", [
    ("s", ["dev-0"], r"metrics\.jsonl:1: field 's': expected an object"),
    ("s", {"dev-0": 2.5}, r"metrics\.jsonl:1: field 's': at key 'dev-0': expected an integer, got 2\.5"),
    ("test_acc", "high", r"field 'test_acc': expected a number, got 'high'"),
    ("participants", "dev-0", r"field 'participants': expected a list of strings \(device ids"),
    ("discarded", "no", r"field 'discarded': expected true or false"),
])
def test_a_malformed_field_names_file_line_and_field(live_dir, field, value, message):
    path = live_dir / "coordinator" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    record[field] = value
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    with pytest.raises(ReportError, match=message):
        read_run(live_dir)


def test_a_record_without_round_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"test_acc": 0.5}\n{"round": 2}\n')
    with pytest.raises(ReportError, match=r"metrics\.jsonl:1: field 'round': missing"):
        read_run(tmp_path)


def test_bad_run_json_names_the_field(sim_dir):
    meta = json.loads((sim_dir / "run.json").read_text())
    (sim_dir / "run.json").write_text(json.dumps({**meta, "kind": "emulated"}))
    with pytest.raises(ReportError, match=r"run\.json: field 'kind': expected 'live' or 'sim', got 'emulated'"):
        read_run(sim_dir)
    (sim_dir / "run.json").write_text(json.dumps({**meta, "required_updates": "twenty"}))
    with pytest.raises(ReportError, match=r"field 'required_updates': expected int"):
        read_run(sim_dir)


def test_todays_sim_folder_gives_one_variant_per_scheme(tmp_path):
    with open(tmp_path / "rounds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "scheme", "seed", "round", "lr", "active", "discarded", "test_acc", "test_loss"])
        for scheme in "ABC":
            for n in (1, 2):
                w.writerow(["synthetic", scheme, 0, n, 1 / n, 5, "False", 0.1 * n, "nan" if n == 2 else 2.0])
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"E": 20, "dataset": "synthetic"}}))
    run = read_run(tmp_path)
    assert run.kind == "sim" and run.required_updates == 20
    variants = run.variants()
    assert list(variants) == ["A", "B", "C"]
    assert [r.test_acc for r in variants["B"]] == [0.1, 0.2]
    assert variants["C"][1].test_loss is None and variants["C"][1].s is None


def test_detect_each_kind_and_a_clear_error_otherwise(tmp_path, live_dir, sim_dir):
    assert detect(live_dir) == "run" and detect(sim_dir) == "run"
    assert detect(REPO / "traces" / "paper") == "traces"
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "schemes_synthetic_final.csv").write_text("setting,num_traces,seed,scheme,final_acc\n")
    assert detect(tmp_path / "sweep") == "sweep"
    (tmp_path / "campaign").mkdir()
    (tmp_path / "campaign" / "campaign.json").write_text("{}")
    assert detect(tmp_path / "campaign") == "campaign"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=r"empty: not a run \(run\.json, metrics\.jsonl.*\), a sweep .*\), "
                                          r"a trace set \(manifest\.json\) or a campaign \(campaign\.json\)$"):
        detect(tmp_path / "empty")
    with pytest.raises(ReportError, match="no such folder"):
        detect(tmp_path / "missing")


def test_a_results_folder_and_its_work_folder_read_the_same(sweep_dir):
    from_results = read_sweep(sweep_dir).datasets[0]
    from_work = read_sweep(sweep_dir / "runs" / "schemes_synthetic").datasets[0]
    assert from_results.dataset == from_work.dataset == "synthetic"
    key = lambda r: (r["seed"], r["scheme"])  # noqa: E731
    assert sorted(from_results.final, key=key) == sorted(from_work.final, key=key)
    assert from_results.runs_dir == sweep_dir / "runs" / "schemes_synthetic"
    curve = read_sweep_curve(from_results.runs_dir, setting="niid", num_traces=3, seed=1, scheme="B")
    assert curve == pytest.approx([0.2, 0.4, 0.6])
    assert read_sweep_curve(from_results.runs_dir, setting="iid", num_traces=3, seed=1, scheme="B") is None


def test_the_table3_page_reads_as_one_dataset_per_reading(tmp_path):
    """results/ of `flexfl sim table3`: table3_runs.csv, curves in runs/table3_<dataset>/<reading>_...csv."""
    root = tmp_path / "results"
    runs = root / "runs" / "table3_synthetic"
    runs.mkdir(parents=True)
    rows = [{"dataset": "synthetic", "reading": reading, "setting": "iid", "num_traces": 2, "seed": 0,
             "scheme": scheme, "final_acc": acc, "final_loss": 1.0, "wall_s": 1.0}
            for reading in ("per-label", "scaled") for scheme, acc in zip("ABC", (0.5, 0.6, 0.7))]
    with open(root / "table3_runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(runs / "scaled_iid_T2_seed0_C.csv", "w", newline="") as f:
        f.write("scheme,round,test_acc,test_loss\nC,1,0.25,1\nC,2,0.5,1\n")
    assert detect(root) == "sweep"
    datasets = read_sweep(root).datasets
    assert [(d.dataset, d.reading, d.key, d.title) for d in datasets] == [
        ("synthetic", "per-label", "synthetic-per-label", "SYNTHETIC (per-label)"),
        ("synthetic", "scaled", "synthetic-scaled", "SYNTHETIC (scaled)")]
    scaled = datasets[1]
    assert [r["final_acc"] for r in scaled.final] == [0.5, 0.6, 0.7] and scaled.runs_dir == runs
    assert read_sweep_curve(runs, setting="iid", num_traces=2, seed=0, scheme="C",
                            prefix=scaled.run_prefix) == pytest.approx([0.25, 0.5])
    assert read_sweep_curve(runs, setting="iid", num_traces=2, seed=0, scheme="C") is None
    (root / "table3_runs.csv").write_text("dataset,setting,num_traces,seed,scheme,final_acc\n")
    with pytest.raises(ReportError, match=r"table3_runs.csv:1: missing columns \['reading'\]"):
        read_sweep(root)


def test_natural_order():
    assert sorted(["dev-10", "dev-2", "dev-1"], key=natural_key) == ["dev-1", "dev-2", "dev-10"]


def test_a_strategy_is_named_by_its_title_from_a_label_and_with_its_parameters_from_a_config(tmp_path):
    from flexfl.app.report.data import Run, strategy_description

    run = Run(path=tmp_path, kind="sim", sources=(), rounds=(), config={"rules": {"strategy": "fedprox", "mu": 0.5}})
    assert run.strategy_of(None) == "FedProx (mu = 0.5)"
    # rounds.csv's labels name a strategy, not its parameters; an unknown one (a plug-in's) stays as it is
    assert [run.strategy_of(k) for k in ("C", "fednova", "fedprox", "my-rule")] == \
        ["Scheme C", "FedNova", "FedProx", "my-rule"]
    assert strategy_description({"rules": {"scheme": "A"}}) == "Scheme A"
    assert strategy_description({"rules": {"strategy": "fednova", "scheme": "C"}}) == "FedNova"
    assert strategy_description({"rules": {"strategy": {"name": "fedprox", "mu": 0.01}}}) == "FedProx (mu = 0.01)"
    assert strategy_description({"dataset": "synthetic"}) is None  # not recorded: the page says so


def test_a_bad_rounds_csv_names_file_line_and_column(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"E": 20, "dataset": "synthetic"}}))
    (tmp_path / "rounds.csv").write_text("scheme,round,lr,test_acc\nA,1,0.1,0.5\nA,2,0.1,half\n")
    with pytest.raises(ReportError, match=r"rounds\.csv:3: column 'test_acc': expected float or empty, got 'half'"):
        read_run(tmp_path)
    (tmp_path / "rounds.csv").write_text("scheme,rnd,lr\nA,1,0.1\n")
    with pytest.raises(ReportError, match=r"rounds\.csv:1: missing column 'round'"):
        read_run(tmp_path)
