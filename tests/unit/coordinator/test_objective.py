"""Learning-rate schedule, fast-reboot decay, and the include/exclude departure policies."""

import itertools

import numpy as np
import pytest
import torch

from coordinator.rules.objective import FastReboot, LearningRate, Objective
from coordinator.rules.round import Arrival, Departure, Federation, RulesConfig
from flexfl.errors import ConfigError, RoundStateError
from flexfl.vocabulary import DeparturePolicy


def test_staircase_rate_and_reset_after_shift():
    lr = LearningRate(eta0=0.5)
    assert lr.at(round_index=1) == 0.5
    assert lr.at(round_index=10) == pytest.approx(0.05)
    # After a shift at round 30 the rate restarts from eta0.
    assert lr.at(round_index=31, shift_round=30) == 0.5
    assert lr.at(round_index=40, shift_round=30) == pytest.approx(0.05)
    with pytest.raises(ConfigError):
        lr.at(round_index=30, shift_round=30)


def test_fast_reboot_starts_at_boost_and_decays_quadratically():
    fr = FastReboot(boost=3.0, decay_power=2.0)
    assert fr.multiplier(rounds_since_arrival=0) == 3.0
    extra = [fr.multiplier(rounds_since_arrival=r) - 1 for r in range(0, 40)]
    assert all(a > b for a, b in itertools.pairwise(extra))
    # O(r^-2): doubling r+1 quarters the extra weight.
    assert extra[19] / extra[39] == pytest.approx(4.0)
    assert FastReboot(boost=1.0).multiplier(rounds_since_arrival=0) == 1.0
    with pytest.raises(ConfigError):
        FastReboot(boost=0.5)


def test_arrival_shifts_objective_and_boosts_newcomer():
    obj = Objective()
    for d in "abc":
        obj.add_initial(d, 100)
    obj.arrive("d", 100, round_index=30)
    assert obj.shift_round == 30
    fr = FastReboot()
    p = obj.weights(list("abcd"), round_index=31, fast_reboot=fr)
    np.testing.assert_allclose(p, [0.25, 0.25, 0.25, 0.75])
    p_later = obj.weights(list("abcd"), round_index=40, fast_reboot=fr)
    assert p_later[3] == pytest.approx(0.25 * (1 + 2 / 100))
    assert LearningRate(eta0=1.0).at(round_index=31, shift_round=obj.shift_round) == 1.0


def test_departure_include_keeps_share_exclude_renormalises():
    include, exclude = Objective(), Objective()
    for obj in (include, exclude):
        obj.add_initial("a", 100)
        obj.add_initial("b", 300)
    include.depart("a", round_index=20, policy=DeparturePolicy.INCLUDE)
    exclude.depart("a", round_index=20, policy="exclude")
    np.testing.assert_allclose(include.weights(["a", "b"], round_index=21), [0.25, 0.75])
    assert include.shift_round == 0  # include does not shift the objective
    np.testing.assert_allclose(exclude.weights(["a", "b"], round_index=21), [0.0, 1.0])
    assert exclude.shift_round == 20


def test_objective_round_trips_and_rejects_bad_input():
    obj = Objective()
    obj.add_initial("a", 10)
    obj.arrive("b", 5, round_index=3)
    obj.depart("a", round_index=4, policy="include")
    again = Objective.from_dict(obj.to_dict())
    assert again == obj
    with pytest.raises(RoundStateError, match="already"):
        obj.add_initial("a", 1)
    with pytest.raises(ConfigError, match="positive"):
        obj.add_initial("z", 0)
    with pytest.raises(RoundStateError, match="not in the objective"):
        obj.depart("nope", round_index=5, policy="exclude")
    with pytest.raises(ConfigError, match="malformed"):
        Objective.from_dict({"sample_counts": {}})


def test_auto_departure_rule_follows_corollary_4_3():
    from coordinator.rules.objective import AutoDeparture

    rule = AutoDeparture(c=2.0)
    # T - tau_0 = 40 >= 2 sqrt(0.25 * 30) = 5.48: exclude; with Gamma = 200: 2 sqrt(6000) = 155 > 40: include.
    assert rule.decide(tau0=30, horizon=70, gamma=0.25) == "exclude"
    assert rule.decide(tau0=30, horizon=70, gamma=200.0) == "include"
    # Later departures need more remaining time; an IID device (Gamma ~ 0) is excluded even at the end.
    assert rule.decide(tau0=60, horizon=70, gamma=2.0) == "include"
    assert rule.decide(tau0=20, horizon=70, gamma=2.0) == "exclude"
    assert rule.decide(tau0=69, horizon=70, gamma=0.0) == "exclude"
    assert rule.decide(tau0=10, horizon=70, gamma=None) == "include"  # never trained: nothing known
    with pytest.raises(ConfigError, match="c must be > 0"):
        AutoDeparture(c=0.0)


