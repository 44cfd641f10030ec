"""The partition spec: defaults, identity, JSON on the wire, and one device's shard without the others."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flexfl.errors import ConfigError
from workloads.federated import build_federated, load_shard
from workloads.partition_spec import PartitionSpec


def test_synthetic_defaults_and_identity():
    spec = PartitionSpec(n_devices=5)
    assert (spec.synthetic_alpha, spec.synthetic_beta) == (1.0, 1.0)
    assert PartitionSpec(n_devices=5, iid=True).synthetic_alpha == 0.0
    # Left out or written out, the same split is the same spec.
    assert spec == PartitionSpec(n_devices=5, alpha=1.0, beta=1.0)
    assert hash(spec) == hash(PartitionSpec(n_devices=5, alpha=1.0, beta=1.0))
    assert spec != PartitionSpec(n_devices=5, alpha=0.5)
    # Where this machine keeps EMNIST is not part of the split.
    assert PartitionSpec(dataset="emnist", emnist_root="/a") == PartitionSpec(dataset="emnist", emnist_root="/b")
    assert "emnist_root" not in PartitionSpec(dataset="emnist", emnist_root="/a").to_json()


def test_json_round_trip_and_differences():
    spec = PartitionSpec(dataset="mnist", n_devices=20, sizes="equal", seed=3)
    assert PartitionSpec.from_json(spec.to_json(), where="test") == spec
    other = PartitionSpec(dataset="synthetic", n_devices=20, sizes="equal", seed=3)
    assert spec.differences(other) == ["alpha: None vs 1.0", "beta: None vs 1.0", "dataset: mnist vs synthetic",
                                       "holdout_fraction: 0.0 vs 0.1"]
    with pytest.raises(ConfigError, match="test: partition is not valid JSON"):
        PartitionSpec.from_json("{", where="test")
    with pytest.raises(ConfigError, match=r"\[partition\].n_devicez: unknown key; did you mean 'n_devices'"):
        PartitionSpec.from_json('{"n_devicez": 3}', where="test")


@pytest.mark.parametrize("kwargs, message", [
    ({"dataset": "mnist", "alpha": 1.0}, "SYNTHETIC only"),
    ({"iid": True, "beta": 0.5}, "non-IID SYNTHETIC only"),
    ({"n_devices": 0}, "n_devices must be >= 1"),
    ({"n_devices": 5, "total_samples": 3}, "at least n_devices"),
    ({"alpha": -1.0}, "standard deviation"),
    # SYNTHETIC's test set is its devices' holdouts: without them a run had no test set to evaluate on
    ({"holdout_fraction": 0.0}, "holdout_fraction = 0 leaves SYNTHETIC without a test set"),
])
def test_bad_specs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PartitionSpec(**kwargs)


@pytest.mark.parametrize("dataset, iid, sizes, holdout", [
    ("synthetic", True, "pareto", None), ("synthetic", False, "lognormal", None),
    ("mnist", True, "pareto-capped", None), ("mnist", False, "pareto", None),
    ("mnist", False, "pareto-per-label", 0.1), ("mnist", True, "equal", 0.2)])
def test_load_shard_equals_the_shard_of_the_whole_split(dataset, iid, sizes, holdout, mnist_cache_dir: Path):
    spec = PartitionSpec(dataset=dataset, n_devices=12, iid=iid, total_samples=6000, seed=1, sizes=sizes,
                         holdout_fraction=holdout)
    whole = build_federated(spec, cache_dir=mnist_cache_dir)
    for k in (0, 7, 11):
        shard = load_shard(spec, k, cache_dir=mnist_cache_dir)
        assert np.array_equal(shard.x, whole.train[k].x) and np.array_equal(shard.y, whole.train[k].y)
    with pytest.raises(ConfigError, match=r"shard_index 12 is outside the partition's 0..11"):
        load_shard(spec, 12, cache_dir=mnist_cache_dir)


def _shares(spec, cache):
    counts = build_federated(spec, cache_dir=cache).sample_counts
    return counts, counts.max() / counts.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_size_readings_on_mnist(seed, mnist_cache_dir: Path):
    base = dict(dataset="mnist", n_devices=100, seed=seed, holdout_fraction=0.0)
    pareto, top_pareto = _shares(PartitionSpec(iid=True, sizes="pareto", **base), mnist_cache_dir)
    capped, top_capped = _shares(PartitionSpec(iid=True, sizes="pareto-capped", **base), mnist_cache_dir)
    truncated, top_truncated = _shares(PartitionSpec(iid=True, sizes="pareto-truncated", **base), mnist_cache_dir)
    equal, _ = _shares(PartitionSpec(iid=True, sizes="equal", **base), mnist_cache_dir)
    for counts in (pareto, capped, truncated):
        assert counts.sum() == 60000 and counts.min() >= 20
    assert top_capped <= 0.1 + 1e-3 < top_pareto  # at most one class's share (6000 of 60000)
    assert top_truncated < top_pareto
    assert set(equal.tolist()) == {600}
    # One label per device with Pareto shares inside each label: nobody is shrunk, and a
    # device never holds more than its label has.
    data = build_federated(PartitionSpec(iid=False, sizes="pareto-per-label", **base), cache_dir=mnist_cache_dir)
    labels = [set(np.unique(d.y).tolist()) for d in data.train]
    assert all(len(device_labels) == 1 for device_labels in labels)
    assert data.sample_counts.sum() >= 59_900 and data.sample_counts.max() <= 6742  # the largest label (1s)


def test_lognormal_is_fedprox_style_and_holdouts_make_a_per_device_test_set(mnist_cache_dir: Path):
    data = build_federated(PartitionSpec(dataset="synthetic", n_devices=30, sizes="lognormal"))
    assert data.sample_counts.sum() + sum(len(d) for d in data.device_test) == 20000
    assert data.sample_counts.min() >= 0.9 * 50 - 1  # FedProx's floor of 50 samples per device
    mnist = build_federated(PartitionSpec(dataset="mnist", n_devices=10, iid=True, sizes="equal", holdout_fraction=0.1),
                            cache_dir=mnist_cache_dir)
    assert [len(d) for d in mnist.train] == [5400] * 10 and [len(d) for d in mnist.device_test] == [600] * 10
    assert len(mnist.test) == 6000 and len(mnist.test_for([0, 3])) == 1200


def test_pareto_per_label_needs_non_iid_images():
    with pytest.raises(ConfigError, match="pareto-per-label"):
        PartitionSpec(dataset="synthetic", sizes="pareto-per-label")
    with pytest.raises(ConfigError, match="pareto-per-label"):
        PartitionSpec(dataset="mnist", iid=True, sizes="pareto-per-label")


@pytest.mark.parametrize("iid", [True, False])
def test_an_agents_shard_is_read_without_the_other_devices_images(iid, mnist_cache_dir: Path):
    """The whole training set is 47 MB as bytes (188 MB as floats); one of 100 shards allocates ~1 MB."""
    import tracemalloc

    spec = PartitionSpec(dataset="mnist", n_devices=100, iid=iid, sizes="equal")
    load_shard(spec, 5, cache_dir=mnist_cache_dir)  # the cache exists before we measure
    tracemalloc.start()
    try:
        shard = load_shard(spec, 5, cache_dir=mnist_cache_dir, as_bytes=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shard.x.dtype == np.uint8 and len(shard) <= 600
    assert peak < 4 * 2**20, f"loading one shard allocated {peak / 2**20:.1f} MiB at its peak"
    whole = build_federated(spec, cache_dir=mnist_cache_dir).train[5]
    assert np.array_equal(shard.x.astype(np.float32) / 255, whole.x) and np.array_equal(shard.y, whole.y)


def test_byte_shards_train_and_evaluate_exactly_like_float_shards(mnist_cache_dir: Path):
    import torch

    from edge_agent.trainer import device_rng, train_local
    from workloads.evaluation import evaluate
    from workloads.federated import initial_model

    spec = PartitionSpec(dataset="mnist", n_devices=100, iid=True, sizes="equal")
    as_bytes, as_float = (load_shard(spec, 7, cache_dir=mnist_cache_dir, as_bytes=b) for b in (True, False))
    deltas = []
    for shard in (as_bytes, as_float):
        model, params = initial_model("mnist", seed=0)
        deltas.append(train_local(model, shard, updates=5, lr=0.1, batch_size=10, rng=device_rng(0, 1, 7)).delta)
        assert evaluate(model, params, shard) == evaluate(model, params, as_float)
    for name in deltas[0]:
        assert torch.equal(deltas[0][name], deltas[1][name])


def test_the_coordinator_never_imports_a_plug_in_a_device_names(plugin_module) -> None:
    """A device's partition naming another dataset is refused by name: its module is not imported on the coordinator."""
    import sys

    from flexfl.errors import PartitionMismatch

    name = plugin_module("import sys\nsys.modules[__name__].IMPORTED = True\ndef load():\n    return None\n")
    device = json.dumps({**PartitionSpec().identity(), "dataset": f"{name}:load"})
    with pytest.raises(PartitionMismatch, match=rf"device 'pi-1': its partition's dataset is '{name}:load', the "
                                                r"coordinator's 'synthetic'"):
        PartitionSpec.from_json(device, where="device 'pi-1'", ours=PartitionSpec())
    assert name not in sys.modules
    assert PartitionSpec.from_json(PartitionSpec(seed=4).to_json(), where="d", ours=PartitionSpec()).seed == 4
