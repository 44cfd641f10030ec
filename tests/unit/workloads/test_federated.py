"""build_federated: per-device splits, weights, holdouts and the paper's defaults; the coordinator's view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexfl.errors import ConfigError, DataError, DatasetNotFoundError
from workloads.defaults import DEFAULTS, WorkloadDefaults
from workloads.federated import FederatedData, build_federated, load_evaluation
from workloads.partition_spec import PartitionSpec


def build(name, *, min_samples=None, cache_dir=None, **spec):
    """build_federated of PartitionSpec(dataset=name, **spec)."""
    return build_federated(PartitionSpec(dataset=name, **spec), min_samples=min_samples, cache_dir=cache_dir)


def test_defaults_are_the_papers() -> None:
    assert DEFAULTS["mnist"] == WorkloadDefaults(model="mlp", eta0=2e-3, batch_size=10, num_classes=10, in_features=784)
    assert DEFAULTS["emnist"] == WorkloadDefaults(model="cnn", eta0=5e-4, batch_size=10, num_classes=47,
                                                  in_features=784)
    assert DEFAULTS["synthetic"] == WorkloadDefaults(model="logreg", eta0=1.0, batch_size=20, num_classes=10,
                                                     in_features=60)


def test_synthetic_split_holdouts_and_weights() -> None:
    data = build("synthetic", n_devices=20, iid=False, seed=0, alpha=1.0, beta=1.0)
    assert isinstance(data, FederatedData)
    assert (data.num_classes, data.in_features) == (10, 60)
    assert len(data.train) == 20 and data.device_test is not None and len(data.device_test) == 20
    totals = [len(tr) + len(te) for tr, te in zip(data.train, data.device_test)]
    assert sum(totals) == 20000 and min(totals) >= 50
    for tr, te in zip(data.train, data.device_test):
        n = len(tr) + len(te)
        assert len(tr) == int(0.9 * n) and len(te) >= 1
    assert len(data.test) == sum(len(te) for te in data.device_test)
    assert np.array_equal(data.test.x[: len(data.device_test[0])], data.device_test[0].x)
    assert data.sample_counts.dtype == np.int64
    assert np.array_equal(data.sample_counts, [len(tr) for tr in data.train])
    assert data.weights.dtype == np.float64
    assert data.weights.sum() == pytest.approx(1.0)
    assert data.weights[0] == pytest.approx(len(data.train[0]) / data.sample_counts.sum())


def test_synthetic_reproducible_and_seed_dependent() -> None:
    a = build("synthetic", n_devices=5, iid=False, seed=3, alpha=0.5, beta=0.5, total_samples=1000)
    b = build("synthetic", n_devices=5, iid=False, seed=3, alpha=0.5, beta=0.5, total_samples=1000)
    c = build("synthetic", n_devices=5, iid=False, seed=4, alpha=0.5, beta=0.5, total_samples=1000)
    assert all(np.array_equal(p.x, q.x) for p, q in zip(a.train, b.train))
    assert not np.array_equal(a.sample_counts, c.sample_counts)


def test_synthetic_iid_flag_selects_shared_model() -> None:
    iid = build("synthetic", n_devices=10, iid=True, seed=0, total_samples=10000, min_samples=500)
    niid = build("synthetic", n_devices=10, iid=False, seed=0, total_samples=10000, min_samples=500)

    def max_label_share(data: FederatedData) -> float:
        return float(np.mean([np.bincount(d.y, minlength=10).max() / len(d) for d in data.train]))

    # IID devices see the pooled label mix; non-IID devices are dominated by few labels.
    assert max_label_share(iid) < max_label_share(niid)


def test_synthetic_iid_with_alpha_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="non-IID"):
        build("synthetic", n_devices=5, iid=True, seed=0, alpha=1.0, beta=1.0)


def test_unknown_dataset() -> None:
    with pytest.raises(ConfigError, match="mnist, emnist, synthetic"):
        build("cifar", n_devices=5, iid=True, seed=0)


def test_mnist_iid(mnist_cache_dir: Path) -> None:
    data = build("mnist", n_devices=100, iid=True, seed=0, cache_dir=mnist_cache_dir)
    assert data.sample_counts.sum() == 60000 and data.sample_counts.min() >= 20
    assert len(data.test) == 10000 and data.device_test is None
    assert (data.num_classes, data.in_features) == (10, 784)
    # The largest IID device sees (almost) every label.
    assert len(np.unique(data.train[int(np.argmax(data.sample_counts))].y)) == 10


def test_mnist_non_iid_one_label_per_device(mnist_cache_dir: Path) -> None:
    data = build("mnist", n_devices=100, iid=False, seed=0, cache_dir=mnist_cache_dir)
    assert all(len(np.unique(d.y)) == 1 for d in data.train)
    assert data.sample_counts.min() >= 1
    assert data.sample_counts.sum() <= 60000
    labels = {int(d.y[0]) for d in data.train}
    assert len(labels) >= 8  # 100 devices draw among 10 labels


def test_mnist_total_samples_too_large(mnist_cache_dir: Path) -> None:
    with pytest.raises(DataError, match="exceeds the 60000"):
        build("mnist", n_devices=10, iid=True, seed=0, total_samples=70000, cache_dir=mnist_cache_dir)


def test_emnist_without_root_looks_in_the_cache_and_says_how_to_get_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLEXFL_CACHE", str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match=f"under {tmp_path / 'emnist'}.*--emnist-root"):
        build("emnist", n_devices=5, iid=True, seed=0)


def test_emnist_root_without_data(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="--emnist-root"):
        build("emnist", n_devices=5, iid=True, seed=0, emnist_root=tmp_path)


def test_emnist_from_folder(tmp_path: Path, make_emnist) -> None:
    make_emnist(tmp_path / "EMNIST" / "raw", n_train=400, n_test=50)
    data = build("emnist", n_devices=4, iid=True, seed=0, emnist_root=tmp_path, min_samples=10)
    assert data.sample_counts.sum() == 400 and len(data.test) == 50
    assert (data.num_classes, data.in_features) == (47, 784)


def test_equal_sizes_give_every_device_the_same_count():

    data = build("synthetic", n_devices=5, iid=False, alpha=1.0, beta=1.0, seed=0, total_samples=1000, sizes="equal")
    counts = [len(d) + len(h) for d, h in zip(data.train, data.device_test)]
    assert counts == [200] * 5


def _same(a, b) -> bool:
    return a.x.dtype == b.x.dtype and np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)


@pytest.mark.parametrize("spec", [
    dict(dataset="mnist", n_devices=30, iid=True, seed=2),
    dict(dataset="mnist", n_devices=30, iid=False, seed=2),
    dict(dataset="mnist", n_devices=30, iid=True, seed=2, sizes="equal", holdout_fraction=0.1),
    dict(dataset="mnist", n_devices=30, iid=False, seed=2, total_samples=20000, holdout_fraction=0.2),
    dict(dataset="mnist", n_devices=30, iid=False, seed=2, sizes="pareto-per-label", holdout_fraction=0.1),
    dict(dataset="synthetic", n_devices=30, seed=2),
    dict(dataset="synthetic", n_devices=30, iid=True, seed=2, sizes="lognormal"),
], ids=["mnist-iid", "mnist-non-iid", "mnist-iid-holdout", "mnist-non-iid-holdout", "mnist-per-label-holdout",
        "synthetic", "synthetic-iid-lognormal"])
def test_the_coordinators_view_equals_the_whole_split(spec, mnist_cache_dir: Path) -> None:
    """Sizes, test set and every device's holdout, without reading the training images."""
    whole = build_federated(PartitionSpec(**spec), cache_dir=mnist_cache_dir)
    view = load_evaluation(PartitionSpec(**spec), cache_dir=mnist_cache_dir)
    assert view.sample_counts.dtype == np.int64 and np.array_equal(view.sample_counts, whole.sample_counts)
    assert np.array_equal(view.weights, whole.weights)
    assert _same(view.test, whole.test)
    if whole.device_test is None:
        assert view.device_test is None
    else:
        assert len(view.device_test) == len(whole.device_test) == 30
        assert all(_same(v, w) for v, w in zip(view.device_test, whole.device_test))
        assert _same(view.test_for([17, 3, 8]), whole.test_for([3, 8, 17]))


