"""A person's correction of a prediction (Home Assistant's select "Correct the last prediction").

Home Assistant publishes the chosen class, QoS 0, not retained, as the select's command template
makes it: ``{"class": "kettle", "end": "<the corrected prediction's window end>"}`` — the end ties the
correction to one prediction (a bare class names the latest). A correction of a class the task does
not have, or of a window the device no longer holds, is refused and counted. A taken correction
goes, with its window's readings, into the device's label store (`LabelStore`): a training row
(docs/serving.md), and the select's state is reset to ``None``, so the same class can be chosen
again for the next prediction."""

from __future__ import annotations

import json
from collections import OrderedDict

from edge_sdk.serving.windows import Window

__all__ = ["Corrections", "CorrectionRefused", "KEEP_WINDOWS"]

#: predictions whose window is kept for a correction to name
KEEP_WINDOWS = 100


class CorrectionRefused(ValueError):
    """A correction that names no class of the task, or no window the device holds."""


class Corrections:
    """The windows of the latest predictions, and the corrections of them taken or refused."""

    def __init__(self) -> None:
        self.windows: OrderedDict[str, Window] = OrderedDict()  # a prediction's end (ISO) -> its window
        self.taken = self.refused = 0

    def remember(self, end: str, window: Window) -> None:
        """A prediction was made on ``window``, published with ``end`` as its end."""
        self.windows[end] = window
        while len(self.windows) > KEEP_WINDOWS:
            self.windows.popitem(last=False)

    def take(self, payload: bytes, classes: tuple[str, ...]) -> tuple[str, Window]:
        """The class and window ``payload`` corrects (CorrectionRefused: why not)."""
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
        self.taken += 1
        return name, self.windows[end]
