"""`flexfl report` on the committed folders of a checkout writes only into its own output folder.

A copy of the tracked folders it reads (results/ pages, traces/paper) is made a git repository
with the project's .gitignore; after `flexfl report` on each, `git status --porcelain` must
show nothing new there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_report_leaves_no_untracked_file_in_the_folders_it_reads(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "results").mkdir(parents=True)
    for page in (REPO / "results").iterdir():  # the pages and their CSVs, not the per-run folders
        if page.is_file():
            shutil.copy(page, checkout / "results")
    shutil.copytree(REPO / "traces" / "paper", checkout / "traces" / "paper")
    shutil.copy(REPO / ".gitignore", checkout)
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "the committed folders")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    printed = {}
    for folder in ("results", "traces/paper"):
        done = subprocess.run([sys.executable, "-m", "flexfl.app.cli", "report", folder], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        printed[folder] = done.stdout.strip()
    assert _git(checkout, "status", "--porcelain") == ""
    assert printed == {"results": "out/report/results.html", "traces/paper": "out/report/traces-paper.html"}
    assert all((checkout / path).stat().st_size > 10_000 for path in printed.values())
