"""Flower's Simulation Engine under FlexFL's strategy, with clients that draw s from FlexFL's traces, gives the global
model `flexfl sim run` gives, round by round, for every built-in strategy, with one arrival and one departure. Issue 35.

One Flower simulation (flower_apps.py's "trace" scenario, in a process of its own) runs each built-in strategy in turn
on five nodes; the simulator runs the same configs (flower_apps.TRACE_CONFIGS: same seed, split, traces, schedule).
The two engines share the rules (coordinator.rules.round.Federation), the s draws (trace_recorder.sampler) and the
local SGD (edge_agent.trainer.train_local, which the simulator's plain trainer also runs). Against the plain trainer
only the order in which the contributors' updates are summed differs (Flower's node ids sort otherwise than dev-<k>),
so the models agree to a few float32 ulps; against the trainer `flexfl sim run` picks by default (cache with numba,
else fast: all rows in one kernel) the SGD steps are summed otherwise too. TOLERANCE bounds max |w_flower - w_sim| over
a tensor by that many float32 epsilons of its largest weight; measured on 2026-12-02 (AMD EPYC Zen 3): plain at most
8.2 eps (9.8e-7 relative, FedNova), cache at most 48 eps (5.7e-6, FedNova), in any round of any
strategy; the bounds leave twice that and more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

import torch

from coordinator.rules.round_record import RoundRecord
from simulator.engine import run_simulation
from workloads.federated import initial_model, model_spec
from workloads.partition_spec import device_id

APPS = Path(__file__).with_name("flower_apps.py")
EPS32 = float(torch.finfo(torch.float32).eps)
TOLERANCE = {"plain": 16, "auto": 128}  # float32 epsilons of the tensor's largest weight (measured: 8.2 and 48)


@pytest.fixture(scope="module")
def apps():
    sys.path.insert(0, str(APPS.parent))
    try:
        import flower_apps
    finally:
        sys.path.remove(str(APPS.parent))
    return flower_apps


@pytest.fixture(scope="module")
def flower_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("flower") / "trace.json"
    done = subprocess.run([sys.executable, str(APPS), "trace", str(out)], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def _simulated(cfg) -> tuple[list[RoundRecord], list[dict[str, torch.Tensor]]]:
    models: list[dict[str, torch.Tensor]] = []
    result = run_simulation(cfg, on_model=lambda tau, params: models.append({k: v.clone() for k, v in params.items()}))
    return result.records, models


@pytest.mark.slow
@pytest.mark.parametrize("trainer", sorted(TOLERANCE))
@pytest.mark.parametrize("strategy", ["scheme-a", "scheme-b", "scheme-c", "fednova", "fedprox", "mifa"])
def test_flower_and_the_simulator_make_the_same_model_every_round(strategy: str, trainer: str, apps,
                                                                  flower_runs: dict) -> None:
    assert sorted(flower_runs) == sorted(apps.TRACE_CONFIGS), "a built-in strategy the Flower run did not run"
    cfg = replace(apps.TRACE_CONFIGS[strategy], trainer=trainer)
    sim_records, sim_models = _simulated(cfg)
    got = flower_runs[strategy]
    records = [RoundRecord.from_json(r, where=f"{strategy}:{i}") for i, r in enumerate(got["records"], 1)]
    assert len(records) == len(sim_records) == len(got["models"]) == cfg.rounds
    # Flower's node "node-<id>" is the simulator's dev-<k>: the one whose n_k and founding match (partition k).
    node_of = _match_nodes(records, sim_records)
    arrive, leave = device_id(apps.ARRIVE.device), device_id(apps.LEAVE.device)
    for r, sim in zip(records, sim_records):
        where = f"{strategy}, round {r.round}"
        assert sorted(node_of[d] for d in r.participants) == sorted(sim.participants), where
        assert {node_of[d]: v for d, v in r.s.items()} == dict(sim.s), where
        assert [node_of[d] for d in r.arrivals] == list(sim.arrivals), where
        assert [node_of[d] for d in r.departures] == list(sim.departures), where
        for d, c in r.coefficients.items():
            assert c == pytest.approx(sim.coefficients[node_of[d]], rel=1e-12, abs=1e-15), (where, d)
        for d, p in r.p.items():
            assert p == pytest.approx(sim.p[node_of[d]], rel=1e-12), (where, d)
    assert [node_of[d] for r in records for d in r.arrivals] == [arrive]
    assert [node_of[d] for r in records for d in r.departures] == [leave]
    assert any(0 < s < cfg.rules.required_updates for r in sim_records for s in r.s.values()), "no partial work"
    for tau, (model, sim_model) in enumerate(zip(got["models"], sim_models), 1):
        for name, values in model.items():
            diff = (torch.tensor(values) - sim_model[name]).abs().max().item()
            bound = TOLERANCE[trainer] * EPS32 * sim_model[name].abs().max().item()
            assert diff <= bound, f"{strategy} ({cfg.trainer_kind}), round {tau}, {name}: the models differ by " \
                                  f"{diff:.3g} > {bound:.3g}"
    initial = initial_model(model_spec(cfg.partition.dataset), seed=cfg.seed)[1]
    moved = any(not torch.equal(torch.tensor(v), initial[k]) for k, v in got["models"][-1].items())
    assert moved == any(not r.discarded for r in records), "the model moved only if a round was kept"
    assert not all(r.discarded for r in records), f"{strategy} kept no round: the comparison would be empty"


def _match_nodes(records: list[RoundRecord], sim_records: list[RoundRecord]) -> dict[str, str]:
    """Flower's device of each simulator device, by who is in which round with which s and p (no two alike here)."""
    mine = {d for r in records for d in r.devices}
    theirs = {d for r in sim_records for d in r.devices}
    assert len(mine) == len(theirs), (sorted(mine), sorted(theirs))

    def signature(recs: list[RoundRecord], d: str) -> tuple:
        return tuple((r.round, r.s.get(d), round(r.p.get(d, -1.0), 9)) for r in recs)

    by_signature = {signature(sim_records, d): d for d in theirs}
    assert len(by_signature) == len(theirs), "two simulated devices look alike: the test cannot tell them apart"
    node_of = {d: by_signature.get(signature(records, d), "?") for d in mine}
    assert "?" not in node_of.values(), f"a Flower node matches no simulated device: {node_of}"
    return node_of
