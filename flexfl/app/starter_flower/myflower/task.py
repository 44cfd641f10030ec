"""The experiment: its data, its model and one local update. Edit these into your own.

The data is FlexFL's SYNTHETIC(1,1) (workloads/synthetic.py: FedProx's generator, 60 features, 10
classes, each partition drawn from a model of its own, so the partitions differ as in the paper),
generated in code, nothing to download; split into equal shards by FlexFL's partition spec, so the
ServerApp and every ClientApp cut the same split from the same seed. The model is the paper's for
it, multinomial logistic regression (60 -> 10). Both run in a blink on a CPU. MNIST is one line
away (`dataset="mnist"`, with its MLP) once FlexFL's cache holds it (`flexfl data prepare`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from workloads.datasets import ArrayDataset
from workloads.evaluation import evaluate
from workloads.federated import initial_model, load_evaluation, load_shard
from workloads.partition_spec import PartitionSpec

DATASET = "synthetic"


def partition(num_partitions: int, *, seed: int) -> PartitionSpec:
    """The split: SYNTHETIC(1,1) over `num_partitions` nodes, equal shards (10 % of each held out for testing)."""
    return PartitionSpec(dataset=DATASET, n_devices=num_partitions, sizes="equal", seed=seed)


def train_data(partition_id: int, num_partitions: int, *, seed: int) -> ArrayDataset:
    """Node `partition_id`'s training samples."""
    return load_shard(partition(num_partitions, seed=seed), partition_id)


def test_data(num_partitions: int, *, seed: int) -> ArrayDataset:
    """The central test set: every partition's held-out samples."""
    return load_evaluation(partition(num_partitions, seed=seed)).test


def new_model(*, seed: int) -> nn.Module:
    """The model with its initial parameters for `seed` (the same on the ServerApp and every node)."""
    model, _ = initial_model(DATASET, seed=seed)
    return model


def batches(data: ArrayDataset, *, batch_size: int, rng: np.random.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless minibatches (x [B, 60], y [B]): consecutive batches of fresh permutations of the samples."""
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    while True:
        order = rng.permutation(len(data))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = torch.from_numpy(order[start:start + batch_size])
            yield x[rows], y[rows]


def local_update(model: nn.Module, batch: tuple[torch.Tensor, ...], *, lr: float) -> float:
    """One local update: one minibatch SGD step at learning rate `lr`; returns the batch's loss."""
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
    return float(loss.detach())


def test(model: nn.Module, state: dict[str, torch.Tensor], data: ArrayDataset) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of the parameters `state` on `data`."""
    return evaluate(model, state, data)
