"""A dataset split over devices, as the coordinator and the simulator consume it.

`build_federated` turns a partition spec (workloads.partition_spec) into per-device training
sets, a global test set and (for SYNTHETIC) per-device holdouts, reproducibly for its seed;
`load_shard` gives one device's training set without building the others;
`load_evaluation` gives the coordinator's view (sample counts, test set, holdouts) without
any training images. All three read the split from `_split`, the one place it is decided.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from flexfl.errors import ConfigError, DataError, PluginError
from workloads.datasets import ArrayDataset, PluginData, RawImages, dataset_shape, default_emnist_root, load_raw
from workloads.defaults import DEFAULTS  # the paper's per-dataset settings, light for the parsers
from workloads.models import MODEL_NAMES, ModelSpec
from workloads.partition import (
    lognormal_draws,
    partition_by_label,
    partition_by_label_shares,
    partition_iid,
    proportional_sizes,
    truncated_pareto_draws,
)
from workloads.partition_spec import Dataset, PartitionSpec, Sizes, is_builtin_dataset
from workloads.synthetic import make_synthetic

log = logging.getLogger(__name__)


def model_spec(dataset: Dataset | str, *, model: str | None = None) -> ModelSpec:
    """The model a run of `dataset` trains: `model` ([rules] model), else the paper's for the dataset.

    A plug-in dataset has no paper model: [rules] model names one (RulesConfig.check_for).
    """
    if model is None:
        if not is_builtin_dataset(dataset):
            raise ConfigError(f"dataset {dataset!r} is a plug-in: name its model in [rules] model")
        model = DEFAULTS[Dataset(dataset)].model
    shape = dataset_shape(dataset)
    return ModelSpec(name=model, input_shape=shape.input_shape, num_classes=shape.num_classes)


def initial_model(workload: ModelSpec | Dataset | str, *, seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model and its initial parameters for `seed`: the same in live runs and simulations.

    `workload` is a ModelSpec (model_spec), or a dataset's name for its paper model.
    """
    spec = workload if isinstance(workload, ModelSpec) else model_spec(workload)
    torch.manual_seed(seed)
    model = spec.build()
    return model, {n: p.detach().clone() for n, p in model.named_parameters()}


def check_plugins(spec: PartitionSpec, *, model: str | None) -> None:
    """Load a plug-in dataset and split it, and build a plug-in model on its shape, once: their errors then
    come before a run writes anything (`flexfl live` claims its folder before its coordinator loads them).

    Built-in datasets and models are left alone (MNIST would be read for nothing).
    """
    dataset_is_plugin = not is_builtin_dataset(spec.dataset)
    if dataset_is_plugin:
        load_evaluation(spec)
    if dataset_is_plugin or (model is not None and model not in MODEL_NAMES):
        initial_model(model_spec(spec.dataset, model=model), seed=0)


class _TestSets:
    """Weights and the objective's test set, over `sample_counts`, `test`, `device_test` and `_test_cache`."""

    if TYPE_CHECKING:  # a field of EvaluationData, a property of FederatedData
        @property
        def sample_counts(self) -> np.ndarray: ...

    test: ArrayDataset
    device_test: tuple[ArrayDataset, ...] | None
    _test_cache: dict

    @property
    def weights(self) -> np.ndarray:
        """p_k = n_k / n per device (float64, sums to 1)."""
        counts = self.sample_counts
        return counts / counts.sum()

    def test_for(self, shards: Sequence[int]) -> ArrayDataset:
        """The test set of an objective over these shards (the paper's rule for arrivals/departures).

        With per-device holdouts (SYNTHETIC) it is the holdouts of exactly these devices: an
        arrival's holdout joins it, an excluded device's leaves it. Without them (MNIST,
        EMNIST) it is the dataset's test set. Cached for the last set of shards asked for.
        """
        if self.device_test is None or not len(shards):
            return self.test
        key = tuple(sorted(int(k) for k in shards))
        cached = self._test_cache.get("key")
        if cached != key:
            self._test_cache.update(key=key, data=_concatenate([self.device_test[k] for k in key]))
        return self._test_cache["data"]


