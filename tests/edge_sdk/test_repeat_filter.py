"""A warning that repeats is let through 5 times a minute, then counted, never lost silently."""

from __future__ import annotations

import io
import logging

from edge_sdk.repeat_filter import RepeatFilter


def test_a_repeated_warning_is_held_back_and_counted() -> None:
    now = [0.0]
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatFilter(burst=2, window_s=60.0, clock=lambda: now[0]))
    log = logging.getLogger("test.repeat")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        for i in range(5):  # one kind (its template), whatever the arguments
            log.warning("refused an update from %s", f"pi-{i}")
        log.warning("another warning")  # another kind: its own allowance
        log.info("refused an update from %s", "pi-9")  # below WARNING: never held back
        now[0] = 61.0
        log.warning("refused an update from %s", "pi-5")
    finally:
        log.removeHandler(handler)
    assert out.getvalue().splitlines() == [
        "refused an update from pi-0", "refused an update from pi-1", "another warning",
        "refused an update from pi-9", "refused an update from pi-5 (3 more like this held back)"]
