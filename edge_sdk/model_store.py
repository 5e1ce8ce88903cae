"""Where a device keeps the inference model the coordinator published for it.

``<state_dir>/model.onnx`` holds the ONNX bytes, ``<state_dir>/model.json`` what they
are (label, round counted from 1 and the protocol's 0-based ``round_index``, sha256, input shape;
when signed, issue time and key id). Both are replaced atomically (write to a temporary file, then
rename), so `edgefl predict` never reads half a model. The bytes are checked against their SHA-256
before anything is written (who signed them is the client's check: edge_sdk/signing.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from edge_sdk.inference import MODEL_FILENAME
from edge_sdk.protocol.messages import Model

__all__ = ["MODEL_INFO_FILENAME", "MAX_MODEL_BYTES", "ModelRejected", "save_model", "read_model_info",
           "installed_sha256", "installed_issued_ms"]

MODEL_INFO_FILENAME = "model.json"
MAX_MODEL_BYTES = 64 * 2**20


class ModelRejected(ValueError):
    """A published model this device will not install."""


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_model(state_dir: str | Path, model: Model) -> Path:
    """Verify ``model`` and install it in ``state_dir``; returns the ONNX file's path."""
    data = bytes(model.data)
    if not 0 < len(data) <= MAX_MODEL_BYTES:
        raise ModelRejected(f"model of {len(data)} bytes; must be 1..{MAX_MODEL_BYTES}")
    if hashlib.sha256(data).digest() != bytes(model.sha256):
        raise ModelRejected("model bytes do not match their sha256")
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILENAME
    info = {"label": model.label, "round": model.round + 1, "round_index": model.round, "format": model.format,
            "sha256": bytes(model.sha256).hex(), "input_shape": list(model.input_shape), "bytes": len(data),
            "issued_ms": model.issued_ms, "key_id": model.key_id, "version": model.version}
    _atomic_write(path, data)
    _atomic_write(folder / MODEL_INFO_FILENAME, json.dumps(info, indent=1).encode())
    return path


def read_model_info(state_dir: str | Path) -> dict[str, Any] | None:
    """What ``model.json`` says of the installed model, or None when there is none."""
    path = Path(state_dir) / MODEL_INFO_FILENAME
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    return info if isinstance(info, dict) else None


def installed_sha256(state_dir: str | Path) -> str | None:
    """Hex SHA-256 of the installed model file, if ``model.json`` names one that is present and intact."""
    try:
        info = read_model_info(state_dir)
        data = (Path(state_dir) / MODEL_FILENAME).read_bytes()
    except (OSError, ValueError):
        return None
    if info is None or hashlib.sha256(data).hexdigest() != info.get("sha256"):
        return None
    return info["sha256"]


def installed_issued_ms(state_dir: str | Path) -> int:
    """When the installed model was signed (``issued_ms``; 0 when there is none, it was unsigned,
    or ``model.json`` cannot be read)."""
    try:
        info = read_model_info(state_dir)
    except (OSError, ValueError):
        return 0
    issued = info.get("issued_ms", 0) if info is not None else 0
    return issued if type(issued) is int and issued >= 0 else 0
