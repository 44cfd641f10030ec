"""benchmarks.fuzz_support.draws_from_seed_alone: a seeded hypothesis run draws the same examples
whatever the process imported.

Without it, `pytest tests/unit tests/integration/test_fuzz.py` sent the gRPC fuzzer's seed 0 other
calls than the fuzz test alone did (hypothesis draws constants from every imported local module),
and the test failed. The check runs in a fresh interpreter: hypothesis never forgets a constant
it has read, so importing the module here would change the draws of every later test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis", reason="the fuzz helpers need hypothesis (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[3]

# Draws of one seed with the pool pinned and free, before and after a module of new constants is
# imported (as an earlier test's import would be).
SCRIPT = """
import importlib, json, sys
from hypothesis import given, seed, settings, strategies as st
from benchmarks.fuzz_support import draws_from_seed_alone

def draws():
    out = []

    @seed(0)
    @settings(max_examples=200, database=None, deadline=None)
    @given(st.tuples(st.integers(), st.text(max_size=20), st.binary(max_size=20), st.floats()))
    def one(x):
        out.append(repr(x))

    one()
    return out

with draws_from_seed_alone():
    pinned = draws()
free = draws()
importlib.import_module(sys.argv[1])
with draws_from_seed_alone():
    pinned_after = draws()
print(json.dumps({"pinned": pinned, "pinned_after": pinned_after, "free": free, "free_after": draws()}))
"""


def test_a_seed_draws_the_same_examples_after_a_module_of_new_constants_is_imported(tmp_path: Path) -> None:
    folder = tmp_path / "mods"
    folder.mkdir()
    constants = [*range(10_007, 10_007 + 40 * 131, 131), *(f"zq-{i}-mark" for i in range(40)),
                 *(f"zq{i}".encode() for i in range(40)), *(i + 0.123 for i in range(101, 141))]
    (folder / "many_constants.py").write_text(f"VALUES = {constants!r}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
           "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}  # its constants cache, not the checkout's
    result = subprocess.run([sys.executable, "-c", SCRIPT, "many_constants"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    draws = json.loads(result.stdout)
    assert draws["free"] != draws["free_after"], (
        "hypothesis drew nothing from the new module's constants: if it no longer reads local modules, "
        "draws_from_seed_alone and this test can go")
    assert draws["pinned"] == draws["pinned_after"], (
        "a seed's draws changed with an import: draws_from_seed_alone no longer empties hypothesis's pool of "
        "local constants (a hypothesis release moved it?)")
