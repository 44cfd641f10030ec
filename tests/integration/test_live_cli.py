"""`flexfl live` as a user runs it: a dead agent, one device, its defaults, `make live` knobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from coordinator.metrics import read_metrics
from coordinator.rules.round_record import RoundRecord
from flexfl.app.live import EmulationConfig, LiveConfig, device_traces, load_live_config, round_line, summarize
from flexfl.config import load_config
from flexfl.errors import ConfigError
from flexfl.run_spec import DeadlineRunSpec
from trace_recorder import PAPER_TRACE_SET
from trace_recorder.traces_table import TracesConfig

REPO = Path(__file__).resolve().parents[2]


def _live(out: Path, *args: str) -> subprocess.Popen:
    # GRPC_ENABLE_FORK_SUPPORT: this branch's harness forks agents with a preexec_fn while its
    # Status channel is busy, which crashes ~3 % of them before exec (grpc/grpc#43055); main's
    # harness no longer forks that way.
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "live", "--out", str(out), "--trace-set", "",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"})


def test_live_reports_an_agent_killed_mid_run_and_goes_on(tmp_path):
    out = tmp_path / "run"
    live = _live(out, "--devices", "3", "--rounds", "6", "--arrive-round", "0", "--depart-round", "0",
                 "--deadline-s", "1", "--E", "10")
    try:
        metrics = out / "coordinator" / "metrics.jsonl"
        limit = time.monotonic() + 180
        while not (metrics.exists() and len(read_metrics(metrics)) >= 2):
            assert live.poll() is None and time.monotonic() < limit, live.communicate()[0][-3000:]
            time.sleep(0.1)
        victim = next(p for p in psutil.Process(live.pid).children(recursive=True)
                      if any(a.endswith("agent-1.toml") for a in p.cmdline()))
        victim.send_signal(signal.SIGKILL)
        printed, _ = live.communicate(timeout=180)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert live.returncode == 0, printed[-3000:]
    assert "agent-1 exited with code -9 after round" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dead_agents"] == {"agent-1": -9} and summary["rounds"] == 6
    assert (out / "accuracy.png").stat().st_size > 0
    rows = read_metrics(out / "coordinator" / "metrics.jsonl")
    assert rows[-1].s["dev-1"] == 0 and rows[-1].s["dev-0"] > 0


def test_live_with_one_device_and_no_events(tmp_path):
    out = tmp_path / "one"
    live = _live(out, "--devices", "1", "--arrive-round", "0", "--depart-round", "0", "--rounds", "2", "--E", "5")
    printed, _ = live.communicate(timeout=180)
    assert live.returncode == 0, printed[-3000:]
    assert "no arrival or departure" in printed and "no membership events" in printed
    assert "flexfl live: 1 agent on loopback, synthetic(1,1) non-IID, 1 device," in printed  # "1 agents", "1 devices"
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2


def test_live_refuses_a_folder_with_an_earlier_run_and_fresh_moves_it_aside(tmp_path):
    """An earlier run is never overwritten or mixed in: refused, or moved aside whole with --fresh."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "agent-7.log").write_text("from an earlier, bigger run\n")  # a file this run would not write
    again = _live(out, "--devices", "1", "--arrive-round", "0", "--depart-round", "0", "--rounds", "2", "--E", "5")
    printed, _ = again.communicate(timeout=60)
    assert again.returncode == 2, printed[-3000:]
    assert f"{out} holds an earlier run (agent-7.log)" in printed and "--fresh" in printed, printed[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [".flexfl.lock", "agent-7.log"]  # nothing written or lost

    fresh = _live(out, "--devices", "1", "--arrive-round", "0", "--depart-round", "0", "--rounds", "2", "--E", "5",
                  "--fresh")
    printed, _ = fresh.communicate(timeout=180)
    assert fresh.returncode == 0, printed[-3000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
    assert len(aside) == 1 and (aside[0] / "agent-7.log").read_text() == "from an earlier, bigger run\n"
    assert f"moved the earlier run in {out} to {aside[0]}" in printed
    assert not (out / "agent-7.log").exists() and json.loads((out / "summary.json").read_text())["rounds"] == 2


def test_event_rounds_scale_with_rounds_and_zero_means_none():
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=20))
    assert (cfg.arrival, cfg.departure) == (6, 13)
    assert LiveConfig(run=DeadlineRunSpec(rounds=2)).arrival == 0  # too short for an arrival: none rather than an error
    one = LiveConfig(run=DeadlineRunSpec(rounds=5), arrive_round=0, depart_round=0,
                     partition=LiveConfig().partition.__class__(n_devices=1))
    assert (one.arrival, one.departure, one.devices) == (0, 0, 1)
    with pytest.raises(ConfigError, match=r"--arrive-round 0 / --depart-round 0 drop an event"):
        LiveConfig(partition=LiveConfig().partition.__class__(n_devices=1))


