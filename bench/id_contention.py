"""Message ids made beside busy threads: ``uuid.uuid4().hex`` against `edge_sdk.protocol.ids.new_id`.

    python bench/id_contention.py [--busy 3] [--seconds 1]

``uuid4`` reads 16 bytes from the kernel per id and lets go of the interpreter lock for that system
call; with other threads busy, each id then waits to get the lock back. Prints ids per second made
by one thread while ``--busy`` others spin, and without them (issue 39: 795 against 459,000 with 3).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_sdk.protocol.ids import new_id  # noqa: E402


def rate(make, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        make()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=3, help="threads spinning in Python meanwhile")
    p.add_argument("--seconds", type=float, default=1.0, help="seconds per measurement")
    args = p.parse_args()
    makers = {"uuid4": lambda: uuid.uuid4().hex, "new_id": new_id}
    idle = {name: rate(make, args.seconds) for name, make in makers.items()}
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass
    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(args.busy)]
    for t in spinners:
        t.start()
    busy = {name: rate(make, args.seconds) for name, make in makers.items()}
    stop.set()
    for name in makers:
        print(f"{name:>7}: {busy[name]:>12,.0f} ids/s beside {args.busy} busy threads, {idle[name]:>12,.0f} alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
