"""Exact behaviour of chunk splitting and reassembly under corruption and hostile budgets (issue 35).

Chunks are built by hand (``parts``) so that each test says exactly which bytes, manifest and
index a chunk carries; sizes are small so that every budget below can be checked on paper.
"""

from __future__ import annotations

import hashlib

import pytest

from edge_sdk.protocol import (
    CHUNK_OVERHEAD,
    Chunk,
    ProtocolError,
    Reassembler,
    decode_envelope,
    split_envelope_payload,
)
from tests.support.fake_clock import FakeClock




def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def parts(payload: bytes, n: int, tid: str = "t", total: int | None = None, digest: bytes | None = None) -> list[Chunk]:
    """``payload`` in ``n`` chunks of ceil(len/n) bytes (the last one shorter) with its true manifest
    unless ``total``/``digest`` say otherwise."""
    step = -(-len(payload) // n)
    return [Chunk(tid, i, n, len(payload) if total is None else total, sha(payload) if digest is None else digest,
                  payload[i * step:(i + 1) * step]) for i in range(n)]


def feed(re: Reassembler, source: str, chunks: list[Chunk]) -> list[bytes | None]:
    return [re.add(source, c) for c in chunks]


def refused(re: Reassembler, source: str, chunk: Chunk, frame_bytes: int | None = None) -> str:
    with pytest.raises(ProtocolError) as e:
        re.add(source, chunk, frame_bytes)
    return e.value.code


PAYLOAD = bytes(range(256)) * 4  # 1024 bytes, 4 chunks of 256
OTHER = bytes(reversed(PAYLOAD))


# ------------------------------------------------------------------------------- splitting

def test_split_layout_is_exact():
    payload = bytes(range(250)) * 12  # 3000 bytes
    wires = split_envelope_payload(payload, "dev", 7, 1024)
    # step = 1024 - 512 = 512 data bytes per chunk: ceil(3000 / 512) = 6 chunks, the last 3000 - 5*512 = 440
    bodies = [decode_envelope(w).body for w in wires]
    assert [len(b.data) for b in bodies] == [512] * 5 + [440]
    assert [b.index for b in bodies] == list(range(6))
    assert {(b.count, b.total_bytes, b.sha256, b.transfer_id) for b in bodies} == \
        {(6, 3000, sha(payload), bodies[0].transfer_id)}
    assert b"".join(bytes(b.data) for b in bodies) == payload
    assert all(len(w) <= 1024 and len(w) - len(b.data) <= CHUNK_OVERHEAD for w, b in zip(wires, bodies))
    re = Reassembler()  # each frame, passed with its real size, passes the padding check
    assert [re.add("dev", b, len(w)) for w, b in zip(wires, bodies)][-1] == payload


def test_split_boundaries():
    exact = b"x" * 1024
    assert split_envelope_payload(exact, "d", 0, 1024) == [exact]  # fits: sent as it is
    # 1025 bytes: ceil(1025 / 512) = 3 chunks, the last carrying 1 byte
    bodies = [decode_envelope(w).body for w in split_envelope_payload(b"y" * 1025, "d", 0, 1024)]
    assert [len(b.data) for b in bodies] == [512, 512, 1]
    # 2048 bytes: exactly 4 chunks of 512, no empty fifth
    assert len(split_envelope_payload(b"z" * 2048, "d", 0, 1024)) == 4
    assert split_envelope_payload(b"", "d", 0, 1024) == [b""]
    with pytest.raises(ValueError):
        split_envelope_payload(b"x", "d", 0, 1023)


# ------------------------------------------------------------------------------- corrupted digests

def _corrupt(kind: str) -> list[Chunk]:
    good = parts(PAYLOAD, 4)
    c = good[1]
    if kind == "sha_low":   # a manifest digest that sorts below the real one
        return parts(PAYLOAD, 4, digest=b"\0" * 32)
    if kind == "sha_high":  # and one that sorts above it
        return parts(PAYLOAD, 4, digest=b"\xff" * 32)
    if kind == "flipped_byte":
        return [good[0], Chunk(c.transfer_id, 1, 4, c.total_bytes, c.sha256, bytes([c.data[0] ^ 1]) + c.data[1:]),
                *good[2:]]
    if kind == "other_transfers_data":  # index 1 of another payload of the same size
        return [good[0], Chunk("t", 1, 4, 1024, sha(PAYLOAD), parts(OTHER, 4)[1].data), *good[2:]]
    if kind == "total_too_large":  # 1024 bytes declared as 1025, digest right
        return parts(PAYLOAD, 4, total=1025)
    if kind == "truncated_last":
        last = good[3]
        return [*good[:3], Chunk("t", 3, 4, 1024, last.sha256, last.data[:-1])]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["sha_low", "sha_high", "flipped_byte", "other_transfers_data",
                                  "total_too_large", "truncated_last"])
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2)])
def test_every_corrupted_digest_is_refused(kind, order):
    chunks = _corrupt(kind)
    re = Reassembler()
    assert feed(re, "dev", [chunks[i] for i in order[:-1]]) == [None] * 3
    assert re.pending == 1 and re.buffered_bytes == sum(len(chunks[i].data) for i in order[:-1])
    assert refused(re, "dev", chunks[order[-1]]) == "checksum"
    assert (re.pending, re.buffered_bytes, re.buffered_by("dev")) == (0, 0, 0)
    # the failed transfer's id is remembered: a re-sent chunk of it starts nothing
    assert re.add("dev", chunks[0]) is None and re.pending == 0 and re.duplicates == 1
    assert re.expire() == []  # a refused transfer is not reported again as lost