def test_make_live_passes_rounds_and_event_rounds():
    def dry_run(target: str, *assignments: str) -> list[str]:
        out = subprocess.run(["make", "-n", "--no-print-directory", target, *assignments], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        return next(line for line in out.splitlines() if " live " in line).split()

    plain = dry_run("live", "ROUNDS=20")
    assert plain[plain.index("--rounds") + 1] == "20" and "--arrive-round" not in plain  # live's own 6 and 13
    both = dry_run("live", "ROUNDS=20", "ARRIVE=5", "DEPART=0")
    assert both[both.index("--arrive-round") + 1] == "5" and both[both.index("--depart-round") + 1] == "0"
    emulated = dry_run("live-emulated", "ARRIVE=3")
    assert emulated[emulated.index("--arrive-round") + 1] == "3"


def test_mnist_live_defaults_to_a_rate_and_split_that_train_and_flags_win(tmp_path):
    mnist = load_live_config(None, overrides={"partition": {"dataset": "mnist"}})
    assert mnist.rules.eta0 == 0.1 and mnist.partition.iid and mnist.partition.n_devices == 5
    assert load_live_config(None).rules.eta0 is None  # SYNTHETIC keeps the paper's eta_0 = 1
    mine = load_live_config(None, overrides={"partition": {"dataset": "mnist", "iid": False}, "rules": {"eta0": 0.002}})
    assert mine.rules.eta0 == 0.002 and not mine.partition.iid
    (tmp_path / "live.toml").write_text('[partition]\ndataset = "mnist"\niid = false\n')
    assert not load_live_config(tmp_path / "live.toml").partition.iid
    assert load_config(LiveConfig, None, overrides={"partition": {"dataset": "mnist"}}).rules.eta0 is None


def test_emulated_agents_follow_no_trace_and_pad_no_update_unless_asked(tmp_path):
    loopback = load_live_config(None)
    assert (loopback.trace_set, loopback.update_s) == (str(PAPER_TRACE_SET), 0.05) and device_traces(loopback)
    emulated = load_live_config(None, overrides={"emulate": {"enabled": True}})
    assert (emulated.trace_set, emulated.update_s, device_traces(emulated)) == ("", 0.0, [])
    mnist = load_live_config(None, overrides={"emulate": {"enabled": True}, "partition": {"dataset": "mnist"}})
    assert (mnist.trace_set, mnist.rules.eta0) == ("", 0.1)  # the dataset's own defaults still apply
    asked = load_live_config(None, overrides={"emulate": {"enabled": True}, "traces": {"set": str(PAPER_TRACE_SET)},
                                              "update_s": 0.02})
    assert (asked.trace_set, asked.update_s, len(device_traces(asked))) == (str(PAPER_TRACE_SET), 0.02, 5)
    (tmp_path / "live.toml").write_text(f'[traces]\nset = "{PAPER_TRACE_SET}"\n[emulate]\nenabled = true\n')
    assert load_live_config(tmp_path / "live.toml").trace_set == str(PAPER_TRACE_SET)  # a file asks as a flag does
    (tmp_path / "plain.toml").write_text("[emulate]\nenabled = true\n")
    assert load_live_config(tmp_path / "plain.toml").trace_set == ""


def test_emulated_cpu_and_upload_are_per_device_and_cycled_and_one_cpu_value_still_reads(tmp_path):
    cfg = LiveConfig(emulate=EmulationConfig(cpu=(0.5, 0.1), up_kbit=(0, 8000, 4000)))
    specs = [cfg.device_spec(i) for i in range(5)]
    assert [s.cpu_quota for s in specs] == [0.5, 0.1, 0.5, 0.1, 0.5]
    assert [s.up_kbit for s in specs] == [None, 8000, 4000, None, 8000]
    assert [s.cpu_quota for s in (LiveConfig(emulate=EmulationConfig(cpu=0.0)).device_spec(i) for i in (0, 1))] == \
        [None, None]  # 0: no quota
    (tmp_path / "one.toml").write_text("[emulate]\ncpu = 0.25\n")  # files from before the list
    assert load_live_config(tmp_path / "one.toml").device_spec(3).cpu_quota == 0.25
    (tmp_path / "list.toml").write_text("[emulate]\ncpu = [0.25, 0.1]\n")
    assert load_live_config(tmp_path / "list.toml").emulate.cpus == (0.25, 0.1)
    with pytest.raises(ConfigError, match=r"--emulate-cpu and --emulate-up-kbit must be >= 0, got \(0.25, -0.1\)"):
        LiveConfig(emulate=EmulationConfig(cpu=(0.25, -0.1)))


def _row(**fields) -> RoundRecord:
    """A round record with what these tests do not look at left neutral."""
    return RoundRecord(**({"round": 1, "lr": 0.5, "participants": (), "devices": (), "s": {}, "p": {},
                           "coefficients": {}, "discarded": False, "test_acc": 0.5, "test_loss": 1.0} | fields))


def test_a_round_line_says_why_a_device_stopped_short_and_rows_from_before_the_reason_print_as_before():
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=6), arrive_round=0, depart_round=0)
    row = _row(round=2, test_acc=0.5, test_loss=1.0, lr=0.5,
               s={"dev-0": 20, "dev-1": 7, "dev-2": 0, "dev-3": 0, "dev-4": 12})
    old = round_line(row, cfg)
    assert "s (E=20) dev-0:20 dev-1:7 dev-2:0 dev-3:0 dev-4:12" in old
    why = {"dev-0": "complete", "dev-1": "upload", "dev-2": "missed", "dev-3": "compute", "dev-4": "trace"}
    line = round_line(replace(row, stop_reason=why), cfg)
    # complete is what s = E says, trace what the agents' traces do: only the other reasons are printed
    assert "s (E=20) dev-0:20 dev-1:7 (upload) dev-2:0 (missed) dev-3:0 (compute) dev-4:12" in line, line


