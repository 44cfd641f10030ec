"""The local trainer: s SGD steps, deltas, early stop, epoch unit, batch plans."""

import math

import numpy as np
import pytest
import torch

from edge_agent.trainer import step_batches, step_plan, steps_per_update, train_local
from flexfl.errors import ConfigError
from workloads.datasets import ArrayDataset
from workloads.models import build_model


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)  # learnable by a linear model
    return ArrayDataset(x=x, y=y)


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model("logreg", in_features=60, num_classes=10)


@pytest.mark.parametrize("n, batch, steps", [(23, 10, 9), (7, 10, 5), (40, 10, 4), (1, 3, 2), (50, 20, 1), (9, 9, 3)])
def test_step_plan_equals_the_stream_and_leaves_the_generator_where_it_does(n, batch, steps):
    # The plan is computed in one go; it must be the stream's first batches, and consume the
    # same draws (a later draw from the generator must match too).
    rng_plan, rng_stream = np.random.default_rng(n * 100 + steps), np.random.default_rng(n * 100 + steps)
    plan = step_plan(n, batch_size=batch, steps=steps, rng=rng_plan)
    stream = step_batches(n, batch_size=batch, rng=rng_stream)
    np.testing.assert_array_equal(plan, np.stack([next(stream) for _ in range(steps)]))
    assert rng_plan.random() == rng_stream.random()


