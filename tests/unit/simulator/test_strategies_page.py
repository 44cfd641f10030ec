"""The strategies page's grid, FedProx's mu protocol and its tables (the runs themselves: test_paired)."""

from __future__ import annotations

import math

import pytest

from flexfl.errors import ConfigError
from simulator.operating_point import PROTOCOL_SEEDS
from simulator.regime import Regime
from simulator.strategies_page import (
    MU_GRID,
    MU_NUM_TRACES,
    STRATEGIES,
    choose_mu,
    chosen_mu,
    lowest_loss_counts,
    metric_table,
    mu_groups,
    mu_scores,
    page_groups,
    write_page,
)

REGIME = Regime(unit="epoch", eta0="0.3")


def test_a_group_holds_every_strategy_on_one_partition_with_fedprox_at_its_mu():
    groups = page_groups("synthetic", REGIME, mu=0.01, seeds=[0, 1], num_traces=[1, 5])
    assert len(groups) == 2 * 2 * 2  # seeds x settings x |T|
    for g in groups:
        assert [r.labels["scheme"] for r in g.runs] == list(STRATEGIES)
        mus = {r.labels["scheme"]: r.config.rules.aggregation.proximal_mu for r in g.runs}
        assert mus["fedprox"] == 0.01 and all(v == 0.0 for k, v in mus.items() if k != "fedprox")
        assert all(r.config.rules.unit == "epoch" and r.config.rules.eta0 == 0.3 for r in g.runs)
        if g.runs[0].labels["num_traces"] == 1:  # only the paper's schemes are known identical at |T| = 1
            assert {r.labels["scheme"] for r in g.runs if r.same_as} == {"B", "C"}


def test_the_mu_protocol_runs_fedprox_alone_on_seeds_the_page_never_uses():
    groups = mu_groups("synthetic", REGIME)
    runs = [r for g in groups for r in g.runs]
    assert {r.config.rules.aggregation.name for r in runs} == {"fedprox"}
    assert sorted({r.labels["mu"] for r in runs}) == list(MU_GRID)
    assert {r.config.seed for r in runs} == set(PROTOCOL_SEEDS["synthetic"])
    assert {r.config.traces.num_traces for r in runs} == {MU_NUM_TRACES}
    assert not {r.config.seed for r in runs} & {0, 1, 2, 3, 4}


def test_mu_is_the_lowest_mean_final_loss_a_diverged_run_never_wins_ties_go_small():
    runs = [{"mu": 0.001, "final_loss": 0.5}, {"mu": 0.001, "final_loss": 0.7},
            {"mu": 0.1, "final_loss": 0.4}, {"mu": 0.1, "final_loss": 0.6},
            {"mu": 1.0, "final_loss": 0.1}, {"mu": 1.0, "error": "diverged"}]
    scores = mu_scores(runs)
    assert scores[0.001] == pytest.approx(0.6) and scores[0.1] == pytest.approx(0.5) and math.isinf(scores[1.0])
    assert choose_mu(scores) == 0.1
    assert choose_mu({0.01: 0.5, 0.001: 0.5}) == 0.001
    with pytest.raises(ConfigError, match="every mu of the grid diverged"):
        choose_mu({0.1: math.inf})


def test_tables_give_median_and_range_and_count_complete_groups_only():
    rows = [{"setting": "iid", "num_traces": 2, "seed": seed, "scheme": name,
             "final_loss": 1.0 + seed + (0.5 if name == "C" else 0.0) - (0.9 if (name, seed) == ("mifa", 1) else 0)}
            for seed in (0, 1) for name in STRATEGIES]
    rows.append({"setting": "iid", "num_traces": 2, "seed": 2, "scheme": "A", "final_loss": 0.0})  # incomplete group
    table = metric_table(rows, "final_loss", 1.0, settings=["iid"], num_traces=[2, 5])
    assert "| Scheme C | 2.000 [1.500, 2.500] | not run |" in table
    assert "| Scheme A | 1.000 [0.000, 2.000] | not run |" in table
    counts = lowest_loss_counts(rows)
    assert counts["mifa"] == 1 and counts["A"] == 1 and sum(counts.values()) == 2


def test_a_page_without_a_plan_and_a_bad_mu_file_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"strategies_plan\.json does not exist"):
        write_page(tmp_path, timing={})
    (tmp_path / "strategies_mu.toml").write_text('["synthetic_epoch-eta0=0.3"]\nmu = -1\n')
    with pytest.raises(ConfigError, match=r"needs mu, a number > 0"):
        chosen_mu(tmp_path, "synthetic", REGIME)
    (tmp_path / "strategies_mu.toml").write_text("[oops\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        chosen_mu(tmp_path, "synthetic", REGIME)
