"""Split large encoded envelopes into ``chunk`` envelopes and reassemble them.

Every chunk carries the whole manifest (transfer_id, count, total_bytes, sha256 of the full
payload), so chunks may arrive in any order, duplicated, or interleaved with other transfers.
A chunk's slice is its frame's data region: it is copied once when the chunk frame is built,
kept as a view onto the received frame until the transfer completes, and joined once.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ProtocolError
from .messages import Chunk, Envelope, encode_envelope

__all__ = ["DEFAULT_CHUNK_SIZE", "MIN_CHUNK_SIZE", "CHUNK_OVERHEAD", "split_envelope_payload", "Reassembler"]

DEFAULT_CHUNK_SIZE = 1 << 20
MIN_CHUNK_SIZE = 1024
#: Upper bound on the bytes a chunk frame adds to its data slice (= its msgpack header, as the
#: slice is the frame's data region). The worst case is 384 bytes (128-char sender, int64
#: round/index/count/total, uint32 nbytes); see docs/protocol.md. 512 leaves headroom.
CHUNK_OVERHEAD = 512
_REMEMBER_DONE = 1024  # finished transfer ids remembered per sender
_REMEMBER_SENDERS = 4096  # senders whose finished ids are remembered (LRU)


def split_envelope_payload(payload: bytes, sender: str, round: int,
                           chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[bytes]:
    """``[payload]`` if it fits in ``chunk_size``, else encoded chunk envelopes each <= chunk_size."""
    if chunk_size < MIN_CHUNK_SIZE:
        raise ValueError(f"chunk_size {chunk_size} < minimum {MIN_CHUNK_SIZE}")
    mv = memoryview(payload).cast("B")
    total = mv.nbytes
    if total <= chunk_size:
        return [payload]
    step = chunk_size - CHUNK_OVERHEAD
    count = -(-total // step)
    sha = hashlib.sha256(mv).digest()
    tid = uuid.uuid4().hex
    out = []
    for i in range(count):
        body = Chunk(tid, i, count, total, sha, mv[i * step:(i + 1) * step])  # type: ignore[arg-type]
        wire = encode_envelope(Envelope.of(body, sender, round))
        if len(wire) > chunk_size:  # cannot happen for valid senders; never emit oversize
            raise RuntimeError(f"chunk of {len(wire)} bytes exceeds chunk_size {chunk_size}")
        out.append(wire)
    return out


def _immutable(data: bytes | memoryview) -> bytes | memoryview:
    """``data`` itself when it cannot change under us (bytes or a view of bytes), else a copy."""
    if isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes)):
        return data
    return bytes(data)


@dataclass
class _Transfer:
    sender: str
    transfer_id: str
    count: int
    total_bytes: int
    sha256: bytes
    last_seen: float
    parts: dict[int, bytes | memoryview] = field(default_factory=dict)
    nbytes: int = 0

    def report(self) -> tuple[str, str, int, int]:
        return (self.sender, self.transfer_id, len(self.parts), self.count)


class Reassembler:
    """Collect chunks per ``(sender, transfer_id)``; thread-safe.

    Memory is bounded by ``max_pending`` transfers of at most ``max_total_bytes`` each and
    ``max_buffered_bytes`` overall (default ``max(1 GiB, max_total_bytes)``; oldest transfers
    are dropped first). Transfers dropped for lack of room are reported by the next
    :meth:`expire` call, like timed-out ones.
    """

    def __init__(self, timeout_s: float = 30.0, max_total_bytes: int = 256 << 20, max_pending: int = 256,
                 clock: Callable[[], float] = time.monotonic, max_buffered_bytes: int | None = None) -> None:
        if max_buffered_bytes is None:  # default: 1 GiB, but always room for one maximal transfer
            max_buffered_bytes = max(1 << 30, max_total_bytes)
        if timeout_s <= 0 or max_total_bytes < 0 or max_pending < 1 or max_buffered_bytes < max_total_bytes:
            raise ValueError("invalid Reassembler limits (need timeout_s > 0, max_pending >= 1, "
                             "0 <= max_total_bytes <= max_buffered_bytes)")
        self.timeout_s = timeout_s
        self.max_total_bytes = max_total_bytes
        self.max_pending = max_pending
        self.max_buffered_bytes = max_buffered_bytes
        self._clock = clock
        self._lock = threading.RLock()
        self._pending: OrderedDict[tuple[str, str], _Transfer] = OrderedDict()  # oldest first
        self._done: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._evicted: deque[tuple[str, str, int, int]] = deque(maxlen=1024)
        self._buffered = 0
        #: Chunks ignored as duplicates: an index already held, or a chunk of a transfer
        #: finished or dropped recently (e.g. re-sent by MQTT after a reconnect).
        self.duplicates = 0

    @property
    def pending(self) -> int:
        """Number of incomplete transfers held."""
        with self._lock:
            return len(self._pending)

    @property
    def buffered_bytes(self) -> int:
        with self._lock:
            return self._buffered

    def pending_transfers(self) -> list[tuple[str, str]]:
        """``(sender, transfer_id)`` of every incomplete transfer held, oldest first."""
        with self._lock:
            return list(self._pending)

    def add(self, sender: str, chunk: Chunk) -> bytes | None:
        """Store ``chunk``; return the full payload once complete and verified, else None."""
        key = (sender, chunk.transfer_id)
        if type(chunk.index) is not int or type(chunk.count) is not int or not 0 <= chunk.index < chunk.count:
            raise ProtocolError("malformed", f"chunk index {chunk.index!r} outside 0..count-1")
        with self._lock:
            done = self._done.get(sender)
            if done is not None and chunk.transfer_id in done:
                self.duplicates += 1
                return None  # straggler or duplicate of a finished transfer
            t = self._pending.get(key)
            if t is None:
                t = self._start(sender, chunk)
            elif (chunk.count, chunk.total_bytes, chunk.sha256) != (t.count, t.total_bytes, t.sha256):
                raise ProtocolError("malformed", f"chunk manifest of transfer {chunk.transfer_id!r} "
                                    "disagrees with its first chunk")
            t.last_seen = self._clock()
            if chunk.index in t.parts:
                self.duplicates += 1
                return None  # duplicate
            size = memoryview(chunk.data).nbytes
            if t.nbytes + size > t.total_bytes:
                self._drop(key, remember=True)
                raise ProtocolError("malformed", f"transfer {chunk.transfer_id!r} holds more than its "
                                    f"declared {t.total_bytes} bytes")
            self._make_room(size, keep=key)
            t.parts[chunk.index] = _immutable(chunk.data)
            t.nbytes += size
            self._buffered += size
            if len(t.parts) < t.count:
                return None
            self._drop(key, remember=True)
            payload = b"".join(t.parts[i] for i in range(t.count))
            if len(payload) != t.total_bytes or hashlib.sha256(payload).digest() != t.sha256:
                raise ProtocolError("checksum", f"transfer {chunk.transfer_id!r} from {sender!r} "
                                    "failed its sha256/size check")
            return payload

    def expire(self) -> list[tuple[str, str, int, int]]:
        """Drop transfers idle for longer than ``timeout_s``.

        Returns ``(sender, transfer_id, received_chunks, count)`` for each, plus any transfer
        evicted for lack of room since the last call.
        """
        with self._lock:
            now = self._clock()
            out = list(self._evicted)
            self._evicted.clear()
            for key, t in list(self._pending.items()):
                if now - t.last_seen > self.timeout_s:
                    out.append(t.report())
                    self._drop(key, remember=True)
            return out

    def discard_sender(self, sender: str) -> int:
        """Drop all partial transfers of ``sender`` (e.g. its last will fired); return how many.

        Their ids are remembered, so chunks of them that still arrive (MQTT re-sends unacked
        ones after a reconnect) are ignored instead of starting a transfer that cannot finish.
        """
        with self._lock:
            keys = [k for k in self._pending if k[0] == sender]
            for k in keys:
                self._drop(k, remember=True)
            return len(keys)

    # ----------------------------------------------------------------- internals

    def _start(self, sender: str, chunk: Chunk) -> _Transfer:
        if chunk.total_bytes > self.max_total_bytes:
            raise ProtocolError("oversize", f"transfer of {chunk.total_bytes} bytes > limit {self.max_total_bytes}")
        if chunk.count > max(1, chunk.total_bytes):
            raise ProtocolError("malformed", f"{chunk.count} chunks cannot carry {chunk.total_bytes} bytes")
        while len(self._pending) >= self.max_pending:
            self._evict_oldest()
        t = _Transfer(sender, chunk.transfer_id, chunk.count, chunk.total_bytes, bytes(chunk.sha256),
                      self._clock())
        self._pending[(sender, chunk.transfer_id)] = t
        return t

    def _make_room(self, size: int, keep: tuple[str, str]) -> None:
        while self._buffered + size > self.max_buffered_bytes:
            if next(iter(self._pending)) == keep and len(self._pending) == 1:
                break  # a single transfer is bounded by max_total_bytes <= max_buffered_bytes
            oldest = next(iter(self._pending))
            if oldest == keep:
                self._pending.move_to_end(keep)
                continue
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        key, t = next(iter(self._pending.items()))
        self._evicted.append(t.report())
        self._drop(key, remember=True)

    def _drop(self, key: tuple[str, str], remember: bool) -> None:
        t = self._pending.pop(key)
        self._buffered -= t.nbytes
        if remember:
            done = self._done.get(key[0])
            if done is None:
                done = self._done[key[0]] = OrderedDict()
                if len(self._done) > _REMEMBER_SENDERS:
                    self._done.popitem(last=False)
            self._done.move_to_end(key[0])
            done[key[1]] = None
            if len(done) > _REMEMBER_DONE:
                done.popitem(last=False)
