"""Provision a real Debian bookworm root with testbed.yml, then check it from inside.

The `target` fixture (conftest.py) debootstraps the root, applies testbed.yml twice
through the chroot connection and keeps the target for these checks; it is built once
per platform: amd64, and arm64 under qemu-user-static (marked `arm64`). Needs root,
debootstrap (or a cached root) and ansible (make setup-ansible); arm64 also needs
qemu-aarch64 registered with binfmt_misc. Runs only when selected: `make test-provision`
(amd64), `make test-provision-arm64`, or `pytest -m provision tests/ansible` for both.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Target

pytestmark = pytest.mark.provision

REPO = Path(__file__).resolve().parents[2]
HOST = "bookworm-target"
UNITS = ("flexfl-coordinator.service", "flexfl-agent.service", "flexfl-loadgen.service")


# ---- the checks


def test_first_run_provisions_the_target(target: Target) -> None:
    recap = target.first.recap()
    assert recap["failed"] == 0 and recap["unreachable"] == 0
    assert recap["changed"] > 0


def test_second_run_changes_nothing(target: Target) -> None:
    assert target.second.returncode == 0, target.second.output[-6000:]
    changed = [line for line in target.second.output.splitlines() if line.startswith("changed:")]
    assert target.second.recap()["changed"] == 0, changed


def test_venv_runs_flexfl(target: Target) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    proc = target.run("/opt/flexfl/venv/bin/flexfl", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"flexfl {version}"


def test_torch_is_the_pushed_wheel(target: Target) -> None:
    wheel_version = target.torch_wheel.name.split("-")[1]
    proc = target.run("/opt/flexfl/venv/bin/python", "-c",
                      "import platform, torch; print(torch.__version__, platform.machine(), torch.version.cuda)")
    assert proc.returncode == 0, proc.stderr
    version, machine, cuda = proc.stdout.split()
    # PyPI's aarch64 wheel is named 2.10.0 and says 2.10.0+cpu; the local amd64 one has +cpu in both.
    assert version.split("+")[0] == wheel_version.split("+")[0]
    # The target's own architecture, and a CPU build (no CUDA), as a Pi needs.
    assert (machine, cuda) == (target.platform.machine, "None")


def test_units_are_enabled_and_pass_systemd_analyze_verify(target: Target) -> None:
    for unit in UNITS:
        assert target.path(f"/etc/systemd/system/{unit}").is_file()
        link = target.path(f"/etc/systemd/system/multi-user.target.wants/{unit}")
        assert link.is_symlink() and os.readlink(link) == f"/etc/systemd/system/{unit}"
    proc = target.run("systemd-analyze", "verify", *(f"/etc/systemd/system/{u}" for u in UNITS))
    # verify exits 0 on some warnings (unknown keys): any output counts as a failure.
    assert proc.returncode == 0 and (proc.stdout + proc.stderr).strip() == "", proc.stdout + proc.stderr


def unit_settings(target: Target, unit: str) -> dict[str, str]:
    lines = target.path(f"/etc/systemd/system/{unit}").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_services_run_as_the_service_user_with_least_privilege(target: Target) -> None:
    for unit in UNITS:
        assert unit_settings(target, unit)["User"] == "flexfl"
    loadgen = unit_settings(target, "flexfl-loadgen.service")
    # A negative nice (edge_agent_loadgen_nice: -5) adds CAP_SYS_NICE to tc's CAP_NET_ADMIN.
    assert loadgen["AmbientCapabilities"].split() == ["CAP_NET_ADMIN", "CAP_SYS_NICE"]
    assert loadgen["CapabilityBoundingSet"] == loadgen["AmbientCapabilities"]
    assert "--iface lo" in loadgen["ExecStart"] and "--bind tcp://0.0.0.0:5601" in loadgen["ExecStart"]
    for unit in ("flexfl-agent.service", "flexfl-coordinator.service"):
        settings = unit_settings(target, unit)
        assert settings["CapabilityBoundingSet"] == "" and settings["NoNewPrivileges"] == "yes"
    agent_exec = unit_settings(target, "flexfl-agent.service")["ExecStart"]
    assert agent_exec == "/opt/flexfl/venv/bin/flexfl agent --config /etc/flexfl/agent.toml"


def test_configs_hold_the_inventory_values(target: Target) -> None:
    agent = tomllib.loads(target.path("/etc/flexfl/agent.toml").read_text())
    coordinator = tomllib.loads(target.path("/etc/flexfl/coordinator.toml").read_text())
    assert agent["coordinator"] == "127.0.0.1:50077"
    assert agent["device_id"] == target.inventory["edge_agent_device_id"]
    assert agent["fleet_token_file"] == coordinator["server"]["fleet_token_file"] == "/etc/flexfl/fleet_token"
    assert (agent["tls_ca"], agent["tls_client_cert"], agent["tls_client_key"]) == (
        "/etc/flexfl/tls/ca.pem", "/etc/flexfl/tls/agent.pem", "/etc/flexfl/tls/agent.key")
    assert agent["participation"]["trace"] == target.config["edge_agent_participation_trace"] == "traces/paper:T50"
    assert agent["shard_index"] == target.inventory["edge_agent_shard_index"]
    assert "partition" not in agent  # agents receive the partition from the coordinator
    server = coordinator["server"]
    assert server["listen"] == "0.0.0.0:50077"
    assert (server["tls_cert"], server["tls_key"], server["tls_client_ca"]) == (
        "/etc/flexfl/tls/coordinator.pem", "/etc/flexfl/tls/coordinator.key", "/etc/flexfl/tls/ca.pem")
    assert coordinator["partition"] == {"dataset": target.config["common_dataset"], "iid": True,
                                        "n_devices": 4, "seed": 5}
    assert (coordinator["run"]["rounds"], coordinator["run"]["deadline_s"],
            coordinator["rules"]["scheme"]) == (7, 12.5, "B")
    assert coordinator["output"]["dir"] == "/var/lib/flexfl/coordinator"
    # Every key the templates write is a field of the config dataclasses, with the right type.
    from coordinator.config import load_coordinator_config
    from edge_agent.config import load_agent_config

    for name, load in (("agent.toml", load_agent_config), ("coordinator.toml", load_coordinator_config)):
        load(target.path(f"/etc/flexfl/{name}"))


def key_paths(table: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in table.items():
        paths |= key_paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return paths


def mode_owner(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid


def test_credentials_are_pushed_with_tight_permissions(target: Target) -> None:
    flexfl = target.gid("flexfl")
    for secret in ("/etc/flexfl/fleet_token", "/etc/flexfl/tls/agent.key", "/etc/flexfl/tls/coordinator.key",
                   "/etc/flexfl/agent.toml", "/etc/flexfl/coordinator.toml"):
        assert mode_owner(target.path(secret)) == ("0o640", 0, flexfl), secret
    for folder in ("/etc/flexfl", "/etc/flexfl/tls"):
        assert mode_owner(target.path(folder)) == ("0o750", 0, flexfl), folder
    controller = target.ansible_dir / "credentials"
    assert target.path("/etc/flexfl/fleet_token").read_text() == (controller / "fleet_token").read_text()
    assert len((controller / "fleet_token").read_text().strip()) == 48
    for key in [controller / "fleet_token", *controller.glob("**/*.key")]:
        assert oct(stat.S_IMODE(key.stat().st_mode)) == "0o600", key


def openssl(*args: str) -> str:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed on the controller")
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_certificates_chain_to_the_fleet_ca(target: Target) -> None:
    tls = target.path("/etc/flexfl/tls")
    for cert in ("coordinator.pem", "agent.pem"):
        assert openssl("verify", "-CAfile", str(tls / "ca.pem"), str(tls / cert)).strip().endswith(": OK")
    assert "IP Address:127.0.0.1" in openssl("x509", "-noout", "-ext", "subjectAltName", "-in",
                                             str(tls / "coordinator.pem"))
    assert "CN = pi-test-07" in openssl("x509", "-noout", "-subject", "-in", str(tls / "agent.pem"))
    assert "TLS Web Client Authentication" in openssl("x509", "-noout", "-ext", "extendedKeyUsage",
                                                      "-in", str(tls / "agent.pem"))


def test_service_user_and_code_ownership(target: Target) -> None:
    passwd = {line.split(":")[0]: line.split(":") for line in target.path("/etc/passwd").read_text().splitlines()}
    assert passwd["flexfl"][5:] == ["/var/lib/flexfl", "/usr/sbin/nologin"]
    # The services may run the code, not change it.
    st = target.path("/opt/flexfl/venv/bin/flexfl").stat()
    assert st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    assert mode_owner(target.path("/var/lib/flexfl"))[1:] == (int(passwd["flexfl"][2]), target.gid("flexfl"))


def test_time_sync_is_installed_enabled_and_configured(target: Target) -> None:
    assert target.path("/lib/systemd/systemd-timesyncd").is_file()
    assert target.path("/etc/systemd/system/sysinit.target.wants/systemd-timesyncd.service").is_symlink()
    assert "NTP=ntp.flexfl-test.invalid" in target.path("/etc/systemd/timesyncd.conf.d/flexfl.conf").read_text()


def test_status_playbook_reports_version_and_services(target: Target) -> None:
    run = target.run_playbook("status.yml", "status.log")
    assert run.returncode == 0, run.output[-4000:]
    assert run.recap()["changed"] == 0
    assert "flexfl 0.1.0" in run.output
    for unit in ("flexfl-coordinator", "flexfl-agent", "flexfl-loadgen"):
        assert f"{unit} enabled/systemd not running" in run.output


def test_fetch_results_brings_traces_and_metrics_back(target: Target) -> None:
    recorded = {"traces/recorded-set/manifest.json": '{"traces": ["T1"]}\n',
                "traces/recorded-set/T1.csv": "round,s\n1,20\n",
                "coordinator/metrics.jsonl": '{"round": 1, "accuracy": 0.5}\n'}
    for relative, content in recorded.items():
        path = target.path(f"/var/lib/flexfl/{relative}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    first = target.run_playbook("fetch_results.yml", "fetch-first.log")
    assert first.returncode == 0, first.output[-4000:]
    for relative, content in recorded.items():
        assert (target.ansible_dir / "fetched" / HOST / relative).read_text() == content
    again = target.run_playbook("fetch_results.yml", "fetch-second.log")
    assert again.returncode == 0 and again.recap()["changed"] == 0


def test_code_change_reaches_the_target(target: Target) -> None:
    # Same version number, new code: the role must notice the new wheel and reinstall it; the plug-in's too.
    marker = f"# provision test {os.getpid()}"
    changed = {"flexfl": target.checkout / "flexfl" / "__init__.py"}
    if target.plugin is not None:
        changed["myfl"] = target.plugin / "myfl" / "__init__.py"
    for source in changed.values():
        source.write_text(source.read_text() + marker + "\n")
    run = target.run_playbook("testbed.yml", "testbed-upgrade.log")
    assert run.returncode == 0, run.output[-6000:]
    reinstalls = ["FlexFL"] + (["plug-in"] if target.plugin is not None else [])
    for what in reinstalls:
        assert re.search(rf"TASK \[flexfl_install : Install the pushed {what} wheel in place of the installed one\]"
                         r".*\n(.*\n)?changed:", run.output), (what, run.output[-6000:])
    for module in changed:
        proc = target.run("/opt/flexfl/venv/bin/python", "-c",
                          f"import {module}, pathlib; print(pathlib.Path({module}.__file__).read_text())")
        assert proc.returncode == 0 and marker in proc.stdout, (module, proc.stderr)


def test_device_identity_and_loadgen_keys(target: Target) -> None:
    """The client certificate's CN is the agent's device id (the coordinator's check), and the
    loadgen daemon, started from the pushed keys, answers the controller's key and no other."""
    from loadgen.client import LoadgenClient
    from loadgen.errors import DaemonError
    from loadgen.keys import client_auth, write_keypair

    device_id = target.inventory["edge_agent_device_id"]
    subject = openssl("x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in",
                      str(target.path("/etc/flexfl/tls/agent.pem")))
    assert subject.strip() == f"subject=CN={device_id}"
    assert tomllib.loads(target.path("/etc/flexfl/agent.toml").read_text())["device_id"] == device_id

    flexfl = target.gid("flexfl")
    keys = target.path("/etc/flexfl/loadgen")
    controller = target.ansible_dir / "credentials" / "loadgen"
    assert mode_owner(keys) == mode_owner(keys / "clients") == ("0o750", 0, flexfl)
    assert mode_owner(keys / "server.key_secret") == ("0o640", 0, flexfl)
    assert (keys / "server.key_secret").read_bytes() == (controller / "servers" / f"{HOST}.key_secret").read_bytes()
    assert sorted(p.name for p in (keys / "clients").iterdir()) == ["controller.key"]
    assert b"secret-key" not in (keys / "clients" / "controller.key").read_bytes()
    assert "--keys /etc/flexfl/loadgen" in unit_settings(target, "flexfl-loadgen.service")["ExecStart"]

    # The target's own daemon, on a loopback port the chroot shares with this machine.
    daemon = target.popen("/opt/flexfl/venv/bin/flexfl", "loadgen", "serve", "--bind", "tcp://127.0.0.1:*",
                          "--keys", "/etc/flexfl/loadgen", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listening = daemon.stdout.readline().split()
        assert listening[:1] == ["listening"], daemon.stderr.read() if daemon.poll() is not None else listening
        endpoint = listening[1]
        auth = client_auth(controller / "controller.key_secret", {endpoint: controller / "servers" / f"{HOST}.key"})
        with LoadgenClient(endpoint, timeout_s=30, auth=auth) as client:
            assert client.ping()["pong"] is True
        write_keypair(target.ansible_dir / "stranger", "stranger")
        stranger = client_auth(target.ansible_dir / "stranger" / "stranger.key_secret",
                               {endpoint: controller / "servers" / f"{HOST}.key"})
        with LoadgenClient(endpoint, timeout_s=2, auth=stranger) as client, pytest.raises(DaemonError) as refused:
            client.ping()
        assert "authentication failed: the daemon refused this client's CURVE key" in str(refused.value)
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
