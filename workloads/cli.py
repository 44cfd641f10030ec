"""`flexfl data`: build the MNIST cache once, and inspect a federated split."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


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
    show.add_argument("--dataset", choices=("mnist", "emnist", "synthetic"), required=True)
    show.add_argument("--devices", type=int, required=True, metavar="N")
    show.add_argument("--non-iid", action="store_true", help="one label per device (SYNTHETIC: alpha/beta formula)")
    show.add_argument("--alpha", type=float, default=0.0, help="SYNTHETIC alpha (with --non-iid)")
    show.add_argument("--beta", type=float, default=0.0, help="SYNTHETIC beta (with --non-iid)")
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--emnist-root", type=Path, default=None, metavar="DIR",
                      help="folder holding EMNIST/raw/*-ubyte[.gz] (torchvision layout)")
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
    from workloads.federated import build_federated

    data = build_federated(args.dataset, n_devices=args.devices, iid=not args.non_iid, seed=args.seed,
                           alpha=args.alpha, beta=args.beta, emnist_root=args.emnist_root,
                           cache_dir=args.cache_dir)
    counts = data.sample_counts
    labels_per_device = np.array([len(np.unique(d.y)) for d in data.train])
    mode = "non-IID" if args.non_iid else "IID"
    if args.dataset == "synthetic" and args.non_iid:
        mode += f" alpha={args.alpha} beta={args.beta}"
    print(f"{args.dataset} {mode}, {len(counts)} devices, seed {args.seed}")
    print(f"samples/device: min {counts.min()}, median {np.median(counts):g}, max {counts.max()}, "
          f"total {counts.sum()}; largest device holds {counts.max() / counts.sum():.1%}")
    print(f"labels/device: min {labels_per_device.min()}, median {np.median(labels_per_device):g}, "
          f"max {labels_per_device.max()}")
    holdout = "" if data.device_test is None else " (per-device holdouts concatenated)"
    print(f"test set: {len(data.test)} samples{holdout}")
    return 0
