"""Hand-made run folders in the formats `flexfl report` reads."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import MetricsWriter
from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import write_config

E = 10


def _round(n: int, *, participants, devices, s, rejected=None, arrivals=(), departures=(), acc=0.5, loss=1.0) -> dict:
    """One record in the coordinator's per-round schema.

    As the coordinator writes it: coordinator.rules.round_record.RoundRecord's to_json, with its live part."""
    updates = [d for d in participants if d in s]
    # As the coordinator decides it for devices it took nothing from, and agents that stopped short of E on time.
    why = {d: "offline" if d not in participants else "missed" if not s.get(d)
           else "complete" if s[d] == E else "compute" for d in devices}
    return {
        "round": n, "time": 1.7e9 + n, "lr": 1.0 / n, "close_reason": "deadline" if 0 in s.values() else "all answered",
        "participants": list(participants), "devices": list(devices),
        "s": {d: s.get(d, 0) for d in devices}, "p": {d: 1 / len(devices) for d in devices},
        "coefficients": {d: s.get(d, 0) / E / len(devices) for d in devices}, "discarded": False,
        "test_acc": acc, "test_loss": loss,
        "bytes_out": {d: 1000 for d in participants}, "bytes_in": {d: 400 for d in updates if s[d] > 0},
        "train_s": {d: 0.1 * s[d] for d in updates}, "local_loss": {d: 0.5 for d in updates},
        "previous_upload_s": {d: 0.01 for d in updates}, "stop_reason": why,
        "arrived_after_s": {d: 0.1 * s[d] + 0.05 for d in updates},
        "rejected": {d: [reason] for d, reason in (rejected or {}).items()}, "arrivals": list(arrivals),
        "departures": list(departures),
        "round_s": 1.5, "aggregate_eval_s": 0.02, "overhead_s": None if n == 1 else 0.01,
    }


# dev-0..2 from the start; dev-3 arrives during round 2 (trains from 3); dev-0 departs during 3.
# Round 1: dev-2 inactive. Round 2: dev-1's update rejected (s = 0). Round 3: dev-2 rejected once,
# then a valid s = 5 arrived. Round 4: dev-0 absent (departed, excluded).
ROUNDS = [
    _round(1, participants=["dev-0", "dev-1", "dev-2"], devices=["dev-0", "dev-1", "dev-2"],
           s={"dev-0": 10, "dev-1": 4, "dev-2": 0}, acc=0.3, loss=2.2),
    _round(2, participants=["dev-0", "dev-1", "dev-2"], devices=["dev-0", "dev-1", "dev-2"],
           s={"dev-0": 10, "dev-1": 0, "dev-2": 6}, rejected={"dev-1": "tensor 'fc.weight' has shape (3,) not (10, 5)"},
           arrivals=["dev-3"], acc=0.4, loss=1.8),
    _round(3, participants=["dev-0", "dev-1", "dev-2", "dev-3"], devices=["dev-0", "dev-1", "dev-2", "dev-3"],
           s={"dev-0": 8, "dev-1": 10, "dev-2": 5, "dev-3": 2}, rejected={"dev-2": "update contains NaN"},
           departures=["dev-0"], acc=0.55, loss=1.4),
    _round(4, participants=["dev-1", "dev-2", "dev-3"], devices=["dev-1", "dev-2", "dev-3"],
           s={"dev-1": 10, "dev-2": 10, "dev-3": 10}, acc=0.6, loss=1.1),
]


def write_metrics(path: Path, records: list[dict]) -> None:
    writer = MetricsWriter(path, append=False)
    for r in records:
        writer.write(r)
    writer.close()


@pytest.fixture
def live_dir(tmp_path: Path) -> Path:
    """Today's `flexfl live` folder: no run.json; coordinator.toml and agent-*.toml beside the metrics."""
    run = tmp_path / "live"
    write_metrics(run / "coordinator" / "metrics.jsonl", ROUNDS)
    write_config(run / "coordinator.toml", CoordinatorConfig(
        server=ServerConfig(listen="127.0.0.1:1"), rules=RulesConfig(required_updates=E),
        run=RunConfig(rounds=4, deadline_s=2.0), output=OutputConfig(dir=str(run / "coordinator"))))
    traces = ["T0", "T30", "T50", ""]
    for i, trace in enumerate(traces):
        write_config(run / f"agent-{i}.toml", AgentConfig(
            coordinator="127.0.0.1:1", device_id=f"dev-{i}", shard_index=i,
            participation=ParticipationConfig(trace=f"/somewhere/traces/paper:{trace}" if trace else "")))
    (run / "coordinator.log").write_text("log\n")
    return run


