"""The ClientApp of the side-by-side, the same under both variants: FlexFL's deadline rule around one SGD step a
local update (edge_agent.flower_client.DeadlineTraining). Under "flower-fedavg" the ServerApp sends no deadline
(flexfl.deadline_s = 0), so it runs all E updates, as a Flower client does; under "flexfl-scheme-c" it stops when the
next update and its upload no longer fit before the deadline, counted from when the ServerApp made the message (one
clock: the emulated fleet is one machine)."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from edge_agent.flower_client import DeadlineTraining
from sbs import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    k, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    seed = int(context.run_config["seed"])
    data, model = task.train_data(k, n, seed), task.new_model(seed=seed)  # before the clock starts
    budget = DeadlineTraining.start(msg, context, counting_from="sent")
    model.load_state_dict(budget.global_state())
    batches = task.batches(data, batch_size=int(context.run_config["batch-size"]),
                           rng=np.random.default_rng([seed, budget.round, k]))
    for _ in budget.updates():
        task.local_update(model, next(batches), lr=budget.lr)
    return budget.reply(model.state_dict(), num_examples=len(data))
