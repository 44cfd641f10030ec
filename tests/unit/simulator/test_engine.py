"""Simulation runs: deterministic per seed, fast == plain, scheme A discards, membership events, CLI outputs."""

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.rules.config import RulesConfig
from flexfl.app.cli import main
from flexfl.errors import ConfigError, DivergenceError
from flexfl.run_spec import RunSpec
from simulator.engine import (
    ArrivalEvent,
    DepartureEvent,
    ScheduleConfig,
    SimConfig,
    TraceParticipation,
    TracesConfig,
    TrainerKind,
    load_data,
    run_simulation,
)
from trace_recorder.format import Trace, TraceManifest, read_trace_set, utc_now_iso, write_trace_set
from workloads.partition_spec import PartitionSpec

SMALL = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=8, total_samples=1200),
                  rules=RulesConfig(required_updates=5), traces=TracesConfig(num_traces=8), run=RunSpec(rounds=4))


def small(*, rules=None, partition=None, **fields):
    """SMALL with some rules/partition fields changed."""
    cfg = SMALL
    if rules:
        cfg = replace(cfg, rules=replace(cfg.rules, **rules))
    if partition:
        cfg = replace(cfg, partition=replace(cfg.partition, **partition))
    run = {key: fields.pop(key) for key in ("rounds", "seed") if key in fields}  # [run]'s keys
    return replace(cfg.with_run(**run), **fields)


def test_short_run_is_deterministic_for_a_seed():
    a = run_simulation(SMALL)
    b = run_simulation(SMALL)
    c = run_simulation(small(seed=1))
    assert [r.test_acc for r in a.records] == [r.test_acc for r in b.records]
    for n in a.final_params:
        assert torch.equal(a.final_params[n], b.final_params[n])
    assert any(not torch.equal(a.final_params[n], c.final_params[n]) for n in a.final_params)


def test_a_diverging_run_raises_a_divergence_error_naming_the_round_and_the_run():
    with pytest.raises(DivergenceError) as diverged:
        run_simulation(small(rules={"eta0": 1e38}, seed=3))  # the first SGD step overflows float32
    assert not isinstance(diverged.value, ConfigError)  # the setup is valid; the training failed
    assert str(diverged.value).startswith("round 1 of the synthetic run (Scheme C, E = 5 steps, seed 3): test loss "
                                          "became nan; the learning rate 1e+38 is too high for this setup")


@pytest.mark.parametrize("kind", [TrainerKind.CACHE, TrainerKind.FAST])
@pytest.mark.parametrize("scheme", ["A", "B", "C"])
def test_row_trainer_simulation_equals_plain_trainer(scheme, kind):
    cfg = small(rules={"scheme": scheme}, trainer=kind)
    assert small().trainer_kind is TrainerKind.CACHE  # auto
    data = load_data(cfg)
    fast = run_simulation(cfg, data=data)
    slow = run_simulation(replace(cfg, trainer=TrainerKind.PLAIN), data=data)
    for n in fast.final_params:
        # Same arithmetic in another order: float32 rounding grows over rounds at SYNTHETIC's eta_0 = 1.
        torch.testing.assert_close(fast.final_params[n], slow.final_params[n], rtol=1e-3, atol=1e-4)
    assert fast.device_updates == slow.device_updates


