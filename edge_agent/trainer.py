"""The local trainer: plain SGD for s local updates, returning the model delta.

One local update is one minibatch SGD step (paper eq. (1)); `unit="epoch"` makes one update
a pass over the local data instead: ceil(n_k / B) steps (steps_per_update), so a device's
steps per round are proportional to its samples. Minibatches follow a *batch plan* drawn
from a numpy Generator: consecutive batches of independent random permutations of the local
indices, in both units (an epoch is the next ceil(n_k / B) batches of that stream: exactly
one permutation when B divides n_k; otherwise its last batch runs into the next
permutation, so each sample is seen once per permutation and no batch is short). The plan
for s updates is a prefix of the plan for E updates, so a device that is stopped early
(deadline) has trained on exactly the first batches a full round would use, and the
simulator's trainers replay the same plan from a step count alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flexfl.errors import ConfigError
from flexfl.vocabulary import Unit
from workloads.datasets import ArrayDataset, scaled


@dataclass(frozen=True)
class LocalResult:
    """What a device sends back: the delta w_k - w and how it got there."""

    delta: dict[str, torch.Tensor]
    updates_completed: int  # s: local updates (in `unit`) finished
    steps_completed: int  # minibatch SGD steps behind them
    samples_used: int  # sum of minibatch sizes
    mean_loss: float  # mean minibatch training loss over the steps (nan when s = 0)
    train_s: float


def step_batches(n_samples: int, *, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Endless stream of minibatch index arrays: consecutive batches of fresh permutations.

    A batch may straddle two permutations; with n_samples < batch_size it repeats indices.
    """
    if n_samples < 1 or batch_size < 1:
        raise ConfigError(f"need n_samples >= 1 and batch_size >= 1, got {n_samples}, {batch_size}")
    buffer = np.empty(0, dtype=np.int64)
    while True:
        while len(buffer) < batch_size:
            buffer = np.concatenate([buffer, rng.permutation(n_samples)])
        yield buffer[:batch_size]
        buffer = buffer[batch_size:]


def step_plan(n_samples: int, *, batch_size: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """The first `steps` batches of step_batches as an int64 array [steps, batch_size].

    Draws the same permutations as the stream (it draws one whenever fewer than a batch's
    worth of indices are left: ceil(steps * batch_size / n_samples) in all), leaving `rng`
    in the same state, without a Python loop per step.
    """
    if steps == 0:
        return np.empty((0, batch_size), dtype=np.int64)
    if n_samples < 1 or batch_size < 1:
        raise ConfigError(f"need n_samples >= 1 and batch_size >= 1, got {n_samples}, {batch_size}")
    needed = steps * batch_size
    perms = [rng.permutation(n_samples) for _ in range(-(-needed // n_samples))]
    return np.concatenate(perms)[:needed].reshape(steps, batch_size)


def steps_per_update(n_samples: int, *, batch_size: int, unit: Unit | str) -> int:
    """SGD steps in one local update: 1 for a step, ceil(n_k / B) for an epoch (at least 1)."""
    unit = _unit(unit)
    if n_samples < 1 or batch_size < 1:
        raise ConfigError(f"need n_samples >= 1 and batch_size >= 1, got {n_samples}, {batch_size}")
    return 1 if unit is Unit.STEP else -(-n_samples // batch_size)


def _unit(unit: Unit | str) -> Unit:
    try:
        return Unit(unit)
    except ValueError:
        raise ConfigError(f"unknown local update unit {unit!r}; use 'step' or 'epoch'") from None


def train_local(
    model: nn.Module,
    data: ArrayDataset,
    *,
    updates: int,
    lr: float,
    batch_size: int,
    rng: np.random.Generator,
    unit: Unit | str = Unit.STEP,
    keep_going: Callable[[int], bool] | None = None,
    mu: float = 0.0,
) -> LocalResult:
    """Run up to `updates` local updates of plain SGD on `model` (trained in place).

    `keep_going(done)` is asked before each update after the first `done` ones and may stop
    early (the edge agent's deadline check); the result reports the updates completed.
    The delta is taken against the model's parameters at entry, w_G. `mu` > 0 adds FedProx's
    proximal term mu/2 ||w - w_G||^2 to the local objective: each step's gradient gains
    mu (w - w_G), taken at the weights before the step (the reported loss stays the
    minibatch cross-entropy), as simulator.trainers.fast_trainer and simulator.trainers.cache_trainer do.
    """
    unit = _checked(unit, updates=updates, lr=lr, mu=mu)
    start = time.perf_counter()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    x_all = torch.from_numpy(data.x)
    y_all = torch.from_numpy(data.y)
    stream = step_batches(len(data), batch_size=batch_size, rng=rng)
    per_update = steps_per_update(len(data), batch_size=batch_size, unit=unit)
    loss_fn = nn.CrossEntropyLoss()
    done = steps = samples = 0
    loss_sum = 0.0
    model.train()
    while done < updates and (keep_going is None or keep_going(done)):
        for _ in range(per_update):
            idx = next(stream)
            index = torch.from_numpy(idx)
            loss_sum += _sgd_step(model, loss_fn, x_all[index], y_all[index], lr=lr, mu=mu, initial=initial)
            steps += 1
            samples += len(idx)
        done += 1
    delta = {name: (p.detach() - initial[name]) for name, p in model.named_parameters()}
    return LocalResult(
        delta=delta,
        updates_completed=done,
        steps_completed=steps,
        samples_used=samples,
        mean_loss=loss_sum / steps if steps else float("nan"),
        train_s=time.perf_counter() - start,
    )


def _checked(unit: Unit | str, *, updates: int, lr: float, mu: float) -> Unit:
    """The unit, once train_local's arguments are known to be usable."""
    unit = _unit(unit)
    if updates < 0:
        raise ConfigError(f"updates must be >= 0, got {updates}")
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"learning rate must be a positive number, got {lr!r}")
    if not (math.isfinite(mu) and mu >= 0):
        raise ConfigError(f"mu (FedProx's proximal weight) must be a number >= 0, got {mu!r}")
    return unit


def _sgd_step(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, mu: float,
              initial: dict[str, torch.Tensor]) -> float:
    """One minibatch SGD step on `model` in place, with FedProx's proximal gradient when mu > 0; returns the
    minibatch loss before the step."""
    loss = loss_fn(model(scaled(x)), y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        for name, p in model.named_parameters():
            grad = p.grad
            if grad is None:  # a parameter the loss does not reach: its gradient is 0, and so is w - w_G
                continue
            if mu > 0:  # FedProx: the gradient of mu/2 ||w - w_G||^2, before this step's update
                grad.add_(p - initial[name], alpha=mu)
            p.sub_(grad, alpha=lr)
    return float(loss.detach())


def device_rng(seed: int, round_index: int, device_index: int) -> np.random.Generator:
    """The minibatch generator of one device in one round; shared by agents and the simulator."""
    return np.random.default_rng([seed, 3, round_index, device_index])
