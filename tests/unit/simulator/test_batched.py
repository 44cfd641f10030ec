"""The batched (vmap) trainer equals the plain per-device trainer, step for step."""

import numpy as np
import pytest
import torch

from edge_agent.trainer import device_rng, train_local
from simulator.batched import BatchedTrainer
from workloads.evaluation import evaluate
from workloads.datasets import ArrayDataset
from workloads.models import build_model


def _shards(sizes, dim, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [ArrayDataset(x=rng.random((n, dim), dtype=np.float32), y=rng.integers(0, classes, n).astype(np.int64)) for n in sizes]


@pytest.mark.parametrize("name, dim, classes", [("logreg", 60, 10), ("mlp", 784, 10), ("cnn", 784, 47)])
def test_batched_equals_plain(name, dim, classes):
    torch.manual_seed(0)
    model = build_model(name, in_features=dim, num_classes=classes)
    shards = _shards([13, 40, 7, 25], dim, classes)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    devices = np.array([0, 1, 3])  # device 2 sits out, as an inactive device would
    steps = np.array([5, 2, 4])
    lr = 0.05
    trainer = BatchedTrainer(model, shards, batch_size=10)
    deltas, losses = trainer.train(params, devices=devices, steps=steps, lr=lr,
                                   rngs=[device_rng(7, 3, int(d)) for d in devices])
    for i, (d, s) in enumerate(zip(devices, steps)):
        ref = build_model(name, in_features=dim, num_classes=classes)
        ref.load_state_dict({n: p.clone() for n, p in params.items()})
        res = train_local(ref, shards[d], updates=int(s), lr=lr, batch_size=10, rng=device_rng(7, 3, int(d)))
        for n in params:
            torch.testing.assert_close(deltas[n][i], res.delta[n], rtol=1e-4, atol=1e-6)
        assert losses[i] == pytest.approx(res.mean_loss, rel=1e-4)
    # The global parameters are not modified in place.
    for n, p in model.named_parameters():
        torch.testing.assert_close(params[n], p.detach())


def test_evaluate_counts_correct_predictions():
    model = build_model("logreg", in_features=2, num_classes=2)
    params = {"linear.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "linear.bias": torch.zeros(2)}
    assert set(params) == {n for n, _ in model.named_parameters()}
    data = ArrayDataset(x=np.array([[2, 0], [0, 2], [2, 0], [0, 2]], dtype=np.float32), y=np.array([0, 1, 1, 1]))
    acc, loss = evaluate(model, params, data, chunk=3)
    assert acc == 0.75 and loss > 0
