"""Device profiles: what a device can compute and transfer, measured or looked up.

A :class:`DeviceProfile` holds sustained float32 training throughput (GFLOPS),
RAM, CPU count and link speeds, each number with a ``sources`` entry saying
where it came from. Profiles are measured on the device (:func:`measure_device`)
or loaded from the shipped ``profiles/*.toml`` files (:func:`load_profile`).
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

__all__ = ["DeviceProfile", "NOMINAL_MBPS", "available_profiles", "load_profile",
           "measure_bandwidth", "measure_device", "measure_flops", "measure_flops_detail",
           "profile_to_toml", "save_profile"]

#: Link speed assumed when bandwidth is not measured (typical 2.4 GHz home Wi-Fi).
NOMINAL_MBPS = 20.0

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ARCH_RE = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")
_MAX_SOURCE_LEN = 1000
# field -> (kind, low, high, low_inclusive)
_NUMERIC: dict[str, tuple[type, float, float, bool]] = {
    "gflops": (float, 0.0, 1e6, False),
    "ram_mb": (int, 16, 1e8, True),
    "cpu_count": (int, 1, 4096, True),
    "uplink_mbps": (float, 0.0, 1e6, False),
    "downlink_mbps": (float, 0.0, 1e6, False),
}
_SOURCE_FIELDS = frozenset(_NUMERIC) | {"arch"}
_KEYS = frozenset(["name", "arch", "measured", *_NUMERIC])


def _check_number(key: str, value: Any) -> int | float:
    kind, low, high, low_incl = _NUMERIC[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"profile field {key!r} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"profile field {key!r} must be finite, got {value!r}")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"profile field {key!r} must be an integer, got {value!r}")
    value = kind(value)
    if (value < low if low_incl else value <= low) or value > high:
        lo = "[" if low_incl else "("
        raise ValueError(f"profile field {key!r}={value!r} outside {lo}{low:g}, {high:g}]")
    return value


@dataclass(frozen=True)
class DeviceProfile:
    """Compute, memory and link capabilities of one device (validated on creation)."""

    name: str
    gflops: float
    ram_mb: int
    cpu_count: int
    uplink_mbps: float
    downlink_mbps: float
    arch: str = ""
    measured: bool = False
    sources: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"profile name {self.name!r} invalid: need 1-64 chars of [A-Za-z0-9_.-]")
        if not isinstance(self.arch, str) or not _ARCH_RE.match(self.arch):
            raise ValueError(f"profile arch {self.arch!r} invalid: need <=64 chars of [A-Za-z0-9_.-]")
        if not isinstance(self.measured, bool):
            raise ValueError(f"profile field 'measured' must be a bool, got {self.measured!r}")
        for key in _NUMERIC:
            object.__setattr__(self, key, _check_number(key, getattr(self, key)))
        if not isinstance(self.sources, Mapping):
            raise ValueError("profile 'sources' must be a mapping of field -> str")
        for key, text in self.sources.items():
            if key not in _SOURCE_FIELDS:
                raise ValueError(f"unknown source key {key!r}; allowed: {sorted(_SOURCE_FIELDS)}")
            if not isinstance(text, str) or len(text) > _MAX_SOURCE_LEN:
                raise ValueError(f"source for {key!r} must be a str of <= {_MAX_SOURCE_LEN} chars")
        object.__setattr__(self, "sources", dict(self.sources))

    def to_dict(self) -> dict[str, Any]:
        """Flat dict (str -> int/float/str/bool); sources become ``source.<field>`` keys."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ("name", *_NUMERIC, "arch", "measured")}
        out.update((f"source.{k}", text) for k, text in sorted(self.sources.items()))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceProfile:
        """Strictly validate a flat dict (as made by :meth:`to_dict`) into a profile."""
        if not isinstance(d, Mapping):
            raise ValueError(f"profile must be a mapping, got {type(d).__name__}")
        fields: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, value in d.items():
            if not isinstance(key, str):
                raise ValueError(f"profile keys must be str, got {key!r}")
            if key.startswith("source."):
                sources[key[len("source."):]] = value
            elif key in _KEYS:
                fields[key] = value
            else:
                raise ValueError(f"unknown profile field {key!r}; allowed: {sorted(_KEYS)}")
        missing = sorted({"name", *_NUMERIC} - fields.keys())
        if missing:
            raise ValueError(f"profile is missing required field(s): {', '.join(missing)}")
        return cls(**fields, sources=sources)


