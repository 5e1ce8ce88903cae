"""A person's correction of a prediction (Home Assistant's select "Correct the last prediction").

Home Assistant publishes the chosen class, QoS 0, not retained, as the select's command template
makes it: ``{"class": "kettle", "end": "<the corrected prediction's window end>"}`` — the end ties the
correction to one prediction (a bare class names the latest). A correction of a class the task does
not have, or of a window the device no longer holds, is refused and counted. A taken correction is
kept, with its window's readings, in ``<state_dir>/corrections.jsonl`` (bounded: the oldest dropped) —
labelled rows for the device's training (docs/serving.md) — and the select's state is reset to
``None``, so the same class can be chosen again for the next prediction."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Corrections", "CorrectionRefused"]

log = logging.getLogger(__name__)

#: predictions whose window is kept for a correction to name
KEEP_WINDOWS = 100


class CorrectionRefused(ValueError):
    """A correction that names no class of the task, or no window the device holds."""


class Corrections:
    def __init__(self, state_dir: str | Path, max_lines: int = 10_000) -> None:
        self.path = Path(state_dir) / "corrections.jsonl"
        self.max_lines = max_lines
        self.windows: OrderedDict[str, np.ndarray] = OrderedDict()  # a prediction's end -> its readings
        self.taken = self.refused = 0

    def remember(self, end: str, values: np.ndarray) -> None:
        """A prediction was made on ``values``, its window ending at ``end``."""
        self.windows[end] = values
        while len(self.windows) > KEEP_WINDOWS:
            self.windows.popitem(last=False)

    def take(self, payload: bytes, classes: tuple[str, ...]) -> dict[str, Any]:
        """Record the correction in ``payload``; returns what was kept (CorrectionRefused: why not)."""
        try:
            text = payload.decode("utf-8").strip()
            body = json.loads(text) if text.startswith("{") else {"class": text}
            name, end = body.get("class"), body.get("end")
        except (UnicodeDecodeError, ValueError, AttributeError):
            self.refused += 1
            raise CorrectionRefused("not a correction (a class name, or JSON with class and end)") from None
        if name not in classes:
            self.refused += 1
            raise CorrectionRefused(f"{str(name)[:40]!r} is not a class of the task ({', '.join(classes)})")
        if not self.windows:
            self.refused += 1
            raise CorrectionRefused("no prediction to correct")
        if end in (None, "", "None", "unknown"):
            end = next(reversed(self.windows))
        if end not in self.windows:
            self.refused += 1
            raise CorrectionRefused(f"no prediction whose window ended at {str(end)[:40]!r} is kept")
        row = {"end": end, "class": name, "values": self.windows[end].tolist()}
        self._append(row)
        self.taken += 1
        return row

    def _append(self, row: dict[str, Any]) -> None:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        if len(lines) >= self.max_lines:  # bounded: the oldest go (rare: a person's corrections)
            self.path.write_text("\n".join(lines[len(lines) - self.max_lines + 1:]) + "\n")
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")