def test_threshold_departure_rule_looks_at_the_time_left_only():
    from coordinator.rules.objective import ThresholdDeparture

    rule = ThresholdDeparture(k=30)
    assert rule.decide(tau0=40, horizon=70) == "exclude"  # 30 rounds left
    assert rule.decide(tau0=41, horizon=70) == "include"
    assert ThresholdDeparture(k=0).decide(tau0=70, horizon=70) == "exclude"
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="k must be a number >= 0"):
            ThresholdDeparture(k=bad)


def test_gamma_estimate_is_half_the_mean_product_of_consecutive_dissimilarities_and_survives_a_checkpoint():
    obj = Objective()
    obj.add_initial("a", 10)
    obj.add_initial("b", 10)
    assert obj.gamma("a") is None
    # x_a: (2, 0) in every round (a stable dissimilarity); x_b: (0, +-1) alternating (noise only).
    for r in range(7):
        obj.note_round(["a", "b"], np.array([[2.0 + (r == 6), 0.0], [0.0, (-1.0) ** r]]))
    # a: products 4, 4, 4, 4, then 6 with the last round; the last five, halved.
    assert obj.gamma("a") == pytest.approx((4 + 4 + 4 + 4 + 6) / 5 / 2)
    assert obj.gamma("b") == 0.0  # mean product -1: noise around an IID device's 0
    assert Objective.from_dict(obj.to_dict()) == obj
    obj.note_round(["a"], np.array([[100.0, 0.0]]))  # a lone contributor: nothing to compare with
    obj.note_round(["a", "b"], np.array([[np.nan, 0.0], [0.0, 1.0]]))  # a diverged update is skipped
    assert obj.gamma("a") == pytest.approx(2.2)
    # A checkpoint from before coordinator.rules.gamma (squared norms) starts the estimate afresh.
    old = {**obj.to_dict(), "grad_sq": {"a": [1.0]}}
    del old["gammas"]
    assert Objective.from_dict(old).gamma("a") is None
    obj.depart("a", round_index=3, policy="exclude")
    assert obj.gamma("a") is None and "a" not in obj.gammas.last
    for policy in ("auto", "threshold"):
        with pytest.raises(ConfigError, match=f"resolve the {policy} departure policy"):
            obj.depart("b", round_index=3, policy=policy)


def test_a_device_arriving_and_departing_at_one_close_keeps_no_boost():
    obj = Objective()
    obj.add_initial("a", 10)
    obj.add_initial("b", 30)
    obj.arrive("c", 40, round_index=3)
    obj.depart("c", round_index=3, policy=DeparturePolicy.INCLUDE)  # before it ever trained
    fr = FastReboot(boost=3.0)
    np.testing.assert_allclose(obj.weights(["a", "b", "c"], round_index=4, fast_reboot=fr), [0.125, 0.375, 0.5])
    # One that trained a round first keeps its (decayed) boost under include, as before.
    obj.arrive("d", 20, round_index=4)
    obj.depart("d", round_index=5, policy=DeparturePolicy.INCLUDE)
    assert obj.weights(["d"], round_index=6, fast_reboot=fr)[0] == pytest.approx(0.2 * (1 + 2 / 4))


def test_under_auto_an_arrival_that_departs_in_its_round_is_included_without_its_boost():
    fed = Federation(rules=RulesConfig(required_updates=4, eta0=1.0, departure_policy="auto", auto_c=1.0),
                     dataset="synthetic", params={"w": torch.zeros(2)})
    fed.horizon = 10
    fed.apply_events(arrivals=[Arrival("a", 10), Arrival("b", 30)])
    fed.close_stacked(fed.weigh(1, {"a": 4, "b": 4}), deltas={"w": torch.zeros(2, 2)}, rows=["a", "b"])
    # "c" joins and announces its departure within round 2: both take effect at its close.
    out = fed.close_stacked(fed.weigh(2, {"a": 4, "b": 4}), deltas={"w": torch.zeros(2, 2)}, rows=["a", "b"],
                    arrivals=[Arrival("c", 40)], departures=[Departure("c")])
    assert out.departures == (("c", "include"),)  # no Gamma estimate for it: auto includes
    np.testing.assert_allclose(fed.weigh(3, {"a": 4}).p, [10 / 80, 30 / 80, 40 / 80])