def test_epoch_unit_runs_on_the_cache_trainer_and_equals_plain():
    """E in epochs: each device trains s x ceil(n_k / B) steps (ragged under Pareto sizes), on the fast path."""
    cfg = small(rules={"unit": "epoch", "required_updates": 2}, rounds=2)
    assert cfg.trainer_kind is TrainerKind.CACHE
    data = load_data(cfg)
    sizes = np.array([len(d) for d in data.train])
    assert len(set(np.ceil(sizes / 20))) >= 2  # ragged: devices' steps per epoch differ (3 and 38 here)
    fast = run_simulation(cfg, data=data)
    slow = run_simulation(replace(cfg, trainer=TrainerKind.PLAIN), data=data)
    for n in fast.final_params:
        torch.testing.assert_close(fast.final_params[n], slow.final_params[n], rtol=1e-3, atol=1e-4)
    assert fast.device_updates == slow.device_updates
    # Steps, not updates: at least one epoch of some device is more than one step.
    steps_mode = run_simulation(replace(cfg, rules=replace(cfg.rules, unit="step")), data=data)
    assert fast.device_updates > steps_mode.device_updates


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
    cfg = small(rules={"scheme": "A", "required_updates": 4},
                traces=TracesConfig(set=str(tmp_path / "set"), num_traces=1))
    res = run_simulation(cfg, traces=traces)
    assert all(r.discarded for r in res.records)
    assert res.device_updates == 0
    # The model never moved: accuracy is that of the initial model every round.
    assert len({r.test_acc for r in res.records}) == 1
    res_c = run_simulation(replace(cfg, rules=replace(cfg.rules, scheme="C")), traces=traces)
    assert not any(r.discarded for r in res_c.records) and res_c.device_updates > 0


def test_a_given_trace_assignment_pins_each_device_to_its_trace(tmp_path):
    """Device k follows trace assignment[k] (a recorded set replayed device by device), not assign_traces' draw."""
    manifest = TraceManifest(
        schema_version=1, name="two", kind="calibrated", description="test", source={"test": True},
        required_updates=4, deadline_s=None, traces=("full", "none"), conditions={"full": {}, "none": {}}, hosts=(),
        created=utc_now_iso())
    write_trace_set(tmp_path / "set", manifest, [Trace(name=n, round=np.arange(3), fraction=np.full(3, f))
                                                 for n, f in (("full", 1.0), ("none", 0.0))])
    traces = read_trace_set(tmp_path / "set")
    cfg = small(rules={"required_updates": 4}, traces=TracesConfig(set=str(tmp_path / "set"), num_traces=2))
    order = [k % 2 for k in range(8)]  # even devices: "full", odd: "none"
    pinned = TraceParticipation(traces, cfg, assignment=order)
    assert pinned.trace_names == ["full", "none"] * 4
    assert [pinned.draw(k, r) for r in (1, 2, 3) for k in range(8)] == [4, 0] * 12
    drawn = TraceParticipation(traces, cfg).trace_names  # the seed's draw is another map
    assert drawn != pinned.trace_names
    with pytest.raises(ConfigError, match=r"must give each of 8 devices a trace index in 0..1"):
        TraceParticipation(traces, cfg, assignment=[0, 1, 2, 0, 0, 0, 0, 0])
    with pytest.raises(ConfigError, match="must give each of 8 devices"):
        TraceParticipation(traces, cfg, assignment=[0, 1])


def test_training_improves_accuracy_over_rounds():
    res = run_simulation(small(rounds=30, partition={"iid": True, "n_devices": 10, "total_samples": 3000}))
    first, last = res.records[0], res.records[-1]
    # eta_0 / tau decays fast, so progress after round 1 is steady but modest.
    assert last.test_loss < first.test_loss - 0.2
    assert last.test_acc > first.test_acc + 0.05


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="dataset: expected one of mnist, emnist, synthetic, got 'cifar'"):
        small(partition={"dataset": "cifar"})
    with pytest.raises(ConfigError, match=r"device 9, outside 0..7"):
        small(schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=9, round=2),)))
    with pytest.raises(ConfigError, match="not after its arrival"):
        small(schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=1, round=3),),
                                      departures=(DepartureEvent(device=1, round=2),)))


