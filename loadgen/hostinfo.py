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
    return _model_name(_cpuinfo_fields(cpuinfo))


def cpu_description(*, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """cpu_model() with x86's family and model numbers, which tell two CPUs of one name apart
    ("AMD EPYC (family 26, model 2)"): what every benchmark prints beside its figures."""
    fields = _cpuinfo_fields(cpuinfo)
    name = _model_name(fields) or platform.machine() or "unknown CPU"
    if fields and "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def _model_name(fields: dict[str, str] | None) -> str | None:
    # x86: "model name"; ARM Pis: "Model" (board) and often no model name.
    if fields is None:
        return platform.processor() or None
    return fields.get("model name") or fields.get("Model") or fields.get("Hardware") or platform.processor() or None


def _cpuinfo_fields(cpuinfo: Path) -> dict[str, str] | None:
    """The first processor's fields (and a Pi's board lines), first value of each key; None if unreadable."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields
