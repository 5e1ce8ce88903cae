"""Run a snippet in a fresh interpreter: what a module imports (or installs) at import time is only
seen in a process that has imported nothing else."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["run_python"]


def run_python(*lines: str, timeout: float = 120) -> None:
    """Run ``lines`` as one program in a new Python process; fail with its output when it fails."""
    proc = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