def test_the_good_transfer_passes_in_every_order():
    for order in ((0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2)):
        re = Reassembler()
        assert feed(re, "dev", [parts(PAYLOAD, 4)[i] for i in order]) == [None, None, None, PAYLOAD]
        assert re.duplicates == 0


def test_more_data_than_declared_is_malformed():
    chunks = parts(PAYLOAD, 4, total=1000)  # 4 x 256 = 1024 > 1000: the fourth chunk overflows
    re = Reassembler()
    assert feed(re, "dev", chunks[:3]) == [None] * 3
    assert refused(re, "dev", chunks[3]) == "malformed"
    assert (re.pending, re.buffered_bytes) == (0, 0)
    assert re.add("dev", chunks[0]) is None and re.duplicates == 1  # dropped and remembered
    # exactly the declared size is fine: 1024 in 4 chunks
    assert feed(Reassembler(), "dev", parts(PAYLOAD, 4))[-1] == PAYLOAD


@pytest.mark.parametrize("index, count", [(4, 4), (5, 4), (-1, 4), (True, 4), (1.0, 4), (0, 4.0), (0, 0)])
def test_an_index_outside_the_transfer_is_malformed(index, count):
    re = Reassembler()
    re.add("dev", parts(PAYLOAD, 4)[0])
    assert refused(re, "dev", Chunk("t", index, count, 1024, sha(PAYLOAD), b"x" * 10)) == "malformed"
    assert (re.pending, re.buffered_bytes) == (1, 256)  # the open transfer is untouched


def test_a_duplicated_index_keeps_the_first_data():
    good = parts(PAYLOAD, 4)
    forged = Chunk("t", 1, 4, 1024, sha(PAYLOAD), b"\0" * 256)
    re = Reassembler()  # good first: the forged duplicate is ignored and the transfer completes
    assert feed(re, "dev", [good[0], good[1], forged, good[2], good[3]]) == [None] * 4 + [PAYLOAD]
    assert re.duplicates == 1
    re = Reassembler()  # forged first: the good one is the duplicate, and the digest fails
    assert feed(re, "dev", [good[0], forged, good[1], good[2]]) == [None] * 4
    assert re.duplicates == 1
    assert refused(re, "dev", good[3]) == "checksum"


