"""The emulated fleet: N edge devices on one Linux machine (root), for tests, `make traces`, `live --emulate`.

Layout for prefix P and subnet S (a /24 given by its first three octets, e.g. "10.77.0"):

    root namespace   bridge P+"br" with S.1/24: the coordinator's fixed address
                     veth end P+"h<i>" of device i, a port of the bridge;
                     its egress is the device's download (optional tbf)
    netns P-dev<i>   veth end P+"d<i>" with S.(10+i)/24, default route via S.1;
                     its egress is the device's upload (tbf, set here or by the loadgen daemon)
    cgroup v1 cpu    /sys/fs/cgroup/cpu/P (cpu.shares: the fleet weighs as much as N ordinary
                     processes) / dev<i> (cfs quota: the device's compute budget, in CPUs)
    state            /run/flexfl/fleet-P/state.json, process logs and the loadgen daemons'
                     ipc:// sockets beside it; keys/ holds this run's CURVE keys (a
                     "controller" client keypair, a server keypair per device), so the
                     daemons authenticate their clients as on real hosts

A process runs "inside" device i when it is in the device's cgroup (its pid is written to
cgroup.procs before exec) and network namespace (setns before exec); everything it starts
inherits both. The mount namespace is left alone (unlike `ip netns exec`, which remounts
/sys and would hide the cgroup a process wants to read its quota from).

`down` works from names, not only from the state file: it finds every namespace, link and
cgroup of prefix P by pattern, so a crashed run can always be cleaned up, and running it
twice is fine. Everything here needs root.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from flexfl.files import atomic_file
from loadgen import bandwidth, netns
from loadgen import keys as curve
from loadgen._run import run
from loadgen.cgroup import (
    CGROUP_V1_CPU_ROOT,
    MIN_CFS_QUOTA_US,
    cfs_quota_us,
    cgroup_pids,
    read_quota_cpus,
    remove_cgroup,
    terminate,
    write_control,
)
from loadgen.errors import LoadgenError

log = logging.getLogger(__name__)

CGROUP_CPU_ROOT = CGROUP_V1_CPU_ROOT
STATE_ROOT = Path("/run/flexfl")
DEFAULT_PREFIX = "ffl"
DEFAULT_SUBNET = "10.77.0"
DEFAULT_CFS_PERIOD_US = 10_000  # short periods: a round's few hundred ms of work is throttled evenly
FIRST_HOST = 10  # device i gets S.(FIRST_HOST + i)
CONTROLLER_KEY = "controller"  # the fleet's one client keypair, in <state>/keys/
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{1,7}")
_SUBNET_RE = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})")


class FleetError(LoadgenError):
    """The emulated fleet cannot be set up, used or removed (the message says what to do)."""


@dataclass(frozen=True)
class DeviceSpec:
    """One emulated device's budget: CPUs (None: no quota) and link rates in kbit/s (None: unshaped)."""

    cpu_quota: float | None = 0.25
    up_kbit: int | None = None  # tbf on the device's egress: its upload
    down_kbit: int | None = None  # tbf on the coordinator side's egress towards it: its download


