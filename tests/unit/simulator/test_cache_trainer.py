"""The cache trainer equals per-device train_local and FastTrainer, row for row; FedProx's mu in both."""

import numpy as np
import pytest
import torch
from torch import nn

from edge_agent.trainer import device_rng, step_plan, train_local
from flexfl.errors import ConfigError
from simulator.trainers.cache_trainer import EVAL_BLOCK, CacheTrainer, evaluate, sparse_inputs
from simulator.trainers.fast_trainer import FastTrainer
from workloads.datasets import ArrayDataset
from workloads.evaluation import evaluate as torch_evaluate
from workloads.models import build_model

BATCH = 10
DENSE = [("logreg", 60, 10), ("mlp", 784, 10)]


def _shards(sizes, dim, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [ArrayDataset(x=rng.random((n, dim), dtype=np.float32), y=rng.integers(0, classes, n).astype(np.int64))
            for n in sizes]


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _models(name, dim, classes, count):
    out = []
    for seed in range(count):
        torch.manual_seed(seed)
        out.append(_params(build_model(name, in_features=dim, num_classes=classes)))
    return out


def _assert_rows_equal_train_local(name, dim, classes, shards, deltas, losses, *, starts, shard_of_row, steps, lrs,
                                   rng_keys, batch=BATCH, mu=0.0):
    mus = np.broadcast_to(np.asarray(mu, dtype=float), (len(steps),))
    for i, (shard, s, lr) in enumerate(zip(shard_of_row, steps, lrs)):
        ref = build_model(name, in_features=dim, num_classes=classes)
        ref.load_state_dict({n: p.clone() for n, p in starts[i].items()})
        res = train_local(ref, shards[shard], updates=int(s), lr=float(lr), batch_size=batch,
                          rng=device_rng(*rng_keys[i]), mu=float(mus[i]))
        for n in starts[i]:
            torch.testing.assert_close(deltas[n][i], res.delta[n], rtol=1e-4, atol=2e-6, msg=f"row {i} {n}")
        if s == 0:
            assert np.isnan(losses[i]) and all(float(d[i].abs().max()) == 0.0 for d in deltas.values())
        else:
            assert losses[i] == pytest.approx(res.mean_loss, rel=1e-5)


@pytest.mark.parametrize("name, dim, classes", DENSE)
def test_ragged_steps_equal_train_local_and_the_fast_trainer(name, dim, classes):
    model = build_model(name, in_features=dim, num_classes=classes)
    shards = _shards([13, 40, 7, 25, 31], dim, classes)
    start = _params(model)
    # Ragged s including 0, unsorted, one shard trained twice, shard 2 smaller than a batch.
    shard_of_row = np.array([0, 1, 2, 3, 4, 1])
    steps = np.array([2, 9, 5, 0, 6, 1])
    keys = [(7, 3, int(k)) for k in shard_of_row]
    args = dict(shard_of_row=shard_of_row, steps=steps, lr=0.05)
    deltas, losses = CacheTrainer(model, shards, batch_size=BATCH).train(start, **args,
                                                                         rngs=[device_rng(*k) for k in keys])
    _assert_rows_equal_train_local(name, dim, classes, shards, deltas, losses, starts=[start] * len(steps),
                                   shard_of_row=shard_of_row, steps=steps, lrs=[0.05] * len(steps), rng_keys=keys)
    fast, fast_losses = FastTrainer(model, shards, batch_size=BATCH).train(start, **args,
                                                                           rngs=[device_rng(*k) for k in keys])
    for n in start:
        torch.testing.assert_close(deltas[n], fast[n], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(losses, fast_losses, rtol=1e-5)
    for n, p in model.named_parameters():  # the global parameters are not modified in place
        torch.testing.assert_close(start[n], p.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("batch", [3, 13])
def test_batches_off_the_kernels_blocks_equal_the_fast_trainer(batch):
    # The kernels work in blocks of 4 outputs and 5 or 10 batch rows: 3 takes only the remainder
    # paths, 13 both (the MLP's last layer, 10 outputs, has a remainder of 2 as well).
    model = build_model("mlp", num_classes=10)
    shards = _shards([30, 8], 784, 10, seed=2)
    start = _params(model)
    args = dict(shard_of_row=[0, 1, 0], steps=[4, 3, 0], lr=0.1)
    got, got_loss = CacheTrainer(model, shards, batch_size=batch).train(start, **args,
                                                                        rngs=[device_rng(2, 1, k) for k in (0, 1, 0)])
    want, want_loss = FastTrainer(model, shards, batch_size=batch).train(start, **args,
                                                                         rngs=[device_rng(2, 1, k) for k in (0, 1, 0)])
    for n in start:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    assert float(got["fc1.weight"][0].abs().max()) > 0


@pytest.mark.parametrize("name, dim, classes", DENSE)
@pytest.mark.parametrize("by_run", [False, True])
def test_per_row_start_weights_and_learning_rates(name, dim, classes, by_run):
    # Three runs share two shards, each from its own global model and lr; the start models are
    # given per row, or once per run with start_of_row.
    shards = _shards([17, 26], dim, classes, seed=1)
    starts = _models(name, dim, classes, 3)
    run_of_row = np.array([0, 0, 1, 1, 2, 2])
    shard_of_row = np.array([0, 1, 0, 1, 0, 1])
    steps = np.array([6, 5, 0, 6, 2, 1])
    run_lr = np.array([0.1, 0.02, 0.05])
    if by_run:
        start = {n: torch.stack([s[n] for s in starts]) for n in starts[0]}
        extra = {"start_of_row": run_of_row}
    else:
        start = {n: torch.stack([starts[r][n] for r in run_of_row]) for n in starts[0]}
        extra = {}
    keys = [(11, 2, int(k)) for k in shard_of_row]
    trainer = CacheTrainer(build_model(name, in_features=dim, num_classes=classes), shards, batch_size=BATCH)
    deltas, losses = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=run_lr[run_of_row],
                                   rngs=[device_rng(*k) for k in keys], **extra)
    _assert_rows_equal_train_local(name, dim, classes, shards, deltas, losses, starts=[starts[r] for r in run_of_row],
                                   shard_of_row=shard_of_row, steps=steps, lrs=run_lr[run_of_row], rng_keys=keys)


def test_a_global_parameter_beside_stacked_ones():
    # Without start_of_row each parameter may be global or per row on its own.
    model = build_model("logreg", in_features=60, num_classes=10)
    shards = _shards([20, 30], 60, 10)
    starts = _models("logreg", 60, 10, 2)
    start = {"linear.weight": torch.stack([s["linear.weight"] for s in starts]),
             "linear.bias": starts[0]["linear.bias"]}
    keys = [(3, 1, 0), (3, 1, 1)]
    deltas, losses = CacheTrainer(model, shards, batch_size=BATCH).train(
        start, shard_of_row=[0, 1], steps=[3, 4], lr=0.2, rngs=[device_rng(*k) for k in keys])
    per_row = [{"linear.weight": s["linear.weight"], "linear.bias": starts[0]["linear.bias"]} for s in starts]
    _assert_rows_equal_train_local("logreg", 60, 10, shards, deltas, losses, starts=per_row, shard_of_row=[0, 1],
                                   steps=[3, 4], lrs=[0.2, 0.2], rng_keys=keys)


def test_rows_sharing_a_generator_train_on_its_batches_each_for_its_own_steps():
    model = build_model("mlp", num_classes=10)
    shards = _shards([40, 25], 784, 10, seed=3)
    trainer = CacheTrainer(model, shards, batch_size=BATCH)
    start = _params(model)
    shard_of_row, steps = [0, 0, 0, 1], [4, 1, 6, 3]  # three rows of shard 0 (ragged steps), one of shard 1
    shared = device_rng(0, 1, 0)
    got, got_loss = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=0.1,
                                  rngs=[shared, shared, shared, device_rng(0, 1, 1)])
    want, want_loss = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=0.1,
                                    rngs=[device_rng(0, 1, k) for k in shard_of_row])
    np.testing.assert_array_equal(got_loss, want_loss)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=0)
    assert not torch.equal(got["fc1.weight"][0], got["fc1.weight"][1])  # 4 steps vs 1


