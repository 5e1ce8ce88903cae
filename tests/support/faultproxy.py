"""A fault-injecting TCP proxy for MQTT, for tests and the soak: clients connect to it instead
of the broker.

It parses both byte streams into MQTT packets (fixed header + remaining-length varint) and, for
PUBLISH packets a `FaultPolicy` selects — `policy` for client → broker (uplink), `down_policy`
for broker → client (downlink) — can delay them (random delays reorder them), duplicate them
(the copy is sent again, same packet id, and the proxy forwards only one of the receiver's two
acknowledgements, as MQTT's own re-delivery would look: an extra PUBACK would acknowledge a later
message that reuses the id), throttle them (at most one every `gap_s`), drop them
(the proxy acknowledges a dropped qos-1 packet itself, so the sender believes it delivered:
a message lost beyond MQTT's reach), or `hold()` them until `release()` (a stalled link).
`drop_connections()` cuts every connection at once, as a network failure would; a client that
dies without sending DISCONNECT has its connection to the broker aborted with whatever the
proxy still held (so the broker publishes its last will). The asyncio loop runs in a daemon
thread; counters are read from the caller's thread.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import peek_header

__all__ = ["FaultPolicy", "FaultProxy", "edgefl_chunks", "read_packet"]

CONNECT, PUBLISH, PUBACK, DISCONNECT = 1, 3, 4, 14
UP, DOWN = "up", "down"


@dataclass(frozen=True)
class FaultPolicy:
    """Which PUBLISH packets of one direction to disturb, and how."""

    #: (topic, payload) → True for packets the faults apply to.
    select: Callable[[str, bytes], bool] = lambda topic, payload: True
    duplicate: float = 0.0  # probability that a selected packet is sent twice
    max_delay_s: float = 0.0  # each selected packet (and copy) is held uniform(0, max_delay_s)
    gap_s: float = 0.0  # throttle: selected packets leave at least gap_s apart
    drop: float = 0.0  # probability that a selected qos-1 packet is dropped (and acknowledged here)
    seed: int = 0


def edgefl_chunks(direction: str) -> Callable[[str, bytes], bool]:
    """A `FaultPolicy.select` for edgefl's chunk messages on ``up/`` (a device's uploads) or
    ``down/`` (what the coordinator sends it) topics, not its other messages."""
    def select(topic: str, payload: bytes) -> bool:
        try:
            return f"/{direction}/" in topic and peek_header(payload)[1] == "chunk"
        except ProtocolError:  # not an envelope: leave it alone
            return False
    return select


async def read_packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet (fixed header included); IncompleteReadError at EOF."""
    first = await reader.readexactly(1)
    header, length, shift = bytearray(first), 0, 0
    for _ in range(4):
        byte = (await reader.readexactly(1))[0]
        header.append(byte)
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise ValueError("malformed MQTT remaining length")
    return bytes(header) + await reader.readexactly(length)


def _publish_topic(packet: bytes) -> str:
    return _parse_publish(packet, v5=False)[0]


def _connect_level(packet: bytes) -> int:
    """Protocol level of a CONNECT packet (4: MQTT 3.1.1, 5: MQTT 5)."""
    i = 1
    while packet[i] & 0x80:
        i += 1
    i += 1
    return packet[i + 2 + int.from_bytes(packet[i:i + 2], "big")]


def _publish_packet_id(packet: bytes) -> bytes | None:
    """The 2-byte packet id of a qos-1/2 PUBLISH (None for qos 0)."""
    if not (packet[0] >> 1) & 3:
        return None
    i = 1
    while packet[i] & 0x80:
        i += 1
    i += 1
    i += 2 + int.from_bytes(packet[i:i + 2], "big")
    return packet[i:i + 2]


def _parse_publish(packet: bytes, v5: bool) -> tuple[str, bytes]:
    """(topic, payload) of a PUBLISH packet."""
    i = 1
    while packet[i] & 0x80:
        i += 1
    i += 1
    size = int.from_bytes(packet[i:i + 2], "big")
    topic = packet[i + 2:i + 2 + size].decode("utf-8", "replace")
    i += 2 + size
    if (packet[0] >> 1) & 3:
        i += 2  # packet id
    if v5:  # properties: a varint length, then that many bytes
        length = shift = 0
        while True:
            byte = packet[i]
            i += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        i += length
    return topic, packet[i:]