def test_a_manifest_that_disagrees_with_the_first_chunk_is_malformed():
    good = parts(PAYLOAD, 4)
    re = Reassembler()
    re.add("dev", good[0])
    c = good[1]
    for bad in (Chunk("t", 1, 5, 1024, c.sha256, c.data), Chunk("t", 1, 4, 1023, c.sha256, c.data),
                Chunk("t", 1, 4, 1024, sha(b"other"), c.data)):
        assert refused(re, "dev", bad) == "malformed"
    assert (re.pending, re.buffered_bytes) == (1, 256)  # nothing of the forged chunks was kept
    assert feed(re, "dev", good[1:]) == [None, None, PAYLOAD]


def test_chunk_data_is_copied_out_of_its_frame():
    frame = bytearray(PAYLOAD)
    chunks = [Chunk("t", i, 4, 1024, sha(PAYLOAD), memoryview(frame)[i * 256:(i + 1) * 256]) for i in range(4)]
    re = Reassembler()
    assert feed(re, "dev", chunks[:3]) == [None] * 3
    frame[:] = bytes(1024)  # the receive buffer is reused before the transfer finishes
    chunks[3] = Chunk("t", 3, 4, 1024, sha(PAYLOAD), PAYLOAD[768:])
    assert re.add("dev", chunks[3]) == PAYLOAD


def test_an_empty_payload_in_one_chunk():
    assert Reassembler().add("dev", Chunk("t", 0, 1, 0, sha(b""), b"")) == b""


# ------------------------------------------------------------------------------- padded frames

def test_a_padded_frame_is_refused_and_exactly_the_limit_is_accepted():
    c = parts(PAYLOAD, 4)
    re = Reassembler()
    assert re.add("dev", c[0], frame_bytes=256 + CHUNK_OVERHEAD) is None  # header of exactly 512 bytes
    assert refused(re, "dev", c[1], frame_bytes=256 + CHUNK_OVERHEAD + 1) == "malformed"
    assert (re.pending, re.buffered_bytes) == (1, 256)  # the padded chunk was not stored
    assert re.add("dev", c[1], frame_bytes=100) is None  # a frame size below the data's is no padding
    assert refused(re, "dev", c[2], frame_bytes=10_000) == "malformed"
    assert re.add("dev", c[2]) is None  # no frame size given: not checked
    assert re.add("dev", c[3], frame_bytes=256) == PAYLOAD
    # an empty chunk: a frame of 512 bytes is all header, 513 is padded
    assert Reassembler().add("d", Chunk("e", 0, 1, 0, sha(b""), b""), frame_bytes=CHUNK_OVERHEAD) == b""
    assert refused(Reassembler(), "d", Chunk("e", 0, 1, 0, sha(b""), b""), CHUNK_OVERHEAD + 1) == "malformed"
    assert CHUNK_OVERHEAD == 512


# ------------------------------------------------------------------------------- per-source budgets

def test_open_transfers_per_source():
    re = Reassembler(max_pending_per_source=2)
    for tid in ("a1", "a2"):
        re.add("A", parts(PAYLOAD, 4, tid)[0])
    re.add("B", parts(PAYLOAD, 4, "b1")[0])
    assert re.expire() == []  # two per source fit
    re.add("A", parts(PAYLOAD, 4, "a3")[0])  # A's third evicts A's oldest, never B's
    assert re.pending_transfers() == [("A", "a2"), ("B", "b1"), ("A", "a3")]
    assert re.expire() == [("A", "a1", 1, 4)]
    assert (re.buffered_by("A"), re.buffered_by("B"), re.buffered_bytes) == (512, 256, 768)
    assert re.add("A", parts(PAYLOAD, 4, "a1")[1]) is None and re.duplicates == 1  # evicted id remembered
    assert feed(re, "B", parts(PAYLOAD, 4, "b1")[1:])[-1] == PAYLOAD


