"""The code passes ruff's small rule set (pyproject.toml [tool.ruff.lint])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff comes with the dev extra: pip install -e '.[all]'")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
