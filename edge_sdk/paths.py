"""Check, before any work, that the folders a command will write into can be written.

A job that trains for an hour and then cannot write its report has lost the hour: every command
checks its output folders (report, checkpoints, device state, saved profiles) when it starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["writable_dir", "writable_file"]


def writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` (and its parents) if needed and prove a file can be written in it; else a
    one-line ValueError naming ``what`` (e.g. ``--out``), the folder and the reason."""
    folder = Path(path).expanduser()
    try:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{what} {folder} is a file, not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".edgefl-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {folder} is not writable: {exc.strerror or exc}") from None
    return folder


def writable_file(path: str | Path, what: str) -> Path:
    """Check that the file ``path`` can be written (its folder is made, an existing file must be
    writable); a one-line ValueError otherwise."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise ValueError(f"{what} {file} is a folder, not a file")
    writable_dir(file.parent, f"the folder of {what}")
    if file.exists() and not os.access(file, os.W_OK):
        raise ValueError(f"{what} {file} is not writable")
    return file
