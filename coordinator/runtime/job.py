"""One federated job on a broker: transport → fleet → round loop → report, for `edgefl coordinator`
and `edgefl simulate` alike (they differ only in what they build before and run beside it)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TypeVar

from edge_sdk.networking.link import LinkConfig, MessageLink
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.protocol.topics import Topics
from edge_sdk.signing import ModelSigner
from edge_sdk.networking.transport import MqttTransport, TransportConfig

from coordinator.homeassistant import HomeAssistantBridge, HomeAssistantConfig
from coordinator.runtime.device_budgets import FleetLimits
from coordinator.core.federation import EvalData
from coordinator.runtime.device_counts import DeviceCountsFile
from coordinator.runtime.fleet import Fleet, FleetProgress
from coordinator.runtime.publish import attach_signer
from coordinator.runtime.removed_devices import RemovedDevicesFile
from coordinator.runtime.report import RoundRecord, RunReport, keep_previous_report
from coordinator.runtime.async_loop import AsyncLoop
from coordinator.runtime.fleet_async_loop import FleetAsyncLoop
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.sim_clock import SimClock
from coordinator.runtime.task import Task
from coordinator.strategies.base import Strategy

__all__ = ["JobConnection", "run_job"]

T = TypeVar("T")


@dataclass(frozen=True)
class JobConnection:
    """Where the coordinator of a job talks to its fleet, and how it signs what it publishes."""

    transport: TransportConfig
    job: str
    link: LinkConfig = field(default_factory=LinkConfig)
    limits: FleetLimits = field(default_factory=FleetLimits)
    #: signs every published model (None: they go out unsigned)
    signer: ModelSigner | None = None
    #: what the job learns: devices whose data is of another task are refused (None: not checked)
    task: Task | None = None
    #: the job and its devices in Home Assistant (MQTT discovery; off by default)
    homeassistant: HomeAssistantConfig = field(default_factory=HomeAssistantConfig)
    #: the file remove-device.sh appends removed devices' ids to (None: not watched)
    removed_devices: str | None = None


def run_job(strategy: Strategy, report: RunReport, connection: JobConnection, out: str | Path, *,
            eval_data: EvalData | None = None, preprocessing: Preprocessing | None = None,
            beside: Callable[[Fleet], AbstractContextManager[object]] | None = None,
            on_round: Callable[[RoundRecord], None] | None = None,
            on_progress: Callable[[FleetProgress], None] | None = None, plots: bool = True,
            identity: dict[str, Any] | None = None, keep_previous: bool = False,
            write_every_round: bool = False, fleet_normalisation: bool = False,
            clock: SimClock | None = None) -> RunReport:
    """Connect, start the fleet, run the round loop to the end and write the report into ``out``
    (also when the job stops early: Ctrl-C or an error, marked ``interrupted``).

    ``clock``: a simulated fleet's (`coordinator.runtime.sim_clock`); ``[federation] asynchronous``
    runs buffered asynchronous aggregation — `AsyncLoop` in the clock's simulated time, without a
    clock `FleetAsyncLoop` on a real fleet — else `RoundLoop`.
    ``fleet_normalisation``: ``preprocessing``'s mean and std come from the devices before round 1.
    ``write_every_round``: report.json (atomically) after every round, as a coordinator that serves
    for months must (a simulation writes it at its end); metrics.csv is appended every round.
    ``keep_previous``: a new job keeps an earlier job's report in ``out`` under a dated name, once
    connected (a start that fails, e.g. a wrong password, touches no earlier report).
    ``identity``: the job's (`coordinator.runtime.job_identity`), kept in its checkpoint and
    checked on resume. ``beside(fleet)``: a context that runs while the rounds do (e.g. a
    simulation's devices); it is left before the coordinator disconnects, with the exception that
    stopped the job, if any.
    """
    home = None
    transport_config = connection.transport
    if connection.homeassistant.enabled:
        home = HomeAssistantBridge(connection.homeassistant, connection.job, report.method, strategy.config.rounds,
                                   strategy.config.checkpoint_dir)
        transport_config = replace(transport_config, will=home.will(), birth=home.birth())
    transport = MqttTransport(transport_config)
    transport.connect()
    if keep_previous:
        keep_previous_report(Path(out))
    report.status = "running"  # what report.json says until the job ends (`RunReport.write_outcome`)
    finished = False
    fleet: Fleet | None = None
    try:
        fleet = Fleet(MessageLink(transport, connection.link), Topics(job=connection.job),
                      on_progress=_both(on_progress, home.progress if home else None),
                      method=strategy.device_part(), limits=connection.limits, task=connection.task,
                      spool_dir=out)
        fleet.spool.clear_stale()
        if connection.signer is not None:
            attach_signer(fleet, connection.signer)
        fleet.start()
        if connection.removed_devices is not None:
            fleet.tickers.append(RemovedDevicesFile(connection.removed_devices, fleet.remove).check)
        if home is not None:
            home.classes = tuple(preprocessing.classes) if preprocessing is not None else ()
            home.attach(fleet)
        with beside(fleet) if beside is not None else nullcontext():
            loop_class = RoundLoop if not strategy.config.asynchronous else AsyncLoop if clock else FleetAsyncLoop
            loop = loop_class(strategy, fleet, report, eval_data=eval_data, preprocessing=preprocessing,
                              identity=identity, fleet_normalisation=fleet_normalisation, clock=clock)
            if home is not None:
                loop.before_round, loop.on_resumed = home.hold_if_paused, home.restore
                if loop.serving is not None:
                    loop.serving.on_waiting = lambda _pace: home.set_job_state("waiting_for_data")
            counts = DeviceCountsFile(Path(out) / "devices.csv")
            health = loop.health
            health.on_change = _both(report.set_health, home.set_health if home else None)
            report.set_health(health.as_dict())

            def on_disk(_record: RoundRecord) -> None:  # after every version: nothing waits for the job's end
                with health.writing("devices.csv"):
                    counts.append(loop.device_counts)
                with health.writing("report.json and metrics.csv"):
                    if write_every_round:
                        report.write(Path(out), plots=False, describe=strategy.describe_label)
                    else:  # metrics.csv has every round even when the report keeps only the latest
                        report.append_metrics(Path(out))
            loop.run(_both(_both(on_disk, home.round_done if home else None), on_round))
            if plots:
                report.prepare_plots()  # while the devices stop
            transport.wait_published(10.0)
        finished = True
    finally:
        if fleet is not None:
            fleet.spool.close()
        if home is not None:
            home.finish(finished)
            transport.wait_published(2.0)
        transport.close()
        report.write_outcome(Path(out), finished, plots=plots, describe=strategy.describe_label)
    return report


def _both(first: Callable[[T], None] | None, second: Callable[[T], None] | None) -> Callable[[T], None] | None:
    """A callback that calls ``first`` then ``second`` (either may be None)."""
    if first is None or second is None:
        return first or second

    def call(value: T) -> None:
        first(value)
        second(value)
    return call