def test_step_plan_is_a_prefix_of_longer_plans():
    short = step_plan(23, batch_size=10, steps=3, rng=np.random.default_rng(5))
    long = step_plan(23, batch_size=10, steps=9, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(short, long[:3])
    # Consecutive batches walk permutations: the first 23 indices are a permutation.
    assert sorted(long.reshape(-1)[:23]) == list(range(23))


def test_an_epoch_is_ceil_n_over_b_steps():
    assert steps_per_update(23, batch_size=10, unit="epoch") == 3
    assert steps_per_update(20, batch_size=10, unit="epoch") == 2
    assert steps_per_update(4, batch_size=10, unit="epoch") == 1  # a device smaller than a batch still steps
    assert steps_per_update(23, batch_size=10, unit="step") == 1
    with pytest.raises(ConfigError, match="unit"):
        steps_per_update(23, batch_size=10, unit="hour")


def test_an_epoch_sees_every_sample_once_when_b_divides_n():
    plan = step_plan(30, batch_size=10, steps=3 * steps_per_update(30, batch_size=10, unit="epoch"),
                     rng=np.random.default_rng(0))
    for epoch in plan.reshape(3, -1):
        assert sorted(epoch) == list(range(30))


def test_train_local_runs_s_steps_and_returns_delta():
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train_local(model, _data(), updates=7, lr=0.1, batch_size=8, rng=np.random.default_rng(1))
    assert res.updates_completed == 7 and res.steps_completed == 7 and res.samples_used == 56
    for n, p in model.named_parameters():
        torch.testing.assert_close(res.delta[n], p.detach() - before[n])
    assert any(float(d.abs().sum()) > 0 for d in res.delta.values())
    assert math.isfinite(res.mean_loss)


def test_zero_updates_is_a_zero_delta():
    res = train_local(_model(), _data(), updates=0, lr=0.1, batch_size=8, rng=np.random.default_rng(1))
    assert res.updates_completed == 0 and math.isnan(res.mean_loss)
    assert all(float(d.abs().sum()) == 0 for d in res.delta.values())


def test_keep_going_stops_early_and_early_stop_is_a_prefix():
    full = _model()
    train_local(full, _data(), updates=3, lr=0.1, batch_size=8, rng=np.random.default_rng(2))
    stopped = _model()
    res = train_local(stopped, _data(), updates=10, lr=0.1, batch_size=8, rng=np.random.default_rng(2),
                      keep_going=lambda done: done < 3)
    assert res.updates_completed == 3
    for (_n, a), (_, b) in zip(full.named_parameters(), stopped.named_parameters()):
        torch.testing.assert_close(a, b)


def test_epoch_unit_makes_full_passes():
    res = train_local(_model(), _data(n=25), updates=2, lr=0.1, batch_size=10,
                      rng=np.random.default_rng(0), unit="epoch")
    assert res.updates_completed == 2 and res.steps_completed == 6 and res.samples_used == 60


def test_epochs_are_the_step_stream_so_step_counts_replay_them():
    """s epochs train exactly as s * ceil(n/B) steps: the simulator's trainers need only step counts."""
    data = _data(n=25)
    by_epoch, by_step = _model(), _model()
    a = train_local(by_epoch, data, updates=3, lr=0.1, batch_size=10, rng=np.random.default_rng(4), unit="epoch")
    b = train_local(by_step, data, updates=9, lr=0.1, batch_size=10, rng=np.random.default_rng(4), unit="step")
    assert a.updates_completed == 3 and b.updates_completed == 9 and a.steps_completed == b.steps_completed == 9
    for n in a.delta:
        torch.testing.assert_close(a.delta[n], b.delta[n], rtol=0, atol=0)


def test_keep_going_counts_epochs():
    res = train_local(_model(), _data(n=25), updates=5, lr=0.1, batch_size=10, rng=np.random.default_rng(0),
                      unit="epoch", keep_going=lambda done: done < 2)
    assert res.updates_completed == 2 and res.steps_completed == 6


def test_training_reduces_loss():
    model = _model()
    data = _data(n=400)
    first = train_local(model, data, updates=5, lr=0.5, batch_size=20, rng=np.random.default_rng(0))
    train_local(model, data, updates=200, lr=0.5, batch_size=20, rng=np.random.default_rng(1))
    last = train_local(model, data, updates=5, lr=0.5, batch_size=20, rng=np.random.default_rng(2))
    assert last.mean_loss < 0.5 * first.mean_loss


@pytest.mark.parametrize("kwargs, fragment", [
    ({"updates": -1}, "updates"), ({"lr": float("nan")}, "learning rate"), ({"unit": "hour"}, "unit"),
])
def test_bad_arguments_rejected(kwargs, fragment):
    args = {"updates": 1, "lr": 0.1, "batch_size": 8, "rng": np.random.default_rng(0)} | kwargs
    with pytest.raises(ConfigError, match=fragment):
        train_local(_model(), _data(), **args)


def _prox_reference(model, data, *, steps, lr, mu, rng, batch_size):
    """FedProx's local SGD in float64 through autograd: steps on cross-entropy + mu/2 ||w - w_G||^2."""
    from workloads.datasets import scaled

    ref = build_model("logreg", in_features=60, num_classes=10).double()
    ref.load_state_dict({n: p.double() for n, p in model.state_dict().items()})
    w_g = {n: p.detach().clone() for n, p in ref.named_parameters()}
    x, y = torch.from_numpy(scaled(data.x)).double(), torch.from_numpy(data.y)
    for idx in torch.from_numpy(step_plan(len(data), batch_size=batch_size, steps=steps, rng=rng)):
        loss = torch.nn.functional.cross_entropy(ref(x[idx]), y[idx])
        loss = loss + mu / 2 * sum(((p - w_g[n]) ** 2).sum() for n, p in ref.named_parameters())
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p.sub_(g, alpha=lr)
    return {n: (p.detach() - w_g[n]).float() for n, p in ref.named_parameters()}


@pytest.mark.parametrize("unit, updates", [("step", 7), ("epoch", 2)])
def test_fedprox_mu_adds_the_proximal_gradient_mu_w_minus_w_global(unit, updates):
    data = _data(n=30, seed=4)
    model, plain_model = _model(seed=2), _model(seed=2)
    mu, lr = 3.0, 0.1
    res = train_local(model, data, updates=updates, lr=lr, batch_size=8, rng=np.random.default_rng(1), unit=unit, mu=mu)
    steps = updates * (1 if unit == "step" else 4)
    assert res.steps_completed == steps
    ref = _prox_reference(_model(seed=2), data, steps=steps, lr=lr, mu=mu, rng=np.random.default_rng(1), batch_size=8)
    plain = train_local(plain_model, data, updates=updates, lr=lr, batch_size=8,
                        rng=np.random.default_rng(1), unit=unit)
    for name, d in ref.items():
        torch.testing.assert_close(res.delta[name], d, rtol=1e-4, atol=1e-6)
        assert not torch.allclose(plain.delta[name], d, rtol=1e-4, atol=1e-6)  # the term is really there
    # mu pulls towards w_G: the update is shorter than plain SGD's.
    assert sum(float(d.norm()) for d in res.delta.values()) < sum(float(d.norm()) for d in plain.delta.values())
    with pytest.raises(ConfigError, match="mu \\(FedProx's proximal weight\\) must be a number >= 0"):
        train_local(_model(), data, updates=1, lr=0.1, batch_size=8, rng=np.random.default_rng(1), mu=-1.0)
