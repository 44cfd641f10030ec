"""Schemes A/B/C by hand (paper Figure 3), FedNova against its formula, FedAvg equivalence, edge cases,
C's unbiasedness, and the running sum equal to the stacked update for every strategy."""

import numpy as np
import pytest
import torch

from coordinator.rules.aggregation import RunningAggregate, apply_update, coefficients, scheme_a, scheme_b, scheme_c
from coordinator.rules.strategies import STRATEGIES, strategy_names
from flexfl.errors import AggregationError, ConfigError
from flexfl.vocabulary import Scheme

ALL = strategy_names()

FIG3_S = [3, 4, 5, 5]
FIG3_P = [0.25, 0.25, 0.25, 0.25]


def test_figure3_scheme_a_keeps_only_complete_devices_rescaled():
    c = scheme_a(s=FIG3_S, E=5, p=FIG3_P)
    # N p q / K = 4 * 0.25 / 2 for the two complete devices.
    np.testing.assert_allclose(c.values, [0.0, 0.0, 0.5, 0.5])
    assert not c.discarded


def test_figure3_scheme_b_keeps_base_weights():
    np.testing.assert_allclose(scheme_b(s=FIG3_S, E=5, p=FIG3_P).values, [0.25, 0.25, 0.25, 0.25])


def test_figure3_scheme_c_scales_incomplete_by_e_over_s():
    c = scheme_c(s=FIG3_S, E=5, p=FIG3_P)
    np.testing.assert_allclose(c.values, [0.25 * 5 / 3, 0.25 * 5 / 4, 0.25, 0.25])
    assert c.values.sum() > 1.0  # intended: C rescales step counts, not a convex combination


@pytest.mark.parametrize("scheme", ALL)
def test_all_strategies_equal_fedavg_when_everyone_completes(scheme):
    p = np.array([0.1, 0.2, 0.3, 0.4])
    c = coefficients(scheme, s=[7, 7, 7, 7], E=7, p=p)
    np.testing.assert_allclose(c.values, p)
    assert not c.discarded


def test_scheme_a_discards_round_without_complete_device():
    c = scheme_a(s=[1, 2, 0], E=3, p=[1 / 3] * 3)
    assert c.discarded
    w = {"w": torch.ones(2)}
    new = apply_update(global_state=w, deltas={"w": torch.full((3, 2), 5.0)}, coefficients=c)
    assert torch.equal(new["w"], w["w"])


@pytest.mark.parametrize("scheme", ALL)
def test_inactive_devices_get_zero(scheme):
    c = coefficients(scheme, s=[0, 5, 0, 5], E=5, p=[0.25] * 4)
    assert c.values[0] == 0 and c.values[2] == 0


@pytest.mark.parametrize("scheme", ALL)
def test_coefficients_finite_for_every_participation_pattern(scheme):
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 20))
        E = int(rng.integers(1, 10))
        s = rng.integers(0, E + 1, size=n)
        p = rng.dirichlet(np.ones(n))
        c = coefficients(scheme, s=s, E=E, p=p)
        assert np.all(np.isfinite(c.values)) and np.all(c.values >= 0)


