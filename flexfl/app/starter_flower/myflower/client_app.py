"""The ClientApp: local training that races the round's deadline under FlexFL's rule (DeadlineTraining).

Each round it starts one more local update only while that update, the upload and a safety margin
still fit before the deadline the ServerApp sends, and replies with how many it did (s, of E) and
why it stopped there (complete, compute, upload), which the ServerApp's Scheme C weighs by E / s.

What a node is comes from its node config (`flower-supernode --node-config '...'`; Flower's
Simulation Engine sets the first two itself):
- partition-id, num-partitions: which shard of the split this node trains on;
- a slow node, emulated (both optional):
  - step-delay-s: seconds of sleep after each local update (no root needed);
  - train-cpus: the CPUs its training may use (root): its SuperNode runs in a cgroup of its own
    (loadgen.flower_fleet's NodeSpec.cgroup), which is capped at that while the node trains. Only
    then: a ClientApp starts afresh each round, and its imports (5 CPU seconds here) under a small
    cap would outlast the 60 s a Flower 1.42 SuperNode waits before it restarts the ClientApp.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from edge_agent.flower_client import DeadlineTraining
from loadgen.cgroup import cpu_quota_while
from myflower import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    node = context.node_config
    partition_id, num_partitions = int(node["partition-id"]), int(node["num-partitions"])
    seed, expected = int(context.run_config["seed"]), int(context.run_config["num-partitions"])
    if num_partitions != expected:
        raise ValueError(f"node config num-partitions = {num_partitions}, but the run config's num-partitions is "
                         f"{expected}: the ServerApp tests on that split; give every node num-partitions={expected} "
                         f"(in a simulation: --federation-config num-supernodes={expected})")
    step_delay_s = float(node.get("step-delay-s", 0.0))
    # One thread: a minibatch of 20 x 60 gains nothing from more, and torch's threads spin waiting for work; two
    # SuperNodes on a busy 2-core machine did 8 of E = 50 steps in the 2 s deadline with torch's default, 50 with one.
    torch.set_num_threads(1)
    data = task.train_data(partition_id, num_partitions, seed=seed)  # before the clock starts
    model = task.new_model(seed=seed)
    budget = DeadlineTraining.start(msg, context)  # the round's deadline counts from here
    model.load_state_dict(budget.global_state())
    batches = task.batches(data, batch_size=int(context.run_config["batch-size"]),
                           rng=np.random.default_rng([seed, budget.round, partition_id]))
    with cpu_quota_while(float(node["train-cpus"])) if "train-cpus" in node else nullcontext():
        for _ in budget.updates():  # at most E; each one: one local update
            task.local_update(model, next(batches), lr=budget.lr)
            if step_delay_s:
                time.sleep(step_delay_s)
    return budget.reply(model.state_dict(), num_examples=len(data))
