"""A message link: envelopes in, envelopes out, over one MQTT transport.

The link joins the codec, chunking and the transport, and counts the MQTT
payload bytes that really cross the wire. It is used the same way by a device
and by the coordinator. Nothing here runs on paho's network thread: `poll` is
called from the owner's own loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_sdk.protocol.chunking import DEFAULT_CHUNK_SIZE, Reassembler, split_envelope_payload
from edge_sdk.protocol.codec import CodecLimits
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Chunk, Envelope, decode_envelope, encode_envelope, peek_header
from edge_sdk.networking.transport import MqttTransport

__all__ = ["LinkConfig", "Received", "Rejected", "MessageLink"]

log = logging.getLogger(__name__)

#: Bytes the MQTT PUBLISH header and properties may take beside the payload.
_PACKET_HEADROOM = 1024
#: `MessageLink.poll` ends a longer wait early while a chunked message is half received
PARTIAL_WAKE_S = 1.0


@dataclass(frozen=True)
class LinkConfig:
    """How a link frames messages."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    transfer_dtype: str | None = None  # "float16" halves float tensors on the wire
    limits: CodecLimits = field(default_factory=CodecLimits)
    reassembly_timeout_s: float = 30.0


@dataclass(frozen=True)
class Received:
    """A whole, decoded message and the MQTT payload bytes it took."""

    topic: str
    envelope: Envelope
    nbytes: int


@dataclass(frozen=True)
class Rejected:
    """Input that could not be decoded; `sender` is best effort, for an error reply."""

    topic: str
    error: ProtocolError
    sender: str | None
    msg_id: str | None
    nbytes: int


