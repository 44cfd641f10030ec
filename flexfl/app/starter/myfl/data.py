"""A small dataset, generated in code (nothing to download): Gaussian blobs, one per class.

FlexFL calls blobs() with no arguments and splits what it returns over the devices by the
config's [partition] table, as it splits MNIST: IID or one label per device (`iid`), sample
counts by `sizes`, and the split's `seed`. It needs x_train (float32 [n, ...]), y_train
(integer labels 0..num_classes-1, [n]), x_test and y_test (None for both: no test set, then
set [partition] holdout_fraction) and num_classes, as attributes or dict keys.

It must return the same arrays at every call, on every machine: the coordinator and each
agent call it and cut their own shards from it (hence the fixed seed).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

NUM_CLASSES = 4
FEATURES = 16
NOISE = 2.0  # the blobs overlap: TinyNet reaches about 77 % on IID data, not 100 %


def blobs() -> SimpleNamespace:
    """2000 training and 500 test samples of NUM_CLASSES blobs in FEATURES dimensions."""
    rng = np.random.default_rng(0)  # fixed: every machine gets the same data
    centres = rng.normal(0.0, 1.0, (NUM_CLASSES, FEATURES))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, NUM_CLASSES, n)
        x = centres[y] + rng.normal(0.0, NOISE, (n, FEATURES))
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = draw(2000)
    x_test, y_test = draw(500)
    return SimpleNamespace(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=NUM_CLASSES)