def test_bytes_per_source():
    # every source may hold max_total_bytes = 1024 bytes by default
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=4096)
    assert re.source_limit("A") == re.max_buffered_per_source == 1024
    a1, a2, b1 = parts(PAYLOAD, 4, "a1"), parts(PAYLOAD, 4, "a2"), parts(PAYLOAD, 4, "b1")
    feed(re, "A", a1[:2])             # A: 512
    feed(re, "B", b1[:3])             # B: 768
    feed(re, "A", a2[:2])             # A: 1024, exactly its budget: nothing evicted
    assert re.expire() == [] and re.buffered_by("A") == 1024
    assert re.add("A", a2[2]) is None  # 1280 > 1024: A's oldest (a1, 512 bytes) goes, B keeps its 768
    assert re.expire() == [("A", "a1", 2, 4)]
    assert (re.buffered_by("A"), re.buffered_by("B"), re.buffered_bytes) == (768, 768, 1536)
    assert re.add("A", a2[3]) == PAYLOAD
    assert feed(re, "B", b1[3:]) == [PAYLOAD]
    assert (re.pending, re.buffered_bytes, re.buffered_by("A")) == (0, 0, 0)


def test_a_transfer_larger_than_its_sources_budget_is_oversize():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=4096)
    re.set_source_limit("A", 1023)
    assert re.source_limit("A") == 1023 and re.source_limit("B") == 1024
    assert refused(re, "A", parts(PAYLOAD, 4)[0]) == "oversize"
    assert re.pending == 0 and re.duplicates == 0
    assert feed(re, "B", parts(PAYLOAD, 4)) [-1] == PAYLOAD  # B's budget is its own
    re.set_source_limit("A", 1024)  # exactly the transfer's size
    assert feed(re, "A", parts(PAYLOAD, 4))[-1] == PAYLOAD
    re.set_source_limit("A", 0)
    assert refused(re, "A", parts(PAYLOAD, 4, "u")[0]) == "oversize"
    assert re.add("A", Chunk("e", 0, 1, 0, sha(b""), b"")) == b""  # an empty transfer fits a zero budget
    re.set_source_limit("A", None)  # back to the default
    assert re.source_limit("A") == 1024
    re.set_source_limit("nobody", None)  # forgetting a source without a limit is fine
    # a transfer over max_total_bytes is oversize whatever the source's budget
    re.set_source_limit("A", 4096)
    assert refused(re, "A", Chunk("big", 0, 2, 1025, sha(b""), b"x")) == "oversize"
    assert re.add("A", Chunk("fits", 0, 2, 1024, sha(b""), b"x")) is None


def test_source_limits_are_checked():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=4096)
    for bad in (-1, 4097, 1.0, True, "10", None):
        if bad is not None:
            with pytest.raises(ValueError):
                re.set_source_limit("A", bad)
        with pytest.raises(ValueError):
            re.set_default_source_limit(bad)
    assert re.source_limit("A") == 1024
    re.set_source_limit("A", 4096)  # the global budget itself is allowed
    re.set_default_source_limit(100)
    assert (re.source_limit("A"), re.source_limit("B"), re.max_buffered_per_source) == (4096, 100, 100)
    re.set_default_source_limit(4096)
    re.set_default_source_limit(0)
    assert refused(re, "B", parts(PAYLOAD, 4)[0]) == "oversize"


def test_lowering_a_budget_lets_the_open_transfer_finish_but_evicts_older_ones():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=4096)
    a0, a1, a2 = parts(PAYLOAD, 4, "a0"), parts(PAYLOAD, 4, "a1"), parts(PAYLOAD, 4, "a2")
    re.add("A", a0[0])
    re.add("A", a1[0])
    feed(re, "A", a2[:2])  # A: 1024
    re.set_source_limit("A", 300)
    assert re.add("A", a2[2]) is None  # over 300: a0, then a1 are evicted; a2, alone, keeps going
    assert re.expire() == [("A", "a0", 1, 4), ("A", "a1", 1, 4)]
    assert re.buffered_by("A") == 768
    assert re.add("A", a2[3]) == PAYLOAD
    assert refused(re, "A", parts(PAYLOAD, 4, "a3")[0]) == "oversize"  # new ones are held to 300


