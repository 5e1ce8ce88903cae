"""pi-evil: a compromised fleet member with valid credentials, for bench/hostile.py (issue 35).

One process: it connects as the MQTT user ``pi-evil`` (its bundle's password and CA), speaks
edgefl's protocol (edge_sdk.protocol's messages, codec and chunking over edge_sdk's transport and
link) and runs the attacks it is given at the rates its flags fix, so that a bench measures the
fleet, not the attacker's share of the CPU:

* ``poison``     registers like an honest device (``--samples``); answers every plan at once with an
                 update of the plan's names and shapes filled with ``--poison-value``.
* ``heavy_zero`` registers claiming ``--heavy-samples`` (refused: registers with ``--samples``, then
                 re-registers with the heavy claim before every update: the mid-job variant); answers
                 every plan with the plan's own weights (a zero delta) and the heavy sample count.
* ``flood``      malformed or rejected frames on its own uplink at ``--flood-rate`` per second, from
                 the first round to the end (each earns an error reply).
* ``takeover``   connects with every ``--steal-id`` (an honest device's and the coordinator's client
                 id) using pi-evil's own username and password, and reconnects ``--takeover-interval-s``
                 after each time it is thrown out (holding the id).
* ``padding``    ``--padding-chunks`` chunk frames of one transfer, 1 data byte each under
                 ``--padding-bytes`` of padding in an unknown body field, at ``--padding-rate`` per
                 second from the first round on; never completed.
* ``amplify``    registers; for ``--amplify-seconds`` after each plan, ``error{incomplete}`` on its
                 uplink and ``status`` with ever newer connection stamps, together ``--amplify-rate``
                 per second; then declines the round (``not_training``) so as not to hold it.
* ``silent``     registers like an honest device; takes every plan and never answers (no update, no
                 decline): without a straggler rule every round waits for it until its deadline.
* ``flaky``      not an attack: an honest device that drops out half the time. Registers; answers a
                 seeded half of its plans with the plan's own weights (an update that learnt
                 nothing, its honest sample count), the other half never.
* ``spoof``      at every round start, ``--spoof-transfers`` chunked transfers whose envelope sender
                 is an honest device, on pi-evil's own uplink, at ``--spoof-rate`` per second, each
                 left incomplete (blame on time-out, eviction of others' transfers above 256).

An attacker that does not register (flood, padding, spoof or takeover alone) hears no round
announcement (since issue 39 they reach a round's participants alone): it starts ``--start-after-s``
after connecting and counts a round every ``--round-every-s``. (Before, these four waited for an
announcement that never came and sent nothing.)

Several attacks run together (``barrage``): registration then claims ``--heavy-samples`` and the
update after the amplification window is the poisoned one. Everything it sent and got back is
written as JSON to ``--stats`` every second and at the end (SIGTERM or SIGINT stops it).

    python bench/hostile_attacks.py --attacks poison --bundle DIR --job home --stats out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import tomllib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from edge_sdk.networking.link import MessageLink, Received, Rejected
from edge_sdk.protocol.codec import encode_frame
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import (
    SCHEMA_VERSION, Ack, Chunk, Envelope, Error, Model, Plan, Register, RoundStart, Status, Update,
    encode_envelope,
)
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError

__all__ = ["ATTACKS", "BARRAGE", "OPTIONS", "AttackConfig", "Attacker", "Pacer", "Tally", "flood_frames", "padded_chunk_frame"]

ATTACKS = ("poison", "heavy_zero", "flood", "takeover", "padding", "amplify", "spoof", "silent", "flaky")
#: attacks that register pi-evil as a device (it then takes part in every round)
REGISTERING = frozenset({"poison", "heavy_zero", "amplify", "silent", "flaky"})
#: the barrage: every attack at once but ``silent`` and ``flaky`` (which would keep its poisoned updates back)
BARRAGE = tuple(a for a in ATTACKS if a not in ("silent", "flaky"))
PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "raspberry-pi-4b.toml"


@dataclass(frozen=True)
class AttackConfig:
    """Who the attacker is, what it does and how fast (every rate is an upper bound it keeps)."""

    attacks: tuple[str, ...]
    url: str
    username: str
    password: str
    ca_file: str
    job: str = "home"
    method: str = "fedavg"
    honest: tuple[str, ...] = ("pi-kitchen", "pi-den")
    steal_ids: tuple[str, ...] = ()
    samples: int = 1200
    heavy_samples: int = 100_000_000
    poison_value: float = 1e30
    flood_rate: float = 3000.0
    #: 0: the flood takes no MQTT message ids, so its backlog in the attacker's own client never
    #: blocks the attacker's other messages (with 1, 65,535 unacknowledged frames would)
    flood_qos: int = 0
    #: "uplink" (the coordinator reads every frame) or "profile" (edgefl/profile/<it>, which nobody
    #: reads: a control that leaves the attacker's and the broker's CPU share and removes the coordinator's)
    flood_topic: str = "uplink"
    amplify_rate: float = 200.0
    amplify_seconds: float = 5.0
    padding_chunks: int = 1400
    padding_bytes: int = 1_000_000
    padding_rate: float = 40.0
    spoof_transfers: int = 300
    spoof_rate: float = 300.0
    takeover_interval_s: float = 1.0
    #: an attacker that does not register hears no round announcement (they go to the participants
    #: alone): it starts this long after connecting and counts a new round every `round_every_s`
    start_after_s: float = 6.0
    round_every_s: float = 4.0
    max_seconds: float = 3600.0

    @property
    def registers(self) -> bool:
        return bool(REGISTERING & set(self.attacks))

    @property
    def claimed_samples(self) -> int:
        return self.heavy_samples if "heavy_zero" in self.attacks else self.samples


class Pacer:
    """Spaces events ``rate`` per second; after a stall it resumes at the rate, never in a burst."""

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    def wait(self, stop: threading.Event) -> bool:
        """Block until the next event is due; False once ``stop`` is set."""
        now = time.monotonic()
        if self.next > now:
            if stop.wait(self.next - now):
                return False
        elif now - self.next > 0.5:
            self.next = now
        self.next += self.interval
        return not stop.is_set()


@dataclass
class Tally:
    """Messages and bytes one attack sent, and for how long it was sending: its rate is over its
    active time (gaps above ``GAP_S`` between two sends, e.g. between per-round bursts, not counted)."""

    GAP_S = 1.0
    messages: int = 0
    bytes: int = 0
    failed: int = 0  # publishes the transport refused (e.g. its queue full, not connected)
    active_s: float = 0.0
    first: float | None = None
    last: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.messages += 1
            self.bytes += nbytes
            if self.last is not None and now - self.last <= self.GAP_S:
                self.active_s += now - self.last
            self.first = now if self.first is None else self.first
            self.last = now

    def summary(self) -> dict[str, float]:
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        active = self.active_s
        return {"messages": self.messages, "bytes": self.bytes, "failed": self.failed, "span_s": round(span, 2),
                "active_s": round(active, 2),
                "messages_per_s": round(self.messages / active, 1) if active > 0 else 0.0,
                "bytes_per_s": round(self.bytes / active, 1) if active > 0 else 0.0}


def _header(kind: str, sender: str, body: dict[str, Any], rnd: int = -1) -> dict[str, Any]:
    return {"v": SCHEMA_VERSION, "kind": kind, "id": uuid.uuid4().hex, "reply_to": None, "round": rnd,
            "sender": sender, "body": body}


def flood_frames(sender: str, count: int = 64) -> list[bytes]:
    """Small frames the coordinator must reject, of every kind of wrong: not msgpack, truncated,
    not a map, a wrong version, an unknown kind, a missing or mistyped field, an update from a
    device that never registered, data the header does not reference."""
    rng = np.random.default_rng(35)
    good = encode_envelope(Envelope.of(Status("idle"), sender))
    shapes = [
        lambda i: bytes(rng.integers(0, 256, 48, dtype=np.uint8)),                       # noise
        lambda i: good[: len(good) // 2],                                                  # truncated
        lambda i: msgpack.packb([1, 2, i]),                                                # not a map
        lambda i: msgpack.packb({**_header("status", sender, {"state": "idle"}), "v": 99}),  # version
        lambda i: msgpack.packb(_header(f"nonsense{i}", sender, {})),                      # kind
        lambda i: msgpack.packb(_header("register", sender, {"num_samples": "many"})),     # types
        lambda i: msgpack.packb(_header("update", sender, {"label": "global", "tensors": {},
                                                           "num_samples": 1, "metrics": {}}, rnd=i)),
        lambda i: good + b"trailing bytes",                                                # unreferenced
    ]
    return [shapes[i % len(shapes)](i) for i in range(count)]


def padded_chunk_frame(sender: str, transfer_id: str, index: int, count: int, sha256: bytes,
                       padding: bytes, rnd: int = -1) -> bytes:
    """A chunk frame with 1 data byte and ``padding`` in an unknown body field (decoders ignore
    unknown fields): it costs its receiver the whole frame if the slice is kept as a view."""
    body = Chunk(transfer_id, index, count, count, sha256, b"\x00").to_body()
    body["padding"] = padding
    return encode_frame(_header("chunk", sender, body, rnd))


class Attacker:
    """pi-evil's connections, its attacks as threads, and what it sent and got back."""

    def __init__(self, config: AttackConfig) -> None:
        self.config = config
        self.topics = Topics(job=config.job)
        self.me = config.username
        self.stop = threading.Event()
        self.started = time.monotonic()
        # a deep receive queue where the transport has one, so that what comes back is counted, not dropped
        deep = {"max_queue": 200_000} if "max_queue" in TransportConfig.__dataclass_fields__ else {}
        self.transport = MqttTransport(self._transport_config(self.me, **deep))
        self.link = MessageLink(self.transport)
        self.tally: dict[str, Tally] = {name: Tally() for name in (*ATTACKS, "register", "update", "decline", "ack")}
        self.received: Counter[str] = Counter()  # messages back, by kind (and error code)
        self._received_lock = threading.Lock()
        self.first_round = threading.Event()
        self.rounds_seen: set[int] = set()
        self.registered_with: int | None = None  # the sample count its accepted registration claims
        self.register_refusals: list[str] = []  # "claim: code" of each registration refused
        self._register_answer = threading.Event()
        self._register_id: str | None = None
        self._register_claim = 0
        self._profile: dict[str, Any] = {}
        self._plans_done: set[int] = set()
        self._new_round = threading.Condition()
        self._round = -1
        self._holders: dict[str, MqttTransport] = {}
        self._held_s: Counter[str] = Counter()  # seconds each stolen id was held
        self._attempts: Counter[str] = Counter()  # first connections tried with each stolen id
        self._threads: list[threading.Thread] = []
        self.notes: list[str] = []

    def _transport_config(self, client_id: str, **extra: Any) -> TransportConfig:
        c = self.config
        settings: dict[str, Any] = {"connect_timeout": 15.0, **extra}
        return TransportConfig(url=c.url, client_id=client_id, username=c.username, password=c.password,
                               ca_file=c.ca_file, **settings)

    # -- running ---------------------------------------------------------------
    def run(self, stats: Path) -> None:
        """Connect, start every attack, write stats every second until stopped."""
        self.transport.subscribe(self.topics.downlink(self.me))
        self.transport.subscribe(self.topics.broadcast())
        self.transport.connect()
        workers = {"receiver": self._receive}
        if self.config.registers:
            workers["register"] = self._register_until_acked
        for name in ("flood", "padding", "spoof", "takeover"):
            if name in self.config.attacks:
                workers[name] = getattr(self, f"_{name}")
        if not self.config.registers:
            workers["round_clock"] = self._round_clock
        for name, target in workers.items():
            thread = threading.Thread(target=self._guard, args=(name, target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        end = self.started + self.config.max_seconds
        while not self.stop.wait(1.0) and time.monotonic() < end:
            self._write(stats)
        self.stop.set()
        for thread in self._threads:
            thread.join(3)
        for holder in self._holders.values():
            holder.close()
        self.transport.close()
        self._write(stats)

    def _guard(self, name: str, target: Any) -> None:
        try:
            target()
        except Exception as exc:  # an attack that breaks must not take the others (or the stats) with it
            self.notes.append(f"{name} failed: {type(exc).__name__}: {exc}")

    def _publish(self, tally: Tally, topic: str, frame: bytes, qos: int = 1, retry_s: float = 0.05) -> None:
        try:
            self.transport.publish(topic, frame, qos=qos)
            tally.add(len(frame))
        except TransportError:
            tally.failed += 1
            self.stop.wait(retry_s)

    def _send(self, tally: Tally, topic: str, envelope: Envelope) -> None:
        try:
            tally.add(self.link.send(topic, envelope))
        except (TransportError, ValueError):
            tally.failed += 1

    # -- receiving ---------------------------------------------------------------
    def _receive(self) -> None:
        """Count everything sent back; follow rounds; answer plans in a thread of their own."""
        while not self.stop.is_set():
            item = self.link.poll(0.5)
            if isinstance(item, Rejected):
                self._count("rejected")
            if not isinstance(item, Received):
                continue
            env = item.envelope
            body = env.body
            self._count(env.kind if not isinstance(body, Error) else f"error:{body.code}")
            if isinstance(body, RoundStart):
                with self._new_round:
                    self._round = max(self._round, env.round)
                    self.rounds_seen.add(env.round)
                    self._new_round.notify_all()
                self.first_round.set()
            elif self._register_id is not None and env.reply_to == self._register_id:
                if isinstance(body, Error):
                    self.register_refusals.append(f"{self._register_claim}: {body.code}")
                else:
                    self.registered_with = self._register_claim
                self._register_answer.set()
            elif isinstance(body, Model) and self.registered_with is not None:
                # acknowledged like an installed model, or the coordinator waits a minute for it at the end
                ack = Envelope.of(Ack(f"model for round {body.round} installed"), self.me, env.round, env.msg_id)
                self._send(self.tally["ack"], self.topics.uplink(self.me), ack)
            elif isinstance(body, Plan) and env.round not in self._plans_done and self.config.registers:
                self._plans_done.add(env.round)
                threading.Thread(target=self._guard, args=("plan", lambda e=env: self._answer(e)),
                                 daemon=True).start()

    def _round_clock(self) -> None:
        """Rounds for an attacker that hears none: the first after `start_after_s`, then one every
        `round_every_s` (round announcements reach only a round's participants)."""
        if self.stop.wait(self.config.start_after_s):
            return
        while True:
            with self._new_round:
                self._round += 1
                self.rounds_seen.add(self._round)
                self._new_round.notify_all()
            self.first_round.set()
            if self.stop.wait(self.config.round_every_s):
                return

    def _count(self, what: str) -> None:
        with self._received_lock:
            self.received[what] += 1

    def wait_round(self, after: int) -> int | None:
        """Block until a round later than ``after`` starts; its number (None once stopping)."""
        with self._new_round:
            while self._round <= after and not self.stop.is_set():
                self._new_round.wait(0.5)
            return None if self.stop.is_set() else self._round

    # -- registering attacks -------------------------------------------------------------
    def _register(self, claim: int) -> bool:
        """Send one registration claiming ``claim`` samples; True once the coordinator answered it."""
        env = Envelope.of(Register(self._profile, claim, (self.config.method,), "0.1.0",
                                   connection=self.transport.connection_stamp), self.me)
        self._register_answer.clear()
        self._register_id, self._register_claim = env.msg_id, claim
        self._send(self.tally["register"], self.topics.uplink(self.me), env)
        return self._register_answer.wait(5.0)

    def _register_until_acked(self) -> None:
        """Register like a device; claiming ``--heavy-samples`` when heavy_zero is on. If that claim
        is refused, register with the honest-looking count instead (then re-register with the heavy
        count in every round: see `_answer`), so that the attacker always takes part."""
        with open(PROFILE, "rb") as fh:
            doc = tomllib.load(fh)
        self._profile = {k: (v["value"] if isinstance(v, dict) else v) for k, v in doc.items()}
        claim = self.config.claimed_samples
        while self.registered_with is None and not self.stop.is_set():
            if self._register(claim) and self.registered_with is None:
                claim = self.config.samples  # refused: fall back to an honest-looking count

    def _answer(self, env: Envelope) -> None:
        """One plan: amplify first (if asked), then the poisoned / heavy update or a decline."""
        plan: Plan = env.body
        attacks = set(self.config.attacks)
        if "silent" in attacks:
            return  # takes the plan, answers nothing
        if "flaky" in attacks:
            if np.random.default_rng([env.round, 0xF1A]).random() < 0.5:
                return  # dropped out this round
            update = Update(plan.label, {k: np.array(a) for k, a in plan.tensors.items()}, self.config.samples,
                            {"loss": 2.3, "compute_s": 3.0})
            self._send(self.tally["update"], self.topics.uplink(self.me), Envelope.of(update, self.me, env.round))
            return
        if "amplify" in attacks:
            self._amplify(env.round)
        if attacks & {"poison", "heavy_zero"}:
            if "poison" in attacks:
                tensors = {k: (np.full(a.shape, self.config.poison_value, dtype=a.dtype) if a.dtype.kind == "f"
                               else np.array(a)) for k, a in plan.tensors.items()}
            else:  # the plan's own weights: a zero delta
                tensors = {k: np.array(a) for k, a in plan.tensors.items()}
            if self.registered_with != self.config.claimed_samples:  # re-register mid-job with the claim
                self._register(self.config.claimed_samples)
            update = Update(plan.label, tensors, self.config.claimed_samples, {"loss": 0.4, "compute_s": 3.0})
            self._send(self.tally["update"], self.topics.uplink(self.me), Envelope.of(update, self.me, env.round))
        elif "amplify" in attacks:
            decline = Envelope.of(Error(ErrorCode.NOT_TRAINING, "busy"), self.me, round=env.round, reply_to=env.msg_id)
            self._send(self.tally["decline"], self.topics.uplink(self.me), decline)

    def _amplify(self, rnd: int) -> None:
        """``error{incomplete}`` and ever newer ``status`` stamps, each of which re-sends the plan."""
        pacer, end, stamp = Pacer(self.config.amplify_rate), time.monotonic() + self.config.amplify_seconds, 0
        tally = self.tally["amplify"]
        while time.monotonic() < end and pacer.wait(self.stop):
            stamp += 1
            if stamp % 2:
                error = Error(ErrorCode.INCOMPLETE, f"transfer {uuid.uuid4().hex} timed out with 0/2 chunks")
                self._send(tally, self.topics.uplink(self.me), Envelope.of(error, self.me))
            else:
                status = Status("idle", connection=self.transport.connection_stamp + stamp)
                self._send(tally, self.topics.status(self.me), Envelope.of(status, self.me))

    # -- attacks on the uplink ------------------------------------------------------------
    def _flood(self) -> None:
        frames = flood_frames(self.me)
        self.first_round.wait()
        topic = self.topics.uplink(self.me) if self.config.flood_topic == "uplink" else f"edgefl/profile/{self.me}"
        pacer, i = Pacer(self.config.flood_rate), 0
        while pacer.wait(self.stop):
            self._publish(self.tally["flood"], topic, frames[i % len(frames)], qos=self.config.flood_qos)
            i += 1

    def _padding(self) -> None:
        c = self.config
        padding, tid = os.urandom(c.padding_bytes), uuid.uuid4().hex
        count = c.padding_chunks + 1  # one chunk is never sent: the transfer never completes
        sha = os.urandom(32)
        self.first_round.wait()
        pacer, topic = Pacer(c.padding_rate), self.topics.uplink(self.me)
        for index in range(c.padding_chunks):
            if not pacer.wait(self.stop):
                return
            self._publish(self.tally["padding"], topic, padded_chunk_frame(self.me, tid, index, count, sha, padding))

    def _spoof(self) -> None:
        """Per round: incomplete transfers in honest devices' names, on pi-evil's own uplink."""
        c, topic, rnd = self.config, self.topics.uplink(self.me), -1
        while (rnd := self.wait_round(rnd)) is not None:
            pacer = Pacer(c.spoof_rate)
            for i in range(c.spoof_transfers):
                if not pacer.wait(self.stop):
                    return
                victim = c.honest[i % len(c.honest)]
                chunk = Chunk(uuid.uuid4().hex, 0, 2, 128, os.urandom(32), os.urandom(64))
                self._publish(self.tally["spoof"], topic, encode_envelope(Envelope.of(chunk, victim, rnd)))

    def _takeover(self) -> None:
        """Connect with each stolen client id; paho reconnects after each time it is thrown out."""
        self.first_round.wait()
        if self.stop.wait(1.0):
            return
        interval = self.config.takeover_interval_s
        self._holders = {sid: MqttTransport(self._transport_config(
            sid, reconnect_min_delay=interval, reconnect_max_delay=interval, connect_timeout=5.0))
            for sid in self.config.steal_ids}
        pending = set(self._holders)
        while not self.stop.wait(0.1):
            for sid in list(pending):  # a refused first connection is tried again every interval
                self._attempts[sid] += 1
                try:
                    self._holders[sid].connect()
                    pending.discard(sid)
                except TransportError as exc:
                    self.tally["takeover"].failed += 1
                    self.notes.append(f"takeover {sid}: {exc}"[:300])
                    self._holders[sid] = MqttTransport(self._transport_config(
                        sid, reconnect_min_delay=interval, reconnect_max_delay=interval, connect_timeout=5.0))
                    self.stop.wait(interval)
            for sid, holder in self._holders.items():
                if holder.connected:
                    self._held_s[sid] += 0.1

    # -- stats --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        c = self.config
        rates = {"flood_rate": c.flood_rate, "flood_qos": c.flood_qos, "flood_topic": c.flood_topic,
                 "amplify_rate": c.amplify_rate, "amplify_seconds": c.amplify_seconds,
                 "padding_rate": c.padding_rate, "padding_chunks": c.padding_chunks,
                 "padding_bytes": c.padding_bytes, "spoof_rate": c.spoof_rate, "spoof_transfers": c.spoof_transfers,
                 "takeover_interval_s": c.takeover_interval_s, "samples": c.samples,
                 "heavy_samples": c.heavy_samples, "poison_value": c.poison_value}
        sent = {k: t.summary() for k, t in self.tally.items() if t.messages or t.failed}
        with self._received_lock:
            received = dict(self.received)
        return {
            "attacks": list(c.attacks), "settings": rates, "registered_with": self.registered_with,
            "register_refusals": self.register_refusals[-20:],
            "seconds": round(time.monotonic() - self.started, 1), "rounds_seen": sorted(self.rounds_seen),
            "sent": sent, "sent_total": {"messages": sum(t.messages for t in self.tally.values()),
                                         "bytes": sum(t.bytes for t in self.tally.values())},
            "back": {"bytes": self.link.bytes_received, "messages": sum(received.values()),
                     "dropped_unread": self.transport.dropped, "by_kind": received},
            "takeover": {sid: {"attempts": self._attempts[sid], "connects": h.connect_count,
                               "held_s": round(self._held_s[sid], 1)}
                         for sid, h in self._holders.items()},
            "main_connects": self.transport.connect_count,
            "notes": self.notes[-20:],
        }

    def _write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stats(), indent=1))
        os.replace(tmp, path)


