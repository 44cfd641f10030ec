"""The agent's memory figures: read from /proc/self/status, kept and logged with every round."""

import logging
import math
from pathlib import Path

import pytest

from benchmarks.agent_memory import _ROUND_LINE
from edge_agent import memory
from edge_agent.agent import EdgeAgent
from edge_agent.config import AgentConfig
from edge_agent.memory import ProcessMemory

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
    record = {"round": 3, "s": 4, "E": 5, "cap": 5, "train_s": 0.25, "upload_s": 0.5, "outcome": "accepted", "lr": 0.1}
    try:
        with caplog.at_level(logging.INFO, logger="edge_agent.agent"):
            agent._round_done(dict(record))
    finally:
        agent._channel.close()
    kept = agent.rounds_done[-1]
    assert {k: kept[k] for k in record} == record
    assert 0 < kept["anonymous_mib"] <= kept["resident_mib"] <= kept["peak_mib"]
    m = _ROUND_LINE.search(caplog.messages[-1])  # benchmarks/agent_memory.py parses the agent's log with it
    assert m is not None, caplog.messages[-1]
    assert (m["device"], m["round"], m["s"]) == ("pi-7", "3", "4")
    assert float(m["resident"]) == pytest.approx(kept["resident_mib"], abs=0.05)
    assert float(m["anonymous"]) == pytest.approx(kept["anonymous_mib"], abs=0.05)
    assert float(m["peak"]) == pytest.approx(kept["peak_mib"], abs=0.05)
