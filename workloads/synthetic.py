"""SYNTHETIC(alpha, beta) of the FedProx paper (Li et al. 2018), one dataset per device.

Non-IID (per device k): u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2); W_k [dim, C] and b_k [C]
have entries ~ N(u_k, 1); v_k has coordinates ~ N(B_k, 1); x ~ N(v_k, diag(j^-1.2)),
j = 1..dim; y = argmax(x W_k + b_k). alpha moves the devices' models apart, beta their
inputs. IID: one W, b ~ N(0, 1) shared by all devices and v_k = 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from flexfl.errors import DataError
from workloads.datasets import ArrayDataset

log = logging.getLogger(__name__)


def make_synthetic(
    *,
    alpha: float,
    beta: float,
    sizes: Sequence[int] | np.ndarray,
    seed: int,
    iid: bool | None = None,
    dim: int = 60,
    num_classes: int = 10,
) -> list[ArrayDataset]:
    """One SYNTHETIC(alpha, beta) dataset per device, device k holding sizes[k] samples.

    `iid=None` picks the IID variant exactly when alpha == beta == 0 (the paper's "IID is
    alpha = beta = 0"); `iid=False` forces the per-device formula even at (0, 0), where
    devices still differ because each draws its own W_k, b_k. Reproducible for a seed.
    """
    if alpha < 0 or beta < 0:
        raise DataError(f"alpha and beta are standard deviations and must be >= 0, got ({alpha}, {beta})")
    if dim < 1 or num_classes < 2:
        raise DataError(f"need dim >= 1 and num_classes >= 2, got dim={dim}, num_classes={num_classes}")
    if any(int(n) < 0 for n in sizes):
        raise DataError(f"sizes must be >= 0, got {list(sizes)}")
    if iid is None:
        iid = alpha == 0 and beta == 0
    rng = np.random.default_rng(seed)
    n_devices = len(sizes)
    # Standard deviations of the coordinates of x: sqrt of diag(j^-1.2).
    x_std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6

    if iid:
        w_shared = rng.normal(0.0, 1.0, (dim, num_classes))
        b_shared = rng.normal(0.0, 1.0, num_classes)
    else:
        u = rng.normal(0.0, alpha, n_devices)
        big_b = rng.normal(0.0, beta, n_devices)

    datasets = []
    for k, n in enumerate(sizes):
        if iid:
            w, b, v = w_shared, b_shared, np.zeros(dim)
        else:
            w = rng.normal(u[k], 1.0, (dim, num_classes))
            b = rng.normal(u[k], 1.0, num_classes)
            v = rng.normal(big_b[k], 1.0, dim)
        x = v + rng.standard_normal((int(n), dim)) * x_std  # [n, dim]
        # argmax of the logits equals argmax of the softmax; no need to normalise.
        y = np.argmax(x @ w + b, axis=1)
        datasets.append(ArrayDataset(x=x.astype(np.float32), y=y.astype(np.int64)))
    log.debug("SYNTHETIC(%s, %s) iid=%s: %d devices, %d samples", alpha, beta, iid, n_devices, sum(map(int, sizes)))
    return datasets
