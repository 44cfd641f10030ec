"""The shared round: open -> weigh -> close, with membership events, as both engines run it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.rules.aggregation import coefficients
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Departure, Federation
from coordinator.rules.strategies import FedNova, strategy_names
from flexfl.config import to_dict
from flexfl.errors import AggregationError, ConfigError, RoundStateError


def _federation(**rules) -> Federation:
    fed = Federation(rules=RulesConfig(required_updates=4, eta0=1.0, **rules), dataset="synthetic",
                     params={"w": torch.zeros(2)})
    fed.apply_events(arrivals=[Arrival("a", 10), Arrival("b", 30)])
    return fed


def test_a_round_aggregates_scheme_c_and_applies_events_at_its_close():
    fed = _federation()
    opening = fed.open(1)
    assert opening.participants == ("a", "b") and opening.lr == 1.0
    w = fed.weigh(1, {"a": 2, "b": 4})
    np.testing.assert_allclose(w.p, [0.25, 0.75])
    np.testing.assert_allclose(w.coefficients.values, [0.25 * 4 / 2, 0.75])
    deltas = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}
    out = fed.close_stacked(w, deltas=deltas, rows=["a", "b"], arrivals=[Arrival("c", 40)])
    torch.testing.assert_close(fed.params["w"], torch.tensor([0.5, 0.75]))
    assert out.arrivals == ("c",) and out.shifted and fed.objective.shift_round == 1
    # Round 2: the newcomer trains at 3x its weight, the rate restarted at eta_0.
    opening = fed.open(2)
    assert opening.participants == ("a", "b", "c") and opening.lr == 1.0
    w = fed.weigh(2, {"c": 4})
    assert w.p[2] == pytest.approx(3 * 40 / 80) and w.contributors == ["c"]


@pytest.mark.parametrize("policy, shifted", [("include", False), ("exclude", True)])
def test_departures_under_each_policy(policy, shifted):
    fed = _federation(departure_policy=policy)
    w = fed.weigh(1, {"a": 4, "b": 4})
    out = fed.close_stacked(w, deltas={"w": torch.zeros(2, 2)}, rows=["a", "b"], departures=[Departure("b")])
    assert out.departures == (("b", policy),) and out.shifted is shifted
    nxt = fed.open(2)
    assert nxt.participants == ("a",)
    assert nxt.lr == (1.0 if shifted else 0.5)
    assert fed.objective.members() == (["a", "b"] if policy == "include" else ["a"])
    if policy == "include":  # it comes back: trains again, no objective shift
        fed.close_stacked(fed.weigh(2, {"a": 1}), deltas={"w": torch.zeros(1, 2)}, rows=["a"],
                          arrivals=[Arrival("b", 30)])
        assert fed.open(3).participants == ("a", "b") and fed.objective.shift_round == 0


def test_a_departure_policy_per_event_overrides_the_rules():
    fed = _federation(departure_policy="include")
    out = fed.close_stacked(fed.weigh(1, {}), deltas={}, rows=[], departures=[Departure("a", "exclude")])
    assert out.departures == (("a", "exclude"),) and fed.objective.members() == ["b"]


def test_bad_rounds_are_refused():
    fed = _federation()
    with pytest.raises(RoundStateError, match="round 2 cannot open after round 0"):
        fed.open(2)
    with pytest.raises(RoundStateError, match=r"outside the objective: \['z'\]"):
        fed.weigh(1, {"z": 1})
    w = fed.weigh(1, {"a": 4, "b": 4})
    with pytest.raises(AggregationError, match=r"no update given for contributors \['b'\]"):
        fed.close_stacked(w, deltas={"w": torch.zeros(1, 2)}, rows=["a"])
    assert fed.completed_round == 0  # nothing changed


def test_auto_departures_follow_the_gamma_estimate_and_the_horizon():
    fed = _federation(departure_policy="auto", auto_c=1.0)  # a: 10 samples, b: 30
    fed.horizon = 50
    # Rounds 1-3 at lr = 1/tau: a's mean local gradient is (2, 0), b's (0, 0), at any s. The
    # aggregate direction is 0.25 (2, 0), so x_a = (1.5, 0) and x_b = (-0.5, 0) every round.
    for tau, s in zip((1, 2, 3), ({"a": 4, "b": 1}, {"a": 1, "b": 4}, {"a": 2, "b": 3})):
        d = torch.tensor([[-fed.learning_rate(tau) * s["a"] * 2.0, 0.0], [0.0, 0.0]])
        fed.close_stacked(fed.weigh(tau, s), deltas={"w": d}, rows=["a", "b"])
    assert fed.objective.gamma("a") == pytest.approx(1.5 ** 2 / 2) and fed.objective.gamma("b") == pytest.approx(0.125)
    # At tau_0 = 4: a needs 50 - 4 >= sqrt(1.125 * 4) = 2.1: exclude.
    assert fed.departure_policy(Departure("a"), tau0=4) == "exclude"
    fed.rules = RulesConfig(required_updates=4, eta0=1.0, departure_policy="auto", auto_c=30.0)
    # Round 4's zero updates add products 0: Gamma_a = (2.25 + 2.25 + 0) / 3 / 2 = 0.75, Gamma_b = 0.083.
    # With c = 30: a needs 46 >= 30 sqrt(0.75 * 4) = 52: include; b needs 46 >= 30 sqrt(0.083 * 4) = 17: exclude.
    out = fed.close_stacked(fed.weigh(4, {"a": 4, "b": 4}), deltas={"w": torch.zeros(2, 2)}, rows=["a", "b"],
                    departures=[Departure("a"), Departure("b")])
    assert out.departures == (("a", "include"), ("b", "exclude"))
    assert out.departure_gammas == pytest.approx({"a": 0.75, "b": 0.25 * 2 / 3 / 2})
    assert fed.objective.members() == ["a"] and fed.objective.departed_included == {"a"}


def test_threshold_departures_follow_the_time_left():
    fed = _federation(departure_policy="threshold", threshold_k=46)
    fed.horizon = 50
    assert fed.departure_policy(Departure("a"), tau0=4) == "exclude"  # 46 rounds left
    assert fed.departure_policy(Departure("a"), tau0=5) == "include"
    out = fed.close_stacked(fed.weigh(1, {}), deltas={}, rows=[],
                            departures=[Departure("a"), Departure("b", "threshold")])
    assert out.departures == (("a", "exclude"), ("b", "exclude"))  # 49 rounds left
    with pytest.raises(ConfigError, match="threshold_k"):
        RulesConfig(threshold_k=-1)


@pytest.mark.parametrize("unit", ["step", "epoch"])
@pytest.mark.parametrize("strategy", strategy_names())
def test_summed_updates_close_a_round_as_the_stacked_ones_do(strategy, unit):
    """The live coordinator sums updates as they arrive, the simulator stacks them: the same rounds.

    Also the same Gamma estimates: both feed the contributors' updates only, so Scheme A's
    incomplete updates, which the live coordinator receives (and which the stacked close is
    given here), count on neither side.
    """
    # Under epochs the devices' steps per update differ (batch 20: a 1, b 2, c 2), which FedNova counts.
    rules = {"strategy": strategy, "unit": unit, **({"mu": 0.1} if strategy == "fedprox" else {})}
    batch, live = _federation(**rules), _federation(**rules)
    g = torch.Generator().manual_seed(0)
    # s per round; round 2 has an arrival (c) and round 4 a departure (a); round 3 has nobody
    # complete (Scheme A discards it); in round 5 only the boosted newcomer answers.
    plan = {1: {"a": 4, "b": 2}, 2: {"a": 1, "b": 4}, 3: {"a": 3, "b": 0, "c": 2}, 4: {"a": 4, "b": 4, "c": 4},
            5: {"c": 3}, 6: {"b": 4, "c": 4}, 7: {"b": 2, "c": 4}, 8: {"b": 4, "c": 1}}
    events = {1: dict(arrivals=[Arrival("c", 40)]), 4: dict(departures=[Departure("a")])}
    fed_incomplete = 0  # incomplete updates given to the stacked close but not contributing
    for tau, s in plan.items():
        deltas = {d: torch.randn(2, generator=g) for d in s}
        opening = live.open(tau)
        assert opening == batch.open(tau)
        summed = live.start_sum(opening)
        for d in reversed(list(s)):  # arrival order differs from the objective's order
            summed.add(d, s=s[d], delta={"w": deltas[d].numpy()})
        w_live, w_batch = live.weigh(tau, summed.s), batch.weigh(tau, s)
        np.testing.assert_array_equal(w_live.coefficients.values, w_batch.coefficients.values)
        rows = list(s)
        fed_incomplete += sum(s[d] > 0 and d not in w_batch.contributors for d in rows)
        out_live = live.close_summed(w_live, summed=summed, **events.get(tau, {}))
        out_batch = batch.close_stacked(w_batch, deltas={"w": torch.stack([deltas[d] for d in rows])}, rows=rows,
                                **events.get(tau, {}))
        assert (out_live.arrivals, out_live.departures, out_live.shifted) == \
            (out_batch.arrivals, out_batch.departures, out_batch.shifted)
        assert out_live.departure_gammas == pytest.approx(out_batch.departure_gammas)
        torch.testing.assert_close(live.params["w"], batch.params["w"], rtol=1e-6, atol=1e-6)
        if tau == 2:
            assert w_live.p[2] == pytest.approx(3 * 40 / 80)  # fast-reboot boost entered the sum's weights
        if tau == 3 and strategy == "scheme-a":
            assert w_live.coefficients.discarded
    assert fed_incomplete > 0 if strategy == "scheme-a" else fed_incomplete == 0
    live_objective, batch_objective = live.objective.to_dict(), batch.objective.to_dict()
    # The Gamma state comes from the same updates, summed in a different order.
    live_gamma, batch_gamma = live_objective.pop("gammas"), batch_objective.pop("gammas")
    assert live_objective == batch_objective
    assert live_gamma["products"].keys() == batch_gamma["products"].keys() == {"b", "c"}
    for part in ("last", "products"):
        for device, values in live_gamma[part].items():
            assert values == pytest.approx(batch_gamma[part][device], rel=1e-9, abs=1e-12)
    assert live.objective.gamma("b") == pytest.approx(batch.objective.gamma("b"), rel=1e-9)


def test_a_sum_that_does_not_match_its_weighing_is_refused():
    fed = _federation()
    summed = fed.start_sum(fed.open(1))
    summed.add("a", s=2, delta={"w": np.ones(2, dtype=np.float32)})
    with pytest.raises(RoundStateError, match="not the ones weighed"):
        fed.close_summed(fed.weigh(1, {"a": 3}), summed=summed)
    with pytest.raises(RoundStateError, match="not in the objective"):
        summed.add("z", s=1, delta={"w": np.ones(2, dtype=np.float32)})
    assert fed.completed_round == 0 and torch.equal(fed.params["w"], torch.zeros(2))
    fed.close_summed(fed.weigh(1, summed.s), summed=summed)
    torch.testing.assert_close(fed.params["w"], torch.full((2,), 0.25 * 4 / 2))


def test_the_strategy_is_chosen_by_name_or_by_its_older_scheme_spelling():
    assert RulesConfig().aggregation.name == "scheme-c"
    assert isinstance(RulesConfig(strategy="fednova").aggregation, FedNova)
    # A scheme strategy is kept as its scheme: one config, written one way, equal to the old spelling.
    by_name = RulesConfig(strategy="scheme-a")
    assert by_name == RulesConfig(scheme="A") and by_name.strategy is None
    assert to_dict(by_name) == to_dict(RulesConfig(scheme="A"))
    assert "strategy" not in to_dict(RulesConfig(scheme="B"))  # files of scheme runs read as before
    assert RulesConfig(scheme="B").with_strategy("fednova") == RulesConfig(strategy="fednova")
    assert RulesConfig(strategy="fednova").with_strategy("A") == RulesConfig(scheme="A")
    with pytest.raises(ConfigError,
                       match=r"rules.strategy: unknown strategy 'fedfoo'; choose one of scheme-a, .*fednova"):
        RulesConfig(strategy="fedfoo")
    with pytest.raises(ConfigError, match="name two strategies"):
        RulesConfig(scheme="A", strategy="fednova")
    assert RulesConfig(scheme="C", unit="epoch").unit == "epoch"
    with pytest.raises(ConfigError, match="name two strategies"):
        RulesConfig(scheme="A", strategy="scheme-b")


def test_fednova_under_epochs_normalises_by_each_devices_sgd_steps():
    """FedNova's tau_k are SGD steps: s_k epochs of ceil(n_k / B) batches (Wang et al.: tau_i = E n_i / B)."""
    fed = _federation(strategy="fednova", unit="epoch", batch_size=10)  # a: 10 samples, 1 step; b: 30, 3 steps
    w = fed.weigh(1, {"a": 2, "b": 4})
    np.testing.assert_array_equal(w.s, [2, 4])  # recorded as the rules count them, in epochs
    tau = {"a": 2 * 1, "b": 4 * 3}
    tau_eff = 0.25 * tau["a"] + 0.75 * tau["b"]
    np.testing.assert_allclose(w.coefficients.values, [0.25 * tau_eff / tau["a"], 0.75 * tau_eff / tau["b"]])
    # Under steps the same s are steps: a different normalisation
    steps = _federation(strategy="fednova", batch_size=10).weigh(1, {"a": 2, "b": 4})
    np.testing.assert_allclose(steps.coefficients.values, [0.25 * 3.5 / 2, 0.75 * 3.5 / 4])
    # Equal sizes, equal steps per epoch: the epochs' normalisation is the steps' scaled, i.e. the same c_k
    equal = Federation(rules=RulesConfig(required_updates=4, eta0=1.0, strategy="fednova", unit="epoch",
                                         batch_size=10), dataset="synthetic", params={"w": torch.zeros(2)})
    equal.apply_events(arrivals=[Arrival("a", 30), Arrival("b", 30)])
    np.testing.assert_allclose(equal.weigh(1, {"a": 2, "b": 4}).coefficients.values, [0.5 * 3 / 2, 0.5 * 3 / 4])