@dataclass(frozen=True)
class FleetSpec:
    devices: tuple[DeviceSpec, ...]
    prefix: str = DEFAULT_PREFIX
    subnet: str = DEFAULT_SUBNET
    cfs_period_us: int = DEFAULT_CFS_PERIOD_US
    cpu_shares: int | None = None  # the fleet cgroup's weight; None: 1024 per device
    state_root: Path = STATE_ROOT
    # stress-ng method for the devices' competitors (None: stress-ng's default mix; see start_loadgen)
    stress_ng_method: str | None = "int8"

    def validate(self) -> FleetSpec:
        check_prefix(self.prefix)
        m = _SUBNET_RE.fullmatch(self.subnet)
        if not m or any(int(x) > 255 for x in m.groups()):
            raise FleetError(f"subnet must be the first three octets of a /24, e.g. 10.77.0; got {self.subnet!r}")
        if not 1 <= len(self.devices) <= 255 - FIRST_HOST:
            raise FleetError(f"a fleet has 1..{255 - FIRST_HOST} devices, got {len(self.devices)}")
        if not 1000 <= self.cfs_period_us <= 1_000_000:
            raise FleetError(f"cfs_period_us must be in 1000..1000000, got {self.cfs_period_us}")
        for i, d in enumerate(self.devices):
            if d.cpu_quota is not None and not d.cpu_quota >= least_quota_cpus(self.cfs_period_us):
                raise FleetError(f"device {i}: cpu_quota {d.cpu_quota} is below the kernel's minimum "
                                 f"({least_quota_cpus(self.cfs_period_us):g} CPU: 1 ms per "
                                 f"{self.cfs_period_us / 1000:g} ms period)")
            for name in ("up_kbit", "down_kbit"):
                v = getattr(d, name)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise FleetError(f"device {i}: {name} must be a positive integer or None, got {v!r}")
        return self


@dataclass(frozen=True)
class Device:
    """Where device `index` lives; all names derive from the fleet's prefix."""

    index: int
    netns: str
    iface: str  # inside the netns
    host_iface: str  # root-namespace end, a bridge port
    address: str  # without the /24
    cgroup: str  # absolute path of its cpu cgroup
    loadgen_endpoint: str
    spec: DeviceSpec = field(default_factory=DeviceSpec)


def least_quota_cpus(cfs_period_us: int) -> float:
    """The smallest CPU quota the kernel takes at this period: 1 ms of CPU time per period (cpu.cfs_quota_us)."""
    return MIN_CFS_QUOTA_US / cfs_period_us


def check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise FleetError(f"fleet prefix must be 2-8 lowercase letters/digits starting with a letter, got {prefix!r}")


def require_root(what: str = "the emulated fleet") -> None:
    """Raise a FleetError saying why root is needed, unless running as root with cgroup v1 cpu."""
    if sys.platform != "linux":
        raise FleetError(f"{what} needs Linux (network namespaces, tc, cgroups)")
    if os.geteuid() != 0:
        raise FleetError(f"{what} needs root: network namespaces, veth links, tc qdiscs and cgroup CPU "
                         "quotas need CAP_NET_ADMIN/CAP_SYS_ADMIN; run it with sudo")
    if not (CGROUP_CPU_ROOT / "cpu.cfs_quota_us").exists():
        raise FleetError(f"{what} needs the cgroup v1 cpu controller at {CGROUP_CPU_ROOT} "
                         "(cpu.cfs_quota_us); cgroup v2-only hosts are not supported yet")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise FleetError(f"`{tool}` is not installed (apt-get install iproute2)")


def _names(prefix: str, subnet: str, state_dir: Path, i: int, spec: DeviceSpec) -> Device:
    return Device(index=i, netns=f"{prefix}-dev{i}", iface=f"{prefix}d{i}", host_iface=f"{prefix}h{i}",
                  address=f"{subnet}.{FIRST_HOST + i}", cgroup=str(CGROUP_CPU_ROOT / prefix / f"dev{i}"),
                  loadgen_endpoint=f"ipc://{state_dir}/dev{i}.loadgen", spec=spec)


def state_dir_of(prefix: str, state_root: Path = STATE_ROOT) -> Path:
    return Path(state_root) / f"fleet-{prefix}"


