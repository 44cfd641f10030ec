"""FlexFL's deadline rule in a Flower ClientApp (edge_agent.flower_client), on Flower's Simulation Engine with
FlexFL's strategy (flower_apps.py's "client" scenario, in a process of its own): a client whose local updates take
50 ms stops before E when the deadline cannot hold them all and says "compute"; one whose updates take no time
runs all E; the strategy records both. The same run's folder, written by its ServerApp, becomes a trace set
(`flexfl traces from-run`) that `flexfl traces validate|show` and `flexfl sim run --trace-set` read."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

from trace_recorder.format import read_trace_set

from .test_flower_strategy import simulate

E, DEADLINE_S = 40, 0.6  # flower_apps.CLIENT_E, DEADLINE_S


@pytest.fixture(scope="module")
def client_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The scenario's records and sample counts, and the run folder its ServerApp wrote."""
    tmp = tmp_path_factory.mktemp("client")
    return simulate("client", tmp, run_dir=tmp / "run"), tmp / "run"


def flexfl(*args: str) -> str:
    """`flexfl ARGS` as a user runs it; its stdout (a failure shows its stderr)."""
    done = subprocess.run([sys.executable, "-m", "flexfl.app.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, (args, done.stderr[-3000:])
    return done.stdout


@pytest.mark.slow
def test_the_deadline_rule_cuts_a_slow_clients_round_short_and_the_strategy_records_why(client_run) -> None:
    result, _ = client_run
    records = result["records"]
    assert [r.round for r in records] == [1, 2, 3]
    slow = next(d for d, n in result["sample_counts"].items() if n == 100)
    for r in records:
        fast = next(d for d in r.participants if d != slow)
        # 0.6 s at >= 50 ms an update: at most 12 (the margin and the clock take some), at least one
        assert 1 <= r.s[slow] <= 12 and r.stop_reason[slow] == "compute", (r.round, r.s, r.stop_reason)
        assert r.s[fast] == E and r.stop_reason[fast] == "complete", (r.round, r.s, r.stop_reason)
        # The live part, as a coordinator's rows have it: both answered in time, with their updates' bytes and times
        live = r.live
        assert live is not None and live.close_reason == "all answered" and not live.rejected
        assert set(live.bytes_out) == set(live.bytes_in) == set(live.arrived_after_s) == {slow, fast}
        assert min(live.bytes_in.values()) > 4 * 4  # the 2x2 float32 model and the metrics
        assert live.train_s[slow] >= r.s[slow] * 0.05 > live.train_s[fast]  # DeadlineTraining measured its loop
        assert live.arrived_after_s[slow] >= live.train_s[slow] and live.round_s >= live.arrived_after_s[slow]
        assert live.previous_upload_s == {}  # Flower does not show a node's upload time


@pytest.mark.slow
def test_a_flower_run_becomes_a_trace_set_that_flexfl_traces_and_the_simulator_read(client_run,
                                                                                     tmp_path: Path) -> None:
    result, run = client_run
    slow = next(d for d, n in result["sample_counts"].items() if n == 100)
    fast = next(d for d in result["sample_counts"] if d != slow)
    out = tmp_path / "flower-set"
    flexfl("traces", "from-run", str(run), "--out", str(out))
    assert flexfl("traces", "validate", str(out)).strip() == "ok: 2 traces, 3 rounds"
    shown = {line.split()[0]: line.split() for line in flexfl("traces", "show", str(out)).splitlines()[2:]}
    assert float(shown[slow][2]) < 100 == float(shown[fast][2])  # mean % of s / E
    traces = read_trace_set(out)
    m = traces.manifest
    assert (m.kind, m.required_updates, m.deadline_s, m.source["engine"]) == ("recorded", E, DEADLINE_S, "flower")
    by_round = {r.round: r for r in result["records"]}
    for name, reason in ((slow, 2), (fast, 1)):  # fleet.proto's StopReason: 2 compute, 1 complete
        t = traces.get(name)
        assert list(t.round) == [1, 2, 3]
        assert list(t.fraction) == [by_round[k].s[name] / E for k in (1, 2, 3)]
        assert list(t.extra["stop_reason"]) == [reason] * 3 and list(t.extra["arrived"]) == [1] * 3
        assert list(t.extra["upload_s"]) == [0.0] * 3 and min(t.extra["upload_bytes"]) > 0
    assert max(traces.get(slow).fraction) < 1
    sim = tmp_path / "sim"
    flexfl("sim", "run", "--trace-set", str(out), "--num-traces", "2", "--dataset", "synthetic", "--devices", "4",
           "--total-samples", "400", "--rounds", "2", "--scheme", "C", "--out", str(sim))
    # Each simulated device's s (E = 20 there) is one of the set's fractions, rounded half up: s = floor(f E + 1/2)
    drawn = {math.floor(f * 20 + 0.5) for t in traces.traces for f in t.fraction}
    rows = [json.loads(line) for line in (sim / "C" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and {s for r in rows for s in r["s"].values()} <= drawn, drawn