def test_fedprox_is_scheme_b_aggregation_with_the_rules_mu_in_the_local_objective():
    rules = RulesConfig(strategy="fedprox", mu=0.01)
    assert rules.aggregation.proximal_mu == 0.01 and RulesConfig().aggregation.proximal_mu == 0.0
    s, p = [0, 2, 5, 3], [0.1, 0.2, 0.3, 0.4]
    np.testing.assert_array_equal(coefficients(rules.aggregation, s=s, E=5, p=p).values,
                                  coefficients("B", s=s, E=5, p=p).values)  # partial work accepted as Scheme B
    assert RulesConfig(scheme="B").with_strategy("fedprox", mu=0.1).with_strategy("B") == RulesConfig(scheme="B")
    with pytest.raises(ConfigError, match=r"^\[rules.strategy\].mu: missing \(required\): the weight of its proximal"):
        RulesConfig(strategy="fedprox")
    with pytest.raises(ConfigError,
                       match=r"rules.mu = 0.1 is FedProx's proximal weight, but the strategy is 'scheme-c'"):
        RulesConfig(mu=0.1)
    with pytest.raises(ConfigError, match="FedProx's mu must be a number >= 0"):
        RulesConfig(strategy="fedprox", mu=-1.0)


def test_mifa_applies_every_members_latest_update_every_round():
    """MIFA (coordinator.rules.strategies.MIFA) against its formula in numpy, on hand-made updates over six rounds:
    m_k = (E / s_k) delta_k / eta_t at device k's latest update, w <- w + eta_tau sum_k p_k m_k over the
    objective's members with a memory; an inactive device contributes its memory, a device before its
    first update nothing, an included departure its memory forever, an excluded one nothing."""
    E, n = 4, {"a": 10, "b": 30, "c": 20}
    fed = Federation(rules=RulesConfig(required_updates=E, eta0=1.0, strategy="mifa"), dataset="synthetic",
                     params={"w": torch.zeros(3)})
    fed.apply_events(arrivals=[Arrival(d, k) for d, k in n.items()])
    rng = np.random.default_rng(0)
    # s per round (absent: sent nothing). c before its first update (1); b inactive (2, 3); nobody (3);
    # b departs under include after round 3 and keeps contributing; c is excluded after round 4.
    plan = {1: {"a": 4, "b": 2}, 2: {"a": 1, "c": 4}, 3: {}, 4: {"a": 4}, 5: {"a": 2}, 6: {}}
    events = {3: [Departure("b", "include")], 4: [Departure("c", "exclude")]}
    w, memory, members = np.zeros(3), {}, dict(n)
    for tau, s in plan.items():
        lr = fed.open(tau).lr
        deltas = {d: rng.normal(size=3).astype(np.float32) for d in s}
        for d, k in s.items():
            memory[d] = (E / k) * deltas[d].astype(np.float64) / lr
        total = sum(members.values())
        w = w + lr * sum(members[d] / total * m for d, m in memory.items())
        rows = list(s)
        fed.close_stacked(fed.weigh(tau, s),
                          deltas={"w": torch.tensor(np.array([deltas[d] for d in rows]).reshape(-1, 3))},
                          rows=rows, departures=events.get(tau, ()))
        np.testing.assert_allclose(fed.params["w"].numpy(), w, rtol=1e-5, atol=1e-6, err_msg=f"round {tau}")
        if tau == 4:  # excluded: out of the objective and of the memory
            del members["c"], memory["c"]
    assert set(fed.memory.memories) == {"a", "b"} and "b" in fed.objective.departed_included
    assert not np.allclose(w, 0)


