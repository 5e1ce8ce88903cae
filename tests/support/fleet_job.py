"""Run a whole job in one test process: the coordinator's round loop here, each device client in a thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from coordinator.core.federation import EvalData
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.strategies.base import Strategy
from edge_sdk.client import DeviceClient
from edge_sdk.networking.transport import MqttTransport

__all__ = ["run_job", "clients_beside"]


def run_job(strategy: Strategy, fleet: Fleet, clients: Sequence[DeviceClient], coordinator: MqttTransport,
            method: str = "fedavg", eval_data: EvalData | None = None) -> RunReport:
    """Start ``clients``, run every round of ``strategy`` on ``fleet`` (evaluated on ``eval_data``),
    then join the clients (a `Stop` ends them) and close the coordinator's transport."""
    threads = [threading.Thread(target=client.run, daemon=True) for client in clients]
    for thread in threads:
        thread.start()
    try:
        return RoundLoop(strategy, fleet, RunReport(method=method, config={}), eval_data=eval_data).run()
    finally:
        for thread in threads:
            thread.join(timeout=20)
        coordinator.close()


def clients_beside(clients: Sequence[DeviceClient]) -> Callable[[Fleet], AbstractContextManager[None]]:
    """`coordinator.runtime.job.run_job`'s ``beside``: ``clients`` run in threads while the rounds
    do, and are joined (a `Stop` ends them) when the job leaves it."""
    @contextmanager
    def beside(_fleet: Fleet) -> Iterator[None]:
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        yield
        for thread in threads:
            thread.join(timeout=20)
    return beside
