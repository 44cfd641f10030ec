"""The fidelity page from hand-made phase data: its per-round s file, from which its KS distances recompute."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from trace_recorder.fidelity.page import FidelityInputs, read_s_csv, write_page
from trace_recorder.fidelity.stats import ks_distance, lag1_autocorrelation

DEVICES = ("T0", "T90")


def _inputs() -> FidelityInputs:
    rng = np.random.default_rng(0)
    rounds = 12

    def curve(offset: float) -> dict[str, np.ndarray]:
        return {"test_acc": np.linspace(0.3, 0.8, rounds) + offset, "test_loss": np.linspace(2.0, 0.5, rounds) - offset}

    band = {s: curve(0.01 * s) for s in (1, 2, 3)}
    return FidelityInputs(
        devices=DEVICES, conditions={"T0": "no load", "T90": "CPU competitor 90 %"},
        recorded={"T0": np.ones(10), "T90": rng.integers(0, 5, 10) / 4},
        live={"T0": np.array([1.0, 0.75, 1.0, 1.0]), "T90": np.array([0.25, 0.75, 0.5, 0.0])},
        live_curve={"round": np.arange(1, rounds + 1), **curve(0.0)}, band=band, live_s_band=band, live_seed=0,
        traces_at_live_seed=curve(0.02), live_s_replay=curve(0.0),
        traces_after_live_start={s: curve(0.01) for s in (0, 1, 2, 3)}, start_rounds=2,
        live_start={"T0": np.array([1.0, 1.0]), "T90": np.array([1.0, 0.5])})


def test_the_page_commits_each_devices_s_per_round_and_its_ks_distances_recompute_from_it(tmp_path) -> None:
    """Issue 33 item 11: the KS distances of results/trace_fidelity.md could not be recomputed, the live
    run's per-round s was not beside the page."""
    inputs = _inputs()
    result = write_page(inputs, tmp_path / "fid.md")
    s = read_s_csv(tmp_path / "fid_s.csv")
    for source, series in (("recorded", inputs.recorded), ("live", inputs.live), ("live_start", inputs.live_start)):
        assert {d: v.tolist() for d, v in s[source].items()} == {d: v.tolist() for d, v in series.items()}
    with open(tmp_path / "fid_devices.csv", newline="") as f:
        devices = {r["device"]: r for r in csv.DictReader(f)}
    for d in DEVICES:
        assert float(devices[d]["ks"]) == pytest.approx(ks_distance(s["live"][d], s["recorded"][d]), abs=1e-6)
        assert float(devices[d]["lag1_recorded"]) == pytest.approx(lag1_autocorrelation(s["recorded"][d]), abs=1e-5,
                                                                    nan_ok=True)
    assert result["files"]["s_csv"] == tmp_path / "fid_s.csv"
    page = (tmp_path / "fid.md").read_text()
    assert "`fid_s.csv` (each device's s/E per round, recorded and live: the KS distances' inputs)" in page
    assert "| | recorded | live | simulated |" in page  # the table helper keeps the empty corner cell


def test_an_s_file_with_an_unknown_source_names_its_line_and_column(tmp_path) -> None:
    from flexfl.errors import ReportError

    write_page(_inputs(), tmp_path / "fid.md")
    path = tmp_path / "fid_s.csv"
    lines = path.read_text().splitlines()
    assert lines[0] == "device,source,index,s_over_E"  # the header SLine's fields give
    path.write_text("\n".join([*lines[:3], lines[3].replace("recorded", "replayed"), *lines[4:]]) + "\n")
    with pytest.raises(ReportError, match=r"fid_s\.csv:4: column 'source': expected recorded or live or live_start, "
                                          r"got 'replayed'"):
        read_s_csv(path)
