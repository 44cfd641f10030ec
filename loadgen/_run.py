"""One way to run ip/tc: argument lists, captured output, failures wrapped with the command."""

from __future__ import annotations

import logging
import shlex
import subprocess
from typing import TypeVar

from loadgen.errors import LoadgenError

# The error class a failure is raised as (ShapingError, CpuLoadError, ...): callers get their own type back.
E = TypeVar("E", bound=LoadgenError)

log = logging.getLogger(__name__)

# Debian package that provides each binary we shell out to, for the "not installed" error.
_PACKAGES = {"ip": "iproute2", "tc": "iproute2", "ss": "iproute2", "stress-ng": "stress-ng"}


def in_netns(argv: list[str], netns: str | None) -> list[str]:
    """Prefix `argv` with `ip netns exec NS` when a namespace is given."""
    return argv if netns is None else ["ip", "netns", "exec", netns, *argv]


def run(
    argv: list[str],
    *,
    error: type[LoadgenError],
    check: bool = True,
    timeout_s: float = 10.0,
) -> subprocess.CompletedProcess[str]:
    """Run a command with captured text output; raise `error` if it cannot run.

    With `check=True` a non-zero exit raises too; with `check=False` the caller inspects
    the result and classifies the failure (see `failure`).
    """
    log.debug("run: %s", shlex.join(argv))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        pkg = _PACKAGES.get(argv[0], argv[0])
        raise error(f"`{argv[0]}` is not installed (apt-get install {pkg})") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"`{shlex.join(argv)}` did not finish within {timeout_s:g} s") from exc
    if check and proc.returncode != 0:
        raise failure(error, proc)
    return proc


def failure(
    error: type[E], proc: subprocess.CompletedProcess[str], *, hint: str | None = None
) -> E:
    """Build `error` naming the command, its exit code and stderr, after an optional hint."""
    stderr = proc.stderr.strip() or "(no stderr)"
    msg = f"`{shlex.join(proc.args)}` failed (exit {proc.returncode}): {stderr}"
    return error(f"{hint}; {msg}" if hint else msg)
