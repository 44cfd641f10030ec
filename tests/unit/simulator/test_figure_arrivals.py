"""The multi-arrival figure on SYNTHETIC, shortened: real paired runs, then the page and its per-run CSV."""

import csv

import numpy as np
import pytest

from flexfl.errors import ConfigError
from simulator.paper import figure_arrivals
from simulator.sweep import read_metrics, run_sweep


def test_synthetic_figure_pairs_runs_and_every_page_number_is_in_its_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(figure_arrivals, "ROUNDS", 50)
    monkeypatch.setattr(figure_arrivals, "FIRST_ROUNDS", (10, 20, 30))
    work = tmp_path / "runs"
    groups = figure_arrivals.groups(seeds=[0, 1], dataset="synthetic")
    assert {r.config.partition.dataset for g in groups for r in g.runs} == {"synthetic"}
    run_sweep(groups, work_dir=work)
    for seed in (0, 1):
        fast = [r.test_acc for r in read_metrics(work, f"seed{seed}_fast")]
        vanilla = [r.test_acc for r in read_metrics(work, f"seed{seed}_vanilla")]
        assert len(fast) == len(vanilla) == 50
        # Same data, draws and schedule: identical until fast-reboot first acts (after the first arrival).
        assert fast[:9] == vanilla[:9]
        assert fast[10:] != vanilla[10:]

    path = figure_arrivals.write_page(tmp_path, work_dir=work, seeds=[0, 1], timing="t", dataset="synthetic")
    assert path.name == "figure_arrivals_synthetic.md" and (tmp_path / "figure_arrivals_synthetic.png").is_file()
    page = path.read_text()
    assert "SYNTHETIC(1,1)" in page and "--dataset synthetic" in page
    rows = list(csv.DictReader(open(tmp_path / "figure_arrivals_synthetic_runs.csv")))
    assert len(rows) == 2 * 2 * 3
    for r in rows:  # the window mean recomputes from the run's own metrics
        acc = 100 * np.array([m.test_acc for m in read_metrics(work, f"seed{r['seed']}_{r['reboot']}")])
        k = int(r["first_round"])
        assert float(r["mean_acc_20"]) == pytest.approx(acc[k - 1:k + 19].mean())


def test_unknown_dataset_is_refused():
    with pytest.raises(ConfigError, match="dataset must be one of synthetic, mnist"):
        figure_arrivals.groups(seeds=[0], dataset="emnist")


def test_the_page_renders_from_its_runs_csv_alone(tmp_path):
    """The committed <stem>_runs.csv holds every figure of the page (the plot aside)."""
    import json

    from simulator.paper.regime import Regime

    rows = [{"seed": s, "reboot": rb, "first_round": r, "mean_acc_20": 50 + s + (2 if rb == "fast" else 0) + r / 100,
             "final_acc": 60} for s in (0, 1, 2) for rb in ("fast", "vanilla") for r in figure_arrivals.FIRST_ROUNDS]
    with open(tmp_path / "figure_arrivals_synthetic_runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "figure_arrivals_synthetic_timing.json").write_text(json.dumps({"c": "1 min for `c`"}))
    page = figure_arrivals.page_from_csv(tmp_path, dataset="synthetic", seeds=[0, 1, 2], regime=Regime()).read_text()
    assert "| 100 | 54.0 | 52.0 | +2.0 [+2.0, +2.0] |" in page and "| 200 | 55.0 | 53.0 | +2.0 [+2.0, +2.0] |" in page
    assert "seeds [0, 1, 2]. Wall time: 1 min for `c`." in page
    assert "![multi-arrival](figure_arrivals_synthetic.png)" in page