@dataclass(eq=False)
class _Lane:
    """One direction of a proxied connection: packets waiting to be written to `writer`."""
    direction: str
    writer: asyncio.StreamWriter
    heap: list[tuple[float, int, int, bytes]] = field(default_factory=list)  # (release, seq, copy, data)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_release: float = 0.0
    next_slot: float = 0.0
    written_seq: int = -1
    seq: int = 0
    held: list[tuple[int, bytes]] = field(default_factory=list)  # (seq, packet) while holding


@dataclass(eq=False)
class _Conn:
    up: _Lane  # to the broker
    down: _Lane  # to the client
    #: direction → packet id → PUBACKs of that direction to swallow (one per duplicated PUBLISH)
    swallow: dict[str, dict[bytes, int]] = field(default_factory=lambda: {UP: {}, DOWN: {}})
    closing: bool = False
    v5: bool = False  # MQTT 5 (PUBLISH has properties), from the CONNECT packet

    def lane(self, direction: str) -> _Lane:
        return self.up if direction == UP else self.down


class FaultProxy:
    """Listens on 127.0.0.1:`port` and forwards to the broker at `upstream_port`."""

    def __init__(self, upstream_port: int, policy: FaultPolicy = FaultPolicy(),
                 upstream_host: str = "127.0.0.1", down_policy: FaultPolicy | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.policy = policy
        #: broker → client faults; None: that direction passes untouched
        self.down_policy = down_policy
        self._rngs = {UP: random.Random(policy.seed), DOWN: random.Random(down_policy.seed if down_policy else 0)}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[_Conn] = set()
        self.port = 0
        #: PUBLISH packets seen / selected / sent twice / held back / sent after a later one /
        #: dropped, in both directions together.
        self.publishes = self.selected = self.duplicated = self.delayed = self.reordered = self.dropped = 0
        #: topic → PUBLISH packets forwarded to the broker (copies included).
        self.forwarded: dict[str, int] = {}
        self.connections = 0
        self._holding: set[str] = set()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    # -- lifecycle (test thread) ------------------------------------------------
    def start(self) -> "FaultProxy":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def drop_connections(self) -> None:
        """Abort every proxied connection at once (both sides see a reset)."""
        self._call(lambda: [self._abort(conn) for conn in list(self._conns)])

    def hold(self, directions: tuple[str, ...] = (UP,)) -> None:
        """Keep selected PUBLISH packets of `directions` ("up", "down") from now on until
        `release()` (a stalled link)."""
        self._call(lambda: self._holding.update(directions))

    def release(self) -> None:
        """Send the held packets (in arrival order) and stop holding."""
        def release() -> None:
            self._holding.clear()
            now = asyncio.get_running_loop().time()
            for conn in self._conns:
                for lane in (conn.up, conn.down):
                    for seq, packet in lane.held:
                        self._push(lane, now, seq, 0, packet)
                    lane.held.clear()
        self._call(release)

    def _call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the proxy's loop and wait for it."""
        assert self._loop is not None
        done = threading.Event()
        self._loop.call_soon_threadsafe(lambda: (fn(), done.set()))
        if not done.wait(5):
            raise RuntimeError("fault proxy loop is not responding")

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ---------------------------------------------------------------
    def _main(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, sock=sock))
        ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for conn in list(self._conns):
                self._abort(conn)
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        conn = _Conn(_Lane(UP, up_writer), _Lane(DOWN, writer))
        self._conns.add(conn)
        tasks = [asyncio.create_task(self._read(reader, conn, UP)),
                 asyncio.create_task(self._sender(conn, conn.up)),
                 asyncio.create_task(self._read(up_reader, conn, DOWN)),
                 asyncio.create_task(self._sender(conn, conn.down))]
        await asyncio.wait([tasks[0], tasks[2]], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        self._abort(conn)
        self._conns.discard(conn)

    async def _read(self, reader: asyncio.StreamReader, conn: _Conn, direction: str) -> None:
        """Read the packets of one direction and schedule them on its lane."""
        loop, last_type, lane = asyncio.get_running_loop(), 0, conn.lane(direction)
        policy = self.policy if direction == UP else self.down_policy
        try:
            while True:
                packet = await read_packet(reader)
                last_type = packet[0] >> 4
                now = loop.time()
                if last_type == CONNECT:
                    conn.v5 = _connect_level(packet) == 5
                if last_type == PUBACK and self._swallowed(conn, direction, packet):
                    pass
                elif last_type == PUBLISH and policy is not None:
                    self.publishes += 1
                    self._schedule_publish(conn, direction, policy, packet, lane.seq, now)
                else:  # keeps its place behind everything sent before it
                    self._push(lane, max(now, lane.last_release), lane.seq, 0, packet)
                lane.seq += 1
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        if direction == DOWN:
            conn.closing = True
            return
        if last_type == DISCONNECT:  # a clean close: deliver what is held, then close
            while conn.up.heap and not conn.closing:
                await asyncio.sleep(0.01)
        self._abort(conn)  # a dead client: what the proxy still holds is lost with it

    @staticmethod
    def _swallowed(conn: _Conn, direction: str, puback: bytes) -> bool:
        """Is this the first of two acknowledgements of a PUBLISH the proxy duplicated?"""
        waiting = conn.swallow[direction]
        packet_id = puback[2:4]  # remaining length < 128: one byte
        if waiting.get(packet_id, 0) <= 0:
            return False
        waiting[packet_id] -= 1
        return True

    def _schedule_publish(self, conn: _Conn, direction: str, policy: FaultPolicy, packet: bytes,
                          seq: int, now: float) -> None:
        lane, rng = conn.lane(direction), self._rngs[direction]
        if not policy.select(*_parse_publish(packet, conn.v5)):
            self._push(lane, max(now, lane.last_release), seq, 0, packet)
            return
        self.selected += 1
        if direction in self._holding:
            lane.held.append((seq, packet))
            return
        packet_id = _publish_packet_id(packet)
        if packet_id is not None and (packet[0] >> 1) & 3 == 1 and rng.random() < policy.drop:
            self.dropped += 1  # lost, yet acknowledged to its sender
            back = conn.down if direction == UP else conn.up
            self._push(back, max(now, back.last_release), back.seq, 0, bytes([PUBACK << 4, 2]) + packet_id)
            back.seq += 1
            return
        release = now + rng.uniform(0, policy.max_delay_s)
        if policy.gap_s:
            release = max(release, lane.next_slot)
            lane.next_slot = release + policy.gap_s
        if release > now:
            self.delayed += 1
        self._push(lane, release, seq, 0, packet)
        if rng.random() < policy.duplicate:
            self.duplicated += 1
            if packet_id is not None:
                back = conn.swallow[DOWN if direction == UP else UP]
                back[packet_id] = back.get(packet_id, 0) + 1
            self._push(lane, release + rng.uniform(0, policy.max_delay_s), seq, 1, packet)

    def _push(self, lane: _Lane, release: float, seq: int, copy: int, packet: bytes) -> None:
        heapq.heappush(lane.heap, (release, seq, copy, packet))
        lane.last_release = max(lane.last_release, release)
        lane.wake.set()

    async def _sender(self, conn: _Conn, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not lane.heap:
                lane.wake.clear()
                await lane.wake.wait()
                continue
            release, seq, copy, packet = lane.heap[0]
            wait = release - loop.time()
            if wait > 0:  # sleep, unless an earlier packet is pushed meanwhile
                lane.wake.clear()
                try:
                    await asyncio.wait_for(lane.wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                continue
            heapq.heappop(lane.heap)
            if packet[0] >> 4 == PUBLISH:
                if lane.direction == UP:
                    topic = _publish_topic(packet)
                    self.forwarded[topic] = self.forwarded.get(topic, 0) + 1
                if not copy:
                    if seq < lane.written_seq:
                        self.reordered += 1
                    lane.written_seq = max(lane.written_seq, seq)
            try:
                lane.writer.write(packet)
                await lane.writer.drain()
            except ConnectionError:
                return

    def _abort(self, conn: _Conn) -> None:
        conn.closing = True
        for lane in (conn.up, conn.down):
            lane.heap.clear()
            lane.writer.transport.abort()
