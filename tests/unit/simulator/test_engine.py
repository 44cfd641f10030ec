"""Simulation runs: deterministic per seed, batched == plain, scheme A discards, CLI outputs."""

import csv
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from flexfl.cli import main
from flexfl.errors import ConfigError
from simulator.engine import SimConfig, load_data, run_simulation
from trace_recorder.format import Trace, TraceManifest, read_trace_set, write_trace_set, utc_now_iso

SMALL = SimConfig(dataset="synthetic", iid=False, alpha=1.0, beta=1.0, n_devices=8, rounds=4, E=5,
                  total_samples=1200, num_traces=8)


def test_short_run_is_deterministic_for_a_seed():
    a = run_simulation(SMALL)
    b = run_simulation(SMALL)
    c = run_simulation(replace(SMALL, seed=1))
    assert [r.test_acc for r in a.records] == [r.test_acc for r in b.records]
    for n in a.final_params:
        assert torch.equal(a.final_params[n], b.final_params[n])
    assert any(not torch.equal(a.final_params[n], c.final_params[n]) for n in a.final_params)


@pytest.mark.parametrize("scheme", ["A", "B", "C"])
def test_batched_simulation_equals_plain_trainer(scheme):
    cfg = replace(SMALL, scheme=scheme)
    data = load_data(cfg.resolved())
    fast = run_simulation(cfg, data=data)
    slow = run_simulation(replace(cfg, trainer="plain"), data=data)
    for n in fast.final_params:
        torch.testing.assert_close(fast.final_params[n], slow.final_params[n], rtol=1e-4, atol=1e-5)
    assert fast.device_updates == slow.device_updates


def _one_trace_set(tmp_path, fractions):
    manifest = TraceManifest(
        schema_version=1, name="t", kind="calibrated", description="test", source={"test": True},
        required_updates=4, deadline_s=None, traces=("t",), conditions={"t": {}}, hosts=(), created=utc_now_iso(),
    )
    trace = Trace(name="t", round=np.arange(len(fractions)), fraction=np.array(fractions, dtype=np.float64))
    write_trace_set(tmp_path / "set", manifest, [trace])
    return read_trace_set(tmp_path / "set")


def test_scheme_a_discards_rounds_without_complete_devices(tmp_path):
    traces = _one_trace_set(tmp_path, [0.5, 0.75])  # nobody ever completes E = 4
    cfg = replace(SMALL, scheme="A", E=4, num_traces=1, trace_set=str(tmp_path / "set"))
    res = run_simulation(cfg, traces=traces)
    assert all(r.discarded for r in res.records)
    assert res.device_updates == 0
    torch.manual_seed(cfg.seed)
    # The model never moved: accuracy is that of the initial model every round.
    assert len({r.test_acc for r in res.records}) == 1
    res_c = run_simulation(replace(cfg, scheme="C"), traces=traces)
    assert not any(r.discarded for r in res_c.records) and res_c.device_updates > 0


def test_training_improves_accuracy_over_rounds():
    res = run_simulation(replace(SMALL, rounds=30, iid=True, alpha=0.0, beta=0.0, n_devices=10, total_samples=3000))
    first, last = res.records[0], res.records[-1]
    # eta_0 / tau decays fast, so progress after round 1 is steady but modest.
    assert last.test_loss < first.test_loss - 0.2
    assert last.test_acc > first.test_acc + 0.05


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="unknown dataset"):
        run_simulation(replace(SMALL, dataset="cifar"))
    with pytest.raises(ConfigError, match="plain"):
        run_simulation(replace(SMALL, unit="epoch"))


def test_cli_run_writes_csv_plot_and_summary(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sim", "run", "--dataset", "synthetic", "--devices", "6", "--rounds", "3", "--E", "4",
                 "--total-samples", "900", "--schemes", "B,C", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "rounds.csv")))
    assert len(rows) == 6 and {r["scheme"] for r in rows} == {"B", "C"}
    assert (out / "accuracy.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["final_acc"]) == {"B", "C"}
    assert "final test accuracy" in capsys.readouterr().out


def test_cli_schemes_writes_table_and_resumes(tmp_path, capsys):
    args = ["sim", "schemes", "--dataset", "synthetic", "--devices", "6", "--rounds", "2", "--E", "4",
            "--total-samples", "900", "--settings", "niid", "--num-traces-list", "1,8", "--seeds", "0,1",
            "--jobs", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    md = (tmp_path / "schemes_synthetic.md").read_text()
    assert "SYNTHETIC NIID (paper) | 0.1, -0.4" in md and "not run" in md
    # |T| = 1 is trace T0 only: everyone completes, all schemes are FedAvg, 0 % improvement.
    assert "| SYNTHETIC NIID (FlexFL) | 0.0 ± 0.0, 0.0 ± 0.0 |" in md
    first = capsys.readouterr().out
    assert first.count("same run as A: all complete") == 4  # |T| = 1, schemes B and C, two seeds
    shared = json.loads((tmp_path / "runs" / "schemes_synthetic" / "niid_T1_seed0_C.json").read_text())
    assert shared["identical_to"] == "A"
    rows = list(csv.DictReader(open(tmp_path / "runs" / "schemes_synthetic" / "niid_T1_seed0_C.csv")))
    assert {r["scheme"] for r in rows} == {"C"}
    assert main(args) == 0
    assert capsys.readouterr().out.count("cached") == 12
    # --report-only tabulates what exists and computes nothing (|T| = 2 was never run).
    report = [a if a != "1,8" else "1,2" for a in args] + ["--report-only"]
    assert main(report) == 0
    out = capsys.readouterr().out
    assert "cached" not in out and "6 runs" in out
    assert "| SYNTHETIC NIID (FlexFL) | 0.0 ± 0.0, 0.0 ± 0.0 | not run |" in (tmp_path / "schemes_synthetic.md").read_text()


def test_cli_rejects_bad_flags(tmp_path, capsys):
    assert main(["sim", "schemes", "--num-traces-list", "0-9", "--out", str(tmp_path)]) == 2
    assert "--num-traces-list" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 3\nbogus = 1\n')
    assert main(["sim", "run", "--config", str(cfg), "--out", str(tmp_path)]) == 2
    assert "unknown keys ['bogus']" in capsys.readouterr().err
