"""A run's SGD steps counted without training: the engine's own rounds with a no-op trainer.

What a run costs on a row trainer is its device-steps (SimResult.device_updates): each
round, the contributors of Federation.weigh (Scheme A: the devices with s = E; B and C:
every device with s > 0) train s x steps_per_update(n_k) SGD steps each. Who contributes
depends on the s draws, the scheme and the objective's weights, never on the model's
values (an auto departure's include-or-exclude, decided from the updates, changes p, not who
is active), so `round_work` runs simulator.engine's own round (RunState.begin, then RunState.end with
zero deltas) on a one-image test set and a stand-in linear model: the draws, the weighing
and the steps per update are the engine's, and a round of an MNIST Scheme B run (~98 zero
deltas) takes 3.4 ms instead of 19 ms with the MLP's update sum and Gamma sketches (2-core
AMD EPYC, shared): Table 3's MNIST grid, 220 runs x 200 rounds, counts in ~2.3 min.
tests/unit/simulator/test_device_steps.py checks the count against run_simulation's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from simulator.groups import Group
from simulator.participation import TraceParticipation
from simulator.run_state import RoundWork, RunState
from simulator.sim_config import SimConfig
from trace_recorder.format import TraceSet, read_trace_set
from workloads.datasets import ArrayDataset
from workloads.federated import FederatedData
from workloads.models import LogisticRegression
from workloads.partition_spec import PartitionSpec


@dataclass(frozen=True)
class StepCount:
    """What one run trains over all its rounds."""

    device_steps: int  # SGD steps, summed over devices and rounds (= SimResult.device_updates)
    device_rounds: int  # (device, round) pairs that trained: rows of the row trainer
    rounds: int

    def __add__(self, other: StepCount) -> StepCount:
        return StepCount(self.device_steps + other.device_steps, self.device_rounds + other.device_rounds,
                         self.rounds + other.rounds)


def round_work(cfg: SimConfig, *, data: FederatedData, traces: TraceSet | None = None) -> Iterator[RoundWork]:
    """Each round's work of the run `cfg` in order (work.shards trains work.steps), nothing trained.

    The rounds close with zero updates, so the model never changes; the draws and who
    contributes are those of run_simulation(cfg) (they never depend on the model).
    """
    traces = traces if traces is not None else read_trace_set(Path(cfg.traces.set))
    # One test image and no holdouts: the engine evaluates every round, the count needs none of it.
    light = replace(data, test=ArrayDataset(x=data.test.x[:1], y=data.test.y[:1]), device_test=None)
    run = RunState(cfg, light, TraceParticipation(traces, cfg))
    run.model = LogisticRegression(data.in_features, data.num_classes)
    run.fed.params = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    zeros = {n: torch.zeros((len(data.train), *p.shape)) for n, p in run.fed.params.items()}
    for tau in range(1, cfg.rounds + 1):
        work = run.begin(tau)
        yield work
        k = len(work.rows)
        run.end(work, {n: z[:k] for n, z in zeros.items()} if k else {}, np.zeros(k), train_s=0.0)


def count_run(cfg: SimConfig, *, data: FederatedData, traces: TraceSet | None = None) -> StepCount:
    """The device-steps and trained rows of run_simulation(cfg), counted without training."""
    steps = rows = 0
    for work in round_work(cfg, data=data, traces=traces):
        steps += sum(work.steps)
        rows += len(work.rows)
    return StepCount(device_steps=steps, device_rounds=rows, rounds=cfg.rounds)


def count_group(group: Group, *, data: FederatedData,
                traces: dict[str, TraceSet] | None = None) -> dict[str, StepCount]:
    """Every computed run of a sweep group by name; a run `same_as` another costs nothing and is left out.

    `traces` maps a config's traces.set to its trace set (read from disk when missing, and kept there).
    """
    traces = traces if traces is not None else {}
    out = {}
    for run in group.runs:
        if run.same_as is None:
            if run.config.traces.set not in traces:
                traces[run.config.traces.set] = read_trace_set(Path(run.config.traces.set))
            out[run.name] = count_run(run.config, data=data, traces=traces[run.config.traces.set])
    return out


def count_groups(groups: Sequence[Group], *,
                 load: Callable[[PartitionSpec], FederatedData]) -> list[dict[str, StepCount]]:
    """count_group of each group, each partition's data built once with `load` (groups come partition by partition)."""
    traces: dict[str, TraceSet] = {}
    data: tuple[PartitionSpec, FederatedData] | None = None
    out = []
    for g in groups:
        partition = g.runs[0].config.partition
        if data is None or data[0] != partition:
            data = (partition, load(partition))  # one partition in memory at a time
        out.append(count_group(g, data=data[1], traces=traces))
    return out
