"""The SDK's version has one source, edge_sdk/version.py: pyproject.toml reads it for the package's
metadata (a wheel, an editable install), `edgefl --version` prints it and a device registers with it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest

from edge_sdk.config import read_toml
from edge_sdk.version import SDK_VERSION
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def test_pyproject_takes_the_version_from_edge_sdk() -> None:
    pyproject = read_toml(ROOT / "pyproject.toml")
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "edge_sdk.version.SDK_VERSION"}


def test_edgefl_version_prints_it(capsys) -> None:
    from edge_sdk.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"edgefl {SDK_VERSION}\n"


def test_the_installed_metadata_says_the_same() -> None:
    try:
        installed = version("edgefl")
    except PackageNotFoundError:
        pytest.skip("edgefl is not installed: run from a checkout")
    assert installed == SDK_VERSION, (f"the installed edgefl is {installed}, edge_sdk/version.py says {SDK_VERSION}: "
                                      "install it again (pip install -e .)")


def test_a_device_registers_with_it() -> None:
    import numpy as np

    from edge_sdk.client import ClientConfig, DeviceClient
    from edge_sdk.methods import LocalData
    from edge_sdk.profiling import load_profile

    client = DeviceClient(ClientConfig(device_id="pi", device="cpu"),
                          LocalData(np.zeros((4, 8), np.float32), np.zeros(4, np.int64), 2), load_profile("laptop"))
    sent = []
    client.uplink.envelope = sent.append
    client._register()
    assert [env.body.sdk_version for env in sent] == [SDK_VERSION]
    assert "evaluate" in sent[0].body.capabilities and "fedavg" in sent[0].body.capabilities  # what it can do
