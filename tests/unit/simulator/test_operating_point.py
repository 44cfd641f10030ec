"""The operating-point protocol's choice rule and the regime that applies its choice to every sweep."""

import math

import pytest

from flexfl.errors import ConfigError
from flexfl.vocabulary import Unit
from simulator.paper import operating_point as op
from simulator.paper import table3, table4, table5
from simulator.paper.regime import Regime


def _summary(k, loss, setting="iid", seed=100):
    s = {"k": k, "eta0": op.eta0_at("synthetic", k), "setting": setting, "seed": seed}
    return {**s, "error": "diverged"} if loss is None else {**s, "final_loss": loss, "final_acc": 0.5}


def test_the_lowest_mean_final_loss_wins_and_divergence_scores_infinity():
    runs = [_summary(-1, 0.5), _summary(-1, 0.7, "niid"), _summary(0, 0.4), _summary(0, 0.6, "niid"),
            _summary(1, 0.1), _summary(1, None, "niid")]
    cands = op.candidates(runs)
    assert [c.k for c in cands] == [-1, 0, 1]
    assert math.isinf(cands[2].score)  # one diverged run sinks the rate, however good the other
    best, edge = op.choose(cands)
    assert best.k == 0 and edge == 0 and best.score == pytest.approx(0.5)


def test_an_edge_winner_is_reported_so_the_grid_grows():
    best, edge = op.choose(op.candidates([_summary(-2, 0.1), _summary(-1, 0.2), _summary(0, 0.3)]))
    assert best.k == -2 and edge == -1
    with pytest.raises(ConfigError, match="every eta_0 of the grid diverged"):
        op.choose(op.candidates([_summary(0, None)]))


def test_protocol_runs_are_full_participation_fedavg_on_held_out_seeds():
    groups = op.groups("synthetic", "epoch", [0])
    cfgs = [r.config for g in groups for r in g.runs]
    assert {c.traces.num_traces for c in cfgs} == {1}  # T0 only: everyone completes, A = B = C
    assert {c.seed for c in cfgs} == set(op.PROTOCOL_SEEDS["synthetic"])
    assert not {c.seed for c in cfgs} & set(range(5))  # the tables' seeds
    assert {c.rules.unit for c in cfgs} == {Unit.EPOCH} and {c.rules.eta0 for c in cfgs} == {1.0}
    assert op.horizon("mnist", "epoch") == 20 and op.horizon("mnist", "step") == 200


def test_regime_protocol_reads_the_choice_and_fails_clearly_without_it(tmp_path):
    table = tmp_path / "operating_point.toml"
    with pytest.raises(ConfigError, match="flexfl sim operating-point --dataset mnist --unit epoch"):
        Regime(unit="epoch", eta0="protocol", table=table).eta0_for("mnist")
    best = op.Candidate(k=1, eta0=0.0063, losses=(0.3,), accs=(0.9,))
    op.record_choice("mnist", "epoch", best, table=table)
    assert Regime(unit="epoch", eta0="protocol", table=table).eta0_for("mnist") == 0.0063
    with pytest.raises(ConfigError, match=r"no \[synthetic.epoch\] eta0"):
        Regime(unit="epoch", eta0="protocol", table=table).eta0_for("synthetic")
    with pytest.raises(ConfigError, match="--eta0 'fast'"):
        Regime(eta0="fast")


def test_the_default_regime_keeps_the_step_readings_configs_and_another_reaches_every_table():
    default, epoch = Regime(), Regime(unit="epoch", eta0="paper")
    assert default.eta0_for("mnist") == 0.1 and default.eta0_for("synthetic") is None
    assert epoch.eta0_for("mnist") == 2e-3 and epoch.tag == "epoch-paper"
    for groups in (table3.reading_groups("mnist", table3.READINGS["per-label"], seeds=[0], num_traces=[2],
                                         regime=epoch),
                   table4.groups("mnist", seeds=[0], regime=epoch), table5.groups(seeds=[0], regime=epoch)):
        cfgs = [r.config for g in groups for r in g.runs]
        assert {c.rules.unit for c in cfgs} == {Unit.EPOCH}
        assert {c.rules.eta0_for(c.partition.dataset) for c in cfgs} <= {2e-3, 1.0}


def test_table4_counts_a_seed_where_only_one_variant_recovers():
    assert table4.fast_sooner(5, None) and not table4.fast_sooner(None, 5)
    assert table4.fast_sooner(3, 4) and not table4.fast_sooner(4, 4) and not table4.fast_sooner(None, None)


def test_the_runs_csv_reads_back_as_protocol_runs_and_the_committed_page_renders_from_it(tmp_path) -> None:
    from pathlib import Path

    from flexfl.errors import ReportError
    from simulator.paper.operating_point import (
        PAGE,
        RUN_FIELDS,
        RUNS_CSV,
        ProtocolRun,
        read_choices,
        read_runs,
        render,
        run_rows,
    )
    from simulator.report import write_csv_atomic

    summaries = [{"setting": "iid", "seed": 100, "k": 0, "eta0": 0.1, "final_loss": 0.5, "final_acc": 0.8},
                 {"setting": "iid", "seed": 100, "k": 1, "eta0": 0.316, "error": "diverged"}]
    write_csv_atomic(tmp_path / RUNS_CSV, run_rows("synthetic", "epoch", summaries))
    assert read_runs(tmp_path / RUNS_CSV) == [
        ProtocolRun(dataset="synthetic", unit="epoch", setting="iid", seed=100, k=0, eta0=0.1, final_loss=0.5,
                    final_acc=0.8, diverged=False),
        ProtocolRun(dataset="synthetic", unit="epoch", setting="iid", seed=100, k=1, eta0=0.316, final_loss=None,
                    final_acc=None, diverged=True)]
    assert (tmp_path / RUNS_CSV).read_text().splitlines()[0] == ",".join(RUN_FIELDS)
    (tmp_path / RUNS_CSV).write_text((tmp_path / RUNS_CSV).read_text().replace(",0.316,", ",fast,"))
    with pytest.raises(ReportError, match=rf"{RUNS_CSV}:3: column 'eta0': expected float, got 'fast'"):
        read_runs(tmp_path / RUNS_CSV)
    results = Path(__file__).resolve().parents[3] / "results"
    assert render(read_runs(results / RUNS_CSV), read_choices(results / "operating_point.toml")) == \
        (results / PAGE).read_text()
