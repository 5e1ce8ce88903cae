"""The optional parts some tests need, checked in one place.

Outside CI a test whose part is missing skips, saying which part and how to get it. Under CI
(``CI=true``, as .ci/run runs) it fails instead: CI must not pass with parts of the suite silently
skipped. NNI is required on x86-64 only (it has no wheels elsewhere; there REFT prunes with
torch-pruning and the NNI tests skip, under CI too).

    @needs("mosquitto", "openssl")       # a test; ``pytestmark = needs(...)`` for a whole module
    require("onnxruntime")                # inside a test or a fixture

``needs`` is the ``requires`` marker, which tests/conftest.py checks before each test's fixtures.
No torch here: the files of tests/no_torch_tests.txt use it too.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["HOME_TOOLS", "expected_pruning_backend", "have", "in_ci", "needs", "require"]

#: what deploy/homeserver's broker set-up needs (tests/support/home_broker.py)
HOME_TOOLS = ("mosquitto", "mosquitto_passwd", "openssl")
NNI_MACHINES = ("x86_64", "AMD64")  # NNI 3.0's wheels (pyproject.toml)


def in_ci() -> bool:
    """CI=true (or 1/yes) in the environment."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _tool(name: str, hint: str) -> Callable[[], str | None]:
    def check() -> str | None:
        found = shutil.which(name) is not None or Path("/usr/sbin", name).exists()  # not on a user's PATH
        return None if found else f"{name} is not installed ({hint})"
    return check


def _mosquitto() -> str | None:
    from coordinator.runtime.broker import find_mosquitto

    return None if find_mosquitto() else "mosquitto is not installed (apt-get install mosquitto)"


def _module(name: str, hint: str) -> Callable[[], str | None]:
    def check() -> str | None:
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed ({hint})"
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install is missing too, and says why
            return f"{name} is installed but does not import ({type(exc).__name__}: {exc})"
        return None
    return check


def _nni() -> str | None:
    if importlib.util.find_spec("nni") is None:
        return "NNI is not installed (pip install -e '.[all]')"
    from coordinator.strategies.pruning import available_backends

    if "nni" in available_backends():
        return None
    try:  # what coordinator/strategies/pruning.py imports, for the reason
        import nni.compression.pruning  # noqa: F401
        import nni.compression.speedup  # noqa: F401
    except Exception as exc:
        return f"NNI is installed but does not import ({type(exc).__name__}: {exc})"
    return "NNI is installed but coordinator/strategies/pruning.py does not offer it"


def _ray() -> str | None:
    if importlib.util.find_spec("ray") is None or not Path(sys.executable).with_name("ray").exists():
        return "Ray is not installed (pip install -e '.[ray]')"
    return None


_CHECKS: dict[str, Callable[[], str | None]] = {
    "mosquitto": _mosquitto,
    "mosquitto_passwd": _tool("mosquitto_passwd", "apt-get install mosquitto"),
    "openssl": _tool("openssl", "apt-get install openssl"),
    "shellcheck": _tool("shellcheck", "apt-get install shellcheck"),
    "onnx": _module("onnx", "pip install -e '.[coordinator]'"),
    "onnxruntime": _module("onnxruntime", "pip install -e '.[coordinator]'"),
    "ruff": _module("ruff", "pip install -e '.[dev]'"),
    "nni": _nni,
    "ray": _ray,
}


@functools.cache
def _missing(name: str) -> str | None:
    """Why ``name`` is unusable here, or None."""
    if name not in _CHECKS:
        raise KeyError(f"unknown requirement {name!r}; known: {', '.join(_CHECKS)}")
    return _CHECKS[name]()


def _required_here(name: str) -> bool:
    """Whether CI must have ``name`` on this machine (NNI: x86-64 only)."""
    return name != "nni" or platform.machine() in NNI_MACHINES


def have(name: str) -> bool:
    """``name`` is installed and usable here."""
    return _missing(name) is None


def require(*names: str) -> None:
    """Skip the running test when a named part is missing; under CI=true fail instead (unless
    the part cannot exist on this machine: NNI off x86-64)."""
    reasons = [(name, why) for name in names if (why := _missing(name))]
    if not reasons:
        return
    text = "; ".join(why for _, why in reasons)
    if in_ci() and any(_required_here(name) for name, _ in reasons):
        pytest.fail(f"CI=true and a required part is missing: {text}", pytrace=False)
    if not all(_required_here(name) for name, _ in reasons):
        text += f" (NNI has wheels for {' and '.join(NNI_MACHINES)} only; this is {platform.machine()})"
    pytest.skip(text)


def needs(*names: str) -> pytest.MarkDecorator:
    """A mark: ``require(*names)`` before the test and its fixtures."""
    for name in names:
        if name not in _CHECKS:
            raise KeyError(f"unknown requirement {name!r}; known: {', '.join(_CHECKS)}")
    return pytest.mark.requires(*names)


def expected_pruning_backend() -> str:
    """The backend ``auto`` must resolve to: NNI where CI requires it or it imports, else
    torch-pruning (a broken NNI must not pass as torch-pruning under CI)."""
    if have("nni") or (in_ci() and _required_here("nni")):
        return "nni"
    return "torch-pruning"
