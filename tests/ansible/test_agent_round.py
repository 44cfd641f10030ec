"""The provisioned agent trains real MNIST rounds against a coordinator on this machine, and (amd64) a
round of the plug-in package that provisioning installed.

The agent runs inside the provisioned target the way its systemd unit would run it (the
unit's user, group, working directory, environment and ExecStart, so the config the role
rendered), and dials a coordinator started in this process on loopback with the rendered
coordinator.toml: mutual TLS with the certificates the role pushed, the fleet token, the
partition and training settings. The changes are the ones a test needs: a free port
instead of the fixed one, two rounds with a deadline the emulated agent can meet, and a
pause before round 1 to read the idle agent's memory.

On the arm64 target every arm64 instruction runs under qemu-user, so the time per local
update printed here is an emulation figure, not a Pi's; the resident memory read from
/proc/<pid>/status is the qemu process's, i.e. the guest's memory plus qemu's own
(translated code, its heap). A bare Python and a bare `import torch` beside it are
measured the same way, so the differences are what the agent adds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # FlexFL's own modules load in the tests only: test_lint.py's venv may lack FlexFL
    import torch
    from conftest import Target

    from coordinator.config import CoordinatorConfig
    from coordinator.rules.round_record import RoundRecord
    from coordinator.runtime import Coordinator

pytestmark = pytest.mark.provision

AGENT_UNIT = "/etc/systemd/system/flexfl-agent.service"
# Round 1's updates include one-off costs (first use of autograd's code paths, and under
# qemu their first translation); round 2 shows the steady pace.
ROUNDS = 2
# From the agent's receipt of the model: room for E updates under emulation.
ROUND_DEADLINE_S = 600.0
# Round 1 waits this long after the join, so the idle agent's memory can be read.
IDLE_AFTER_JOIN_S = 8.0
# Start to join: importing torch and parsing MNIST's CSVs under qemu take minutes.
JOIN_TIMEOUT_S = 1800.0
MIB = 1024 * 1024


def unit_service(target: Target, unit: str) -> dict[str, list[str]]:
    """The [Service] settings of a rendered unit; a repeated key (Environment=) keeps every value."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in target.path(unit).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def as_the_unit(target: Target, unit: str, argv: list[str] | None = None) -> list[str]:
    """A command line that runs the unit's ExecStart (or argv) in the target as the unit would run it."""
    service = unit_service(target, unit)
    uid, gid = target.uid(service["User"][-1]), target.gid(service["Group"][-1])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update(entry.split("=", 1) for entry in service.get("Environment", []))
    command = argv if argv is not None else shlex.split(service["ExecStart"][-1])
    return ["chroot", f"--userspec={uid}:{gid}", f"--groups={gid}", str(target.root),
            "/usr/bin/env", "-i", f"--chdir={service['WorkingDirectory'][-1]}",
            *(f"{k}={v}" for k, v in env.items()), *command]


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak resident) of a live process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / MIB
    return fields