@dataclass(frozen=True, eq=False)  # eq=False: holds numpy arrays
class FederatedData(_TestSets):
    """Per-device training sets, the global test set and optional per-device holdouts."""

    name: str
    train: tuple[ArrayDataset, ...]
    test: ArrayDataset
    device_test: tuple[ArrayDataset, ...] | None
    num_classes: int
    in_features: int
    _test_cache: dict = field(default_factory=dict, repr=False)

    @cached_property
    def sample_counts(self) -> np.ndarray:
        """n_k per device (int64, read-only): counted once, as callers read it per device in loops over
        the population (rebuilding it per read made a run's set-up quadratic in the devices, issue 36)."""
        counts = np.array([len(d) for d in self.train], dtype=np.int64)
        counts.setflags(write=False)
        return counts


@dataclass(frozen=True, eq=False)
class EvaluationData(_TestSets):
    """What a coordinator needs of a split: n_k per device, the test set and per-device holdouts.

    No training samples: the coordinator weighs devices by their counts and evaluates on the
    test set (or the objective's holdouts), while the devices hold their own shards.
    """

    sample_counts: np.ndarray  # n_k per device, int64
    test: ArrayDataset
    device_test: tuple[ArrayDataset, ...] | None
    _test_cache: dict = field(default_factory=dict, repr=False)


def _derived_seeds(seed: int, n: int) -> list[int]:
    # Independent streams per random step, so changing one step leaves the others intact.
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(n)]


def build_federated(spec: PartitionSpec, *, cache_dir: Path | None = None,
                    min_samples: int | None = None) -> FederatedData:
    """Split the dataset of `spec` over its devices, reproducibly for its seed.

    Sample counts are Pareto(0.5) (see `pareto_sizes`) or equal. MNIST/EMNIST:
    `total_samples` defaults to the whole training set, `min_samples` to 20; non-IID gives
    each device one label (`partition_by_label`, which may shrink counts); test = the
    dataset's test set. SYNTHETIC: `total_samples` defaults to 20000, `min_samples` to 50;
    IID is the shared-model variant, non-IID the alpha/beta formula; each device is split
    90/10 into train and holdout, and test = all holdouts concatenated.
    """
    shape = dataset_shape(spec.dataset)
    split = _split(spec, cache_dir=cache_dir, min_samples=min_samples)
    holdout = split.holdouts()
    return FederatedData(name=spec.dataset, train=tuple(split.train(k) for k in range(spec.n_devices)),
                         test=split.test(holdout), device_test=holdout,
                         num_classes=shape.num_classes, in_features=shape.in_features)


def load_shard(spec: PartitionSpec, index: int, *, cache_dir: Path | None = None,
               as_bytes: bool = False) -> ArrayDataset:
    """Device `index`'s training data, equal to build_federated(spec).train[index].

    For MNIST/EMNIST only the labels of the whole training set are read to compute the
    split, and only this device's images are read (an edge device keeps its own shard);
    `as_bytes` keeps them as uint8 pixel bytes (ArrayDataset: the same values once scaled,
    4x less memory). SYNTHETIC is generated whole (a few MB) and cut.
    """
    if not 0 <= index < spec.n_devices:
        raise ConfigError(f"shard_index {index} is outside the partition's 0..{spec.n_devices - 1}")
    return _split(spec, cache_dir=cache_dir, min_samples=None).train(index, as_bytes=as_bytes)


