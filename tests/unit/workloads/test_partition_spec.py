"""The partition spec: defaults, identity, JSON on the wire, and one device's shard without the others."""

from __future__ import annotations

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
    assert spec.differences(other) == ["alpha: None vs 1.0", "beta: None vs 1.0", "dataset: mnist vs synthetic"]
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
])
def test_bad_specs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PartitionSpec(**kwargs)


@pytest.mark.parametrize("dataset", ["synthetic", "mnist"])
@pytest.mark.parametrize("iid", [True, False])
def test_load_shard_equals_the_shard_of_the_whole_split(dataset, iid, mnist_cache_dir: Path):
    spec = PartitionSpec(dataset=dataset, n_devices=12, iid=iid, total_samples=6000, seed=1)
    whole = build_federated(spec, cache_dir=mnist_cache_dir)
    for k in (0, 7, 11):
        shard = load_shard(spec, k, cache_dir=mnist_cache_dir)
        assert np.array_equal(shard.x, whole.train[k].x) and np.array_equal(shard.y, whole.train[k].y)
    with pytest.raises(ConfigError, match="shard_index 12 is outside the partition's 0..11"):
        load_shard(spec, 12, cache_dir=mnist_cache_dir)
