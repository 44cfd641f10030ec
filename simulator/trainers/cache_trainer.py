"""Cache-resident local training: each row (a device in a run) trains alone, its weights in cache.

`CacheTrainer(model, shards, batch_size=B).train(start, shard_of_row=, steps=, lr=, rngs=,
start_of_row=, out=, mu=)` takes the arguments of `simulator.trainers.fast_trainer.FastTrainer.train`
and returns what it returns: the deltas {name: [R, *shape]} (trained - start, row order as
given) and each row's mean minibatch loss (float64 [R], nan for 0 steps). The batches are the
same (`simulator.trainers.rows.batch_plan`: edge_agent.trainer.step_plan per row, rows that share a
Generator object share its batches), and so is the arithmetic up to float32 rounding:
row i equals `edge_agent.trainer.train_local(unit="step")` on its shard with rngs[i] to float
tolerance (tests/unit/simulator/test_cache_trainer.py). `mu` > 0 adds FedProx's proximal
term mu * (w - w_start) to every gradient. `evaluate(model, params, data)` is the simulator
engine's test evaluation, on the same kernels.

How it differs from FastTrainer (MLP and logistic regression, chains of Linear + ReLU):
- One row at a time, all its steps: the MLP's 0.8 MB of weights (logistic regression's
  2.4 KB) stay in the core's cache from the first step to the last, and a row costs only its
  own steps, however ragged the steps of a round are (no padding to the longest row).
- A step runs inside numba-compiled loops (simulator.trainers.row_kernels), no Python per step and no
  autograd: forward, softmax cross-entropy by hand (clamped at -40 as FastTrainer), input
  gradients, and the SGD update fused into the weight-gradient product (w is read and written
  once per step). Every row trains in the same work buffer, which stays in cache from row to
  row; only its delta goes to memory (that took a row's fixed cost from 145 to 90 us on MNIST).
- Inputs that are mostly zeros (MNIST's pixels) train the first layer transposed, and each step
  skips the inputs that are zero in its whole batch: about half of MNIST's first-layer work.
The CNN has no kernel here: its rows go to FastTrainer, which trains them one by one through
autograd (a CNN step is ~0.75 GFLOP of convolutions; cache residency does not change that).

The first train() of a process loads the kernels from numba's cache (0.4 s), or compiles them
where the cache is missing or the CPU differs (7 s for the MLP and logistic regression
together, measured with an empty NUMBA_CACHE_DIR). The first evaluate() likewise: 0.3 s from
the cache, or 3.1 s to compile for the MLP on uint8 pixels and ~0.8 s for each other model and
input type. One thread, the caller's.
Speed: python -m benchmarks.sim_speed --variants cache,fast,sequential,torchloop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from flexfl.errors import ConfigError
from simulator.trainers import row_kernels
from simulator.trainers.fast_trainer import FastTrainer
from simulator.trainers.rows import batch_plan, check_rows, delta_buffers, mean_losses, row_arguments
from workloads.datasets import PIXEL_SCALE, ArrayDataset
from workloads.evaluation import CHUNK
from workloads.evaluation import evaluate as torch_evaluate
from workloads.models import EmnistCNN, LogisticRegression, MnistMLP

SPARSE_INPUTS = 0.5  # at most this fraction of the features not zero: the first layer trains transposed
SPARSE_SAMPLE = 1000  # samples that sparse_inputs looks at (the evaluation asks every round)

LAYERS = {
    MnistMLP: [("fc1.weight", "fc1.bias"), ("fc2.weight", "fc2.bias"), ("fc3.weight", "fc3.bias")],
    LogisticRegression: [("linear.weight", "linear.bias")],
}


class CacheTrainer:
    """Trains rows (devices x runs) one after another, each in cache through all its steps."""

    def __init__(self, model: nn.Module, shards: Sequence[ArrayDataset], *, batch_size: int) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not shards:
            raise ConfigError("CacheTrainer needs at least one shard")
        self.batch_size = batch_size
        self.model = model
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self._cnn: FastTrainer | None = None
        if isinstance(model, EmnistCNN):
            self._cnn = FastTrainer(model, shards, batch_size=batch_size)
            return
        layers = LAYERS.get(type(model))
        if layers is None:
            raise ConfigError(f"CacheTrainer has no kernel for {type(model).__name__}; use the plain trainer")
        self._layers = layers
        self.sizes = np.array([len(d) for d in shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        # All shards in one flat array; a row's batch is gathered by global index.
        # Pixel bytes stay bytes (a batch's gather divides them by 255 as scaled() does): 4x less
        # memory than float32 (47 MB for MNIST's 60k, not 188) and 4x fewer bytes per gathered batch.
        x = np.concatenate([d.x.reshape(len(d), -1) for d in shards])
        pixels = x.dtype == np.uint8
        self.x = x if pixels else np.ascontiguousarray(x, dtype=np.float32)
        self.scale = PIXEL_SCALE if pixels else 1.0
        self.y = np.concatenate([d.y for d in shards]).astype(np.int64)
        num_classes = self.shapes[layers[-1][1]][0]
        if len(self.y) and (int(self.y.max()) >= num_classes or int(self.y.min()) < 0):
            raise ConfigError(f"labels span {int(self.y.min())}..{int(self.y.max())} but the model has "
                              f"{num_classes} classes")
        # Activations h[l] [B, width] (h[0] the batch) and output gradients g[l] of layer l, reused by every call.
        widths = [self.shapes[w][1] for w, _ in layers] + [num_classes]
        self._h = tuple(np.empty((batch_size, n), dtype=np.float32) for n in widths)
        self._g = tuple(np.empty((batch_size, n), dtype=np.float32) for n in widths[1:])
        # Inputs that are mostly zeros (MNIST's pixels: 81 %) train the first layer transposed, [in, out],
        # skipping in each step the inputs that are zero in its whole batch (row_kernels.train_rows).
        # Dense inputs keep torch's layout: SYNTHETIC's 60 x 10 layer ran at 0.61x transposed.
        self.first_transposed = sparse_inputs(self.x)
        self._w_work = tuple(np.empty(self.shapes[w][::-1] if i == 0 and self.first_transposed else self.shapes[w],
                                      dtype=np.float32) for i, (w, _) in enumerate(layers))
        self._b_work = tuple(np.empty(self.shapes[b], dtype=np.float32) for _, b in layers)
        # The fraction of the first layer's inputs that entered the last train()'s steps (1.0 dense):
        # its forward and update products did that fraction of their dense FLOPs.
        self.inputs_used = 1.0

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

        The arguments are FastTrainer.train's: `start` one global dict or {name: [G, *shape]}
        chosen by `start_of_row` (default G = R, row i from its own); `out` receives the deltas
        in its first R rows; `mu` > 0 adds FedProx's mu * (w - w_start) to every gradient (the
        reported loss stays the minibatch cross-entropy).
        """
        if self._cnn is not None:
            return self._cnn.train(start, shard_of_row=shard_of_row, steps=steps, lr=lr, rngs=rngs,
                                   start_of_row=start_of_row, out=out, mu=mu)
        shard_of_row, steps, lrs, source, mus = row_arguments(shard_of_row, steps, lr, start_of_row, mu)
        n_rows = len(steps)
        check_rows(self.shapes, len(self.sizes), start, shard_of_row, steps, lrs, rngs, source, mus,
                   given_sources=start_of_row is not None)
        # Start models as [G, *shape] arrays: a global start is one model (G = 1) that every row
        # starts from; a global parameter beside stacked ones is repeated per row.
        stacked = {n: start[n].dim() == len(shape) + 1 for n, shape in self.shapes.items()}
        if not any(stacked.values()):
            source = np.zeros(n_rows, dtype=np.int64)
        starts = {}
        for n, shape in self.shapes.items():
            t = start[n].detach().to(torch.float32)
            if not stacked[n]:
                t = t.unsqueeze(0) if not any(stacked.values()) else t.expand(n_rows, *shape)
            starts[n] = t.contiguous().numpy()
        if self.first_transposed:
            first = self._layers[0][0]
            starts[first] = np.ascontiguousarray(starts[first].transpose(0, 2, 1))  # [G, in, out], as trained
        deltas = delta_buffers(self.shapes, n_rows, out)

        # Sorted by steps, descending, as batch_plan needs (rows sharing a Generator: the longest draws).
        order = np.argsort(-steps, kind="stable")
        training = order[: int(np.count_nonzero(steps))]
        plan = batch_plan(training, steps[training], shard_of_row, rngs, sizes=self.sizes, offsets=self.offsets,
                          batch_size=self.batch_size)
        for d in deltas.values():
            d[torch.from_numpy(order[len(training):])] = 0.0
        loss_sum = np.zeros(n_rows)
        buffers = {n: d.numpy() for n, d in deltas.items()}
        used = row_kernels.train_rows(
            self.x, self.scale, self.y, plan, training, steps[training], lrs[training], mus[training], source[training],
            tuple(starts[w] for w, _ in self._layers), tuple(starts[b] for _, b in self._layers),
            self._w_work, self._b_work,
            tuple(buffers[w] for w, _ in self._layers), tuple(buffers[b] for _, b in self._layers),
            self._h, self._g, loss_sum, self.first_transposed)
        self.inputs_used = used / max(1, int(steps.sum()) * self.x.shape[1])
        return deltas, mean_losses(steps, loss_sum)