def test_mifa_memories_survive_a_snapshot_and_restore():
    fed = _federation(strategy="mifa")
    fed.close_stacked(fed.weigh(1, {"a": 2, "b": 4}), deltas={"w": torch.tensor([[1.0, 2.0], [3.0, -1.0]])},
                      rows=["a", "b"])
    saved = fed.memory.snapshot()
    term = fed.memory.term(p={"a": 0.25, "b": 0.75}, n_total=40)
    other = _federation(strategy="mifa")
    other.memory.restore(saved)
    torch.testing.assert_close(other.memory.term(p={"a": 0.25, "b": 0.75}, n_total=40), term)
    torch.testing.assert_close(term["w"], other.memory.stacked_term(p={"a": 0.25, "b": 0.75})["w"])


def test_a_device_that_leaves_under_include_and_rejoins_before_round_1_trains_again():
    """Before training starts, a rejoin of a departed-but-included device is a rejoin, not a second add
    (the coordinator had marked it back in its registry and journal while the objective refused it)."""
    from flexfl.vocabulary import DeparturePolicy

    fed = _federation()
    fed.apply_events(departures=[Departure("b", policy=DeparturePolicy.INCLUDE)])
    assert fed.objective.departed_included == {"b"}
    fed.apply_events(arrivals=[Arrival("b", 30)])
    assert fed.objective.departed_included == set() and fed.objective.active_members() == ["a", "b"]
    assert fed.objective.sample_counts == {"a": 10, "b": 30}


