"""Tests of edge_sdk.protocol.codec: frames (header + data region), tensors, plain msgpack, limits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import CodecLimits, ProtocolError, check_finite, packb, unpackb
from edge_sdk.protocol.codec import (
    MAX_HEADER_BYTES,
    Blob,
    DataRegion,
    decode_frame,
    encode_frame,
    pack_tensor,
    pack_tensors,
    unpack_tensor,
    unpack_tensors,
)

LIMITS = CodecLimits()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame(header: object, data: bytes = b"") -> bytes:
    """A frame built by hand: plain msgpack header, then the raw data region."""
    return msgpack.packb(header, use_bin_type=True) + data


def decode_tensors(payload: bytes | bytearray | memoryview, limits: CodecLimits = LIMITS) -> dict[str, np.ndarray]:
    header, data = decode_frame(payload, limits)
    out = unpack_tensors(header, data, limits)
    data.finish()
    return out


def roundtrip(a: np.ndarray, transfer_dtype: str | None = None, limits: CodecLimits = LIMITS) -> np.ndarray:
    return decode_tensors(encode_frame({"t": pack_tensor(a, transfer_dtype)}), limits)["t"]


# ----------------------------------------------------------------------------- frame layout


def test_frame_is_plain_msgpack_header_then_tensor_bytes_in_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([True, False, True])
    c = np.arange(3, dtype=">i2")  # byte-swapped on the wire
    wire = encode_frame({"x": 1, "t": {"a": pack_tensor(a), "b": pack_tensor(b)}, "c": [pack_tensor(c)]})
    header = {"x": 1, "t": {"a": {"dtype": "float32", "shape": [2, 3], "offset": 0, "nbytes": 24},
                            "b": {"dtype": "bool", "shape": [3], "offset": 24, "nbytes": 3}},
              "c": [{"dtype": "int16", "shape": [3], "offset": 27, "nbytes": 6}]}
    assert wire == msgpack.packb(header, use_bin_type=True) + a.tobytes() + b.tobytes() + c.astype("<i2").tobytes()


def test_blob_refs_carry_meta_and_raw_bytes() -> None:
    wire = encode_frame({"p": Blob(b"abc"), "q": Blob(memoryview(b"xyz")[1:], {"k": 7})})
    header, data = decode_frame(wire, LIMITS)
    assert header == {"p": {"offset": 0, "nbytes": 3}, "q": {"k": 7, "offset": 3, "nbytes": 2}}
    assert bytes(data.take(header["p"])) == b"abc" and bytes(data.take(header["q"])) == b"yz"
    data.finish()
    assert wire.endswith(b"abcyz")


def test_decode_finds_header_end_with_msgpack_only_for_any_header_size() -> None:
    rng = np.random.default_rng(0)
    for n_tensors in (1, 50, 3000):  # headers of ~60 B ... ~200 kB (more than one unpacker feed)
        tensors = {f"layer{i}.weight": rng.standard_normal(i % 5 + 1).astype(np.float32) for i in range(n_tensors)}
        wire = encode_frame(pack_tensors(tensors))
        header, data = decode_frame(wire, LIMITS)
        assert data.start == len(wire) - sum(a.nbytes for a in tensors.values())
        out = unpack_tensors(header, data, LIMITS)
        data.finish()
        assert list(out) == list(tensors)
        for k in tensors:
            np.testing.assert_array_equal(out[k], tensors[k])


def test_header_size_limit() -> None:
    header = {"s": "x" * 1000}
    size = len(msgpack.packb(header))
    tail = b"\0" * 5000
    limits = CodecLimits(max_header_bytes=size)
    assert decode_frame(frame(header) + tail, limits)[1].size == 5000  # exactly at the limit: fine
    with pytest.raises(ProtocolError) as e:
        decode_frame(frame(header) + tail, CodecLimits(max_header_bytes=size - 1))
    assert e.value.code == "oversize"
    with pytest.raises(ValueError):
        encode_frame(header, max_header_bytes=size - 1)  # the encoder never emits such a header
    with pytest.raises(ProtocolError) as e:
        decode_frame(frame(header)[:-1], limits)  # truncated header, payload ends inside it
    assert e.value.code == "malformed"
    assert MAX_HEADER_BYTES == LIMITS.max_header_bytes == 1 << 20


def test_decode_is_zero_copy_and_read_only() -> None:
    a = np.arange(1000, dtype=np.float64)
    payload = encode_frame({"a": pack_tensor(a)})
    b = decode_tensors(payload)["a"]
    assert np.shares_memory(b, np.frombuffer(payload, dtype=np.uint8))
    with pytest.raises(ValueError):
        b[0] = 1.0
    view = memoryview(payload)  # a read-only view of bytes is used as is
    assert np.shares_memory(decode_tensors(view)["a"], np.frombuffer(payload, dtype=np.uint8))


def test_mutable_payload_is_copied_so_tensors_cannot_change() -> None:
    a = np.arange(16, dtype=np.int32)
    buf = bytearray(encode_frame({"a": pack_tensor(a)}))
    for payload in (buf, memoryview(buf)):
        b = decode_tensors(payload)["a"]
        buf[-4:] = b"\xff\xff\xff\xff"
        np.testing.assert_array_equal(a, b)
        buf[-4:] = a[-1:].tobytes()


@pytest.mark.parametrize(
    "refs, data, fragment",
    [
        ([(0, 4), (5, 4)], 9, "offset 5, expected 4"),  # gap
        ([(0, 4), (2, 4)], 8, "offset 2, expected 4"),  # overlap
        ([(4, 4), (0, 4)], 8, "offset 4, expected 0"),  # out of header order
        ([(0, 4), (4, 5)], 8, "does not fit"),  # past the end
        ([(0, -1)], 0, "does not fit"),
        ([(0, True)], 1, "integer"),
        ([(0.0, 4)], 4, "integer"),
        ([(0, 4)], 6, "2 bytes of the data region are not referenced"),
    ],
)
def test_data_region_references_must_tile_it_exactly(refs, data: int, fragment: str) -> None:
    header = [{"offset": o, "nbytes": n} for o, n in refs]
    h, region = decode_frame(frame(header, b"\0" * data), LIMITS)
    with pytest.raises(ProtocolError) as e:
        for ref in h:
            region.take(ref)
        region.finish()
    assert e.value.code == "malformed" and fragment in str(e.value)


def test_data_region_take_rejects_non_maps() -> None:
    region = DataRegion(b"\x90abc", 1)
    for ref in (None, [0, 3], {"offset": 0}, {"nbytes": 3}, b"abc"):
        with pytest.raises(ProtocolError) as e:
            region.take(ref)
        assert e.value.code == "malformed"
    assert bytes(region.take({"offset": 0, "nbytes": 3})) == b"abc"


def test_encode_copies_tensor_bytes_only_into_the_frame() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    blob = pack_tensor(a)
    assert isinstance(blob, Blob) and blob.meta == {"dtype": "float32", "shape": [3, 4]}
    assert np.shares_memory(np.frombuffer(blob.data, dtype=np.uint8), a)  # no copy before the join
    with pytest.raises(TypeError):
        packb({"t": blob})  # blobs need a data region


# ----------------------------------------------------------------------------- tensors


@pytest.mark.parametrize("dtype", sorted(LIMITS.allowed_dtypes))
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (2, 0, 4), (1, 2, 1, 3)])
def test_tensor_roundtrip_every_dtype_and_shape(dtype: str, shape: tuple) -> None:
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    b = roundtrip(a)
    assert b.dtype == np.dtype(dtype) and b.shape == shape
    np.testing.assert_array_equal(a, b)
    assert not b.flags.writeable


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">f8", ">i2"])
def test_big_endian_input_is_sent_little_endian(dtype: str) -> None:
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    assert bytes(pack_tensor(a).data) == a.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    b = roundtrip(a)
    assert b.dtype.isnative
    np.testing.assert_array_equal(a, b)


def test_non_contiguous_inputs() -> None:
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    for view in (base.T, base[:, ::2, 1:], base[::-1], np.broadcast_to(base[0, 0], (3, 5))):
        b = roundtrip(view)
        assert b.flags.c_contiguous
        np.testing.assert_array_equal(view, b)


def test_fp16_transfer_halves_floats_and_keeps_ints() -> None:
    w = np.linspace(-1, 1, 100, dtype=np.float32).reshape(10, 10)
    n = np.arange(5, dtype=np.int64)
    packed = pack_tensors({"w": w, "n": n}, transfer_dtype="float16")
    assert packed["w"].meta["dtype"] == "float16" and packed["w"].data.nbytes == w.nbytes // 2
    assert packed["n"].meta["dtype"] == "int64" and packed["n"].data.nbytes == n.nbytes
    out = decode_tensors(encode_frame(packed))
    assert out["w"].dtype == np.float16
    np.testing.assert_allclose(out["w"].astype(np.float32), w, atol=1e-3)
    np.testing.assert_array_equal(out["n"], n)
    with pytest.raises(ValueError):
        pack_tensor(w, transfer_dtype="int8")


def test_pack_rejects_unsendable_dtypes() -> None:
    for a in (np.array(["abc"]), np.array([1 + 2j]), np.array([object()]), np.zeros(2, dtype="M8[s]")):
        with pytest.raises(ProtocolError) as e:
            pack_tensor(a)
        assert e.value.code == "dtype"
    with pytest.raises(TypeError):
        pack_tensor([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pack_tensors({1: np.zeros(1)})  # type: ignore[dict-item]


def _ref(dtype: object = "float32", shape: object = (2,), nbytes: object = 8) -> dict:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "offset": 0, "nbytes": nbytes}


@pytest.mark.parametrize(
    "obj, data, code",
    [
        (_ref(dtype="object"), 8, "dtype"),
        (_ref(dtype="complex64"), 8, "dtype"),
        (_ref(dtype="<U3"), 8, "dtype"),
        (_ref(dtype="uint64"), 8, "dtype"),  # safe but not in the default allowed set
        (_ref(shape=(3,)), 8, "shape"),  # 12 bytes needed, nbytes says 8
        (_ref(shape=(3,), nbytes=12), 8, "malformed"),  # consistent, but runs past the data region
        (_ref(shape=(-2,)), 8, "shape"),
        (_ref(shape=(1,) * 9, nbytes=4), 4, "shape"),  # ndim > 8
        (_ref(shape=(0, 2**62, 2**62), nbytes=0), 0, "shape"),
        (_ref(dtype="bool", shape=(2,), nbytes=2), b"\x01\x02", "malformed"),
        (_ref(shape=(True, 2)), 8, "malformed"),
        (_ref(shape=(2.0,)), 8, "malformed"),
        (_ref(nbytes="8"), 8, "malformed"),
        (_ref(dtype=5), 8, "malformed"),
        ({"dtype": "float32", "shape": [2], "offset": 0}, 8, "malformed"),
        ({"dtype": "float32", "shape": [2], "data": b"\0" * 8}, 0, "malformed"),  # old inline form
        ([1, 2], 8, "malformed"),
        ({**_ref(), "shape": 2}, 8, "malformed"),
    ],
)
def test_unpack_tensor_rejects(obj: object, data: int | bytes, code: str) -> None:
    raw = data if isinstance(data, bytes) else b"\0" * data
    header, region = decode_frame(frame(obj, raw), LIMITS)
    with pytest.raises(ProtocolError) as e:
        unpack_tensor(header, region, LIMITS)
    assert e.value.code == code
    assert str(e.value)


def test_tensor_and_count_limits() -> None:
    limits = CodecLimits(max_tensor_bytes=1024, max_tensors=3)
    header, region = decode_frame(frame(_ref(shape=(257,), nbytes=1028), b"\0" * 1028), limits)
    with pytest.raises(ProtocolError) as e:
        unpack_tensor(header, region, limits)
    assert e.value.code == "oversize"
    many = {f"t{i}": pack_tensor(np.zeros(2, np.float32)) for i in range(4)}
    with pytest.raises(ProtocolError) as e:
        decode_tensors(encode_frame(many), limits)
    assert e.value.code == "limit"
    assert len(decode_tensors(encode_frame(dict(list(many.items())[:3])), limits)) == 3
    header, region = decode_frame(frame({"a": _ref(dtype="object")}, b"\0" * 8), limits)
    with pytest.raises(ProtocolError) as e:
        unpack_tensors(header, region, limits)
    assert e.value.code == "dtype" and "'a'" in str(e.value)


# ----------------------------------------------------------------------------- finiteness


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_check_finite_catches_nan_inf(bad: float, dtype: str) -> None:
    good = np.ones((3, 3), dtype=dtype)
    broken = good.copy()
    broken[1, 2] = bad
    check_finite({"good": good, "ints": np.arange(3)})
    with pytest.raises(ProtocolError) as e:
        check_finite({"good": good, "broken": broken})
    assert e.value.code == "nonfinite" and "'broken'" in str(e.value) and "'good'" not in str(e.value)


def test_check_finite_no_false_positive_when_sum_overflows() -> None:
    check_finite({"huge": np.full(4, 1.7e308), "h16": np.full(100_000, 65000, dtype=np.float16)})


# ----------------------------------------------------------------------------- plain msgpack

plain_data = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=40) | st.binary(max_size=300),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=10), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(plain_data)
def test_packb_is_msgpack_and_a_frame_without_blobs(obj) -> None:
    wire = packb(obj)
    assert wire == msgpack.packb(obj, use_bin_type=True) == encode_frame(obj)
    assert unpackb(wire, LIMITS) == obj
    header, region = decode_frame(wire, LIMITS)
    assert header == obj and (region.start, region.size) == (len(wire), 0)
    region.finish()


def test_packb_converts_numpy_scalars_tuples_and_mappings() -> None:
    from types import MappingProxyType
    obj = {"a": np.float32(0.5), "b": np.int64(7), "c": (1, np.bool_(True)), "d": MappingProxyType({"x": 1})}
    assert unpackb(packb(obj), LIMITS) == {"a": 0.5, "b": 7, "c": [1, True], "d": {"x": 1}}
    with pytest.raises(TypeError):
        packb({"x": object()})
    with pytest.raises(TypeError):
        packb({"x": np.zeros(2)})  # arrays go through pack_tensor + encode_frame


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # empty
        b"\xc1",  # never-used type byte
        b"\x92\x01",  # truncated array
        b"\xa5ab",  # truncated str
        b"\xc6\x00\x00\x10\x00ab",  # truncated bin32
        b"\xa2\xff\xfe",  # invalid utf-8
        b"\x81\x01\x02",  # int map key
        b"\xd6\xff\x00\x00\x00\x01",  # timestamp ext
        b"\xd4\x01\x00",  # fixext1
        b"\xc7\x00\x05",  # ext8 of length 0
        b"\xdd\xff\xff\xff\xff",  # huge array claim
        b"\x91" * 2000 + b"\xc0",  # absurd nesting
    ],
)
@pytest.mark.parametrize("decode", [unpackb, decode_frame])
def test_decoders_reject_malformed(decode, payload: bytes) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(payload, LIMITS)
    assert e.value.code == "malformed"


def test_unpackb_rejects_trailing_data_frames_keep_it_as_data_region() -> None:
    with pytest.raises(ProtocolError) as e:
        unpackb(b"\x01\x02", LIMITS)
    assert e.value.code == "malformed"
    header, region = decode_frame(b"\x01\x02", LIMITS)
    assert header == 1 and region.size == 1
    with pytest.raises(ProtocolError):
        region.finish()


@pytest.mark.parametrize("decode", [unpackb, decode_frame])
def test_decoder_limits(decode) -> None:
    limits = CodecLimits(max_message_bytes=100, max_str_len=10, max_items=5)
    with pytest.raises(ProtocolError) as e:
        decode(b"\xc1" * 101, limits)  # garbage, but the size check comes first
    assert e.value.code == "oversize"
    for payload in (packb("x" * 11), packb(list(range(6))), packb({str(i): i for i in range(6)})):
        with pytest.raises(ProtocolError) as e:
            decode(payload, limits)
        assert e.value.code == "malformed"
    result = decode(packb(list(range(5))), limits)
    assert (result if decode is unpackb else result[0]) == [0, 1, 2, 3, 4]
    with pytest.raises(ProtocolError):
        decode("not bytes", limits)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- fuzzing
# (random bytes and byte-mutated envelopes are fuzzed through decode_envelope in test_messages.py)


VALID = encode_frame(pack_tensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array([True, False]),
                                   "e": np.zeros((0, 3), np.int8), "s": np.full((), 2.5)}))


def test_fuzz_seed_frame_is_valid() -> None:
    out = decode_tensors(VALID)
    assert list(out) == ["w", "m", "e", "s"] and out["s"] == 2.5 and out["e"].shape == (0, 3)


@FUZZ
@given(st.data())
def test_fuzz_mutated_references(data) -> None:
    header, region = decode_frame(VALID, LIMITS)
    raw = bytes(memoryview(VALID)[region.start:])
    name = data.draw(st.sampled_from(sorted(header)))
    key = data.draw(st.sampled_from(["offset", "nbytes", "shape", "dtype"]))
    header[name][key] = data.draw(st.integers(-(2**63), 2**64 - 1) | st.lists(st.integers(-3, 2**40), max_size=9)
                                  | st.sampled_from(["float32", "bool", "int8", "object"]) | st.none())
    raw = raw[:data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=8))
    try:
        out = decode_tensors(frame(header, raw))
    except ProtocolError as e:
        assert e.code in {"malformed", "oversize", "dtype", "shape", "limit"}
    else:
        assert all(isinstance(a, np.ndarray) and not a.flags.writeable for a in out.values())
