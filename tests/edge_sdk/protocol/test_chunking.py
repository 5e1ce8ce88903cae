"""Tests of edge_sdk.protocol.chunking: split, reassembly, expiry, limits."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from edge_sdk.protocol import (
    Chunk,
    Envelope,
    ProtocolError,
    Reassembler,
    Update,
    decode_envelope,
    encode_envelope,
    split_envelope_payload,
)
from tests.support.fake_clock import FakeClock




def big_payload(n_floats: int = 50_000, sender: str = "dev-1") -> bytes:
    rng = np.random.default_rng(0)
    body = Update("full", {"w": rng.standard_normal(n_floats, dtype=np.float32)}, 5, {"loss": 1.0})
    return encode_envelope(Envelope.of(body, sender, round=2))


def chunks_of(payload: bytes, sender: str = "dev-1", chunk_size: int = 16_384) -> list[Chunk]:
    out = []
    for wire in split_envelope_payload(payload, sender, 2, chunk_size):
        env = decode_envelope(wire)
        assert env.kind == "chunk" and env.sender == sender and env.round == 2
        out.append(env.body)
    return out


def test_small_payload_is_returned_unchanged() -> None:
    p = encode_envelope(Envelope.of(Update("l" * 2000, {}, 1, {}), "d"))
    assert split_envelope_payload(p, "d", 0, len(p)) == [p]
    assert len(split_envelope_payload(p, "d", 0, len(p) - 1)) == 2


def test_chunk_size_too_small() -> None:
    with pytest.raises(ValueError):
        split_envelope_payload(b"x" * 10, "d", 0, 1023)


@pytest.mark.parametrize("chunk_size", [1024, 1500, 16_384, 1 << 20])
def test_every_chunk_fits_even_with_worst_case_header(chunk_size: int) -> None:
    sender = "s" * 128
    payload = big_payload(300_000, sender)
    wires = split_envelope_payload(payload, sender, 2**63 - 1, chunk_size)
    assert len(wires) > 1
    assert all(len(w) <= chunk_size for w in wires)
    assert max(len(w) for w in wires) > chunk_size - 512  # data slices are not needlessly small
    bodies = [decode_envelope(w).body for w in wires]
    assert {b.transfer_id for b in bodies} == {bodies[0].transfer_id}
    assert [b.index for b in bodies] == list(range(len(wires)))
    assert all((b.count, b.total_bytes) == (len(wires), len(payload)) for b in bodies)


def test_reassemble_shuffled_with_duplicates() -> None:
    payload = big_payload()
    chunks = chunks_of(payload)
    assert len(chunks) > 5
    stream = chunks + random.Random(1).sample(chunks, 4)
    random.Random(2).shuffle(stream)
    re = Reassembler()
    results = [re.add("dev-1", c) for c in stream]
    done = [r for r in results if r is not None]
    assert done == [payload]  # exactly once, even with duplicates after completion
    assert re.pending == 0 and re.buffered_bytes == 0
    assert re.add("dev-1", chunks[0]) is None and re.pending == 0  # late straggler: no restart
    env = decode_envelope(done[0])
    assert env.body.tensors["w"].shape == (50_000,)


def test_interleaved_transfers_and_senders_are_independent() -> None:
    a, b = big_payload(20_000), big_payload(30_000)
    ca, cb = chunks_of(a), chunks_of(b)
    same_id = [Chunk(c.transfer_id, c.index, c.count, c.total_bytes, c.sha256, c.data) for c in ca]
    re = Reassembler()
    got = {}
    for i in range(max(len(ca), len(cb))):
        for sender, lst in (("x", ca), ("y", cb), ("z", same_id)):
            if i < len(lst):
                r = re.add(sender, lst[i])
                if r is not None:
                    got[sender] = r
    assert got == {"x": a, "y": b, "z": a}


def test_missing_chunk_is_reported_by_expire() -> None:
    clock = FakeClock(1000.0)
    re = Reassembler(timeout_s=10, clock=clock)
    chunks = chunks_of(big_payload())
    for c in chunks[:-1]:
        assert re.add("dev-1", c) is None
    clock.now += 9
    assert re.expire() == [] and re.pending == 1
    clock.now += 2
    assert re.expire() == [("dev-1", chunks[0].transfer_id, len(chunks) - 1, len(chunks))]
    assert re.pending == 0 and re.buffered_bytes == 0
    assert re.add("dev-1", chunks[-1]) is None and re.pending == 0  # too late, not restarted
    assert re.expire() == []


def test_activity_keeps_a_slow_transfer_alive() -> None:
    clock = FakeClock(1000.0)
    re = Reassembler(timeout_s=10, clock=clock)
    payload = big_payload()
    out = None
    for c in chunks_of(payload):
        clock.now += 8
        assert re.expire() == []
        out = re.add("dev-1", c) or out
    assert out == payload


def test_corrupted_data_fails_checksum_and_drops_transfer() -> None:
    chunks = chunks_of(big_payload())
    bad = chunks[3]
    flipped = bytes([bad.data[0] ^ 1]) + bytes(bad.data[1:])
    chunks[3] = Chunk(bad.transfer_id, bad.index, bad.count, bad.total_bytes, bad.sha256, flipped)
    re = Reassembler()
    for c in chunks[:-1]:
        assert re.add("dev-1", c) is None
    with pytest.raises(ProtocolError) as e:
        re.add("dev-1", chunks[-1])
    assert e.value.code == "checksum"
    assert re.pending == 0 and re.buffered_bytes == 0


def test_inconsistent_manifest_is_malformed() -> None:
    chunks = chunks_of(big_payload())
    re = Reassembler()
    re.add("dev-1", chunks[0])
    c = chunks[1]
    for bad in (Chunk(c.transfer_id, c.index, c.count + 1, c.total_bytes, c.sha256, c.data),
                Chunk(c.transfer_id, c.index, c.count, c.total_bytes + 1, c.sha256, c.data),
                Chunk(c.transfer_id, c.index, c.count, c.total_bytes, b"\1" * 32, c.data)):
        with pytest.raises(ProtocolError) as e:
            re.add("dev-1", bad)
        assert e.value.code == "malformed"
    assert re.pending == 1  # the good transfer survives a forged chunk


def test_size_and_count_limits() -> None:
    re = Reassembler(max_total_bytes=1000)
    with pytest.raises(ProtocolError) as e:
        re.add("d", Chunk("t", 0, 2, 1001, b"\0" * 32, b"x"))
    assert e.value.code == "oversize"
    with pytest.raises(ProtocolError) as e:
        re.add("d", Chunk("t", 0, 500, 100, b"\0" * 32, b"x"))  # more chunks than bytes
    assert e.value.code == "malformed"
    re.add("d", Chunk("u", 0, 2, 10, b"\0" * 32, b"x" * 8))
    with pytest.raises(ProtocolError) as e:
        re.add("d", Chunk("u", 1, 2, 10, b"\0" * 32, b"x" * 8))  # 16 bytes > declared 10
    assert e.value.code == "malformed"
    with pytest.raises(ProtocolError) as e:
        re.add("d", Chunk("v", 2, 2, 10, b"\0" * 32, b"x"))  # index out of range
    assert e.value.code == "malformed"
    assert re.pending == 0 and re.buffered_bytes == 0


def test_discard_source() -> None:
    re = Reassembler()
    a, b = chunks_of(big_payload(), "a"), chunks_of(big_payload(), "b")
    re.add("a", a[0])
    re.add("a", chunks_of(big_payload(), "a")[0])
    re.add("b", b[0])
    assert re.pending == 3
    assert re.discard_source("a") == 2
    assert re.discard_source("a") == 0
    assert re.pending == 1
    out = [re.add("b", c) for c in b[1:]]
    assert out[-1] is not None and re.pending == 0


def test_too_many_pending_drops_oldest_and_reports_it() -> None:
    re = Reassembler(max_pending=2)
    t = [chunks_of(big_payload()) for _ in range(3)]
    for chunks in t:
        re.add("d", chunks[0])
    assert re.pending == 2
    assert re.expire() == [("d", t[0][0].transfer_id, 1, len(t[0]))]
    assert re.expire() == []
    assert [re.add("d", c) for c in t[2][1:]][-1] is not None


def test_buffered_bytes_budget_evicts_oldest() -> None:
    payload = big_payload(20_000)  # ~80 kB
    re = Reassembler(max_total_bytes=100_000, max_buffered_bytes=100_000)
    first, second = chunks_of(payload), chunks_of(payload)
    for c in first[:-1]:
        re.add("d", c)
    out = [re.add("d", c) for c in second]
    assert out[-1] == payload
    reported = re.expire()
    assert [r[1] for r in reported] == [first[0].transfer_id]
    assert re.buffered_bytes == 0 and re.pending == 0


def test_completed_ids_memory_is_bounded() -> None:
    re = Reassembler()
    for i in range(1100):
        assert re.add("d", Chunk(f"t{i}", 0, 1, 1, hashlib.sha256(b"x").digest(), b"x")) == b"x"
    assert sum(len(v) for v in re._done.values()) == 1024