@pytest.mark.parametrize(("text", "description"), [
    ('[rules.strategy]\nname = "fedprox"\nmu = 0.01\n', "FedProx (mu = 0.01)"),
    ('[rules]\nstrategy = "fedprox"\nmu = 0.01\n', "FedProx (mu = 0.01)"),  # the older form
    ('[rules]\nscheme = "A"\n', "Scheme A"),  # older still
    ('[rules.strategy]\nname = "scheme-a"\n', "Scheme A"),
    ('[rules.strategy]\nname = "mifa"\n', "MIFA"),
])
def test_a_strategy_and_its_parameters_are_read_from_rules_strategy_and_from_the_older_forms(tmp_path, text,
                                                                                               description):
    from coordinator.config import load_coordinator_config
    from flexfl.config import dump_toml, from_dict

    path = tmp_path / "c.toml"
    path.write_text(text)
    rules = load_coordinator_config(path).rules
    assert rules.aggregation.description == description
    assert from_dict(RulesConfig, to_dict(rules)) == rules  # written back in one form, the table's
    if "mu" in text:
        assert rules == RulesConfig(strategy={"name": "fedprox", "mu": 0.01}) and "mu =" not in dump_toml(rules).split(
            "[strategy]")[0]


@pytest.mark.parametrize(("text", "error"), [
    ('[rules.strategy]\nname = "fedprox"\n', "c.toml: [rules.strategy].mu: missing (required): the weight of its "
                                              "proximal term mu/2 ||w - w_G||^2 (FedProx's grid: 0.001, 0.01, 0.1, 1)"),
    ('[rules.strategy]\nname = "fedprox"\nmu = "x"\n',
     "c.toml: [rules.strategy].mu: expected a finite number, got 'x'"),
    ('[rules.strategy]\nname = "fedprox"\nmuu = 1\n', "c.toml: [rules.strategy].muu: unknown key; did you mean 'mu'? "
                                                       "valid keys: mu"),
    ('[rules.strategy]\nname = "mifa"\nmu = 1\n', "c.toml: [rules.strategy].mu: unknown key; it has no parameters"),
    ('[rules.strategy]\nmu = 1\n', "c.toml: [rules.strategy].name: missing (required); choose one of scheme-a, "),
    ('[rules]\nstrategy = "fedprox"\n', "c.toml: [rules] [rules.strategy].mu: missing (required)"),
    ('[rules]\nmu = 0.1\n', "c.toml: [rules] rules.mu = 0.1 is FedProx's proximal weight, but the strategy is "
                            "'scheme-c'; leave mu out, or write [rules.strategy] name = 'fedprox', mu = ..."),
])
def test_a_wrong_strategy_table_is_one_line_naming_file_table_and_key(tmp_path, text, error):
    from coordinator.config import load_coordinator_config

    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_coordinator_config(path)
    assert str(exc.value).startswith(str(tmp_path / error) if error.startswith("c.toml") else error), str(exc.value)


