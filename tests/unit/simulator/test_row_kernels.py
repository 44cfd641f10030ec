"""Both blockings of the cache trainer's products equal a float64 reference, on shapes off their blocks."""

import llvmlite.binding as llvm
import numpy as np
import pytest

from simulator import row_kernels

# (rows of w, inputs, batch): the blocks are 2, 3 or 4 rows of w and 5 or 10 rows of h; these
# shapes leave remainders in each, and (200, 784, 10) is the MNIST MLP's first layer.
SHAPES = [(1, 1, 1), (3, 7, 4), (4, 33, 5), (5, 17, 9), (10, 200, 10), (7, 40, 12), (200, 784, 10)]
FORWARD = {"wide": row_kernels.forward_add_wide, "narrow": row_kernels.forward_add_narrow}
UPDATE = {"wide": row_kernels.sgd_update_wide, "narrow": row_kernels.sgd_update_narrow}


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


@pytest.mark.parametrize("blocking", sorted(UPDATE))
@pytest.mark.parametrize("n_out, n_in, batch", SHAPES)
def test_sgd_update_subtracts_the_weight_gradient(blocking, n_out, n_in, batch):
    w, h, g = _arrays(n_out, n_in, batch, seed=n_out * 1000 + n_in + 1)
    want = w.astype(np.float64) - g.astype(np.float64).T @ h.astype(np.float64)
    UPDATE[blocking](g, h, w)
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-5 * np.sqrt(batch))


def test_the_blocking_follows_the_cpus_vector_registers(monkeypatch):
    chosen = row_kernels.forward_add is row_kernels.forward_add_wide
    assert chosen == row_kernels.WIDE_REGISTERS
    assert (row_kernels.sgd_update is row_kernels.sgd_update_wide) == row_kernels.WIDE_REGISTERS
    monkeypatch.setattr(row_kernels.platform, "machine", lambda: "aarch64")
    assert row_kernels._wide_registers()  # NEON: 32 registers
    monkeypatch.setattr(row_kernels.platform, "machine", lambda: "x86_64")
    assert row_kernels._wide_registers() == bool(llvm.get_host_cpu_features().get("avx512f", False))
