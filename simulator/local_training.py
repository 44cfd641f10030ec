"""Local training of a round's contributors, for one run (RunTrainer) or paired runs together (PairedTrainer).

Both answer `train_round(runs, works, round_index=tau)` with each run's deltas (row i: its
work.rows[i]) and each row's mean minibatch loss, so that simulator.engine has one loop for both.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from coordinator.rules.aggregation import stack_deltas
from coordinator.rules.round import RoundSum
from edge_agent.trainer import device_rng, train_local
from flexfl.errors import ConfigError
from simulator.run_state import RoundWork, RunState
from simulator.sim_config import SimConfig
from simulator.trainers.fast_trainer import FastTrainer
from simulator.trainers.trainer_kind import TrainerKind
from workloads.federated import FederatedData

# A run's round, trained: its deltas {name: [rows, *shape]} (or, trained in chunks, the RoundSum they were
# added to), and the mean minibatch loss per row.
Trained = tuple[dict[str, torch.Tensor] | RoundSum, np.ndarray]

# A round's deltas are stacked only while they fit in this many bytes; a larger round is trained and added to
# its RoundSum (the live coordinator's summed form) chunk by chunk, so that a round's memory stays one chunk of
# model copies whatever its participants (issue 36: 10,000 MNIST participants stacked took 8.8 GiB). Every
# round of the paper's tables fits, so their runs stay stacked, as committed.
STACK_BUDGET_BYTES = 256 * 2**20


def rows_per_chunk(params: Mapping[str, torch.Tensor], *, budget_bytes: int = STACK_BUDGET_BYTES) -> int:
    """How many rows of deltas like `params` (float32) fit in `budget_bytes`: at least one."""
    row = 4 * sum(int(p.numel()) for p in params.values())
    return max(1, budget_bytes // max(row, 1))


def _cache_trainer(*args, **kwargs):
    try:
        from simulator.trainers.cache_trainer import CacheTrainer  # needs numba (the [sim] extra)
    except ImportError as exc:
        raise ConfigError(f"trainer = 'cache' needs numba (pip install -e '.[sim]'): {exc}; "
                          "trainer = 'fast' or 'auto' simulates without it") from None
    return CacheTrainer(*args, **kwargs)


ROW_TRAINERS = {TrainerKind.CACHE: _cache_trainer, TrainerKind.FAST: FastTrainer}


class RoundTrainer(Protocol):
    def train_round(self, runs: Sequence[RunState], works: Sequence[RoundWork], *,
                    round_index: int) -> list[Trained]: ...


class RunTrainer:
    """One run's contributors: all together (a row trainer) or edge_agent.trainer per device (plain)."""

    def __init__(self, cfg: SimConfig, model: torch.nn.Module, data: FederatedData, *,
                 chunk_rows: int | None = None) -> None:
        """`chunk_rows`: the most rows of deltas a round stacks (default: rows_per_chunk's, from
        STACK_BUDGET_BYTES); a round with more contributors is trained and summed in chunks of it."""
        self.cfg = cfg
        self.model = model
        self.data = data
        self.batch_size = cfg.rules.batch_size_for(cfg.partition.dataset)
        self.mu = cfg.rules.aggregation.proximal_mu  # FedProx's local term (0: plain SGD)
        self.fast = ROW_TRAINERS[cfg.trainer_kind](model, data.train,
                                                   batch_size=self.batch_size) if cfg.batched else None
        if chunk_rows is not None and chunk_rows < 1:
            raise ConfigError(f"chunk_rows must be at least 1, got {chunk_rows}")
        self.chunk_rows = chunk_rows
        self._out: dict[str, torch.Tensor] | None = None  # delta buffers kept from round to round

    def train_round(self, runs: Sequence[RunState], works: Sequence[RoundWork], *, round_index: int) -> list[Trained]:
        (run,), (work,) = runs, works
        params, lr = run.fed.params, work.opening.lr
        chunk = self._chunk(params)
        if len(work.shards) <= chunk:
            return [self.train(params, work.shards, work.steps, lr=lr, round_index=round_index)]
        # Too many rows to stack: train a chunk, add it to the round's sum, reuse the buffers for the next.
        summed = run.fed.start_sum(work.opening)
        losses = []
        for lo in range(0, len(work.shards), chunk):
            deltas, loss = self.train(params, work.shards[lo:lo + chunk], work.steps[lo:lo + chunk], lr=lr,
                                      round_index=round_index)
            rows = work.rows[lo:lo + chunk]
            summed.add_rows(rows, s=[work.s[d] for d in rows], deltas=deltas)
            losses.append(loss)
        # Participants that worked without contributing (Scheme A's s < E) enter the sum at weight 0, as they
        # do live: the close checks the sum's s against the weighing's.
        for d in work.opening.participants:
            if work.s[d] and d not in summed.s:
                summed.add(d, s=work.s[d], delta={})
        return [(summed, np.concatenate(losses))]

    def _chunk(self, params: Mapping[str, torch.Tensor]) -> int:
        return self.chunk_rows if self.chunk_rows is not None else rows_per_chunk(params)

    def train(self, params: Mapping[str, torch.Tensor], shards: list[int], steps: list[int], *, lr: float,
              round_index: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Deltas stacked in `shards` order (row i: steps[i] SGD steps) and each row's mean minibatch loss."""
        if not shards:
            return {}, np.array([])
        rngs = [device_rng(self.cfg.seed, round_index, k) for k in shards]
        if self.fast is not None:
            if self._out is None or len(next(iter(self._out.values()))) < len(shards):
                n = min(len(self.data.train), max(self._chunk(params), len(shards)))
                self._out = {name: torch.empty((n, *p.shape)) for name, p in params.items()}
            return self.fast.train(dict(params), shard_of_row=shards, steps=steps, lr=lr, rngs=rngs, out=self._out,
                                   mu=self.mu)
        deltas, losses = [], []
        for k, s, rng in zip(shards, steps, rngs):
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(params[name])
            # `steps` already counts epochs as their steps (same stream: edge_agent.trainer).
            res = train_local(self.model, self.data.train[k], updates=s, lr=lr, batch_size=self.batch_size, rng=rng,
                              unit="step", mu=self.mu)
            deltas.append(res.delta)
            losses.append(res.mean_loss)
        return stack_deltas(deltas), np.array(losses)


class PairedTrainer:
    """The rows of every run still going in one row-trainer call, each row from its run's model at its run's rate."""

    def __init__(self, runs: Sequence[RunState], data: FederatedData) -> None:
        first = runs[0].cfg
        self.fast = ROW_TRAINERS[first.trainer_kind](runs[0].model, data.train,
                                                     batch_size=first.rules.batch_size_for(first.partition.dataset))
        n = len(data.train)
        self.out = {name: torch.empty((n * len(runs), *p.shape)) for name, p in runs[0].fed.params.items()}

    def train_round(self, runs: Sequence[RunState], works: Sequence[RoundWork], *, round_index: int) -> list[Trained]:
        # Rows of all runs, run after run; row j starts from model start_of_row[j] (its run's).
        bounds = np.cumsum([0] + [len(w.shards) for w in works])
        deltas: dict[str, torch.Tensor] = {}
        losses = np.array([])
        if bounds[-1]:
            # One Generator per (seed, device): the runs of a seed share a device's minibatches.
            keys = [(run.cfg.seed, k) for run, w in zip(runs, works) for k in w.shards]
            generators = {key: device_rng(key[0], round_index, key[1]) for key in set(keys)}
            start = {name: torch.stack([run.fed.params[name] for run in runs]) for name in self.out}
            deltas, losses = self.fast.train(
                start, shard_of_row=np.concatenate([w.shards for w in works]).astype(np.int64),
                steps=np.concatenate([w.steps for w in works]).astype(np.int64),
                lr=np.concatenate([np.full(len(w.shards), w.opening.lr) for w in works]),
                rngs=[generators[key] for key in keys],
                start_of_row=np.repeat(np.arange(len(works)), np.diff(bounds)), out=self.out,
                mu=np.concatenate([np.full(len(w.shards), run.cfg.rules.aggregation.proximal_mu)
                                   for run, w in zip(runs, works)]))
        return [({name: d[lo:hi] for name, d in deltas.items()} if hi > lo else {}, losses[lo:hi])
                for lo, hi in itertools.pairwise(bounds)]
