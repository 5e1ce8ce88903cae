"""The device's rolling log of predictions: ``<state_dir>/predictions.jsonl``, one JSON line each,
bounded — past ``max_lines`` it becomes ``predictions.1.jsonl`` (the one before is dropped)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PredictionLog"]


class PredictionLog:
    def __init__(self, state_dir: str | Path, max_lines: int = 10_000) -> None:
        self.path = Path(state_dir) / "predictions.jsonl"
        self.max_lines = max_lines
        self._lines = 0
        if self.path.exists():
            with open(self.path, "rb") as fh:
                self._lines = sum(1 for _ in fh)

    def append(self, prediction: dict[str, Any]) -> None:
        if self._lines >= self.max_lines:
            self.path.replace(self.path.with_name("predictions.1.jsonl"))
            self._lines = 0
        with open(self.path, "a") as fh:
            fh.write(json.dumps(prediction, separators=(",", ":")) + "\n")
        self._lines += 1