# ------------------------------------------------------------------------------- global budgets

def test_too_many_open_transfers_evicts_from_the_source_with_the_most():
    re = Reassembler(max_pending=3)
    re.add("A", parts(PAYLOAD, 4, "a1")[0])
    re.add("A", parts(PAYLOAD, 4, "a2")[0])
    feed(re, "B", parts(PAYLOAD, 4, "b1")[:3])  # B holds more bytes (768) but fewer transfers (1)
    re.add("C", parts(PAYLOAD, 4, "c1")[0])  # a fourth: A, with 2 open, loses its oldest
    assert re.pending == 3
    assert re.expire() == [("A", "a1", 1, 4)]
    assert re.pending_transfers() == [("A", "a2"), ("B", "b1"), ("C", "c1")]
    # now one each: ties are broken by name (the largest), so that eviction is deterministic
    re.add("D", parts(PAYLOAD, 4, "d1")[0])
    assert re.expire() == [("C", "c1", 1, 4)]
    assert re.add("A", parts(PAYLOAD, 4, "a1")[1]) is None and re.duplicates == 1


def test_too_many_bytes_evicts_from_the_source_holding_the_most():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=1280)
    re.add("A", parts(PAYLOAD, 4, "a1")[0])
    re.add("A", parts(PAYLOAD, 4, "a2")[0])    # A: 2 transfers, 512 bytes
    feed(re, "B", parts(PAYLOAD, 4, "b1")[:3])  # B: 1 transfer, 768 bytes; 1280 in all: full, not over
    assert re.expire() == []
    c1 = parts(PAYLOAD, 4, "c1")
    assert re.add("C", c1[0]) is None  # 1536 > 1280: B holds the most bytes and loses b1 -> 768
    assert re.expire() == [("B", "b1", 3, 4)]
    assert (re.buffered_bytes, re.buffered_by("A"), re.buffered_by("B"), re.buffered_by("C")) == (768, 512, 0, 256)
    feed(re, "C", c1[1:3])  # 1280: full again, nothing evicted
    assert re.expire() == []
    # 1536 > 1280: C holds the most, but only the transfer being completed; A (512) loses a1
    assert re.add("C", c1[3]) == PAYLOAD
    assert re.expire() == [("A", "a1", 1, 4)]
    assert re.pending_transfers() == [("A", "a2")] and re.buffered_bytes == 256


def test_the_transfer_being_added_to_is_never_the_one_evicted():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=1024, max_buffered_per_source=1024)
    a1, a2 = parts(PAYLOAD, 4, "a1"), parts(PAYLOAD, 4, "a2")
    feed(re, "A", a1[:3])  # 768
    feed(re, "A", a2[:1])  # 1024
    assert re.add("A", a2[1]) is None  # a1 goes, not a2
    assert re.pending_transfers() == [("A", "a2")] and re.expire() == [("A", "a1", 3, 4)]
    assert feed(re, "A", a2[2:])[-1] == PAYLOAD


def test_the_global_budget_with_two_transfers_open():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=1024)
    feed(re, "A", parts(PAYLOAD, 4, "a1")[:3])  # 768
    b1 = parts(PAYLOAD, 4, "b1")
    assert re.add("B", b1[0]) is None  # 1024: full
    assert re.add("B", b1[1]) is None  # 1280 > 1024: A's a1 goes (B's own transfer is being added to)
    assert re.expire() == [("A", "a1", 3, 4)] and re.buffered_bytes == 512
    assert feed(re, "B", b1[2:]) == [None, PAYLOAD]


def test_no_bookkeeping_is_left_for_a_source_with_nothing_open():
    re = Reassembler(max_pending_per_source=1)
    for i in range(20):  # finished, evicted, discarded and expired transfers of many sources
        src = f"s{i}"
        feed(re, src, parts(PAYLOAD, 4, "x"))
        re.add(src, parts(PAYLOAD, 4, "y")[0])
        re.add(src, parts(PAYLOAD, 4, "z")[0])  # evicts y
        re.discard_source(src)
    assert re.pending == 0 and re.buffered_bytes == 0
    assert re._by_source == {}  # per-source counters exist only while a source has a transfer open


