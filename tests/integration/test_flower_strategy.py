"""FlexFL's strategy inside Flower's Simulation Engine (issue 35): a real ServerApp and ClientApps on Ray
(flower_apps.py, in a process of its own), aggregated by FlexFL's round. The model it ends with is the one FlexFL's
own Federation makes from the same replies, and the membership events are FlexFL's: nodes that answer in round 1
found the objective, a node that first answers later arrives with fast-reboot, an error reply counts as s = 0."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

import torch

from coordinator.rules.round import Arrival, Federation
from coordinator.rules.round_record import RoundRecord

APPS = Path(__file__).with_name("flower_apps.py")


def simulate(scenario: str, tmp_path: Path, *, run_dir: Path | None = None) -> dict:
    """Run flower_apps.py's `scenario` in its own process; its records, sample counts and final model (and, with
    `run_dir`, its run folder there)."""
    out = tmp_path / f"{scenario}.json"
    done = subprocess.run([sys.executable, str(APPS), scenario, str(out), *([str(run_dir)] if run_dir else [])],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    result["records"] = [RoundRecord.from_json(r, where=f"{out}:{i}") for i, r in enumerate(result["records"], 1)]
    return result


@pytest.mark.slow
def test_a_flower_run_aggregates_as_flexfls_round_with_its_membership_events(tmp_path: Path) -> None:
    sys.path.insert(0, str(APPS.parent))
    try:
        import flower_apps as apps
    finally:
        sys.path.remove(str(APPS.parent))
    result = simulate("strategy", tmp_path)
    records, counts = result["records"], result["sample_counts"]
    assert [r.round for r in records] == [1, 2, 3, 4]
    pid_of = {d: n // 100 - 1 for d, n in counts.items()}
    assert sorted(pid_of.values()) == [0, 1, 2, 3]
    late = next(d for d, p in pid_of.items() if p == apps.LATE)
    # Founding: the three nodes that answered round 1; the late node arrives at the close of round LATE.
    assert sorted(pid_of[d] for d in records[0].founded) == [0, 1, 2] and late not in records[0].devices
    assert records[apps.LATE - 1].arrivals == (late,) and late not in records[apps.LATE - 1].participants
    assert records[apps.LATE].p[late] > apps.n_of(apps.LATE) / sum(counts.values())  # fast-reboot's boost
    # The error reply of partition 1 in round 2 counts as s = 0; the others' s and reasons are what they reported.
    one = next(d for d, p in pid_of.items() if p == 1)
    assert records[1].s[one] == 0 and records[1].coefficients[one] == 0 and records[1].stop_reason[one] == "missed"
    for r in records:
        for d in r.participants:
            if not (d == one and r.round == 2):
                assert r.s[d] == apps.s_of(pid_of[d], r.round), (r.round, d)
                assert r.stop_reason[d] == ("complete" if r.s[d] == apps.E else "compute"), (r.round, d)
    # The oracle: FlexFL's Federation given the same replies in the same order ends with the same model.
    oracle = Federation(rules=apps.RULES, dataset="flower", params=apps.initial(), horizon=apps.ROUNDS)
    for r in records:
        if r.founded:
            oracle.apply_events(arrivals=[Arrival(d, apps.n_of(pid_of[d])) for d in r.founded])
        opening = oracle.open(r.round)
        assert opening.participants == r.participants and math.isclose(opening.lr, r.lr)
        weighing = oracle.weigh(r.round, {d: r.s[d] for d in r.participants})
        rows = list(weighing.contributors)
        deltas = {name: torch.stack([apps.delta_of(pid_of[d], r.round)[name] for d in rows]) for name in apps.SHAPES}
        oracle.close_stacked(weighing, deltas=deltas if rows else {}, rows=rows,
                             arrivals=[Arrival(d, apps.n_of(pid_of[d])) for d in r.arrivals])
        assert np.allclose(weighing.coefficients.values, [r.coefficients[d] for d in weighing.devices], rtol=1e-12)
    for name, values in result["params"].items():
        assert torch.allclose(torch.tensor(values), oracle.params[name], rtol=1e-5, atol=1e-7), name
    assert not torch.equal(torch.tensor(result["params"]["w"]), torch.zeros(apps.SHAPES["w"]))
