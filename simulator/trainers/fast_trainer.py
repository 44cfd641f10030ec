"""Fast local training: every row (a device in a run) of a round trains together.

`FastTrainer(model, shards, batch_size=B).train(start, shard_of_row=, steps=, lr=, rngs=)`
runs, for each row i, `steps[i]` plain SGD steps on shard `shard_of_row[i]` from start
weights `start` (one global dict {name: tensor}, broadcast to all rows; or a stacked dict
{name: [G, *shape]} with `start_of_row[i]` choosing row i's model, G = R and row i's own
model by default) at learning rate `lr` (a float or one per row), with
minibatches from `edge_agent.trainer.step_plan(n, batch_size=B, steps=steps[i], rng=rngs[i])`
(rows that share one Generator object share its batches, each taking its first steps[i]).
It returns the deltas {name: [R, *shape]} (trained - start, row order as given) and each
row's mean minibatch loss over its steps (float64 [R], nan for 0 steps). Row i's result
equals `edge_agent.trainer.train_local(unit="step")` on that shard with rngs[i] to float
tolerance (tests/unit/simulator/test_fast_trainer.py). Rows are independent, so paired runs
that share data (the schemes of a seed, seeds over one partition) can be trained in one call.

`out` (optional) receives the deltas, so a caller can keep one buffer from round to round
(sized for the most rows it will train; the first R rows are used).

How it is fast (MLP and logistic regression, chains of Linear + ReLU):
- Weights are stacked per row ([R, out, in]); a step of all rows is a few batched matmuls
  (`baddbmm`), and the SGD update is fused into the weight-gradient matmul in place
  (`W.baddbmm_(g^T, h, alpha=-1)`, the learning rate folded into the output gradient).
- Rows are sorted by steps, descending, so the rows still training at step t are a prefix:
  slices, never gathers or scatters of weights. No per-row Python runs inside a step.
- Rows are trained in chunks of `chunk_rows` (all steps of one chunk, then the next): a
  chunk's weights are copied in, trained and turned into deltas while they sit in cache.
- The backward pass is written out (softmax - onehot, ReLU masks) and every step reuses
  preallocated buffers. This kernel mirrors workloads.models; the equality test pins it.
The CNN is trained row by row through the model's own forward and autograd: a CNN step is
~0.75 GFLOP of convolutions, so batching saves little, and grouped convolutions (one group
per row) ran at less than half the row loop's speed in a one-off measurement; it runs at
the plain trainer's speed.

Threads are the caller's: one per worker process (torch.set_num_threads(1)); torch's
default two threads collapse on a shared machine (python -m benchmarks.threads).
Speed: python -m benchmarks.sim_speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from flexfl.errors import ConfigError
from simulator.trainers.rows import batch_plan, check_rows, delta_buffers, mean_losses, row_arguments
from workloads.datasets import ArrayDataset, scaled
from workloads.models import EmnistCNN, LogisticRegression, MnistMLP

# Rows per chunk, measured with `python -m benchmarks.sim_speed --variants fast@4,fast@16,...`:
# for the MNIST MLP 16 rows (12.7 MB of weights) tie with 32, beat 4 and 8 by 5-15 % and all
# 100 rows at once by 1.7x; logistic regression rows are 2.4 KB, so all rows go at once; CNN
# rows train one by one anyway.
DEFAULT_CHUNK_ROWS = {"mlp": 16, "logreg": 1024, "cnn": 1}


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
        self.model = model
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if isinstance(model, MnistMLP):
            self._layers = [("fc1.weight", "fc1.bias"), ("fc2.weight", "fc2.bias"), ("fc3.weight", "fc3.bias")]
            kind = "mlp"
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
        self.x = torch.from_numpy(scaled(np.concatenate([d.x.reshape(len(d), -1) for d in shards])))
        self.y = torch.from_numpy(np.concatenate([d.y for d in shards]))
        num_classes = self.shapes["fc2.bias" if kind == "cnn" else self._layers[-1][1]][0]
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
        start_of_row: Sequence[int] | np.ndarray | None = None,
        out: dict[str, torch.Tensor] | None = None,
        mu: float | Sequence[float] | np.ndarray = 0.0,
    ) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Train each row i for steps[i] SGD steps; returns (deltas {name: [R, *shape]}, mean loss [R]).

        `start` is one global dict (every row starts there) or {name: [G, *shape]}: row i
        starts from start[name][start_of_row[i]] (default: G = R, row i from its own; paired
        runs pass one model per run and the run of each row). `out`, if
        given, receives the deltas in its first R rows (float32 [>= R, *shape] each; the views
        are returned): a caller that keeps it from round to round saves the page faults of
        fresh memory (about a tenth of an MNIST round in torch.profiler).
        `mu` > 0 adds FedProx's proximal term: every step's gradient gains mu * (w - w_start),
        w_start the row's start weights (the reported loss stays the minibatch cross-entropy);
        one number for every row or one per row (paired runs: FedProx's rows beside others').
        """
        shard_of_row, steps, lrs, source, mus = row_arguments(shard_of_row, steps, lr, start_of_row, mu)
        n_rows = len(steps)
        check_rows(self.shapes, len(self.sizes), start, shard_of_row, steps, lrs, rngs, source, mus,
                   given_sources=start_of_row is not None)
        start = {n: start[n].detach().to(torch.float32) for n in self.shapes}
        stacked = {n: start[n].dim() == len(shape) + 1 for n, shape in self.shapes.items()}

        # Sort rows by steps, descending: rows training at step t are a prefix of their chunk.
        order = np.argsort(-steps, kind="stable")
        s_sorted = steps[order]
        n_training = int(np.count_nonzero(s_sorted))
        plan_t = torch.from_numpy(batch_plan(order[:n_training], s_sorted[:n_training], shard_of_row, rngs,
                                             sizes=self.sizes, offsets=self.offsets, batch_size=self.batch_size))
        order_t = torch.from_numpy(order)
        source_t = torch.from_numpy(source[order])  # start model of each sorted row
        lr_sorted, mu_sorted = lrs[order], mus[order]
        losses = torch.zeros((plan_t.shape[0], n_training), dtype=torch.float32)  # [t, sorted row]

        deltas = delta_buffers(self.shapes, n_rows, out)
        idle = order_t[n_training:]  # rows with 0 steps: zero delta
        for d in deltas.values():
            d.index_fill_(0, idle, 0.0)
        self._train_chunks(start, stacked, deltas, plan_t, order_t[:n_training], source_t[:n_training],
                           s_sorted[:n_training], lr_sorted[:n_training], mu_sorted[:n_training], losses)
        loss_sum = np.zeros(n_rows)
        loss_sum[order[:n_training]] = losses.to(torch.float64).sum(dim=0).numpy()
        return deltas, mean_losses(steps, loss_sum)

    def _train_chunks(self, start: dict[str, torch.Tensor], stacked: dict[str, bool], deltas: dict[str, torch.Tensor],
                      plan_t: torch.Tensor, rows_t: torch.Tensor, source_t: torch.Tensor, s_sorted: np.ndarray,
                      lr_sorted: np.ndarray, mu_sorted: np.ndarray, losses: torch.Tensor) -> None:
        """Train the training rows (sorted by steps, descending) chunk by chunk; their deltas go to `deltas`."""
        n_training = len(rows_t)
        chunk = min(self.chunk_rows, n_training)
        # One chunk's weights at a time, trained in place while they sit in cache, then
        # turned into deltas; the buffers are reused by every step of every chunk.
        work = {n: torch.empty((chunk, *shape), dtype=torch.float32) for n, shape in self.shapes.items()}
        buffers = self._dense_buffers(chunk) if self.kind != "cnn" else None
        for lo in range(0, n_training, max(chunk, 1)):
            hi = min(lo + chunk, n_training)
            rows, sources = rows_t[lo:hi], source_t[lo:hi]
            w = {n: work[n][: hi - lo] for n in work}
            for n, wn in w.items():
                if stacked[n]:
                    torch.index_select(start[n], 0, sources, out=wn)
                else:
                    wn.copy_(start[n])
            # FedProx pulls towards each row's start weights, [rows, *shape] (a global start expanded, not copied).
            # Rows with mu = 0 beside FedProx's are pulled by lr * 0, which leaves them exact.
            w0 = ({n: start[n].index_select(0, sources) if stacked[n] else start[n].expand(hi - lo, *start[n].shape)
                   for n in w} if mu_sorted[lo:hi].any() else None)
            if self.kind == "cnn":
                self._cnn_steps(w, plan_t[:, lo:hi], s_sorted[lo:hi], lr_sorted[lo:hi], losses[:, lo:hi],
                                mu_sorted[lo:hi], w0)
            else:
                assert buffers is not None  # made above for every kind but the CNN
                self._dense_steps(w, plan_t[:, lo:hi], s_sorted[lo:hi], lr_sorted[lo:hi], losses[:, lo:hi], buffers,
                                  mu_sorted[lo:hi], w0)
            for n, wn in w.items():
                wn.sub_(start[n].index_select(0, sources) if stacked[n] else start[n])
                deltas[n].index_copy_(0, rows, wn)

    def _dense_buffers(self, rows: int) -> dict[str, list[torch.Tensor]]:
        """Inputs, pre-activations and input gradients of every layer for `rows` rows."""
        b = self.batch_size
        widths = [self.shapes[wn][1] for wn, _ in self._layers] + [self.shapes[self._layers[-1][1]][0]]
        return {
            "x": [torch.empty((rows, b, widths[0]))],
            "target": [torch.empty((rows, b, widths[-1]))],
            "z": [torch.empty((rows, b, width)) for width in widths[1:]],  # z[l]: output of layer l
            "g": [torch.empty((rows, b, width)) for width in widths[:-1]],  # g[l]: gradient at layer l's input
        }

    def _dense_steps(self, w: dict, plan: torch.Tensor, steps: np.ndarray, lr: np.ndarray, losses: torch.Tensor,
                     buffers: dict[str, list[torch.Tensor]], mu: np.ndarray,
                     w0: dict[str, torch.Tensor] | None) -> None:
        """All steps of one chunk of a Linear(+ReLU) chain; rows sorted by steps, descending."""
        b = self.batch_size
        last = len(self._layers) - 1
        active_at = (steps[None, :] > np.arange(int(steps[0]))[:, None]).sum(axis=1)
        active_prev = -1
        for t, active in enumerate(active_at.tolist()):
            if active != active_prev:  # views of the active prefix, rebuilt only when it shrinks
                layers = [(w[wn][:active], w[bn][:active].unsqueeze(1)) for wn, bn in self._layers]
                if w0 is not None:  # start weights, biases [A, 1, out] like the layers'
                    prox = [(w0[wn][:active], w0[bn][:active].unsqueeze(1)) for wn, bn in self._layers]
                    prox_scale = torch.from_numpy((lr[:active] * mu[:active]).astype(np.float32)).view(-1, 1, 1)
                x, target = buffers["x"][0][:active], buffers["target"][0][:active]
                z = [buf[:active] for buf in buffers["z"]]
                g_in = [buf[:active] for buf in buffers["g"]]
                # d(mean CE)/d(logits) = (softmax - onehot) / B; the learning rate is folded in.
                scale = torch.from_numpy((lr[:active] / b).astype(np.float32)).view(-1, 1, 1)
                active_prev = active
            idx = plan[t, :active].reshape(-1)
            torch.index_select(self.x, 0, idx, out=x.view(active * b, -1))  # [A, B, in]
            torch.index_select(self.onehot, 0, idx, out=target.view(active * b, -1))  # [A, B, C]
            h = x
            for layer, (weight, bias) in enumerate(layers):
                h = torch.baddbmm(bias, h, weight.transpose(1, 2), out=z[layer])  # [A, B, out]
                if layer < last:
                    h.relu_()
            # Softmax cross-entropy by hand: torch's log_softmax over 10 classes is slow on CPU,
            # and exp() of an argument below -87 (a result below float32's normal range) takes a
            # slow path; e^-40 is far below the resolution of what it is added to.
            logits = h.sub_(h.amax(dim=2, keepdim=True))  # shifted: max 0
            e = logits.clamp_min(-40.0).exp_()
            total = e.sum(dim=2, keepdim=True)  # in [1, C]
            torch.mean(total.log().squeeze(2) - (logits * target).sum(dim=2), dim=1, out=losses[t, :active])
            g = e.div_(total).sub_(target).mul_(scale)  # lr * dLoss/dlogits, [A, B, C]
            for layer in range(last, -1, -1):
                weight, bias = layers[layer]
                h_in = z[layer - 1] if layer else x
                if layer:  # input gradient with the weights before their update; ReLU passes where h_in > 0
                    grad_in = torch.bmm(g, weight, out=g_in[layer])
                    torch.ops.aten.threshold_backward.grad_input(grad_in, h_in, 0, grad_input=grad_in)
                if w0 is not None:  # lr * mu * (w - w_start), with the weights before this step's update
                    weight.sub_((weight - prox[layer][0]).mul_(prox_scale))
                    bias.sub_((bias - prox[layer][1]).mul_(prox_scale))
                weight.baddbmm_(g.transpose(1, 2), h_in, alpha=-1.0)
                bias.sub_(g.sum(dim=1, keepdim=True))
                g = grad_in if layer else g

    def _cnn_steps(self, w: dict, plan: torch.Tensor, steps: np.ndarray, lr: np.ndarray, losses: torch.Tensor,
                   mu: np.ndarray, w0: dict[str, torch.Tensor] | None) -> None:
        """All steps of one chunk of CNN rows, row by row through the model's own forward and autograd."""
        b = self.batch_size
        for i in range(len(steps)):
            for t in range(int(steps[i])):
                idx = plan[t, i]
                x = self.x.index_select(0, idx).view(b, 1, 28, 28)
                leaves = {n: p[i].detach().requires_grad_() for n, p in w.items()}
                with torch.enable_grad():
                    loss = nn.functional.cross_entropy(functional_call(self.model, leaves, (x,)),
                                                       self.y.index_select(0, idx))
                    grads = torch.autograd.grad(loss, list(leaves.values()))
                losses[t, i] = loss.detach()
                with torch.no_grad():
                    for (n, p), grad in zip(w.items(), grads):
                        if w0 is not None and mu[i] > 0:
                            grad = grad + float(mu[i]) * (p[i] - w0[n][i])
                        p[i].sub_(grad, alpha=float(lr[i]))  # as train_local does
