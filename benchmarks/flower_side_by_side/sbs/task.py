"""The side-by-side's experiment: MNIST split IID over the nodes, the paper's MLP, one SGD step.

IID: FlexFL's non-IID MNIST split gives each device one digit, so five devices hold five of the ten and FedAvg over
them cannot pass ~50 % (seen in the first run of this benchmark: Flower's FedAvg stayed at 10.3 % over 10 rounds,
the loss rising); five devices on a desk, each with a bit of everything, is the setting this compares.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import numpy as np
import torch
from torch import nn

from workloads.datasets import ArrayDataset, scaled
from workloads.evaluation import evaluate
from workloads.federated import initial_model, load_evaluation, load_shard
from workloads.partition_spec import PartitionSpec

DATASET = "mnist"


def partition(num_partitions: int, *, seed: int) -> PartitionSpec:
    """FlexFL's MNIST split over `num_partitions` nodes: IID, the paper's sizes."""
    return PartitionSpec(dataset=DATASET, n_devices=num_partitions, iid=True, seed=seed)


@cache
def train_data(partition_id: int, num_partitions: int, seed: int) -> ArrayDataset:
    """Node `partition_id`'s training samples (read once per process)."""
    return load_shard(partition(num_partitions, seed=seed), partition_id)


@cache
def test_data(num_partitions: int, seed: int) -> ArrayDataset:
    return load_evaluation(partition(num_partitions, seed=seed)).test


def new_model(*, seed: int) -> nn.Module:
    model, _ = initial_model(DATASET, seed=seed)
    return model


def batches(data: ArrayDataset, *, batch_size: int, rng: np.random.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless minibatches: consecutive batches of fresh permutations of the samples."""
    while True:
        order = rng.permutation(len(data))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            yield scaled(torch.from_numpy(data.x[rows])), torch.from_numpy(data.y[rows])


def local_update(model: nn.Module, batch: tuple[torch.Tensor, ...], *, lr: float) -> None:
    """One local update: one minibatch SGD step."""
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def test(model: nn.Module, state: dict[str, torch.Tensor], data: ArrayDataset) -> tuple[float, float]:
    return evaluate(model, state, data)