@pytest.fixture
def sim_dir(tmp_path: Path) -> Path:
    """The format the simulator is moving to: run.json + metrics.jsonl, without bytes, durations, rejections."""
    run = tmp_path / "sim"
    keep = ("round", "lr", "participants", "devices", "s", "p", "coefficients", "discarded", "test_acc",
            "test_loss", "arrivals", "departures")
    write_metrics(run / "metrics.jsonl", [{k: r[k] for k in keep} for r in ROUNDS])
    (run / "run.json").write_text(json.dumps({
        "kind": "sim", "config": {"dataset": "synthetic", "scheme": "C"},
        "devices": {f"dev-{i}": {"trace": t, "shard": i} for i, t in enumerate(["T0", "T30", None, "Tlo"])},
        "deadline_s": None, "required_updates": E}))
    return run


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """A results folder of `flexfl sim schemes`: final CSV + per-run CSV/JSON in runs/schemes_synthetic/."""
    root = tmp_path / "results"
    runs = root / "runs" / "schemes_synthetic"
    runs.mkdir(parents=True)
    rows = []
    for seed in (0, 1):
        for scheme, acc in zip("ABC", (0.5, 0.6, 0.63)):
            rows.append({"setting": "niid", "num_traces": 3, "seed": seed, "scheme": scheme,
                         "final_acc": acc + 0.01 * seed, "final_loss": 1.0})
            with open(runs / f"niid_T3_seed{seed}_{scheme}.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=["scheme", "round", "test_acc", "test_loss"])
                w.writeheader()
                w.writerows({"scheme": scheme, "round": n, "test_acc": acc * n / 3, "test_loss": 1} for n in (1, 2, 3))
            (runs / f"niid_T3_seed{seed}_{scheme}.json").write_text(json.dumps(
                {"config": {"partition": {"dataset": "synthetic"}}, "final_acc": acc + 0.01 * seed, "final_loss": 1.0}))
    with open(root / "schemes_synthetic_final.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (root / "schemes_synthetic.md").write_text("# notes\n")
    return root


def _settings(share: float, up: int | None, online: bool = True):
    from loadgen.fleet_timeline import Settings

    return Settings(cpu_share=share, cpu_quota=None if share == 1 else 0.25 * share, up_kbit=up, down_kbit=16000,
                    online=online).record()


# What the fleet applied (as flexfl.app.live_conditions writes it): dev-1 at half its CPU in round 1 (its s = 4),
# dev-2 offline in round 1 (its s = 0), dev-3 from its first round as a participant; round 3 changed inside.
CONDITIONS = [
    {"round": 1, "time": 1.7e9 + 1, "t_s": 0.0, "devices": {"dev-0": _settings(1, 8000), "dev-1": _settings(0.5, 8000),
                                                            "dev-2": _settings(1, 8000, online=False)}},
    {"round": 2, "time": 1.7e9 + 2, "t_s": 2.0, "devices": {"dev-0": _settings(1, 8000), "dev-1": _settings(1, 8000),
                                                            "dev-2": _settings(1, 800)}},
    {"round": 3, "time": 1.7e9 + 3, "t_s": 4.0, "devices": {d: _settings(1, 8000) for d in ("dev-0", "dev-1",
                                                                                            "dev-2", "dev-3")}},
    {"round": 3, "time": 1.7e9 + 4, "t_s": 5.0, "devices": {d: _settings(0.1, 8000) for d in ("dev-0", "dev-1",
                                                                                            "dev-2", "dev-3")}},
    {"round": 4, "time": 1.7e9 + 5, "t_s": 6.0, "devices": {d: _settings(1, 8000) for d in ("dev-1", "dev-2",
                                                                                            "dev-3")}},
]


@pytest.fixture
def timeline_dir(live_dir: Path) -> Path:
    """A `flexfl live --emulate --timeline` folder: the live folder and the conditions.jsonl its fleet wrote."""
    from loadgen.fleet_timeline import CONDITIONS_FILE

    write_metrics(live_dir / CONDITIONS_FILE, CONDITIONS)
    return live_dir
