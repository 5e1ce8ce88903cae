"""Chaos soak (issue 18): a long federated job on real mosquitto with real training, while a
scheduler injects faults at random, again and again; reports what each kind of fault cost.

    python bench/soak.py --minutes 30 --out runs/soak

Everything is a real process: mosquitto, an `edgefl coordinator` (checkpointing every round),
and `--devices` `edgefl client` processes that reach the broker through the TCP fault proxy
(tests/support/faultproxy.py), which throughout the job duplicates, delays (so reorders) and now and
then drops chunks in both directions. Every `--every` seconds on average (exponential gaps) the
scheduler injects one of:

* ``broker_restart``  mosquitto stopped, started again on the same port 1–5 s later
* ``device_kill``     one device process SIGKILLed, started again 2–8 s later
* ``connection_drop`` every proxied connection cut at once (devices reconnect)
* ``stall``           the chunks of both directions held in the proxy 2–10 s, then released
* ``coordinator_kill`` the coordinator SIGKILLed and started again 2–5 s later (it resumes from
  its checkpoint)

Per fault kind it reports the count, rounds lost (a round that aggregated fewer updates than
the quorum of the devices running), updates lost (devices running through a whole round whose
update it did not aggregate), and seconds lost (a round's time above the median of fault-free
rounds, shared among the faults injected during it; for a coordinator kill, from the last round
before it to the first after it). Also: the coordinator's rejections by code (``duplicate`` and
``wrong_round`` are updates refused, not aggregated), proxy counters, and coordinator and device
RSS over time (growth of the coordinator after warm-up, per coordinator process).
Writes ``soak.json`` and prints the table; bounded by ``--minutes``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support/faultproxy.py

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker  # noqa: E402
from tests.support.faultproxy import FaultPolicy, FaultProxy, edgefl_chunks  # noqa: E402

EDGEFL = str(Path(sys.executable).parent / "edgefl")
KINDS = ("broker_restart", "device_kill", "connection_drop", "stall", "coordinator_kill")
ROUND_LINE = re.compile(r"round (\d+)/\d+: .*?\s(\d+) devices .*\(([\d.]+) s here\)")
REJECTED = re.compile(r"rejected input from (\S+): (\w+):")
CHUNK_SIZE = 16384  # plans and updates of the MLP travel as ~10 chunks each way
QUORUM = 0.5


@dataclass
class Fault:
    t: float
    kind: str
    detail: str
    rounds: list[int] = field(default_factory=list)  # the rounds it overlapped
    seconds_lost: float = 0.0


@dataclass
class RoundSeen:
    round: int
    t_end: float
    updates: int
    host_s: float
    running: int  # device processes running through the whole round
    life: int  # which coordinator process


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.broker = EmbeddedBroker(BrokerConfig(prefer="mosquitto"))
        self.faults: list[Fault] = []
        self.rounds: list[RoundSeen] = []
        self.rejections: dict[str, int] = {}
        self.rss: list[dict] = []
        self.life = 0
        self.coordinator: subprocess.Popen | None = None
        self.devices: dict[str, subprocess.Popen] = {}
        self.down_since: dict[str, float] = {}  # device -> when it was killed (until restarted)
        self.killed_in: dict[str, list[tuple[float, float]]] = {}  # device -> [(killed, restarted)]
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the job --------------------------------------------------------------
    def write_configs(self) -> None:
        a, url = self.args, self.broker.url
        job = f"soak{a.seed}"
        (self.out / "coordinator.toml").write_text(f"""
method = "fedavg"
job = "{job}"
model = "mlp"
dataset = "mnist-sample"
out = "{self.out / 'report'}"
[broker]
url = "{url}"
[federation]
rounds = 100000
min_devices = {a.devices}
quorum = {QUORUM}
round_deadline_s = 300
register_timeout_s = 600
checkpoint_dir = "{self.out / 'checkpoint'}"
publish = false
[train]
epochs = 1
batch_size = 32
lr = 0.05
[link]
chunk_size = {CHUNK_SIZE}
reassembly_timeout_s = 5
""")
        for i in range(a.devices):
            (self.out / f"dev{i}.toml").write_text(f"""
