"""Device profiles: what a device can compute and transfer, measured or looked up.

A :class:`DeviceProfile` holds sustained float32 training throughput (GFLOPS),
RAM, CPU count and link speeds, each number with a ``sources`` entry saying
where it came from. Profiles are measured on the device (:func:`measure_device`)
or loaded from the shipped ``profiles/*.toml`` files (:func:`load_profile`).

A measured GFLOPS figure is a high quantile of several short timed trials, and comes
with a :class:`MeasureQuality`: the trials' spread, the load average, the CPU clock and
the CPU time the rest of the machine used meanwhile, and a ``busy`` verdict with its
reason (:func:`judge_measurement`). A device that measured itself while busy can
measure again when idle (``edge_sdk.client``: ``remeasure_every_s``).
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from edge_sdk.availability import OnlineShare
from edge_sdk.command_defaults import DEVICE_COMMANDS

__all__ = ["DeviceProfile", "MeasureQuality", "NOMINAL_MBPS", "QUANTILE", "REPORT_CHANGE", "TRIALS",
           "CpuWatch", "available_profiles", "changed_enough", "high_quantile", "judge_measurement",
           "load_profile", "measure_bandwidth", "measure_device", "measure_flops_detail",
           "profile_to_toml", "read_cpu_mhz", "save_profile", "with_measurement"]

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


#: MeasureQuality's optional numbers: field -> (low, high), both inclusive
_QUALITY_NUMBERS: dict[str, tuple[float, float]] = {
    "spread": (1.0, 1e6),
    "median_gflops": (0.0, 1e6),
    "load_avg": (0.0, 1e6),
    "others_cpu": (0.0, 4096.0),
    "cpu_mhz": (0.0, 1e6),
    "max_mhz": (0.0, 1e6),
}
_QUALITY_KEYS = frozenset(["trials", "busy", "reason", *_QUALITY_NUMBERS])
MAX_REASON_LEN = 300


@dataclass(frozen=True)
class MeasureQuality:
    """How far to trust a measured GFLOPS figure (see :func:`measure_flops_detail`); None: not known."""

    trials: int  # timed trials the figure is the high quantile of
    spread: float = 1.0  # fastest trial / slowest trial (1.0: all alike)
    median_gflops: float | None = None  # the median trial
    load_avg: float | None = None  # 1-minute load average just before measuring
    others_cpu: float | None = None  # CPUs' worth of time the rest of the machine used while it ran
    cpu_mhz: float | None = None  # CPU clock after the trials
    max_mhz: float | None = None  # the CPU's maximum clock, where the kernel says
    busy: bool = False  # the device looked busy: the figure is likely too low
    reason: str = ""  # why it looked busy

    def __post_init__(self) -> None:
        if type(self.trials) is not int or not 0 <= self.trials <= 100_000:
            raise ValueError(f"quality field 'trials' must be an int in [0, 100000], got {self.trials!r}")
        for key, (low, high) in _QUALITY_NUMBERS.items():
            value = getattr(self, key)
            if value is None and key != "spread":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise ValueError(f"quality field {key!r} must be a finite number in [{low:g}, {high:g}], "
                                 f"got {value!r}")
            object.__setattr__(self, key, float(value))
        if not isinstance(self.busy, bool):
            raise ValueError(f"quality field 'busy' must be a bool, got {self.busy!r}")
        if not isinstance(self.reason, str) or len(self.reason) > MAX_REASON_LEN:
            raise ValueError(f"quality field 'reason' must be a str of <= {MAX_REASON_LEN} chars")

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of the known fields (None ones left out)."""
        return {k: v for k, v in ((k, getattr(self, k)) for k in
                                  ("trials", *_QUALITY_NUMBERS, "busy", "reason")) if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasureQuality:
        unknown = sorted(set(d) - _QUALITY_KEYS)
        if unknown:
            raise ValueError(f"unknown quality field(s) {unknown}; allowed: {sorted(_QUALITY_KEYS)}")
        if "trials" not in d:
            raise ValueError("quality is missing required field 'trials'")
        return cls(**d)

    def summary(self) -> str:
        """One line: the trials, their spread, and what the machine did meanwhile."""
        parts = [f"p{QUANTILE * 100:.0f} of {self.trials} trials, spread {self.spread:.2f}x"]
        if self.load_avg is not None:
            parts.append(f"load average {self.load_avg:.2f}")
        if self.others_cpu is not None:
            parts.append(f"other processes {self.others_cpu:.2f} CPUs")
        if self.cpu_mhz is not None:
            parts.append(f"{self.cpu_mhz:.0f} MHz" + (f" of {self.max_mhz:.0f}" if self.max_mhz else ""))
        text = ", ".join(parts)
        return f"{text}; BUSY: {self.reason}" if self.busy else text


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
    #: how the GFLOPS figure was measured (None: looked up, or an old profile file); not part of
    #: equality, and not sent in a registration (old coordinators refuse unknown profile fields)
    quality: MeasureQuality | None = field(default=None, compare=False)
    #: when a device of this class is online (profile files only, like ``quality``; a simulation's
    #: ``--offline profiles``); None: always
    availability: OnlineShare | None = field(default=None, compare=False)

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
        if self.quality is not None and not isinstance(self.quality, MeasureQuality):
            raise ValueError(f"profile 'quality' must be a MeasureQuality or None, got {type(self.quality).__name__}")
        if self.availability is not None and not isinstance(self.availability, OnlineShare):
            raise ValueError("profile 'availability' must be an OnlineShare or None, "
                             f"got {type(self.availability).__name__}")

    def to_dict(self, quality: bool = False) -> dict[str, Any]:
        """Flat dict (str -> int/float/str/bool); sources become ``source.<field>`` keys and, with
        ``quality`` (profile files; never a registration), the measurement's ``quality.<field>`` and the
        class's ``availability.<field>``."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ("name", *_NUMERIC, "arch", "measured")}
        out.update((f"source.{k}", text) for k, text in sorted(self.sources.items()))
        if quality and self.quality is not None:
            out.update((f"quality.{k}", v) for k, v in self.quality.to_dict().items())
        if quality and self.availability is not None:
            out.update((f"availability.{k}", v) for k, v in self.availability.to_dict().items())
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceProfile:
        """Strictly validate a flat dict (as made by :meth:`to_dict`) into a profile."""
        if not isinstance(d, Mapping):
            raise ValueError(f"profile must be a mapping, got {type(d).__name__}")
        fields: dict[str, Any] = {}
        sources: dict[str, str] = {}
        quality: dict[str, Any] = {}
        availability: dict[str, Any] = {}
        for key, value in d.items():
            if not isinstance(key, str):
                raise ValueError(f"profile keys must be str, got {key!r}")
            if key.startswith("source."):
                sources[key[len("source."):]] = value
            elif key.startswith("quality."):
                quality[key[len("quality."):]] = value
            elif key.startswith("availability."):
                availability[key[len("availability."):]] = value
            elif key in _KEYS:
                fields[key] = value
            else:
                raise ValueError(f"unknown profile field {key!r}; allowed: {sorted(_KEYS)}")
        missing = sorted({"name", *_NUMERIC} - fields.keys())
        if missing:
            raise ValueError(f"profile is missing required field(s): {', '.join(missing)}")
        return cls(**fields, sources=sources, quality=MeasureQuality.from_dict(quality) if quality else None,
                   availability=OnlineShare.from_dict(availability) if availability else None)


# ----------------------------------------------------------------------------- compute

#: Timed trials of the conv workload (the matmul gets half as many); the figure is their
#: QUANTILE throughput quantile: interference only ever slows a trial down, so the fast end
#: estimates what the device does undisturbed, and the 90th percentile rather than the best
#: keeps one lucky trial (a boost clock, a timer step) from setting it alone.
TRIALS = 10
QUANTILE = 0.9
#: A new figure is reported (`edge_sdk.client`) when it differs by more than this share.
REPORT_CHANGE = 0.25
#: The measurement looked busy (judge_measurement) when the rest of the machine used more than
#: BUSY_OTHERS_SHARE of this process' CPUs, and at least BUSY_OTHERS_MIN CPUs, while it ran ...
BUSY_OTHERS_SHARE = 0.15
BUSY_OTHERS_MIN = 0.25
#: ... or the fastest trial was BUSY_SPREAD times the slowest, or the CPU clock was below
#: LOW_CLOCK of its maximum; the 1-minute load average per CPU counts (above BUSY_LOAD_PER_CPU)
#: only where /proc/stat cannot be read (it lags by a minute, and counts waiting on disks).
BUSY_SPREAD = 1.5
LOW_CLOCK = 0.6
BUSY_LOAD_PER_CPU = 0.75


def high_quantile(values: Any, q: float = QUANTILE) -> float:
    """The ``q`` quantile of ``values`` (linear between order statistics, numpy's default)."""
    xs = sorted(float(v) for v in values)
    if not xs or not all(math.isfinite(x) for x in xs):
        raise ValueError("high_quantile needs at least one finite value")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def judge_measurement(trial_gflops: Any, cpus: int, others_cpu: float | None = None,
                      load_avg: float | None = None, cpu_mhz: float | None = None,
                      max_mhz: float | None = None, on_cpu: bool = True) -> tuple[bool, str]:
    """``(busy, reason)`` of a measurement: did the device look busy while it ran? (pure)

    ``others_cpu``: CPUs' worth of time the rest of the machine used meanwhile (None: unknown,
    then the 1-minute ``load_avg`` from before stands in). ``on_cpu`` False (a GPU was
    measured): only the trials' spread counts.
    """
    values = [float(v) for v in trial_gflops]
    if not values or min(values) <= 0:
        raise ValueError("judge_measurement needs positive trial figures")
    reasons = []
    if on_cpu and others_cpu is not None:
        if others_cpu > max(BUSY_OTHERS_MIN, BUSY_OTHERS_SHARE * cpus):
            reasons.append(f"other processes used {others_cpu:.2f} of {cpus} CPUs while it ran")
    elif on_cpu and load_avg is not None and load_avg > BUSY_LOAD_PER_CPU * cpus:
        reasons.append(f"load average {load_avg:.2f} on {cpus} CPUs before it ran")
    spread = max(values) / min(values)
    if spread > BUSY_SPREAD:
        reasons.append(f"its trials varied {spread:.1f}x")
    if on_cpu and cpu_mhz and max_mhz and cpu_mhz < LOW_CLOCK * max_mhz:
        reasons.append(f"the CPU ran at {cpu_mhz:.0f} of {max_mhz:.0f} MHz (throttled or power saving)")
    return bool(reasons), "; ".join(reasons)


def _usable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _read_cpu_busy_s(cpus: list[int], root: str | Path = "/") -> float | None:
    """Busy seconds since boot of ``cpus``, from their /proc/stat lines (all but idle and iowait)."""
    try:
        text = Path(root, "proc/stat").read_text(encoding="ascii", errors="replace")
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    except (OSError, ValueError):
        return None
    wanted, busy, found = set(cpus), 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in wanted):
            continue
        try:
            values = [int(v) for v in rest.split()[:8]]
        except ValueError:
            return None
        values += [0] * (8 - len(values))  # user nice system idle iowait irq softirq steal
        busy += sum(values) - values[3] - values[4]
        found += 1
    return busy / hz if found and hz > 0 else None


class CpuWatch:
    """How much CPU the rest of the machine used from its creation to :meth:`others`:
    the busy time /proc/stat counts on this process' CPUs, less this process' own CPU time."""

    def __init__(self, root: str | Path = "/", clock: Callable[[], float] = time.monotonic,
                 own: Callable[[], float] = time.process_time, cpus: list[int] | None = None) -> None:
        self.root, self._clock, self._own = root, clock, own
        self.cpus = _usable_cpus() if cpus is None else list(cpus)
        self._start = (clock(), _read_cpu_busy_s(self.cpus, root), own())

    def others(self) -> float | None:
        """CPUs' worth of time other processes used since the start (None: /proc/stat unreadable)."""
        t0, busy0, own0 = self._start
        now, busy, own = self._clock(), _read_cpu_busy_s(self.cpus, self.root), self._own()
        if busy0 is None or busy is None or now - t0 <= 0:
            return None
        return min(float(len(self.cpus)), max(0.0, (busy - busy0 - (own - own0)) / (now - t0)))


def _load_avg() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _read_number(path: Path) -> float | None:
    try:
        value = float(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def read_cpu_mhz(cpu: int = 0, root: str | Path = "/") -> tuple[float | None, float | None]:
    """``(current, maximum)`` clock of ``cpu`` in MHz: cpufreq's scaling_cur_freq and
    cpuinfo_max_freq, else the current one from /proc/cpuinfo (no maximum); None where unreadable."""
    base = Path(root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq")
    cur, top = _read_number(base / "scaling_cur_freq"), _read_number(base / "cpuinfo_max_freq")
    cur_mhz, max_mhz = (cur / 1000 if cur else None), (top / 1000 if top else None)
    if cur_mhz is None:
        try:
            text = Path(root, "proc/cpuinfo").read_text(encoding="ascii", errors="replace")
        except OSError:
            text = ""
        processor, first = None, None
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            try:
                if key == "processor":
                    processor = int(value)
                elif key == "cpu mhz":
                    mhz = float(value)
                    if math.isfinite(mhz) and mhz > 0:
                        first = mhz if first is None else first
                        if processor == cpu:
                            cur_mhz = mhz
                            break
            except ValueError:
                continue
        cur_mhz = cur_mhz if cur_mhz is not None else first
    return cur_mhz, max_mhz


def _time_once(fn: Callable[[], None], device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _pick_size(make: Callable[[int], Callable[[], None]], flops: Callable[[int], float], sizes: tuple[int, ...],
               target: float, cap: float, device: torch.device,
               limit_s: float = math.inf) -> tuple[int, Callable[[], None], float]:
    """Warm up and grow the workload; returns ``(size, fn, seconds per run)``.

    A run's time is the median of three after a warm-up run. Grows until a run takes ``target``
    seconds *and* gains less than 25 % throughput over the size before, or takes ``cap`` seconds,
    or the timed runs (not the warm-ups) have taken ``limit_s`` together. (The old rule, the first
    size whose faster of two runs took ``target``, picked a tiny conv batch on a busy multi-threaded
    CPU, where a run is mostly threads waiting for a descheduled one: 0.6 GFLOPS where batch 256
    made 20.)
    """
    spent, prev_rate = 0.0, None
    for size in sizes:
        fn = make(size)
        _time_once(fn, device)  # warm-up: allocations, per-shape kernel selection / JIT (not counted)
        runs = [_time_once(fn, device) for _ in range(3)]
        spent += sum(runs)
        seconds = max(statistics.median(runs), 1e-9)
        rate = flops(size) / seconds
        if size == sizes[-1] or seconds >= cap or spent >= limit_s or (
                seconds >= target and prev_rate is not None and rate < 1.25 * prev_rate):
            return size, fn, seconds
        prev_rate = rate
    raise ValueError("no sizes")  # pragma: no cover - sizes is never empty


def _trials(fn: Callable[[], None], flops: float, budget: float, trials: int, run_s: float,
            device: torch.device) -> list[float]:
    """GFLOPS of each of up to ``trials`` timed trials filling ``budget`` seconds: at least 3
    trials of a run each; no new trial starts once ``budget`` has passed (a busy machine's runs
    take longer than the size pick's: the measurement still ends near its budget)."""
    count = max(3, min(trials, int(budget / max(run_s, 1e-9))))
    per = budget / count
    out: list[float] = []
    begin = time.perf_counter()
    while len(out) < count and (len(out) < 3 or time.perf_counter() - begin < budget):
        runs, start = 0, time.perf_counter()
        while True:
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= per or runs >= 100_000:
                break
        out.append(runs * flops / max(elapsed, 1e-12) / 1e9)
    return out


def measure_flops_detail(seconds: float = 1.0, dtype: torch.dtype = torch.float32,
                         threads: int | None = None, device: str = "cpu", trials: int = TRIALS) -> dict[str, Any]:
    """Time a square matmul and a 3x3 conv2d forward+backward; return both GFLOPS figures,
    the conv figure's trials and a :class:`MeasureQuality` (``quality``).

    FLOPs are counted analytically: ``2*n**3`` for the matmul and
    ``3 * 2*Cout*Cin*k*k*Hout*Wout*batch`` for the conv layer (forward, grad-input and
    grad-weight each cost one forward). After a warm-up the sizes grow (matmul 256..512, conv
    batch 4..256) until one run is long enough to time and a larger one no longer pays off
    (:func:`_pick_size`); then up to ``trials`` short trials of the conv (half as many of the matmul)
    fill ``seconds`` (3/4 of it the conv's), and each figure is their :data:`QUANTILE`
    throughput quantile. Meanwhile the 1-minute load average, the CPU time the rest of the
    machine used and, afterwards, the CPU clock are noted, and :func:`judge_measurement` says
    whether the device looked busy. On a busy CPU with several threads (``threads`` not given)
    the conv is measured once more on one thread (half the budget), and the larger figure is
    kept: several threads waiting for a descheduled one can make a CPU that others use look tens
    of times slower than it is, while one thread is slowed only by its share. The whole takes
    about ``seconds`` plus the warm-up (half as much again when busy with several threads).
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 0 < seconds <= 600):
        raise ValueError(f"seconds must be in (0, 600], got {seconds!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 4096):
        raise ValueError(f"threads must be None or an int in [1, 4096], got {threads!r}")
    if type(trials) is not int or not 3 <= trials <= 1000:
        raise ValueError(f"trials must be an int in [3, 1000], got {trials!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    target = min(0.03, seconds / 15)
    mm_budget, conv_budget = seconds / 4, seconds * 3 / 4
    load_avg = _load_avg()
    watch = CpuWatch()
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

        def mm_flops(n: int) -> float:
            return 2.0 * n**3

        def conv_flops(batch: int) -> float:
            return 3.0 * 2 * chans * chans * k * k * hw * hw * batch

        n, mm, mm_s = _pick_size(make_matmul, mm_flops, (256, 384, 512), target, max(target, mm_budget / 3), dev,
                                 limit_s=mm_budget)
        mm_trials = _trials(mm, mm_flops(n), mm_budget, max(3, trials // 2), mm_s, dev)
        del mm
        batch, conv, conv_s = _pick_size(make_conv, conv_flops, (4, 8, 16, 32, 64, 128, 256), target,
                                         max(target, conv_budget / 4), dev, limit_s=conv_budget / 2)
        conv_trials = _trials(conv, conv_flops(batch), conv_budget, trials, conv_s, dev)
        used_threads = torch.get_num_threads()
        note = ""
        busy, _ = judge_measurement(conv_trials, len(watch.cpus), watch.others(), load_avg, on_cpu=dev.type == "cpu")
        if busy and threads is None and dev.type == "cpu" and used_threads > 1:
            # threads that wait for a descheduled one make a busy CPU look tens of times slower than
            # it is; one thread is slowed only by its share: the device does at least that much
            torch.set_num_threads(1)
            batch1, conv1, conv1_s = _pick_size(make_conv, conv_flops, (4, 8, 16, 32, 64, 128, 256), target,
                                                max(target, conv_budget / 4), dev, limit_s=conv_budget / 4)
            one = _trials(conv1, conv_flops(batch1), conv_budget / 2, trials, conv1_s, dev)
            if high_quantile(one) > high_quantile(conv_trials):
                note = (f"; {used_threads} threads made {high_quantile(conv_trials):.3g} GFLOPS, one thread "
                        f"{high_quantile(one):.3g}: the figure is one thread's")
                conv_trials, batch, used_threads = one, batch1, 1
    finally:
        torch.set_num_threads(prev_threads)
    others = watch.others()
    cpu_mhz, max_mhz = read_cpu_mhz(watch.cpus[0] if watch.cpus else 0)
    busy, reason = judge_measurement(conv_trials, len(watch.cpus), others, load_avg, cpu_mhz, max_mhz,
                                     on_cpu=dev.type == "cpu")
    reason += note if busy else ""
    quality = MeasureQuality(
        trials=len(conv_trials), spread=min(1e6, max(conv_trials) / min(conv_trials)),
        median_gflops=min(1e6, statistics.median(conv_trials)),
        load_avg=None if load_avg is None else min(load_avg, 1e6), others_cpu=others,
        cpu_mhz=cpu_mhz if cpu_mhz is None or cpu_mhz <= 1e6 else None,
        max_mhz=max_mhz if max_mhz is None or max_mhz <= 1e6 else None,
        busy=busy, reason=reason[:MAX_REASON_LEN])
    return {"matmul_gflops": high_quantile(mm_trials), "conv_train_gflops": high_quantile(conv_trials),
            "matmul_n": n, "conv_batch": batch, "conv_shape": f"{chans}->{chans}ch {k}x{k} {hw}x{hw}",
            "threads": used_threads, "dtype": str(dtype).removeprefix("torch."), "device": str(dev),
            "torch": torch.__version__, "trial_gflops": conv_trials, "quality": quality}


def changed_enough(reported: float, measured: float, share: float = REPORT_CHANGE) -> bool:
    """Whether ``measured`` GFLOPS differ from the ``reported`` figure by more than ``share`` of it."""
    if not (reported > 0 and measured > 0 and math.isfinite(reported) and math.isfinite(measured)):
        raise ValueError(f"GFLOPS figures must be finite and > 0, got {reported!r} and {measured!r}")
    return abs(measured - reported) > share * reported


def _flops_source(detail: Mapping[str, Any]) -> str:
    quality: MeasureQuality = detail["quality"]
    text = (f"measured: conv2d fwd+bwd {detail['conv_shape']} batch {detail['conv_batch']}, "
            f"{detail['dtype']} on {detail['device']}, {detail['threads']} threads, "
            f"torch {detail['torch']} (matmul {detail['matmul_gflops']:.1f} GFLOPS); {quality.summary()}")
    return text[:_MAX_SOURCE_LEN]


def with_measurement(profile: DeviceProfile, detail: Mapping[str, Any]) -> DeviceProfile:
    """``profile`` with the GFLOPS figure, its source and its quality from ``measure_flops_detail``."""
    return replace(profile, gflops=min(float(detail["conv_train_gflops"]), 1e6), measured=True,
                   sources={**profile.sources, "gflops": _flops_source(detail)}, quality=detail["quality"])


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


def measure_device(name: str = DEVICE_COMMANDS.profile_name, seconds: float = DEVICE_COMMANDS.measure_seconds,
                   transport: Any = None,
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
        "gflops": _flops_source(detail),
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
    return DeviceProfile(name=name, gflops=min(float(detail["conv_train_gflops"]), 1e6), ram_mb=_ram_mb(),
                         cpu_count=_cpu_count(), uplink_mbps=mbps, downlink_mbps=mbps,
                         arch=platform.machine(), measured=True, sources=sources, quality=detail["quality"])


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
        if key in ("quality", "availability") and isinstance(value, Mapping):  # plain keys (see profile_to_toml)
            flat.update((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, Mapping):
            if "value" not in value or set(value) - {"value", "source"}:
                raise ValueError(f"table [{key}] must hold exactly 'value' and optional 'source'")
            flat[key] = value["value"]
            if "source" in value:
                flat[f"source.{key}"] = value["source"]
        else:
            flat[key] = value
    return flat


def profile_to_toml(profile: DeviceProfile) -> str:
    """Render ``profile`` in the shipped ``profiles/*.toml`` layout (plus a ``[quality]`` table of
    plain keys when it was measured: files written before it had none, and still load)."""
    lines = [f"name = {json.dumps(profile.name)}", f"measured = {json.dumps(profile.measured)}"]
    for key in ("arch", *_NUMERIC):  # JSON scalars are valid TOML values
        lines += ["", f"[{key}]", f"value = {json.dumps(getattr(profile, key))}"]
        if key in profile.sources:
            lines.append(f"source = {json.dumps(profile.sources[key])}")
    if profile.quality is not None:  # how the gflops figure was measured (files before it have none)
        lines += ["", "[quality]"] + [f"{k} = {json.dumps(v)}" for k, v in profile.quality.to_dict().items()]
    if profile.availability is not None:  # when a device of the class is online (a simulation's --offline profiles)
        lines += ["", "[availability]"] + [f"{k} = {json.dumps(v)}" for k, v in profile.availability.to_dict().items()]
    return "\n".join(lines) + "\n"


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON (flat ``to_dict``), or as TOML if ``path`` ends in .toml."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        path.write_text(profile_to_toml(profile), encoding="utf-8")
    else:
        path.write_text(json.dumps(profile.to_dict(quality=True), indent=2) + "\n", encoding="utf-8")
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