class EmulatedFleet:
    """A fleet that is up. Create with `up(spec)`, or `attach(prefix)` to one another process made."""

    def __init__(self, *, prefix: str, subnet: str, devices: list[Device], cfs_period_us: int,
                 state_dir: Path, processes: list[dict] | None = None, stress_ng_method: str | None = None) -> None:
        self.prefix = prefix
        self.stress_ng_method = stress_ng_method
        self.subnet = subnet
        self.devices = devices
        self.cfs_period_us = cfs_period_us
        self.state_dir = state_dir
        self.processes: list[dict] = processes or []  # {"device", "role", "pid", "argv", "log"}
        self._children: list[subprocess.Popen] = []

    # ---- lifecycle --------------------------------------------------------------------

    @classmethod
    def up(cls, spec: FleetSpec) -> EmulatedFleet:
        """Create every device; on any failure remove what was made and raise."""
        spec.validate()
        require_root()
        prefix = spec.prefix
        leftovers = find_leftovers(prefix)
        if any(leftovers.values()) or state_dir_of(prefix, spec.state_root).exists():
            raise FleetError(f"fleet '{prefix}' is already up or left over ({_describe(leftovers)}); "
                             f"run `flexfl fleet down --prefix {prefix}` first")
        _check_subnet_free(spec.subnet)
        state_dir = state_dir_of(prefix, spec.state_root)
        devices = [_names(prefix, spec.subnet, state_dir, i, d) for i, d in enumerate(spec.devices)]
        fleet = cls(prefix=prefix, subnet=spec.subnet, devices=devices, cfs_period_us=spec.cfs_period_us,
                    stress_ng_method=spec.stress_ng_method,
                    state_dir=state_dir)
        try:
            state_dir.mkdir(parents=True, exist_ok=False)
            fleet._save()  # first: a crash from here on leaves a state file pointing at the mess
            fleet._make_loadgen_keys()
            bridge = f"{prefix}br"
            run(["ip", "link", "add", bridge, "type", "bridge"], error=FleetError)
            run(["ip", "addr", "add", f"{spec.subnet}.1/24", "dev", bridge], error=FleetError)
            run(["ip", "link", "set", bridge, "up"], error=FleetError)
            parent = CGROUP_CPU_ROOT / prefix
            parent.mkdir()
            _write(parent / "cpu.shares", spec.cpu_shares or 1024 * len(devices))
            for d in devices:
                netns.create_netns(d.netns)
                netns.add_veth(d.host_iface, d.iface, peer_netns=d.netns, peer_address=f"{d.address}/24")
                run(["ip", "link", "set", d.host_iface, "master", bridge], error=FleetError)
                netns.set_default_route(f"{spec.subnet}.1", netns=d.netns)
                Path(d.cgroup).mkdir()
                _write(Path(d.cgroup) / "cpu.cfs_period_us", spec.cfs_period_us)
                fleet.set_cpu_quota(d.index, d.spec.cpu_quota)
                fleet.set_upload(d.index, d.spec.up_kbit)
                fleet.set_download(d.index, d.spec.down_kbit)
            fleet._save()
        except BaseException:
            log.error("fleet '%s' setup failed; removing what was made", prefix)
            down(prefix, state_root=spec.state_root)
            raise
        log.info("fleet '%s' up: %d devices on %s.0/24, coordinator at %s", prefix, len(devices), spec.subnet,
                 fleet.coordinator_host)
        return fleet

    @classmethod
    def attach(cls, prefix: str, *, state_root: Path = STATE_ROOT) -> EmulatedFleet:
        """The fleet `prefix` as described by its state file."""
        check_prefix(prefix)
        path = state_dir_of(prefix, state_root) / "state.json"
        try:
            raw = json.loads(path.read_text())
            devices = [Device(**{**d, "spec": DeviceSpec(**d["spec"])}) for d in raw["devices"]]
            return cls(prefix=raw["prefix"], subnet=raw["subnet"], devices=devices,
                       cfs_period_us=raw["cfs_period_us"], state_dir=path.parent, processes=raw["processes"],
                       stress_ng_method=raw.get("stress_ng_method"))
        except FileNotFoundError:
            raise FleetError(f"fleet '{prefix}' is not up (no {path})") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise FleetError(f"{path} is unreadable ({exc}); `flexfl fleet down --prefix {prefix}` still "
                             "removes the fleet by its names") from None

    def down(self) -> list[str]:
        """Stop this fleet's processes and remove all of it (see the module function `down`)."""
        self.stop_children(grace_s=3.0)
        return down(self.prefix, state_root=self.state_dir.parent)

    def __enter__(self) -> EmulatedFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def coordinator_host(self) -> str:
        """The address every device reaches the coordinator at (the bridge's)."""
        return f"{self.subnet}.1"

    # ---- loadgen keys -----------------------------------------------------------------

    def loadgen_keys_dir(self, index: int) -> Path:
        """Device `index`'s daemon keys folder (its `--keys`)."""
        return self.state_dir / "keys" / f"dev{index}"

    def loadgen_auth(self) -> curve.ClientAuth:
        """What a client needs to drive this fleet's loadgen daemons (keys made by `up`)."""
        keys = self.state_dir / "keys"
        return curve.client_auth(keys / f"{CONTROLLER_KEY}{curve.SECRET_SUFFIX}", {
            d.loadgen_endpoint: self.loadgen_keys_dir(d.index) / f"{curve.SERVER_NAME}{curve.PUBLIC_SUFFIX}"
            for d in self.devices})

    def _make_loadgen_keys(self) -> None:
        # Fresh per run: one client keypair, and per device a server keypair allowing it.
        keys = self.state_dir / "keys"
        public, _ = curve.write_keypair(keys, CONTROLLER_KEY)
        for d in self.devices:
            folder = self.loadgen_keys_dir(d.index)
            curve.write_keypair(folder, curve.SERVER_NAME)
            curve.copy_public_key(public, folder / curve.CLIENTS_DIR, CONTROLLER_KEY)

    # ---- budgets ----------------------------------------------------------------------

    @property
    def least_quota_cpus(self) -> float:
        """The smallest CPU quota a device can get here (least_quota_cpus at this fleet's period)."""
        return least_quota_cpus(self.cfs_period_us)

    def set_cpu_quota(self, index: int, cpus: float | None) -> None:
        """Cap device `index` at `cpus` CPUs (None: no cap); below least_quota_cpus, at that."""
        d = self.devices[index]
        _write(Path(d.cgroup) / "cpu.cfs_quota_us", cfs_quota_us(cpus, period_us=self.cfs_period_us))

    def set_upload(self, index: int, kbit: int | None) -> None:
        """tbf on the device's own egress (None: remove it)."""
        d = self.devices[index]
        if kbit is None:
            bandwidth.clear(d.iface, netns=d.netns)
        else:
            bandwidth.set_rate(d.iface, rate_kbit=kbit, netns=d.netns)

    def set_download(self, index: int, kbit: int | None) -> None:
        """tbf on the coordinator side's egress towards the device (None: remove it)."""
        d = self.devices[index]
        if kbit is None:
            bandwidth.clear(d.host_iface)
        else:
            bandwidth.set_rate(d.host_iface, rate_kbit=kbit)

    def set_online(self, index: int, online: bool) -> None:
        """Take device `index`'s link down inside its namespace (offline), or bring it back.

        Down, the device reaches nothing: its connections stall and new ones fail at once
        ("network unreachable"); the kernel drops the routes through the link, so bringing it
        up restores the default route too. Back, it finds its old connections gone, on its side
        and on the coordinator's, as a device back on a network does: a stalled connection would
        otherwise come back only on TCP's retransmission timer, which backs off while the link is
        down (an agent offline for 5 s was still silent 5 s after its link was back). Its
        processes, quota and qdiscs stay as they are.
        """
        d = self.devices[index]
        netns.set_link(d.iface, up=online, netns=d.netns)
        if online:
            netns.set_default_route(self.coordinator_host, netns=d.netns)
            netns.abort_tcp(dst=self.coordinator_host, netns=d.netns)
            netns.abort_tcp(dst=d.address)

    # ---- processes --------------------------------------------------------------------

    def spawn(self, index: int, argv: Sequence[str], *, role: str, log_path: Path | None = None,
              env: dict[str, str] | None = None, detach: bool = False) -> subprocess.Popen:
        """Start `argv` inside device `index` (its cgroup and network namespace).

        Output goes to `log_path` (default: <state dir>/dev<i>.<role>.log). Unless `detach`,
        the process gets SIGTERM when the spawning thread dies (PR_SET_PDEATHSIG), so a
        killed controller does not leave it running; `down` stops it either way.
        """
        d = self.devices[index]
        log_path = Path(log_path or self.state_dir / f"dev{index}.{role}.log")
        # A launcher enters the device and execs argv (no preexec_fn: see loadgen/device_exec.py).
        launcher = [sys.executable, "-m", "loadgen.device_exec", "--cgroup", str(d.cgroup), "--netns", d.netns,
                    *([] if detach else ["--die-with", str(os.getpid())]), "--", *argv]
        log_file = open(log_path, "ab")
        try:
            proc = subprocess.Popen(launcher, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise FleetError(f"cannot start {argv[0]} in device {index} ({d.netns}): {exc}") from exc
        finally:
            log_file.close()
        if not detach:
            self._children.append(proc)
        self.processes.append({"device": index, "role": role, "pid": proc.pid, "argv": list(argv)[:6],
                               "log": str(log_path)})
        self._save()
        log.debug("device %d: started %s (pid %d)", index, role, proc.pid)
        return proc

    def start_loadgen(self, index: int, *, nice: int = 0, detach: bool = False,
                      timeout_s: float = 60.0) -> subprocess.Popen:
        """Start device `index`'s loadgen daemon on its ipc:// endpoint (CURVE) and wait until it answers.

        Policy: the daemon and its stress-ng run in the device's cgroup beside the agent, at
        the same nice, and `--cpus` is the device's quota, so a competitor at X % takes X %
        of the device's budget when the agent idles and shares it fairly when both run.
        stress-ng sizes each pause from the CPU time of its last busy slice; its default
        method mix has slow operations whose slices get throttled half-way under a quota,
        and a 90 % competitor then reached about half its target here. The fleet therefore
        pins one uniform method (FleetSpec.stress_ng_method, "int8") with --cpu-method.
        """
        d = self.devices[index]
        cpus = d.spec.cpu_quota if d.spec.cpu_quota is not None else float(len(os.sched_getaffinity(0)))
        argv = [sys.executable, "-m", "flexfl.app.cli", "loadgen", "serve", "--bind", d.loadgen_endpoint,
                "--iface", d.iface,
                "--cpus", f"{cpus:g}", "--nice", str(nice), "--keys", str(self.loadgen_keys_dir(index))]
        if self.stress_ng_method:
            argv += ["--cpu-method", self.stress_ng_method]
        proc = self.spawn(index, argv, role="loadgen", detach=detach)
        _wait_for_daemon(d.loadgen_endpoint, proc, timeout_s=timeout_s, auth=self.loadgen_auth(),
                         log_path=self.state_dir / f"dev{index}.loadgen.log")
        return proc

    def stop_children(self, *, grace_s: float = 5.0) -> None:
        """SIGTERM the processes this object started (not detached ones), SIGKILL after `grace_s`."""
        for p in self._children:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self._children:
            _stop_child(p, grace_s=grace_s)
        self._children.clear()

    # ---- state ------------------------------------------------------------------------

    def _save(self) -> None:
        state = {"prefix": self.prefix, "subnet": self.subnet, "cfs_period_us": self.cfs_period_us,
                 "stress_ng_method": self.stress_ng_method,
                 "coordinator_host": self.coordinator_host, "created": time.time(),
                 "devices": [asdict(d) for d in self.devices], "processes": self.processes}
        with atomic_file(self.state_dir / "state.json") as f:
            json.dump(state, f, indent=1)

    def status(self) -> list[dict[str, Any]]:
        return status(self.prefix, state_root=self.state_dir.parent)


# ---- module-level: work from names, so leftovers of a crashed run are found too -------------


def find_leftovers(prefix: str) -> dict[str, list[str]]:
    """Namespaces, root-namespace links and cgroups that belong to fleet `prefix`, by name."""
    check_prefix(prefix)
    ns_re = re.compile(rf"{re.escape(prefix)}-dev\d+")
    link_re = re.compile(rf"{re.escape(prefix)}(br|h\d+)")
    namespaces = [n for n in netns.list_netns() if ns_re.fullmatch(n)]
    out = run(["ip", "-o", "link", "show"], error=FleetError).stdout
    links = []
    for line in out.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if link_re.fullmatch(name):
            links.append(name)
    parent = CGROUP_CPU_ROOT / prefix
    cgroups = [str(p) for p in sorted(parent.glob("dev*")) if p.is_dir()] + ([str(parent)] if parent.is_dir() else [])
    return {"netns": namespaces, "links": links, "cgroups": cgroups}


def list_fleets(*, state_root: Path = STATE_ROOT) -> list[str]:
    """Prefixes of every fleet with something left on this machine (namespaces, cgroups, state)."""
    found = set()
    for ns in netns.list_netns():
        m = re.fullmatch(r"([a-z][a-z0-9]{1,7})-dev\d+", ns)
        if m:
            found.add(m.group(1))
    if CGROUP_CPU_ROOT.is_dir():
        for d in CGROUP_CPU_ROOT.iterdir():
            if _PREFIX_RE.fullmatch(d.name) and (d / "dev0").is_dir():
                found.add(d.name)
    for d in Path(state_root).glob("fleet-*"):
        if _PREFIX_RE.fullmatch(d.name[len("fleet-"):]):
            found.add(d.name[len("fleet-"):])
    return sorted(found)


def fleet_pids(prefix: str) -> list[int]:
    """Pids inside the fleet's namespaces or cgroups (its agents, daemons, stress-ng, ...)."""
    found = find_leftovers(prefix)
    pids: set[int] = set()
    for ns in found["netns"]:
        pids.update(netns.netns_pids(ns))
    for cg in found["cgroups"]:
        pids.update(cgroup_pids(Path(cg)))
    pids.discard(os.getpid())
    return sorted(pids)


def down(prefix: str, *, state_root: Path = STATE_ROOT, grace_s: float = 3.0) -> list[str]:
    """Remove fleet `prefix`: stop its processes, delete namespaces, links and cgroups, the state dir.

    Idempotent; returns what it removed. Qdiscs go with their links.
    """
    require_root("removing the emulated fleet")
    removed: list[str] = []
    pids = fleet_pids(prefix)
    if pids:
        terminate(pids, grace_s=grace_s)
        removed.append(f"{len(pids)} process(es)")
    found = find_leftovers(prefix)
    for ns in found["netns"]:
        netns.delete_netns(ns)
        removed.append(f"netns {ns}")
    # Host-side veth ends vanish with their peers' namespaces; what is left is the bridge
    # and the ends of devices whose namespace was already gone.
    for link in find_leftovers(prefix)["links"]:
        netns.delete_link(link)
        removed.append(f"link {link}")
    for cg in found["cgroups"]:  # children first, then the fleet's own
        remove_cgroup(Path(cg), error=FleetError)
        removed.append(f"cgroup {cg}")
    state_dir = state_dir_of(prefix, state_root)
    if state_dir.exists():
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(f"state {state_dir}")
    try:
        state_dir.parent.rmdir()  # only when no other fleet's state is in it
    except OSError:
        pass
    if removed:
        log.info("fleet '%s' down: removed %s", prefix, ", ".join(removed))
    return removed


def status(prefix: str, *, state_root: Path = STATE_ROOT) -> list[dict[str, Any]]:
    """Per device: namespace, address, qdisc rates both ways, cgroup quota, processes alive."""
    require_root("inspecting the emulated fleet")
    try:
        fleet = EmulatedFleet.attach(prefix, state_root=state_root)
        devices = fleet.devices
        processes = fleet.processes
    except FleetError:
        found = find_leftovers(prefix)
        devices = [_names(prefix, "?", state_dir_of(prefix, state_root), int(n.rsplit("dev", 1)[1]), DeviceSpec())
                   for n in found["netns"]]
        processes = []
    rows = []
    existing = set(netns.list_netns())
    for d in devices:
        alive = d.netns in existing
        ns_pids = netns.netns_pids(d.netns) if alive else []
        procs = []
        for p in processes:
            if p["device"] == d.index:
                procs.append({"role": p["role"], "pid": p["pid"], "alive": _alive(p["pid"])})
        known = {p["pid"] for p in procs}
        for pid in ns_pids:
            if pid not in known:
                procs.append({"role": _proc_name(pid), "pid": pid, "alive": True})
        rows.append({
            "device": d.index, "netns": d.netns if alive else f"{d.netns} (missing)", "address": d.address,
            "iface": d.iface, "up_kbit": _tbf_rate(d.iface, d.netns) if alive else None,
            "down_kbit": _tbf_rate(d.host_iface, None), "cpu_quota": read_quota_cpus(Path(d.cgroup)),
            "loadgen": d.loadgen_endpoint, "processes": procs,
        })
    return rows


def tool_versions() -> dict[str, str]:
    """Versions of stress-ng and iproute2 on this machine, for manifests."""
    out = {}
    for name, argv in (("stress-ng", ["stress-ng", "--version"]), ("iproute2", ["ip", "-V"])):
        try:
            proc = run(argv, error=FleetError, check=False)
            out[name] = (proc.stdout or proc.stderr).strip()
        except FleetError:
            out[name] = "not installed"
    return out


# ---- helpers --------------------------------------------------------------------------------



def _write(path: Path, value: object) -> None:
    write_control(path, value, error=FleetError)


def _stop_child(p: subprocess.Popen, *, grace_s: float = 3.0) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _proc_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _tbf_rate(dev: str, ns: str | None) -> int | None:
    try:
        shown = bandwidth.show(dev, netns=ns)
    except LoadgenError:
        return None
    return shown["tbf"]["rate_kbit"] if shown["tbf"] else None


def _check_subnet_free(subnet: str) -> None:
    out = run(["ip", "-o", "-4", "addr", "show"], error=FleetError).stdout
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            addr = fields[fields.index("inet") + 1]
            if addr.startswith(f"{subnet}."):
                raise FleetError(f"subnet {subnet}.0/24 is already in use here ({addr} on {fields[1]}); "
                                 "pick another with --subnet")


def _describe(found: dict[str, list[str]]) -> str:
    parts = [f"{len(v)} {k}" for k, v in found.items() if v]
    return ", ".join(parts) or "a state folder"


def _wait_for_daemon(endpoint: str, proc: subprocess.Popen, *, timeout_s: float, log_path: Path,
                     auth: curve.ClientAuth | None = None) -> None:
    from loadgen.client import LoadgenClient
    from loadgen.errors import DaemonError

    deadline = time.monotonic() + timeout_s
    with LoadgenClient(endpoint, timeout_s=1.0, auth=auth) as client:
        while True:
            if proc.poll() is not None:
                raise FleetError(f"loadgen daemon at {endpoint} exited with code {proc.returncode}; see {log_path}")
            try:
                client.ping()
                return
            except DaemonError:
                if time.monotonic() > deadline:
                    raise FleetError(f"loadgen daemon at {endpoint} did not answer within {timeout_s:g} s; "
                                     f"see {log_path}") from None
