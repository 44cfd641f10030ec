"""The cache trainer's kernels equal a float64 reference, on shapes off their blocks: both blockings of
the products, the products over a list of rows (the transposed first layer's skipped inputs), the
columns not zero in a batch, and the transposed difference."""

import llvmlite.binding as llvm
import numpy as np
import pytest

from simulator.trainers import (
    row_kernels,  # (rows of w, inputs, batch): the blocks are 2, 3 or 4 rows of w and 2, 5 or 10 rows of h; these
)

# shapes leave remainders in each, and (200, 784, 10) is the MNIST MLP's first layer.
SHAPES = [(1, 1, 1), (3, 7, 4), (4, 33, 5), (5, 17, 9), (10, 200, 10), (7, 40, 12), (200, 784, 10)]
FORWARD = {"wide": row_kernels.forward_add_wide, "narrow": row_kernels.forward_add_narrow}
UPDATE = {"wide": row_kernels.sgd_update_wide, "narrow": row_kernels.sgd_update_narrow}
PRODUCT = {"wide": row_kernels.product_add_wide, "narrow": row_kernels.product_add_narrow}


def _arrays(n_out, n_in, batch, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n_out, n_in), dtype=np.float32), rng.standard_normal((batch, n_in), dtype=np.float32),
            rng.standard_normal((batch, n_out), dtype=np.float32))


@pytest.mark.parametrize("blocking", sorted(FORWARD))
@pytest.mark.parametrize("n_out, n_in, batch", SHAPES)
def test_forward_add_adds_h_times_w_transposed(blocking, n_out, n_in, batch):
    w, h, z = _arrays(n_out, n_in, batch, seed=n_out * 1000 + n_in)
    want = z.astype(np.float64) + h.astype(np.float64) @ w.astype(np.float64).T
    FORWARD[blocking](w, h, z)
    np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-5 * np.sqrt(n_in))


def _some_rows(n_out, seed):
    """Every row, and an ascending subset with gaps (about half, at least one row)."""
    rng = np.random.default_rng(seed)
    subset = np.flatnonzero(rng.random(n_out) < 0.5)
    return [np.arange(n_out), subset if len(subset) else np.array([n_out - 1])]


@pytest.mark.parametrize("blocking", sorted(UPDATE))
@pytest.mark.parametrize("n_out, n_in, batch", SHAPES)
def test_sgd_update_subtracts_the_weight_gradient_from_the_listed_rows(blocking, n_out, n_in, batch):
    for rows in _some_rows(n_out, seed=n_out + n_in):
        w, h, g = _arrays(n_out, n_in, batch, seed=n_out * 1000 + n_in + 1)
        want = w.astype(np.float64)
        want[rows] -= (g.astype(np.float64).T @ h.astype(np.float64))[rows]
        listed = np.zeros(n_out + 3, dtype=np.int64)  # longer than n_rows: only rows[:n_rows] count
        listed[:len(rows)] = rows
        UPDATE[blocking](g, h, w, listed, len(rows))
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-5 * np.sqrt(batch))
        unlisted = np.setdiff1d(np.arange(n_out), rows)
        assert np.array_equal(w[unlisted], want[unlisted])  # untouched, bit for bit


@pytest.mark.parametrize("blocking", sorted(PRODUCT))
@pytest.mark.parametrize("n_out, n_in, batch", SHAPES)
def test_product_add_sums_over_the_listed_rows(blocking, n_out, n_in, batch):
    # out[b, k] += sum_j g[b, j] w[j, k] over j in rows: the input gradient (all rows), and the
    # transposed first layer's forward product (the rows of the inputs not zero in the batch).
    for rows in _some_rows(n_out, seed=n_out * 7 + batch):
        w, out, g = _arrays(n_out, n_in, batch, seed=n_out * 1000 + n_in + 2)
        want = out.astype(np.float64) + g[:, rows].astype(np.float64) @ w[rows].astype(np.float64)
        PRODUCT[blocking](g, w, out, rows, len(rows))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(n_out))


def test_nonzero_columns_lists_the_inputs_some_sample_uses():
    rng = np.random.default_rng(3)
    h = np.where(rng.random((10, 784)) < 0.08, rng.random((10, 784), dtype=np.float32), 0).astype(np.float32)
    h[:, :50] = 0  # a border no sample uses
    h[4, 783] = -0.5  # negative values count as used
    columns = np.full(784, -1, dtype=np.int64)
    n = row_kernels.nonzero_columns(h, np.empty(784, dtype=np.uint8), columns)
    assert list(columns[:n]) == list(np.flatnonzero((h != 0).any(axis=0)))
    assert 0 < n < 784 and 783 in columns[:n]
    assert row_kernels.nonzero_columns(np.zeros((3, 5), np.float32), np.empty(5, np.uint8), columns) == 0


@pytest.mark.parametrize("shape", [(784, 200), (61, 13), (8, 8), (3, 5), (8, 17), (17, 8), (60, 10)])
def test_difference_transposed_is_the_transposed_delta_bit_for_bit(shape):
    # 8 x 8 blocks transposed in registers, and the rows and columns past the last whole block.
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    wt, wt0 = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)
    out = np.full(shape[::-1], np.nan, dtype=np.float32)
    row_kernels.difference_transposed(wt, wt0, out)
    assert np.array_equal(out, (wt - wt0).T)


def test_the_blocking_follows_the_cpus_vector_registers(monkeypatch):
    chosen = row_kernels.forward_add is row_kernels.forward_add_wide
    assert chosen == row_kernels.WIDE_REGISTERS
    assert (row_kernels.sgd_update is row_kernels.sgd_update_wide) == row_kernels.WIDE_REGISTERS
    assert (row_kernels.product_add is row_kernels.product_add_wide) == row_kernels.WIDE_REGISTERS
    monkeypatch.setattr(row_kernels.platform, "machine", lambda: "aarch64")
    assert row_kernels._wide_registers()  # NEON: 32 registers
    monkeypatch.setattr(row_kernels.platform, "machine", lambda: "x86_64")
    assert row_kernels._wide_registers() == bool(llvm.get_host_cpu_features().get("avx512f", False))
