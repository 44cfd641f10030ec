"""The shipped `traces/paper/` set: readable, complete, calibrated, and not hand-edited."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trace_recorder.calibrate import PAPER_TABLE2, PAPER_TRACE_ORDER, generate_paper_traces
from trace_recorder.format import TraceSet, read_trace_set

PAPER_SET = Path(__file__).resolve().parents[3] / "traces" / "paper"


@pytest.fixture(scope="module")
def paper() -> TraceSet:
    return read_trace_set(PAPER_SET)


def test_shipped_set_has_the_paper_traces_in_order(paper: TraceSet) -> None:
    assert paper.manifest.kind == "calibrated"
    assert paper.manifest.traces == PAPER_TRACE_ORDER
    assert [t.name for t in paper.traces] == list(PAPER_TRACE_ORDER)
    assert all(len(t) >= 200 for t in paper.traces)


def test_shipped_set_matches_table2_within_one_point(paper: TraceSet) -> None:
    for t in paper.traces:
        mean, std = PAPER_TABLE2[t.name]
        assert abs(t.mean_pct - mean) <= 1.0, t.name
        assert abs(t.std_pct - std) <= 1.0, t.name


def test_zeros_only_in_the_bandwidth_traces(paper: TraceSet) -> None:
    assert all(t.zero_share == 0 for t in paper.first(5))
    assert all(t.zero_share > 0 for t in paper.traces[5:])


def test_shipped_set_is_what_its_recorded_command_generates(paper: TraceSet) -> None:
    src = paper.manifest.source
    regenerated = generate_paper_traces(rounds=src["rounds"], resolution=src["resolution"], seed=src["seed"],
                                        tolerance_pct=src["tolerance_pct"])
    for shipped, fresh in zip(paper.traces, regenerated):
        assert np.array_equal(shipped.fraction, fresh.fraction), shipped.name
