"""A dataset split over devices, as the coordinator and the simulator consume it.

`build_federated` turns a dataset name and a few knobs into per-device training sets, a
global test set and (for SYNTHETIC) per-device holdouts, reproducibly for a seed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flexfl.errors import ConfigError, DataError
from workloads.datasets import ArrayDataset, load_emnist, load_mnist
from workloads.partition import pareto_sizes, partition_by_label, partition_iid
from workloads.synthetic import make_synthetic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadDefaults:
    """The paper's model and hyper-parameters for one dataset."""

    model: str
    eta0: float
    batch_size: int
    num_classes: int
    in_features: int


# Section 5.1 of the paper: eta_0 and batch sizes; models from FedAvg / FedProx.
DEFAULTS: dict[str, WorkloadDefaults] = {
    "mnist": WorkloadDefaults(model="mlp", eta0=2e-3, batch_size=10, num_classes=10, in_features=784),
    "emnist": WorkloadDefaults(model="cnn", eta0=5e-4, batch_size=10, num_classes=47, in_features=784),
    "synthetic": WorkloadDefaults(model="logreg", eta0=1.0, batch_size=20, num_classes=10, in_features=60),
}

SYNTHETIC_TRAIN_FRACTION = 0.9  # FedProx's per-device train/test split


@dataclass(frozen=True, eq=False)  # eq=False: holds numpy arrays
class FederatedData:
    """Per-device training sets, the global test set and optional per-device holdouts."""

    name: str
    train: tuple[ArrayDataset, ...]
    test: ArrayDataset
    device_test: tuple[ArrayDataset, ...] | None
    num_classes: int
    in_features: int

    @property
    def sample_counts(self) -> np.ndarray:
        """n_k per device (int64)."""
        return np.array([len(d) for d in self.train], dtype=np.int64)

    @property
    def weights(self) -> np.ndarray:
        """p_k = n_k / n per device (float64, sums to 1)."""
        counts = self.sample_counts
        return counts / counts.sum()


def _derived_seeds(seed: int, n: int) -> list[int]:
    # Independent streams per random step, so changing one step leaves the others intact.
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(n)]


def build_federated(
    name: str,
    *,
    n_devices: int,
    iid: bool,
    seed: int,
    alpha: float = 0.0,
    beta: float = 0.0,
    total_samples: int | None = None,
    min_samples: int | None = None,
    emnist_root: Path | None = None,
    cache_dir: Path | None = None,
    sizes: str = "pareto",
) -> FederatedData:
    """Split dataset `name` ("mnist", "emnist", "synthetic") over n_devices, reproducibly.

    Sample counts are Pareto(0.5) (see `pareto_sizes`). MNIST/EMNIST: `total_samples`
    defaults to the whole training set, `min_samples` to 20; non-IID gives each device one
    label (`partition_by_label`, which may shrink counts); test = the dataset's test set.
    SYNTHETIC: `total_samples` defaults to 20000, `min_samples` to 50; iid=True is the IID
    variant, iid=False the alpha/beta formula; each device is split 90/10 into train and
    holdout, and test = all holdouts concatenated.
    `sizes="equal"` gives every device the same count instead (the paper's fast-reboot setup).
    """
    if name not in DEFAULTS:
        raise ConfigError(f"unknown dataset {name!r}; valid names: {', '.join(DEFAULTS)}")
    if n_devices < 1:
        raise ConfigError(f"n_devices must be >= 1, got {n_devices}")
    defaults = DEFAULTS[name]
    sizes_seed, split_seed, data_seed = _derived_seeds(seed, 3)
    if sizes not in ("pareto", "equal"):
        raise ConfigError(f"sizes must be 'pareto' or 'equal', got {sizes!r}")

    def device_sizes(total: int, min_size: int) -> np.ndarray:
        if sizes == "equal":
            return np.full(n_devices, total // n_devices, dtype=np.int64)
        return pareto_sizes(n_devices, total=total, min_size=min_size, seed=sizes_seed)

    if name == "synthetic":
        if iid and (alpha or beta):
            raise ConfigError(f"alpha/beta ({alpha}, {beta}) apply to non-IID SYNTHETIC only; pass iid=False (--non-iid)")
        counts = device_sizes(total_samples or 20000, min_samples or 50)
        if counts.min() < 2:
            raise ConfigError("SYNTHETIC needs at least 2 samples per device (train + holdout); raise min_samples")
        devices = make_synthetic(alpha=alpha, beta=beta, sizes=counts, seed=data_seed, iid=iid,
                                 dim=defaults.in_features, num_classes=defaults.num_classes)
        train, holdout = _split_devices(devices, seed=split_seed)
        test = ArrayDataset(x=np.concatenate([d.x for d in holdout]), y=np.concatenate([d.y for d in holdout]))
        return FederatedData(name=name, train=train, test=test, device_test=holdout,
                             num_classes=defaults.num_classes, in_features=defaults.in_features)

    if alpha or beta:
        log.warning("alpha/beta apply to SYNTHETIC only; ignored for %s", name)
    if name == "mnist":
        full_train, test = load_mnist(cache_dir)
    else:
        if emnist_root is None:
            raise ConfigError("EMNIST needs its data folder: pass --emnist-root DIR (emnist_root=...)")
        full_train, test = load_emnist(Path(emnist_root))
    total = total_samples or len(full_train)
    if total > len(full_train):
        raise DataError(f"total_samples {total} exceeds the {len(full_train)} training samples of {name}")
    counts = device_sizes(total, min_samples or 20)
    if iid:
        parts = partition_iid(len(full_train), counts, seed=split_seed)
    else:
        parts, _ = partition_by_label(full_train.y, counts, seed=split_seed)
    return FederatedData(name=name, train=tuple(full_train.subset(p) for p in parts), test=test,
                         device_test=None, num_classes=defaults.num_classes, in_features=defaults.in_features)


def _split_devices(
    devices: list[ArrayDataset], *, seed: int
) -> tuple[tuple[ArrayDataset, ...], tuple[ArrayDataset, ...]]:
    # FedProx keeps int(0.9 n) for training; the holdout gets the rest (at least 1 for n >= 2).
    rng = np.random.default_rng(seed)
    train, holdout = [], []
    for d in devices:
        perm = rng.permutation(len(d))
        n_train = int(SYNTHETIC_TRAIN_FRACTION * len(d))
        train.append(d.subset(perm[:n_train]))
        holdout.append(d.subset(perm[n_train:]))
    return tuple(train), tuple(holdout)
