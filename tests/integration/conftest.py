"""Loopback fixtures: a real gRPC coordinator on port 0 and real agents in threads."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from coordinator.config import CoordinatorConfig, ServerConfig, TrainingConfig, OutputConfig
from coordinator.runtime import Coordinator
from edge_agent.agent import EdgeAgent, load_shard
from edge_agent.config import AgentConfig, DataConfig, ParticipationConfig

TOKEN = "test-fleet-token"


def make_config(tmp_path, **training) -> CoordinatorConfig:
    t = dict(dataset="synthetic", iid=False, n_devices=4, data_seed=0, total_samples=1600, rounds=3,
             required_updates=5, deadline_s=2.0, min_devices=3, scheme="C")
    t.update(training)
    return CoordinatorConfig(
        server=ServerConfig(listen="127.0.0.1:0", fleet_token=TOKEN, pull_wait_s=0.5),
        training=TrainingConfig(**t), output=OutputConfig(dir=str(tmp_path / "coord")),
    ).validate()


class Fleet:
    """A coordinator and its agents; everything is stopped and joined on close()."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.coordinator = Coordinator(cfg)
        self.port = self.coordinator.start()
        self.agents: dict[str, tuple[EdgeAgent, threading.Thread]] = {}

    def agent_config(self, index: int, **kw) -> AgentConfig:
        t = self.cfg.training
        part = kw.pop("participation", ParticipationConfig())
        return AgentConfig(
            coordinator=f"127.0.0.1:{self.port}", device_id=kw.pop("device_id", f"dev-{index}"), fleet_token=kw.pop("token", TOKEN),
            pull_wait_s=0.5, backoff_initial_s=0.1, backoff_max_s=0.5,
            data=DataConfig(dataset=t.dataset, iid=t.iid, alpha=t.alpha, beta=t.beta, n_devices=t.n_devices,
                            data_seed=t.data_seed, total_samples=t.total_samples, shard_index=index),
            participation=part, **kw,
        )

    def start_agent(self, index: int, **kw) -> EdgeAgent:
        cfg = self.agent_config(index, **kw)
        agent = EdgeAgent(cfg, load_shard(cfg))
        thread = threading.Thread(target=agent.run, name=cfg.device_id, daemon=True)
        thread.start()
        self.agents[cfg.device_id] = (agent, thread)
        return agent

    def close(self) -> None:
        for agent, _ in self.agents.values():
            agent.stop(announce=False)
        self.coordinator.stop()
        self.coordinator.wait(timeout=10)
        for _, thread in self.agents.values():
            thread.join(timeout=10)


@pytest.fixture
def fleet_factory():
    fleets: list[Fleet] = []

    def make(cfg: CoordinatorConfig) -> Fleet:
        fleet = Fleet(cfg)
        fleets.append(fleet)
        return fleet

    yield make
    for f in fleets:
        f.close()


@pytest.fixture
def live_config(tmp_path):
    """make_config bound to this test's tmp_path: live_config(**training_overrides)."""
    return lambda **training: make_config(tmp_path, **training)


def _wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def wait_for():
    """wait_for(predicate, timeout=30, what=...) polls until true or fails the test."""
    return _wait_for
