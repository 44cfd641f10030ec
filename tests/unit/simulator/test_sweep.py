"""Sweeps: per-run files, resume after an interruption, recompute on a changed config, executors agree."""

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.rules.config import RulesConfig
from flexfl.app.cli import main
from flexfl.config import to_dict
from flexfl.errors import ConfigError, SweepError
from flexfl.run_spec import RunSpec
from simulator.engine import SimConfig, TracesConfig, TrainerKind, load_data, run_simulation
from simulator.executors import LocalExecutor, RayExecutor, executor_for
from simulator.groups import Group, Run
from simulator.sweep import read_metrics, run_sweep, saved_summary
from workloads.partition_spec import PartitionSpec

BASE = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=6, total_samples=900),
                 rules=RulesConfig(required_updates=4), traces=TracesConfig(num_traces=8), run=RunSpec(rounds=3))


def cfg_of(seed: int, scheme: str, **fields) -> SimConfig:
    run = {"seed": seed, **({"rounds": fields.pop("rounds")} if "rounds" in fields else {})}
    return replace(BASE.with_run(**run), partition=replace(BASE.partition, seed=seed),
                   rules=replace(BASE.rules, scheme=scheme), **fields)


def groups(rounds: int = 3, trainer: TrainerKind = TrainerKind.AUTO) -> list[Group]:
    """Two seeds (two data sets), Schemes A/B/C each; seed 1 with the plain trainer when asked (run one by one)."""
    return [Group(tuple(Run(name=f"s{seed}_{scheme}", labels={"seed": seed, "scheme": scheme},
                            config=cfg_of(seed, scheme, rounds=rounds, trainer=trainer if seed else TrainerKind.AUTO))
                        for scheme in "ABC"))
            for seed in (0, 1)]


def quiet(lines: list[str]):
    return lines.append


def files_of(work: Path, name: str) -> dict:
    """A run's saved results, without what depends on the clock."""
    summary = json.loads((work / f"{name}.json").read_text())
    for k in ("wall_s", "group_wall_s"):
        summary.pop(k)
    rounds = [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(work / f"{name}.csv"))]
    return {"summary": summary, "rounds": rounds, "metrics": (work / f"{name}.metrics.jsonl.gz").read_bytes()}


def test_each_run_gets_its_files_and_equals_its_run_alone(tmp_path):
    lines: list[str] = []
    summaries = run_sweep(groups(trainer=TrainerKind.PLAIN), work_dir=tmp_path, report=quiet(lines))
    assert [s["name"] for s in summaries] == ["s0_A", "s0_B", "s0_C", "s1_A", "s1_B", "s1_C"]
    assert not any(s["cached"] for s in summaries)
    for _s, run in zip(summaries, [r for g in groups(trainer=TrainerKind.PLAIN) for r in g.runs]):
        saved = json.loads((tmp_path / f"{run.name}.json").read_text())
        assert saved["config"] == json.loads(json.dumps(to_dict(run.config)))
        assert (saved["seed"], saved["scheme"]) == (run.labels["seed"], run.labels["scheme"])
        alone = run_simulation(run.config, data=load_data(run.config))
        assert saved["final_loss"] == pytest.approx(alone.records[-1].test_loss, rel=1e-5)
        rows = list(csv.DictReader(open(tmp_path / f"{run.name}.csv")))
        assert [float(r["test_loss"]) for r in rows] == pytest.approx([r.test_loss for r in alone.records], rel=1e-5)
        metrics = read_metrics(tmp_path, run.name)
        assert [dict(m.s) for m in metrics] == [r["s"] for r in alone.rows]
        assert [dict(m.coefficients) for m in metrics] == [r["coefficients"] for r in alone.rows]
    # Seed 0 (fast trainer) was paired; seed 1 (plain trainer) ran one by one.
    assert summaries[0]["paired_with"] == ["s0_B", "s0_C"] and summaries[3]["paired_with"] == []
    assert lines[0].startswith("sweep: 6 runs, 0 already in") and lines[-1].startswith("sweep: 6 runs in")
    assert sum("] s" in line and "ETA" in line for line in lines) == 6


class Interrupted(LocalExecutor):
    """The local executor, stopped (as by Ctrl-C) after `groups` groups have come back."""

    def __init__(self, groups: int) -> None:
        super().__init__(jobs=1)
        self.groups = groups

    def run(self, tasks):
        for i, outputs in enumerate(super().run(tasks)):
            if i == self.groups:
                raise KeyboardInterrupt
            yield outputs


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run_sweep(groups(), work_dir=whole, report=quiet([]))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(groups(), work_dir=stopped, executor=Interrupted(groups=1), report=quiet([]))
    assert sorted(p.name for p in stopped.glob("*.json")) == ["s0_A.json", "s0_B.json", "s0_C.json"]
    before = {p.name: p.stat().st_mtime_ns for p in stopped.iterdir()}
    lines: list[str] = []
    summaries = run_sweep(groups(), work_dir=stopped, report=quiet(lines))
    assert [s["cached"] for s in summaries] == [True] * 3 + [False] * 3
    assert "3 already in" in lines[0] and "3 to compute in 1 groups" in lines[0]
    assert all(stopped.joinpath(n).stat().st_mtime_ns == t for n, t in before.items())  # untouched
    for name in ("s0_A", "s1_C"):
        assert files_of(stopped, name) == files_of(whole, name)