device_id = "dev{i}"
job = "{job}"
state_dir = "{self.out / f'dev{i}'}"
heartbeat_s = 30
[broker]
url = "{self.proxy.url}"
[device]
profile = "raspberry-pi-4b"
[data]
dataset = "mnist-sample"
partition = "iid"
shard = {i}
shards = {a.devices}
[link]
chunk_size = {CHUNK_SIZE}
reassembly_timeout_s = 5
""")

    def start_coordinator(self) -> None:
        self.life += 1
        log = open(self.out / f"coordinator-{self.life}.log", "w")  # noqa: SIM115 - the process owns it
        self.coordinator = subprocess.Popen(
            [EDGEFL, "coordinator", "--config", str(self.out / "coordinator.toml")],
            stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._read_coordinator, args=(self.coordinator, self.life), daemon=True).start()
        threading.Thread(target=self._read_log, args=(self.out / f"coordinator-{self.life}.log", self.coordinator),
                         daemon=True).start()

    def _read_coordinator(self, proc: subprocess.Popen, life: int) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if m := ROUND_LINE.search(line):
                t = self.now()
                with self._lock:
                    start = self.rounds[-1].t_end if self.rounds else 0.0
                    running = sum(1 for d in self.devices if not self._was_down(d, start, t))
                    self.rounds.append(RoundSeen(int(m[1]) - 1, t, int(m[2]), float(m[3]), running, life))

    def _read_log(self, path: Path, proc: subprocess.Popen) -> None:
        """Count the coordinator's rejections by code, following its log until it exits."""
        with open(path) as f:
            while True:
                line = f.readline()
                if not line:
                    if proc.poll() is not None:
                        return
                    time.sleep(0.5)
                    continue
                if m := REJECTED.search(line):
                    with self._lock:
                        self.rejections[m[2]] = self.rejections.get(m[2], 0) + 1

    def _was_down(self, device: str, start: float, end: float) -> bool:
        spans = list(self.killed_in.get(device, []))
        if device in self.down_since:
            spans.append((self.down_since[device], math.inf))
        return any(k < end and r > start for k, r in spans)

    def start_device(self, i: int) -> None:
        name = f"dev{i}"
        log = open(self.out / f"{name}.log", "a")  # noqa: SIM115
        self.devices[name] = subprocess.Popen(
            [EDGEFL, "client", "--config", str(self.out / f"{name}.toml")],
            stdout=log, stderr=subprocess.STDOUT)

    # -- faults ---------------------------------------------------------------
    def inject(self, kind: str) -> str:
        r = self.rng
        if kind == "broker_restart":
            pause = r.uniform(1, 5)
            self.broker.restart(pause_s=pause)
            return f"down {pause:.1f} s"
        if kind == "device_kill":
            name = r.choice(sorted(self.devices))
            proc = self.devices[name]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed = self.now()
            self.down_since[name] = killed
            pause = r.uniform(2, 8)
            time.sleep(pause)
            self.start_device(int(name[3:]))
            with self._lock:
                self.killed_in.setdefault(name, []).append((killed, self.now()))
                del self.down_since[name]
            return f"{name}, restarted after {pause:.1f} s"
        if kind == "connection_drop":
            self.proxy.drop_connections()
            return "all device connections"
        if kind == "stall":
            hold = r.uniform(2, 10)
            self.proxy.hold(("up", "down"))
            time.sleep(hold)
            self.proxy.release()
            return f"both directions held {hold:.1f} s"
        assert kind == "coordinator_kill"
        assert self.coordinator is not None
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()
        pause = r.uniform(2, 5)
        time.sleep(pause)
        self.start_coordinator()
        return f"restarted after {pause:.1f} s"

    def sample_rss(self) -> None:
        sample = {"t": round(self.now(), 1), "life": self.life,
                  "coordinator": rss_mb(self.coordinator.pid) if self.coordinator else None,
                  "devices": {n: rss_mb(p.pid) for n, p in self.devices.items()}}
        self.rss.append(sample)

    # -- run --------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        self.broker.start()
        up = FaultPolicy(select=edgefl_chunks("up"), duplicate=0.05, max_delay_s=0.05, seed=a.seed)
        down = FaultPolicy(select=edgefl_chunks("down"), duplicate=0.05, max_delay_s=0.05, drop=a.drop, seed=a.seed + 1)
        self.proxy = FaultProxy(self.broker.port, up, down_policy=down).start()
        self.write_configs()
        self.start_coordinator()
        for i in range(a.devices):
            self.start_device(i)
        end = a.minutes * 60
        next_fault = a.warmup
        next_rss = 0.0
        try:
            while self.now() < end:
                if self.now() >= next_rss:
                    self.sample_rss()
                    next_rss = self.now() + 5
                if self.now() >= next_fault:
                    kind = self.rng.choice(KINDS)
                    t = self.now()
                    detail = self.inject(kind)
                    self.faults.append(Fault(round(t, 1), kind, detail))
                    print(f"{t:7.1f} s  {kind}: {detail}", flush=True)
                    next_fault = self.now() + self.rng.expovariate(1 / a.every)
                time.sleep(0.2)
            time.sleep(a.settle)  # let the round in flight finish
        finally:
            if self.coordinator is not None:
                self.coordinator.terminate()
                self.coordinator.wait(30)
            for proc in self.devices.values():
                proc.terminate()
            for proc in self.devices.values():
                proc.wait(30)
            self.proxy.stop()
            self.broker.stop()
        return self.summary()

    # -- results --------------------------------------------------------------
    def summary(self) -> dict:
        rounds, faults = self.rounds, self.faults
        starts = [0.0] + [r.t_end for r in rounds[:-1]]
        overlapping = [[f for f in faults if start <= f.t < r.t_end] for start, r in zip(starts, rounds)]
        for r, hit in zip(rounds, overlapping):
            for f in hit:
                f.rounds.append(r.round)
        clean = [r.host_s for r, hit in zip(rounds, overlapping) if not hit]
        baseline = statistics.median(clean) if clean else 0.0
        per_kind = {k: {"count": 0, "rounds_lost": 0, "updates_lost": 0, "seconds_lost": 0.0} for k in KINDS}
        for r, hit in zip(rounds, overlapping):
            during = [f for f in hit if f.kind != "coordinator_kill"]
            lost_round = r.updates < math.ceil(QUORUM * max(r.running, 1))
            lost_updates = max(0, r.running - r.updates)
            for f in during:
                f.seconds_lost += max(0.0, r.host_s - baseline) / len(during)
                per_kind[f.kind]["rounds_lost"] += lost_round / len(during)
                per_kind[f.kind]["updates_lost"] += lost_updates / len(during)
        for f in faults:
            per_kind[f.kind]["count"] += 1
            if f.kind == "coordinator_kill":  # from the last round before it to the first after it
                before = max((r.t_end for r in rounds if r.t_end <= f.t), default=0.0)
                after = min((r.t_end for r in rounds if r.t_end > f.t), default=self.now())
                f.seconds_lost = max(0.0, after - before - baseline)
            per_kind[f.kind]["seconds_lost"] += f.seconds_lost
        growth = {}
        for life in sorted({s["life"] for s in self.rss}):
            series = [s["coordinator"] for s in self.rss if s["life"] == life and s["coordinator"]]
            if len(series) >= 12:  # a minute of samples after a minute of warm-up
                warm = statistics.median(series[12:24]) if len(series) >= 24 else series[12]
                growth[life] = {"after_warmup_mb": round(warm, 1), "last_mb": round(series[-1], 1),
                                "growth": round(series[-1] / warm - 1, 4), "samples": len(series)}
        return {
            "minutes": self.args.minutes, "devices": self.args.devices, "seed": self.args.seed,
            "rounds": len(rounds), "baseline_round_s": round(baseline, 2),
            "faults": [asdict(f) for f in faults], "per_kind": per_kind,
            "rejections": self.rejections,
            "proxy": {k: getattr(self.proxy, k) for k in
                      ("publishes", "selected", "duplicated", "delayed", "reordered", "dropped", "connections")},
            "coordinator_rss": growth, "rss": self.rss, "round_log": [asdict(r) for r in rounds],
        }


