"""Loopback fixtures: a real gRPC coordinator on port 0 and real agents in threads."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.rules.config import RulesConfig
from coordinator.runtime import Coordinator
from edge_agent.agent import EdgeAgent
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import write_config
from workloads.partition_spec import PartitionSpec

TOKEN = "test-fleet-token"
_TABLES = {"partition": PartitionSpec, "rules": RulesConfig, "run": RunConfig}


def make_config(tmp_path, **values) -> CoordinatorConfig:
    """A loopback coordinator config; each keyword goes to the table that has that field.

    `seed` is the run's seed, `data_seed` the partition's.
    """
    flat = dict(dataset="synthetic", n_devices=4, total_samples=1600, rounds=3, required_updates=5, deadline_s=2.0,
                min_devices=3)
    flat.update(values)
    tables: dict[str, dict] = {name: {} for name in _TABLES}
    for key, value in flat.items():
        if key == "data_seed":
            tables["partition"]["seed"] = value
            continue
        table = "run" if key == "seed" else next(t for t, cls in _TABLES.items()
                                                 if key in {f.name for f in fields(cls)})
        tables[table][key] = value
    return CoordinatorConfig(
        server=ServerConfig(listen="127.0.0.1:0", fleet_token=TOKEN, pull_wait_s=0.5),
        partition=PartitionSpec(**tables["partition"]), rules=RulesConfig(**tables["rules"]),
        run=RunConfig(**tables["run"]), output=OutputConfig(dir=str(tmp_path / "coord")),
    )


class Fleet:
    """A coordinator and its agents; everything is stopped and joined on close()."""

    def __init__(self, cfg: CoordinatorConfig, *, resume: bool = False) -> None:
        self.cfg = cfg
        self.coordinator = Coordinator(cfg, resume=resume)
        self.port = self.coordinator.start()
        self.agents: dict[str, tuple[EdgeAgent, threading.Thread]] = {}

    def agent_config(self, index: int, **kw) -> AgentConfig:
        return AgentConfig(
            coordinator=f"127.0.0.1:{self.port}", device_id=kw.pop("device_id", f"dev-{index}"), shard_index=index,
            fleet_token=kw.pop("token", TOKEN), pull_wait_s=0.5, backoff_initial_s=0.1, backoff_max_s=0.5,
            participation=kw.pop("participation", ParticipationConfig()), **kw,
        )

    def start_agent(self, index: int, *, before_run=None, **kw) -> EdgeAgent:
        """Run agent `index` in a thread; `before_run(agent)` may set its state first."""
        cfg = self.agent_config(index, **kw)
        agent = EdgeAgent(cfg)
        if before_run is not None:
            before_run(agent)
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
    """make_config bound to this test's tmp_path: live_config(**fields)."""
    return lambda **values: make_config(tmp_path, **values)


def with_server(cfg: CoordinatorConfig, **server) -> CoordinatorConfig:
    return replace(cfg, server=replace(cfg.server, **server))


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coordinator_toml(tmp_path: Path, port: int, **values) -> Path:
    """A coordinator config file for a `flexfl coordinator` process on `port` with a token file, output in out/.

    Keywords go to make_config (defaults here: 3 devices, all needed to start, 3 s deadline).
    """
    (tmp_path / "token").write_text(TOKEN)
    cfg = make_config(tmp_path, **{"n_devices": 3, "deadline_s": 3.0, "min_devices": 3, **values})
    cfg = replace(cfg, server=replace(cfg.server, listen=f"127.0.0.1:{port}", fleet_token="",
                                      fleet_token_file=str(tmp_path / "token")),
                  output=replace(cfg.output, dir=str(tmp_path / "out")))
    return write_config(tmp_path / "coordinator.toml", cfg)


def flexfl_process(*args: str, log: Path | None = None) -> subprocess.Popen:
    """`flexfl ARGS` as a process; output to `log`, or to a pipe read with communicate()."""
    out = open(log, "w") if log is not None else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                            text=True)


@pytest.fixture
def procs():
    """Processes a test started (append them): killed if still running when the test ends."""
    running: list[subprocess.Popen] = []
    yield running
    for p in running:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


@pytest.fixture
def agents(fleet_factory, live_config):
    """agents(port, index, **kw): a thread agent (EdgeAgent) of a `flexfl coordinator` process on `port`.

    fleet_factory's in-process coordinator only lends its agent configs (it waits for 99
    devices and never starts); keywords go to Fleet.agent_config.
    """
    helper = fleet_factory(live_config(rounds=1, n_devices=3, min_devices=99))

    def start(port: int, index: int, **kw) -> EdgeAgent:
        helper.port = port
        return helper.start_agent(index, **kw)

    return start


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Path:
    """A test CA (ca.pem), a server certificate for localhost, client certificates CN=dev-0..2, one without a CN
    (no-cn); each NAME.pem with NAME.key. Tests that use it skip without openssl (their pytestmark)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=flexfl-test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    # One client certificate per device (CN = device id), and one whose subject has no CN.
    made = [("server", "/CN=server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            *((f"dev-{i}", f"/CN=dev-{i}", "extendedKeyUsage=clientAuth") for i in range(3)),
            ("no-cn", "/O=flexfl-test", "extendedKeyUsage=clientAuth")]
    for name, subject, ext in made:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    return d
