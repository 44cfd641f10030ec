"""The ServerApp: FlexFL's round rules in Flower (FlexFLStrategy: Scheme C, fast-reboot, a deadline).

Each round the strategy sends the model with the round's deadline, E and learning rate; the nodes'
replies (s of E updates each) are aggregated by FlexFL's own round (coordinator/rules/round.py, the
code FlexFL's live coordinator and its simulator run): Scheme C weighs an incomplete update by
p_k E / s_k, a node that appears mid-run arrives with fast-reboot, one that vanishes departs. After
each round the model is tested centrally and the round's FlexFL row is written to
OUT-DIR/run-<Flower run id>/ (run.json, metrics.jsonl), which `flexfl report` reads.

Its settings are the run config ([tool.flwr.app.config] in pyproject.toml; `flwr run -c 'key=value'`).
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from coordinator.flower_run import FlowerRunFolder
from coordinator.flower_strategy import FlexFLStrategy
from coordinator.rules.config import RulesConfig
from myflower import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, nodes, seed = int(cfg["num-server-rounds"]), int(cfg["num-partitions"]), int(cfg["seed"])
    deadline_s = float(cfg["deadline-s"])
    # FlexFL's [rules]: Scheme C and fast-reboot are its defaults; E counts minibatch steps.
    rules = RulesConfig(required_updates=int(cfg["local-updates"]), eta0=float(cfg["eta0"]),
                        batch_size=int(cfg["batch-size"]), fast_reboot=True)
    strategy = FlexFLStrategy(rules=rules, num_rounds=rounds, deadline_s=deadline_s, seed=seed, dataset=task.DATASET)
    model, test = task.new_model(seed=seed), task.test_data(nodes, seed=seed)
    wait_for_nodes(grid, nodes, timeout_s=float(cfg["round-timeout-s"]))
    out = Path(str(cfg["out-dir"])).absolute() / f"run-{context.run_id}"
    folder = FlowerRunFolder.claim(out, rules=rules, dataset=task.DATASET, deadline_s=deadline_s, config=cfg)
    log(INFO, "FlexFL rows of this run: %s", out)

    def central_test(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        acc, loss = task.test(model, arrays.to_torch_state_dict(), test)
        for r in folder.write_new(strategy.records, evaluated_round=server_round, test_acc=acc, test_loss=loss):
            log(INFO, "round %d: s (E=%d) %s; Scheme C coefficients %s; test accuracy %.2f%%", r.round,
                     rules.required_updates, dict(r.s), {d: round(c, 4) for d, c in r.coefficients.items()},
                     100 * r.test_acc)
        return MetricRecord({"accuracy": acc, "loss": loss})

    try:
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                       timeout=float(cfg["round-timeout-s"]), evaluate_fn=central_test)
    finally:
        folder.close()
    log(INFO, "FlexFL rows of this run: %s (flexfl report %s)", out, out)


def wait_for_nodes(grid: Grid, n: int, *, timeout_s: float) -> None:
    """Wait until `n` nodes are connected: round 1's nodes found the objective (a later one arrives)."""
    limit = time.monotonic() + timeout_s
    while len(list(grid.get_node_ids())) < n:
        if time.monotonic() > limit:
            raise RuntimeError(f"{len(list(grid.get_node_ids()))} of the run config's num-partitions = {n} nodes "
                               f"connected within {timeout_s:g} s: start more SuperNodes, or lower num-partitions")
        time.sleep(0.2)
