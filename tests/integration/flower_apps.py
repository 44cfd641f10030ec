"""Flower apps for the Flower tests, each run in a process of its own (`python flower_apps.py SCENARIO OUT.json`):
a second run_simulation in one process got no replies at all (Flower 1.42), so a test never runs two.

- strategy: four nodes under FlexFLStrategy, with deterministic updates; partition 3 answers with errors until
  round LATE (it arrives then), partition 1 errors in round 2.
- client: two nodes training under edge_agent.flower_client.DeadlineTraining: partition 0's updates take 50 ms
  (its rounds are cut short by the deadline), partition 1's take no time (it finishes E). With RUN_DIR
  (`python flower_apps.py client OUT.json RUN_DIR`) the ServerApp writes its run folder there, round by round
  (coordinator.flower_run.FlowerRunFolder, as a Flower app under FlexFL's strategy does).
- trace: five nodes on SYNTHETIC whose s each round is drawn from FlexFL's paper traces (TraceTraining) and whose
  local SGD is FlexFL's (edge_agent.trainer.train_local), one ServerApp running every built-in strategy in turn
  (TRACE_CONFIGS: the configs `flexfl sim run` would run); partition ARRIVE.device is absent until round
  ARRIVE.round, partition LEAVE.device says it leaves in round LEAVE.round and is gone after it.
OUT.json gets the strategy's round records, its objective's sample counts and its final model (trace: per
strategy, its records and the global model after every round).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from coordinator.flower_run import FlowerRunFolder
from coordinator.flower_strategy import FlexFLStrategy
from coordinator.rules.config import RulesConfig
from coordinator.rules.strategies import strategy_names
from edge_agent.flower_client import DeadlineTraining, TraceTraining, trace_for
from edge_agent.trainer import device_rng, train_local
from edge_agent.transport import wire_stop_reason
from flexfl.run_spec import RunSpec
from flexfl.vocabulary import StopReason
from simulator.sim_config import ArrivalEvent, DepartureEvent, ScheduleConfig, SimConfig
from trace_recorder.format import read_trace_set
from trace_recorder.traces_table import TracesConfig
from workloads.federated import build_federated, initial_model, model_spec
from workloads.partition_spec import PartitionSpec

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


# ---- trace ----------------------------------------------------------------------------------

ARRIVE, LEAVE = ArrivalEvent(device=4, round=2), DepartureEvent(device=1, round=4)
TRACE_BASE = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=5, total_samples=1500, seed=1),
                       rules=RulesConfig(required_updates=8, batch_size=10),
                       # The first four traces (T0..T50): Scheme A keeps some rounds (one completes) and drops others.
                       traces=TracesConfig(num_traces=4),
                       schedule=ScheduleConfig(arrivals=(ARRIVE,), departures=(LEAVE,)),
                       run=RunSpec(rounds=6, seed=3), trainer="plain")
TRACE_CONFIGS = {name: replace(TRACE_BASE, rules=TRACE_BASE.rules.with_strategy(name, mu=0.1 if name == "fedprox"
                                                                                  else None))
                 for name in strategy_names()}
_data = {}


def _trace_data():
    if not _data:  # once per process (a Ray actor serves many nodes' rounds)
        _data["fed"] = build_federated(TRACE_BASE.partition)
        _data["traces"] = read_trace_set(Path(TRACE_BASE.traces.set))
        _data["model"] = initial_model(model_spec("synthetic"), seed=0)[0]
    return _data["fed"], _data["traces"], _data["model"]


traced = ClientApp()


@traced.train()
def traced_train(msg: Message, context: Context) -> Message:
    k = int(context.node_config["partition-id"])
    rnd = int(msg.content["config"]["flexfl.round"])
    if (k == ARRIVE.device and rnd < ARRIVE.round) or (k == LEAVE.device and rnd > LEAVE.round):
        raise RuntimeError(f"partition {k} is not there in round {rnd}")  # absent: Flower sends an error reply
    fed, traces, model = _trace_data()
    cfg = TRACE_BASE
    budget = TraceTraining.start(msg, context, device_index=k, trace=trace_for(
        traces, device_index=k, n_devices=cfg.partition.n_devices, num_traces=cfg.traces.num_traces, seed=cfg.seed))
    model.load_state_dict(budget.global_state())
    done = train_local(model, fed.train[k], updates=budget.cap, lr=budget.lr, mu=budget.mu, unit=cfg.rules.unit,
                       batch_size=cfg.rules.batch_size_for(cfg.partition.dataset),
                       rng=device_rng(cfg.seed, budget.round, k))
    return budget.reply(model.state_dict(), num_examples=int(fed.sample_counts[k]), s=done.updates_completed,
                        leaving=k == LEAVE.device and rnd == LEAVE.round, train_s=done.train_s)


def run_traced(out: Path) -> None:
    """Every built-in strategy in turn on the same five nodes; OUT.json: per strategy, records and models."""
    server, done = ServerApp(), {}
    start = ArrayRecord(initial_model(model_spec("synthetic"), seed=TRACE_BASE.seed)[1])

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for name, cfg in TRACE_CONFIGS.items():
            strategy = FlexFLStrategy(rules=cfg.rules, num_rounds=cfg.rounds, seed=cfg.seed,
                                      dataset=str(cfg.partition.dataset))
            models = []

            def keep(server_round: int, arrays: ArrayRecord, models=models) -> None:
                if server_round > 0:
                    models.append({k: v.tolist() for k, v in arrays.to_torch_state_dict().items()})

            strategy.start(grid=grid, initial_arrays=start, num_rounds=cfg.rounds, timeout=300, evaluate_fn=keep)
            done[name] = {"records": [r.to_json() for r in strategy.records], "models": models}

    run_simulation(server_app=server, client_app=traced, num_supernodes=TRACE_BASE.partition.n_devices,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    out.write_text(json.dumps(done))


def run(scenario: str, run_dir: Path | None = None) -> FlexFLStrategy:
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
        if run_dir is None:
            strategy.start(grid=grid, initial_arrays=ArrayRecord(start), num_rounds=rounds, timeout=300)
            return
        folder = FlowerRunFolder.claim(run_dir, rules=strategy.rules, dataset=strategy.dataset,
                                       deadline_s=strategy.deadline_s, config={"scenario": scenario})

        def write_rows(server_round: int, arrays: ArrayRecord) -> None:  # after each round, as a Flower app would
            folder.write_new(strategy.records, evaluated_round=server_round)

        try:
            strategy.start(grid=grid, initial_arrays=ArrayRecord(start), num_rounds=rounds, timeout=300,
                           evaluate_fn=write_rows)
        finally:
            folder.close()

    run_simulation(server_app=server, client_app=client, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    return strategy


if __name__ == "__main__":
    if sys.argv[1] == "trace":
        run_traced(Path(sys.argv[2]))
        sys.exit(0)
    done = run(sys.argv[1], Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    fed = done.federation
    assert fed is not None
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"records": [r.to_json() for r in done.records], "sample_counts": dict(fed.objective.sample_counts),
                   "params": {name: t.tolist() for name, t in fed.params.items()}}, f)
