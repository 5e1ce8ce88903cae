"""On-device inference with a pre-composed ONNX model (onnxruntime; no torch needed).

The coordinator exports each finished model as dense ONNX; a device keeps the one
meant for it at ``<state_dir>/model.onnx`` (see `default_model_path`). Inputs are
a batch of samples in the model's input space (the same preprocessing as the
training data; `normalize` applies per-channel mean/std to raw values). Batches
come from ``.npy``/``.npz`` files (never unpickled) or text: JSON arrays, or one
sample per line of comma/space separated numbers.

A model published by edgefl 0.2 or later takes *raw* inputs: its graph starts with the job's
normalisation, and its metadata (``edgefl.preprocessing``: mean, std, class names, input shape)
says so (`OnnxClassifier.preprocessing`). An older model expects normalised inputs.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge_sdk.command_defaults import DEVICE_COMMANDS
from edge_sdk.data.preprocessing import ONNX_METADATA_KEY, Preprocessing

__all__ = ["MODEL_FILENAME", "OnnxClassifier", "Predictions", "default_model_path", "load_batch",
           "normalize"]

#: File name of the device's current model inside its state directory.
MODEL_FILENAME = "model.onnx"
_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"
_NPZ_KEYS = ("x", "x_test", "x_train", "inputs")


def default_model_path(state_dir: str | Path) -> Path:
    """Where a device's published model lives: ``<state_dir>/model.onnx``."""
    return Path(state_dir) / MODEL_FILENAME


@dataclass(frozen=True)
class Predictions:
    """Class index and softmax probabilities for every sample."""

    classes: np.ndarray  # (N,) int64
    probabilities: np.ndarray  # (N, num_classes) float32

    def to_json_lines(self, top: int = DEVICE_COMMANDS.predict_top, labels: Sequence[str] = ()) -> str:
        """One JSON object per sample: ``{"index", "class", "score", ["label"], ["top"]}``."""
        lines = []
        for i, (k, p) in enumerate(zip(self.classes, self.probabilities, strict=True)):
            row: dict[str, Any] = {"index": i, "class": int(k), "score": round(float(p[k]), 6)}
            if labels:
                row["label"] = labels[int(k)] if int(k) < len(labels) else str(int(k))
            if top > 1:
                best = np.argsort(-p)[:top]
                row["top"] = [[int(j), round(float(p[j]), 6)] for j in best]
            lines.append(json.dumps(row))
        return "\n".join(lines) + ("\n" if lines else "")


def _onnxruntime() -> Any:
    try:
        import onnxruntime  # lazily: only `edgefl predict` needs it
    except ImportError as exc:
        raise ImportError(
            "onnxruntime is not installed: pip install onnxruntime "
            "(Termux: pkg install python-onnxruntime; Jetson: NVIDIA's onnxruntime-gpu wheel)") from exc
    return onnxruntime


