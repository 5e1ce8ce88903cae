"""The device owner's own loader: ``python = "module:function"`` returning arrays."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.sources.assemble import assemble
from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.keys import hash_samples
from edge_sdk.sources.labels import map_labels
from edge_sdk.sources.options import ReadOptions

__all__ = ["PythonSource", "check_loader"]

_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def check_loader(spec: object) -> str:
    """``spec`` if it reads ``module:function``, else a one-line ValueError."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise ValueError(f'[data] python must be "module:function" (e.g. "my_sensors:load"), got {str(spec)[:60]!r}')
    return spec


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class PythonSource:
    """Calls ``function()`` of ``module`` (imported with ``python_path`` first on sys.path) at every
    read; it returns ``(x, y)`` or ``(x, y, keys)``: x numeric N x ..., y integer labels or class
    names, keys N integers (default: the hash of each sample's values). The last sample is the
    newest. It may raise NoData (or FileNotFoundError) when it has nothing yet."""

    def __init__(self, spec: str, python_path: str | Path | None = None, options: ReadOptions | None = None) -> None:
        self.spec = check_loader(spec)
        self.python_path = None if python_path is None else Path(python_path).expanduser()
        self.options = options or ReadOptions()
        self.description = f"python {spec}" + (f" (from {self.python_path})" if self.python_path else "")
        self._function: Callable[[], Any] | None = None

    def _load(self) -> Callable[[], Any]:
        if self._function is not None:
            return self._function
        module_name, _, name = self.spec.partition(":")
        added = self.python_path is not None and str(self.python_path) not in sys.path
        if added:
            sys.path.insert(0, str(self.python_path))
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, SyntaxError, whatever its top level raises
            raise ValueError(f"[data] python {self.spec}: cannot import {module_name}: {_one_line(exc)}") from None
        finally:
            if added:
                sys.path.remove(str(self.python_path))
        function = getattr(module, name, None)
        if not callable(function):
            raise ValueError(f"[data] python {self.spec}: {module_name} has no function {name}")
        self._function = function
        return function

    def read(self) -> SourceRead:
        function = self._load()
        try:
            result = function()
        except NoData:
            raise
        except FileNotFoundError as exc:
            raise NoData(f"[data] python {self.spec}: {_one_line(exc)}") from None
        except Exception as exc:
            raise ValueError(f"[data] python {self.spec} raised {_one_line(exc)}") from None
        x, y, keys = self._arrays(result)
        if not len(y):
            raise NoData(f"[data] python {self.spec} returned no samples")
        skipped = Skipped()
        data = assemble(x, map_labels(y, self.options, f"[data] python {self.spec}"), keys, self.options, skipped,
                        f"[data] python {self.spec}")
        return SourceRead(data, None, skipped.report(f"[data] python {self.spec}"))

    def _arrays(self, result: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        where = f"[data] python {self.spec}"
        if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
            raise ValueError(f"{where} returned {type(result).__name__}; expected a tuple (x, y) or (x, y, keys) "
                             "of arrays")
        try:
            x, y = np.asarray(result[0]), np.asarray(result[1])
            keys = np.asarray(result[2]) if len(result) == 3 else None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where} returned something that is not arrays: {_one_line(exc)}") from None
        if x.dtype.kind not in "iuf" or x.ndim < 1:
            raise ValueError(f"{where} returned x of dtype {x.dtype} and shape {x.shape}; expected numbers, "
                             "one sample per row")
        if y.ndim != 1 or len(y) != len(x) or y.dtype.kind not in "iuUO":
            raise ValueError(f"{where} returned y of dtype {y.dtype} and shape {y.shape}; expected {len(x)} "
                             "integer labels or class names")
        x = x.reshape(len(x), 1) if x.ndim == 1 else x
        shape = self.options.input_shape
        if shape is not None:
            if int(np.prod(shape)) != int(np.prod(x.shape[1:])):
                raise ValueError(f"{where} returned samples of shape {list(x.shape[1:])}, which [data] input_shape "
                                 f"{list(shape)} does not hold")
            x = x.reshape((len(x), *shape))
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
        if keys is None:
            return x, y, hash_samples(x)
        if keys.dtype.kind not in "iu" or keys.shape != (len(x),):
            raise ValueError(f"{where} returned keys of dtype {keys.dtype} and shape {keys.shape}; expected "
                             f"{len(x)} integers")
        return x, y, keys.astype(np.int64).view(np.uint64) if keys.dtype.kind == "i" else keys.astype(np.uint64)
