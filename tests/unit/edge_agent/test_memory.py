"""The agent's memory: its figures (from /proc/self/status), kept and logged with every round; what a round keeps."""

import logging
import math
import platform
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.agent_memory import _ROUND_LINE, torch_floor
from edge_agent import memory
from edge_agent.agent import EdgeAgent, RoundDone
from edge_agent.config import AgentConfig, ParticipationConfig
from edge_agent.deadline import Estimates
from edge_agent.device_round import run_round
from edge_agent.memory import ProcessMemory
from flexfl.exchange import ModelDescription, RoundTerms
from flexfl.vocabulary import StopReason
from workloads.datasets import ArrayDataset
from workloads.models import build_model

linux_only = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc/self/status (Linux)")


@linux_only
def test_figures_are_the_kernels_and_consistent():
    m = ProcessMemory.now()
    # The anonymous part is part of what is resident; the high-water mark is at least what is resident now.
    assert 0 < m.anonymous_mib <= m.resident_mib <= m.peak_mib


def test_without_proc_only_the_resident_size_is_known(monkeypatch, tmp_path):
    monkeypatch.setattr(memory, "_STATUS", tmp_path / "no-such-file")
    m = ProcessMemory.now()
    assert m.resident_mib > 0
    assert math.isnan(m.anonymous_mib) and math.isnan(m.peak_mib)


@linux_only
def test_each_round_is_kept_and_logged_with_the_memory_the_benchmark_reads(caplog):
    agent = EdgeAgent(AgentConfig(device_id="pi-7", fleet_token="t"))  # no call is made
    fields = {"round_id": 3, "s": 4, "E": 5, "cap": 5, "why": StopReason.COMPUTE, "train_s": 0.25, "upload_s": 0.5,
              "outcome": "accepted", "lr": 0.1}
    try:
        with caplog.at_level(logging.INFO, logger="edge_agent.agent"):
            agent._round_done(partial(RoundDone, **fields))
    finally:
        agent.transport.close()
    kept = agent.rounds_done[-1]
    assert {k: getattr(kept, k) for k in fields} == fields
    assert 0 < kept.memory.anonymous_mib <= kept.memory.resident_mib <= kept.memory.peak_mib
    m = _ROUND_LINE.search(caplog.messages[-1])  # benchmarks/agent_memory.py parses the agent's log with it
    assert m is not None, caplog.messages[-1]
    assert (m["device"], m["round"], m["s"]) == ("pi-7", "3", "4")
    assert "s = 4/5 (compute)" in caplog.messages[-1]
    assert float(m["resident"]) == pytest.approx(kept.memory.resident_mib, abs=0.051)
    assert float(m["anonymous"]) == pytest.approx(kept.memory.anonymous_mib, abs=0.051)
    assert float(m["peak"]) == pytest.approx(kept.memory.peak_mib, abs=0.051)


def test_a_round_keeps_no_gradients_once_its_update_is_made():
    rng = np.random.default_rng(0)
    shard = ArrayDataset(x=rng.normal(size=(32, 60)).astype(np.float32), y=rng.integers(0, 10, 32))
    torch.manual_seed(0)
    model = build_model("logreg", in_features=60, num_classes=10)
    terms = RoundTerms(required_updates=3, learning_rate=0.1, batch_size=8, deadline_s=60.0,
                       model=ModelDescription(architecture="logreg", num_classes=10, in_features=60),
                       params={n: p.detach().clone() for n, p in model.named_parameters()}, seed=0, unit="step",
                       device_index=0, trace_sampling="iid", s_rule="round", proximal_mu=0.0)
    update = run_round(round_id=1, terms=terms, model=model, shard=shard, cap=3, deadline_at=math.inf,
                       estimates=Estimates(), margin_s=0.0, participation=ParticipationConfig(forced_updates=(3,)),
                       stopping=lambda: False)
    assert update.report.updates_completed == 3 and set(update.delta) == {n for n, _ in model.named_parameters()}
    assert all(p.grad is None for p in model.parameters())


def test_the_allocator_settings_apply_on_glibc():
    # In a child: the arena limit is process-wide and would stay set in the test process.
    code = "from edge_agent.memory import limit_arenas, release_freed; print(limit_arenas(), release_freed())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    glibc = platform.libc_ver()[0] == "glibc"
    assert out == [str(glibc), str(glibc)]


@linux_only
@pytest.mark.parametrize("dataset", ["mnist", "synthetic"])
def test_the_benchmarks_second_floor_trains_the_datasets_model(dataset):
    # benchmarks/agent_memory.py's "torch after training": its child builds the dataset's model and trains it.
    floor = torch_floor(dataset=dataset, steps=2)
    assert 0 < floor["RssAnon"] <= floor["VmRSS"] <= floor["VmHWM"]