class MessageLink:
    """Sends and receives `Envelope`s over an `MqttTransport`, chunking big ones."""

    def __init__(self, transport: MqttTransport, config: LinkConfig = LinkConfig()) -> None:
        self.transport = transport
        self.config = config
        self._reassembler = Reassembler(
            timeout_s=config.reassembly_timeout_s,
            max_total_bytes=config.limits.max_message_bytes,
        )
        self._partial_bytes: dict[tuple[str, str], int] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        #: topics whose messages are plain text for someone else (e.g. Home Assistant's birth message),
        #: not envelopes: handed to the handler of their topic on the thread that polls
        self.plain_topics: dict[str, Callable[[str, bytes], None]] = {}

    def effective_chunk_size(self) -> int:
        """The configured chunk size, never above the broker's Maximum Packet Size."""
        size = self.config.chunk_size
        limit = self.transport.max_packet_size
        if limit is not None:
            size = min(size, limit - _PACKET_HEADROOM)
        return size

    def send(self, topic: str, envelope: Envelope, retain: bool = False) -> int:
        """Encode, chunk when needed and publish; returns the payload bytes sent.

        ``retain``: the broker keeps the message for whoever subscribes later. Only a message
        that fits one frame can be retained (the broker keeps one message per topic), so a
        bigger one raises ValueError before anything is sent.
        """
        payload = encode_envelope(envelope, transfer_dtype=self.config.transfer_dtype)
        frames = split_envelope_payload(
            payload, envelope.sender, envelope.round, self.effective_chunk_size()
        )
        if retain and len(frames) > 1:
            raise ValueError(f"a retained message must fit one frame: {len(payload)} bytes need "
                             f"{len(frames)} chunks of {self.effective_chunk_size()}")
        sent = 0
        for frame in frames:
            self.transport.publish(topic, frame, qos=1, retain=retain)
            sent += len(frame)
        self.bytes_sent += sent
        return sent

    def poll(self, timeout: float | None, wake_on_partial: bool = False) -> Received | Rejected | None:
        """The next whole message, a rejected frame, or None when `timeout` passes. With
        ``wake_on_partial``, None sooner when a chunk leaves a message half received and more than
        `PARTIAL_WAKE_S` of the wait is left: a caller that chose its wait before the message
        began (a device, until its heartbeat) looks at its schedule again, and notices in time
        when the message stalls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            incoming = self.transport.receive(remaining)
            if incoming is None:
                return None
            result = self._handle(incoming.topic, incoming.payload)
            if result is not None:
                return result
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if (wake_on_partial and (deadline is None or deadline - now > PARTIAL_WAKE_S)
                    and self._reassembler.pending_transfers()):
                return None

    def expire(self) -> list[tuple[str, str, int, int]]:
        """Drop chunked transfers that stalled or were evicted; returns (topic, id, got, count)
        for each: the topic they arrived on names who sent them."""
        expired = self._reassembler.expire()
        for topic, transfer_id, _, _ in expired:
            self._partial_bytes.pop((topic, transfer_id), None)
        return expired

    @property
    def duplicate_chunks(self) -> int:
        """Chunks ignored because they were already received (duplicates, stragglers)."""
        return self._reassembler.duplicates

    def pending_transfers(self) -> list[tuple[str, str]]:
        """``(topic, transfer_id)`` of the chunked messages still being reassembled."""
        return self._reassembler.pending_transfers()

    def set_sender_budget(self, topic: str | None, max_bytes: int | None) -> None:
        """Bytes that messages arriving on ``topic`` may hold here at once — waiting in the receive
        queue, and in chunked transfers being reassembled (a transfer larger than that is refused).
        ``topic`` None sets the default of every topic without its own; ``max_bytes`` None (for a
        topic) goes back to the default. Capped at the codec's ``max_message_bytes``."""
        cap = self.config.limits.max_message_bytes
        if topic is None:
            budget = min(int(max_bytes if max_bytes is not None else cap), cap)
            self.transport.set_topic_budget(None, max(budget, 1))
            self._reassembler.set_default_source_limit(budget)
        else:
            budget = None if max_bytes is None else min(int(max_bytes), cap)
            self.transport.set_topic_budget(topic, None if budget is None else max(budget, 1))
            self._reassembler.set_source_limit(topic, budget)

    def discard_topic(self, topic: str) -> int:
        """Forget the partial transfers that arrived on ``topic`` (e.g. its device's last will fired)."""
        for key in [k for k in self._partial_bytes if k[0] == topic]:
            del self._partial_bytes[key]
        return self._reassembler.discard_source(topic)

    def _handle(self, topic: str, payload: bytes) -> Received | Rejected | None:
        size = len(payload)
        self.bytes_received += size
        if (plain := self.plain_topics.get(topic)) is not None:
            plain(topic, payload)
            return None
        try:
            envelope = decode_envelope(payload, self.config.limits)
            if not isinstance(envelope.body, Chunk):
                return Received(topic, envelope, size)
            return self._add_chunk(topic, envelope, size)
        except ProtocolError as error:
            _, _, msg_id, sender = peek_header(payload, self.config.limits)
            log.debug("rejected frame on %s from %s: %s", topic, sender, error)  # its owner reports it
            return Rejected(topic, error, sender, msg_id, size)

    def _add_chunk(self, topic: str, envelope: Envelope, size: int) -> Received | None:
        """Chunks are reassembled per topic: the broker's ACL says who may publish there, while
        the sender written in a chunk is only the chunk's own claim."""
        chunk: Chunk = envelope.body
        key = (topic, chunk.transfer_id)
        self._partial_bytes[key] = self._partial_bytes.get(key, 0) + size
        duplicates = self._reassembler.duplicates
        try:
            whole = self._reassembler.add(topic, chunk, frame_bytes=size)
        except ProtocolError:
            self._partial_bytes.pop(key, None)
            raise
        if whole is None:
            if self._reassembler.duplicates != duplicates:  # not part of the message's bytes
                log.debug("ignored chunk %d of %s on %s: already received", chunk.index,
                          chunk.transfer_id, topic)
                if (left := self._partial_bytes[key] - size) > 0:
                    self._partial_bytes[key] = left
                else:  # a straggler of a finished or dropped transfer
                    del self._partial_bytes[key]
            return None
        total = self._partial_bytes.pop(key, size)
        inner = decode_envelope(whole, self.config.limits)
        if inner.sender != envelope.sender:
            raise ProtocolError("malformed", "chunked message sender differs from its chunks")
        if isinstance(inner.body, Chunk):
            raise ProtocolError("malformed", "a chunk may not carry another chunk")
        return Received(topic, inner, total)
