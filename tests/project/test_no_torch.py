"""The edge SDK without torch, on every supported Python (3.10+): the wire protocol, the
transport, config files and the CLI's front door work before torch is installed (a Jetson owner
installs NVIDIA's torch wheel after the SDK). `.ci/py310.sh` runs this file and the others listed
in no_torch_tests.txt under Python 3.10 in a venv that has no torch; in the main suite torch is
hidden from a subprocess instead."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_sdk.config import read_toml, section
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
LISTED = ROOT / "tests" / "no_torch_tests.txt"
# A fresh interpreter in which `import torch` (and any torch.*) fails, as on a device without it.
HIDE_TORCH = "import sys\nsys.modules['torch'] = None\n"


def _listed() -> list[str]:
    lines = (line.strip() for line in LISTED.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_TORCH + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_listed_test_files_import_without_torch() -> None:
    files = _listed()
    assert "tests/project/test_no_torch.py" in files
    assert not [f for f in files if not (ROOT / f).is_file()], "listed files that do not exist"
    modules = ["tests.conftest"] + [f.removesuffix(".py").replace("/", ".") for f in files]
    proc = _without_torch(f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n")
    assert proc.returncode == 0, f"a file of {LISTED.name} needs torch now:\n{proc.stderr}"


def test_the_cli_front_door_and_the_torch_free_modules() -> None:
    proc = _without_torch(
        "import contextlib, io\n"
        "import edge_sdk.protocol.messages, edge_sdk.networking.transport, edge_sdk.networking.link, edge_sdk.config\n"
        "import edge_sdk.inference, edge_sdk.signing, edge_sdk.data.datasets, edge_sdk.schedule\n"
        "from edge_sdk.cli import main\n"
        "for argv in (['--version'], ['--help'], ['predict', '--help']):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "    print(out.getvalue().splitlines()[0])\n")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("edgefl ") and lines[1].startswith("usage: edgefl") \
        and lines[2].startswith("usage: edgefl predict"), proc.stdout


def test_config_files_parse_on_this_python(tmp_path) -> None:
    import edge_sdk.config

    # tomllib from 3.11 on; tomli (the same parser, a dependency only there) on 3.10
    assert edge_sdk.config.tomllib.__name__ == ("tomllib" if sys.version_info >= (3, 11) else "tomli")
    good = tmp_path / "client.toml"
    good.write_text('device_id = "pi-den"\n[broker]\nurl = "mqtts://homeserver.lan:8883"\nkeepalive_s = 30\n')
    config = read_toml(good)
    assert config["device_id"] == "pi-den"
    assert section(config, "broker", {"url", "keepalive_s"}) == {"url": "mqtts://homeserver.lan:8883",
                                                                 "keepalive_s": 30}
    bad = tmp_path / "bad.toml"
    bad.write_text('device_id = "pi-den\n')
    with pytest.raises(ValueError, match=r"bad\.toml: invalid TOML"):
        read_toml(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_toml(tmp_path / "missing.toml")


def test_the_methods_settings_and_option_help_need_no_torch() -> None:
    """``edgefl simulate --method M --option help`` and the methods' settings (which a device reads
    its plans with) import no torch: the settings live in edge_sdk.methods.settings, and
    edge_sdk.methods imports its device parts on use."""
    proc = _without_torch(
        "import contextlib, io\n"
        "from edge_sdk.methods import DEVICE_METHODS\n"
        "from edge_sdk.methods.registry import METHODS\n"
        "from edge_sdk.cli import main\n"
        "assert set(METHODS) >= set(DEVICE_METHODS)\n"
        "for name in sorted(METHODS):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        assert main(['simulate', '--method', name, '--option', 'help']) == 0\n"
        "    print(out.getvalue().splitlines()[0])\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "fdnnc options (--option KEY=VALUE; docs/methods/fdnnc.md):", proc.stdout
