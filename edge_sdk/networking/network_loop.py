"""One thread that drives the sockets of many MQTT connections.

paho's threaded interface (`loop_start`) gives every connection its own network thread, which
polls its socket with ``select()`` — a thread per connection, and no connection on a file
descriptor above 1024. A process that hosts many simulated devices instead hands their
connections to one :class:`NetworkLoop`: paho's external-loop API (``loop_read``,
``loop_write``, ``loop_misc`` and the socket callbacks) on one ``selectors`` selector (epoll on
Linux), so an idle connection costs a registered socket and nothing else. A connection that drops
is reconnected by the loop, as paho's own thread would, with the same back-off.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

import paho.mqtt.client as mqtt

__all__ = ["NetworkLoop"]

log = logging.getLogger(__name__)
#: How often (seconds) the loop runs paho's housekeeping (keep-alive pings) over its connections.
MISC_EVERY_S = 1.0


@dataclass
class _Connection:
    client: mqtt.Client
    sock: socket.socket | None = None
    fd: int = -1  # its socket's descriptor, registered as a number: a closed socket's lookup is O(connections)
    writing: bool = False
    closing: bool = False  # detached: forget it once its socket closes (or at once if it has none)
    reconnect_at: float | None = None  # lost: when to try again
    delay: float = 1.0
    min_delay: float = 1.0
    max_delay: float = 10.0


class NetworkLoop:
    """Drives the paho clients `attach`-ed to it from one daemon thread until `stop`."""

    def __init__(self, name: str = "edgefl-network", misc_every_s: float = MISC_EVERY_S) -> None:
        """``misc_every_s``: how often the keep-alives of all connections are looked at (paho's
        ``loop_misc``, a Python call per connection): a tenth of their keep-alive is close enough."""
        self._misc_every_s = misc_every_s
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        #: what other threads asked, applied by the loop's thread: (op, client, socket, its connection)
        self._ops: deque[tuple[str, mqtt.Client, socket.socket | None, _Connection | None]] = deque()
        self._conns: dict[int, _Connection] = {}  # id(client) -> its connection
        self._lost: dict[int, _Connection] = {}  # the connections waiting to reconnect (reconnect_at set)
        self._stopping = threading.Event()
        self._wake_pending = False  # a wake-up byte is unread
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def misc_every_s(self) -> float:
        """How often (seconds) the keep-alives of all connections are looked at."""
        return self._misc_every_s

    def __len__(self) -> int:
        return len(self._conns)

    # -- what clients (any thread) call ---------------------------------------------------
    def attach(self, client: mqtt.Client, min_delay: float = 1.0, max_delay: float = 10.0) -> None:
        """Drive ``client`` from this loop (before its ``connect``; never `loop_start` it)."""
        client.on_socket_open = lambda c, _u, sock: self._queue("open", c, sock)
        client.on_socket_close = lambda c, _u, sock: self._queue("close", c, sock)
        client.on_socket_register_write = lambda c, _u, sock: self._queue("write", c, sock)
        client.on_socket_unregister_write = lambda c, _u, sock: self._queue("unwrite", c, sock)
        self._queue("attach", client, None,
                    _Connection(client, delay=min_delay, min_delay=min_delay, max_delay=max_delay))

    def detach(self, client: mqtt.Client) -> None:
        """Stop driving ``client`` once its socket has closed (call after its ``disconnect``)."""
        self._queue("detach", client, None)

    def reset(self, client: mqtt.Client) -> None:
        """Close ``client``'s socket now, from the loop's thread, and forget it, without paho
        reading the end of the stream first (``client`` is done with: `MqttTransport.abort`). A
        socket set to reset on close resets the connection: the broker publishes the will."""
        self._queue("reset", client, None)

    def stop(self) -> None:
        """Stop driving the connections and drop those still open (their sockets are closed
        under their clients, which must not be used after; a socket set to reset on close, as
        `MqttTransport.abort` sets it, resets its connection: the broker publishes its will)."""
        self._stopping.set()
        self._wake()
        self._thread.join(5.0)

    def _queue(self, op: str, client: mqtt.Client, sock: socket.socket | None,
               new: _Connection | None = None) -> None:
        self._ops.append((op, client, sock, new))  # deque.append is atomic: no lock
        if threading.get_ident() != self._thread.ident:  # the loop's own thread applies it before it waits
            self._wake()

    def _wake(self) -> None:
        """Make the loop's thread apply the queued ops now. One wake-up byte at a time: while the
        flag is set, the loop has yet to clear it and then apply every op queued before (it reads
        the bytes, clears the flag, and applies at its next turn), so thousands of ops queued at
        once cost one system call."""
        if self._wake_pending:
            return
        self._wake_pending = True
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    # -- the loop's thread ------------------------------------------------------------------
    def _run(self) -> None:
        next_misc = time.monotonic() + self._misc_every_s
        while not self._stopping.is_set():
            try:
                next_misc = self._turn(next_misc)
            except Exception:  # one connection's trouble must not stop every other connection
                log.exception("network loop: a turn failed; going on")
        self._apply_ops()  # the last detaches and closes
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._selector.close()

    def _turn(self, next_misc: float) -> float:
        """One pass: apply what other threads asked, wait for socket events (or the next
        housekeeping or reconnect), read and write, keep alive, reconnect; the next housekeeping."""
        self._apply_ops()
        timeout = max(0.0, min(next_misc, self._next_reconnect()) - time.monotonic())
        for key, mask in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError, OSError):
                    while self._wake_r.recv(4096):
                        pass
                self._wake_pending = False  # after reading: an op queued before this is applied next turn
                continue
            conn: _Connection = key.data
            if mask & selectors.EVENT_READ:
                conn.client.loop_read()
            if mask & selectors.EVENT_WRITE and conn.sock is not None:
                conn.client.loop_write()
        now = time.monotonic()
        if now >= next_misc:
            next_misc = now + self._misc_every_s
            for conn in list(self._conns.values()):
                if conn.sock is not None:
                    conn.client.loop_misc()
        self._reconnect_due(now)
        return next_misc

    def _apply_ops(self) -> None:
        while self._ops:
            op, client, sock, new = self._ops.popleft()
            conn = self._conns.get(id(client))
            if op == "attach" and new is not None:
                self._conns[id(client)] = new
            elif conn is None:
                continue
            elif op == "open" and sock is not None:
                self._unregister(conn)
                conn.sock, conn.writing, conn.reconnect_at, conn.delay = sock, False, None, conn.min_delay
                self._lost.pop(id(client), None)
                self._register(conn)
                if client.want_write():
                    self._set_writing(conn, True)
            elif op == "close" and sock is not None and conn.sock is not None and sock is not conn.sock:
                continue  # the close of a socket it has replaced since
            elif op == "close":
                self._unregister(conn)
                if conn.closing:
                    del self._conns[id(client)]
                else:  # lost: reconnect as paho's own thread would, with its back-off
                    self._retry_later(conn, time.monotonic())
            elif op in ("write", "unwrite"):
                self._set_writing(conn, op == "write")
            elif op == "reset":
                self._drop(conn)
            elif op == "detach":
                conn.closing = True
                conn.reconnect_at = None
                self._lost.pop(id(client), None)
                if conn.sock is None:
                    del self._conns[id(client)]

    def _register(self, conn: _Connection) -> None:
        """Watch ``conn``'s socket (by its descriptor); a stale registration of the same
        descriptor (a closed socket whose close was not applied yet when the number was reused)
        is dropped first."""
        assert conn.sock is not None
        conn.fd = conn.sock.fileno()
        try:
            self._selector.register(conn.fd, selectors.EVENT_READ, conn)
        except KeyError:
            stale = self._selector.get_key(conn.fd)
            self._selector.unregister(conn.fd)
            if isinstance(stale.data, _Connection):
                stale.data.sock, stale.data.fd, stale.data.writing = None, -1, False
            self._selector.register(conn.fd, selectors.EVENT_READ, conn)

    def _owns(self, conn: _Connection) -> bool:
        """Whether the selector's registration of ``conn.fd`` is still ``conn``'s (the number may
        have been closed and reused by another connection since)."""
        key = self._selector.get_map().get(conn.fd) if conn.fd >= 0 else None
        return key is not None and key.data is conn

    def _set_writing(self, conn: _Connection, writing: bool) -> None:
        """Watch the socket for room to write while paho has something left to write: first
        written at once, so that a small message costs no change of the selector."""
        if conn.sock is None:
            return
        if writing:
            conn.client.loop_write()  # write at once what can be written
            writing = conn.sock is not None and conn.client.want_write()
        if conn.writing == writing or conn.sock is None or not self._owns(conn):
            return
        conn.writing = writing
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.modify(conn.fd, events, conn)

    def _unregister(self, conn: _Connection) -> None:
        if conn.sock is not None:
            if self._owns(conn):
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(conn.fd)
            conn.sock, conn.fd = None, -1
            conn.writing = False

    def _drop(self, conn: _Connection) -> None:
        """Close ``conn``'s socket under its client (a socket set to reset on close resets the
        connection) and forget it."""
        sock = conn.sock
        self._unregister(conn)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._lost.pop(id(conn.client), None)
        self._conns.pop(id(conn.client), None)

    def _retry_later(self, conn: _Connection, now: float) -> None:
        conn.reconnect_at = now + conn.delay
        conn.delay = min(conn.delay * 2, conn.max_delay)
        self._lost[id(conn.client)] = conn

    def _next_reconnect(self) -> float:
        """When the next lost connection is due (only the lost ones are looked at: a turn costs
        nothing per healthy connection)."""
        return min((c.reconnect_at for c in self._lost.values() if c.reconnect_at is not None), default=float("inf"))

    def _reconnect_due(self, now: float) -> None:
        for key, conn in list(self._lost.items()):
            if conn.closing or conn.reconnect_at is None:
                del self._lost[key]
                continue
            if now < conn.reconnect_at:
                continue
            del self._lost[key]
            conn.reconnect_at = None
            try:
                conn.client.reconnect()  # opens the socket: its "open" op registers it
            except (OSError, ValueError) as exc:
                log.debug("reconnect failed: %s", exc)
                self._retry_later(conn, now)