# ----------------------------------------------------------------------------- compute


def _time_once(fn: Callable[[], None], device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _timed_median(fn: Callable[[], None], budget: float, device: torch.device) -> float:
    """Median wall time of ``fn`` over repetitions filling ``budget`` seconds (>= 3 reps)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 10_000):
        times.append(_time_once(fn, device))
    return statistics.median(times)


def _scale_up(make: Callable[[int], Callable[[], None]], sizes: tuple[int, ...],
              target: float, device: torch.device) -> tuple[int, Callable[[], None]]:
    """Warm up and pick the first size whose run takes >= ``target`` seconds (else the last)."""
    for size in sizes:
        fn = make(size)
        _time_once(fn, device)  # warm-up: allocations, per-shape kernel selection / JIT
        if min(_time_once(fn, device), _time_once(fn, device)) >= target or size == sizes[-1]:
            break
    return size, fn


def measure_flops_detail(seconds: float = 1.0, dtype: torch.dtype = torch.float32,
                         threads: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """Time a square matmul and a 3x3 conv2d forward+backward; return both GFLOPS figures.

    FLOPs are counted analytically: ``2*n**3`` for the matmul and
    ``3 * 2*Cout*Cin*k*k*Hout*Wout*batch`` for the conv layer (forward, grad-input
    and grad-weight each cost one forward). Sizes grow (matmul 256..512, conv batch
    4..256) until one run is long enough to time; each figure is the median over
    repetitions filling about half of ``seconds``.
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 0 < seconds <= 600):
        raise ValueError(f"seconds must be in (0, 600], got {seconds!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 4096):
        raise ValueError(f"threads must be None or an int in [1, 4096], got {threads!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    target = min(0.03, seconds / 15)
    prev_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)

        def make_matmul(n: int) -> Callable[[], None]:
            a = torch.randn(n, n, generator=gen).to(dev, dtype)
            b = torch.randn(n, n, generator=gen).to(dev, dtype)
            return lambda: (a @ b, None)[1]

        chans, hw, k = 32, 16, 3

        def make_conv(batch: int) -> Callable[[], None]:
            x = torch.randn(batch, chans, hw, hw, generator=gen).to(dev, dtype).requires_grad_()
            w = (torch.randn(chans, chans, k, k, generator=gen) * 0.1).to(dev, dtype).requires_grad_()
            grad = torch.ones(batch, chans, hw, hw, device=dev, dtype=dtype)

            def step() -> None:
                x.grad = w.grad = None
                torch.nn.functional.conv2d(x, w, padding=k // 2).backward(grad)
            return step

        n, mm = _scale_up(make_matmul, (256, 384, 512), target, dev)
        mm_s = _timed_median(mm, seconds / 2, dev)
        batch, conv = _scale_up(make_conv, (4, 8, 16, 32, 64, 128, 256), target, dev)
        conv_s = _timed_median(conv, seconds / 2, dev)
    finally:
        torch.set_num_threads(prev_threads)
    conv_flops = 3 * 2 * chans * chans * k * k * hw * hw * batch
    return {"matmul_gflops": 2 * n**3 / mm_s / 1e9, "conv_train_gflops": conv_flops / conv_s / 1e9,
            "matmul_n": n, "conv_batch": batch, "conv_shape": f"{chans}->{chans}ch {k}x{k} {hw}x{hw}",
            "threads": threads if threads is not None else prev_threads,
            "dtype": str(dtype).removeprefix("torch."), "device": str(dev), "torch": torch.__version__}


def measure_flops(seconds: float = 1.0, dtype: torch.dtype = torch.float32,
                  threads: int | None = None, device: str = "cpu") -> float:
    """Sustained GFLOPS of conv2d forward+backward (the training-relevant figure).

    See :func:`measure_flops_detail` for the matmul figure and the method.
    """
    return float(measure_flops_detail(seconds, dtype, threads, device)["conv_train_gflops"])


# ----------------------------------------------------------------------------- network


def measure_bandwidth(transport: Any, topic: str, nbytes: int = 256 * 1024, rounds: int = 3,
                      timeout: float = 10.0) -> float:
    """Per-direction Mbit/s from MQTT round trips of ``nbytes`` to the broker and back.

    Subscribes to ``topic`` (use a private one: other messages received meanwhile are
    dropped), publishes a random payload and waits for its echo. Assuming symmetric
    links, throughput = ``2 * nbytes * 8 / rtt``; the median over ``rounds`` is returned.
    Raises TimeoutError if an echo does not arrive within ``timeout`` seconds.
    """
    if not isinstance(topic, str) or not topic or any(c in topic for c in "#+\0"):
        raise ValueError(f"topic must be a non-empty MQTT topic without wildcards, got {topic!r}")
    if not isinstance(nbytes, int) or not 1 <= nbytes <= 256 * 1024 * 1024:
        raise ValueError(f"nbytes must be an int in [1, 268435456], got {nbytes!r}")
    if not isinstance(rounds, int) or not 1 <= rounds <= 1000:
        raise ValueError(f"rounds must be an int in [1, 1000], got {rounds!r}")
    transport.subscribe(topic, qos=1)
    try:
        deadline = time.perf_counter() + timeout
        probes: set[bytes] = set()
        while True:  # small probes until one echoes: the subscription is active
            if time.perf_counter() >= deadline:
                raise TimeoutError(f"subscription to {topic!r} never echoed within {timeout} s")
            probes.add(probe := b"edgefl-bw-probe-" + os.urandom(8))
            transport.publish(topic, probe, qos=1, retain=False)
            if _echo(transport, topic, probes, min(0.25, deadline - time.perf_counter())):
                break
        rtts = []
        for _ in range(rounds):
            payload = os.urandom(16) + bytes(nbytes - 16) if nbytes > 16 else os.urandom(nbytes)
            t0 = time.perf_counter()
            transport.publish(topic, payload, qos=1, retain=False)
            if not _echo(transport, topic, {payload}, timeout):
                raise TimeoutError(f"no echo of {nbytes} bytes on {topic!r} within {timeout} s")
            rtts.append(time.perf_counter() - t0)
    finally:
        if hasattr(transport, "unsubscribe"):
            transport.unsubscribe(topic)
    return 2 * nbytes * 8 / max(statistics.median(rtts), 1e-9) / 1e6


def _echo(transport: Any, topic: str, payloads: set[bytes], timeout: float) -> bool:
    """Receive until one of ``payloads`` comes back on ``topic``; False on timeout."""
    deadline = time.perf_counter() + timeout
    while (left := deadline - time.perf_counter()) > 0:
        msg = transport.receive(timeout=left)
        if msg is None and getattr(transport, "connected", True) is False:
            raise ConnectionError("transport disconnected during the bandwidth measurement (with the shipped broker "
                                  "config a second connection with the same credentials, such as this device's "
                                  "running edgefl client, replaces it: stop the client first)")
        if msg is not None and msg.topic == topic and bytes(msg.payload) in payloads:
            return True
    return False


# ----------------------------------------------------------------------------- device


def _ram_mb() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))