def test_rows_whose_lr_differs_get_different_deltas():
    model = build_model("mlp", num_classes=10)
    trainer = CacheTrainer(model, _shards([30], 784, 10), batch_size=BATCH)
    deltas, _ = trainer.train(_params(model), shard_of_row=[0, 0], steps=[3, 3], lr=[0.1, 0.01],
                              rngs=[device_rng(0, 1, 0), device_rng(0, 1, 0)])
    assert not torch.allclose(deltas["fc1.weight"][0], deltas["fc1.weight"][1])


def _prox_reference(name, dim, classes, start, shard, *, steps, lr, mu, rng):
    """FedProx in float64 through autograd: SGD on cross-entropy + mu/2 ||w - w_start||^2."""
    model = build_model(name, in_features=dim, num_classes=classes).double()
    model.load_state_dict({n: p.double() for n, p in start.items()})
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.from_numpy(shard.x).double(), torch.from_numpy(shard.y)
    for idx in torch.from_numpy(step_plan(len(shard), batch_size=BATCH, steps=steps, rng=rng)):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss = loss + mu / 2 * sum(((p - w0[n]) ** 2).sum() for n, p in model.named_parameters())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, grad in zip(model.parameters(), grads):
                p.sub_(grad, alpha=lr)
    return {n: (p.detach() - w0[n]).float() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name, dim, classes", DENSE)
@pytest.mark.parametrize("trainer_class", [CacheTrainer, FastTrainer])
@pytest.mark.parametrize("mu", [2.0, [2.0, 0.0, 0.5, 0.0]], ids=["one mu", "mu per row"])
def test_fedprox_mu_equals_a_float64_reference(name, dim, classes, trainer_class, mu):
    shards = _shards([23, 35], dim, classes, seed=4)
    starts = _models(name, dim, classes, 2)
    start = {n: torch.stack([s[n] for s in starts]) for n in starts[0]}
    # Rows of two start models: the proximal term must pull each row to its own start.
    start_of_row, shard_of_row, steps, lrs = [0, 1, 1, 0], [0, 1, 0, 1], [8, 5, 0, 3], [0.3, 0.1, 0.1, 0.2]
    mus = np.broadcast_to(np.asarray(mu, dtype=float), (4,))
    trainer = trainer_class(build_model(name, in_features=dim, num_classes=classes), shards, batch_size=BATCH)
    args = dict(shard_of_row=shard_of_row, steps=steps, lr=lrs, start_of_row=start_of_row)
    deltas, losses = trainer.train(start, **args, rngs=[device_rng(5, 1, k) for k in range(4)], mu=mu)
    plain, _ = trainer.train(start, **args, rngs=[device_rng(5, 1, k) for k in range(4)])
    # The plain trainer (edge agents, the simulator's reference) runs the same proximal steps.
    _assert_rows_equal_train_local(name, dim, classes, shards, deltas, losses, starts=[starts[r] for r in start_of_row],
                                   shard_of_row=shard_of_row, steps=steps, lrs=lrs,
                                   rng_keys=[(5, 1, k) for k in range(4)], mu=mu)
    for i in range(4):
        ref = _prox_reference(name, dim, classes, starts[start_of_row[i]], shards[shard_of_row[i]], steps=steps[i],
                              lr=lrs[i], mu=float(mus[i]), rng=device_rng(5, 1, i))
        for n in ref:
            torch.testing.assert_close(deltas[n][i], ref[n], rtol=1e-4, atol=1e-6, msg=f"row {i} {n}")
        weight = next(iter(ref))  # fc1.weight or linear.weight
        if steps[i] and mus[i] == 0:  # a row at mu = 0 beside FedProx's rows trains plain SGD, bit for bit
            assert torch.equal(plain[weight][i], deltas[weight][i])
        elif steps[i]:  # the term is there: without it the deltas are not the reference's
            assert not torch.allclose(plain[weight][i], ref[weight], rtol=1e-4, atol=1e-6)


def test_fedprox_mu_on_the_cnn_equals_a_float64_reference():
    # CacheTrainer hands CNN rows to FastTrainer, mu included.
    shards = _shards([12, 15], 784, 47)
    start = _models("cnn", 784, 47, 1)[0]
    trainer = CacheTrainer(build_model("cnn", in_features=784, num_classes=47), shards, batch_size=BATCH)
    deltas, _ = trainer.train(start, shard_of_row=[0, 1], steps=[2, 1], lr=0.2, mu=3.0,
                              rngs=[device_rng(6, 1, k) for k in (0, 1)])
    for i, s in enumerate([2, 1]):
        ref = _prox_reference("cnn", 784, 47, start, shards[i], steps=s, lr=0.2, mu=3.0, rng=device_rng(6, 1, i))
        for n in ref:
            torch.testing.assert_close(deltas[n][i], ref[n], rtol=1e-4, atol=1e-6, msg=f"row {i} {n}")


def test_cnn_rows_go_to_the_fast_trainer():
    model = build_model("cnn", in_features=784, num_classes=47)
    shards = _shards([12, 15], 784, 47)
    start = _params(model)
    args = dict(shard_of_row=[0, 1], steps=[2, 0], lr=0.05)
    deltas, losses = CacheTrainer(model, shards, batch_size=BATCH).train(start, **args,
                                                                         rngs=[device_rng(1, 1, k) for k in (0, 1)])
    _assert_rows_equal_train_local("cnn", 784, 47, shards, deltas, losses, starts=[start] * 2, shard_of_row=[0, 1],
                                   steps=[2, 0], lrs=[0.05, 0.05], rng_keys=[(1, 1, 0), (1, 1, 1)])


def test_bad_input_names_the_row_or_parameter():
    model = build_model("logreg", in_features=60, num_classes=10)
    trainer = CacheTrainer(model, _shards([20, 20], 60, 10), batch_size=BATCH)
    start = _params(model)
    rngs = [device_rng(0, 1, 0), device_rng(0, 1, 1)]
    ok = dict(shard_of_row=[0, 1], steps=[1, 1], lr=0.1, rngs=rngs)
    with pytest.raises(ConfigError, match="row 1: shard 5"):
        trainer.train(start, **{**ok, "shard_of_row": [0, 5]})
    with pytest.raises(ConfigError, match="row 0: learning rate"):
        trainer.train(start, **{**ok, "lr": [float("nan"), 0.1]})
    with pytest.raises(ConfigError, match="steps must be >= 0; row 1"):
        trainer.train(start, **{**ok, "steps": [1, -2]})
    with pytest.raises(ConfigError, match=r"row 0: mu \(FedProx's proximal weight\) must be a number >= 0, got -0.5"):
        trainer.train(start, **ok, mu=-0.5)
    with pytest.raises(ConfigError, match=r"row 1: mu .* got nan"):
        trainer.train(start, **ok, mu=[0.1, float("nan")])
    with pytest.raises(ConfigError, match="one entry per row"):
        trainer.train(start, **ok, mu=[0.1, 0.1, 0.1])
    with pytest.raises(ConfigError, match=r"start\['linear.weight'\] has shape \(3, 10, 60\)"):
        trainer.train({**start, "linear.weight": torch.zeros(3, 10, 60)}, **ok)
    with pytest.raises(ConfigError, match="one entry per row"):
        trainer.train(start, **{**ok, "rngs": rngs[:1]})
    two_models = {n: torch.stack([p, p]) for n, p in start.items()}
    with pytest.raises(ConfigError, match=r"start\['linear.weight'\] holds 2 models but row 1 starts from model 2"):
        trainer.train(two_models, **ok, start_of_row=[0, 2])
    with pytest.raises(ConfigError, match=r"with start_of_row expected \(models, 10, 60\)"):
        trainer.train(start, **ok, start_of_row=[0, 0])
    with pytest.raises(ConfigError, match=r"out\['linear.bias'\] must be contiguous float32 of shape \(>= 2, 10\), "
                                          r"got torch.float32 \(1, 10\)"):
        trainer.train(start, **ok, out={"linear.weight": torch.zeros(2, 10, 60), "linear.bias": torch.zeros(1, 10)})
    with pytest.raises(ConfigError, match="no kernel for Linear"):
        CacheTrainer(torch.nn.Linear(3, 2), _shards([5], 3, 2), batch_size=BATCH)
    with pytest.raises(ConfigError, match=r"labels span 0..11 but the model has 10 classes"):
        CacheTrainer(model, [ArrayDataset(x=np.zeros((2, 60), np.float32), y=np.array([0, 11]))], batch_size=BATCH)
    with pytest.raises(ConfigError, match="batch_size must be >= 1, got 0"):
        CacheTrainer(model, _shards([5], 60, 10), batch_size=0)


def test_out_buffer_receives_the_deltas_and_idle_rows_are_zeroed():
    model = build_model("mlp", num_classes=10)
    shards = _shards([20, 30], 784, 10)
    trainer = CacheTrainer(model, shards, batch_size=BATCH)
    start = _params(model)
    # Sized for 4 rows with stale values from a "last round"; this round trains 3.
    out = {n: torch.full((4, *p.shape), 7.0) for n, p in start.items()}
    rows = dict(shard_of_row=[0, 1, 0], steps=[2, 0, 3], lr=0.1)
    deltas, _ = trainer.train(start, **rows, rngs=[device_rng(1, 1, k) for k in (0, 1, 0)], out=out)
    fresh, _ = trainer.train(start, **rows, rngs=[device_rng(1, 1, k) for k in (0, 1, 0)])
    for n in start:
        assert deltas[n].data_ptr() == out[n].data_ptr() and deltas[n].shape[0] == 3
        torch.testing.assert_close(out[n][:3], fresh[n], rtol=0, atol=0)
        assert float(out[n][1].abs().max()) == 0.0
        assert float(out[n][3].min()) == 7.0  # rows past R are left alone


def test_no_row_trains():
    model = build_model("mlp", num_classes=10)
    trainer = CacheTrainer(model, _shards([12], 784, 10), batch_size=BATCH)
    deltas, losses = trainer.train(_params(model), shard_of_row=[0, 0], steps=[0, 0], lr=0.1, rngs=[None, None])
    assert all(float(d.abs().max()) == 0.0 and d.shape[0] == 2 for d in deltas.values())
    assert np.isnan(losses).all()


@pytest.mark.parametrize("name, dim, classes", [("logreg", 60, 10), ("mlp", 784, 10)])
def test_a_row_that_diverges_leaves_the_next_row_untouched(name, dim, classes):
    # Rows share the trainer's work buffers (weights, activations, gradients), which must not carry
    # a diverged row's nan into the next row. Rows run longest first: the diverging row first.
    model = build_model(name, in_features=dim, num_classes=classes)
    shards = _shards([30, 30], dim, classes, seed=6)
    trainer = CacheTrainer(model, shards, batch_size=BATCH)
    start = _params(model)
    keys = [(9, 1, 0), (9, 1, 1)]
    deltas, losses = trainer.train(start, shard_of_row=[0, 1], steps=[8, 3], lr=[1e38, 0.1],
                                   rngs=[device_rng(*k) for k in keys])
    assert np.isnan(losses[0]) and all(bool(torch.isnan(d[0]).any()) for d in deltas.values())
    alone, alone_loss = trainer.train(start, shard_of_row=[1], steps=[3], lr=0.1, rngs=[device_rng(*keys[1])])
    assert losses[1] == alone_loss[0]
    for n in start:
        torch.testing.assert_close(deltas[n][1], alone[n][0], rtol=0, atol=0)


@pytest.mark.parametrize("name, dim, classes, pixels", [("logreg", 60, 10, False), ("mlp", 784, 10, False),
                                                        ("mlp", 784, 10, True), ("mlp", 784, 10, "sparse"),
                                                        ("logreg", 60, 10, "sparse"), ("cnn", 784, 47, True)])
def test_the_engines_evaluation_equals_the_torch_evaluation(name, dim, classes, pixels):
    # The kernels' evaluation (MLP, logistic regression; uint8 pixels divided by 255 or float
    # features) against workloads.evaluation.evaluate; the CNN goes to the latter. A sample count
    # off the kernel's blocks, and weights trained a little so the predictions are not all one class.
    rng = np.random.default_rng(8)
    n = 3 * EVAL_BLOCK + 7
    x = rng.integers(0, 256, (n, dim), dtype=np.uint8) if pixels else rng.standard_normal((n, dim), dtype=np.float32)
    if pixels == "sparse":  # MNIST-like: the first layer is evaluated transposed, skipping zero inputs
        x[rng.random((n, dim)) < 0.8] = 0
        x[:, : dim // 8] = 0
    data = ArrayDataset(x=x, y=rng.integers(0, classes, n).astype(np.int64))
    torch.manual_seed(8)  # the model's own, not the earlier tests' draws: the CNN's 47 classes need some right
    model = build_model(name, in_features=dim, num_classes=classes)
    params = _params(model)
    with torch.no_grad():
        for p in params.values():
            p.add_(torch.from_numpy(rng.standard_normal(tuple(p.shape), dtype=np.float32)) * 0.05)
    assert sparse_inputs(x) == (pixels == "sparse")
    stats = {}
    acc, loss = evaluate(model, params, data, stats=stats)
    if pixels == "sparse":  # blocks of EVAL_BLOCK samples: most inputs are used by one of them, not the border
        assert 0.5 < stats["inputs_used"] < 0.875
    else:
        assert stats["inputs_used"] == 1.0
    want_acc, want_loss = torch_evaluate(model, params, data)
    assert acc == want_acc and 0 < acc < 1
    assert loss == pytest.approx(want_loss, rel=1e-5)


def test_the_engines_evaluation_of_a_diverged_model_has_a_nan_loss():
    # The engine stops a run whose test loss is not finite (DivergenceError): nan must reach it.
    model = build_model("mlp", num_classes=10)
    params = _params(model)
    params["fc3.bias"][0] = float("nan")
    data = _shards([25], 784, 10)[0]
    assert np.isnan(evaluate(model, params, data)[1])


def _pixel_shards(sizes, dim, classes, seed=0, as_bytes=False):
    """Sparse features like MNIST's pixels: a border of inputs no sample uses, ~80 % zeros elsewhere;
    float32, or uint8 bytes meaning x / 255 as MNIST's shards are kept."""
    rng = np.random.default_rng(seed)
    shards = []
    for n in sizes:
        x = np.where(rng.random((n, dim)) < 0.2, rng.random((n, dim), dtype=np.float32), 0).astype(np.float32)
        x[:, : dim // 8] = 0
        if as_bytes:
            x = np.ceil(x * 255).astype(np.uint8)
        shards.append(ArrayDataset(x=x, y=rng.integers(0, classes, n).astype(np.int64)))
    return shards


@pytest.mark.parametrize("name, dim, classes", DENSE)
@pytest.mark.parametrize("mu", [0.0, 0.5])
@pytest.mark.parametrize("as_bytes", [False, True], ids=["float32", "uint8"])
def test_inputs_zero_in_a_batch_cost_nothing_and_change_nothing(name, dim, classes, mu, as_bytes):
    # The first layer is trained transposed and skips the inputs that are zero in the whole batch
    # (no forward term, a zero gradient row); the deltas must still be train_local's, FedProx's
    # pull included (it moves every weight, skipped rows too).
    shards = _pixel_shards([30, 17, 42], dim, classes, seed=6, as_bytes=as_bytes)
    model = build_model(name, in_features=dim, num_classes=classes)
    start = _params(model)
    shard_of_row, steps = np.array([0, 1, 2, 2]), np.array([6, 3, 9, 0])
    keys = [(9, 2, k) for k in range(4)]
    trainer = CacheTrainer(model, shards, batch_size=BATCH)
    assert trainer.first_transposed  # ~83 % zeros; the dense shards of the other tests keep torch's layout
    dense = CacheTrainer(model, _shards([30], dim, classes), batch_size=BATCH)
    dense.train(start, shard_of_row=[0], steps=[2], lr=0.2, rngs=[device_rng(1, 1, 0)])
    assert not dense.first_transposed and dense.inputs_used == 1.0
    deltas, losses = trainer.train(start, shard_of_row=shard_of_row, steps=steps, lr=0.2,
                                   rngs=[device_rng(*k) for k in keys], mu=mu)
    _assert_rows_equal_train_local(name, dim, classes, shards, deltas, losses, starts=[start] * 4,
                                   shard_of_row=shard_of_row, steps=steps, lrs=[0.2] * 4, rng_keys=keys, mu=mu)
    weight = next(iter(start))  # fc1.weight or linear.weight, [out, in] as torch has it
    # The border (1/8) and ~80 % of the rest are zero: a batch of 10 uses about 0.875 (1 - 0.8^10) of the inputs.
    assert 0.5 < trainer.inputs_used < 0.875
    # Inputs no sample uses end where they started (FedProx pulls a weight at its start by zero); the rest moved.
    assert float(deltas[weight][:3, :, : dim // 8].abs().max()) == 0.0
    assert float(deltas[weight][:3, :, dim // 8:].abs().max()) > 0
