"""The fast trainer equals per-device edge_agent.trainer.train_local, row for row."""

import numpy as np
import pytest
import torch

from edge_agent.trainer import device_rng, train_local
from flexfl.errors import ConfigError
from simulator.trainers.fast_trainer import FastTrainer
from workloads.datasets import ArrayDataset
from workloads.models import build_model

BATCH = 10
E_OF = {"logreg": 6, "mlp": 6, "cnn": 3}  # a CNN step costs ~10 ms here


def _shards(sizes, dim, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [ArrayDataset(x=rng.random((n, dim), dtype=np.float32), y=rng.integers(0, classes, n).astype(np.int64))
            for n in sizes]


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _reference(name, dim, classes, start, shard, *, steps, lr, rng):
    ref = build_model(name, in_features=dim, num_classes=classes)
    ref.load_state_dict({n: p.clone() for n, p in start.items()})
    return train_local(ref, shard, updates=steps, lr=lr, batch_size=BATCH, rng=rng)


def _assert_rows_equal(name, dim, classes, shards, deltas, losses, *, starts, shard_of_row, steps, lrs, rng_keys):
    for i, (shard, s, lr) in enumerate(zip(shard_of_row, steps, lrs)):
        res = _reference(name, dim, classes, starts[i], shards[shard], steps=int(s), lr=float(lr),
                         rng=device_rng(*rng_keys[i]))
        for n in starts[i]:
            torch.testing.assert_close(deltas[n][i], res.delta[n], rtol=1e-4, atol=2e-6, msg=f"row {i} {n}")
        if s == 0:
            assert np.isnan(losses[i]) and all(float(d[i].abs().max()) == 0.0 for d in deltas.values())
        else:
            assert losses[i] == pytest.approx(res.mean_loss, rel=1e-5)


MODELS = [("logreg", 60, 10), ("mlp", 784, 10), ("cnn", 784, 47)]


@pytest.mark.parametrize("name, dim, classes", MODELS)
@pytest.mark.parametrize("chunk_rows", [None, 2])
def test_global_start_ragged_steps_equal_train_local(name, dim, classes, chunk_rows):
    torch.manual_seed(0)
    model = build_model(name, in_features=dim, num_classes=classes)
    shards = _shards([13, 40, 7, 25, 31], dim, classes)
    start = _params(model)
    # Ragged s including 0 and E, unsorted, one shard trained twice (as two runs would), and
    # shard 2 smaller than a batch (its batches repeat indices).
    E = E_OF[name]
    shard_of_row = np.array([0, 1, 2, 3, 4, 1])
    steps = np.array([2, E, E - 1, 0, E, 1])
    keys = [(7, 3, int(k)) for k in shard_of_row]
    trainer = FastTrainer(model, shards, batch_size=BATCH, chunk_rows=chunk_rows)
    deltas, losses = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=0.05,
                                   rngs=[device_rng(*k) for k in keys])
    _assert_rows_equal(name, dim, classes, shards, deltas, losses, starts=[start] * len(steps),
                       shard_of_row=shard_of_row, steps=steps, lrs=[0.05] * len(steps), rng_keys=keys)
    # The global parameters are not modified in place.
    for n, p in model.named_parameters():
        torch.testing.assert_close(start[n], p.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("name, dim, classes", MODELS)
@pytest.mark.parametrize("by_run", [False, True])
def test_per_row_start_weights_and_learning_rates(name, dim, classes, by_run):
    # Three runs (as three schemes would) share two shards, each from its own global model and
    # lr; the start models are given per row, or once per run with start_of_row.
    shards = _shards([17, 26], dim, classes, seed=1)
    starts = []
    for run in range(3):
        torch.manual_seed(run)
        starts.append(_params(build_model(name, in_features=dim, num_classes=classes)))
    run_of_row = np.array([0, 0, 1, 1, 2, 2])
    shard_of_row = np.array([0, 1, 0, 1, 0, 1])
    E = E_OF[name]
    steps = np.array([E, E - 1, 0, E, 2, 1])
    run_lr = np.array([0.1, 0.02, 0.05])
    if by_run:
        start = {n: torch.stack([s[n] for s in starts]) for n in starts[0]}
        extra = {"start_of_row": run_of_row}
    else:
        start = {n: torch.stack([starts[r][n] for r in run_of_row]) for n in starts[0]}
        extra = {}
    keys = [(11, 2, int(k)) for k in shard_of_row]
    trainer = FastTrainer(build_model(name, in_features=dim, num_classes=classes), shards, batch_size=BATCH)
    deltas, losses = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=run_lr[run_of_row],
                                   rngs=[device_rng(*k) for k in keys], **extra)
    _assert_rows_equal(name, dim, classes, shards, deltas, losses, starts=[starts[r] for r in run_of_row],
                       shard_of_row=shard_of_row, steps=steps, lrs=run_lr[run_of_row], rng_keys=keys)


