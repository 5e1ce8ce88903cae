"""A missing part skips its tests locally and fails them under CI=true (tests/support/requirements.py);
.ci/run stops with one line when a system tool is still missing under CI=true."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import requirements
from tests.support.requirements import needs, require
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture
def missing(monkeypatch: pytest.MonkeyPatch):
    """Pretend ``nni`` and ``openssl`` are missing on an x86-64 machine (``ruff`` is there)."""
    reasons = {"nni": "NNI is not installed", "openssl": "openssl is not installed", "ruff": None}
    monkeypatch.setattr(requirements, "_missing", reasons.__getitem__)
    monkeypatch.setattr(requirements.platform, "machine", lambda: "x86_64")
    return monkeypatch


@pytest.mark.parametrize("ci", ["", "false"])
def test_outside_ci_a_missing_part_skips_with_its_reason(missing, ci: str) -> None:
    missing.setenv("CI", ci)
    require("ruff")  # present: nothing happens
    with pytest.raises(pytest.skip.Exception, match="openssl is not installed"):
        require("ruff", "openssl")


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_missing_part_fails(missing, ci: str) -> None:
    missing.setenv("CI", ci)
    for name, why in (("openssl", "openssl is not installed"), ("nni", "NNI is not installed")):
        with pytest.raises(pytest.fail.Exception, match=f"^CI=true and a required part is missing: {why}$"):
            require(name)
    assert requirements.expected_pruning_backend() == "nni"  # a missing NNI must not pass as torch-pruning


def test_nni_is_not_required_where_it_has_no_wheels(missing) -> None:
    missing.setenv("CI", "true")
    missing.setattr(requirements.platform, "machine", lambda: "aarch64")
    with pytest.raises(pytest.skip.Exception, match="NNI has wheels for x86_64 and AMD64 only; this is aarch64"):
        require("nni")
    with pytest.raises(pytest.fail.Exception, match="openssl"):  # any other part still fails
        require("nni", "openssl")
    assert requirements.expected_pruning_backend() == "torch-pruning"


def test_unknown_names_are_errors() -> None:
    with pytest.raises(KeyError, match="unknown requirement 'mosquito'"):
        needs("mosquito")


def test_ci_run_stops_when_a_system_tool_is_still_missing(tmp_path: Path) -> None:
    """A copy of .ci/run (never the real one: it would go on to replace .venv) with a PATH that
    has bash and dirname but no apt-get and none of the tools."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "CI": "true", "HOME": os.environ.get("HOME", "/")}
    proc = subprocess.run([str(bin_dir / "bash"), str(tmp_path / ".ci" / "run")], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: CI=true and required system tools are missing:") and \
        len(proc.stderr.splitlines()) == 1, proc.stderr
    assert {"mosquitto_passwd", "mosquitto_pub", "openssl", "shellcheck"} <= set(proc.stderr.split()), proc.stderr
    assert proc.stdout == "" and not (tmp_path / ".venv").exists()