def test_the_summary_counts_each_devices_stop_reasons_and_rows_without_them_count_nothing():
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=6), arrive_round=0, depart_round=0)
    base = _row(participants=("a", "b"), s={"a": 20, "b": 3})
    rows = [replace(base, round=1),  # written before the field
            replace(base, round=2, stop_reason={"a": "complete", "b": "upload"}),
            replace(base, round=3, stop_reason={"a": "complete", "b": "compute"}),
            replace(base, round=4, stop_reason={"a": "complete", "b": "upload"})]
    assert summarize(rows, cfg, wall_s=1.0, dead_agents={})["stop_reasons"] == \
        {"a": {"complete": 3}, "b": {"upload": 2, "compute": 1}}


def test_a_late_device_that_did_not_arrive_as_asked_is_a_problem_of_the_run():
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=3), arrive_round=2, depart_round=0)
    row, last = _row(round=1), _row(round=3)
    never = summarize([row, last], cfg, wall_s=1.0, dead_agents={})
    assert never["problems"] and "dev-4 never arrived, not in round 2 as asked" in never["problems"][0]
    late = summarize([row, replace(row, round=3, arrivals=("dev-4",))], cfg, wall_s=1.0, dead_agents={})
    assert "arrived in round 3, not in round 2" in late["problems"][0]
    on_time = summarize([row, replace(row, round=2, arrivals=("dev-4",)), last], cfg, wall_s=1.0, dead_agents={})
    assert on_time["problems"] == [] and on_time["arrival_round"] == 2


def test_a_run_short_of_its_rounds_or_without_its_departure_is_a_problem_that_says_how_far_it_got():
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=4), arrive_round=0, depart_round=2, out="out/x")
    rows = [_row(round=r) for r in (1, 2, 3)]
    short = summarize(rows, cfg, wall_s=1.0, dead_agents={})["problems"]
    assert short[0].startswith("the run stopped after round 3 of 4 (the coordinator ended early")
    assert short[0].endswith("`flexfl live --resume --out out/x` continues it")
    assert short[1].startswith("dev-0 never departed, not after round 2 as asked")
    departed = [rows[0], replace(rows[1], departures=("dev-0",)), rows[2], _row(round=4)]
    assert summarize(departed, cfg, wall_s=1.0, dead_agents={})["problems"] == []
    # Stopped before the departure's round: only the rounds are missing, not the departure.
    assert len(summarize(rows[:1], cfg, wall_s=1.0, dead_agents={})["problems"]) == 1


def test_live_tells_the_coordinator_to_hold_the_scripted_rounds(tmp_path):
    from coordinator.config import load_coordinator_config
    from flexfl.app.live import write_configs

    cfg = LiveConfig(run=DeadlineRunSpec(rounds=30), traces=TracesConfig(set=""))
    coordinator_toml, _, _ = write_configs(cfg, tmp_path, "127.0.0.1:50051")
    run = load_coordinator_config(coordinator_toml).run
    assert run.expected_arrivals == {"dev-4": 10} and run.expected_departures == {"dev-0": 20}
    assert run.min_devices == 4


