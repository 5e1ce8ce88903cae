"""Where a large simulation's start-up goes (issue 39): how fast N simulated devices connect and
register, and how long one `DeviceClient.open` (its connect, until the CONNACK) takes; beside it,
the bare `NetworkLoop` connecting N transports with a will, a birth message and a subscriber on
their statuses (no device logic, no coordinator), for the floor.

    OMP_NUM_THREADS=1 python bench/sim_startup.py --clients 10000            # a whole job, 1 round
    OMP_NUM_THREADS=1 python bench/sim_startup.py --clients 10000 --idle 30  # ...and 30 s idle after it
    OMP_NUM_THREADS=1 python bench/sim_startup.py --clients 10000 --backend process --connections own
    OMP_NUM_THREADS=1 python bench/sim_startup.py --clients 10000 --bare --threads 8

Prints one line per 1,000 devices registered (seconds since start), then the open times' median,
90th percentile and sum, and the process' CPU; with ``--idle S``, the CPU seconds the whole
process (coordinator and devices) and the broker took over S seconds between two rounds; with
``--bare``, the seconds the N connections took.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_sdk.client import DeviceClient  # noqa: E402


def timed_opens() -> list[float]:
    """Record the seconds every `DeviceClient.open` takes from now on (a wrapper for timing)."""
    took: list[float] = []
    original = DeviceClient.open

    def open_timed(self: DeviceClient) -> None:
        started = time.monotonic()
        original(self)
        took.append(time.monotonic() - started)
    DeviceClient.open = open_timed  # type: ignore[method-assign]
    return took


def process_cpu_s(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_between_rounds(seconds: float) -> Callable[[Any], None]:
    """An ``on_round`` that holds the job after its first round for ``seconds`` (the devices stay
    connected and registered, nothing is asked of them) and prints the CPU it cost."""
    def hold(record: Any) -> None:
        if record.round != 0 or seconds <= 0:
            return
        import psutil

        brokers = [child.pid for child in psutil.Process().children(recursive=True)]  # the embedded broker
        before, broker_before = process_cpu_s(), sum(process_cpu_s(p) for p in brokers)
        time.sleep(seconds)
        broker = sum(process_cpu_s(p) for p in brokers) - broker_before
        print(f"idle {seconds:g} s between rounds: {process_cpu_s() - before:.2f} s CPU here (coordinator and "
              f"devices), {broker:.2f} s in the broker", flush=True)
    return hold


def whole_job(clients: int, idle_s: float = 0.0, backend: str = "local", connections: str = "auto") -> None:
    from coordinator.runtime.fleet import FleetProgress
    from simulation.config import SimulationConfig
    from simulation.simulate import run_simulation

    took = timed_opens()
    started = time.monotonic()
    shown = [-1]

    def progress(p: FleetProgress) -> None:
        if p.round < 0 and (p.done // 1000 != shown[0] or p.done == p.total):
            shown[0] = p.done // 1000
            print(f"{time.monotonic() - started:6.1f} s  registered {p.done}/{p.total}", flush=True)

    with tempfile.TemporaryDirectory() as out:
        config = SimulationConfig(method="fedavg", dataset="fashion-mnist", clients=clients, out=out, threads=1,
                                  plots=False, backend=backend, connections=connections)
        config = replace(config, federation=replace(config.federation, rounds=2 if idle_s > 0 else 1,
                                                    devices_per_round=10, eval_every=100))
        run_simulation(config, on_progress=progress, on_round=idle_between_rounds(idle_s))
    print(f"{time.monotonic() - started:6.1f} s  done")
    opens = np.array(took)
    if not len(opens):  # the devices opened in another process (--backend process)
        return
    print(f"DeviceClient.open: n={len(opens)} median {1e3 * np.median(opens):.1f} ms, "
          f"p90 {1e3 * np.percentile(opens, 90):.1f} ms, sum {opens.sum():.1f} s")


def bare_loop(clients: int, threads: int) -> None:
    from coordinator.runtime.broker import EmbeddedBroker
    from edge_sdk.networking.network_loop import NetworkLoop
    from edge_sdk.networking.transport import MqttTransport, TransportConfig, Will
    from simulation.open_files import ensure_open_files

    ensure_open_files(clients)
    with EmbeddedBroker() as broker, MqttTransport(TransportConfig(url=broker.url)) as watcher:
        watcher.subscribe("bench/+/status")
        loop = NetworkLoop()

        def presence(i: int, state: bytes) -> Will:
            return Will(f"bench/d{i}/status", state, qos=1, retain=True)
        transports = [MqttTransport(TransportConfig(url=broker.url, client_id=f"d{i}", protocol="5",
                                                    will=presence(i, b"offline"), birth=presence(i, b"online")),
                                    network=loop) for i in range(clients)]
        for t in transports:
            t.subscribe("bench/in")
        following = iter(range(clients))
        lock = threading.Lock()

        def connect_next() -> None:
            while True:
                with lock:
                    i = next(following, None)
                if i is None:
                    return
                transports[i].connect()
        started = time.monotonic()
        workers = [threading.Thread(target=connect_next) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print(f"bare NetworkLoop: {clients} connections in {time.monotonic() - started:.1f} s with {threads} threads")
        for t in transports:
            t.close()
        loop.stop()


def time_wait_sockets() -> int:
    """TCP sockets in TIME_WAIT on this machine (IPv4): thousands of them make every new
    connection's port search slow, so a run right after another is slower for it."""
    with open("/proc/net/tcp") as table:
        return sum(1 for line in table if line.split()[3] == "06")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3000)
    parser.add_argument("--bare", action="store_true", help="the bare NetworkLoop only")
    parser.add_argument("--threads", type=int, default=8, help="connecting threads with --bare")
    parser.add_argument("--backend", default="local", help="the whole job's --backend (local, process)")
    parser.add_argument("--connections", default="auto", help="the whole job's --connections (auto, own, shared)")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds to hold the job idle after round 1")
    args = parser.parse_args()
    print(f"TIME_WAIT sockets before: {time_wait_sockets()}")
    if args.bare:
        bare_loop(args.clients, args.threads)
    else:
        whole_job(args.clients, args.idle, args.backend, args.connections)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU: user {usage.ru_utime:.1f} s, system {usage.ru_stime:.1f} s; "
          f"TIME_WAIT sockets after: {time_wait_sockets()}")


if __name__ == "__main__":
    main()
