"""The coordinator's side of Home Assistant: it publishes discovery, state and availability for
the job and every device (`discovery.py`), publishes discovery again when Home Assistant's birth
message arrives, clears a device removed from the job, and pauses the job between rounds on the one command
topic. Fire-and-forget: retained messages, and nothing in the job waits for Home Assistant.

The runtime builds the bridge and hands it its fleet and rounds; the bridge knows them only as
the small protocols below (`FleetView`, `Progress`, `RoundView`), so it imports nothing of
``coordinator.runtime`` (tests/project/test_import_graph.py)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from edge_sdk.client import SDK_VERSION
from edge_sdk.networking.transport import MqttTransport, Will
from edge_sdk.protocol.capabilities import SERVE

from coordinator.aggregate.evaluation import NOT_ENOUGH
from coordinator.aggregate.interval import INTERVAL_KIND
from coordinator.homeassistant.config import HomeAssistantConfig
from coordinator.homeassistant.names import clean_text
from coordinator.homeassistant.discovery import PAUSE, RESUME, HaTopics, coordinator_config, device_config

if TYPE_CHECKING:
    from edge_sdk.networking.link import MessageLink

    from coordinator.core.device_record import DeviceRecord

__all__ = ["HomeAssistantBridge", "PAUSE_FILE", "FleetView", "Progress", "RoundView"]

log = logging.getLogger(__name__)

#: In the checkpoint folder while the job is paused: a restarted coordinator stays paused.
PAUSE_FILE = "paused"
#: How long a paused job waits for messages between two looks at the switch.
PAUSED_PUMP_S = 0.5
#: Discovery is published again at most this often: a birth message sooner waits for the time (the
#: birth topic's writer may be hostile, and each re-publish is three messages per device).
REPUBLISH_EVERY_S = 10.0
#: the job's state (its "Devices online") again at most this often as devices come and go
PRESENCE_EVERY_S = 2.0


class FleetView(Protocol):
    """What the bridge uses of the fleet it publishes (`coordinator.runtime.fleet.Fleet`)."""

    link: MessageLink
    devices: dict[str, DeviceRecord]
    removed: set[str]
    tickers: list[Callable[[], None]]
    on_device_change: Callable[[DeviceRecord], None] | None
    on_removed: Callable[[str], None] | None

    def online(self) -> list[str]: ...

    def pump(self, timeout: float, until: Callable[[], bool] | None = None) -> None: ...


class Progress(Protocol):
    """What the bridge reads of the fleet's progress (`coordinator.runtime.fleet.FleetProgress`)."""

    @property
    def round(self) -> int: ...  # -1: waiting for devices to register


class RoundView(Protocol):
    """What the bridge reads of a finished round (`coordinator.runtime.report.RoundRecord`)."""

    @property
    def round(self) -> int: ...

    @property
    def accuracy(self) -> dict[str, float]: ...

    @property
    def federated_accuracy(self) -> dict[str, float]: ...

    @property
    def evaluation(self) -> dict[str, Any]: ...  # by_label: what each federated figure rests on

    @property
    def version(self) -> int: ...

    @property
    def published_version(self) -> int: ...

    @property
    def bytes_down(self) -> int: ...

    @property
    def bytes_up(self) -> int: ...

    @property
    def host_seconds(self) -> float: ...

    @property
    def participants(self) -> list[str]: ...


