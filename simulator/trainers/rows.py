"""What the simulator's trainers share about rows: argument checks, batch plans, delta buffers.

A row is one device of one run in a round. `simulator.trainers.fast_trainer.FastTrainer` (rows in
lock-step) and `simulator.trainers.cache_trainer.CacheTrainer` (one row at a time) take the same
arguments and must draw the same minibatches, so both call these functions: one copy of the
rules, not two kept equal by a comment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from edge_agent.trainer import step_plan
from flexfl.errors import ConfigError


def batch_plan(rows: np.ndarray, steps: np.ndarray, shard_of_row: np.ndarray, rngs: Sequence[np.random.Generator], *,
               sizes: np.ndarray, offsets: np.ndarray, batch_size: int) -> np.ndarray:
    """plan[t, i] = global sample indices of rows[i]'s t-th batch, int64 [max steps, len(rows), batch_size].

    Row r's batches come from `edge_agent.trainer.step_plan(sizes[shard], rng=rngs[r])`, offset
    by its shard's first global index. Rows given the same Generator object (and shard) share
    its batches: paired runs of one seed train a device on the same minibatches, and
    step_plan's batches for fewer steps are a prefix of those for more. `rows` must come
    sorted by steps, descending, so the first row of such a set draws for all of them.
    Entries past a row's own steps are 0.
    """
    plan = np.zeros((int(steps.max(initial=0)), len(rows), batch_size), dtype=np.int64)
    drawn: dict[int, int] = {}  # id(rng) -> column of the row that drew from it
    for i, (row, s) in enumerate(zip(rows, steps)):
        shard = shard_of_row[row]
        first = drawn.get(id(rngs[row]))
        if first is not None and shard_of_row[rows[first]] == shard:
            plan[:s, i] = plan[:s, first]
            continue
        drawn[id(rngs[row])] = i
        plan[:s, i] = step_plan(int(sizes[shard]), batch_size=batch_size, steps=int(s), rng=rngs[row]) + offsets[shard]
    return plan


def row_arguments(
    shard_of_row: Sequence[int] | np.ndarray,
    steps: Sequence[int] | np.ndarray,
    lr: float | Sequence[float] | np.ndarray,
    start_of_row: Sequence[int] | np.ndarray | None,
    mu: float | Sequence[float] | np.ndarray = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(shard_of_row, steps, lr per row, start model per row, FedProx's mu per row) as arrays;
    lr, mu and start_of_row broadcast (paired runs give each row its run's lr and mu)."""
    steps = np.asarray(steps, dtype=np.int64)
    lrs, mus = (np.asarray(v, dtype=np.float64) for v in (lr, mu))
    lrs = np.full(len(steps), float(lrs)) if lrs.ndim == 0 else lrs
    mus = np.full(len(steps), float(mus)) if mus.ndim == 0 else mus
    source = np.arange(len(steps)) if start_of_row is None else np.asarray(start_of_row, dtype=np.int64)
    return np.asarray(shard_of_row, dtype=np.int64), steps, lrs, source, mus


def check_rows(shapes: Mapping[str, tuple[int, ...]], n_shards: int, start: Mapping[str, torch.Tensor],
               shard_of_row: np.ndarray, steps: np.ndarray, lrs: np.ndarray, rngs: Sequence[np.random.Generator],
               source: np.ndarray, mus: np.ndarray, *, given_sources: bool) -> None:
    """Raise ConfigError naming the row or parameter when the arguments of a train() call do not fit."""
    n_rows = len(steps)
    if (steps.ndim != 1 or shard_of_row.shape != (n_rows,) or lrs.shape != (n_rows,) or len(rngs) != n_rows
            or source.shape != (n_rows,) or mus.shape != (n_rows,)):
        raise ConfigError(f"steps, shard_of_row, lr, rngs, start_of_row and mu must have one entry per row (lr and "
                          f"mu may be one number); got lengths {len(steps)}, {len(shard_of_row)}, {lrs.size}, "
                          f"{len(rngs)}, {source.size}, {mus.size}")
    if n_rows and steps.min() < 0:
        raise ConfigError(f"steps must be >= 0; row {int(steps.argmin())} has {int(steps.min())}")
    bad = np.flatnonzero((shard_of_row < 0) | (shard_of_row >= n_shards))
    if len(bad):
        raise ConfigError(f"row {int(bad[0])}: shard {int(shard_of_row[bad[0]])} is not in 0..{n_shards - 1}")
    bad = np.flatnonzero(~(np.isfinite(lrs) & (lrs > 0)))
    if len(bad):
        raise ConfigError(f"row {int(bad[0])}: learning rate must be a positive number, got {lrs[bad[0]]!r}")
    bad = np.flatnonzero(~(np.isfinite(mus) & (mus >= 0)))
    if len(bad):
        raise ConfigError(f"row {int(bad[0])}: mu (FedProx's proximal weight) must be a number >= 0, got "
                          f"{float(mus[bad[0]])!r}")
    if set(start) != set(shapes):
        raise ConfigError(f"start has parameters {sorted(start)}, the model has {sorted(shapes)}")
    if n_rows and source.min() < 0:
        raise ConfigError(f"start_of_row must be >= 0; row {int(source.argmin())} has {int(source.min())}")
    for n, shape in shapes.items():
        got = tuple(start[n].shape)
        if not given_sources:
            if got not in (shape, (n_rows, *shape)):
                raise ConfigError(f"start[{n!r}] has shape {got}; expected {shape} or {(n_rows, *shape)}")
        elif len(got) != len(shape) + 1 or got[1:] != shape:
            raise ConfigError(f"start[{n!r}] has shape {got}; with start_of_row expected (models, "
                              f"{', '.join(map(str, shape))})")
        elif n_rows and got[0] <= source.max():
            raise ConfigError(f"start[{n!r}] holds {got[0]} models but row {int(source.argmax())} starts "
                              f"from model {int(source.max())}")


def delta_buffers(shapes: Mapping[str, tuple[int, ...]], n_rows: int,
                  out: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The first n_rows rows of `out` (checked), or fresh float32 buffers {name: [n_rows, *shape]}."""
    if out is None:
        return {n: torch.empty((n_rows, *shape), dtype=torch.float32) for n, shape in shapes.items()}
    for n, shape in shapes.items():
        t = out.get(n)
        if (t is None or t.dtype != torch.float32 or tuple(t.shape[1:]) != shape or len(t) < n_rows
                or not t.is_contiguous()):
            got = f"{t.dtype} {tuple(t.shape)}" if t is not None else "nothing"
            rest = ", ".join(map(str, shape))
            raise ConfigError(f"out[{n!r}] must be contiguous float32 of shape (>= {n_rows}, {rest}), got {got}")
    return {n: out[n][:n_rows] for n in shapes}


def mean_losses(steps: np.ndarray, loss_sum: np.ndarray) -> np.ndarray:
    """Each row's mean minibatch loss, float64 [R]; nan where a row took no step."""
    mean = np.full(len(steps), np.nan)
    trained = steps > 0
    mean[trained] = loss_sum[trained] / steps[trained]
    return mean
