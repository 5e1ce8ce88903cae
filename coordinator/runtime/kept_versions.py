"""Kept model versions and rollback (``[federation] keep_versions``; docs/continuous.md).

Every published version is kept beside the checkpoint, in ``versions/<version>/``: the method's
training state (the checkpoint's pickle-free format), each label's ONNX model as the devices got it,
and ``version.json`` (round, time, what it scored). The oldest beyond ``keep_versions`` are removed,
never the one the devices serve.

``edgefl coordinator --config FILE --versions`` lists them; ``--rollback N`` asks for version N to be
served again: it writes ``rollback.json`` beside the checkpoint, and the coordinator — at its next
start, or between rounds while it runs — loads version N's state (training continues from it),
publishes it to the devices and removes the request after its next checkpoint. Version numbers do
not go back: the next round's model is the next number.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.runtime.safe_files import write_atomically
from coordinator.runtime.state import load_checkpoint, save_checkpoint

__all__ = ["KeptVersion", "ROLLBACK_FILE", "VERSIONS_DIR", "keep_version", "kept_versions", "request_rollback",
           "pending_rollback", "version_tensors", "clear_rollback"]

log = logging.getLogger(__name__)

VERSIONS_DIR = "versions"
ROLLBACK_FILE = "rollback.json"
_META = "version.json"


@dataclass(frozen=True)
class KeptVersion:
    """One kept model version."""

    version: int
    round: int  # 1-based: the round whose aggregation made it
    published_at: float  # unix time
    figures: dict[str, float]  # accuracy per label when it was published (empty: not evaluated)
    labels: tuple[str, ...]  # the labels whose ONNX model is kept
    path: Path


def _dir(checkpoint_dir: Path, version: int) -> Path:
    return checkpoint_dir / VERSIONS_DIR / f"{version:08d}"


def keep_version(checkpoint_dir: Path, version: int, rnd: int, method: str, tensors: dict[str, np.ndarray],
                 figures: dict[str, float], onnx: dict[str, bytes], keep: int) -> Path:
    """Keep ``version`` (made in 0-based round ``rnd``): its state, its ONNX models per label and
    ``figures``; then remove the oldest beyond ``keep`` (never this one). Returns its folder."""
    path = _dir(checkpoint_dir, version)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_checkpoint(tmp, method, rnd, [], tensors)
        for label, data in onnx.items():
            (tmp / f"{_safe(label)}.onnx").write_bytes(data)
        meta = {"version": version, "round": rnd + 1, "published_at": time.time(),
                "figures": {k: float(v) for k, v in figures.items()}, "labels": sorted(onnx)}
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in kept_versions(checkpoint_dir)[:-keep] if keep > 0 else []:
        if old.version != version:
            shutil.rmtree(old.path, ignore_errors=True)
    return path


def _safe(label: str) -> str:
    """A label as a file name (labels are short method tier names: ``p0.5``, ``rank8``)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in label) or "model"


def kept_versions(checkpoint_dir: Path) -> list[KeptVersion]:
    """The kept versions, oldest first (a folder without a readable version.json is skipped)."""
    root = checkpoint_dir / VERSIONS_DIR
    found = []
    for path in sorted(root.glob("[0-9]" * 8)) if root.is_dir() else []:
        try:
            meta = json.loads((path / _META).read_text())
            found.append(KeptVersion(int(meta["version"]), int(meta["round"]), float(meta["published_at"]),
                                     {str(k): float(v) for k, v in meta["figures"].items()},
                                     tuple(str(x) for x in meta["labels"]), path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: not a kept version (no readable %s); skipped", path, _META)
    return found


def request_rollback(checkpoint_dir: Path, version: int) -> KeptVersion:
    """Ask the coordinator to serve ``version`` again (ValueError naming the kept ones if it is not kept)."""
    kept = {v.version: v for v in kept_versions(checkpoint_dir)}
    if version not in kept:
        have = ", ".join(str(v) for v in sorted(kept)) or "none"
        raise ValueError(f"version {version} is not kept in {checkpoint_dir / VERSIONS_DIR} (kept: {have})")
    write_atomically(checkpoint_dir / ROLLBACK_FILE, json.dumps({"to": version, "asked_at": time.time()}))
    return kept[version]


def pending_rollback(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The rollback asked for (``{"to": N, "asked_at": T}``), None if none; a request that cannot be
    read or names no kept version is logged and removed."""
    path = checkpoint_dir / ROLLBACK_FILE
    if not path.exists():
        return None
    try:
        request = json.loads(path.read_text())
        version = request["to"]
        if type(version) is not int or not (_dir(checkpoint_dir, version) / _META).exists():
            raise ValueError(f"version {version!r} is not kept")
        return {"to": version, "asked_at": float(request.get("asked_at", 0.0))}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("%s: not a rollback request (%s); removed", path, exc)
        path.unlink(missing_ok=True)
        return None


def version_tensors(checkpoint_dir: Path, version: int) -> dict[str, np.ndarray]:
    """The training state kept with ``version``."""
    checkpoint = load_checkpoint(_dir(checkpoint_dir, version))
    if checkpoint is None:
        raise ValueError(f"version {version} has no state in {_dir(checkpoint_dir, version)}")
    return checkpoint.tensors


def clear_rollback(checkpoint_dir: Path, asked_at: float) -> None:
    """Remove the rollback request that was applied (not a newer one asked meanwhile)."""
    request = pending_rollback(checkpoint_dir)
    if request is not None and request["asked_at"] == asked_at:
        (checkpoint_dir / ROLLBACK_FILE).unlink(missing_ok=True)