def test_live_without_emnist_says_why_on_the_terminal_and_leaves_its_folder_unclaimed(tmp_path):
    """Before: 'coordinator exited with code 2 ...; see coordinator.log', the reason inside the log."""
    env = {**os.environ, "FLEXFL_CACHE": str(tmp_path / "empty-cache")}
    live = subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "live", "--out", str(tmp_path / "run"),
                             "--dataset", "emnist", "--devices", "2", "--rounds", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    printed, _ = live.communicate(timeout=120)
    assert live.returncode == 2, printed[-3000:]
    last = printed.strip().splitlines()[-1]
    assert last.startswith("flexfl: error: EMNIST not found under"), last
    assert "emnist_root" in last and "Traceback" not in printed
    # Checked before the folder is claimed (before: configs, a log and fleet_token were written, and the
    # retry was refused as "an earlier run").
    assert not (tmp_path / "run").exists()


def test_live_runs_the_strategy_asked_for_and_names_it_with_its_parameters(tmp_path):
    out = tmp_path / "fedprox"
    # Paper traces T0/T30 (the later --trace-set wins): incomplete work, where FedProx and Scheme C differ.
    live = _live(out, "--devices", "2", "--rounds", "2", "--arrive-round", "0", "--depart-round", "0", "--E", "20",
                 "--trace-set", str(REPO / "traces" / "paper"), "--num-traces", "2",
                 "--strategy", "fedprox", "--mu", "0.1")
    printed, _ = live.communicate(timeout=180)
    assert live.returncode == 0, printed[-3000:]
    banner, *_, final, _report_line = printed.strip().splitlines()
    assert banner.endswith("FedProx (mu = 0.1); no arrival or departure"), banner
    assert "under FedProx (mu = 0.1) after 2 of 2 rounds" in final, final
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["strategy"], summary["strategy_parameters"]) == ("fedprox", {"mu": 0.1})
    # The coordinator aggregated as FedProx does (Scheme B's c_k = p_k), not as the default Scheme C.
    rows = read_metrics(out / "coordinator" / "metrics.jsonl")
    assert any(0 < s < 20 for row in rows for s in row.s.values()), [row.s for row in rows]
    for row in rows:
        assert all(row.coefficients[d] == pytest.approx(row.p[d] if row.s[d] > 0 else 0.0) for d in row.p)
    assert 'Aggregation strategy: <b class="strategy">FedProx (mu = 0.1)</b>' in (out / "report.html").read_text()


def test_the_start_up_checks_fail_on_a_missing_trace_set_or_an_address_not_here_and_write_nothing(tmp_path):
    from flexfl.app.live_cli import check_before_claim
    from flexfl.errors import FlexFLError

    out = tmp_path / "run"
    with pytest.raises(FlexFLError, match="nope"):
        check_before_claim(LiveConfig(traces=TracesConfig(set=str(tmp_path / "nope")), out=str(out)))
    with pytest.raises(ConfigError, match=r"cannot listen on 192\.0\.2\.1"):  # TEST-NET-1: never this machine's
        check_before_claim(LiveConfig(traces=TracesConfig(set=""), host="192.0.2.1", out=str(out)))
    check_before_claim(LiveConfig(traces=TracesConfig(set=""), out=str(out)))
    assert not out.exists()


def test_live_keeps_the_fleet_token_out_of_the_results_folder_and_its_processes_still_read_it(tmp_path):
    """Before: <out>/fleet_token, in the folder people zip and share (and its report listed it)."""
    from coordinator.config import load_coordinator_config
    from edge_agent.config import load_agent_config
    from flexfl.app.live import write_configs

    out = tmp_path / "demo"
    out.mkdir()
    cfg = LiveConfig(run=DeadlineRunSpec(rounds=3), traces=TracesConfig(set=""))
    coordinator_toml, agents, token = write_configs(cfg, out, "127.0.0.1:50051")
    assert not any("token" in p.name for p in out.rglob("*")) and token not in "".join(
        p.read_text() for p in out.rglob("*.toml"))
    assert load_coordinator_config(coordinator_toml).server.token() == token
    assert all(load_agent_config(a).token() == token for a in agents)
    assert Path(load_coordinator_config(coordinator_toml).server.fleet_token_file).parent == tmp_path / ".demo.secrets"
