"""FlexFL's strategy inside Flower's Simulation Engine (issue 35): a real ServerApp and ClientApps on Ray, aggregated by
FlexFL's round. The model it ends with is the one FlexFL's own Federation makes from the same replies, and the
membership events are FlexFL's: nodes that answer in round 1 found the objective, a node that first answers later
arrives with fast-reboot, an error reply counts as s = 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from coordinator.flower_strategy import FlexFLStrategy
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Federation
from edge_agent.transport import wire_stop_reason
from flexfl.vocabulary import StopReason

E, ROUNDS, NODES = 5, 4, 4
LATE = 3  # partition 3 answers with an error until round LATE: it arrives then
SHAPES = {"w": (3, 2), "b": (2,)}


def _n(pid: int) -> int:
    return 100 * (pid + 1)


def _s(pid: int, rnd: int) -> int:
    return (pid + 2 * rnd) % (E + 1)  # some rounds 0 < s < E, some s = 0 or E


def _delta(pid: int, rnd: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * pid + rnd)
    return {name: torch.randn(shape, generator=g) * 0.1 for name, shape in SHAPES.items()}


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    rnd = int(msg.content["config"]["flexfl.round"])
    if (pid == LATE and rnd < LATE) or (pid == 1 and rnd == 2):
        raise RuntimeError(f"partition {pid} is not there in round {rnd}")  # Flower sends an error reply
    assert msg.content["config"]["flexfl.E"] == E
    w = msg.content["arrays"].to_torch_state_dict()
    local = {name: w[name] + d for name, d in _delta(pid, rnd).items()}
    why = StopReason.COMPLETE if _s(pid, rnd) == E else StopReason.COMPUTE
    metrics = MetricRecord({"num-examples": _n(pid), "flexfl.s": _s(pid, rnd),
                            "flexfl.stop_reason": wire_stop_reason(why)})
    return Message(content=RecordDict({"arrays": ArrayRecord(local), "metrics": metrics}), reply_to=msg)


RULES = RulesConfig(required_updates=E, eta0=0.5, batch_size=10)
STRATEGY = FlexFLStrategy(rules=RULES, num_rounds=ROUNDS)
server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    STRATEGY.start(grid=grid, initial_arrays=ArrayRecord({n: torch.zeros(s) for n, s in SHAPES.items()}),
                   num_rounds=ROUNDS, timeout=120)


@pytest.mark.slow
def test_a_flower_run_aggregates_as_flexfls_round_with_its_membership_events() -> None:
    run_simulation(server_app=server, client_app=client, num_supernodes=NODES,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    records = STRATEGY.records
    assert [r.round for r in records] == [1, 2, 3, 4]
    fed = STRATEGY.federation
    pid_of = {d: n // 100 - 1 for d, n in fed.objective.sample_counts.items()}
    late = next(d for d, p in pid_of.items() if p == LATE)
    assert sorted(pid_of.values()) == [0, 1, 2, 3]
    # Founding: the three nodes that answered round 1; the late node arrives at the close of round LATE.
    assert sorted(pid_of[d] for d in records[0].founded) == [0, 1, 2] and late not in records[0].devices
    assert records[LATE - 1].arrivals == (late,) and late not in records[LATE - 1].participants
    n_total = sum(fed.objective.sample_counts.values())
    assert records[LATE].p[late] > _n(LATE) / n_total  # fast-reboot: boosted in the round after its arrival
    # The error reply of partition 1 in round 2 counts as s = 0; the others' s are what they reported.
    one = next(d for d, p in pid_of.items() if p == 1)
    assert records[1].s[one] == 0 and records[1].coefficients[one] == 0 and records[1].stop_reason[one] == "missed"
    for r in records:
        for d in r.participants:
            if not (d == one and r.round == 2):
                assert r.s[d] == _s(pid_of[d], r.round), (r.round, d)
                assert r.stop_reason[d] == ("complete" if r.s[d] == E else "compute"), (r.round, d)
    # The oracle: FlexFL's Federation given the same replies in the same order ends with the same model.
    oracle = Federation(rules=RULES, dataset="flower", params={n: torch.zeros(s) for n, s in SHAPES.items()},
                        horizon=ROUNDS)
    for r in records:
        if r.founded:
            oracle.apply_events(arrivals=[Arrival(d, _n(pid_of[d])) for d in r.founded])
        opening = oracle.open(r.round)
        assert opening.participants == r.participants and math.isclose(opening.lr, r.lr)
        weighing = oracle.weigh(r.round, {d: r.s[d] for d in r.participants})
        rows = list(weighing.contributors)
        deltas = {name: torch.stack([_delta(pid_of[d], r.round)[name] for d in rows]) for name in SHAPES}
        oracle.close_stacked(weighing, deltas=deltas if rows else {}, rows=rows,
                             arrivals=[Arrival(d, _n(pid_of[d])) for d in r.arrivals])
        assert np.allclose(weighing.coefficients.values, [r.coefficients[d] for d in weighing.devices], rtol=1e-12)
    for name in SHAPES:
        assert torch.allclose(fed.params[name], oracle.params[name], rtol=1e-5, atol=1e-7), name
    assert not torch.equal(fed.params["w"], torch.zeros(SHAPES["w"]))
