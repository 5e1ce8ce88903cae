"""deploy/raspberrypi/install.sh against a temporary root (no real systemd or users needed):
a working venv with only the edge SDK, config and unit with the right modes, idempotent,
and an uninstall path. Plus shellcheck and systemd-analyze on the deploy files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from edge_sdk.signing import ModelSigner, load_public_key
from tests.support.keys import public_key_pem
from tests.support.requirements import needs
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
DEPLOY = ROOT / "deploy"
INSTALL = DEPLOY / "raspberrypi" / "install.sh"
UNIT = DEPLOY / "raspberrypi" / "edgefl-client.service"
SCRIPTS = sorted(DEPLOY.rglob("*.sh"))


def _run(*args: object, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "EDGEFL_PYTHON": sys.executable,
                "EDGEFL_PIP_OPTS": "--no-index --no-deps", **(env or {})}
    proc = subprocess.run(["bash", INSTALL, *map(str, args)], capture_output=True, text=True, env=full_env)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout, built from a copy (the work tree stays clean)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    for pkg in ("edge_sdk", "coordinator", "profiles"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", tmp / "dist", src], check=True, capture_output=True)
    return next((tmp / "dist").glob("edgefl-*.whl"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "pi-den"
    pub = out.parent / "model-signing.pub"  # the coordinator's public key, as add-device.sh --coordinator makes it
    pub.write_bytes(public_key_pem(ModelSigner.generate().public_key))
    subprocess.run(["bash", DEPLOY / "homeserver" / "add-device.sh", "--passwd", out.parent / "passwd",
                    "--out", out, "--no-reload", "--broker-url", "mqtts://homeserver.lan:8883",
                    "--signing-pub", pub, "pi-den"], check=True, capture_output=True)
    return out


def _venv_seeing_our_packages(root: Path) -> Path:
    """The staged venv, made beforehand so that it sees torch & co. from this interpreter's
    site-packages, as `--system-site-packages` lets a Jetson's venv see NVIDIA's torch. (Made
    by install.sh from inside a venv, `--system-site-packages` would see the base
    interpreter's packages instead, which have no torch.)"""
    venv = root / "opt" / "edgefl" / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_test_runner_packages.pth").write_text("\n".join(sorted(ours)) + "\n")
    return venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    root = tmp_path_factory.mktemp("root")
    _venv_seeing_our_packages(root)
    first = _run("--root", root, "--source", wheel, "--torch", "skip")
    return root, first


@pytest.mark.slow
def test_a_missing_venv_is_created_and_a_missing_torch_is_a_clear_error(tmp_path, wheel):
    proc = _run("--root", tmp_path, "--source", wheel, "--torch", "skip", env={"EDGEFL_PYTHON": sys.base_prefix
                                                                               + "/bin/python3"}, check=False)
    assert "created virtual environment /opt/edgefl/venv" in proc.stdout, proc.stdout + proc.stderr
    if proc.returncode != 0:  # the base interpreter has no torch (the usual case): one line says why
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "the edge SDK does not import: ModuleNotFoundError: No module named 'torch'" in proc.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_first_install_builds_a_lean_working_venv(installed):
    root, first = installed
    venv = root / "opt" / "edgefl" / "venv"
    # install.sh itself checked `import torch, edge_sdk.client` in the venv
    out = subprocess.run([venv / "bin" / "python", "-c", "import edge_sdk; print(edge_sdk.__file__)"],
                         capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.startswith(str(venv))  # the venv's own copy, not the checkout
    own = {p.name.lower() for p in next(venv.glob("lib/python3*/site-packages")).iterdir()}
    assert any(name.startswith("edgefl-") for name in own)
    assert not {n for n in own if n.split("-")[0] in ("nni", "onnx", "onnxruntime", "sklearn", "matplotlib")}
    assert subprocess.run([venv / "bin" / "edgefl", "predict", "--help"], capture_output=True).returncode == 0
    assert "[staging] would run: useradd --system --user-group --home-dir /var/lib/edgefl" in first.stdout


@pytest.mark.slow
def test_config_unit_and_state_have_the_right_modes(installed):
    root, first = installed
    conf = root / "etc" / "edgefl"
    assert _mode(conf) == 0o750 and _mode(conf / "client.toml") == 0o640
    assert (conf / "client.toml").read_text() == (DEPLOY / "raspberrypi" / "client.toml").read_text()
    unit = root / "etc" / "systemd" / "system" / "edgefl-client.service"
    assert unit.read_text() == UNIT.read_text() and _mode(unit) == 0o644
    assert _mode(root / "var" / "lib" / "edgefl") == 0o750
    # the example config still names pi-kitchen: enabled, but not started until edited
    assert "would run: systemctl enable edgefl-client.service" in first.stdout
    assert "enable --now" not in first.stdout and "edit /etc/edgefl/client.toml" in first.stdout


def test_unit_hardening():
    text = UNIT.read_text()
    for line in ("Restart=on-failure", "ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes",
                 "PrivateTmp=yes", "StateDirectory=edgefl", "User=edgefl",
                 "ExecStart=/opt/edgefl/venv/bin/edgefl -v client --config /etc/edgefl/client.toml"):
        assert f"\n{line}\n" in text, line
    assert "\nMemoryDenyWriteExecute" not in text  # breaks torch's JIT


@pytest.mark.slow
def test_bundle_install_is_idempotent_and_starts(installed, wheel, bundle):
    root, _ = installed
    args = ("--root", root, "--source", wheel, "--torch", "skip", "--bundle", bundle, "--memory-max", "700M")
    second = _run(*args)
    conf = root / "etc" / "edgefl"
    assert (conf / "client.toml").read_text() == (bundle / "client.toml").read_text()  # replaced the example
    assert (conf / "password").read_text() == (bundle / "password").read_text()
    assert _mode(conf / "password") == 0o640 and _mode(conf / "client.toml") == 0o640
    # the coordinator's public key, where the bundle's client.toml trusts it
    assert load_public_key(conf / "model-signing.pub") == load_public_key(bundle / "model-signing.pub")
    assert _mode(conf / "model-signing.pub") == 0o644
    assert '\ntrusted_keys = ["/etc/edgefl/model-signing.pub"]\n' in (conf / "client.toml").read_text()
    assert "would run: systemctl enable --now edgefl-client.service" in second.stdout
    dropin = root / "etc" / "systemd" / "system" / "edgefl-client.service.d" / "limits.conf"
    assert "MemoryMax=700M" in dropin.read_text()
    third = _run(*args)  # nothing left to change
    assert "installed /etc" not in third.stdout and "created virtual environment" not in third.stdout
    assert "virtual environment /opt/edgefl/venv exists" in third.stdout
    assert "edge SDK up to date" in third.stdout  # the same wheel is not installed again
    # a config edited by the owner is never overwritten by a bundle
    (conf / "client.toml").write_text((bundle / "client.toml").read_text() + "# mine\n")
    fourth = _run(*args)
    assert (conf / "client.toml").read_text().endswith("# mine\n")
    assert (conf / "client.toml.new").exists() and "kept your" in fourth.stdout


@pytest.mark.slow
def test_a_serve_only_install_runs_edgefl_serve_and_a_later_full_one_the_client(tmp_path, wheel):
    _venv_seeing_our_packages(tmp_path)
    served = _run("--root", tmp_path, "--source", wheel, "--serve-only", "--no-start")
    assert "installing torch" not in served.stdout and "installing onnxruntime" in served.stdout
    dropin = tmp_path / "etc" / "systemd" / "system" / "edgefl-client.service.d" / "serve-only.conf"
    assert dropin.read_text() == ("[Service]\nExecStart=\n"
                                  "ExecStart=/opt/edgefl/venv/bin/edgefl -v serve --config /etc/edgefl/client.toml\n")
    full = _run("--root", tmp_path, "--source", wheel, "--torch", "skip", "--no-start")
    assert not dropin.exists() and "edge SDK up to date" not in full.stdout  # another install: done again


def test_uninstall_then_purge(tmp_path):
    for path in ("opt/edgefl/venv/bin/python", "etc/systemd/system/edgefl-client.service",
                 "etc/systemd/system/edgefl-client.service.d/limits.conf", "etc/edgefl/client.toml",
                 "var/lib/edgefl/data.npz"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    kept = _run("--root", tmp_path, "--uninstall")
    assert not (tmp_path / "opt" / "edgefl").exists()
    assert not (tmp_path / "etc" / "systemd" / "system" / "edgefl-client.service").exists()
    assert not (tmp_path / "etc" / "systemd" / "system" / "edgefl-client.service.d").exists()
    assert (tmp_path / "etc" / "edgefl" / "client.toml").exists()
    assert (tmp_path / "var" / "lib" / "edgefl" / "data.npz").exists()  # private data kept
    assert "would run: systemctl disable --now edgefl-client.service" in kept.stdout
    _run("--root", tmp_path, "--uninstall")  # again: nothing to remove, still fine
    purged = _run("--root", tmp_path, "--uninstall", "--purge")
    assert not (tmp_path / "etc" / "edgefl").exists() and not (tmp_path / "var" / "lib" / "edgefl").exists()
    assert "would run: userdel edgefl" in purged.stdout


def test_refuses_32_bit_arm_and_old_python(tmp_path):
    proc = _run("--root", tmp_path, env={"EDGEFL_UNAME_M": "armv7l"}, check=False)
    assert proc.returncode == 1 and "32-bit" in proc.stderr
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\n")
    old.chmod(0o755)
    proc = _run("--root", tmp_path, "--python", old, check=False)
    assert proc.returncode == 1 and "Python 3.9 is too old" in proc.stderr
    assert not (tmp_path / "opt").exists()


def test_live_install_needs_root_or_a_staging_root(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root")
    proc = _run(check=False)
    assert proc.returncode == 1 and "run as root" in proc.stderr


@needs("shellcheck")
def test_shellcheck_clean():
    assert len(SCRIPTS) >= 4, SCRIPTS  # install, aarch64 check, add-device, make-certs
    proc = subprocess.run(["shellcheck", "-x", *SCRIPTS], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_verify(tmp_path):
    for unit in (UNIT, DEPLOY / "homeserver" / "edgefl-coordinator.service"):
        copy = tmp_path / unit.name
        text = unit.read_text()
        copy.write_text(text.replace("/opt/edgefl/venv/bin/edgefl", "/bin/true")
                        .replace("/opt/edgefl-coordinator/venv/bin/edgefl", "/bin/true"))
        proc = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True, text=True)
        assert proc.returncode == 0 and unit.name not in proc.stderr, proc.stderr


def _requirements(group: str | None = None) -> dict:
    from packaging.requirements import Requirement

    from edge_sdk.config import read_toml

    project = read_toml(ROOT / "pyproject.toml")["project"]
    listed = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {req.name: req for req in map(Requirement, listed)}


# (platform_machine, sys_platform) of the home servers edgefl names; NNI 3.0's only wheels are
# manylinux1_x86_64, macosx_10_9_x86_64 and win_amd64 (no sdist)
_MACHINES = {"x86-64 Linux": ("x86_64", "linux"), "Windows": ("AMD64", "win32"), "Intel Mac": ("x86_64", "darwin"),
             "Raspberry Pi / ARM Linux": ("aarch64", "linux"), "Apple-silicon Mac": ("arm64", "darwin")}


@pytest.mark.parametrize("where", sorted(_MACHINES))
def test_nni_is_required_only_where_it_has_wheels(where):
    machine, system = _MACHINES[where]
    env = {"platform_machine": machine, "sys_platform": system, "python_version": "3.11"}
    coordinator = _requirements("coordinator")
    assert coordinator["nni"].marker.evaluate(env) is (machine in ("x86_64", "AMD64"))
    # REFT's pruning backend where NNI is missing (coordinator/strategies/pruning.py) is required everywhere
    assert coordinator["torch-pruning"].marker is None


def test_python_310_is_supported_with_tomli_for_tomllib():
    from edge_sdk.config import read_toml

    assert read_toml(ROOT / "pyproject.toml")["project"]["requires-python"] == ">=3.10"
    tomli = _requirements()["tomli"]
    assert tomli.marker.evaluate({"python_version": "3.10"}) and not tomli.marker.evaluate({"python_version": "3.11"})