def test_cli_run_writes_csv_plot_and_summary(tmp_path, capsys):
    """--scheme picks the schemes to run (it was the rules' flag, and ignored: A, B and C ran)."""
    out = tmp_path / "out"
    code = main(["sim", "run", "--dataset", "synthetic", "--devices", "6", "--rounds", "3", "--E", "4",
                 "--total-samples", "900", "--scheme", "B", "--scheme", "scheme-c", "--scheme", "fednova",
                 "--scheme", "fedprox", "--mu", "0.5", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "rounds.csv")))
    assert len(rows) == 12 and {r["scheme"] for r in rows} == {"B", "C", "fednova", "fedprox"}
    assert (out / "accuracy.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["final_acc"]) == {"B", "C", "fednova", "fedprox"}
    assert "[rules.strategy]\nname = \"fednova\"" in (out / "fednova" / "sim.toml").read_text()
    assert "mu = 0.5" in (out / "fedprox" / "sim.toml").read_text()
    assert "mu =" not in (out / "B" / "sim.toml").read_text()
    assert "final test accuracy" in capsys.readouterr().out
    assert main(["sim", "run", "--schemes", "C,fedfoo", "--out", str(tmp_path / "no")]) == 2
    assert "unknown strategy 'fedfoo'" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert main(["sim", "run", "--schemes", "C,fedprox", "--out", str(tmp_path / "no")]) == 2  # no mu
    assert "[rules.strategy].mu: missing (required)" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_cli_run_keeps_the_old_schemes_spelling(tmp_path, caplog):
    out = tmp_path / "out"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "6", "--rounds", "2", "--E", "4",
                 "--total-samples", "900", "--schemes", "a,C", "--out", str(out)]) == 0
    assert set(json.loads((out / "summary.json").read_text())["final_acc"]) == {"A", "C"}
    assert "--schemes is deprecated: write --scheme a --scheme C" in caplog.text


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
    assert first.count("(same run as niid_T1_seed") == 4  # |T| = 1, schemes B and C, two seeds
    assert first.count("paired with 2") == 6  # |T| = 8: the three schemes of a seed train together
    shared = json.loads((tmp_path / "runs" / "schemes_synthetic" / "niid_T1_seed0_C.json").read_text())
    assert shared["identical_to"] == "niid_T1_seed0_A"
    rows = list(csv.DictReader(open(tmp_path / "runs" / "schemes_synthetic" / "niid_T1_seed0_C.csv")))
    assert {r["scheme"] for r in rows} == {"C"}
    assert main(args) == 0
    assert "sweep: 12 runs, 12 already in" in capsys.readouterr().out
    # --report-only tabulates what exists and computes nothing (|T| = 2 was never run).
    report = [a if a != "1,8" else "1,2" for a in args] + ["--report-only"]
    assert main(report) == 0
    out = capsys.readouterr().out
    assert "sweep:" not in out and "6 runs" in out
    page = (tmp_path / "schemes_synthetic.md").read_text()
    assert "| SYNTHETIC NIID (FlexFL) | 0.0 ± 0.0, 0.0 ± 0.0 | not run |" in page


def test_cli_rejects_bad_flags(tmp_path, capsys):
    assert main(["sim", "schemes", "--num-traces-list", "0-9", "--out", str(tmp_path)]) == 2
    assert "--num-traces-list" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 3\n[rules]\nshceme = "A"\n')
    assert main(["sim", "run", "--config", str(cfg), "--out", str(tmp_path)]) == 2
    assert "[rules].shceme: unknown key; did you mean 'scheme'?" in capsys.readouterr().err
    assert main(["sim", "run", "--arrive", "3at30", "--out", str(tmp_path)]) == 2
    assert "--arrive '3at30': expected DEVICE@ROUND" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["include", "exclude"])
