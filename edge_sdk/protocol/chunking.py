"""Split large encoded envelopes into ``chunk`` envelopes and reassemble them.

Every chunk carries the whole manifest (transfer_id, count, total_bytes, sha256 of the full
payload), so chunks may arrive in any order, duplicated, or interleaved with other transfers.
A chunk's slice is its frame's data region: it is copied once when the chunk frame is built,
copied out of the received frame (so a frame padded with fields the decoder ignores is never
kept) and joined once.

Transfers are keyed by their *source*: the identity the broker authenticated (the link passes
the topic a frame arrived on), never a name written inside the message. Every source has its own
budget of open transfers and buffered bytes, so one device cannot evict another's transfers.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ProtocolError
from .ids import new_id
from .messages import Chunk, Envelope, encode_envelope

__all__ = ["DEFAULT_CHUNK_SIZE", "MIN_CHUNK_SIZE", "CHUNK_OVERHEAD", "split_envelope_payload", "Reassembler"]

DEFAULT_CHUNK_SIZE = 1 << 20
MIN_CHUNK_SIZE = 1024
#: Upper bound on the bytes a chunk frame adds to its data slice (= its msgpack header, as the
#: slice is the frame's data region). The worst case is 384 bytes (128-char sender, int64
#: round/index/count/total, uint32 nbytes); see docs/protocol.md. 512 leaves headroom; a received
#: chunk frame larger than its data plus this is rejected (padding).
CHUNK_OVERHEAD = 512
_REMEMBER_DONE = 1024  # finished transfer ids remembered per source
_REMEMBER_SENDERS = 4096  # sources whose finished ids are remembered (LRU)


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
    tid = new_id()
    out = []
    for i in range(count):
        body = Chunk(tid, i, count, total, sha, mv[i * step:(i + 1) * step])  # type: ignore[arg-type]
        wire = encode_envelope(Envelope.of(body, sender, round))
        if len(wire) > chunk_size:  # cannot happen for valid senders; never emit oversize
            raise RuntimeError(f"chunk of {len(wire)} bytes exceeds chunk_size {chunk_size}")
        out.append(wire)
    return out


@dataclass
class _Transfer:
    source: str
    transfer_id: str
    count: int
    total_bytes: int
    sha256: bytes
    last_seen: float
    parts: dict[int, bytes] = field(default_factory=dict)
    nbytes: int = 0

    def report(self) -> tuple[str, str, int, int]:
        return (self.source, self.transfer_id, len(self.parts), self.count)


class Reassembler:
    """Collect chunks per ``(source, transfer_id)``; thread-safe.

    Memory is bounded per source — at most ``max_pending_per_source`` open transfers holding at
    most ``max_buffered_per_source`` bytes (default ``max_total_bytes``, one maximal message; set
    per source with :meth:`set_source_limit`, e.g. to what that device was asked to send) — and
    overall: ``max_pending`` transfers and ``max_buffered_bytes`` (default ``max(1 GiB,
    max_total_bytes)``). A transfer larger than its source's byte budget is refused; a source over
    its own budget loses its own oldest transfer; when the overall budget is full, the source
    holding the most loses its oldest. Transfers dropped for lack of room are reported by the next
    :meth:`expire` call, like timed-out ones.
    """

    def __init__(self, timeout_s: float = 30.0, max_total_bytes: int = 256 << 20, max_pending: int = 256,
                 clock: Callable[[], float] = time.monotonic, max_buffered_bytes: int | None = None,
                 max_pending_per_source: int = 8, max_buffered_per_source: int | None = None) -> None:
        if max_buffered_bytes is None:  # default: 1 GiB, but always room for one maximal transfer
            max_buffered_bytes = max(1 << 30, max_total_bytes)
        if max_buffered_per_source is None:
            max_buffered_per_source = max_total_bytes
        if not timeout_s > 0:
            raise ValueError(f"Reassembler: timeout_s must be > 0, got {timeout_s!r}")
        if max_total_bytes < 0:
            raise ValueError(f"Reassembler: max_total_bytes must be >= 0, got {max_total_bytes!r}")
        if max_pending < 1 or max_pending_per_source < 1:
            raise ValueError(f"Reassembler: max_pending ({max_pending!r}) and max_pending_per_source "
                             f"({max_pending_per_source!r}) must be >= 1")
        if not 0 <= max_buffered_per_source <= max_buffered_bytes or max_total_bytes > max_buffered_bytes:
            raise ValueError("Reassembler: need 0 <= max_buffered_per_source <= max_buffered_bytes and "
                             f"max_total_bytes <= max_buffered_bytes, got {max_buffered_per_source}, "
                             f"{max_buffered_bytes}, {max_total_bytes}")
        self.timeout_s = timeout_s
        self.max_total_bytes = max_total_bytes
        self.max_pending = max_pending
        self.max_buffered_bytes = max_buffered_bytes
        self.max_pending_per_source = max_pending_per_source
        self.max_buffered_per_source = max_buffered_per_source
        self._clock = clock
        self._lock = threading.RLock()
        self._pending: OrderedDict[tuple[str, str], _Transfer] = OrderedDict()  # oldest first
        self._done: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._evicted: deque[tuple[str, str, int, int]] = deque(maxlen=1024)
        self._buffered = 0
        self._by_source: dict[str, list[int]] = {}  # source -> [open transfers, buffered bytes]
        self._source_limits: dict[str, int] = {}  # per-source byte budgets other than the default
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
        """Chunk data bytes held by incomplete transfers."""
        with self._lock:
            return self._buffered

    def buffered_by(self, source: str) -> int:
        """Chunk data bytes held for ``source``."""
        with self._lock:
            return self._by_source.get(source, [0, 0])[1]

    def set_default_source_limit(self, max_bytes: int) -> None:
        """The byte budget of every source without its own (`set_source_limit`)."""
        if type(max_bytes) is not int or not 0 <= max_bytes <= self.max_buffered_bytes:
            raise ValueError(f"source limit must be an int in [0, {self.max_buffered_bytes}], got {max_bytes!r}")
        with self._lock:
            self.max_buffered_per_source = max_bytes

    def set_source_limit(self, source: str, max_bytes: int | None) -> None:
        """The byte budget of ``source`` (None: back to ``max_buffered_per_source``); applies to
        the transfers it starts from now on and to the room its open ones may take."""
        with self._lock:
            if max_bytes is None:
                self._source_limits.pop(source, None)
            elif type(max_bytes) is not int or not 0 <= max_bytes <= self.max_buffered_bytes:
                raise ValueError(f"source limit must be an int in [0, {self.max_buffered_bytes}], got {max_bytes!r}")
            else:
                self._source_limits[source] = max_bytes

    def source_limit(self, source: str) -> int:
        """The byte budget of ``source``."""
        with self._lock:
            return self._source_limits.get(source, self.max_buffered_per_source)

    def pending_transfers(self) -> list[tuple[str, str]]:
        """``(source, transfer_id)`` of every incomplete transfer held, oldest first."""
        with self._lock:
            return list(self._pending)

    def add(self, source: str, chunk: Chunk, frame_bytes: int | None = None) -> bytes | None:
        """Store ``chunk`` from ``source``; return the full payload once complete and verified, else None.

        ``frame_bytes``: the size of the frame the chunk arrived in; a frame carrying more than
        ``CHUNK_OVERHEAD`` bytes beyond its data is rejected (it was padded).
        """
        key = (source, chunk.transfer_id)
        if type(chunk.index) is not int or type(chunk.count) is not int or not 0 <= chunk.index < chunk.count:
            raise ProtocolError("malformed", f"chunk index {chunk.index!r} outside 0..count-1")
        size = memoryview(chunk.data).nbytes
        if frame_bytes is not None and frame_bytes - size > CHUNK_OVERHEAD:
            raise ProtocolError("malformed", f"chunk frame of {frame_bytes} bytes carries {size} bytes of data: "
                                f"more than {CHUNK_OVERHEAD} bytes of header")
        with self._lock:
            done = self._done.get(source)
            if done is not None and chunk.transfer_id in done:
                self.duplicates += 1
                return None  # straggler or duplicate of a finished transfer
            t = self._pending.get(key)
            if t is None:
                t = self._start(source, chunk)
            elif (chunk.count, chunk.total_bytes, chunk.sha256) != (t.count, t.total_bytes, t.sha256):
                raise ProtocolError("malformed", f"chunk manifest of transfer {chunk.transfer_id!r} "
                                    "disagrees with its first chunk")
            t.last_seen = self._clock()
            if chunk.index in t.parts:
                self.duplicates += 1
                return None  # duplicate
            if t.nbytes + size > t.total_bytes:
                self._drop(key)
                raise ProtocolError("malformed", f"transfer {chunk.transfer_id!r} holds more than its "
                                    f"declared {t.total_bytes} bytes")
            self._make_room(size, keep=key)
            t.parts[chunk.index] = bytes(chunk.data)  # a copy: the frame itself is not kept
            t.nbytes += size
            self._buffered += size
            self._by_source[source][1] += size
            if len(t.parts) < t.count:
                return None
            self._drop(key)
            payload = b"".join(t.parts[i] for i in range(t.count))
            if len(payload) != t.total_bytes or hashlib.sha256(payload).digest() != t.sha256:
                raise ProtocolError("checksum", f"transfer {chunk.transfer_id!r} from {source!r} "
                                    "failed its sha256/size check")
            return payload

    def expire(self) -> list[tuple[str, str, int, int]]:
        """Drop transfers idle for longer than ``timeout_s``.

        Returns ``(source, transfer_id, received_chunks, count)`` for each, plus any transfer
        evicted for lack of room since the last call.
        """
        with self._lock:
            now = self._clock()
            out = list(self._evicted)
            self._evicted.clear()
            for key, t in list(self._pending.items()):
                if now - t.last_seen > self.timeout_s:
                    out.append(t.report())
                    self._drop(key)
            return out

    def discard_source(self, source: str) -> int:
        """Drop all partial transfers of ``source`` (e.g. its last will fired); return how many.

        Their ids are remembered, so chunks of them that still arrive (MQTT re-sends unacked
        ones after a reconnect) are ignored instead of starting a transfer that cannot finish.
        """
        with self._lock:
            keys = [k for k in self._pending if k[0] == source]
            for k in keys:
                self._drop(k)
            return len(keys)

    # ----------------------------------------------------------------- internals

    def _start(self, source: str, chunk: Chunk) -> _Transfer:
        if chunk.total_bytes > self.max_total_bytes:
            raise ProtocolError("oversize", f"transfer of {chunk.total_bytes} bytes > limit {self.max_total_bytes}")
        if chunk.total_bytes > (limit := self.source_limit(source)):
            raise ProtocolError("oversize", f"transfer of {chunk.total_bytes} bytes > this sender's budget of {limit}")
        if chunk.count > max(1, chunk.total_bytes):
            raise ProtocolError("malformed", f"{chunk.count} chunks cannot carry {chunk.total_bytes} bytes")
        while self._by_source.get(source, [0, 0])[0] >= self.max_pending_per_source:
            self._evict_oldest_of(source)
        while len(self._pending) >= self.max_pending:
            self._evict_oldest_of(self._heaviest(lambda s: s[0]))
        t = _Transfer(source, chunk.transfer_id, chunk.count, chunk.total_bytes, bytes(chunk.sha256), self._clock())
        self._pending[(source, chunk.transfer_id)] = t
        self._by_source.setdefault(source, [0, 0])[0] += 1
        return t

    def _heaviest(self, measure: Callable[[list[int]], int], exclude: tuple[str, str] | None = None) -> str:
        """The source that holds the most (by ``measure``) among those with a transfer other than ``exclude``."""
        candidates = {t.source for k, t in self._pending.items() if k != exclude}
        return max(candidates, key=lambda s: (measure(self._by_source[s]), s))

    def _make_room(self, size: int, keep: tuple[str, str]) -> None:
        """Evict transfers other than ``keep`` until ``size`` more bytes fit both budgets."""
        source = keep[0]
        while self._by_source[source][1] + size > self.source_limit(source):
            if not self._evict_oldest_of(source, keep):
                break  # only `keep` is left: its total_bytes was within the budget when it started
        while self._buffered + size > self.max_buffered_bytes and len(self._pending) > 1:
            self._evict_oldest_of(self._heaviest(lambda s: s[1], exclude=keep), keep)

    def _evict_oldest_of(self, source: str, keep: tuple[str, str] | None = None) -> bool:
        """Drop the oldest transfer of ``source`` other than ``keep``; False when it has none."""
        for key, t in self._pending.items():
            if key[0] == source and key != keep:
                self._evicted.append(t.report())
                self._drop(key)
                return True
        return False

    def _drop(self, key: tuple[str, str]) -> None:
        """Forget an open transfer, remembering its id so that late chunks of it are ignored."""
        t = self._pending.pop(key)
        self._buffered -= t.nbytes
        held = self._by_source[key[0]]
        held[0] -= 1
        held[1] -= t.nbytes
        if held[0] == 0:
            del self._by_source[key[0]]
        done = self._done.get(key[0])
        if done is None:
            done = self._done[key[0]] = OrderedDict()
            if len(self._done) > _REMEMBER_SENDERS:
                self._done.popitem(last=False)
        self._done.move_to_end(key[0])
        done[key[1]] = None
        if len(done) > _REMEMBER_DONE:
            done.popitem(last=False)