def test_rows_whose_lr_differs_get_different_deltas():
    # Guards the per-row lr path: equal rows but for lr must not come out equal.
    model = build_model("mlp", num_classes=10)
    shards = _shards([30], 784, 10)
    trainer = FastTrainer(model, shards, batch_size=BATCH)
    deltas, _ = trainer.train(_params(model), shard_of_row=[0, 0], steps=[3, 3], lr=[0.1, 0.01],
                              rngs=[device_rng(0, 1, 0), device_rng(0, 1, 0)])
    assert not torch.allclose(deltas["fc1.weight"][0], deltas["fc1.weight"][1])


def test_bad_input_names_the_row_or_parameter():
    model = build_model("logreg", in_features=60, num_classes=10)
    trainer = FastTrainer(model, _shards([20, 20], 60, 10), batch_size=BATCH)
    start = _params(model)
    rngs = [device_rng(0, 1, 0), device_rng(0, 1, 1)]
    with pytest.raises(ConfigError, match="row 1: shard 5"):
        trainer.train(start, shard_of_row=[0, 5], steps=[1, 1], lr=0.1, rngs=rngs)
    with pytest.raises(ConfigError, match="row 0: learning rate"):
        trainer.train(start, shard_of_row=[0, 1], steps=[1, 1], lr=[float("nan"), 0.1], rngs=rngs)
    with pytest.raises(ConfigError, match="steps must be >= 0; row 1"):
        trainer.train(start, shard_of_row=[0, 1], steps=[1, -2], lr=0.1, rngs=rngs)
    with pytest.raises(ConfigError, match=r"start\['linear.weight'\] has shape \(3, 10, 60\)"):
        trainer.train({**start, "linear.weight": torch.zeros(3, 10, 60)}, shard_of_row=[0, 1], steps=[1, 1],
                      lr=0.1, rngs=rngs)
    with pytest.raises(ConfigError, match="one entry per row"):
        trainer.train(start, shard_of_row=[0, 1], steps=[1, 1], lr=0.1, rngs=rngs[:1])
    two_models = {n: torch.stack([p, p]) for n, p in start.items()}
    with pytest.raises(ConfigError, match=r"start\['linear.weight'\] holds 2 models but row 1 starts from model 2"):
        trainer.train(two_models, shard_of_row=[0, 1], steps=[1, 1], lr=0.1, rngs=rngs, start_of_row=[0, 2])
    with pytest.raises(ConfigError, match=r"with start_of_row expected \(models, 10, 60\)"):
        trainer.train(start, shard_of_row=[0, 1], steps=[1, 1], lr=0.1, rngs=rngs, start_of_row=[0, 0])
    with pytest.raises(ConfigError, match="no kernel for Linear"):
        FastTrainer(torch.nn.Linear(3, 2), _shards([5], 3, 2), batch_size=BATCH)


def test_out_buffer_receives_the_deltas_and_idle_rows_are_zeroed():
    model = build_model("logreg", in_features=60, num_classes=10)
    shards = _shards([20, 30], 60, 10)
    trainer = FastTrainer(model, shards, batch_size=BATCH)
    start = _params(model)
    # Sized for 4 rows with stale values from a "last round"; this round trains 3.
    out = {n: torch.full((4, *p.shape), 7.0) for n, p in start.items()}
    rows = dict(shard_of_row=[0, 1, 0], steps=[2, 0, 3], lr=0.1)
    deltas, _losses = trainer.train(start, **rows, rngs=[device_rng(1, 1, k) for k in (0, 1, 0)], out=out)
    fresh, _ = trainer.train(start, **rows, rngs=[device_rng(1, 1, k) for k in (0, 1, 0)])
    for n in start:
        assert deltas[n].data_ptr() == out[n].data_ptr() and deltas[n].shape[0] == 3
        torch.testing.assert_close(out[n][:3], fresh[n], rtol=0, atol=0)
        assert float(out[n][1].abs().max()) == 0.0
    with pytest.raises(ConfigError, match=r"out\['linear.bias'\] must be contiguous float32 of shape "
                                            r"\(>= 3, 10\), got torch.float32 \(2, 10\)"):
        trainer.train(start, **rows, rngs=[device_rng(1, 1, k) for k in (0, 1, 0)],
                      out={**out, "linear.bias": torch.zeros(2, 10)})


def test_no_row_trains():
    model = build_model("mlp", num_classes=10)
    trainer = FastTrainer(model, _shards([12], 784, 10), batch_size=BATCH)
    deltas, losses = trainer.train(_params(model), shard_of_row=[0, 0], steps=[0, 0], lr=0.1, rngs=[None, None])
    assert all(float(d.abs().max()) == 0.0 and d.shape[0] == 2 for d in deltas.values())
    assert np.isnan(losses).all()

