"""`flexfl data`: build the MNIST cache once, and inspect a federated split."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workloads.partition_spec import PartitionSpec

log = logging.getLogger(__name__)


def add_partition_flags(p: argparse.ArgumentParser, *, table: tuple[str, ...] = ("partition",),
                        defaults: PartitionSpec | None = None) -> None:
    """The flags that override a config's [partition] table (workloads.partition_spec.PartitionSpec).

    `defaults`: the command's partition when neither its config nor a flag sets one, stated in the help."""
    from flexfl.config import enum_choices, flag_dest
    from workloads.partition_spec import Dataset, Sizes

    def default(key: str) -> str:
        return "" if defaults is None else f" (default {getattr(defaults, key)})"

    def dest(key: str) -> str:
        return flag_dest(*table, key)

    g = p.add_argument_group("data partition ([partition] table)")
    g.add_argument("--dataset", dest=dest("dataset"), choices=enum_choices(Dataset),
                   help=f"the dataset to split over the devices{default('dataset')}")
    iid = g.add_mutually_exclusive_group()
    iid.add_argument("--iid", dest=dest("iid"), action="store_true", default=None, help="IID data")
    iid.add_argument("--non-iid", dest=dest("iid"), action="store_false",
                     help="non-IID: one label per device (MNIST/EMNIST), the alpha/beta formula (SYNTHETIC)")
    g.add_argument("--alpha", dest=dest("alpha"), type=float, help="SYNTHETIC alpha (non-IID default 1)")
    g.add_argument("--beta", dest=dest("beta"), type=float, help="SYNTHETIC beta (non-IID default 1)")
    g.add_argument("--devices", dest=dest("n_devices"), type=int, metavar="N",
                   help=f"number of devices (shards){default('n_devices')}")
    g.add_argument("--total-samples", dest=dest("total_samples"), type=int, help="samples spread over devices")
    g.add_argument("--sizes", dest=dest("sizes"), choices=enum_choices(Sizes),
                   help="samples per device: a reading of the paper's Type-I Pareto(0.5), or equal "
                        "(workloads.partition_spec.Sizes says what each is)")
    g.add_argument("--data-seed", dest=dest("seed"), type=int, help="seed of the split")
    g.add_argument("--emnist-root", dest=dest("emnist_root"), metavar="DIR",
                   help="folder holding EMNIST in torchvision layout (default ~/.cache/flexfl/emnist)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `flexfl data {prepare,show}` to the top-level subcommands."""
    data = sub.add_parser("data", help="prepare and inspect datasets",
                          description="Prepare the MNIST cache and inspect how a dataset splits over devices.")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    prepare = data_sub.add_parser("prepare", help="parse MNIST once into the cache")
    prepare.add_argument("--cache-dir", type=Path, default=None,
                         help="cache folder (default: $FLEXFL_CACHE or ~/.cache/flexfl)")
    prepare.set_defaults(func=_prepare)

    show = data_sub.add_parser("show", help="per-device sample-count and label statistics")
    add_partition_flags(show)
    show.add_argument("--cache-dir", type=Path, default=None, help="MNIST cache folder")
    show.set_defaults(func=_show)


def _prepare(args: argparse.Namespace) -> int:
    from workloads.datasets import load_mnist, mnist_cache_path

    start = time.perf_counter()
    train, test = load_mnist(args.cache_dir)
    print(f"MNIST: {len(train)} train, {len(test)} test -> {mnist_cache_path(args.cache_dir)} "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


def _show(args: argparse.Namespace) -> int:
    from flexfl.config import from_dict, overrides_from_args
    from workloads.federated import build_federated
    from workloads.partition_spec import PartitionSpec

    spec = from_dict(PartitionSpec, overrides_from_args(args).get("partition", {}), where="flags", table="partition")
    data = build_federated(spec, cache_dir=args.cache_dir)
    counts = data.sample_counts
    labels_per_device = np.array([len(np.unique(d.y)) for d in data.train])
    print(spec.describe())
    print(f"samples/device: min {counts.min()}, median {np.median(counts):g}, max {counts.max()}, "
          f"total {counts.sum()}; largest device holds {counts.max() / counts.sum():.1%}")
    print(f"labels/device: min {labels_per_device.min()}, median {np.median(labels_per_device):g}, "
          f"max {labels_per_device.max()}")
    holdout = "" if data.device_test is None else " (per-device holdouts concatenated)"
    print(f"test set: {len(data.test)} samples{holdout}")
    return 0