def test_a_plug_in_strategy_takes_its_parameters_from_the_same_table(tmp_path, plugin_module):
    name = plugin_module("""
        from dataclasses import dataclass
        import numpy as np
        from coordinator.rules.strategies import Strategy

        @dataclass(frozen=True)
        class Damped(Strategy):
            label = "damped"
            factor: float = 1.0

            def arrival_weights(self, *, s, E, p):
                return np.where(s > 0, self.factor * p, 0.0)

            def round_scale(self, *, s, E, p):
                return 1.0
    """)
    from coordinator.config import load_coordinator_config

    path = tmp_path / "c.toml"
    path.write_text(f'[rules.strategy]\nname = "{name}:Damped"\nfactor = 0.5\n')
    rule = load_coordinator_config(path).rules.aggregation
    assert rule.description == "Damped (factor = 0.5)" and rule.parameters == {"factor": 0.5}
    np.testing.assert_allclose(coefficients(rule, s=[0, 2], E=4, p=[0.5, 0.5]).values, [0.0, 0.25])
    path.write_text(f'[rules.strategy]\nname = "{name}:Damped"\nfactr = 0.5\n')
    with pytest.raises(ConfigError, match=r"\[rules.strategy\].factr: unknown key; did you mean 'factor'\?"):
        load_coordinator_config(path)