def test_a_changed_config_or_a_torn_summary_is_recomputed(tmp_path):
    run_sweep(groups(), work_dir=tmp_path, report=quiet([]))
    (tmp_path / "s0_B.json").write_text('{"config": {"rou')  # as if cut off mid-write by hand
    changed = groups()
    changed[1] = Group(tuple(replace(r, config=r.config.with_run(rounds=4)) if r.name == "s1_C" else r
                             for r in changed[1].runs))
    summaries = run_sweep(changed, work_dir=tmp_path, report=quiet([]))
    assert {s["name"] for s in summaries if not s["cached"]} == {"s0_B", "s1_C"}
    s1c = json.loads((tmp_path / "s1_C.json").read_text())
    assert s1c["config"]["run"]["rounds"] == 4 and s1c["rounds"] == 4
    assert len(list(csv.DictReader(open(tmp_path / "s1_C.csv")))) == 4
    assert saved_summary(tmp_path, changed[1].runs[2]) is not None
    assert saved_summary(tmp_path, groups()[1].runs[2]) is None  # the old config is no longer there


def test_an_alias_is_written_from_its_source_under_its_own_config(tmp_path):
    runs = (Run("A", cfg_of(0, "A")), Run("B", cfg_of(0, "B"), same_as="A"))
    summaries = run_sweep([Group(runs)], work_dir=tmp_path, report=quiet([]))
    assert summaries[1]["identical_to"] == "A" and summaries[1]["config"]["rules"]["scheme"] == "B"
    assert summaries[1]["final_params_sha256"] == summaries[0]["final_params_sha256"]
    assert {r["scheme"] for r in csv.DictReader(open(tmp_path / "B.csv"))} == {"B"}


def test_a_failed_run_is_named_and_the_others_are_saved(tmp_path):
    diverging = Group((Run("boom", replace(cfg_of(1, "C"), rules=replace(cfg_of(1, "C").rules, eta0=1e36))),))
    lines: list[str] = []
    with pytest.raises(SweepError,
                       match=r"1 of 4 runs failed .* boom: round 1 of the synthetic run .*: test loss became"):
        run_sweep([groups()[0], diverging], work_dir=tmp_path, report=quiet(lines))
    assert any("boom: FAILED" in line for line in lines)
    assert (tmp_path / "s0_C.json").is_file() and not (tmp_path / "boom.json").exists()


def test_a_process_pool_writes_the_same_files_as_one_process(tmp_path):
    run_sweep(groups(), work_dir=tmp_path / "one", executor=LocalExecutor(jobs=1), report=quiet([]))
    lines: list[str] = []
    run_sweep(groups(), work_dir=tmp_path / "pool", executor=LocalExecutor(jobs=2), report=quiet(lines))
    assert "on 2 local worker processes" in lines[0]
    for name in ("s0_A", "s0_B", "s0_C", "s1_A", "s1_B", "s1_C"):
        assert files_of(tmp_path / "pool", name) == files_of(tmp_path / "one", name)


def test_groups_and_names_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"run s1_A has partition .* a group shares its data"):
        Group((groups()[0].runs[0], groups()[1].runs[0]))
    with pytest.raises(ConfigError, match="name 'a/b'"):
        Run("a/b", BASE)
    with pytest.raises(ConfigError, match="labels \\['config'\\] clash"):
        Run("a", BASE, labels={"config": 1})
    with pytest.raises(ConfigError, match="same_as 'C' must name an earlier computed run"):
        Group((Run("A", BASE), Run("B", BASE, same_as="C")))
    with pytest.raises(ConfigError, match=r"names must be unique; repeated: \[.s0_A., .s0_B., .s0_C.\]"):
        run_sweep([groups()[0], groups()[0]], work_dir=tmp_path / "w", report=quiet([]))
    assert not (tmp_path / "w").exists()  # refused before anything is written