def test_the_coordinators_view_of_mnist_reads_only_the_test_set(mnist_cache_dir: Path) -> None:
    """The test set is 30 MiB as floats (+7.5 MiB passing through its finiteness check); the training
    images would add 180 MiB as floats, 45 MiB as bytes."""
    import tracemalloc

    spec = PartitionSpec(dataset="mnist", n_devices=100, iid=True, sizes="equal")
    load_evaluation(spec, cache_dir=mnist_cache_dir)  # imports and caches warmed before we measure
    tracemalloc.start()
    try:
        view = load_evaluation(spec, cache_dir=mnist_cache_dir)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(view.test) == 10000 and view.device_test is None
    assert peak < 48 * 2**20, f"the coordinator's view allocated {peak / 2**20:.1f} MiB at its peak"


# ---------------------------------------------------------------- plug-in datasets

BLOBS = """
    import numpy as np

    CALLS = []

    def load():
        CALLS.append(1)
        rng = np.random.default_rng(0)
        y = rng.integers(0, 4, 600)
        x = (y[:, None, None] + rng.normal(size=(600, 2, 3))).astype(np.float32)  # samples of shape [2, 3]
        return {"x_train": x[:500], "y_train": y[:500], "x_test": x[500:], "y_test": y[500:], "num_classes": 4}

    def no_test():
        data = load()
        data.update(x_test=None, y_test=None)
        return data
"""


