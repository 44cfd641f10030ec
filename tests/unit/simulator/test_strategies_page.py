"""The strategies page's grid, FedProx's mu protocol and its tables (the runs themselves: test_paired)."""

from __future__ import annotations

import math

import pytest

from flexfl.errors import ConfigError
from simulator.paper.operating_point import PROTOCOL_SEEDS
from simulator.paper.regime import Regime
from simulator.paper.strategies_page import (
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
    lowest = lowest_loss_counts(rows)
    # Seed 0: every strategy but C at 1.0, a tie of five; seed 1: MIFA alone; seed 2 is incomplete.
    assert lowest.wins["mifa"] == 1 and sum(lowest.wins.values()) == 1
    assert lowest.ties == {("A", "B", "fednova", "fedprox", "mifa"): 1} and lowest.groups == 2


def test_losses_within_the_tolerance_are_a_tie_not_a_ranking():
    """Issue 33 item 11: the page ranked C against MIFA where their final losses differ by <= 2e-4."""
    from simulator.paper.strategies_page import TIE_TOLERANCE

    def group(seed, **losses):
        return [{"setting": "iid", "num_traces": 2, "seed": seed, "scheme": n, "final_loss": losses.get(n, 1.0)}
                for n in STRATEGIES]

    rows = [*group(0, C=0.2343734, mifa=0.2343817), *group(1, C=0.2290, mifa=0.2290 + 2 * TIE_TOLERANCE),
            *group(2, A=0.5, C=0.5 + TIE_TOLERANCE)]
    lowest = lowest_loss_counts(rows)
    assert lowest.wins["C"] == 1 and lowest.wins["mifa"] == 0
    assert lowest.ties == {("A", "C"): 1, ("C", "mifa"): 1}
    assert lowest.text() == (
        "Lowest final test loss, per (setting, |T|, seed) group (losses within 0.0005 of the lowest, half the last "
        "digit printed above, tie with it): A 0, B 0, C 1, fednova 0, fedprox 0, mifa 0; tied: A = C 1, C = mifa 1 "
        "(of 3 complete groups).\n")


def test_the_page_renders_again_from_its_committed_files(tmp_path):
    """strategies_runs.csv, the plan, mu and timing files hold every figure of the page."""
    import csv

    from simulator.paper.choices_file import write_choice
    from simulator.paper.strategies_page import MU_FILE, RUNS_CSV, page_from_csv, record_plan, section_key

    record_plan(tmp_path, "synthetic", REGIME, seeds=[0], num_traces=[2], settings=["iid"], command="cmd")
    write_choice(tmp_path / MU_FILE, (section_key("synthetic", REGIME),), {
        "mu": 0.01, "mean_final_test_loss": {"0.01": 0.5}, "seeds": [100], "num_traces": 5, "rounds": 200,
        "timing": "1 min"})
    with open(tmp_path / RUNS_CSV, "w", newline="") as f:
        w = csv.DictWriter(f, ["dataset", "regime", "setting", "num_traces", "seed", "scheme", "final_acc",
                               "last20_acc", "final_loss", "wall_s"])
        w.writeheader()
        w.writerows({"dataset": "synthetic", "regime": REGIME.tag, "setting": "iid", "num_traces": 2, "seed": 0,
                     "scheme": n, "final_acc": 0.5 + i / 100, "last20_acc": 0.5, "final_loss": 1 - i / 10,
                     "wall_s": 1.0} for i, n in enumerate(STRATEGIES))
    page = page_from_csv(tmp_path).read_text()
    assert "**6 of 6 runs finished** (seeds with runs: [0]). Wall time: not recorded." in page
    assert "| MIFA | 55.0 [55.0, 55.0] |" in page and "| MIFA | 0.500 [0.500, 0.500] |" in page
    assert "A 0, B 0, C 0, fednova 0, fedprox 0, mifa 1 (of 1 complete groups)" in page
    stem = f"strategies_{section_key('synthetic', REGIME)}_iid"
    assert f"![{stem}]({stem}.png)" in page


def test_a_page_without_a_plan_and_a_bad_mu_file_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"strategies_plan\.json does not exist"):
        write_page(tmp_path, timing={})
    (tmp_path / "strategies_mu.toml").write_text('["synthetic_epoch-eta0=0.3"]\nmu = -1\n')
    with pytest.raises(ConfigError, match=r"needs mu, a number > 0"):
        chosen_mu(tmp_path, "synthetic", REGIME)
    (tmp_path / "strategies_mu.toml").write_text("[oops\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        chosen_mu(tmp_path, "synthetic", REGIME)
