"""Checkpoints: the round reached, the history and the strategy's tensors.

Written in the same pickle-free frame layout as the wire (a msgpack header
followed by the raw little-endian tensor bytes, see docs/protocol.md),
atomically (temporary file, then rename), so a coordinator killed at any
moment resumes from its last completed round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.protocol.codec import CodecLimits, decode_frame, encode_frame, pack_tensors, unpack_tensors
from edge_sdk.protocol.errors import ProtocolError

from coordinator.runtime.safe_files import write_bytes_atomically

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "CHECKPOINT_FILE", "CHECKPOINT_LIMITS"]

CHECKPOINT_FILE = "checkpoint.msgpack"
_FORMAT = 2  # 1: tensors inline as msgpack bin (no longer read); 2: header + data region
CHECKPOINT_LIMITS = CodecLimits(max_message_bytes=4 << 30, max_tensor_bytes=2 << 30, max_header_bytes=256 << 20)


@dataclass(frozen=True)
class Checkpoint:
    """A resumable coordinator state."""

    method: str
    round: int
    rounds: list[dict[str, Any]]
    tensors: dict[str, np.ndarray]
    #: what makes the job this job (`coordinator.runtime.job_identity`); empty in older checkpoints
    job: dict[str, Any] = field(default_factory=dict)
    #: rounds in all and their bytes and seconds (``rounds`` holds the latest only); None: ``rounds``' own
    rounds_total: int | None = None
    totals: dict[str, float] | None = None


def save_checkpoint(directory: Path, method: str, rnd: int, rounds: list[dict[str, Any]],
                    tensors: dict[str, np.ndarray], job: dict[str, Any] | None = None,
                    rounds_total: int | None = None, totals: dict[str, float] | None = None) -> Path:
    """Write the checkpoint of round `rnd` (``job``: the job's identity; ``rounds``: the latest
    rounds' records, ``rounds_total`` and ``totals`` of all of them); returns its path. Its size
    does not grow with the rounds: the history is appended elsewhere (history.jsonl)."""
    directory.mkdir(parents=True, exist_ok=True)
    header = {"format": _FORMAT, "method": method, "round": rnd, "rounds": rounds, "tensors": pack_tensors(tensors),
              "job": job or {}}
    if rounds_total is not None:
        header.update(rounds_total=rounds_total, totals=dict(totals or {}))
    payload = encode_frame(header, CHECKPOINT_LIMITS.max_header_bytes)
    path = directory / CHECKPOINT_FILE
    write_bytes_atomically(path, payload)
    return path


def load_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint in `directory`, None if there is none; ProtocolError if corrupt."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    obj, data = decode_frame(path.read_bytes(), CHECKPOINT_LIMITS)
    if not isinstance(obj, dict) or obj.get("format") != _FORMAT:
        raise ProtocolError("version", f"{path}: not an edgefl checkpoint of format {_FORMAT}")
    try:
        tensors = unpack_tensors(obj["tensors"], data, CHECKPOINT_LIMITS)
        data.finish()
        job = obj.get("job", {})
        if not isinstance(job, dict):
            raise ValueError(f"job must be a map, got {type(job).__name__}")
        total, totals = obj.get("rounds_total"), obj.get("totals")
        return Checkpoint(method=str(obj["method"]), round=int(obj["round"]),
                          rounds=list(obj["rounds"]),
                          tensors={k: np.array(v) for k, v in tensors.items()}, job=job,
                          rounds_total=int(total) if total is not None else None,
                          totals={str(k): float(v) for k, v in totals.items()} if isinstance(totals, dict) else None)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, f"{path}: {exc.message}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed", f"{path}: {exc}") from exc
