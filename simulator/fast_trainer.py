"""Fast local training: every row (a device in a run) of a round trains together.

`FastTrainer(model, shards, batch_size=B).train(start, shard_of_row=, steps=, lr=, rngs=)`
runs, for each row i, `steps[i]` plain SGD steps on shard `shard_of_row[i]` from start
weights `start` (one global dict {name: tensor}, broadcast to all rows, or a stacked dict
{name: [R, *shape]} with a row each) at learning rate `lr` (a float or one per row), with
minibatches from `edge_agent.trainer.step_plan(n, batch_size=B, steps=steps[i], rng=rngs[i])`.
It returns the deltas {name: [R, *shape]} (trained - start, row order as given) and each
row's mean minibatch loss over its steps (float64 [R], nan for 0 steps). Row i's result
equals `edge_agent.trainer.train_local(unit="step")` on that shard with rngs[i] to float
tolerance (tests/unit/simulator/test_fast_trainer.py). Rows are independent, so paired runs
that share data (the schemes of a seed, seeds over one partition) can be trained in one call.

How it is fast:
- Weights are stacked per row ([R, out, in]); a step of all rows is a few batched matmuls
  (`baddbmm`), and the SGD update is fused into the weight-gradient matmul in place
  (`W.baddbmm_(g^T, h, alpha=-1)`, the learning rate folded into the output gradient).
- Rows are sorted by steps, descending, so the rows still training at step t are a prefix:
  slices, never gathers or scatters of weights. No per-row Python runs inside a step.
- Rows are trained in chunks of `chunk_rows` (all steps of one chunk, then the next), so a
  chunk's weights stay in cache between the forward pass and the update.
- MLP and logistic regression (chains of Linear + ReLU) use a hand-written backward
  (softmax - onehot, ReLU masks); the CNN runs autograd over grouped convolutions (one
  group per row) and batched matmuls. These kernels mirror workloads.models; the equality
  test pins them to it.

Threads are the caller's choice (torch.set_num_threads); see benchmarks/sim_speed.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from edge_agent.trainer import step_plan
from flexfl.errors import ConfigError
from workloads.datasets import ArrayDataset
from workloads.models import EmnistCNN, LogisticRegression, MnistMLP

# Rows per chunk by model: measured with benchmarks/sim_speed.py --chunks (MNIST MLP: a chunk
# of 16 rows, 12.7 MB of weights, beats all 100 rows at once; logreg rows are tiny).
DEFAULT_CHUNK_ROWS = {"dense": 16, "logreg": 1024, "cnn": 8}


class FastTrainer:
    """Trains many rows (devices x runs) of one model architecture in lock-step."""

    def __init__(
        self,
        model: nn.Module,
        shards: Sequence[ArrayDataset],
        *,
        batch_size: int,
        chunk_rows: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not shards:
            raise ConfigError("FastTrainer needs at least one shard")
        if chunk_rows is not None and chunk_rows < 1:
            raise ConfigError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.batch_size = batch_size
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if isinstance(model, MnistMLP):
            self._layers = [("fc1.weight", "fc1.bias"), ("fc2.weight", "fc2.bias"), ("fc3.weight", "fc3.bias")]
            kind = "dense"
        elif isinstance(model, LogisticRegression):
            self._layers = [("linear.weight", "linear.bias")]
            kind = "logreg"
        elif isinstance(model, EmnistCNN):
            self._layers = []
            kind = "cnn"
        else:
            raise ConfigError(f"FastTrainer has no kernel for {type(model).__name__}; use the plain trainer")
        self.kind = kind
        self.chunk_rows = chunk_rows or DEFAULT_CHUNK_ROWS[kind]
        self.sizes = np.array([len(d) for d in shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        # All shards in one flat tensor; a row's batch is an index_select by global index.
        self.x = torch.from_numpy(np.concatenate([d.x.reshape(len(d), -1) for d in shards]))
        self.y = torch.from_numpy(np.concatenate([d.y for d in shards]))
        num_classes = self.shapes[self._layers[-1][1]][0] if self._layers else self.shapes["fc2.bias"][0]
        if len(self.y) and int(self.y.max()) >= num_classes:
            raise ConfigError(f"labels reach {int(self.y.max())} but the model has {num_classes} classes")
        self.onehot = nn.functional.one_hot(self.y, num_classes).to(torch.float32)

    def train(
        self,
        start: dict[str, torch.Tensor],
        *,
        shard_of_row: Sequence[int] | np.ndarray,
        steps: Sequence[int] | np.ndarray,
        lr: float | Sequence[float] | np.ndarray,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Train each row i for steps[i] SGD steps; returns (deltas {name: [R, *shape]}, mean loss [R]).

        `start` is one global dict (every row starts there) or {name: [R, *shape]}.
        """
        shard_of_row = np.asarray(shard_of_row, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        n_rows = len(steps)
        lrs = np.broadcast_to(np.asarray(lr, dtype=np.float64), (n_rows,)) if np.ndim(lr) == 0 else np.asarray(lr, dtype=np.float64)
        self._validate(start, shard_of_row, steps, lrs, rngs)
        stacked = {n: start[n].dim() == len(self.shapes[n]) + 1 for n in self.shapes}

        # Sort rows by steps, descending: rows training at step t are the prefix [0, active[t]).
        order = np.argsort(-steps, kind="stable")
        s_sorted = steps[order]
        n_training = int((s_sorted > 0).sum())
        max_steps = int(s_sorted[0]) if n_rows else 0
        # plan[t, i] = global sample indices of sorted row i's t-th batch.
        plan = np.zeros((max_steps, n_training, self.batch_size), dtype=np.int64)
        for i, row in enumerate(order[:n_training]):
            shard = shard_of_row[row]
            plan[: s_sorted[i], i] = step_plan(int(self.sizes[shard]), batch_size=self.batch_size,
                                               steps=int(s_sorted[i]), rng=rngs[row]) + self.offsets[shard]
        order_t = torch.from_numpy(order[:n_training])
        weights = {}
        for n, shape in self.shapes.items():
            w = start[n].detach()
            weights[n] = (w.index_select(0, order_t) if stacked[n] else w.unsqueeze(0).expand(n_training, *shape)).to(
                torch.float32, copy=True).contiguous()
        lr_sorted = torch.from_numpy(lrs[order[:n_training]].astype(np.float32))
        losses = torch.zeros((max_steps, n_training), dtype=torch.float32)
        plan_t = torch.from_numpy(plan)

        kernel: Callable = self._cnn_steps if self.kind == "cnn" else self._dense_steps
        for lo in range(0, n_training, self.chunk_rows):
            hi = min(lo + self.chunk_rows, n_training)
            kernel({n: w[lo:hi] for n, w in weights.items()}, plan_t[:, lo:hi], s_sorted[lo:hi],
                   lr_sorted[lo:hi], losses[:, lo:hi])

        # Back to the caller's row order; rows with 0 steps keep a zero delta.
        deltas = {}
        for n, shape in self.shapes.items():
            w = start[n].detach()
            trained = weights[n].sub_(w.index_select(0, order_t) if stacked[n] else w)
            deltas[n] = torch.zeros((n_rows, *shape), dtype=torch.float32).index_copy_(0, order_t, trained)
        loss_sum = np.zeros(n_rows)
        loss_sum[order[:n_training]] = losses.to(torch.float64).sum(dim=0).numpy()
        mean_loss = np.full(n_rows, np.nan)
        mean_loss[steps > 0] = loss_sum[steps > 0] / steps[steps > 0]
        return deltas, mean_loss

    def _validate(self, start, shard_of_row, steps, lrs, rngs) -> None:
        n_rows = len(steps)
        if steps.ndim != 1 or shard_of_row.shape != (n_rows,) or lrs.shape != (n_rows,) or len(rngs) != n_rows:
            raise ConfigError(f"steps, shard_of_row, lr and rngs must have one entry per row; got lengths "
                              f"{len(steps)}, {len(shard_of_row)}, {lrs.size}, {len(rngs)}")
        if n_rows and steps.min() < 0:
            raise ConfigError(f"steps must be >= 0; row {int(steps.argmin())} has {int(steps.min())}")
        bad = np.flatnonzero((shard_of_row < 0) | (shard_of_row >= len(self.sizes)))
        if len(bad):
            raise ConfigError(f"row {int(bad[0])}: shard {int(shard_of_row[bad[0]])} is not in 0..{len(self.sizes) - 1}")
        bad = np.flatnonzero(~(np.isfinite(lrs) & (lrs > 0)))
        if len(bad):
            raise ConfigError(f"row {int(bad[0])}: learning rate must be a positive number, got {lrs[bad[0]]!r}")
        if set(start) != set(self.shapes):
            raise ConfigError(f"start has parameters {sorted(start)}, the model has {sorted(self.shapes)}")
        for n, shape in self.shapes.items():
            got = tuple(start[n].shape)
            if got != shape and got != (n_rows, *shape):
                raise ConfigError(f"start[{n!r}] has shape {got}; expected {shape} or {(n_rows, *shape)}")

    def _dense_steps(self, w: dict, plan: torch.Tensor, steps: np.ndarray, lr: torch.Tensor, losses: torch.Tensor) -> None:
        """All steps of one chunk of a Linear(+ReLU) chain; rows sorted by steps, descending."""
        b = self.batch_size
        layers = [(w[wn], w[bn]) for wn, bn in self._layers]
        scale = (lr / b).view(-1, 1, 1)  # d(mean CE)/d(logits) = (softmax - onehot) / B
        views = None
        active_prev = -1
        for t in range(int(steps[0])):
            active = int(np.count_nonzero(steps > t))
            if active != active_prev:  # slices of the active prefix, rebuilt only when it shrinks
                views = [(wt[:active], bt[:active].unsqueeze(1)) for wt, bt in layers]
                sc = scale[:active]
                active_prev = active
            idx = plan[t, :active].reshape(-1)
            h = self.x.index_select(0, idx).view(active, b, -1)  # [A, B, in]
            target = self.onehot.index_select(0, idx).view(active, b, -1)  # [A, B, C]
            inputs = []
            for layer, (wt, bt) in enumerate(views):
                inputs.append(h)
                h = torch.baddbmm(bt, h, wt.transpose(1, 2))  # [A, B, out]
                if layer < len(views) - 1:
                    h = h.relu_()
            logp = torch.log_softmax(h, dim=2)
            torch.sum(logp * target, dim=(1, 2), out=losses[t, :active]).mul_(-1.0 / b)
            g = logp.exp_().sub_(target).mul_(sc)  # lr * dLoss/dlogits, [A, B, C]
            for layer in range(len(views) - 1, -1, -1):
                wt, bt = views[layer]
                h_in = inputs[layer]
                # The input gradient uses the weights before their update; ReLU passes where h_in > 0.
                g_in = torch.ops.aten.threshold_backward(torch.bmm(g, wt), h_in, 0) if layer else None
                wt.baddbmm_(g.transpose(1, 2), h_in, alpha=-1.0)
                bt.sub_(g.sum(dim=1, keepdim=True))
                g = g_in

    def _cnn_steps(self, w: dict, plan: torch.Tensor, steps: np.ndarray, lr: torch.Tensor, losses: torch.Tensor) -> None:
        """All steps of one chunk of EmnistCNN rows: autograd over grouped convolutions."""
        b = self.batch_size
        for t in range(int(steps[0])):
            active = int(np.count_nonzero(steps > t))
            idx = plan[t, :active].reshape(-1)
            x = self.x.index_select(0, idx).view(active, b, 28, 28)
            y = self.y.index_select(0, idx)
            leaves = {n: p[:active].detach().requires_grad_() for n, p in w.items()}
            with torch.enable_grad():
                logits = _cnn_forward(leaves, x)  # [A, B, C]
                ce = nn.functional.cross_entropy(logits.reshape(active * b, -1), y, reduction="none").view(active, b).mean(dim=1)
                # Rows are independent: the gradient of sum_i lr_i * CE_i w.r.t. row i's weights is lr_i * grad_i.
                (ce * lr[:active]).sum().backward()
            losses[t, :active] = ce.detach()
            with torch.no_grad():
                for n, p in w.items():
                    p[:active].sub_(leaves[n].grad)


def _cnn_forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """EmnistCNN for A rows at once: x [A, B, 28, 28] -> logits [A, B, C]; row i uses p[name][i]."""
    a, b = x.shape[:2]
    # Rows become channel groups: [B, A, 28, 28], convolved with groups=A.
    h = x.transpose(0, 1)
    for conv in ("conv1", "conv2"):
        weight = p[f"{conv}.weight"]  # [A, out, in, 5, 5]
        h = nn.functional.conv2d(h, weight.reshape(-1, *weight.shape[2:]), p[f"{conv}.bias"].reshape(-1), padding=2, groups=a)
        h = torch.max_pool2d(torch.relu(h), 2)  # conv1: [B, A*32, 14, 14]; conv2: [B, A*64, 7, 7]
    h = h.reshape(b, a, -1).transpose(0, 1)  # [A, B, 64*7*7], channel-major per row as in flatten(1)
    h = torch.relu(torch.baddbmm(p["fc1.bias"].unsqueeze(1), h, p["fc1.weight"].transpose(1, 2)))
    return torch.baddbmm(p["fc2.bias"].unsqueeze(1), h, p["fc2.weight"].transpose(1, 2))

