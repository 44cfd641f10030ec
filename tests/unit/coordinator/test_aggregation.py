"""Schemes A/B/C by hand (paper Figure 3), FedAvg equivalence, edge cases, and C's unbiasedness."""

import numpy as np
import pytest
import torch

from coordinator.aggregation import Scheme, apply_update, coefficients, scheme_a, scheme_b, scheme_c
from flexfl.errors import AggregationError

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


@pytest.mark.parametrize("scheme", list(Scheme))
def test_all_schemes_equal_fedavg_when_everyone_completes(scheme):
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


@pytest.mark.parametrize("scheme", list(Scheme))
def test_inactive_devices_get_zero(scheme):
    c = coefficients(scheme, s=[0, 5, 0, 5], E=5, p=[0.25] * 4)
    assert c.values[0] == 0 and c.values[2] == 0


@pytest.mark.parametrize("scheme", list(Scheme))
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


def test_unknown_scheme_rejected():
    with pytest.raises(AggregationError, match="unknown scheme"):
        coefficients("D", s=[1], E=1, p=[1.0])


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
