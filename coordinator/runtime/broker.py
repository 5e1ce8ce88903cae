"""Embedded MQTT broker for the coordinator and the tests.

Starts a private broker bound to 127.0.0.1 only: mosquitto (a child process
with a generated config) when the binary is available, else amqtt (a
pure-Python, MQTT 3.1.1-only broker run in a daemon thread with its own
asyncio loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BrokerConfig", "BrokerError", "PortTaken", "EmbeddedBroker", "free_port", "find_mosquitto"]

log = logging.getLogger(__name__)
_HOST = "127.0.0.1"
_START_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1  # prctl(2)
#: fresh free ports tried when the one chosen is taken before the broker binds it
_PORT_ATTEMPTS = 5
_AUTH_KEYS = ("allow_anonymous", "password_file", "plugin", "auth_plugin", "acl_file")


class BrokerError(OSError):
    """The embedded broker could not be started or configured."""


class PortTaken(BrokerError):
    """The broker's port was taken by another program (between choosing it and binding it)."""



@dataclass(frozen=True)
class BrokerConfig:
    """How to run the embedded broker.

    ``max_packet_size``, ``persistence`` and ``extra_config`` (extra
    mosquitto.conf lines appended after the generated listener, so
    listener-scoped options such as certfile apply to it) only affect
    mosquitto; amqtt has no packet size limit and no persistence here.
    """

    port: int | None = None
    prefer: str = "auto"
    max_packet_size: int = 64 * 2**20
    mosquitto_path: str | None = None
    persistence: bool = False
    extra_config: tuple[str, ...] = ()
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if self.prefer not in ("auto", "mosquitto", "amqtt"):
            raise ValueError(f"prefer must be 'auto', 'mosquitto' or 'amqtt', not {self.prefer!r}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        if self.max_packet_size < 128:
            raise ValueError(f"max_packet_size too small: {self.max_packet_size}")
        for line in self.extra_config:
            if "\n" in line:
                raise ValueError(f"extra_config lines must not contain newlines: {line!r}")
            words = line.split()
            if (words and words[0] in ("listener", "port", "bind_address", "bind_interface")
                    and (words[0] != "listener" or len(words) < 3 or words[2] != _HOST)):
                raise ValueError(f"extra_config may only add listeners bound to {_HOST}: {line!r}")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def find_mosquitto(path: str | None = None) -> str | None:
    """Path of a usable mosquitto binary, or None."""
    candidates = [path] if path else [shutil.which("mosquitto"), "/usr/sbin/mosquitto"]
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class _ListHandler(logging.Handler):
    """Collects formatted log records of the amqtt broker."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(level=logging.INFO)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _die_with_parent() -> None:
    """In the broker's process before it starts: on Linux, the kernel ends it when the process
    that started it dies, even by SIGKILL or SIGTERM, so no job leaves a broker behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedBroker:
    """A private MQTT broker on 127.0.0.1 (mosquitto or amqtt)."""

    def __init__(self, config: BrokerConfig = BrokerConfig()) -> None:
        self.config = config
        self._mosquitto = find_mosquitto(config.mosquitto_path)
        wants_mosquitto = config.prefer == "mosquitto" or (config.prefer == "auto" and config.mosquitto_path)
        if wants_mosquitto and self._mosquitto is None:
            raise BrokerError(f"mosquitto binary not found (mosquitto_path={config.mosquitto_path!r})")
        self._kind = "amqtt" if config.prefer == "amqtt" or self._mosquitto is None else "mosquitto"
        self._port: int | None = config.port
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._amqtt_error: BaseException | None = None
        self._amqtt_log: list[str] = []
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------
    @property
    def kind(self) -> str:
        """"mosquitto" or "amqtt"."""
        return self._kind

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("broker has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        return f"mqtt://{_HOST}:{self.port}"

    @property
    def running(self) -> bool:
        if self._kind == "mosquitto":
            return self._proc is not None and self._proc.poll() is None
        return self._thread is not None and self._thread.is_alive()

    def log_text(self) -> str:
        """Broker log so far (mosquitto: log file + console; amqtt: captured records)."""
        if self._kind == "amqtt":
            return "\n".join(self._amqtt_log)
        if self._tmp is None:
            return ""
        parts = []
        for name in ("mosquitto.log", "console.log"):
            path = self._tmp / name
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        """Start the broker and wait until it accepts TCP connections."""
        with self._lock:
            if self.running:
                return
            chosen = self._port is None  # our own free port: another program may take it first
            for attempt in range(_PORT_ATTEMPTS if chosen else 1):
                if chosen:
                    self._port = free_port()
                try:
                    self._start_once()
                    return
                except PortTaken as exc:
                    if not chosen or attempt + 1 == _PORT_ATTEMPTS:
                        raise
                    log.info("%s; starting the broker on another free port", str(exc).splitlines()[0])

    def _start_once(self) -> None:
        if self._kind == "amqtt":
            self._start_amqtt()
            return
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="edgefl-broker-"))
        try:
            self._start_mosquitto()
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            raise

    def stop(self) -> None:
        """Stop the broker and remove its temporary directory (idempotent)."""
        with self._lock:
            self._stop_process()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def restart(self, pause_s: float = 0.0) -> None:
        """Stop, wait `pause_s` seconds, and start again on the same port (temp dir and
        persistence kept)."""
        with self._lock:
            self._stop_process()
        time.sleep(pause_s)
        self.start()

    def wait_for_listener(self, port: int, timeout_s: float = 10.0) -> None:
        """Wait until an extra listener (e.g. a TLS one from ``extra_config``) accepts
        connections; `start` waits only for the broker's own port. BrokerError on timeout."""
        deadline = time.monotonic() + timeout_s
        while not _port_accepts(port):
            if time.monotonic() > deadline:
                raise BrokerError(f"nothing accepts connections on port {port} within {timeout_s:.0f} s:\n"
                                  f"{self.log_text()}")
            time.sleep(0.05)

    def __enter__(self) -> "EmbeddedBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # best effort: never leave a child process behind
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()

    # -- mosquitto ----------------------------------------------------------
    def _mosquitto_conf(self) -> str:
        assert self._tmp is not None
        cfg = self.config
        lines = [f"# generated by edgefl for {self._kind}"]
        if os.geteuid() == 0:
            # mosquitto drops root privileges to user "mosquitto", which could not
            # write into our private temp dir nor read test password files.
            lines.append("user root")
        data_dir = Path(cfg.data_dir) if cfg.data_dir else self._tmp
        lines += [
            f"listener {self.port} {_HOST}",
            f"max_packet_size {cfg.max_packet_size}",
            f"persistence {'true' if cfg.persistence else 'false'}",
        ]
        if cfg.persistence:
            data_dir.mkdir(parents=True, exist_ok=True)
            lines.append(f"persistence_location {data_dir}/")
        lines += [
            f"log_dest file {self._tmp / 'mosquitto.log'}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
        ]
        if not any(line.split()[:1] and line.split()[0] in _AUTH_KEYS for line in cfg.extra_config):
            lines.append("allow_anonymous true")
        lines += list(cfg.extra_config)
        return "\n".join(lines) + "\n"

    def _start_mosquitto(self) -> None:
        assert self._tmp is not None and self._mosquitto is not None
        if _port_accepts(self.port):
            raise PortTaken(f"port {self.port} on {_HOST} is already in use")
        conf = self._tmp / "mosquitto.conf"
        conf.write_text(self._mosquitto_conf())
        console = open(self._tmp / "console.log", "ab")  # noqa: SIM115 - closed below
        try:
            self._proc = subprocess.Popen(
                [self._mosquitto, "-c", str(conf)],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                # not in the terminal's process group: Ctrl-C must not kill the broker under the devices
                # and the coordinator before they disconnect (the job stops it itself, in order)
                start_new_session=True,
                # the kernel signals on the death of the *thread* that started it: only the main one
                preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        finally:
            console.close()
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                text = self.log_text()
                error = PortTaken if "Address already in use" in text else BrokerError
                raise error(f"mosquitto exited with code {code} on start:\n{text}")
            if _port_accepts(self.port):
                return
            time.sleep(0.02)
        self._stop_process()
        raise BrokerError(f"mosquitto did not accept connections on port {self.port} "
                          f"within {_START_TIMEOUT:.0f} s:\n{self.log_text()}")

    # -- amqtt --------------------------------------------------------------
    def _amqtt_config(self) -> dict[str, Any]:
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{_HOST}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

    def _amqtt_main(self, ready: threading.Event) -> None:
        async def run() -> None:
            from amqtt.broker import Broker  # coordinator-only dependency, imported lazily

            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
            broker = Broker(self._amqtt_config())
            await broker.start()
            ready.set()
            try:
                await self._stop_event.wait()
            finally:
                # stop listening (and, on Python >= 3.13, cut the clients) first, and bound the
                # shutdown: amqtt 0.12.1's hung a broker restart with devices mid-transfer on a busy
                # machine, and its listener kept the port (the restart found it in use)
                for server in getattr(broker, "_servers", {}).values():
                    if (instance := getattr(server, "instance", None)) is not None:
                        instance.close()
                        getattr(instance, "abort_clients", lambda: None)()
                try:
                    await asyncio.wait_for(broker.shutdown(), 10)
                except asyncio.TimeoutError:
                    self._amqtt_log.append("amqtt broker shutdown timed out; its listener is closed")

        handler = _ListHandler(self._amqtt_log)
        logger = logging.getLogger("amqtt")
        logger.addHandler(handler)
        try:
            asyncio.run(run())
        except BaseException as exc:  # reported to start() through _amqtt_error
            self._amqtt_error = exc
            self._amqtt_log.append(f"amqtt broker failed: {exc!r}")
        finally:
            logger.removeHandler(handler)
            ready.set()

    def _start_amqtt(self) -> None:
        if _port_accepts(self.port):
            raise PortTaken(f"port {self.port} on {_HOST} is already in use")
        self._amqtt_error = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._amqtt_main, args=(ready,), name=f"amqtt-broker-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(_START_TIMEOUT) or self._amqtt_error is not None:
            err = self._amqtt_error
            self._stop_process()
            taken = ((isinstance(err, OSError) and err.errno == errno.EADDRINUSE)
                     or "address already in use" in str(err).lower())
            raise (PortTaken if taken else BrokerError)(
                f"amqtt broker failed to start on port {self.port}: {err!r}\n{self.log_text()}")
        deadline = time.monotonic() + _START_TIMEOUT
        while not _port_accepts(self.port):
            if time.monotonic() > deadline:
                self._stop_process()
                raise BrokerError(f"amqtt broker not accepting on port {self.port}:\n{self.log_text()}")
            time.sleep(0.02)

    # -- shared -------------------------------------------------------------
    def _stop_process(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        if self._thread is not None:
            thread, self._thread = self._thread, None
            loop, event = self._loop, self._stop_event
            if loop is not None and event is not None and thread.is_alive():
                with contextlib.suppress(RuntimeError):  # loop already closed
                    loop.call_soon_threadsafe(event.set)
            thread.join(timeout=15)  # the shutdown itself is bounded to 10 s (_amqtt_main)
            self._loop = self._stop_event = None
            if thread.is_alive():
                raise BrokerError(f"amqtt broker thread on port {self._port} did not stop")
