"""Facts about the host a daemon runs on, for status replies and trace manifests."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import psutil

from loadgen.cgroup import available_cpus


def host_facts() -> dict[str, Any]:
    """CPU model and counts, memory, OS and Python, from psutil, platform and /proc."""
    try:
        os_name = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        os_name = None
    return {
        "hostname": platform.node(),
        "system": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "os": os_name or f"{platform.system()} {platform.release()}",
        "cpu_model": cpu_model(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpus_available": available_cpus(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
    }


def cpu_model(*, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU model name; on a Raspberry Pi the board model ("Model" line) when present."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return platform.processor() or None
    fields: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    # x86: "model name"; ARM Pis: "Model" (board) and often no model name.
    return fields.get("model name") or fields.get("Model") or fields.get("Hardware") \
        or platform.processor() or None
