"""Peak memory of each process of a simulation while many devices train (issue 61): the coordinator
(the `edgefl simulate` process: coordinator, its fleet, and the devices' scheduler), the broker
(mosquitto) and the device processes, sampled from /proc every ``--every`` seconds.

    OMP_NUM_THREADS=1 python bench/coordinator_rss.py --clients 10000               # one round, all train
    OMP_NUM_THREADS=1 python bench/coordinator_rss.py --clients 10000 --async       # async, all training
    OMP_NUM_THREADS=1 python bench/coordinator_rss.py --clients 10000 -- --option aggregate=median

A synchronous job runs one round in which every device trains; an asynchronous one keeps every
device training (``--concurrency`` = the fleet) for as many versions of ``--buffer-size`` updates
as there are devices (as many updates folded as devices; evaluated at the end only). Peak RSS per process is the largest
VmRSS seen for it (the coordinator's also from its own VmHWM, read while it runs); the JSON of a
run goes to ``--out``. Arguments after ``--`` go to `edgefl simulate` as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["sample_tree", "main"]

_MB = 1 << 20


def _status(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/PID/status, in bytes (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as kids:
                for child in kids.read().split():
                    found.append(int(child))
                    todo.append(int(child))
        except FileNotFoundError:
            continue
    return found


def _role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return "gone"
    return "broker" if "mosquitto" in cmd else "devices"


def sample_tree(root: int, peaks: dict[str, int]) -> None:
    """Raise ``peaks`` (bytes by role: coordinator, broker, devices = the largest device process,
    devices_total = all of them at once) to what the process tree of ``root`` holds now."""
    peaks["coordinator"] = max(peaks.get("coordinator", 0), _status(root, "VmRSS"), _status(root, "VmHWM"))
    total = 0
    for pid in _children(root):
        role, rss = _role(pid), _status(pid, "VmRSS")
        peaks[role] = max(peaks.get(role, 0), rss)
        total += rss if role == "devices" else 0
    peaks["devices_total"] = max(peaks.get("devices_total", 0), total)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--buffer-size", type=int, default=10)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--out", default=None, help="JSON of the run (default: bench/results/coordinator_rss/)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgefl-rss-"))
    edgefl = str(Path(sys.executable).with_name("edgefl"))
    cmd = [edgefl, "simulate", "--dataset", args.dataset, "--clients", str(args.clients),
           "--local-epochs", "1", "--out", str(work / "out")]
    if args.asynchronous:
        versions = str(max(1, args.clients // args.buffer_size))
        cmd += ["--async", "--concurrency", str(args.clients), "--buffer-size", str(args.buffer_size),
                "--rounds", versions, "--eval-every", versions]
    else:
        cmd += ["--rounds", "1"]
    cmd += extra
    print("running:", " ".join(cmd), flush=True)
    started = time.monotonic()
    peaks: dict[str, int] = {}
    with open(work / "log.txt", "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent)
        while child.poll() is None:
            sample_tree(child.pid, peaks)
            time.sleep(args.every)
    seconds = time.monotonic() - started
    tail = (work / "log.txt").read_text(errors="replace").splitlines()[-5:]
    result = {"command": cmd[1:], "rc": child.returncode, "seconds": round(seconds, 1),
              "peak_rss_mb": {k: round(v / _MB) for k, v in sorted(peaks.items())}, "log_tail": tail,
              "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    out = Path(args.out or Path(__file__).parent / "results" / "coordinator_rss"
               / f"{'async' if args.asynchronous else 'sync'}-{args.clients}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["peak_rss_mb"]), f"{seconds:.0f} s, rc {child.returncode}; log {work / 'log.txt'}")
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main())