def test_without_ray_a_ray_address_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[cluster\]'"):
        RayExecutor("local")
    args = ["sim", "schemes", "--dataset", "synthetic", "--devices", "6", "--rounds", "2", "--seeds", "0",
            "--settings", "niid", "--num-traces-list", "2", "--out", str(tmp_path)]
    assert main([*args, "--ray-address", "10.0.0.1:6379"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ray is not installed: pip install -e '.[cluster]'" in err
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # Ray's own variable asks for Ray too
    assert main(args) == 2
    assert "-e '.[cluster]'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


def test_executor_choice(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert isinstance(executor_for(jobs=None, ray_address=None), LocalExecutor)
    assert executor_for(jobs=3, ray_address=None).jobs == 3
    with pytest.raises(ConfigError, match="--jobs must be >= 1"):
        executor_for(jobs=0, ray_address=None)


def test_sweeps_and_the_cli_do_not_import_ray(tmp_path):
    code = f"""
import sys
from flexfl.app.cli import main
assert main(["sim", "schemes", "--dataset", "synthetic", "--devices", "6", "--rounds", "2", "--seeds", "0",
             "--settings", "niid", "--num-traces-list", "2", "--jobs", "1", "--out", {str(tmp_path)!r}]) == 0
print("ray" in sys.modules)
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_a_saved_run_stays_finished_when_a_config_field_is_added_at_its_default(tmp_path):
    import json

    from simulator.groups import Group, Run
    from simulator.sweep import run_sweep, saved_summary

    cfg = SimConfig(partition=PartitionSpec(n_devices=4, total_samples=400), run=RunSpec(rounds=2))
    run = Run(name="r", config=cfg)
    run_sweep([Group((run,))], work_dir=tmp_path, report=lambda line: None)
    path = tmp_path / "r.json"
    saved = json.loads(path.read_text())
    del saved["config"]["rules"]["auto_c"]  # as written before the field existed
    path.write_text(json.dumps(saved))
    assert saved_summary(tmp_path, run) is not None
    saved["config"]["run"]["rounds"] = 3  # a changed value still means another run
    path.write_text(json.dumps(saved))
    assert saved_summary(tmp_path, run) is None


def test_saved_runs_and_checkpoints_stay_valid_when_only_an_unused_policy_constant_changes():
    from flexfl.vocabulary import DeparturePolicy
    from simulator.engine import DepartureEvent, ScheduleConfig, _same_configs, _state_key, runs_alike

    old = SimConfig(rules=RulesConfig(auto_c=23.7137, threshold_k=40.0))  # no departures: neither is used
    new = replace(old, rules=replace(old.rules, auto_c=4.217, threshold_k=80.0))
    assert runs_alike(to_dict(old), new)
    assert _same_configs(_state_key([old, old]), [new, new])  # a checkpoint written under the old defaults
    assert not _same_configs(_state_key([old]), [new.with_run(seed=1)])
    assert not runs_alike(to_dict(old), replace(new, rules=replace(new.rules, eta0=0.5)))
    # A departure under auto uses c (not k); under threshold, k (not c).
    leaves = ScheduleConfig(departures=(DepartureEvent(device=0, round=5, policy=DeparturePolicy.AUTO),))
    auto_old, auto_new = replace(old, schedule=leaves), replace(new, schedule=leaves)
    assert not runs_alike(to_dict(auto_old), auto_new)
    assert runs_alike(to_dict(auto_old), replace(auto_new, rules=replace(auto_new.rules, auto_c=23.7137)))
    by_rules = ScheduleConfig(departures=(DepartureEvent(device=0, round=5),))
    k_old = replace(old, schedule=by_rules, rules=replace(old.rules, departure_policy=DeparturePolicy.THRESHOLD))
    k_new = replace(k_old, rules=replace(k_old.rules, threshold_k=80.0))
    assert not runs_alike(to_dict(k_old), k_new)
    assert runs_alike(to_dict(k_old), replace(k_old, rules=replace(k_old.rules, auto_c=4.217)))


def test_saved_scheme_runs_keep_their_identity_now_that_strategies_exist():
    """A committed run (saved before [rules].strategy existed) reads back byte-equal, so sweeps
    and checkpoints reuse it; its strategy-spelled twin is the same run; FedNova is another."""
    from flexfl.config import from_dict
    from simulator.engine import _same_configs, _state_key, runs_alike
    from simulator.groups import plain_config as _plain_config

    repo = Path(__file__).resolve().parents[3]
    saved = json.loads((repo / "results/epoch-paper/runs/table3_mnist/per-label_niid_T2_seed0_A.json")
                       .read_text())["config"]
    cfg = from_dict(SimConfig, saved)
    # Saved before [run]: rounds and seed at the top level read as the same run, written now in [run]
    assert runs_alike(saved, cfg) and "rounds" not in _plain_config(cfg)
    assert _plain_config(cfg) == {**{k: v for k, v in saved.items() if k not in ("rounds", "seed")},
                                  "run": {"rounds": saved["rounds"], "seed": saved["seed"]}}
    assert cfg.rules.aggregation.name == "scheme-a"
    spelled = replace(cfg, rules=replace(cfg.rules, scheme="C", strategy="scheme-a"))
    assert spelled == cfg and runs_alike(saved, spelled)
    assert _same_configs(_state_key([cfg]), [spelled])
    in_steps = replace(cfg, rules=replace(cfg.rules, unit="step"))  # FedNova counts steps
    nova = replace(in_steps, rules=in_steps.rules.with_strategy("fednova"))
    assert not runs_alike(to_dict(in_steps), nova) and not runs_alike(to_dict(nova), in_steps)
    assert runs_alike(to_dict(nova), nova) and to_dict(nova)["rules"]["strategy"] == {"name": "fednova"}
    older = {**to_dict(nova), "rules": {**to_dict(nova)["rules"], "strategy": "fednova"}}  # saved before the table
    assert runs_alike(older, nova)
    both = {**to_dict(nova), "rules": {**to_dict(nova)["rules"], "scheme": "C"}}  # saved before one of the two
    assert runs_alike(both, nova) and "scheme" not in to_dict(nova)["rules"]