#: the attacker's tunable numbers: (AttackConfig field, type, help); bench/hostile.py forwards them
OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("samples", int, "poison: the honest-looking sample count it registers and claims"),
    ("heavy_samples", int, "heavy_zero (and barrage): the sample count it registers and claims"),
    ("poison_value", float, "poison: the value every float weight of its update holds"),
    ("flood_rate", float, "flood: malformed frames per second"),
    ("flood_qos", int, "flood: MQTT QoS of its frames (the coordinator's error replies are QoS 1 either way)"),
    ("flood_topic", str, "flood: uplink, or profile (a topic nobody reads: a control for the CPU the attacker "
                         "and the broker take on shared cores)"),
    ("amplify_rate", float, "amplify: error{incomplete} + status messages per second"),
    ("amplify_seconds", float, "amplify: seconds of it after each plan (then it declines the round)"),
    ("padding_chunks", int, "padding: chunk frames sent (one transfer, never completed)"),
    ("padding_bytes", int, "padding: bytes of padding per chunk frame"),
    ("padding_rate", float, "padding: chunk frames per second"),
    ("spoof_transfers", int, "spoof: incomplete transfers in honest devices' names per round"),
    ("spoof_rate", float, "spoof: chunk frames per second"),
    ("takeover_interval_s", float, "takeover: seconds before it reconnects with a stolen id it lost"),
    ("start_after_s", float, "an attacker that does not register (flood, padding, spoof, takeover alone) hears no "
                             "round announcement: it starts this long after connecting"),
    ("round_every_s", float, "...and counts a new round this often (spoof's transfers are per round)"),
    ("max_seconds", float, "stop after this long whatever happens"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = AttackConfig((), "", "", "", "")
    p.add_argument("--attacks", required=True, help=f"comma-separated, of {', '.join(ATTACKS)}")
    p.add_argument("--bundle", required=True, type=Path, help="pi-evil's bundle folder (client.toml, password, ca.crt)")
    p.add_argument("--stats", required=True, type=Path, help="JSON file of what it sent and got back")
    p.add_argument("--job", default=d.job)
    p.add_argument("--method", default=d.method, help="the method the job runs (its registration lists it)")
    p.add_argument("--honest", default=",".join(d.honest), help="device ids spoof blames")
    p.add_argument("--steal-ids", default="", help="client ids takeover connects with (comma-separated)")
    for name, kind, text in OPTIONS:
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(d, name), help=text)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attacks = tuple(a for a in args.attacks.split(",") if a)
    if unknown := set(attacks) - set(ATTACKS):
        raise SystemExit(f"unknown attacks {sorted(unknown)}; known: {', '.join(ATTACKS)}")
    with open(args.bundle / "client.toml", "rb") as fh:
        broker = tomllib.load(fh)["broker"]
    config = AttackConfig(
        attacks=attacks, url=broker["url"], username=broker["username"],
        password=(args.bundle / "password").read_text().strip(), ca_file=str(args.bundle / "ca.crt"),
        job=args.job, method=args.method, honest=tuple(args.honest.split(",")),
        steal_ids=tuple(s for s in args.steal_ids.split(",") if s),
        **{name: getattr(args, name) for name, _, _ in OPTIONS})
    attacker = Attacker(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: attacker.stop.set())
    attacker.run(args.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