def _cpu_count() -> int:
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return max(1, len(usable))


def measure_device(name: str = "this-device", seconds: float = 1.0, transport: Any = None,
                   topic: str | None = None, device: str = "auto") -> DeviceProfile:
    """Measure this machine into a :class:`DeviceProfile` (``measured=True``).

    ``device`` is the one training will use (``auto``: CUDA when torch sees a GPU, else the
    CPU; see :func:`edge_sdk.accelerator.resolve_device`). Bandwidth is
    measured via ``transport`` (on ``topic``, default ``edgefl/bw/<name>``); without a
    transport both link speeds are :data:`NOMINAL_MBPS` with source "not measured".
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"profile name {name!r} invalid: need 1-64 chars of [A-Za-z0-9_.-]")
    from edge_sdk.accelerator import resolve_device

    detail = measure_flops_detail(seconds=seconds, device=str(resolve_device(device)))
    sources = {
        "gflops": (f"measured: conv2d fwd+bwd {detail['conv_shape']} batch {detail['conv_batch']}, "
                   f"{detail['dtype']} on {detail['device']}, {detail['threads']} threads, "
                   f"torch {detail['torch']} (matmul {detail['matmul_gflops']:.1f} GFLOPS)"),
        "ram_mb": "measured: MemTotal from /proc/meminfo (or sysconf)",
        "cpu_count": "measured: CPUs usable by this process (sched_getaffinity)",
        "arch": "measured: platform.machine()",
    }
    if transport is not None:
        mbps = min(measure_bandwidth(transport, topic or f"edgefl/bw/{name}"), 1e6)
        text = "measured: MQTT round trip via broker, per-direction assuming symmetric link"
    else:
        mbps = NOMINAL_MBPS
        text = f"not measured: nominal default {NOMINAL_MBPS:g} Mbit/s"
    sources["uplink_mbps"] = sources["downlink_mbps"] = text
    return DeviceProfile(name=name, gflops=detail["conv_train_gflops"], ram_mb=_ram_mb(),
                         cpu_count=_cpu_count(), uplink_mbps=mbps, downlink_mbps=mbps,
                         arch=platform.machine(), measured=True, sources=sources)


# ----------------------------------------------------------------------------- files


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise RuntimeError("reading TOML profiles on Python 3.10 needs 'pip install tomli'") from exc
    return tomllib.loads(text)


def _flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``[field] value=.. source=..`` tables into the flat ``to_dict`` layout."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, Mapping):
            if "value" not in value or set(value) - {"value", "source"}:
                raise ValueError(f"table [{key}] must hold exactly 'value' and optional 'source'")
            flat[key] = value["value"]
            if "source" in value:
                flat[f"source.{key}"] = value["source"]
        else:
            flat[key] = value
    return flat


def profile_to_toml(profile: DeviceProfile) -> str:
    """Render ``profile`` in the shipped ``profiles/*.toml`` layout."""
    lines = [f"name = {json.dumps(profile.name)}", f"measured = {json.dumps(profile.measured)}"]
    for key in ("arch", *_NUMERIC):  # JSON scalars are valid TOML values
        lines += ["", f"[{key}]", f"value = {json.dumps(getattr(profile, key))}"]
        if key in profile.sources:
            lines.append(f"source = {json.dumps(profile.sources[key])}")
    return "\n".join(lines) + "\n"


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON (flat ``to_dict``), or as TOML if ``path`` ends in .toml."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        path.write_text(profile_to_toml(profile), encoding="utf-8")
    else:
        path.write_text(json.dumps(profile.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def available_profiles() -> list[str]:
    """Names of the profiles shipped in the ``profiles`` package."""
    root = importlib.resources.files("profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """Load a shipped profile by bare name, or a ``.toml`` / ``.json`` file by path."""
    text_name = str(name_or_path)
    suffix = Path(text_name).suffix.lower()
    if suffix in (".toml", ".json"):
        text = Path(text_name).read_text(encoding="utf-8")
        where = text_name
    else:
        if not _NAME_RE.match(text_name):
            raise ValueError(f"{text_name!r} is neither a profile name nor a .toml/.json path")
        res = importlib.resources.files("profiles") / f"{text_name}.toml"
        if not res.is_file():
            raise ValueError(f"unknown profile {text_name!r}; available: {available_profiles()}")
        text, suffix, where = res.read_text(encoding="utf-8"), ".toml", f"profiles/{text_name}.toml"
    try:
        doc = _toml_loads(text) if suffix == ".toml" else json.loads(text)
        if not isinstance(doc, Mapping):
            raise ValueError("top level must be a table/object")
        return DeviceProfile.from_dict(_flatten(doc))
    except ValueError as exc:  # includes JSON/TOML decode errors
        raise ValueError(f"invalid profile {where}: {exc}") from exc
