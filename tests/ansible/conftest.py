"""Shared helpers for the Ansible tests: where the tools are, how to run them.

The tools (ansible-playbook, ansible-lint, yamllint) come from `make setup-ansible`,
which installs ansible/requirements.txt into .venv-ansible; FLEXFL_ANSIBLE_BIN names
another folder that holds them. Tests skip, saying why, when a tool is missing.

Tests marked `provision` apply the playbooks to a real Debian bookworm root and take
minutes: they run only when selected, `pytest -m provision tests/ansible`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Timings the provisioning tests record, printed at the end of the session.
TIMINGS_S: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "provision: applies the playbooks to a debootstrapped bookworm root (root, minutes)")


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
