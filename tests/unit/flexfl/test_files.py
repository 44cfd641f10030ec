"""flexfl.files.atomic_file, and that files which must survive a crash are written through it."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from flexfl.files import atomic_file

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("coordinator", "edge_agent", "flexfl", "loadgen", "simulator", "trace_recorder", "workloads", "benchmarks")
# A write that bypasses atomic_file: a rename of our own, write_text/write_bytes, open or fdopen for writing.
PLAIN_WRITE = re.compile(r"os\.replace\(|\.write_text\(|\.write_bytes\(|\bopen\([^#]*[\"'][wax]b?\+?[\"']|fdopen\(")
# Each write allowed to bypass it, with the reason (file, the line's start).
KEY_PAIR_MOVED = "ZeroMQ writes the key pair; moved in from a private folder"
ALLOWED = {
    ("flexfl/files.py", "with os.fdopen(fd, mode"): "atomic_file itself",
    ("flexfl/files.py", "os.replace(tmp, path)"): "atomic_file itself",
    ("coordinator/metrics.py", 'self._file = open(path, "a" if append else "w"'):
        "MetricsWriter appends rows and fsyncs each; a torn last row is repaired on resume",
    ("coordinator/resume.py", 'with open(path, "a"'): "the membership journal: appended, fsynced",
    ("coordinator/resume.py", 'with open(aside, "a"'): "torn metrics lines set aside: appended",
    ("flexfl/run_folder.py", 'f = open(path / LOCK_NAME, "a+"'): "the run folder's lock file",
    ("loadgen/harness.py", 'with open(log_path, "ab")'): "a process's log",
    ("loadgen/flower_fleet.py", 'with open(log_path, "ab")'): "a Flower process's log",
    ("coordinator/agent_logs.py", 'with open(path, "a", encoding="utf-8")'): "a device's log: appended, batch by batch",
    ("loadgen/fleet.py", 'log_file = open(log_path, "ab")'): "a process's log",
    ("benchmarks/flower_compare.py", 'with open(tmp / "server.log", "wb")'): "a process's log",
    ("benchmarks/flower_compare.py", 'with open(tmp / f"clients-{i}.log", "wb")'): "a process's log",
    ("benchmarks/coordinator_bench.py", 'with open(log_dir / f"agents-{first}.log", "wb")'): "a process's log",
    ("loadgen/cpu.py", 'with open(f"/proc/{pid}/autogroup", "w")'): "a kernel control file",
    ("loadgen/device_exec.py", 'with open(os.path.join(args.cgroup, "cgroup.procs"), "w")'): "a kernel control file",
    ("loadgen/cgroup.py", "path.write_text(str(value))"): "a kernel control file (cgroup)",
    ("loadgen/keys.py", "os.replace(made_public, public)"): KEY_PAIR_MOVED,
    ("loadgen/keys.py", "os.replace(made_secret, secret)"): KEY_PAIR_MOVED,
    ("flexfl/app/report/browser.py", "Path(screenshot).write_bytes("): "a screenshot for a person to look at",
    ("benchmarks/flower_side.py", "Path(args.out).write_text("): "a hand-over file in a temp folder",
    ("benchmarks/fuzz_config.py", "path.write_bytes(raw)"): "a fuzzed config in a temp folder",
}


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old")

    def disk_fails(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", disk_fails)
    with pytest.raises(OSError, match="I/O error"), atomic_file(path) as f:
        f.write("new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_results_states_and_summaries_are_written_through_atomic_file() -> None:
    found = set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for line in path.read_text(encoding="utf-8").splitlines():
                if PLAIN_WRITE.search(line):
                    found.add((rel, line.strip()))
    unexplained = sorted(f"{rel}: {line}" for rel, line in found
                         if not any(rel == f and line.startswith(start) for f, start in ALLOWED))
    assert unexplained == [], "write these through flexfl.files.atomic_file, or add them to ALLOWED with a reason"
    unused = sorted(key for key in ALLOWED if not any(rel == key[0] and line.startswith(key[1]) for rel, line in found))
    assert unused == [], "ALLOWED names writes that no longer exist"