@pytest.mark.parametrize(
    "s, E, p, fragment",
    [
        ([6], 5, [1.0], "outside 0..E"),
        ([-1], 5, [1.0], "outside 0..E"),
        ([1, 2], 5, [1.0], "equal length"),
        ([1], 5, [float("nan")], "finite"),
        ([1.5], 5, [1.0], "integers"),
        ([1], 0, [1.0], "E (required local updates)"),
    ],
)
def test_bad_inputs_rejected_with_reason(s, E, p, fragment):
    with pytest.raises(AggregationError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        coefficients("C", s=s, E=E, p=p)


def test_unknown_strategy_rejected_with_the_choices():
    with pytest.raises(ConfigError, match="unknown strategy 'D'; choose one of scheme-a, scheme-b, scheme-c, fednova"):
        coefficients("D", s=[1], E=1, p=[1.0])


def test_the_schemes_are_strategies_under_both_names():
    for scheme in Scheme:
        by_letter = coefficients(scheme.value, s=FIG3_S, E=5, p=FIG3_P).values
        np.testing.assert_array_equal(coefficients(f"scheme-{scheme.value.lower()}", s=FIG3_S, E=5, p=FIG3_P).values,
                                      by_letter)


def _fednova_oracle(*, s, p, deltas):
    """FedNova's update by its formula, in float64: tau_eff sum_k q_k delta_k / s_k over s_k > 0,
    q = p renormalised over those devices, tau_eff = sum_k q_k s_k."""
    s, p = np.asarray(s, dtype=np.float64), np.asarray(p, dtype=np.float64)
    active = s > 0
    q = p[active] / p[active].sum()
    tau_eff = q @ s[active]
    return tau_eff * np.einsum("k,k...->...", q / s[active], np.asarray(deltas, dtype=np.float64)[active])


def test_fednova_follows_its_formula_on_hand_made_updates():
    # Five devices, E = 4: one inactive, two incomplete, two complete; p boosted (sums to 1.3).
    s, p = [2, 0, 4, 1, 4], [0.2, 0.3, 0.1, 0.4, 0.3]
    deltas = [[1.0, -2.0], [100.0, 100.0], [0.5, 0.5], [-1.0, 3.0], [2.0, 0.0]]
    # By hand: active p = (0.2, 0.1, 0.4, 0.3), sum 1.0, so q = p; tau_eff = 0.4 + 0.4 + 0.4 + 1.2 = 2.4.
    # sum q delta/s = 0.1 (1, -2) + 0.025 (0.5, 0.5) + 0.4 (-1, 3) + 0.075 (2, 0) = (-0.1375, 1.0125).
    expected = 2.4 * np.array([-0.1375, 1.0125])
    np.testing.assert_allclose(_fednova_oracle(s=s, p=p, deltas=deltas), expected)
    c = coefficients("fednova", s=s, E=4, p=p)
    np.testing.assert_allclose(c.values, [2.4 * 0.2 / 2, 0.0, 2.4 * 0.1 / 4, 2.4 * 0.4 / 1, 2.4 * 0.3 / 4])
    assert not c.discarded
    w = {"w": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    new = apply_update(global_state=w, deltas={"w": torch.tensor(deltas, dtype=torch.float64)}, coefficients=c)
    np.testing.assert_allclose(new["w"].numpy(), 1.0 + expected, rtol=1e-12)


def test_fednova_renormalises_p_over_the_devices_that_did_work():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n, E = int(rng.integers(1, 10)), int(rng.integers(1, 8))
        s = rng.integers(0, E + 1, size=n)
        p = rng.dirichlet(np.ones(n)) * rng.choice([1.0, 3.0], size=n)
        deltas = rng.normal(size=(n, 3))
        c = coefficients("fednova", s=s, E=E, p=p)
        if not np.any(s > 0):
            assert not c.discarded and np.all(c.values == 0)  # nothing arrived: the model stays
            continue
        np.testing.assert_allclose(c.values @ deltas, _fednova_oracle(s=s, p=p, deltas=deltas), rtol=1e-10, atol=1e-12)
        # Scaling every p (a boost or another normalisation of n) changes nothing: only ratios count.
        np.testing.assert_allclose(coefficients("fednova", s=s, E=E, p=7 * p).values, c.values, rtol=1e-12)
    # An inactive device's weight does not shrink the others': adding one with s = 0 leaves the update.
    base = coefficients("fednova", s=[3, 1], E=3, p=[0.5, 0.5]).values
    np.testing.assert_allclose(coefficients("fednova", s=[3, 1, 0], E=3, p=[0.25, 0.25, 0.5]).values[:2], base)


def test_apply_update_weights_rows_and_checks_shapes():
    w = {"a": torch.zeros(2), "b": torch.zeros(1, 1)}
    c = scheme_c(s=[0, 1, 2], E=2, p=[0.2, 0.3, 0.5])  # values [0, 0.6, 0.5]
    deltas = {"a": torch.tensor([[1.0, 1.0], [2.0, 0.0]]), "b": torch.tensor([[[1.0]], [[1.0]]])}
    new = apply_update(global_state=w, deltas=deltas, coefficients=c, rows=[1, 2])
    torch.testing.assert_close(new["a"], torch.tensor([0.6 + 1.0, 0.6]))
    torch.testing.assert_close(new["b"], torch.tensor([[1.1]]))
    with pytest.raises(AggregationError, match="shape"):
        apply_update(global_state=w, deltas={"a": torch.zeros(2, 3), "b": deltas["b"]}, coefficients=c, rows=[1, 2])
    with pytest.raises(AggregationError, match="do not match"):
        apply_update(global_state=w, deltas={"a": deltas["a"]}, coefficients=c, rows=[1, 2])


def _fixed_point(scheme: Scheme, *, s_by_round, centers, p, E, lr) -> np.ndarray:
    """Iterate FL on quadratics F_k(w) = |w - c_k|^2 / 2 with exact local gradient steps.

    After s steps of GD with rate lr from w, device k is at c_k + (1 - lr)^s (w - c_k): the
    per-step progress is known in closed form, so the only randomness is s.
    """
    w = np.zeros(centers.shape[1])
    for s in s_by_round:
        local = centers + ((1 - lr) ** s)[:, None] * (w - centers)
        c = coefficients(scheme, s=s, E=E, p=p)
        if not c.discarded:
            w = w + c.values @ (local - w)
    return w


def test_scheme_c_is_unbiased_where_b_is_not():
    rng = np.random.default_rng(1)
    n, E, lr = 6, 10, 0.002  # small lr: C's remaining bias is O(lr), B's is O(1)
    centers = rng.normal(size=(n, 3)) * 5
    p = np.full(n, 1 / n)
    optimum = p @ centers  # minimiser of sum_k p_k F_k
    # Heterogeneous participation: device k completes about (k+1)/n of E, randomly per round.
    means = np.linspace(0.15, 1.0, n)
    s_by_round = [np.clip(rng.binomial(E, means), 1, E) for _ in range(6000)]
    w_c = _fixed_point(Scheme.C, s_by_round=s_by_round, centers=centers, p=p, E=E, lr=lr)
    w_b = _fixed_point(Scheme.B, s_by_round=s_by_round, centers=centers, p=p, E=E, lr=lr)
    # B pulls towards devices that run more steps: s-weighted mean of the centers.
    b_target = (p * means) @ centers / (p * means).sum()
    err_c = np.linalg.norm(w_c - optimum)
    err_b = np.linalg.norm(w_b - optimum)
    spread = np.linalg.norm(centers - optimum, axis=1).mean()
    assert err_c < 0.05 * spread, (err_c, spread)
    assert err_b > 10 * err_c
    assert np.linalg.norm(w_b - b_target) < err_b  # and B's bias points where theory says


def _random_round(rng, n: int, E: int, shapes: dict[str, tuple[int, ...]]):
    s = rng.integers(0, E + 1, size=n)
    p = rng.dirichlet(np.ones(n)) * rng.choice([1.0, 3.0], size=n)  # some boosted (fast-reboot), sum != 1
    deltas = {name: torch.randn(n, *shape, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
              for name, shape in shapes.items()}
    return s, p, deltas


@pytest.mark.parametrize("scheme", ALL)
def test_running_aggregate_equals_apply_update_in_any_arrival_order(scheme):
    rng = np.random.default_rng(7)
    shapes = {"w": (5, 3), "b": (3,)}
    for trial in range(40):
        n, E = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        s, p, deltas = _random_round(rng, n, E, shapes)
        if trial % 5 == 0:
            s[:] = np.minimum(s, E - 1) if E > 1 else 0  # nobody complete: Scheme A discards
        w = {name: torch.randn(*shape) for name, shape in shapes.items()}
        c = coefficients(scheme, s=s, E=E, p=p)
        batch = apply_update(global_state=w, deltas=deltas, coefficients=c)
        running = RunningAggregate(strategy=scheme, E=E, p=dict(enumerate(p.tolist())), like=w)
        arrived = rng.permutation(n)[: int(rng.integers(0, n + 1))]  # the rest never answer: s = 0
        for k in arrived:
            running.add(int(k), s=int(s[k]), delta={name: d[k].numpy() for name, d in deltas.items()})
        s_seen = np.zeros(n, dtype=np.int64)
        s_seen[arrived] = s[arrived]
        c_seen = coefficients(scheme, s=s_seen, E=E, p=p)
        expected = apply_update(global_state=w, deltas=deltas, coefficients=c_seen)
        got = running.apply(global_state=w)
        for name in shapes:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
        if c_seen.discarded or not np.any(c_seen.values > 0):
            assert all(torch.equal(got[name], w[name]) for name in shapes)  # the model stays, bit for bit
        if len(arrived) == n:  # everyone answered: the same as the batch over all devices
            for name in shapes:
                torch.testing.assert_close(got[name], batch[name], rtol=1e-5, atol=1e-6)


def test_running_aggregate_weights_are_the_strategies_coefficients_before_scaling():
    w = {"w": torch.zeros(2)}
    arrival = {"A": [0.0, 0.0, 0.25, 0.25], "B": [0.25] * 4, "C": [0.25 * 5 / 3, 0.25 * 5 / 4, 0.25, 0.25],
               "fednova": [0.25 / 3, 0.25 / 4, 0.25 / 5, 0.25 / 5]}
    scale = {"A": 2.0, "B": 1.0, "C": 1.0, "fednova": 0.25 * 17}  # FedNova: tau_eff / sum p = (17 / 4) / 1
    for scheme, expected in arrival.items():
        running = RunningAggregate(strategy=scheme, E=5, p=dict.fromkeys(range(4), 0.25), like=w)
        weights = [running.add(k, s=s, delta={"w": np.ones(2, dtype=np.float32)}) for k, s in enumerate(FIG3_S)]
        np.testing.assert_allclose(weights, expected)
        assert running.scale() == pytest.approx(scale[scheme])
        np.testing.assert_allclose(np.array(weights) * running.scale(),
                                   coefficients(scheme, s=FIG3_S, E=5, p=FIG3_P).values)
    assert set(arrival) - {"fednova"} == {s.value for s in Scheme} and set(STRATEGIES) == set(ALL)


def test_running_aggregate_refuses_a_second_update_and_a_wrong_shape():
    running = RunningAggregate(strategy="C", E=5, p={"a": 0.5, "b": 0.5}, like={"w": torch.zeros(2)})
    running.add("a", s=2, delta={"w": np.ones(2, dtype=np.float32)})
    with pytest.raises(AggregationError, match="already in the sum"):
        running.add("a", s=3, delta={"w": np.ones(2, dtype=np.float32)})
    with pytest.raises(AggregationError, match=r"'w' has shape \(3,\)"):
        running.add("b", s=3, delta={"w": np.ones(3, dtype=np.float32)})
    with pytest.raises(AggregationError, match="'z', which is not a device of this round"):
        running.add("z", s=3, delta={"w": np.ones(2, dtype=np.float32)})
    torch.testing.assert_close(running.apply(global_state={"w": torch.zeros(2)})["w"],
                               torch.full((2,), 0.5 * 5 / 2))


# FedNova's factors with a count of its own: tau_k in samples (s_k passes over n_k samples), not FedNova's SGD steps.
SAMPLE_NOVA = """
    import numpy as np
    from coordinator.rules.strategies import Strategy

    class SampleNova(Strategy):
        label = "sample-nova"

        def counts_per_update(self, *, steps_per_update, n_samples):
            return n_samples

        def arrival_weights(self, *, s, E, p):
            return p * np.divide(1.0, s, out=np.zeros(len(s)), where=s > 0)

        def round_scale(self, *, s, E, p):
            active = s > 0
            return 1.0 if not active.any() else float(p[active] @ s[active]) / float(p[active].sum()) ** 2

    class BadCount(SampleNova):
        def counts_per_update(self, *, steps_per_update, n_samples):
            return n_samples / 2
"""


def test_a_plug_in_strategy_counts_a_devices_work_its_own_way_in_both_forms_of_the_round(plugin_module):
    """Federation hands a plug-in's counts_per_update the same s and E in the stacked and the summed round: its
    coefficients are FedNova's formula (the oracle) with tau_k = s_k n_k, and the two forms make the same model."""
    from coordinator.rules.config import RulesConfig
    from coordinator.rules.round import Arrival, Federation
    from flexfl.errors import PluginError

    name = plugin_module(SAMPLE_NOVA)
    n = {"a": 10, "b": 25, "c": 30}
    s = {"a": 2, "b": 1, "c": 0}
    deltas = {"a": [1.0, -2.0], "b": [0.5, 0.5], "c": [9.0, 9.0]}
    feds = []
    for _ in range(2):
        fed = Federation(rules=RulesConfig(required_updates=3, eta0=1.0, strategy=f"{name}:SampleNova", unit="epoch",
                                           batch_size=10), dataset="synthetic", params={"w": torch.zeros(2)})
        fed.apply_events(arrivals=[Arrival(d, n_k) for d, n_k in n.items()])
        feds.append(fed)
    stacked, summed = feds
    w = stacked.weigh(1, s)
    np.testing.assert_array_equal(w.s, [2, 1, 0])  # recorded as the rules count them
    p = w.p
    oracle = _fednova_oracle(s=[s[d] * n[d] for d in n], p=p, deltas=[deltas[d] for d in n])
    np.testing.assert_allclose(w.coefficients.values @ np.array([deltas[d] for d in n]), oracle, rtol=1e-12)
    # FedNova's own count (SGD steps: a 1, b 3, c 3 per epoch) gives another update here
    steps = _fednova_oracle(s=[2 * 1, 1 * 3, 0], p=p, deltas=[deltas[d] for d in n])
    assert not np.allclose(oracle, steps)
    stacked.close_stacked(w, deltas={"w": torch.tensor([deltas[d] for d in n])}, rows=list(n))
    running = summed.start_sum(summed.open(1))
    for d in ("c", "b", "a"):
        running.add(d, s=s[d], delta={"w": np.array(deltas[d], dtype=np.float32)})
    summed.close_summed(summed.weigh(1, running.s), summed=running)
    np.testing.assert_allclose(stacked.params["w"].numpy(), oracle, rtol=1e-6)
    torch.testing.assert_close(summed.params["w"], stacked.params["w"], rtol=1e-6, atol=1e-7)
    bad = Federation(rules=RulesConfig(required_updates=3, strategy=f"{name}:BadCount", unit="epoch", eta0=1.0,
                                       batch_size=10), dataset="synthetic", params={"w": torch.zeros(2)})
    bad.apply_events(arrivals=[Arrival("a", 10), Arrival("b", 25)])
    with pytest.raises(PluginError, match=rf"strategy plug-in '{name}:BadCount' returned .* from counts_per_update "
                                          r"for 2 devices; expected one integer >= 1 per device"):
        bad.weigh(1, {"a": 1})
