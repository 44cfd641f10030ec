"""`flexfl data prepare` and `flexfl data show`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from workloads.cli import register


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flexfl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_prepare_prints_one_line_summary(mnist_cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["data", "prepare", "--cache-dir", str(mnist_cache_dir)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "60000 train, 10000 test" in out[0] and str(mnist_cache_dir / "mnist") in out[0]


def test_show_synthetic_non_iid(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["data", "show", "--dataset", "synthetic", "--devices", "10", "--non-iid",
                "--alpha", "1", "--beta", "1", "--data-seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "synthetic(1,1) non-IID, 10 devices, pareto sizes, seed 2" in out
    assert "samples/device: min" in out and "largest device holds" in out
    assert "labels/device:" in out
    assert "(per-device holdouts concatenated)" in out


def test_show_mnist_non_iid_one_label_each(mnist_cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["data", "show", "--dataset", "mnist", "--devices", "20", "--non-iid",
                "--cache-dir", str(mnist_cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "labels/device: min 1, median 1, max 1" in out
    assert "test set: 10000 samples" in out


def test_show_rejects_unknown_dataset() -> None:
    with pytest.raises(SystemExit):
        run(["data", "show", "--dataset", "cifar", "--devices", "3"])
