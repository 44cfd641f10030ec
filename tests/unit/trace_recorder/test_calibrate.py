"""The paper-calibrated generator: Table 2 within tolerance, grid, zeros, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flexfl.errors import ConfigError
from trace_recorder.calibrate import (
    ACTIVE_STD_REF_PCT,
    BANDWIDTH_TRACES,
    PAPER_TABLE2,
    PAPER_TRACE_ORDER,
    bandwidth_zero_share,
    fit_paper_models,
    generate_paper_traces,
    paper_manifest,
)
from trace_recorder.format import TraceManifest


@pytest.fixture(scope="module")
def traces():
    return generate_paper_traces(rounds=300, resolution=20, seed=0)


def test_table2_order_and_values() -> None:
    assert PAPER_TRACE_ORDER == ("T0", "T30", "T50", "T70", "T90", "Thi", "Tmi", "Tlo")
    assert PAPER_TABLE2["T90"] == (56.3, 14.8)
    assert PAPER_TABLE2["Tlo"] == (51.2, 18.3)


def test_sample_statistics_match_table2_within_tolerance(traces) -> None:
    assert [t.name for t in traces] == list(PAPER_TRACE_ORDER)
    for t in traces:
        mean, std = PAPER_TABLE2[t.name]
        assert abs(t.mean_pct - mean) <= 0.5, t.name
        assert abs(t.std_pct - std) <= 0.5, t.name


def test_fractions_lie_on_the_grid_and_zeros_only_in_bandwidth_traces(traces) -> None:
    for t in traces:
        steps = t.fraction * 20
        assert np.array_equal(steps, np.round(steps)), t.name
        assert t.round.tolist() == list(range(300))
        if t.name in BANDWIDTH_TRACES:
            assert 0 < t.zero_share < 0.2, t.name
        else:
            assert t.fraction.min() >= 1 / 20, t.name
    assert np.all(traces[0].fraction == 1.0)


def test_generation_is_deterministic_for_a_seed(traces) -> None:
    again = generate_paper_traces(rounds=300, resolution=20, seed=0)
    other = generate_paper_traces(rounds=300, resolution=20, seed=1)
    for a, b, c in zip(traces, again, other):
        assert np.array_equal(a.fraction, b.fraction)
        if a.name != "T0":
            assert not np.array_equal(a.fraction, c.fraction)


def test_other_sizes_still_match_table2() -> None:
    for t in generate_paper_traces(rounds=200, resolution=10, seed=3, tolerance_pct=0.25):
        mean, std = PAPER_TABLE2[t.name]
        assert abs(t.mean_pct - mean) <= 0.25 and abs(t.std_pct - std) <= 0.25, t.name


def test_zero_share_rule_leaves_the_reference_spread_on_active_rounds() -> None:
    for name in BANDWIDTH_TRACES:
        mean, std = PAPER_TABLE2[name]
        p0 = bandwidth_zero_share(mean_pct=mean, std_pct=std)
        q = 1 - p0
        m, s = mean / 100, std / 100
        active_std = np.sqrt((s * s + m * m) / q - (m / q) ** 2)
        assert active_std * 100 == pytest.approx(ACTIVE_STD_REF_PCT, abs=1e-9)
        assert 0.04 < p0 < 0.08
    assert bandwidth_zero_share(mean_pct=75.3, std_pct=10.0) == 0.0


def test_fitted_models_reproduce_the_traces(traces) -> None:
    models = fit_paper_models(rounds=300, resolution=20, seed=0)
    for model, t in zip(models, traces):
        assert model.name == t.name
        assert model.mean_pct == pytest.approx(t.mean_pct) and model.std_pct == pytest.approx(t.std_pct)
        assert model.rng_seed[:2] == (0, PAPER_TRACE_ORDER.index(t.name))
    assert models[0].mu == 1.0 and models[0].sigma == 0.0


def test_unreachable_tolerance_and_bad_arguments_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="cannot match Table 2 for T30"):
        generate_paper_traces(rounds=1)
    with pytest.raises(ConfigError, match="must be >= 1"):
        generate_paper_traces(rounds=0)
    with pytest.raises(ConfigError, match="tolerance_pct"):
        generate_paper_traces(tolerance_pct=0)


def test_paper_manifest_is_a_valid_calibrated_manifest() -> None:
    m = paper_manifest(rounds=300, resolution=20, seed=0, command="flexfl traces calibrate")
    assert m.kind == "calibrated" and m.name == "paper"
    assert "NOT recorded" in m.description and "Table 2" in m.description
    assert m.traces == PAPER_TRACE_ORDER
    assert m.conditions["T70"] == {"cpu_load_pct": 70} and m.conditions["Tmi"] == {"bandwidth": "mi"}
    assert m.deadline_s is None and m.hosts == () and m.required_updates == 20
    assert m.source["seed"] == 0 and m.source["command"] == "flexfl traces calibrate"
    assert set(m.source["fits"]) == set(PAPER_TRACE_ORDER)
    assert TraceManifest.from_dict(json.loads(m.to_json()), path="manifest.json") == m