@pytest.mark.parametrize("fast_reboot", [True, False])
def test_membership_events_follow_the_papers_formulas(policy, fast_reboot):
    """Rounds, p, coefficients and rates of a run with arrivals and departures, recomputed here by hand."""
    E, eta0, boost, power = 5, 0.5, 3.0, 2.0
    cfg = small(rounds=12, rules={"scheme": "C", "eta0": eta0, "fast_reboot": fast_reboot, "fast_reboot_boost": boost,
                                  "fast_reboot_decay_power": power, "departure_policy": policy},
                schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=6, round=3), ArrivalEvent(device=7, round=7)),
                                        departures=(DepartureEvent(device=0, round=5),
                                                    DepartureEvent(device=6, round=10, policy="exclude"))))
    data = load_data(cfg)
    res = run_simulation(cfg, data=data)
    n = {f"dev-{k}": int(c) for k, c in enumerate(data.sample_counts)}
    members = {f"dev-{k}" for k in range(6)}  # 6 and 7 arrive later
    departed_included: set[str] = set()
    arrived_at: dict[str, int] = {}
    shift = 0
    for row in res.rows:
        tau = row["round"]
        assert row["lr"] == pytest.approx(eta0 / (tau - shift))
        assert set(row["participants"]) == members - departed_included
        assert set(row["devices"]) == members
        total = sum(n[d] for d in members)
        for d in members:
            p = n[d] / total
            if fast_reboot and d in arrived_at:
                p *= 1 + (boost - 1) / (tau - arrived_at[d]) ** power  # r + 1 = tau - tau_0
            assert row["p"][d] == pytest.approx(p), (tau, d)
            s = row["s"][d]
            assert 0 <= s <= E and (s == 0 or d not in departed_included)
            assert row["coefficients"][d] == pytest.approx(E / s * p if s else 0.0), (tau, d)
        # Events at the close of tau: arrivals, then departures under their policy.
        arrivals = [f"dev-{a.device}" for a in cfg.schedule.arrivals if a.round == tau]
        departures = [(f"dev-{d.device}", d.policy or policy) for d in cfg.schedule.departures if d.round == tau]
        assert row["arrivals"] == arrivals and row["departures"] == [d for d, _ in departures]
        for d in arrivals:
            members.add(d)
            arrived_at[d] = tau
            shift = tau
        for d, pol in departures:
            if pol == "exclude":
                members.discard(d)
                departed_included.discard(d)
                arrived_at.pop(d, None)
                shift = tau
            else:
                departed_included.add(d)
    # The test set follows the objective: after the last exclusion it holds exactly its members' holdouts.
    assert len(data.test_for([int(d.split("-")[1]) for d in members])) == sum(
        len(data.device_test[int(d.split("-")[1])]) for d in members)


def test_paired_runs_share_data_model_and_s_draws():
    base = small(rounds=6, schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=5, round=2),)))
    a = run_simulation(base)
    b = run_simulation(replace(base, rules=replace(base.rules, fast_reboot=False)))
    c = run_simulation(replace(base, rules=replace(base.rules, scheme="B")))
    for other in (b, c):
        assert [r["s"] for r in other.rows] == [r["s"] for r in a.rows]
    assert a.rows[0]["test_acc"] == b.rows[0]["test_acc"]  # same start, same first round (no arrival yet)
    assert a.rows[2]["p"]["dev-5"] > b.rows[2]["p"]["dev-5"]  # fast-reboot boosts only in a


def test_extra_test_sets_follow_the_start_and_the_active_devices():
    cfg = small(rounds=6, rules={"departure_policy": "include"}, extra_tests=("start", "active"),
                schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=7, round=2),),
                                        departures=(DepartureEvent(device=0, round=4),)))
    data = load_data(cfg)
    res = run_simulation(cfg, data=data)
    rows = {r["round"]: r for r in res.rows}
    # Before the arrival the objective's test set is the start devices' holdouts.
    assert rows[1]["extra_tests"]["start"]["loss"] == pytest.approx(rows[1]["test_loss"])
    # After it, "start" leaves the newcomer's holdout out; after an include departure, "active"
    # leaves the departed device's out while the objective (and its test set) keeps it.
    assert rows[3]["extra_tests"]["start"]["loss"] != pytest.approx(rows[3]["test_loss"])
    assert rows[3]["extra_tests"]["active"]["loss"] == pytest.approx(rows[3]["test_loss"])
    assert rows[5]["extra_tests"]["active"]["loss"] != pytest.approx(rows[5]["test_loss"])
    _, loss = evaluate_params(res.final_params, data.test_for([1, 2, 3, 4, 5, 6, 7]))
    assert rows[6]["extra_tests"]["active"]["loss"] == pytest.approx(loss)


