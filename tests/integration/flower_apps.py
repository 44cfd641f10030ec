"""Flower apps for the Flower tests, each run in a process of its own (`python flower_apps.py SCENARIO OUT.json`):
a second run_simulation in one process got no replies at all (Flower 1.42), so a test never runs two.

- strategy: four nodes under FlexFLStrategy, with deterministic updates; partition 3 answers with errors until
  round LATE (it arrives then), partition 1 errors in round 2.
- client: two nodes training under edge_agent.flower_client.DeadlineTraining: partition 0's updates take 50 ms
  (its rounds are cut short by the deadline), partition 1's take no time (it finishes E).
OUT.json gets the strategy's round records, its objective's sample counts and its final model.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from coordinator.flower_strategy import FlexFLStrategy
from coordinator.rules.config import RulesConfig
from edge_agent.flower_client import DeadlineTraining
from edge_agent.transport import wire_stop_reason
from flexfl.vocabulary import StopReason

# ---- strategy --------------------------------------------------------------------------------

E, ROUNDS, NODES, LATE = 5, 4, 4, 3
SHAPES = {"w": (3, 2), "b": (2,)}
RULES = RulesConfig(required_updates=E, eta0=0.5, batch_size=10)


def n_of(pid: int) -> int:
    return 100 * (pid + 1)


def s_of(pid: int, rnd: int) -> int:
    return (pid + 2 * rnd) % (E + 1)  # some rounds 0 < s < E, some s = 0 or E


def delta_of(pid: int, rnd: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * pid + rnd)
    return {name: torch.randn(shape, generator=g) * 0.1 for name, shape in SHAPES.items()}


def initial() -> dict[str, torch.Tensor]:
    return {name: torch.zeros(shape) for name, shape in SHAPES.items()}


scripted = ClientApp()


@scripted.train()
def scripted_train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    rnd = int(msg.content["config"]["flexfl.round"])
    if (pid == LATE and rnd < LATE) or (pid == 1 and rnd == 2):
        raise RuntimeError(f"partition {pid} is not there in round {rnd}")  # Flower sends an error reply
    w = msg.content.array_records["arrays"].to_torch_state_dict()
    local = {name: w[name] + d for name, d in delta_of(pid, rnd).items()}
    why = StopReason.COMPLETE if s_of(pid, rnd) == E else StopReason.COMPUTE
    metrics = MetricRecord({"num-examples": n_of(pid), "flexfl.s": s_of(pid, rnd),
                            "flexfl.stop_reason": wire_stop_reason(why)})
    return Message(content=RecordDict({"arrays": ArrayRecord(local), "metrics": metrics}), reply_to=msg)


# ---- client ----------------------------------------------------------------------------------

CLIENT_E, UPDATE_S, DEADLINE_S = 40, 0.05, 0.6  # 40 slow updates take 2 s: the deadline allows well under half

deadline = ClientApp()


@deadline.train()
def deadline_train(msg: Message, context: Context) -> Message:
    slow = int(context.node_config["partition-id"]) == 0
    budget = DeadlineTraining.start(msg, context)
    w = budget.global_state()
    for _ in budget.updates():
        if slow:
            time.sleep(UPDATE_S)  # one slow local update
        w = {k: v + 0.01 for k, v in w.items()}
    return budget.reply(w, num_examples=100 if slow else 200)


def run(scenario: str) -> FlexFLStrategy:
    if scenario == "strategy":
        strategy, client, nodes, rounds, start = FlexFLStrategy(rules=RULES, num_rounds=ROUNDS), scripted, NODES, \
            ROUNDS, initial()
    else:
        strategy = FlexFLStrategy(rules=RulesConfig(required_updates=CLIENT_E, eta0=0.1, batch_size=10),
                                  num_rounds=3, deadline_s=DEADLINE_S)
        client, nodes, rounds, start = deadline, 2, 3, {"w": torch.zeros(2, 2)}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.start(grid=grid, initial_arrays=ArrayRecord(start), num_rounds=rounds, timeout=300)

    run_simulation(server_app=server, client_app=client, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    return strategy


if __name__ == "__main__":
    done = run(sys.argv[1])
    fed = done.federation
    assert fed is not None
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"records": [r.to_json() for r in done.records], "sample_counts": dict(fed.objective.sample_counts),
                   "params": {name: t.tolist() for name, t in fed.params.items()}}, f)