def sparse_inputs(x: np.ndarray) -> bool:
    """Whether at most SPARSE_INPUTS of the features of x [N, in] (its first SPARSE_SAMPLE samples) are not zero."""
    head = x[:SPARSE_SAMPLE]
    return bool(head.size) and bool(np.count_nonzero(head) <= SPARSE_INPUTS * head.size)


EVAL_BLOCK = 20  # samples per block of the evaluation (h scratch: 20 x 784 floats for MNIST, in L1/L2)


def evaluate(model: nn.Module, params: dict[str, torch.Tensor], data: ArrayDataset,
             stats: dict[str, float] | None = None) -> tuple[float, float]:
    """workloads.evaluation.evaluate's accuracy and mean cross-entropy, for the simulator's rounds.

    Models with a kernel here (MLP, logistic regression) are evaluated by row_kernels.evaluate_chain,
    the products that train them; others by workloads.evaluation.evaluate. The two agree to
    float32 rounding (tests/unit/simulator/test_cache_trainer.py). On the 10k MNIST test images the
    MLP's evaluation took 26.0 ms against 42.1 through torch (1.62x, min 1.60, max 1.67 over 8
    interleaved pairs, one thread, AMD EPYC family 26 model 2): torch's sgemm (MKL) runs at
    ~100 GFLOP/s on this CPU, the kernels' products at up to ~210. Sparse inputs are evaluated as
    the trainer trains them, the first layer transposed and each block of EVAL_BLOCK samples
    skipping the inputs zero in all of them: on an AMD EPYC family 25 (Zen 3), 1.32x the dense
    kernels (medians of 9 interleaved calls; blocks of 10 / 15 / 30 gave 1.15 / 1.35 / 1.14x). The coordinator keeps
    workloads.evaluation.evaluate: it does not import numba (its idle memory stays ~torch's).
    `stats`, if given, receives "inputs_used": the fraction of the first layer's dense FLOPs done.
    """
    layers = LAYERS.get(type(model))
    if layers is None:
        if stats is not None:
            stats["inputs_used"] = 1.0
        return torch_evaluate(model, params, data)
    x = data.x.reshape(len(data), -1)
    if x.dtype not in (np.uint8, np.float32):
        x = x.astype(np.float32)
    scale = PIXEL_SCALE if x.dtype == np.uint8 else 1.0
    transposed = sparse_inputs(x)  # the first layer as the trainer has it: [in, out], zero inputs skipped
    w = tuple((params[name].detach().to(torch.float32).t() if i == 0 and transposed else
               params[name].detach().to(torch.float32)).contiguous().numpy() for i, (name, _) in enumerate(layers))
    b = tuple(params[name].detach().to(torch.float32).contiguous().numpy() for _, name in layers)
    widths = [x.shape[1]] + [len(bias) for bias in b]
    h = tuple(np.empty((EVAL_BLOCK, n), dtype=np.float32) for n in widths)
    y = np.ascontiguousarray(data.y, dtype=np.int64)
    correct, loss_sum, used = row_kernels.evaluate_chain(np.ascontiguousarray(x), y, scale, w, b, h, CHUNK,
                                                         transposed)
    if stats is not None:
        stats["inputs_used"] = used / max(1, x.size)
    return correct / len(data), loss_sum / len(data)
