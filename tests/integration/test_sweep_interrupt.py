"""Ctrl-C on a real sweep: SIGINT to its process group, as a terminal sends it to the job in front.

The sweep (`flexfl sim table3 --jobs 2`, a small SYNTHETIC grid of 4 paired groups, a few
seconds each) is interrupted while its two workers compute; it must say in one line what
stopped and how to resume, print no worker traceback, exit 130, leave no process behind,
and a rerun of the same command must finish the grid from the runs already saved.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from loadgen.harness import Harness

GRID = ["sim", "table3", "--dataset", "synthetic", "--readings", "per-label", "--settings", "iid",
        "--num-traces-list", "2-5", "--seeds", "0", "--jobs", "2"]
RUNS = 4 * 3  # |T| x schemes


def _finished(work: Path) -> dict[str, int]:
    """The runs saved so far: {file name: mtime in ns} of their summaries."""
    return {p.name: p.stat().st_mtime_ns for p in work.glob("*.json")} if work.is_dir() else {}


def _left_in_group(pgid: int, *, timeout_s: float = 30) -> list[str]:
    """Wait until no process is left in group `pgid` (multiprocessing's resource tracker ends
    soon after its parent); the command lines of those still there after `timeout_s`."""
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        time.sleep(0.05)
    left = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.getpgid(pid) == pgid:
                left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except (ProcessLookupError, FileNotFoundError):
            pass
    return left


def test_ctrl_c_on_a_sweep_says_how_to_resume_without_tracebacks_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "results"
    work = out / "runs" / "table3_synthetic"
    # A shell starts a foreground job with SIGINT at its default; a test run started in the
    # background of a non-interactive shell (`.ci/run &`) has it ignored, which the sweep would
    # inherit (Python leaves an inherited SIG_IGN alone) and the Ctrl-C below would do nothing.
    # A handler here becomes the default across exec.
    with Harness(tmp_path / "logs") as h:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            sweep = h.start_command("sweep", [*GRID, "--out", str(out)])
        finally:
            signal.signal(signal.SIGINT, previous)
        limit = time.monotonic() + 300
        while not _finished(work):  # the first group is in: both workers are busy with later ones
            assert sweep.proc.poll() is None, sweep.log_path.read_text()[-3000:]
            assert time.monotonic() < limit, "no run finished within 300 s"
            time.sleep(0.05)
        h.signal("sweep", signal.SIGINT, group=True)
        assert sweep.proc.wait(timeout=120) == 130, sweep.log_path.read_text()[-3000:]
        log = sweep.log_path.read_text()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
        said = [line for line in log.splitlines() if "interrupted" in line]
        assert len(said) == 1, said
        # stdout and stderr share the log: the line may follow a partly flushed stdout line
        said = said[0][said[0].index("flexfl: interrupted"):]
        assert said.startswith("flexfl: interrupted: the sweep in ") and str(work) in said and "rerun" in said, said
        assert _left_in_group(sweep.proc.pid) == []  # no worker outlives the sweep
        before = _finished(work)
        assert 0 < len(before) < RUNS, len(before)

        again = h.start_command("resume", [*GRID, "--out", str(out)])
        assert again.proc.wait(timeout=600) == 0, again.log_path.read_text()[-3000:]
    after = _finished(work)
    assert len(after) == RUNS
    assert {name: after[name] for name in before} == before  # resumed: the saved runs were not computed again
    assert (out / "table3.md").is_file()
