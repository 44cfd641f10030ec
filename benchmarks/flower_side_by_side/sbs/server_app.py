"""The ServerApp of the side-by-side: run config `variant` picks the rules, everything else is the same.

- "flower-fedavg": Flower's FedAvg (flwr.serverapp.strategy.FedAvg) with its round timeout: a reply later than
  round-timeout-s is dropped, and the nodes are asked for all E local updates (flexfl.deadline_s = 0). So that only
  the rules differ, its train config carries FlexFL's learning-rate schedule (eta0 / tau; nobody arrives) and the
  keys the shared ClientApp reads (FedAvgFlexFLTerms adds them; the aggregation is FedAvg's own).
- "flexfl-scheme-c": coordinator.flower_strategy.FlexFLStrategy (Scheme C, fast-reboot) with the deadline, which
  the ClientApp races with edge_agent.flower_client.DeadlineTraining, counted from when the round's message was
  made (the ClientApp's start-up is part of the round, as Flower starts one process per message); the round
  timeout is the same.
- "calibrate": FlexFLStrategy with no deadline (every node runs all E), for the deadline's calibration: the rows'
  per-node times from sending to the reply (the recorder's rule, benchmarks/flower_side_by_side.py).

After every round the global model is tested centrally and the curve (round, seconds since the first round opened,
accuracy, loss, updates aggregated) is written to out-file (JSON, rewritten whole each round).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from coordinator.flower_strategy import FlexFLStrategy
from coordinator.rules.config import RulesConfig
from flexfl.files import atomic_file
from flexfl.flower_keys import CONFIG_KEYS
from sbs import task

app = ServerApp()


class FedAvgFlexFLTerms(FedAvg):
    """Flower's FedAvg, whose train messages also carry the round's terms the shared ClientApp reads (E, the round,
    eta0 / tau, no deadline); it counts the replies it aggregated."""

    def __init__(self, *, E: int, eta0: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.E, self.eta0, self.aggregated = E, eta0, 0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[CONFIG_KEYS["round"]] = server_round
        config[CONFIG_KEYS["E"]] = self.E
        config[CONFIG_KEYS["lr"]] = self.eta0 / server_round
        config[CONFIG_KEYS["deadline_s"]] = 0.0
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        self.aggregated = sum(1 for m in replies if not m.has_error())
        return super().aggregate_train(server_round, replies)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    variant, rounds, nodes, seed = str(cfg["variant"]), int(cfg["num-server-rounds"]), int(cfg["num-partitions"]), \
        int(cfg["seed"])
    E, eta0, deadline_s = int(cfg["local-updates"]), float(cfg["eta0"]), float(cfg["deadline-s"])
    model, test = task.new_model(seed=seed), task.test_data(nodes, seed)
    out = Path(str(cfg["out-file"]))
    if variant == "flower-fedavg":
        strategy: FedAvg = FedAvgFlexFLTerms(E=E, eta0=eta0, fraction_train=1.0, fraction_evaluate=0.0,
                                             min_available_nodes=nodes, min_train_nodes=1)
    elif variant in ("flexfl-scheme-c", "calibrate"):
        rules = RulesConfig(required_updates=E, eta0=eta0, batch_size=int(cfg["batch-size"]))
        strategy = FlexFLStrategy(rules=rules, num_rounds=rounds, deadline_s=deadline_s if variant != "calibrate"
                                  else 0.0, seed=seed, dataset=task.DATASET, min_available_nodes=nodes)
    else:
        raise ValueError(f"run config variant = {variant!r}: use 'flower-fedavg', 'flexfl-scheme-c' or 'calibrate'")
    curve: list[dict] = []
    started = time.monotonic()

    def central_test(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        acc, loss = task.test(model, arrays.to_torch_state_dict(), test)
        record = next((r for r in reversed(getattr(strategy, "records", [])) if r.round == server_round), None)
        if isinstance(strategy, FlexFLStrategy):  # a round nobody answered has no record
            used = sum(1 for s in record.s.values() if s > 0) if record and server_round else 0
            s = dict(record.s) if record and server_round else {}
        else:
            used, s = (strategy.aggregated if server_round else 0), {}
        curve.append({"round": server_round, "wall_s": time.monotonic() - started if server_round else 0.0,
                      "acc": acc, "loss": loss, "updates_used": used, "s": s})
        with atomic_file(out) as f:
            f.write(json.dumps({"variant": variant, "seed": seed, "E": E, "deadline_s": deadline_s, "rounds": rounds,
                                "curve": curve, "records": [r.to_json() for r in getattr(strategy, "records", [])]}))
        return MetricRecord({"accuracy": acc, "loss": loss})

    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                   timeout=float(cfg["round-timeout-s"]), evaluate_fn=central_test)