def print_table(result: dict) -> None:
    print(f"\n{result['rounds']} rounds in {result['minutes']} min, {len(result['faults'])} faults, "
          f"{result['devices']} devices; fault-free round median {result['baseline_round_s']} s")
    print(f"{'fault':18} {'count':>5} {'rounds lost':>11} {'updates lost':>12} {'s lost':>8} {'s lost/fault':>12}")
    for kind, v in result["per_kind"].items():
        per = v["seconds_lost"] / v["count"] if v["count"] else 0.0
        print(f"{kind:18} {v['count']:5d} {v['rounds_lost']:11.1f} {v['updates_lost']:12.1f} "
              f"{v['seconds_lost']:8.1f} {per:12.1f}")
    print(f"rejections: {result['rejections']}")
    print(f"proxy: {result['proxy']}")
    print(f"coordinator RSS per process: {result['coordinator_rss']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--devices", type=int, default=6)
    p.add_argument("--every", type=float, default=60.0, help="mean seconds between faults")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the first fault")
    p.add_argument("--settle", type=float, default=30.0, help="seconds after the last fault")
    p.add_argument("--drop", type=float, default=0.002, help="probability a downlink chunk is dropped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/soak")
    args = p.parse_args()
    result = Soak(args).run()
    (Path(args.out) / "soak.json").write_text(json.dumps(result, indent=1))
    print_table(result)


if __name__ == "__main__":
    main()
