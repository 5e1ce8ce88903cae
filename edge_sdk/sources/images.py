"""A folder of class sub-folders of image files (folder name = class name); needs Pillow."""

from __future__ import annotations

import importlib
import io
import stat
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.sources.assemble import WRONG_SHAPE, assemble
from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.keys import hash_bytes
from edge_sdk.sources.labels import NOT_A_CLASS, map_labels
from edge_sdk.sources.options import ReadOptions

__all__ = ["MAX_IMAGE_BYTES", "ImageFolderSource", "pillow"]

#: A larger image file is skipped ("too large") without being opened.
MAX_IMAGE_BYTES = 32 << 20
#: Pillow's mode for each channel count of `[data] input_shape`.
MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
NOT_AN_IMAGE = "not an image"
TOO_LARGE = "too large"
NO_CLASS_FOLDER = "not in a class folder"


def pillow() -> Any:
    """PIL.Image, or a one-line ValueError saying how to install it."""
    try:
        return importlib.import_module("PIL.Image")
    except ImportError:
        raise ValueError("[data] images needs Pillow: pip install 'edgefl[images]'") from None


class ImageFolderSource:
    """``images = "/path/folder"``: ``folder/<class>/<file>``, every file an image of exactly
    ``input_shape`` (C, H, W) (another size is skipped as "wrong shape": nothing is resized);
    converted to grey (C=1), grey+alpha, RGB or RGBA; raw 0-255 values. A file's key is the hash of
    its bytes; the newest file (modification time) comes first. A file is decoded once while its
    size and time stay the same."""

    def __init__(self, folder: str | Path, options: ReadOptions) -> None:
        shape = options.input_shape
        if shape is None or len(shape) != 3 or shape[0] not in MODES:
            raise ValueError("[data] images needs input_shape = [C, H, W] with C = 1 (grey), 2, 3 (RGB) or 4, "
                             f"got {list(shape) if shape else None}")
        pillow()
        self.folder = Path(folder).expanduser()
        self.options = options
        self.shape: tuple[int, int, int] = (shape[0], shape[1], shape[2])
        self.description = f"images {self.folder} ({'x'.join(map(str, shape))})"
        #: path -> ((mtime_ns, size), key, pixels or the reason it was skipped)
        self._decoded: dict[Path, tuple[tuple[int, int], int, np.ndarray | str]] = {}

    def read(self) -> SourceRead:
        where = str(self.folder)
        if not self.folder.exists():
            raise NoData(f"{where} does not exist")
        if not self.folder.is_dir():
            raise ValueError(f"[data] images {where} is not a folder")
        image = pillow()
        skipped = Skipped()
        files = self._files(skipped)  # (mtime_ns, path, size, label), newest first
        pixels: list[np.ndarray] = []
        labels: list[int] = []
        keys: list[int] = []
        seen = set()
        for mtime, path, size, label in files:
            if self.options.max_samples is not None and len(pixels) >= self.options.max_samples:
                break
            seen.add(path)
            if label < 0:
                skipped[NOT_A_CLASS] += 1
                continue
            if size > MAX_IMAGE_BYTES:
                skipped[TOO_LARGE] += 1
                continue
            cached = self._decoded.get(path)
            if cached is None or cached[0] != (mtime, size):
                cached = self._decoded[path] = ((mtime, size), *self._decode(image, path))
            if isinstance(cached[2], str):
                skipped[cached[2]] += 1
                continue
            pixels.append(cached[2])
            labels.append(label)
            keys.append(cached[1])
        for gone in set(self._decoded) - {f[1] for f in files}:
            del self._decoded[gone]
        if not pixels:
            why = f" (skipped {skipped.summary()})" if skipped else ""
            raise NoData(f"{where}: no images{why}")
        x = np.stack(pixels)[::-1]  # oldest first: assemble puts the last first
        data = assemble(x, np.array(labels[::-1], np.int64), np.array(keys[::-1], np.uint64), self.options,
                        skipped, where, unit="images")
        return SourceRead(data, None, skipped.report(where, "files"))

    def _files(self, skipped: Skipped) -> list[tuple[int, Path, int, int]]:
        """Every non-hidden file of every class folder, newest first, with its class (-1: none)."""
        try:
            entries = sorted(p for p in self.folder.iterdir() if not p.name.startswith("."))
        except OSError as exc:
            raise ValueError(f"{self.folder}: {exc.strerror or exc}") from None
        folders = [p for p in entries if p.is_dir()]
        skipped[NO_CLASS_FOLDER] += sum(1 for p in entries if p.is_file())
        classes = map_labels([p.name for p in folders], self.options, f"{self.folder} (its sub-folders' names)")
        files = []
        for folder, label in zip(folders, classes.tolist(), strict=True):
            try:
                for path in folder.iterdir():
                    if path.name.startswith("."):
                        continue
                    info = path.stat()
                    if stat.S_ISREG(info.st_mode):
                        files.append((info.st_mtime_ns, path, info.st_size, label))
            except OSError as exc:
                raise ValueError(f"{folder}: {exc.strerror or exc}") from None
        files.sort(key=lambda f: (f[0], str(f[1])), reverse=True)
        return files

    def _decode(self, image: Any, path: Path) -> tuple[int, np.ndarray | str]:
        """(key, C x H x W float32 pixels) or (0, why it is skipped)."""
        try:
            blob = path.read_bytes()
        except OSError:
            return 0, NOT_AN_IMAGE
        key = int(hash_bytes([blob], 1)[0])
        channels, height, width = self.shape
        try:
            with image.open(io.BytesIO(blob)) as img:
                if img.size != (width, height):
                    return key, WRONG_SHAPE
                array = np.asarray(img.convert(MODES[channels]), dtype=np.float32)
        except Exception:  # Pillow raises many kinds for a file that is not a (whole) image
            return key, NOT_AN_IMAGE
        array = array.reshape(height, width, channels).transpose(2, 0, 1)
        return key, np.ascontiguousarray(array)