def test_a_plug_in_dataset_is_split_by_the_partition_rules(plugin_module) -> None:
    """IID or one label per device, sizes, holdouts: the [partition] rules MNIST is split by, on the plug-in's data."""
    from workloads.datasets import dataset_shape
    from workloads.federated import load_shard

    name = plugin_module(BLOBS)
    spec = PartitionSpec(dataset=f"{name}:load", n_devices=6, iid=False, sizes="equal", seed=3)
    assert spec.dataset == f"{name}:load" and spec.describe().startswith(f"{name}:load non-IID, 6 devices")
    data = build_federated(spec)
    assert data.num_classes == 4 and data.in_features == 6 and dataset_shape(spec.dataset).input_shape == (2, 3)
    assert [len(np.unique(d.y)) for d in data.train] == [1] * 6  # non-IID: one label per device
    assert len(data.test) == 100 and data.device_test is None  # the plug-in's own test set
    assert all(_same(load_shard(spec, k), data.train[k]) for k in range(6))  # an agent's shard is the same
    iid = build_federated(PartitionSpec(dataset=f"{name}:load", n_devices=5, iid=True, sizes="equal"))
    assert [len(d) for d in iid.train] == [100] * 5 and min(len(np.unique(d.y)) for d in iid.train) == 4
    held = load_evaluation(PartitionSpec(dataset=f"{name}:no_test", n_devices=5, iid=True, holdout_fraction=0.2))
    assert len(held.test) == sum(len(h) for h in held.device_test) > 0  # the test set is the holdouts
    # Loaded once per plug-in and process (load, then no_test, which calls it), not once per split.
    assert len(__import__(name).CALLS) == 2


def test_a_plug_in_dataset_without_a_test_set_needs_a_holdout(plugin_module) -> None:
    from flexfl.errors import PluginError

    name = plugin_module(BLOBS)
    with pytest.raises(PluginError, match=rf"dataset plug-in '{name}:no_test' gives no test set \(x_test is None\): "
                                          r"set \[partition\] holdout_fraction"):
        load_evaluation(PartitionSpec(dataset=f"{name}:no_test", n_devices=5, iid=True))


def test_an_unknown_dataset_name_lists_the_built_in_ones_and_the_plug_in_forms() -> None:
    with pytest.raises(ConfigError, match=r"partition.dataset: expected one of mnist, emnist, synthetic, got 'cifar'; "
                                          r"or a plug-in: MODULE:ATTRIBUTE, or the name of an installed "
                                          r"flexfl.datasets entry point"):
        PartitionSpec(dataset="cifar")