def load_evaluation(spec: PartitionSpec, *, cache_dir: Path | None = None) -> EvaluationData:
    """The coordinator's view of the split of `spec`: build_federated(spec)'s sample counts, test set and holdouts.

    For MNIST/EMNIST only the labels of the training set are read to compute the split, and
    of its images only the holdouts' rows (none without a holdout_fraction): the test set
    is then the dataset's own. SYNTHETIC is generated whole (a few MB) and cut.
    """
    split = _split(spec, cache_dir=cache_dir, min_samples=None)
    holdout = split.holdouts()
    return EvaluationData(sample_counts=split.train_counts(), test=split.test(holdout), device_test=holdout)


@dataclass(frozen=True, eq=False)
class _Split:
    """Where each device's samples are, before any training image is read.

    Images: the rows of `raw`'s training set each device holds; SYNTHETIC: each device's
    generated samples. With a holdout fraction, `positions` gives each device's (training,
    holdout) positions within its samples.
    """

    raw: RawImages | PluginData | None
    rows: list[np.ndarray] | None  # images and plug-ins: per device, row indices into raw.x_train
    synthetic: list[ArrayDataset] | None  # SYNTHETIC: per device, all its samples
    positions: list[tuple[np.ndarray, np.ndarray]] | None

    def train_counts(self) -> np.ndarray:
        """n_k per device (int64): the training samples, holdouts excluded."""
        if self.positions is not None:
            return np.array([len(tr) for tr, _ in self.positions], dtype=np.int64)
        if self.synthetic is not None:
            return np.array([len(d) for d in self.synthetic], dtype=np.int64)
        return np.array([len(d) for d in self.rows or ()], dtype=np.int64)

    def train(self, k: int, *, as_bytes: bool = False) -> ArrayDataset:
        """Device k's training samples (only its own images are read)."""
        return self._take(k, None if self.positions is None else self.positions[k][0], as_bytes=as_bytes)

    def holdouts(self) -> tuple[ArrayDataset, ...] | None:
        """Every device's holdout, or None without a holdout fraction."""
        if self.positions is None:
            return None
        return tuple(self._take(k, held_out, as_bytes=False) for k, (_, held_out) in enumerate(self.positions))

    def test(self, holdouts: tuple[ArrayDataset, ...] | None) -> ArrayDataset:
        """The global test set: all holdouts concatenated, else the image dataset's own."""
        if holdouts is not None:
            return _concatenate(holdouts)
        own = None if self.raw is None else self.raw.test()
        if own is None:  # PartitionSpec and _split refuse SYNTHETIC and plug-ins without holdouts and a test set
            raise ConfigError("partition: no test set: neither per-device holdouts nor a test set of the dataset's own")
        return own

    def _take(self, k: int, positions: np.ndarray | None, *, as_bytes: bool) -> ArrayDataset:
        if self.synthetic is not None:
            mine = self.synthetic[k]
            return mine if positions is None else mine.subset(positions)
        if self.rows is None or self.raw is None:
            raise TypeError("_Split holds neither SYNTHETIC devices nor image rows")  # _split builds one or the other
        rows = self.rows[k] if positions is None else self.rows[k][positions]
        return self.raw.train_subset(rows, as_bytes=as_bytes)


def _split(spec: PartitionSpec, *, cache_dir: Path | None, min_samples: int | None) -> _Split:
    """The split of `spec`: for MNIST/EMNIST from the labels alone (no image is read here)."""
    raw = rows = synthetic = None
    if spec.dataset is Dataset.SYNTHETIC:
        synthetic = _synthetic_devices(spec, min_samples)  # a few MB: generated whole
        lengths = [len(d) for d in synthetic]
    else:
        raw = load_raw(spec.dataset, emnist_root=Path(spec.emnist_root) if spec.emnist_root else default_emnist_root(),
                       cache_dir=cache_dir)
        if isinstance(raw, PluginData) and raw.x_test is None and spec.holdout == 0:
            raise PluginError(f"dataset plug-in {spec.dataset!r} gives no test set (x_test is None): set [partition] "
                              "holdout_fraction (e.g. 0.1) to test on a holdout of each device's samples")
        rows = _image_parts(spec, raw.y_train, min_samples)
        lengths = [len(r) for r in rows]
    positions = (_holdout_split(lengths, fraction=spec.holdout, seed=_seeds(spec)[1])
                 if spec.holdout > 0 else None)
    return _Split(raw=raw, rows=rows, synthetic=synthetic, positions=positions)


