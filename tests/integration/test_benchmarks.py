"""Benchmarks' machinery: every benchmark module runs in a tiny mode, and `make performance` fails when one fails.

Every module of benchmarks/ is either a benchmark with a smoke run here (SMOKE_RUNS, or a named
test that already runs it: RUN_BY) or a part that another benchmark runs (PARTS); a new module in
neither fails test_every_benchmark_module_has_a_smoke_run. The smoke runs take seconds each on
2 cores (they check that a benchmark runs and prints its verdict, not its figures).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.coordinator_bench import run_fleet
from coordinator.rules.config import RulesConfig

REPO = Path(__file__).resolve().parents[2]
FLOWER_PYTHON = REPO / ".venv-flower" / "bin" / "python"


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]  # after `python -m benchmarks.<module>`: the module's own small settings
    expect: str  # a line of its output (regex, multiline) that only a finished run prints


SMOKE_RUNS = {
    "agent_memory": Smoke(("--dataset", "synthetic", "--repeat", "1", "--rounds", "1"),
                          r"^after training, over floor 2 \(torch after training\): RSS \+[\d.]+ MiB \(goal"),
    "epoch_speed": Smoke(("--reps", "1", "--epochs", "1"), r"^ragged/equal: min [\d.]+"),
    "flower_compare": Smoke(("--agents", "5", "--rounds", "3", "--repeat", "1"), r"^\s+5\s+on\s+[\d.]+"),
    # Without root: two SuperNodes on loopback, one round of each variant at a given deadline, no calibration.
    "flower_side_by_side": Smoke(("--loopback", "--devices", "2", "--seeds", "0", "--rounds", "1", "--deadline-s",
                                  "30", "--out", "{tmp}"),
                                 r"^\| FlexFL deadline client \+ Scheme C \| 1 \| [\d.]+ \|"),
    "population": Smoke(("close", "--devices", "60", "--reps", "1", "--rounds", "2", "--chunk-rows", "16"),
                        r"^chunked / stacked per repetition: seconds per round [\d.]+"),
    # One seed of SYNTHETIC on the paper's traces, two rules (the protocol's sizes: ~7 s here).
    "sync_vs_async": Smoke(("--datasets", "synthetic", "--sources", "paper", "--seeds", "0", "--variants",
                            "scheme-c,fedbuff-k5", "--out", "{tmp}"),
                           r"^- FedBuff K = 5 / Scheme C: [\d.]+ \([\d.]+-[\d.]+\) over 1 seeds"),
    "sweep_speed": Smoke(("--reps", "1", "--workloads", "synthetic", "--rounds", "2", "--schemes", "A,C"),
                         r"^max \|paired - separate\| over final parameters: 0\.0e\+00"),
    "threads": Smoke(("--reps", "1", "--workload", "synthetic"), r"^  2proc x 1thr: min \d+"),
}
# Benchmarks whose tiny run is already a test (file::function; the function must exist): not run twice.
RUN_BY = {
    "coordinator_bench": "tests/integration/test_benchmarks.py::"
                         "test_light_agents_in_two_processes_answer_every_round_with_a_full_size_zero_delta",
    "refused_uploads": "tests/integration/test_bad_input.py::test_refused_model_sized_uploads_do_not_keep_their_memory",
    "cli_speed": "tests/integration/test_benchmarks.py::test_the_cli_benchmark_runs_every_command_with_its_exit_code",
    "fuzz": "tests/integration/test_fuzz.py::test_a_fuzzed_coordinator_still_serves_an_exact_round_without_growing",
    "performance": "tests/integration/test_benchmarks.py::test_a_failed_benchmark_fails_the_run_and_keeps_its_section",
    "sim_speed": "tests/integration/test_benchmarks.py::test_the_simulator_benchmark_runs_and_its_variants_agree",
    "soak": "tests/integration/test_soak.py::test_short_soak_with_kills_departures_arrivals_and_coordinator_restarts",
    "package_graph": "tests/unit/benchmarks/test_package_graph.py::"
                     "test_a_loop_between_two_packages_counts_both_arrows_and_is_named",
}
# Not benchmarks of their own: the module named runs or imports each one.
PARTS = {
    "__init__": None, "report": "performance", "fuzz_config": "fuzz", "fuzz_grpc": "fuzz",
    "fuzz_support": "fuzz_grpc", "light_agents": "coordinator_bench", "flower_side": "flower_compare",
}


def test_every_benchmark_module_has_a_smoke_run():
    modules = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    placed = [*SMOKE_RUNS, *RUN_BY, *PARTS]
    assert len(placed) == len(set(placed)), "a module is placed twice"
    assert modules == set(placed), (f"without a smoke run: {sorted(modules - set(placed))}; "
                                    f"gone: {sorted(set(placed) - modules)}")
    for module, where in RUN_BY.items():
        path, function = where.split("::")
        names = {n.name for n in ast.walk(ast.parse((REPO / path).read_text())) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"{module}: {where} does not exist"
    for module, runner in PARTS.items():
        if runner is not None:
            assert module in (REPO / "benchmarks" / f"{runner}.py").read_text(), f"{runner} does not use {module}"


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(SMOKE_RUNS))
def test_every_benchmark_runs_in_its_tiny_mode(module, tmp_path):
    if module == "flower_compare" and not FLOWER_PYTHON.exists():
        pytest.skip("Flower's virtualenv (.venv-flower) is not set up: `make setup-flower`")
    smoke = SMOKE_RUNS[module]
    args = [a.replace("{tmp}", str(tmp_path)) for a in smoke.args]  # a fresh folder: a resumable one would skip
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"benchmarks.{module} exited {out.returncode}:\n{out.stderr[-3000:]}"
    assert re.search(smoke.expect, out.stdout, re.M), out.stdout[-3000:]


def test_a_failed_benchmark_fails_the_run_and_keeps_its_section(tmp_path, monkeypatch, capsys):
    """benchmarks.performance: a benchmark that exits non-zero leaves its section as it was (a traceback
    once replaced the threads section, with this machine's paths), the others still write theirs, and
    the run exits 1 naming the failed one, so that `make performance` fails."""
    from benchmarks import performance
    from benchmarks.performance import Bench

    page = tmp_path / "performance.md"
    page.write_text("<!-- BEGIN broken -->\nthe figures of the last good run\n<!-- END broken -->\n")
    benches = (Bench("a benchmark with a wrong flag", ("benchmarks.cli_speed", "--no-such-flag"),
                     ("benchmarks.cli_speed", "--no-such-flag"), "fails", section="broken"),
               Bench("the CLI's answer time", ("benchmarks.cli_speed", "--reps", "1"),
                     ("benchmarks.cli_speed", "--reps", "1"), "runs"))
    monkeypatch.setattr(performance, "BENCHES", benches)
    assert performance.main(["--out", str(page)]) == 1
    err = capsys.readouterr().err
    assert "1 of 2 benchmarks failed: broken" in err and "--no-such-flag" in err, err
    text = page.read_text()
    assert "the figures of the last good run" in text and "no-such-flag" not in text
    assert re.search(r"^goal: excess < 0.5 s: (met|NOT met)", text, re.M), text


def test_a_quick_run_writes_beside_the_committed_page(tmp_path, monkeypatch):
    """`make performance QUICK=1` once overwrote results/performance.md with one-repetition figures."""
    from benchmarks import performance

    page, quick_page = tmp_path / "results" / "performance.md", tmp_path / "out" / "performance-quick.md"
    page.parent.mkdir()
    page.write_text("# the committed page\n")
    monkeypatch.setattr(performance, "PAGE", page)
    monkeypatch.setattr(performance, "QUICK_PAGE", quick_page)
    assert performance.main(["--quick", "--only", "cli_speed"]) == 0
    assert page.read_text() == "# the committed page\n"
    assert "<!-- BEGIN cli_speed -->" in quick_page.read_text() and "smoke settings" in quick_page.read_text()


@pytest.mark.slow
def test_light_agents_in_two_processes_answer_every_round_with_a_full_size_zero_delta():
    E = RulesConfig().required_updates  # the benchmark's coordinator keeps the default rules
    run = run_fleet(5, rounds=3, dataset="synthetic", per_process=3, measure_memory=False)
    assert [r.round for r in run.rows] == [1, 2, 3]
    assert all(r.live is not None and r.live.close_reason == "all answered" for r in run.rows)
    assert all(sorted(r.s) == [f"bench-{i}" for i in range(5)] and set(r.s.values()) == {E} for r in run.rows)
    model_bytes = 610 * 4  # SYNTHETIC's logistic regression: 60 x 10 weights + 10 biases, float32
    assert all(model_bytes <= v < 1.2 * model_bytes for r in run.rows if r.live for v in r.live.bytes_in.values())
    assert len(run.periods()) == 1 and run.periods()[0] > 0
    assert all(r.live is not None and r.live.overhead_s is not None for r in run.rows[1:])


def test_the_simulator_benchmark_runs_and_its_variants_agree():
    """benchmarks.sim_speed (make performance) on its smallest setting: it runs, prints the
    ratio line, and its fast and sequential aggregates agree (a broken import once left
    results/performance.md with a traceback)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_speed", "--reps", "1", "--workloads", "synthetic"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"cache/sequential: min [\d.]+x", out.stdout), out.stdout
    assert re.search(r"fast/sequential: min [\d.]+x", out.stdout), out.stdout
    line = re.search(r"max \|variant - sequential\|: (.*) \(max \|sequential\| ([\d.e+-]+)\)", out.stdout)
    assert line, out.stdout
    diffs = {name: float(v) for name, v in re.findall(r"(\w+) ([\d.e+-]+)", line.group(1))}
    scale = float(line.group(2))
    assert set(diffs) == {"cache", "fast", "torchloop", "plain"}, line.group(0)
    # float32 rounding over 20 steps at eta = 1: the fast and cache trainers reorder the arithmetic, and
    # the sequential loop is no closer to exact than they are. Against a float64 run of the same batches
    # (AMD EPYC family 25, the cache trainer's 16-register blocking) the aggregate's largest error was
    # 3.2e-3 for the sequential loop and plain, 2.9e-3 for fast and torchloop, 9.8e-4 for cache (scale
    # 1.94): each is up to ~1.6e-3 x scale from exact, so two of them up to ~3.3e-3 x scale apart on
    # opposite sides. A wrong batch or rule is ~scale.
    assert max(diffs["cache"], diffs["fast"], diffs["torchloop"]) <= 3e-3 * scale and diffs["plain"] <= 1e-5 * scale, \
        line.group(0)


def test_the_whole_round_benchmark_times_the_evaluation_and_judges_issue_18s_goals():
    """sim_speed --evaluate (make performance's whole-round section): every variant's round ends
    in an evaluation on the 10k test images, whose forward-pass FLOPs join the compute roofline,
    and the goals line gives a verdict for each of issue 18's three goals."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_speed", "--reps", "1", "--workloads", "mnist",
                          "--participation", "traces", "--evaluate", "--variants", "cache,sequential,torchloop"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "each round evaluated on 10000 test samples" in out.stdout, out.stdout
    from benchmarks.sim_speed import MLP_PARAMS
    assert f"+ {2 * MLP_PARAMS * 10_000:,} per round for the evaluation" in out.stdout, out.stdout
    goals = re.search(r"^goals \(cache, medians\): compute roofline [\d.]+ \(>= 0.65: (met|NOT met)\); "
                      r"cache/sequential [\d.]+x \(>= 3x: (met|NOT met)\); "
                      r"cache/torchloop [\d.]+x \(> 1: (met|NOT met)\)$",
                      out.stdout, re.M)
    assert goals, out.stdout


def test_the_cli_benchmark_runs_every_command_with_its_exit_code():
    out = subprocess.run([sys.executable, "-m", "benchmarks.cli_speed", "--reps", "1"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]  # it exits non-zero when a command's exit code is not the expected
    assert len(re.findall(r"^excess of flexfl", out.stdout, re.M)) == 3, out.stdout
    assert re.search(r"^goal: excess < 0.5 s: (met|NOT met)", out.stdout, re.M), out.stdout
