"""The code passes ruff: the small rule set everywhere (pyproject.toml [tool.ruff.lint]), the broader one
(E, F, W, B, SIM) on the packages."""

from __future__ import annotations

import subprocess
import sys

from tests.support.requirements import needs
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


@needs("ruff")
def test_ruff_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


#: the broader rule set the packages themselves keep (pycodestyle, pyflakes, bugbear, simplify);
#: tests/ and bench/ keep the small one
PACKAGE_RULES = "E,F,W,B,SIM"


@needs("ruff")
def test_the_packages_pass_the_broader_rules() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", PACKAGE_RULES,
                           "coordinator", "edge_sdk", "simulation"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