def wait_until(condition: Callable[[], bool], *, process: subprocess.Popen, timeout_s: float, what: str,
               log: Path) -> float:
    """Seconds until condition() holds; fails when the process exits first or time runs out."""
    started = time.monotonic()
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the agent exited with {process.returncode} before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"no {what} after {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    return time.monotonic() - started


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def bare_python(target: Target, *, imports: str) -> dict[str, float]:
    """Memory of the target's Python after importing `imports` (or nothing), run as the agent's unit."""
    code = f"import sys{', ' + imports if imports else ''}; print('imported', flush=True); sys.stdin.read()"
    probe = subprocess.Popen(as_the_unit(target, AGENT_UNIT, ["/opt/flexfl/venv/bin/python", "-c", code]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = probe.stdout.readline()
        assert line.strip() == "imported", f"{code!r} failed in the target: {line}{probe.stderr.read()[-3000:]}"
        return memory_mib(probe.pid)
    finally:
        probe.stdin.close()
        probe.wait(timeout=60)


@dataclasses.dataclass
class AgentRounds:
    """What an agent run against a host coordinator leaves for the checks."""

    coordinator: Coordinator
    initial: dict[str, torch.Tensor]  # the global model before round 1
    join_s: float
    idle: dict[str, float]  # the agent's memory after the join
    peak: dict[str, float]  # its memory after the last round (VmHWM: the peak)


def agent_rounds(target: Target, cfg: CoordinatorConfig, *, log: Path) -> AgentRounds:
    """Run cfg's rounds with a coordinator in this process and the target's agent, started as its unit starts it."""
    from coordinator.runtime import Coordinator

    device = str(target.inventory["edge_agent_device_id"])
    coordinator = Coordinator(cfg)
    port = coordinator.start()
    agent: subprocess.Popen | None = None
    try:
        initial = {name: value.clone() for name, value in coordinator.engine.params.items()}
        # The rendered trace ("traces/paper:T50") is read relative to /etc/flexfl, where no role
        # puts a trace set: the agent would stop at start. The round runs without a trace.
        command = [*as_the_unit(target, AGENT_UNIT), "--coordinator", f"127.0.0.1:{port}", "--trace", ""]
        with open(log, "w") as log_file:
            agent = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        join_s = wait_until(lambda: coordinator.engine.registry.get(device) is not None, process=agent,
                            timeout_s=JOIN_TIMEOUT_S, what="join", log=log)
        time.sleep(cfg.run.start_grace_s / 2)
        assert agent.poll() is None, f"the agent exited after joining:\n{log.read_text()[-4000:]}"
        idle = memory_mib(agent.pid)
        peak: dict[str, float] = {}

        def round_closed() -> bool:
            if agent.poll() is None:
                peak.update(memory_mib(agent.pid))  # VmHWM only grows: the last reading is the peak
            return coordinator.engine.completed_round >= cfg.run.rounds

        wait_until(round_closed, process=agent, timeout_s=cfg.run.rounds * (cfg.run.deadline_s + 60),
                   what="the last round", log=log)
        assert coordinator.wait(timeout=120), "the coordinator did not finish after its last round"
        # The coordinator answers the agent's next pull with FINISHED. A provisioned agent serves run after run
        # (edge_agent_serve_runs): it stays, waiting for the coordinator's next run (wait_until fails if it exits).
        wait_until(lambda: "waiting for the coordinator's next run" in log.read_text(), process=agent,
                   timeout_s=300, what="waiting for the next run", log=log)
    finally:
        if agent is not None:
            stop(agent)
        coordinator.stop()
        coordinator.wait(timeout=60)
    return AgentRounds(coordinator, initial, join_s, idle, peak)


def host_coordinator_config(target: Target, out: Path, *, rounds: int,
                            **tables: dict[str, object]) -> CoordinatorConfig:
    """The rendered coordinator.toml with its token and TLS files read through the target's root, a free
    loopback port, `rounds` rounds with a deadline the agent meets, and `tables`' keys changed."""
    from coordinator.config import load_coordinator_config

    rendered = target.path("/etc/flexfl/coordinator.toml")
    server = tomllib.loads(rendered.read_text())["server"]
    target_files = {key: str(target.path(value)) for key, value in server.items()
                    if isinstance(value, str) and value.startswith("/")}
    return load_coordinator_config(rendered, overrides={
        **tables,
        "server": {**target_files, "listen": "127.0.0.1:0"},
        "run": {"rounds": rounds, "deadline_s": ROUND_DEADLINE_S, "start_grace_s": IDLE_AFTER_JOIN_S},
        "output": {"dir": str(out)},
    })


def check_rounds_trained(target: Target, run: AgentRounds, out: Path, *, rounds: int) -> list[RoundRecord]:
    """Each round closed with the agent's answer in (s > 0, coefficient > 0, nothing rejected); the model moved."""
    import torch

    from coordinator.metrics import read_metrics

    device = str(target.inventory["edge_agent_device_id"])
    hardware = run.coordinator.engine.registry.get(device).hardware
    assert hardware["machine"] == target.platform.machine, hardware
    rows = read_metrics(out / "metrics.jsonl")
    assert [row.round for row in rows] == list(range(1, rounds + 1)), rows
    for row in rows:
        assert row.live is not None and row.live.close_reason == "all answered", row
        assert row.s[device] > 0 and row.coefficients[device] > 0, row
        assert row.live.bytes_in[device] > 0 and not row.live.rejected, row
    final = run.coordinator.engine.params
    assert any(not torch.equal(run.initial[name], final[name]) for name in run.initial), \
        "the aggregated model did not change"
    assert all(torch.isfinite(value).all() for value in final.values())
    return rows


def test_agent_trains_rounds_against_a_host_coordinator(target: Target, provision_figures: dict[str, str]) -> None:
    arch = target.platform.arch
    where = "under qemu-user, not a Pi figure" if target.platform.emulated else "native"
    device = str(target.inventory["edge_agent_device_id"])
    python_memory = bare_python(target, imports="")
    torch_memory = bare_python(target, imports="torch")

    out = target.work / "host-coordinator"
    cfg = host_coordinator_config(target, out, rounds=ROUNDS)
    run = agent_rounds(target, cfg, log=target.logs / "agent-round.log")
    rows = check_rounds_trained(target, run, out, rounds=ROUNDS)

    per_update_s = [row.live.train_s[device] / row.s[device] for row in rows if row.live is not None]
    figures = {
        f"{arch}: time per local update, rounds 1..{ROUNDS} ({where})":
            " / ".join(f"{1000 * t:.1f} ms" for t in per_update_s)
            + f" (train_s / s, s = {rows[-1].s[device]}; MNIST MLP, batch {cfg.batch_size})",
        f"{arch}: agent start to join (torch import, MNIST, partition; {where})": f"{run.join_s:.1f} s",
        f"{arch}: agent RSS after join / VmHWM after the last round ({where})":
            f"{run.idle['VmRSS']:.0f} MiB / {run.peak.get('VmHWM', math.nan):.0f} MiB",
        f"{arch}: bare `import torch` RSS / VmHWM ({where})":
            f"{torch_memory['VmRSS']:.0f} MiB / {torch_memory['VmHWM']:.0f} MiB",
        f"{arch}: bare Python RSS ({where})": f"{python_memory['VmRSS']:.0f} MiB",
    }
    provision_figures.update(figures)
    measured = {"emulated": target.platform.emulated, "per_update_s": per_update_s, "join_s": run.join_s,
                "agent_rss_mib": run.idle["VmRSS"], "agent_hwm_mib": run.peak.get("VmHWM"),
                "torch_rss_mib": torch_memory["VmRSS"], "torch_hwm_mib": torch_memory["VmHWM"],
                "python_rss_mib": python_memory["VmRSS"], "rounds": [row.to_json() for row in rows]}
    (target.logs / "figures.json").write_text(json.dumps(measured, indent=2) + "\n")


# The starter's entry points (flexfl/app/starter/pyproject.toml) and what its live.toml trains with.
PLUGIN_NAMES = {"dataset": "blobs", "model": "tinynet", "strategy": "sqrt-c"}
PLUGIN_RULES = {"eta0": 0.5, "batch_size": 16}


def test_provisioned_plugin_package_trains_a_round(target: Target, monkeypatch: pytest.MonkeyPatch,
                                                   provision_timings: dict[str, float]) -> None:
    """The plug-in package (`flexfl new`'s, provisioned by flexfl_install_plugin_dir) reaches the agent: with
    no plugin_path in its config, the agent builds the model and the data its coordinator names by the
    package's entry points, trains and uploads a round."""
    if target.plugin is None:
        pytest.skip(f"no plug-in package is provisioned on {target.platform.arch} (Platform.with_plugin: the "
                    "amd64 run checks it)")
    agent_toml = tomllib.loads(target.path("/etc/flexfl/agent.toml").read_text())
    assert "plugin_path" not in agent_toml  # the package must come from the venv, by entry points
    located = target.run("/opt/flexfl/venv/bin/python", "-c", "import myfl; print(myfl.__file__)")
    assert located.returncode == 0 and located.stdout.startswith("/opt/flexfl/venv/lib/"), located

    # This process plays the coordinator host: it imports the plug-ins from the wheel the role built and
    # pushed (a wheel on sys.path is importable, and importlib.metadata reads its entry points).
    wheels = sorted((target.ansible_dir / ".build" / "plugin").glob("myfl-*.whl"))
    assert len(wheels) == 1, wheels
    monkeypatch.syspath_prepend(str(wheels[0]))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # myfl, imported from the wheel, leaves with it
    out = target.work / "plugin-coordinator"
    # A strategy given over the rendered file replaces its scheme (flexfl.config: EXCLUSIVE_KEYS).
    cfg = host_coordinator_config(target, out, rounds=1, partition={"dataset": PLUGIN_NAMES["dataset"]},
                                  rules={"model": PLUGIN_NAMES["model"],
                                         "strategy": PLUGIN_NAMES["strategy"], **PLUGIN_RULES})
    started = time.monotonic()
    run = agent_rounds(target, cfg, log=target.logs / "agent-plugin-round.log")
    provision_timings[f"{target.platform.arch}: plug-in round (agent start to the round's close)"] = \
        time.monotonic() - started
    (row,) = check_rounds_trained(target, run, out, rounds=1)
    # The global model is TinyNet on the blobs (16 features, 4 classes), which the agent's update fitted.
    shapes = {name: tuple(value.shape) for name, value in run.coordinator.engine.params.items()}
    assert shapes == {"hidden.weight": (32, 16), "hidden.bias": (32,), "out.weight": (4, 32), "out.bias": (4,)}
    assert row.rules is not None and row.rules["model"] == PLUGIN_NAMES["model"], row.rules
    assert row.rules["strategy"] == {"name": PLUGIN_NAMES["strategy"]} and 0.0 <= row.test_acc <= 1.0, row