# ------------------------------------------------------------------------------- forgotten ids

@pytest.mark.parametrize("how", ["finished", "discarded", "evicted", "expired", "checksum"])
def test_late_chunks_of_a_closed_transfer_are_ignored(how):
    clock = FakeClock()
    re = Reassembler(timeout_s=10, clock=clock, max_pending_per_source=1)
    t = parts(PAYLOAD, 4, "t1")
    if how == "finished":
        assert feed(re, "A", t)[-1] == PAYLOAD
    elif how == "discarded":
        feed(re, "A", t[:2])
        assert re.discard_source("A") == 1
    elif how == "evicted":
        feed(re, "A", t[:2])
        re.add("A", parts(PAYLOAD, 4, "t2")[0])  # one open transfer per source: t1 goes
        assert re.discard_source("A") == 1
    elif how == "expired":
        feed(re, "A", t[:2])
        clock.now = 10.5
        assert re.expire() == [("A", "t1", 2, 4)]
    else:
        feed(re, "A", parts(PAYLOAD, 4, "t1", digest=b"\1" * 32)[:3])
        assert refused(re, "A", parts(PAYLOAD, 4, "t1", digest=b"\1" * 32)[3]) == "checksum"
    assert re.pending == 0 and re.buffered_bytes == 0
    assert feed(re, "A", t) == [None] * 4  # every late chunk ignored, none starts a transfer
    assert re.pending == 0 and re.duplicates == 4
    assert feed(re, "B", t)[-1] == PAYLOAD  # the same id from another source is another transfer


def test_a_source_over_its_bytes_evicts_only_its_own_oldest():
    re = Reassembler(max_total_bytes=1024, max_buffered_bytes=4096)
    re.add("B", parts(PAYLOAD, 4, "b1")[0])  # B's transfer is the oldest of all
    re.add("A", parts(PAYLOAD[:512], 2, "a1")[0])  # A: 256
    a2 = parts(PAYLOAD[:768], 3, "a2")
    feed(re, "A", a2[:2])  # A: 768
    re.set_source_limit("A", 800)
    # 768 + 256 = 1024 > 800 (768 | 256 would be 768): A's oldest, a1, goes, not B's b1
    assert re.add("A", a2[2]) == PAYLOAD[:768]
    assert re.expire() == [("A", "a1", 1, 2)]
    assert re.pending_transfers() == [("B", "b1")]


def test_more_than_256_open_transfers_of_one_source():
    re = Reassembler(max_pending_per_source=300, max_pending=1000)
    for i in range(301):
        re.add("A", Chunk(f"t{i}", 0, 2, 2, sha(b"xy"), b"x"))
    assert re.pending == 300 and re.expire() == [("A", "t0", 1, 2)]


def test_more_than_256_chunks_and_open_transfers():
    data = bytes(range(256)) + b"xyz"  # 259 chunks of 1 byte
    chunks = [Chunk("big", i, 259, 259, sha(data), data[i:i + 1]) for i in range(259)]
    assert feed(Reassembler(), "A", chunks) == [None] * 258 + [data]
    re = Reassembler(max_pending=300)
    for i in range(301):  # 301 sources, one transfer each: the 301st evicts one (a tie: the largest name)
        re.add(f"s{i:03d}", Chunk("t", 0, 2, 2, sha(b"xy"), b"x"))
    assert re.pending == 300 and re.expire() == [("s299", "t", 1, 2)]


def test_a_source_holding_only_empty_chunks_keeps_its_count():
    re = Reassembler()
    re.add("A", Chunk("t1", 0, 2, 2, sha(b"xy"), b""))  # open, 0 bytes held
    assert re.add("A", Chunk("t2", 0, 1, 1, sha(b"z"), b"z")) == b"z"  # finishes: A still has t1 open
    assert re.add("A", Chunk("t1", 1, 2, 2, sha(b"xy"), b"xy")) == b"xy"
    assert re.pending == 0


