"""Where a benchmark's table goes: stdout, and ``--out FILE`` when given (folders made)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["emit"]


def emit(text: str, out: str | None) -> None:
    """Print ``text`` and, with ``out``, write it there too (ending in a newline)."""
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text.rstrip("\n") + "\n")
