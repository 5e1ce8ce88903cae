"""The device: registers with the coordinator, trains on plans, uploads updates. Only compact
messages leave it: its profile, its sample count, and the tensors a method uploads.

`DeviceClient` connects, registers and dispatches what arrives to its parts: device_data.py,
device_rounds.py, uplink.py, model_install.py, remeasure.py, sim_hooks.py, device_connection.py."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from edge_sdk.accelerator import resolve_device
from edge_sdk.device.client_config import ClientConfig
from edge_sdk.device.device_connection import open_connection
from edge_sdk.device.device_data import DeviceData
from edge_sdk.device.device_rounds import DeviceRounds, RoundTrained, plan_digest
from edge_sdk.networking.link import MessageLink, Received, Rejected
from edge_sdk.methods import DEVICE_METHODS, LocalData
from edge_sdk.device.model_install import ModelInstaller
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.profiling import DeviceProfile
from edge_sdk.protocol.errors import ErrorCode, ProtocolError
from edge_sdk.protocol.messages import Ack, Envelope, Error, Evaluate, Model, Plan, Register, RoundStart, Status, Stop
from edge_sdk.protocol.messages import StatsRequest, Update
from edge_sdk.protocol.topics import Topics
from edge_sdk.device.remeasure import Remeasuring
from edge_sdk.device.sim_hooks import SimHooks
from edge_sdk.throttle import Throttle
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError
from edge_sdk.device.uplink import Uplink
from edge_sdk.version import SDK_VERSION

if TYPE_CHECKING:
    from edge_sdk.sources import DataSource, SourceRead

__all__ = ["ClientConfig", "DeviceClient", "RoundTrained", "SDK_VERSION", "plan_digest"]

log = logging.getLogger(__name__)


class DeviceClient:
    """Runs one device until the coordinator says stop (or `stop()` is called)."""

    def __init__(self, config: ClientConfig, data: "LocalData | SourceRead | None", profile: DeviceProfile,
                 throttle: Throttle | None = None,
                 on_round: Callable[[RoundTrained], None] | None = None,
                 run_compute: Callable[[Callable[[], object]], object] | None = None,
                 source: "DataSource | None" = None, test: LocalData | None = None,
                 network: NetworkLoop | None = None,
                 connect_via: Callable[[TransportConfig], MqttTransport] | None = None) -> None:
        self.config = config
        self.installer = ModelInstaller(config)  # checks the trusted keys first: a bad one fails here
        self.torch_device = resolve_device(config.device)
        self.sim = SimHooks(run_compute=run_compute, network=network, connect_via=connect_via)
        self.on_round = on_round  # called after every round this device trained and uploaded
        self.turned_away: str | None = None  # why the coordinator or the broker will not have it (retrying cannot help)
        self.profile = profile
        self.remeasuring = Remeasuring(config, profile, self.torch_device)
        self.local = DeviceData(config.device_id, config.holdout, source, data, test)
        self.source = source  # where its data comes from, read again every round it trains (None: as given)
        self.topics = Topics(job=config.job)
        self.uplink = Uplink(config, self.topics)
        self.link: MessageLink | None = None  # its connection's (`open`)
        self._stop = threading.Event()
        # `_train` and `_send_update` stay this class's methods, which a test device overrides
        self.rounds = DeviceRounds(config, self.local, self.uplink, self.sim, throttle, self.torch_device, self._stop,
                                   lambda rnd, plan: self._train(rnd, plan),
                                   lambda update, rnd: self._send_update(update, rnd))
        self.errors: list[Error] = []  # what the coordinator answered with an error
        self.rounds_trained, self.declined = self.rounds.trained, self.rounds.declined  # the parts' records
        self.resent_updates, self.evaluations = self.rounds.resent, self.rounds.evaluations
        self.unanswered_resends, self.profile_updates = self.uplink.unanswered_resends, self.remeasuring.updates
        self._finished = self._registered = False  # `finish` ran; the coordinator acked its registration
        self._register_id: str | None = None
        self._last_register = 0.0

    @property
    def data(self) -> LocalData:
        """What it trains on (its held-out share removed)."""
        return self.local.data

    @property
    def holdout(self) -> LocalData | None:
        """What it evaluates on."""
        return self.local.holdout

    @property
    def published_model(self) -> Model | None:
        """The latest model the coordinator published."""
        return self.installer.published

    @property
    def holds_update(self) -> bool:
        """Whether it keeps its last update (to answer that round's plan if it comes again)."""
        return self.rounds.holds_update

    # -- public -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the run loop to finish after the current step (it wakes at once if it waits)."""
        self._stop.set()
        if self.link is not None:
            self.link.transport.wake()

    def report_capacity(self, profile: DeviceProfile) -> None:
        """Re-register with a new profile (CPU load, throttling, battery): the coordinator may give it
        another model from the next round on. Thread-safe: the run loop sends it on its next pass."""
        if not isinstance(profile, DeviceProfile):
            raise ValueError(f"profile must be a DeviceProfile, got {type(profile).__name__}")
        self.profile = profile
        self.remeasuring.reported(profile)
        self._registered, self._last_register = False, 0.0
        if self.link is not None:
            self.link.transport.wake()

    def run(self, timeout_s: float | None = None) -> str:
        """Connect, register and serve plans; returns why it ended. Ctrl-C (KeyboardInterrupt)
        stops it cleanly: training stops after its current step, the device says "offline" to the
        coordinator and disconnects, then the interrupt propagates."""
        self.open()
        reason = "stopped"
        try:
            reason = self._loop(timeout_s)
        except KeyboardInterrupt:
            self._stop.set()
            self.finish("interrupted", wait_s=2.0)
            raise
        finally:
            self.finish(reason)  # no-op after an interrupt's
        return reason

    def open(self) -> None:
        """Connect to the broker (blocking until the first CONNACK, retrying for
        ``connect_retry_s``) and subscribe; then `step` (or `run`) serves the device. A host that
        drives many devices (simulation/sim_devices.py) calls it, `step` and `finish` itself."""
        self.rounds.apply_caps()
        transport = open_connection(self.config, self.topics, self.sim, self._stop)
        self.uplink.link = self.link = MessageLink(transport, self.config.link)  # the uplink's first: `step` may run
        self.uplink.status_at = time.monotonic()  # the birth message said "online"

    def step(self, max_messages: int = 64) -> str | float:
        """One pass without waiting: its due duties, then up to ``max_messages`` arrived messages.
        Returns why it ended, or the seconds until it has something to do again unless a message
        comes first (`sim.on_ready` says when one does; 0: more are waiting)."""
        if self._stop.is_set():
            return "stopped"
        if self.link is None:  # a message came while `open` was still connecting: the host steps it after
            return 1.0
        self._duties(time.monotonic())
        for _ in range(max_messages):
            item = self.link.poll(0)
            if item is None:
                return self._idle_wait(time.monotonic())
            if (reason := self._on_item(item)) is not None:
                return reason
            if self._stop.is_set():
                return "stopped"
        return 0.0

    def abort(self) -> None:
        """Stop at once and drop the connection without a word, as a device that loses power (the
        broker publishes its will); a simulation's host ends its devices so when the job is over."""
        self._stop.set()
        if self.link is not None and not self._finished:
            self._finished = True
            self.link.transport.abort()

    def finish(self, reason: str, wait_s: float = 10.0) -> None:
        """Say "offline" (with ``reason``) to the coordinator, wait up to ``wait_s`` for what is
        unsent to be acknowledged, and disconnect."""
        if self.link is None or self._finished:
            return
        self._finished = True
        transport = self.link.transport
        try:
            self.uplink.status("offline", reason)
            transport.wait_published(wait_s)
        except (TransportError, ProtocolError, ConnectionError) as exc:
            log.warning("%s: could not say offline: %s", self.config.device_id, exc)
        finally:
            transport.close()

    # -- loop -------------------------------------------------------------
    def _loop(self, timeout_s: float | None) -> str:
        end = None if timeout_s is None else time.monotonic() + timeout_s
        assert self.link is not None
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now > end:
                return "timeout"
            if (refused := self.link.transport.not_authorized) is not None:  # its ACL: retrying cannot help
                self.turned_away = refused
                return refused
            wait = self._duties(now)
            # a message wakes it at once, and so does one beginning to arrive in chunks (it may stall:
            # `_idle_wait`); otherwise it sleeps until its next duty
            item = self.link.poll(wait if end is None else max(0.0, min(wait, end - now)), wake_on_partial=True)
            if item is not None and (reason := self._on_item(item)) is not None:
                return reason
        return "stopped"

    def _duties(self, now: float) -> float:
        """What is due now: register, retry a held plan, heartbeat, ask for stalled transfers,
        re-measure; then how long the device may sleep when no message comes."""
        if not self._registered and now - self._last_register >= self.config.register_retry_s:
            self._register()
        self.rounds.duties(now)  # a held plan retried, the data source re-read
        self.rounds.forget_updates_before(self.sim.forget_updates_before)  # a later round began
        self.uplink.resend_unanswered(now, self.sim.forget_updates_before)
        if now - self.uplink.status_at >= self.config.heartbeat_s:
            self.rounds.heartbeat()
        self.uplink.ask_again_for_stalled()
        remeasured = self.remeasuring.check(now, self.profile, self._registered and self.rounds.pending is None)
        if remeasured is not None:
            self.profile, env = remeasured  # a later registration carries it too
            self.uplink.envelope(env)
        return self._idle_wait(now)

    def _on_item(self, item: Received | Rejected) -> str | None:
        """Handle what the link gave; why the device ends, if it does."""
        if isinstance(item, Rejected):
            log.warning("%s: dropped a malformed message: %s", self.config.device_id, item.error)
            return None
        return self._handle(item.envelope)

    def _idle_wait(self, now: float) -> float:
        """How long the loop may sleep when no message comes: until its next registration while
        it is not registered; a second while it holds a plan, has a message half received or
        re-measures; else until its next heartbeat, or the end of its wait for an announced plan
        (a message wakes it: an idle device of a large simulation costs no wake-ups, nor does one
        whose plan comes minutes after the announcement, in a round where 10,000 devices train);
        sooner when an update the coordinator has not answered is due again."""
        assert self.link is not None
        if not self._registered:  # until its next registration (the ack, a message, wakes it sooner)
            wait = max(0.05, min(1.0 if self._last_register == 0 else self.config.register_retry_s,
                                 self._last_register + self.config.register_retry_s - now))
        elif (self.rounds.pending is not None or self.link.pending_transfers()
              or self.remeasuring.wants_wakeups(now)):
            wait = 1.0
        else:  # until its next heartbeat or re-measuring (which may start when the wait for a plan ends)
            wait = max(0.05, min(self.uplink.status_at + self.config.heartbeat_s, self.remeasuring.wake_at(now)) - now)
        return min(wait, self.uplink.resend_wait(now))  # sooner when an update is due to be sent again

    def _handle(self, env: Envelope) -> str | None:
        """Dispatch one message from the coordinator; why the device ends, if it does."""
        body = env.body
        self.uplink.heard(env)
        if isinstance(body, Ack) and env.reply_to == self._register_id:
            self._registered = True
        elif isinstance(body, Plan):
            self.remeasuring.plan_came()
            self.rounds.on_plan(env)
        elif isinstance(body, (Evaluate, StatsRequest)):  # answered from its held-out / training data
            self.rounds.answer(env)
        elif isinstance(body, Error):
            self.errors.append(body)
            log.warning("%s: coordinator error %s: %s", self.config.device_id, body.code, body.message)
            if body.code == ErrorCode.UNKNOWN_DEVICE:
                self._registered, self._last_register = False, 0.0
            if body.code in (ErrorCode.UNSUPPORTED_METHOD, ErrorCode.TASK_MISMATCH):  # a method or data it lacks
                self.turned_away = f"the coordinator turned this device away: {body.message}"
                return self.turned_away
            if body.code == ErrorCode.KIND:
                self.remeasuring.not_understood(env.reply_to)
        elif isinstance(body, RoundStart):  # a plan follows for each participant: no re-measuring meanwhile
            self.uplink.round_started(env.round)
            if self.config.device_id in body.participants:
                self.remeasuring.plan_announced(body.deadline_s)
            if self.sim.on_round_start is not None:
                self.sim.on_round_start(env.round)
        elif isinstance(body, Model):  # install the published inference model, if its signature checks out
            self.uplink.reply(self.installer.install(body), env)
        elif isinstance(body, Stop):
            return body.reason or "stopped by coordinator"
        elif isinstance(body, Status) and self._registered:  # the coordinator (re)connected: a roll call,
            self.rounds.heartbeat()  # answered at once (an unregistered device's registration is its answer)
        return None

    # -- sending ----------------------------------------------------------
    def _register(self) -> None:
        env = Envelope.of(
            Register(profile=self.profile.to_dict(), num_samples=len(self.data),
                     capabilities=(*DEVICE_METHODS, *self.config.features), sdk_version=SDK_VERSION,
                     connection=self.link.transport.connection_stamp if self.link else 0,
                     input_shape=tuple(int(n) for n in self.data.x.shape[1:]), num_classes=self.data.num_classes),
            self.config.device_id,
        )
        self._register_id = env.msg_id
        self._last_register = time.monotonic()
        self.uplink.envelope(env)

    def _train(self, rnd: int, plan: Plan) -> Update | None:
        """Train round ``rnd`` on ``plan`` and upload the update (a test device overrides it)."""
        return self.rounds.train(rnd, plan, self.on_round)

    def _send_update(self, update: Update, rnd: int) -> None:
        """Send ``update`` and keep it until the coordinator answers it (a test device overrides it)."""
        self.uplink.update(update, rnd)
