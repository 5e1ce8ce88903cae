"""A NumPy .npz file: x_train/y_train, optionally x_test/y_test (the source's own held-out set)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from stat import S_ISREG

import numpy as np

from edge_sdk.data.datasets import _read_npz
from edge_sdk.data.local_data import LocalData
from edge_sdk.data.preprocessing import MAX_CHANNELS, MAX_CLASS_NAME, Preprocessing
from edge_sdk.sources.assemble import assemble
from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.keys import hash_samples
from edge_sdk.sources.labels import map_labels
from edge_sdk.sources.options import ReadOptions

__all__ = ["NpzSource", "npz_has_test"]

_CHUNK = 4096


def npz_has_test(path: str | Path) -> bool:
    """Whether the file is an .npz holding both x_test and y_test (False when it cannot be read)."""
    try:
        with zipfile.ZipFile(Path(path).expanduser()) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return {"x_test.npy", "y_test.npy"} <= names


def _samples(x: np.ndarray, key: str, shape: tuple[int, ...] | None, where: str) -> np.ndarray:
    """``x`` as N x sample shape: ``shape`` when given (the same number of values), else N x F,
    N x 1 x H x W for N x H x W, N x C x H x W (a 4-D array whose second axis is not 1, 3 or 4 and
    whose last is: channels-last, transposed)."""
    if x.dtype.kind not in "uif":
        raise ValueError(f"{where}: array {key!r} must be numeric, got {x.dtype}")
    if x.ndim < 1:
        raise ValueError(f"{where}: array {key!r} must hold one sample per row, got shape {x.shape}")
    if shape is not None:
        if int(np.prod(x.shape[1:])) != int(np.prod(shape)):
            raise ValueError(f"{where}: {key} holds samples of shape {list(x.shape[1:])}, which [data] input_shape "
                             f"{list(shape)} does not hold")
        return x.reshape((len(x), *shape))
    if x.ndim == 1:
        return x.reshape(len(x), 1)
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[1] not in (1, 3, 4) and x.shape[3] in (1, 3, 4):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if x.ndim > 4:
        raise ValueError(f"{where}: array {key!r} has shape {x.shape}; give [data] input_shape")
    return x


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (axis 1) mean and std, float64, chunked."""
    axes = (0, *range(2, x.ndim))
    total = np.zeros(x.shape[1])
    for i in range(0, len(x), _CHUNK):
        total += x[i:i + _CHUNK].sum(axis=axes, dtype=np.float64)
    per_channel = x.size // x.shape[1]
    mean = total / per_channel
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    sq = np.zeros(x.shape[1])
    for i in range(0, len(x), _CHUNK):
        sq += np.square(x[i:i + _CHUNK] - mean.reshape(shape)).sum(axis=axes)
    std = np.sqrt(sq / per_channel)
    return mean, np.where(std > 1e-8, std, 1.0)


class NpzSource:
    """``npz = "/path/file.npz"`` (or ``dataset = "npz:/path"``): never unpickled. A sample's key is
    the hash of its raw values (as float32); the last row is the newest. The data come normalised
    per channel with the statistics of the samples returned (its own `preprocessing`), the test set
    with the same. An unchanged file is not read again."""

    def __init__(self, path: str | Path, options: ReadOptions | None = None) -> None:
        self.path = Path(path).expanduser()
        self.options = options or ReadOptions()
        self.description = f"npz {self.path}"
        self._cache: tuple[tuple[int, int, int], SourceRead] | None = None

    def read(self) -> SourceRead:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            raise NoData(f"npz dataset file {self.path} not found") from None
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror or exc}") from None
        if not S_ISREG(stat.st_mode):
            raise ValueError(f"[data] npz {self.path} is not a file")
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._cache is None or self._cache[0] != signature:
            self._cache = (signature, self._parse())
        read = self._cache[1]
        return SourceRead(read.data, read.test, Skipped(read.skipped).report(str(self.path)))

    def _parse(self) -> SourceRead:
        where = str(self.path)
        try:
            arrays = _read_npz(self.path)
        except OSError as exc:  # e.g. no permission to read it
            raise ValueError(f"{where}: {exc.strerror or exc}") from None
        for key in ("x_train", "y_train"):
            if key not in arrays:
                raise ValueError(f"{where}: missing array {key!r}")
        if ("x_test" in arrays) != ("y_test" in arrays):
            raise ValueError(f"{where}: x_test and y_test come together (one is missing)")
        names = tuple(str(c) for c in arrays["classes"].reshape(-1)) if "classes" in arrays else ()
        options = self.options
        if not options.classes and names:
            options = ReadOptions(options.input_shape, names if _valid(names) else (), options.num_classes,
                                  options.max_samples)
        skipped = Skipped()
        train = self._split(arrays, "train", options, skipped)
        test = self._test(arrays, options, skipped) if "x_test" in arrays else None
        num_classes = max(train.num_classes, test.num_classes if test is not None else 0, len(names))
        mean, std = _channel_stats(train.x)
        if len(mean) > MAX_CHANNELS:
            raise ValueError(f"{where}: samples of shape {list(train.x.shape[1:])} have {len(mean)} channels (axis 1); "
                             f"at most {MAX_CHANNELS}: give [data] input_shape = [C, L]")
        shape = tuple(int(n) for n in train.x.shape[1:])
        own = Preprocessing(tuple(map(float, mean)), tuple(map(float, std)), options.classes,
                            shape if len(shape) <= 3 and max(shape) <= 65536 else ())
        train, test = (None if d is None else LocalData(_normalise(d.x, mean, std), d.y, num_classes, own, d.keys)
                       for d in (train, test))
        return SourceRead(train, test, dict(skipped))

    def _test(self, arrays: dict[str, np.ndarray], options: ReadOptions, skipped: Skipped) -> LocalData | None:
        """The file's own held-out set (all of it: no max_samples); its skipped rows are counted as
        "<reason> (test)"; None when it has no valid row."""
        counts = Skipped()
        try:
            test = self._split(arrays, "test", ReadOptions(options.input_shape, options.classes, options.num_classes),
                               counts)
        except NoData:
            test = None
        for reason, n in counts.items():
            skipped[f"{reason} (test)"] += n
        return test

    def _split(self, arrays: dict[str, np.ndarray], split: str, options: ReadOptions,
               skipped: Skipped) -> LocalData:
        where = str(self.path)
        x = _samples(arrays[f"x_{split}"], f"x_{split}", options.input_shape, where)
        y = arrays[f"y_{split}"]
        if y.shape != (len(x),) or y.dtype.kind not in "iuU":
            raise ValueError(f"{where}: y_{split} must be integer labels or class names, one per sample "
                             f"(got {y.dtype} {y.shape} for {len(x)} samples)")
        if not len(x):
            raise NoData(f"{where}: x_{split} is empty")
        raw = x.astype(np.float32)
        labels = map_labels(y, options, f"{where} y_{split}")
        return assemble(raw, labels, hash_samples(raw), options, skipped, f"{where} x_{split}",
                        preprocessing=Preprocessing((0.0,), (1.0,)))


def _valid(names: tuple[str, ...]) -> bool:
    return len(set(names)) == len(names) and all(0 < len(n) <= MAX_CLASS_NAME for n in names)


def _normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    m, s = mean.reshape(shape), std.reshape(shape)
    out = np.empty(x.shape, dtype=np.float32)
    for i in range(0, len(x), _CHUNK):
        out[i:i + _CHUNK] = (x[i:i + _CHUNK] - m) / s
    return out