def test_sources_are_compared_by_value():
    # a source is the topic a frame arrived on: a new string object for every frame
    def src() -> str:
        return "".join(["de", "v"])

    re = Reassembler(max_pending_per_source=1, max_total_bytes=1024, max_buffered_bytes=1024)
    re.add(src(), parts(PAYLOAD, 4, "t1")[0])
    re.add(src(), parts(PAYLOAD, 4, "t2")[0])  # one open transfer per source: t1 goes
    assert re.expire() == [("dev", "t1", 1, 4)]
    assert (re.buffered_by(src()), re.source_limit(src())) == (256, 1024)
    re.set_source_limit(src(), 300)
    assert re.source_limit("dev") == 300
    assert re.discard_source(src()) == 1 and re.pending == 0


def test_discard_source_drops_only_that_source():
    re = Reassembler()
    re.add("A", parts(PAYLOAD, 4, "a1")[0])
    feed(re, "A", parts(PAYLOAD, 4, "a2")[:2])
    re.add("B", parts(PAYLOAD, 4, "a1")[0])
    assert re.discard_source("A") == 2
    assert re.discard_source("A") == 0 and re.discard_source("nobody") == 0
    assert (re.pending, re.buffered_bytes, re.buffered_by("A"), re.buffered_by("B")) == (1, 256, 0, 256)
    assert re.expire() == []  # discarded transfers are not reported as lost
    assert feed(re, "B", parts(PAYLOAD, 4, "a1")[1:])[-1] == PAYLOAD


def test_expiry_boundary_and_activity():
    clock = FakeClock()
    re = Reassembler(timeout_s=10, clock=clock)
    c = parts(PAYLOAD, 4)
    re.add("A", c[0])
    clock.now = 10.0  # idle for exactly timeout_s: kept
    assert re.expire() == [] and re.pending == 1
    re.add("A", c[0])  # a duplicate still counts as activity
    clock.now = 20.0
    assert re.expire() == []
    clock.now = 20.001
    assert re.expire() == [("A", "t", 1, 4)] and re.pending == 0


def test_finished_ids_are_remembered_per_source_up_to_1024():
    re = Reassembler()
    one = [Chunk(f"t{i}", 0, 1, 1, sha(b"x"), b"x") for i in range(1025)]
    assert feed(re, "A", one) == [b"x"] * 1025
    assert re.add("A", one[1]) is None  # the 1024 latest (t1..t1024) are remembered
    assert re.add("A", one[0]) == b"x"  # t0, the 1025th back, was forgotten: it runs again
    assert re.duplicates == 1


def test_sources_with_remembered_ids_are_bounded_lru():
    re = Reassembler()
    chunk = Chunk("t", 0, 1, 1, sha(b"x"), b"x")
    for i in range(4096):
        re.add(f"s{i}", chunk)
    assert re.add("s0", Chunk("u", 0, 1, 1, sha(b"x"), b"x")) == b"x"  # s0 is now the most recent
    assert re.add("s4096", chunk) == b"x"  # a 4097th source: the least recent, s1, is forgotten
    assert re.add("s0", chunk) is None and re.add("s2", chunk) is None and re.add("s4096", chunk) is None
    assert re.add("s1", chunk) == b"x"


def test_evictions_waiting_for_expire_are_bounded():
    re = Reassembler(max_pending=1)
    for i in range(1026):
        re.add("A", Chunk(f"t{i}", 0, 2, 2, sha(b"xy"), b"x"))  # each new one evicts the one before
    reported = re.expire()
    assert len(reported) == 1024 and reported[0] == ("A", "t1", 1, 2) and reported[-1] == ("A", "t1024", 1, 2)


# ------------------------------------------------------------------------------- limits at start

