"""Batched local training: all devices of a round step together through torch.func.vmap.

Equivalent to calling edge_agent.trainer.train_local (unit "step") once per device with the
same generators: each device follows the same batch plan, and a device stops moving once
it has done its s steps (tests/unit/simulator/test_batched.py checks the equality).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from edge_agent.trainer import step_plan
from flexfl.errors import ConfigError
from workloads.datasets import ArrayDataset


class BatchedTrainer:
    """Trains many copies of one model architecture, one per device, in lock-step."""

    def __init__(self, model: nn.Module, shards: Sequence[ArrayDataset], *, batch_size: int) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = batch_size
        self.sizes = np.array([len(d) for d in shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        # All shards in one tensor; a device's batch is a gather by global index.
        self.x = torch.from_numpy(np.concatenate([d.x for d in shards]))
        self.y = torch.from_numpy(np.concatenate([d.y for d in shards]))

        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(functional_call(self.model, params, (x,)), y)

        self._grad = vmap(grad_and_value(loss))

    def train(
        self,
        global_params: dict[str, torch.Tensor],
        *,
        devices: np.ndarray,
        steps: np.ndarray,
        lr: float,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Train `devices` for `steps[i]` SGD steps each from `global_params`.

        Returns deltas stacked as {name: [K, *shape]} (row i = devices[i]) and each device's
        mean training loss over its steps (nan for 0 steps).
        """
        devices = np.asarray(devices, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        k = len(devices)
        if len(steps) != k or len(rngs) != k:
            raise ConfigError("devices, steps and rngs must have equal lengths")
        params = {n: w.detach().unsqueeze(0).repeat(k, *([1] * w.dim())) for n, w in global_params.items()}
        max_steps = int(steps.max()) if k else 0
        # idx[i, t] = global sample indices of device i's t-th batch (rows past s_i unused).
        idx = np.zeros((k, max_steps, self.batch_size), dtype=np.int64)
        for i, (d, s, rng) in enumerate(zip(devices, steps, rngs)):
            idx[i, :s] = step_plan(int(self.sizes[d]), batch_size=self.batch_size, steps=int(s), rng=rng) + self.offsets[d]
        idx_t = torch.from_numpy(idx)
        loss_sum = torch.zeros(k, dtype=torch.float64)
        for t in range(max_steps):
            active = np.flatnonzero(steps > t)
            if len(active) == k:
                rows = slice(None)
                sub = params
            else:
                rows = torch.from_numpy(active)
                sub = {n: p[rows] for n, p in params.items()}
            batch = idx_t[rows, t]  # [A, B]
            grads, losses = self._grad(sub, self.x[batch], self.y[batch])
            with torch.no_grad():
                for n in params:
                    if isinstance(rows, slice):
                        params[n].sub_(grads[n], alpha=lr)
                    else:
                        params[n][rows] = sub[n] - lr * grads[n]
            loss_sum[rows] += losses.detach().to(torch.float64)
        deltas = {n: params[n] - global_params[n].detach().unsqueeze(0) for n in params}
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_loss = np.where(steps > 0, loss_sum.numpy() / np.maximum(steps, 1), np.nan)
        return deltas, mean_loss
