"""SYNTHETIC(alpha, beta): shapes, reproducibility and how (non-)IID the devices are."""

from __future__ import annotations

import numpy as np
import pytest

from flexfl.errors import DataError
from workloads.datasets import ArrayDataset
from workloads.synthetic import make_synthetic


def label_tv(devices: list[ArrayDataset]) -> float:
    """Mean total-variation distance between the devices' label distributions."""
    dists = np.array([np.bincount(d.y, minlength=10) / len(d) for d in devices])
    pairs = [(i, j) for i in range(len(dists)) for j in range(i + 1, len(dists))]
    return float(np.mean([0.5 * np.abs(dists[i] - dists[j]).sum() for i, j in pairs]))


def feature_shift(devices: list[ArrayDataset]) -> float:
    """Mean distance of a device's feature mean from the average feature mean."""
    means = np.array([d.x.mean(axis=0) for d in devices])
    return float(np.linalg.norm(means - means.mean(axis=0), axis=1).mean())


def test_shapes_dtypes_and_label_range() -> None:
    devices = make_synthetic(alpha=1.0, beta=1.0, sizes=[30, 50, 7], seed=0)
    assert [len(d) for d in devices] == [30, 50, 7]
    for d in devices:
        assert d.x.shape == (len(d), 60) and d.x.dtype == np.float32
        assert d.y.dtype == np.int64 and d.y.min() >= 0 and d.y.max() <= 9


def test_custom_dim_and_classes() -> None:
    (d,) = make_synthetic(alpha=0.5, beta=0.5, sizes=[400], seed=0, dim=8, num_classes=3)
    assert d.x.shape == (400, 8) and set(d.y.tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(("alpha", "beta"), [(0.0, 0.0), (1.0, 1.0)])
def test_reproducible_for_a_seed_and_different_for_another(alpha: float, beta: float) -> None:
    a = make_synthetic(alpha=alpha, beta=beta, sizes=[40, 40], seed=3)
    b = make_synthetic(alpha=alpha, beta=beta, sizes=[40, 40], seed=3)
    c = make_synthetic(alpha=alpha, beta=beta, sizes=[40, 40], seed=4)
    assert all(np.array_equal(p.x, q.x) and np.array_equal(p.y, q.y) for p, q in zip(a, b))
    assert not np.array_equal(a[0].x, c[0].x)


def test_iid_default_follows_alpha_beta_zero() -> None:
    default = make_synthetic(alpha=0.0, beta=0.0, sizes=[50, 50], seed=1)
    forced_iid = make_synthetic(alpha=0.0, beta=0.0, sizes=[50, 50], seed=1, iid=True)
    forced_niid = make_synthetic(alpha=0.0, beta=0.0, sizes=[50, 50], seed=1, iid=False)
    assert np.array_equal(default[1].y, forced_iid[1].y)
    assert not np.array_equal(default[1].x, forced_niid[1].x)


def test_iid_features_have_zero_mean_and_covariance_j_to_minus_1_2() -> None:
    (d,) = make_synthetic(alpha=0.0, beta=0.0, sizes=[20000], seed=2)
    expected_var = np.arange(1, 61) ** -1.2
    assert np.allclose(d.x.mean(axis=0), 0.0, atol=0.03)
    assert np.allclose(d.x.var(axis=0) / expected_var, 1.0, atol=0.05)


def test_iid_devices_share_one_labelling_rule() -> None:
    devices = make_synthetic(alpha=0.0, beta=0.0, sizes=[3000] * 10, seed=5)
    niid = make_synthetic(alpha=0.1, beta=0.1, sizes=[3000] * 10, seed=5)
    assert label_tv(devices) < 0.15
    assert label_tv(niid) > 0.5


def test_label_skew_of_every_non_iid_setting_exceeds_iid() -> None:
    iid = label_tv(make_synthetic(alpha=0.0, beta=0.0, sizes=[1000] * 30, seed=7))
    for ab in (0.1, 0.5, 1.0):
        assert label_tv(make_synthetic(alpha=ab, beta=ab, sizes=[1000] * 30, seed=7)) > 3 * iid


def test_feature_shift_grows_with_beta() -> None:
    shifts = [feature_shift(make_synthetic(alpha=ab, beta=ab, sizes=[1000] * 40, seed=11, iid=False))
              for ab in (0.0, 0.5, 1.0, 2.0)]
    assert shifts == sorted(shifts)
    assert shifts[-1] > 1.5 * shifts[0]


def test_alpha_shifts_all_logits_equally_and_leaves_labels_unchanged() -> None:
    # FedProx draws every entry of W_k and b_k around the same u_k: that adds the same
    # amount to each class's logit, so the argmax labels do not depend on alpha. With one
    # seed the other draws coincide, so the datasets are identical. Documented, not a bug.
    low = make_synthetic(alpha=0.1, beta=0.5, sizes=[500] * 5, seed=9)
    high = make_synthetic(alpha=1.0, beta=0.5, sizes=[500] * 5, seed=9)
    assert all(np.array_equal(p.y, q.y) and np.array_equal(p.x, q.x) for p, q in zip(low, high))


def test_rejects_negative_alpha() -> None:
    with pytest.raises(DataError, match="standard deviations"):
        make_synthetic(alpha=-1.0, beta=0.0, sizes=[10], seed=0)