class OnnxClassifier:
    """An ONNX classifier run by onnxruntime on the CPU (one input, logits output)."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX model {self.path} does not exist (has the coordinator "
                                    "published a model for this device yet?)")
        ort = _onnxruntime()
        options = ort.SessionOptions()
        if threads is not None:
            if type(threads) is not int or threads < 1:
                raise ValueError(f"threads must be a positive int, got {threads!r}")
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ValueError(f"{self.path} is not a usable ONNX model: {exc}") from None
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ValueError(f"{self.path}: expected one model input, found {len(inputs)}")
        self.input_name: str = inputs[0].name
        dims = inputs[0].shape[1:]
        self.sample_shape: tuple[int, ...] | None = (
            tuple(int(d) for d in dims) if all(isinstance(d, int) and d > 0 for d in dims) else None)
        #: the normalisation the graph applies to raw inputs and the class names, from the model's
        #: metadata (edgefl publishes them since 0.2); None: a model that expects normalised inputs
        self.preprocessing: Preprocessing | None = None
        meta = self.session.get_modelmeta().custom_metadata_map.get(ONNX_METADATA_KEY)
        if meta is not None:
            try:
                self.preprocessing = Preprocessing.from_json(meta)
            except ValueError as exc:
                raise ValueError(f"{self.path}: unreadable preprocessing metadata: {exc}") from None

    def logits(self, x: np.ndarray, batch_size: int = DEVICE_COMMANDS.predict_batch_size) -> np.ndarray:
        """Raw model outputs for a batch ``x`` of shape ``(N, *sample_shape)``."""
        x = self._check(x)
        if type(batch_size) is not int or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        outs = [self.session.run(None, {self.input_name: x[i:i + batch_size]})[0]
                for i in range(0, len(x), batch_size)]
        out = np.concatenate(outs) if outs else np.zeros((0, 0), np.float32)
        if out.ndim != 2:
            raise ValueError(f"model output has shape {out.shape}; expected (N, classes) logits")
        return out

    def predict(self, x: np.ndarray, batch_size: int = DEVICE_COMMANDS.predict_batch_size) -> Predictions:
        """Most likely class and softmax probabilities per sample."""
        z = self.logits(x, batch_size).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        return Predictions(p.argmax(axis=1).astype(np.int64), p.astype(np.float32))

    def as_samples(self, x: np.ndarray) -> np.ndarray:
        """``x`` reshaped to ``(N, *sample_shape)`` (e.g. flat rows of pixels); ValueError if impossible."""
        if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu" or x.ndim < 1:
            raise ValueError("inputs must be a numeric numpy array")
        if self.preprocessing is not None and self.preprocessing.any_length:  # (N, C, any length)
            channels, length = self.preprocessing.input_shape
            series = x[:, None, :] if x.ndim == 2 and channels == 1 else x
            if series.ndim != 3 or series.shape[1] != channels or series.shape[2] < 1:
                raise ValueError(f"inputs have sample shape {x.shape[1:]}; the model takes series of {channels} "
                                 f"channel(s) of any length (brought to {length})")
            return series
        if self.sample_shape is None or x.shape[1:] == self.sample_shape:
            return x
        if math.prod(x.shape[1:]) == math.prod(self.sample_shape):
            return x.reshape((len(x), *self.sample_shape))
        raise ValueError(f"inputs have sample shape {x.shape[1:]}; the model expects {self.sample_shape}")

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(self.as_samples(x), dtype=np.float32)
        if not np.isfinite(x).all():
            raise ValueError("inputs contain NaN or inf")
        return x


def normalize(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``(x - mean) / std`` per channel (axis 1), as the training data was normalised
    (`Preprocessing.apply`)."""
    return Preprocessing(tuple(mean), tuple(std)).apply(x)


def _from_text(text: str) -> np.ndarray:
    text = text.strip()
    if not text:
        raise ValueError("empty input batch")
    if text[0] == "[":
        try:
            return np.asarray(json.loads(text), dtype=np.float32)
        except (json.JSONDecodeError, ValueError, TypeError) as exc:
            raise ValueError(f"input is not a numeric JSON array: {exc}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                rows.append([float(v) for v in line.replace(",", " ").split()])
            except ValueError:
                raise ValueError(f"line {n} of the input is not a list of numbers") from None
    if len({len(r) for r in rows}) != 1:
        raise ValueError("every input line must hold the same number of values")
    return np.asarray(rows, dtype=np.float32)


def load_batch(source: str | Path | bytes, key: str | None = None) -> np.ndarray:
    """A batch from ``.npy``/``.npz`` bytes or files, or text (JSON array / one sample per line).

    ``source`` is a path or the raw bytes (e.g. stdin). ``key`` picks the array of an
    ``.npz`` (default: the first of ``x``, ``x_test``, ``x_train``, ``inputs``).
    """
    data = Path(source).read_bytes() if isinstance(source, (str, Path)) else bytes(source)
    try:
        if data.startswith(_NPY_MAGIC):
            batch = np.load(io.BytesIO(data), allow_pickle=False)
        elif data.startswith(_ZIP_MAGIC):
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                name = key or next((k for k in _NPZ_KEYS if k in npz.files), None)
                if name is None or name not in npz.files:
                    raise ValueError(f"npz has arrays {npz.files}; choose one with --key")
                batch = npz[name]
        else:
            batch = _from_text(data.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the input batch: {exc}") from None
    if batch.dtype.kind not in "fiu" or batch.ndim < 1 or len(batch) == 0:
        raise ValueError(f"input batch must be a non-empty numeric array, got {batch.dtype} {batch.shape}")
    return batch if batch.ndim > 1 else batch[None, :]