def _concatenate(parts: Sequence[ArrayDataset]) -> ArrayDataset:
    return ArrayDataset(x=np.concatenate([p.x for p in parts]), y=np.concatenate([p.y for p in parts]))


def _seeds(spec: PartitionSpec) -> tuple[int, int, int]:
    sizes_seed, split_seed, data_seed = _derived_seeds(spec.seed, 3)
    return sizes_seed, split_seed, data_seed


def _size_weights(spec: PartitionSpec) -> np.ndarray:
    """Relative sizes of the Pareto-like readings (see workloads.partition_spec.Sizes)."""
    n, seed = spec.n_devices, _seeds(spec)[0]
    if spec.sizes is Sizes.PARETO_TRUNCATED:
        return truncated_pareto_draws(n, upper=float(max(n, 2)), seed=seed)
    if spec.sizes is Sizes.LOGNORMAL:
        return lognormal_draws(n, seed=seed)
    return np.random.default_rng(seed).pareto(0.5, n) + 1.0  # Type I: support [1, inf)


def _device_sizes(spec: PartitionSpec, total: int, min_size: int) -> np.ndarray:
    if spec.sizes is Sizes.EQUAL:
        return np.full(spec.n_devices, total // spec.n_devices, dtype=np.int64)
    cap = None
    if spec.sizes is Sizes.PARETO_CAPPED:
        cap = max(min_size, -(-total // dataset_shape(spec.dataset).num_classes))  # one class's share, rounded up
    return proportional_sizes(_size_weights(spec), total=total, min_size=min_size, max_size=cap)


def _synthetic_devices(spec: PartitionSpec, min_samples: int | None) -> list[ArrayDataset]:
    defaults = DEFAULTS[spec.dataset]
    counts = _device_sizes(spec, spec.total_samples or 20000, min_samples or 50)
    if spec.holdout > 0 and counts.min() < 2:
        raise ConfigError("SYNTHETIC needs at least 2 samples per device (train + holdout); raise total_samples")
    return make_synthetic(alpha=spec.synthetic_alpha, beta=spec.synthetic_beta, sizes=counts, seed=_seeds(spec)[2],
                          iid=spec.iid, dim=defaults.in_features, num_classes=defaults.num_classes)


def _image_parts(spec: PartitionSpec, labels: np.ndarray, min_samples: int | None) -> list[np.ndarray]:
    total = spec.total_samples or len(labels)
    if total > len(labels):
        raise DataError(f"total_samples {total} exceeds the {len(labels)} training samples of {spec.dataset}")
    split_seed = _seeds(spec)[1]
    if spec.sizes is Sizes.PARETO_PER_LABEL:
        return partition_by_label_shares(labels, _size_weights(spec), total=total, seed=split_seed,
                                         min_size=min_samples or 20)[0]
    counts = _device_sizes(spec, total, min_samples or 20)
    if spec.iid:
        return partition_iid(len(labels), counts, seed=split_seed)
    return partition_by_label(labels, counts, seed=split_seed)[0]


def _holdout_split(lengths: Sequence[int], *, fraction: float, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per device, (training, holdout) positions; the holdout gets n - int((1 - fraction) n).

    FedProx keeps int(0.9 n) for training (at least 1 holdout sample for n >= 2). Depends
    on the devices' sizes only, so one device's split is computed without the others' data.
    """
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        perm = rng.permutation(int(n))
        n_train = int((1.0 - fraction) * n)
        out.append((perm[:n_train], perm[n_train:]))
    return out