class HomeAssistantBridge:
    """Publishes one job to Home Assistant over the coordinator's own connection."""

    def __init__(self, config: HomeAssistantConfig, job: str, method: str, rounds: int,
                 checkpoint_dir: str | None = None) -> None:
        self.config = config
        self.topics = HaTopics(job, config.prefix)
        self.method = method
        self.name = config.name or f"edgefl {job}"
        self.transport: MqttTransport | None = None
        self.fleet: FleetView | None = None
        self._pause_file = Path(checkpoint_dir) / PAUSE_FILE if checkpoint_dir else None
        self.paused = self._pause_file is not None and self._pause_file.exists()
        if self.paused:
            log.warning("the job is paused (from Home Assistant; %s): resume it there", self._pause_file)
        self.job_state = "idle"
        #: the task's class names: a serving device's prediction entities offer them (set by the job)
        self.classes: tuple[str, ...] = ()
        self._state: dict[str, Any] = {"round": 0, "rounds": rounds, "accuracy": {}, "federated_accuracy": {},
                                       "federated": {}, "version": 0, "published_version": 0, "bytes_down": 0,
                                       "bytes_up": 0, "round_seconds": None, "health": "ok",
                                       "health_problem": "", "health_since": None}
        self._announced: dict[str, tuple[str, ...]] = {}  # device -> what its discovery said (model, sdk, classes)
        self._last_round: dict[str, int] = {}
        self._bad_commands = 0
        self._published_at = float("-inf")  # time.monotonic() of the last whole discovery
        self._republish_due = False  # a birth message came sooner than REPUBLISH_EVERY_S after it
        self._presence_due, self._presence_at = False, float("-inf")  # `_presence_if_due`

    # -- the connection ---------------------------------------------------
    def will(self) -> Will:
        """The coordinator's last will: its entities (and through them the devices') unavailable."""
        return Will(self.topics.coordinator_availability, b"offline", qos=1, retain=True)

    def birth(self) -> Will:
        return Will(self.topics.coordinator_availability, b"online", qos=1, retain=True)

    def attach(self, fleet: FleetView) -> None:
        """Start publishing ``fleet``: the birth and command topics are read as plain text, device
        changes and removals are followed, and the job's discovery goes out."""
        self.fleet, self.transport = fleet, fleet.link.transport
        fleet.link.plain_topics[self.config.birth_topic] = self._on_birth
        fleet.link.plain_topics[self.topics.command] = self._on_command
        self.transport.subscribe(self.config.birth_topic, qos=0)
        self.transport.subscribe(self.topics.command, qos=1)
        fleet.on_device_change = self.device_changed
        fleet.on_removed = self.device_removed
        fleet.tickers.append(self._republish_if_due)
        fleet.tickers.append(self._presence_if_due)
        self.job_state = "paused" if self.paused else "idle"
        self.publish_discovery()  # the job's state with it

    def _publish(self, topic: str, payload: dict[str, Any] | bytes, retain: bool = True) -> None:
        assert self.transport is not None
        data = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
        try:
            self.transport.publish(topic, data, qos=1, retain=retain)
        except (ConnectionError, ValueError) as exc:  # fire-and-forget: the job goes on without Home Assistant
            log.warning("Home Assistant: %s not published: %s", topic, exc)

    # -- discovery --------------------------------------------------------
    def publish_discovery(self) -> None:
        """The job's and every known device's discovery, availability and state (again)."""
        self._published_at, self._republish_due = time.monotonic(), False
        self._publish_coordinator_config()
        self._publish(self.topics.coordinator_availability, b"online")
        self._publish_job_state()  # and the devices' presence with it: their changes below say nothing more
        self._announced.clear()
        if self.fleet is not None:
            for record in list(self.fleet.devices.values()):
                self.device_changed(record)
        self._presence_due = False

    def _publish_coordinator_config(self) -> None:
        config = coordinator_config(self.topics, name=self.name, method=self.method, version=SDK_VERSION,
                                    accuracy_labels=tuple(sorted(self._state["accuracy"])),
                                    federated_labels=tuple(sorted(self._state["federated_accuracy"])))
        self._publish(self.topics.discovery(self.topics.coordinator_node), config)

    def _on_birth(self, _topic: str, payload: bytes) -> None:
        if payload.decode("utf-8", "replace").strip() == self.config.birth_payload:
            self._republish_due = True
            self._republish_if_due()

    def _republish_if_due(self) -> None:
        """Discovery again after a birth message, at most every `REPUBLISH_EVERY_S` (a fleet ticker)."""
        if self._republish_due and time.monotonic() - self._published_at >= REPUBLISH_EVERY_S:
            log.info("Home Assistant (re)started: publishing the fleet's discovery again")
            self.publish_discovery()

    # -- devices ------------------------------------------------------------
    def device_changed(self, record: DeviceRecord) -> None:
        """A device registered, came or went: its discovery (when new or changed), availability
        and state."""
        device = record.device_id
        if self.fleet is not None and device in self.fleet.removed:
            return
        serving = self.classes if SERVE in record.capabilities and self.classes else ()
        announced = (record.profile.name, record.sdk_version, *serving)
        if self._announced.get(device) != announced:
            self._announced[device] = announced
            self._publish(self.topics.discovery(self.topics.device_node(device)),
                          device_config(self.topics, device, model=record.profile.name,
                                        sdk_version=record.sdk_version, version=SDK_VERSION, serving=serving))
        self._publish(self.topics.device_availability(device), b"online" if record.online else b"offline")
        self._publish(self.topics.device_state(device), self._device_state(record))
        self._presence_due = True  # the job's "Devices online", at most every PRESENCE_EVERY_S
        self._presence_if_due()

    def _presence_if_due(self) -> None:
        """The job's state again when a device came or went, at most every `PRESENCE_EVERY_S` (also a
        fleet ticker, so that the last change of a burst is not left unsaid)."""
        if self._presence_due and self.transport is not None \
                and time.monotonic() - self._presence_at >= PRESENCE_EVERY_S:
            self._publish_job_state()

    def _device_state(self, record: DeviceRecord) -> dict[str, Any]:
        accuracy = None
        if record.last_evaluation is not None:
            _, samples, correct, _ = record.last_evaluation
            accuracy = round(100.0 * correct / samples, 2) if samples else None
        gflops = record.profile.gflops
        return {"online": record.online, "label": record.label or "",
                "last_round": self._last_round.get(record.device_id), "accuracy": accuracy,
                "bytes_down": record.bytes_down, "bytes_up": record.bytes_up,
                "gflops": round(gflops, 3) if math.isfinite(gflops) else None,
                "sdk_version": clean_text(record.sdk_version, "SDK version", record.device_id)}

    def device_removed(self, device: str) -> None:
        """Clear a device removed from the job from Home Assistant (empty retained payloads)."""
        for topic in (self.topics.discovery(self.topics.device_node(device)), self.topics.device_state(device),
                      self.topics.device_availability(device)):
            self._publish(topic, b"")
        self._announced.pop(device, None)
        log.info("Home Assistant: device %s cleared", device)

    # -- the job ------------------------------------------------------------
    def set_job_state(self, state: str) -> None:
        if state != self.job_state:
            self.job_state = state
            if self.transport is not None:
                self._publish_job_state()

    def set_health(self, health: dict[str, Any]) -> None:
        """Whether the coordinator can write what it keeps (`coordinator.core.health.Health`)."""
        self._state.update(health=health["state"], health_problem=health["problem"], health_since=health["since"])
        if self.transport is not None:
            self._publish_job_state()

    def restore(self, rounds: list[RoundView]) -> None:
        """A resumed job: its counters and figures as its finished rounds left them, not from 0."""
        if not rounds:
            return
        state = self._state
        state["round"] = rounds[-1].round + 1
        state["bytes_down"] = sum(r.bytes_down for r in rounds)
        state["bytes_up"] = sum(r.bytes_up for r in rounds)
        state["version"], state["published_version"] = rounds[-1].version, rounds[-1].published_version
        for record in rounds:
            state["accuracy"].update({k: round(100.0 * v, 2) for k, v in record.accuracy.items() if math.isfinite(v)})
            self._federated_figures(record)
        if self.transport is not None:
            self._publish_coordinator_config()
            self._publish_job_state()

    def _publish_job_state(self) -> None:
        self._presence_due, self._presence_at = False, time.monotonic()
        online = len(self.fleet.online()) if self.fleet is not None else 0
        self._publish(self.topics.coordinator_state, {**self._state, "state": self.job_state,
                                                      "devices_online": online, "paused": self.paused})

    def progress(self, progress: Progress) -> None:
        """`Fleet.on_progress`: waiting for devices (round -1), or a round under way."""
        self.set_job_state("waiting_for_devices" if progress.round < 0 else "training")

    def round_done(self, record: RoundView) -> None:
        """A round ended: the job's state, and that of the devices that took part or evaluated."""
        state, labels_before = self._state, (set(self._state["accuracy"]), set(self._state["federated_accuracy"]))
        state["round"] = record.round + 1
        state["bytes_down"] += record.bytes_down
        state["bytes_up"] += record.bytes_up
        state["round_seconds"] = round(record.host_seconds, 3)
        state["version"], state["published_version"] = record.version, record.published_version
        state["accuracy"].update({label: round(100.0 * v, 2) for label, v in record.accuracy.items()
                                  if math.isfinite(v)})
        self._federated_figures(record)
        if (set(state["accuracy"]), set(state["federated_accuracy"])) != labels_before:
            self._publish_coordinator_config()  # an entity for each new label
        self._publish_job_state()
        if self.fleet is None:
            return
        for device in record.participants:
            self._last_round[device] = record.round + 1
        for device_record in list(self.fleet.devices.values()):
            evaluated = device_record.last_evaluation is not None and device_record.last_evaluation[0] == record.round
            if evaluated or device_record.device_id in record.participants:
                self.device_changed(device_record)

    def _federated_figures(self, record: RoundView) -> None:
        """Each federated accuracy (None, unknown in Home Assistant, below ``min_eval_samples``)
        and what it rests on, as the sensor's attributes."""
        figures = record.evaluation.get("by_label") or {}
        for label, value in record.federated_accuracy.items():
            figure = figures.get(label) or {}
            enough = figure.get("enough", True) and math.isfinite(value)
            self._state["federated_accuracy"][label] = round(100.0 * value, 2) if enough else None
            self._state["federated"][label] = {
                "samples": figure.get("samples"), "devices": figure.get("devices"),
                "interval_low": round(100.0 * figure["low"], 2) if "low" in figure else None,
                "interval_high": round(100.0 * figure["high"], 2) if "high" in figure else None,
                "interval": INTERVAL_KIND, "round": record.round + 1,
                "note": "" if enough else f"{NOT_ENOUGH} ({figure.get('samples')} samples, at least "
                                          f"{record.evaluation.get('min_samples')})"}

    def _on_command(self, _topic: str, payload: bytes) -> None:
        command = payload.decode("utf-8", "replace").strip().lower()
        if command not in (PAUSE, RESUME):
            self._bad_commands += 1
            if self._bad_commands == 1:  # once: the topic is Home Assistant's, but anyone allowed may write it
                log.warning("Home Assistant command %r ignored: only %r and %r are accepted (further ones are "
                            "ignored without a word)", command[:40], PAUSE, RESUME)
            return
        paused = command == PAUSE
        if paused != self.paused:
            self.paused = paused
            log.warning("job %s from Home Assistant%s", "paused" if paused else "resumed",
                        ": it stops after the current round" if paused else "")
            self._keep_pause()
        self._publish_job_state()

    def _keep_pause(self) -> None:
        if self._pause_file is None:
            return
        try:
            if self.paused:
                self._pause_file.parent.mkdir(parents=True, exist_ok=True)
                self._pause_file.touch()
            else:
                self._pause_file.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("the pause is not kept across a restart: %s", exc)

    def hold_if_paused(self, rnd: int) -> None:
        """Before round ``rnd``: while the job is paused, handle messages and wait. A command that
        arrived during the last round (and its report) counts: it is taken first."""
        if self.fleet is None:
            return
        self.fleet.pump(0.0)
        if not self.paused:
            return
        log.warning("paused before round %d: resume from Home Assistant", rnd + 1)
        self.set_job_state("paused")
        while self.paused:
            self.fleet.pump(PAUSED_PUMP_S)
        self.set_job_state("training")

    def finish(self, finished: bool) -> None:
        """The job ended (``finished``: all its rounds; else interrupted or failed): its last state
        and the coordinator's availability, before it disconnects."""
        if self.fleet is not None:  # the devices' bytes now count the published model
            for record in list(self.fleet.devices.values()):
                if record.device_id not in self.fleet.removed:
                    self._publish(self.topics.device_state(record.device_id), self._device_state(record))
        self.set_job_state("finished" if finished else "interrupted")
        self._publish_job_state()
        # its availability stays "online" (retained): the job's final figures stay readable, its state
        # says it has ended; a coordinator that dies turns it "offline" (its will)