def test_count_against_total_bytes():
    re = Reassembler()
    assert refused(re, "A", Chunk("t", 0, 2, 1, sha(b"x"), b"x")) == "malformed"  # 2 chunks, 1 byte
    assert refused(re, "A", Chunk("t", 0, 2, 0, sha(b""), b"")) == "malformed"
    assert re.pending == 0
    assert feed(re, "A", [Chunk("u", 0, 2, 2, sha(b"xy"), b"x"), Chunk("u", 1, 2, 2, sha(b"xy"), b"y")]) == \
        [None, b"xy"]  # one byte per chunk is fine


def test_max_total_bytes_is_inclusive():
    re = Reassembler(max_total_bytes=1024)
    assert feed(re, "A", parts(PAYLOAD, 4))[-1] == PAYLOAD
    assert refused(re, "A", Chunk("u", 0, 2, 1025, sha(b""), b"x")) == "oversize"
    assert refused(Reassembler(max_total_bytes=0), "A", Chunk("u", 0, 1, 1, sha(b"x"), b"x")) == "oversize"


# ------------------------------------------------------------------------------- constructor

@pytest.mark.parametrize("kwargs", [
    {"timeout_s": 0}, {"timeout_s": -1.0}, {"timeout_s": float("nan")},
    {"max_total_bytes": -1},
    {"max_pending": 0}, {"max_pending": -5}, {"max_pending_per_source": 0},
    {"max_buffered_per_source": -1},
    {"max_total_bytes": 100, "max_buffered_bytes": 99},               # one maximal transfer must fit
    {"max_buffered_bytes": 1000, "max_buffered_per_source": 1001, "max_total_bytes": 10},  # per source > global
    {"max_total_bytes": 2000, "max_buffered_bytes": 1000},
    {"max_total_bytes": 2000, "max_buffered_bytes": 1000, "max_buffered_per_source": 500},
])
def test_constructor_refuses(kwargs):
    with pytest.raises(ValueError):
        Reassembler(**kwargs)


def test_constructor_messages():
    with pytest.raises(ValueError, match="max_total_bytes must be >= 0, got -1"):
        Reassembler(max_total_bytes=-1)
    with pytest.raises(ValueError, match=r"max_pending \(0\) and max_pending_per_source \(8\) must be >= 1"):
        Reassembler(max_pending=0)
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        Reassembler(timeout_s=0)


def test_constructor_edges_and_defaults():
    re = Reassembler(timeout_s=1e-9, max_total_bytes=0, max_pending=1, max_pending_per_source=1,
                     max_buffered_bytes=0, max_buffered_per_source=0)
    assert (re.max_total_bytes, re.max_buffered_bytes, re.max_buffered_per_source) == (0, 0, 0)
    re = Reassembler(max_total_bytes=100, max_buffered_bytes=100, max_buffered_per_source=100)
    assert re.max_buffered_per_source == 100
    re = Reassembler()
    assert (re.timeout_s, re.max_total_bytes, re.max_pending, re.max_pending_per_source) == (30.0, 256 << 20, 256, 8)
    assert (re.max_buffered_bytes, re.max_buffered_per_source) == (1 << 30, 256 << 20)
    re = Reassembler(max_total_bytes=(1 << 30) + 1)  # the global default grows to hold one maximal transfer
    assert re.max_buffered_bytes == (1 << 30) + 1 and re.max_buffered_per_source == (1 << 30) + 1
    assert (re.pending, re.buffered_bytes, re.buffered_by("x"), re.duplicates, re.pending_transfers()) == \
        (0, 0, 0, 0, [])


def test_the_default_chunk_size_is_one_mib():
    mib = bytes(1 << 20)
    assert split_envelope_payload(mib, "d", 0) == [mib]
    # one byte more: ceil((2**20 + 1) / (2**20 - 512)) = 2 chunks
    wires = split_envelope_payload(mib + b"x", "d", 0)
    assert len(wires) == 2 and all(len(w) <= 1 << 20 for w in wires)