def evaluate_params(params, test):
    from workloads.evaluation import evaluate
    from workloads.federated import initial_model

    model, _ = initial_model("synthetic", seed=0)
    return evaluate(model, params, test)


# Runs before anything else is imported: the extras' packages (numba and llvmlite of [sim], matplotlib of
# [plot], jinja2 of [report]) then fail to import as on a plain `pip install .` (patching
# importlib.util.find_spec after numba is loaded proves nothing).
NO_EXTRAS = """
import sys

class NoExtras:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numba", "llvmlite", "matplotlib", "jinja2"):
            raise ImportError("blocked by the test: " + name, name=name.split(".")[0])
        return None

sys.meta_path.insert(0, NoExtras())
from flexfl.app.cli import main
rc = main(sys.argv[1:])
print("numba imported:", "numba" in sys.modules)
sys.exit(rc)
"""


def test_without_extras_sim_run_trains_on_the_torch_trainer_and_says_so(tmp_path):
    """An install without extras (an edge device's: no numba, no matplotlib) still simulates, says on which
    trainer, and writes every file but the plot."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", NO_EXTRAS, "sim", "run", "--dataset", "synthetic", "--iid",
                           "--devices", "4", "--total-samples", "800", "--rounds", "4", "--scheme", "C",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "numba is not installed (pip install -e '.[sim]'): simulating on the batched torch trainer" in done.stderr
    assert "numba imported: False" in done.stdout
    accuracy = [float(r["test_acc"]) for r in csv.DictReader((out / "rounds.csv").open())]
    assert len(accuracy) == 4 and accuracy[-1] > 0.3  # ten classes: chance is 0.1
    assert "matplotlib is not installed (pip install -e '.[plot]'): accuracy.png not drawn" in done.stderr
    assert (out / "summary.json").is_file() and not (out / "accuracy.png").exists()
    assert "final test accuracy: Scheme C" in done.stdout and "rounds.csv, summary.json" in done.stdout
    # Asking for the kernels by name without numba is a configuration error, not a traceback.
    done = subprocess.run([sys.executable, "-c", NO_EXTRAS, "sim", "run", "--dataset", "synthetic", "--devices", "4",
                           "--rounds", "1", "--scheme", "C", "--trainer", "cache", "--out", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "trainer = 'cache' needs numba" in done.stderr, done.stderr[-2000:]


def test_a_runs_set_up_reads_each_devices_size_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set-up linear in the population (issue 36): it counts the work, it times nothing. Reading n_k of every device
    through a property that rebuilt the N-long array made RunState's set-up read N^2 sizes."""
    from simulator.engine import RunState
    from workloads.datasets import ArrayDataset

    n = 400
    cfg = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=n, total_samples=100 * n),
                    run=RunSpec(rounds=1))
    data = load_data(cfg)
    reads = {"n": 0}
    original = ArrayDataset.__len__

    def counted(self: ArrayDataset) -> int:
        reads["n"] += 1
        return original(self)

    monkeypatch.setattr(ArrayDataset, "__len__", counted)
    run = RunState(cfg, data, TraceParticipation(read_trace_set(Path(cfg.traces.set)), cfg))
    run.begin(1)
    assert reads["n"] <= 10 * n, f"{reads['n']} dataset sizes read to set up {n} devices"
    assert data.sample_counts is data.sample_counts and not data.sample_counts.flags.writeable
