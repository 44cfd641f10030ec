"""`flexfl traces fidelity` without a fleet: the profile it derives, its work folder's phases and resume, the page.

The recorded set and the live run's metrics are written here as the phases would leave them
(the netns test runs the phases themselves); the simulations run for real.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from coordinator.rules.round_record import LiveRound, RoundRecord
from flexfl.app.cli import main
from flexfl.errors import ConfigError
from trace_recorder.fidelity.experiment import (
    AfterStart,
    FidelityConfig,
    FidelityOptions,
    WorkFolder,
    fidelity_profile,
    live_kept_rounds,
    live_start_rounds,
    run_fidelity,
)
from trace_recorder.fidelity.stats import ks_distance
from trace_recorder.format import Trace, TraceManifest, utc_now_iso, write_trace_set

PROFILE = """
name = "unit-fidelity"
rounds = 100
seed = 0
[partition]
dataset = "synthetic"
total_samples = 600
[rules]
required_updates = 4
scheme = "B"
[[traces]]
name = "T0"
[[traces]]
name = "T90"
cpu_load_pct = 90
[[traces]]
name = "T50"
cpu_load_pct = 50
"""

RECORDED = {"T0": [1.0] * 6, "T90": [0.25, 0.5, 0.5, 0.75, 0.25, 0.0]}
# s per live round (E = 4). The recorder's rule keeps rounds 3-5: T90 did not get round 1's model (no
# bytes_out), round 2 is the first all-delivered one (settling), round 6 has no successor.
LIVE_S = {"T0": [4, 4, 4, 3, 4, 4], "T90": [0, 3, 3, 3, 1, 3]}


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.toml"
    path.write_text(PROFILE)
    return path


def _config(profile_file, **fields) -> FidelityConfig:
    return FidelityConfig(**{"profile": str(profile_file), "traces": ("T0", "T90"), "record_rounds": 6,
                             "live_rounds": 6, "sim_seeds": 3, **fields})


def _phases_record_and_live_done(work: WorkFolder) -> None:
    """The files the record and live phases leave, and their state."""
    manifest = TraceManifest(schema_version=1, name="traces", kind="recorded", description="unit test",
                             source={"test": True}, required_updates=4, deadline_s=0.2, traces=("T0", "T90"),
                             conditions={"T0": {"cpu_load_pct": 0}, "T90": {"cpu_load_pct": 90,
                                                                            "cpu_load_achieved_pct": 81.5}},
                             hosts=(), created=utc_now_iso())
    write_trace_set(work.traces, manifest, [Trace(name=t, round=np.arange(6), fraction=np.array(f))
                                            for t, f in RECORDED.items()])
    rows = []
    for i in range(6):
        arrived = ["T0"] if i == 0 else ["T0", "T90"]
        live = LiveRound(time=0.0, close_reason="deadline", bytes_out={t: 100 for t in arrived}, bytes_in={},
                         train_s={}, local_loss={}, rejected={}, round_s=0.2, aggregate_eval_s=0.0, overhead_s=None)
        s = {t: LIVE_S[t][i] for t in LIVE_S}
        rows.append(RoundRecord(round=i + 1, lr=0.1, participants=tuple(s), devices=tuple(s), s=s, p={},
                                coefficients={}, discarded=False, test_acc=0.3 + 0.05 * i, test_loss=1.2 - 0.1 * i,
                                live=live))
    (work.live / "coordinator").mkdir(parents=True)
    (work.live / "coordinator" / "metrics.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    work.finish("record", elapsed_s=60.0, loadavg=[1.0, 1.2])
    work.finish("live", elapsed_s=30.0, loadavg=[1.1], devices=["T0", "T90"], cpu_achieved={"T90": 80.2})


def test_the_fidelity_profile_keeps_the_loads_and_takes_the_fl_rules(profile_file):
    p = fidelity_profile(_config(profile_file, eta0=0.3, warmup_rounds=5))
    assert [(t.name, t.cpu_load_pct) for t in p.traces] == [("T0", 0.0), ("T90", 90.0)]  # the chosen traces, in order
    assert p.rounds == 6 and p.deadline.warmup_rounds == 5
    assert p.rules.scheme.value == "C" and p.rules.eta0 == 0.3 and p.rules.required_updates == 4
    assert fidelity_profile(_config(profile_file, traces=())).traces[2].name == "T50"  # () = every trace
    mnist = fidelity_profile(FidelityConfig())  # the paper profile: MNIST at flexfl live's eta_0, IID
    assert mnist.partition.iid and mnist.rules.eta0 == 0.1 and mnist.rules.batch_size == 10
    with pytest.raises(ConfigError, match="has no trace T77"):
        fidelity_profile(_config(profile_file, traces=("T0", "T77")))


def test_a_work_folder_of_another_config_is_refused_naming_what_differs(tmp_path, profile_file):
    cfg = _config(profile_file)
    work = WorkFolder(tmp_path / "work", cfg, fidelity_profile(cfg))
    work.open()
    work.finish("record", elapsed_s=1.0)
    again = WorkFolder(tmp_path / "work", cfg, fidelity_profile(cfg))
    again.open()
    assert again.done("record") and not again.done("live")
    other = _config(profile_file, live_rounds=7, sim_seeds=4)
    with pytest.raises(ConfigError, match=r"work holds a fidelity run of another config \(differs in live_rounds, "
                                          r"sim_seeds\); pass another --work or remove the folder"):
        WorkFolder(tmp_path / "work", other, fidelity_profile(other)).open()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(ConfigError, match=r"busy is not empty and holds no fidelity\.json"):
        WorkFolder(tmp_path / "busy", cfg, fidelity_profile(cfg)).open()


def test_the_cli_refuses_bad_input_in_one_line(tmp_path, profile_file, capsys):
    work = tmp_path / "work"
    assert main(["traces", "fidelity", "--profile", str(profile_file), "--traces", "T0,Tx", "--work", str(work)]) == 2
    assert main(["traces", "fidelity", "--profile", str(tmp_path / "missing.toml"), "--work", str(work)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "has no trace Tx" in err[0] and "missing.toml: cannot read config" in err[1], err
    assert not work.exists()  # nothing was made


def test_after_start_takes_the_live_s_in_the_start_rounds_and_the_traces_after():
    class Const:
        def __init__(self, s):
            self.s, self.trace_names = s, ["a", "b"]

        def draw(self, shard, round_index):
            return self.s + shard

    part = AfterStart(Const(10), start=Const(0), rounds=2)
    assert part.trace_names == ["a", "b"]
    assert [part.draw(1, r) for r in (1, 2, 3, 4)] == [1, 1, 11, 11]


def test_live_rounds_kept_by_the_recorders_rule():
    def row(k: int) -> RoundRecord:
        live = LiveRound(time=0.0, close_reason="deadline", bytes_out={"a": 1, "b": 1} if k > 2 else {"a": 1},
                         bytes_in={}, train_s={}, local_loss={}, rejected={}, round_s=1.0, aggregate_eval_s=0.0,
                         overhead_s=None)
        return RoundRecord(round=k, lr=0.1, participants=("a", "b"), devices=("a", "b"), s={"a": 1, "b": 1}, p={},
                           coefficients={}, discarded=False, test_acc=0.5, test_loss=1.0, live=live)

    rows = [row(k) for k in range(1, 8)]
    # settled in round 3 (the first in which both received the model); 7 has no successor
    assert live_kept_rounds(rows, ["a", "b"]) == [4, 5, 6]
    assert live_start_rounds(rows, ["a", "b"]) == 3


def test_finished_phases_are_skipped_an_interrupted_one_resumes_and_the_page_has_the_figures(
        tmp_path, profile_file, capsys):
    cfg = _config(profile_file)
    opts = FidelityOptions(config=cfg, work=tmp_path / "work", page=tmp_path / "page" / "fid.md", command="test")
    work = WorkFolder(opts.work, cfg, fidelity_profile(cfg))
    work.open()
    _phases_record_and_live_done(work)

    result = run_fidelity(opts)  # record and live are done; the simulations run here
    out = capsys.readouterr().out
    assert "phase 1/4 record: done in an earlier run" in out and "phase 2/4 live: done in an earlier run" in out
    assert "fidelity phase 3/4 simulate\n" in out and "simulate traces-seed-3 (4/12)" in out
    assert "simulate live-s-seed-3 (8/12)" in out and "simulate traces-after-live-start-seed-3 (12/12)" in out
    sims = {p.name: p.read_text() for p in work.sims.iterdir()}
    assert sorted(sims) == sorted(f"{source}-seed-{seed}.json" for seed in range(4)
                                  for source in ("live-s", "traces", "traces-after-live-start"))

    # (a) KS over the live rounds the recorder's rule keeps: 3..5
    with open(tmp_path / "page" / "fid_devices.csv") as f:
        devices = {r["device"]: r for r in csv.DictReader(f)}
    live_t90 = np.array(LIVE_S["T90"][2:5]) / 4
    assert float(devices["T90"]["ks"]) == pytest.approx(ks_distance(live_t90, RECORDED["T90"]), abs=1e-6)
    # live [3, 3, 1] / 4 vs recorded: at 0.5, F = 1/3 vs 5/6 (rounds 2-5 would give 1/4 vs 5/6)
    assert float(devices["T90"]["ks"]) == pytest.approx(1 / 2, abs=1e-6)
    assert float(devices["T0"]["ks"]) == pytest.approx(1 / 3, abs=1e-6)  # one of three live rounds at 3/4
    assert float(devices["T90"]["mean_diff"]) == pytest.approx(live_t90.mean() - np.mean(RECORDED["T90"]), abs=1e-6)
    # the two rounds the rule drops, which no trace holds: T90 did 0 and 3 of E = 4
    assert float(devices["T90"]["live_start_mean"]) == pytest.approx(3 / 8) and devices["T0"]["live_start_mean"] == "1"
    # (b) the share of live rounds inside the band of the three simulations, as the per-round CSV shows them
    with open(tmp_path / "page" / "fid_curves.csv") as f:
        rounds = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rounds] == [1, 2, 3, 4, 5, 6]
    acc = result["curves"][0]
    inside = [float(r["test_acc_band_min"]) <= float(r["test_acc_live"]) <= float(r["test_acc_band_max"])
              for r in rounds]
    assert acc.metric == "test_acc" and acc.inside_share == pytest.approx(np.mean(inside))
    assert math.isfinite(acc.live_loo_share) and len(acc.sim_loo_shares) == 3
    # the made-up live curve is not what the simulator makes of the live s: the replay column shows the gap
    assert acc.replay_max_gap > 0.01
    # seed for seed: traces - live s, from the per-round columns of both simulations
    assert acc.paired_seeds == (0, 1, 2, 3)
    for seed, diff in zip(acc.paired_seeds, acc.paired_mean_diffs):
        expected = np.mean([float(r[f"test_acc_traces_seed{seed}"]) - float(r[f"test_acc_live_s_seed{seed}"])
                            for r in rounds])
        assert diff == pytest.approx(expected, abs=1e-5)
    assert any(d != 0 for d in acc.paired_mean_diffs)  # T90's live s is not what its trace draws
    for seed, diff in zip(acc.paired_seeds, acc.start_mean_diffs):
        expected = np.mean([float(r[f"test_acc_traces_after_live_start_seed{seed}"])
                            - float(r[f"test_acc_live_s_seed{seed}"]) for r in rounds])
        assert diff == pytest.approx(expected, abs=1e-5)
    # the first two rounds are the live run's in both, so the curves agree there (and differ after)
    assert rounds[1]["test_loss_traces_after_live_start_seed1"] == rounds[1]["test_loss_live_s_seed1"]
    assert rounds[1]["test_loss_traces_seed1"] != rounds[1]["test_loss_live_s_seed1"]
    assert rounds[4]["test_loss_traces_after_live_start_seed1"] != rounds[4]["test_loss_live_s_seed1"]
    page = (tmp_path / "page" / "fid.md").read_text()
    assert "| T90 | CPU competitor 90 % | 6 / 3 |" in page and "| 82 / 80 |" in page
    assert (tmp_path / "page" / "fid_ecdf.png").stat().st_size > 10_000
    assert (tmp_path / "page" / "fid_curves.png").stat().st_size > 10_000

    # Interrupted during the simulations: seed-2 is missing and the phase is not done. Only seed-2 runs again,
    # and it comes out as before (every draw is seeded).
    work = WorkFolder(opts.work, cfg, fidelity_profile(cfg))
    work.open()
    del work.state["phases"]["simulate"]
    work.save()
    (work.sims / "traces-seed-2.json").unlink()
    run_fidelity(opts)
    out = capsys.readouterr().out
    assert out.count("simulate ") == 1 and "simulate traces-seed-2 (1/1)" in out
    assert {p.name: p.read_text() for p in work.sims.iterdir()}.keys() == sims.keys()
    again = json.loads((work.sims / "traces-seed-2.json").read_text())["rounds"]
    assert again == json.loads(sims["traces-seed-2.json"])["rounds"]

    run_fidelity(opts)  # everything done: only the page is written again
    out = capsys.readouterr().out
    assert out.count("done in an earlier run") == 3 and "simulate seed" not in out


def test_the_phases_keep_their_fleet_tokens_beside_the_work_folder_not_in_it(tmp_path, profile_file, monkeypatch):
    """The recorder's token was work/record/fleet_token (the live phase's work/live/fleet_token): in the folder
    whose traces and metrics are copied out."""
    from trace_recorder.fidelity import experiment

    cfg = _config(profile_file)
    work = WorkFolder(tmp_path / "work", cfg, fidelity_profile(cfg))
    work.open()
    asked = []
    monkeypatch.setattr(experiment, "record", lambda opts: asked.append(opts) or {"elapsed_s": 1.0})
    experiment._record(work, FidelityOptions(config=cfg, work=work.path))
    assert asked[0].secrets == tmp_path / ".work.secrets" / "record" and asked[0].secrets.is_dir()
    assert work.secrets(work.live) == tmp_path / ".work.secrets" / "live"
    assert not (work.path / ".record.secrets").exists() and not (work.path / ".live.secrets").exists()
