"""Tests of edge_sdk.protocol.messages: every kind, golden frames, strict decoding, fuzzing."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import (MESSAGE_TYPES, SCHEMA_VERSION, Ack, Chunk, CodecLimits, Model, Envelope, Error,
                             DataCount, Evaluate, Evaluation, FleetStats, Plan, StatsRequest,
                             ProfileUpdate, ProtocolError, Register, RoundStart, Status, Stop, Update,
                             decode_envelope, encode_envelope, packb, peek_header)

W = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
FIXED_ID = "0123456789abcdef0123456789abcdef"

SAMPLES = [
    Register({"ram_mb": 4096, "cpu_ghz": 1.5, "arch": "aarch64", "gpu": False}, 1200, ("fp16", "prune"), "0.1.0"),
    Register({"ram_mb": 4096}, 1200, ("fedavg",), "0.3.0", 1, (1, 28, 28), 10),
    Plan("fedavg", "sub-0.5", {"arch": "cnn", "layers": [{"conv": [3, 16, 3]}, None, 1.5, True]},
         {"conv.weight": np.ones((16, 3, 3, 3), np.float32), "steps": np.arange(3, dtype=np.int64)},
         {"epochs": 2, "lr": 0.01, "optimizer": {"name": "sgd", "momentum": 0.9}}),
    Plan("fedavg", "global", {"layers": []}, {"head": W}, {}, None, {"biases": "ab" * 32, "kept": "0f" * 32}),
    RoundStart(120.5, ("dev-1", "dev-2")),
    Update("full", {"w": W, "b": np.zeros(2, np.float16), "mask": np.array([True, False])}, 10, {"loss": 0.25}),
    Update("global", {"head": W}, 10, {}, {"biases": "ab" * 32}),
    Ack("ok"),
    Error("malformed", "bad body"),
    Status("idle", "battery low", {"battery": 0.12}),
    Stop("job finished"),
    Chunk("ab" * 16, 1, 3, 2500, bytes(range(32)), b"\x00\xff" * 10),
    Model("0.5", 4, bytes(range(32)), b"\x08\x07onnx", (1, 28, 28)),
    ProfileUpdate(12.5, 10, 1.08, 11.9, 0.31, 0.04, 1800.0),
    Evaluate("flanc", "0.5", {"layers": [{"type": "linear", "out": 2}]}, {"w": W}, {"static_bn": True},
             {"mean": [0.5], "std": [0.25]}, True),
    Evaluate("fedavg", "global", {"layers": []}, {"w": W}, {}, None, False, {"w": W * 2}),
    Evaluate("fedavg", "global", {"layers": []}, {"w": W}, {}, None, False, None, {"biases": "cd" * 32}),
    Evaluation("0.5", 40, 31, 12.5, (20, 20), (15, 16), "", 0.02),
    Evaluation("global", 40, 31, 12.5, baseline_correct=29),
    Evaluation("0.5", 0, 0, 0.0, reason="too little data"),
    DataCount(training=120, new=12, held_out=30),
    StatsRequest("channel_moments"),
    FleetStats("channel_moments", 40, (0.5, 1.5), (3.0, 4.0)),
]


def assert_same_body(a, b) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("tensors", "baseline") and x is not None:
            assert list(x) == list(y)
            for k in x:
                assert x[k].dtype == y[k].dtype
                np.testing.assert_array_equal(x[k], y[k])
        else:
            assert (bytes(x) if isinstance(y, memoryview) else x) == (bytes(y) if isinstance(y, memoryview) else y)


@pytest.mark.parametrize("body", SAMPLES, ids=lambda b: b.KIND)
def test_roundtrip_every_kind(body) -> None:
    env = Envelope.of(body, "dev-1", round=4, reply_to="f" * 32)
    out = decode_envelope(encode_envelope(env))
    assert (out.kind, out.sender, out.round, out.msg_id, out.reply_to, out.version) == (
        body.KIND, "dev-1", 4, env.msg_id, "f" * 32, SCHEMA_VERSION)
    assert_same_body(body, out.body)


@pytest.mark.parametrize("body", [
    {"label": "g", "num_samples": 5, "correct": 6, "loss_sum": 1.0},  # more correct than samples
    {"label": "g", "num_samples": 5, "correct": 2, "loss_sum": -1.0},  # a negative loss
    {"label": "g", "num_samples": 5, "correct": 2, "loss_sum": float("nan")},
    {"label": "g", "num_samples": 5, "correct": 2, "loss_sum": 1.0, "class_counts": [2, 2], "class_correct": [1, 1]},
    {"label": "g", "num_samples": 4, "correct": 2, "loss_sum": 1.0, "class_counts": [2, 2], "class_correct": [0, 3]},
    {"label": "g", "num_samples": 4, "correct": 2, "loss_sum": 1.0, "class_counts": [4], "class_correct": [1, 1]},
    {"label": "g", "num_samples": 0, "correct": 0, "loss_sum": 2.0},  # a loss over no samples
    {"label": "g", "num_samples": -1, "correct": 0, "loss_sum": 0.0},
    {"label": "g" * 100, "num_samples": 1, "correct": 0, "loss_sum": 0.0},
    {"label": "g", "num_samples": 4, "correct": 2, "loss_sum": 1.0, "baseline_correct": 5},  # more than evaluated
    {"label": "g", "num_samples": 4, "correct": 2, "loss_sum": 1.0, "baseline_correct": -2},
])
def test_an_impossible_evaluation_is_malformed(body) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        Evaluation.from_body(body, CodecLimits(), None)


def test_every_kind_is_registered_and_sampled() -> None:
    assert set(MESSAGE_TYPES) == {b.KIND for b in SAMPLES}
    assert all(MESSAGE_TYPES[k].KIND == k for k in MESSAGE_TYPES)


# Golden bytes, checked by hand against the msgpack spec: msgpack header, then the data region.
GOLDEN_UPDATE_HEADER = (
    "87"                                              # fixmap, 7 entries
    "a176" "01"                                       # "v": 1
    "a46b696e64" "a6757064617465"                     # "kind": "update"
    "a26964" "d920" + FIXED_ID.encode().hex() +       # "id": str8(32)
    "a87265706c795f746f" "c0"                         # "reply_to": nil
    "a5726f756e64" "03"                               # "round": 3
    "a673656e646572" "a56465762d31"                   # "sender": "dev-1"
    "a4626f6479" "84"                                 # "body": fixmap(4)
    "a56c6162656c" "a16d"                             # "label": "m"
    "a774656e736f7273" "81" "a177" "84"               # "tensors": {"w": fixmap(4)
    "a56474797065" "a7666c6f61743332"                 # "dtype": "float32"
    "a57368617065" "92" "02" "02"                     # "shape": [2, 2]
    "a66f6666736574" "00"                             # "offset": 0
    "a66e6279746573" "10"                             # "nbytes": 16}
    "ab6e756d5f73616d706c6573" "0a"                   # "num_samples": 10
    "a76d657472696373" "81" "a46c6f7373"              # "metrics": {"loss":
    "cb3fe0000000000000"                              # float64 0.5}
)
GOLDEN_UPDATE = GOLDEN_UPDATE_HEADER + "0000803f" "00000040" "00004040" "00008040"  # data: 1.0 2.0 3.0 4.0 <f4


def test_golden_bytes_update() -> None:
    env = Envelope("update", "dev-1", Update("m", {"w": W}, 10, {"loss": 0.5}), round=3, msg_id=FIXED_ID)
    wire = encode_envelope(env)
    assert wire.hex() == GOLDEN_UPDATE and len(wire) == 200
    header = msgpack.Unpacker(raw=False)
    header.feed(wire)
    header.unpack()
    assert header.tell() == 184 == len(GOLDEN_UPDATE_HEADER) // 2  # msgpack alone finds the data region
    assert decode_envelope(bytes.fromhex(GOLDEN_UPDATE)).body.tensors["w"].tolist() == W.tolist()


GOLDEN_CHUNK = (
    "87" "a176" "01" "a46b696e64" "a56368756e6b" "a26964" "a178"    # {"v": 1, "kind": "chunk", "id": "x",
    "a87265706c795f746f" "c0" "a5726f756e64" "00"                 # "reply_to": nil, "round": 0,
    "a673656e646572" "a164" "a4626f6479" "86"                     # "sender": "d", "body": fixmap(6)
    "ab7472616e736665725f6964" "a174" "a5696e646578" "01"         # "transfer_id": "t", "index": 1,
    "a5636f756e74" "02" "ab746f74616c5f6279746573" "05"           # "count": 2, "total_bytes": 5,
    "a6736861323536" "c420" + "ab" * 32 +                         # "sha256": bin8(32),
    "a464617461" "82" "a66f6666736574" "00" "a66e6279746573" "02"  # "data": {"offset": 0, "nbytes": 2}}}
    "6869"                                                        # data region: b"hi"
)


def test_golden_bytes_chunk() -> None:
    env = Envelope("chunk", "d", Chunk("t", 1, 2, 5, b"\xab" * 32, b"hi"), round=0, msg_id="x")
    wire = encode_envelope(env)
    assert wire.hex() == GOLDEN_CHUNK and len(wire) == 158
    out = decode_envelope(wire).body
    assert bytes(out.data) == b"hi" and isinstance(out.data, memoryview) and out.data.obj is wire  # zero-copy


def test_golden_bytes_ack() -> None:
    env = Envelope("ack", "c", Ack(), round=-1, msg_id="x", reply_to="y")
    assert encode_envelope(env).hex() == (
        "87a17601a46b696e64a361636ba26964a178a87265706c795f746fa179a5726f756e64ff"
        "a673656e646572a163a4626f647981a46e6f7465a0")


def test_fp16_transfer_through_envelope() -> None:
    big = np.linspace(0, 1, 10_000, dtype=np.float32)
    env = Envelope.of(Update("full", {"w": big, "n": np.arange(4)}, 1, {}), "d")
    full, half = encode_envelope(env), encode_envelope(env, transfer_dtype="float16")
    assert len(full) - len(half) == big.nbytes // 2
    out = decode_envelope(half).body.tensors
    assert out["w"].dtype == np.float16 and out["n"].dtype == np.int64
    np.testing.assert_allclose(out["w"], big, atol=5e-4)


def test_envelope_construction_checks() -> None:
    assert Envelope.of(Ack(), "dev").kind == "ack"
    assert Envelope.of(Ack(), "dev").msg_id != Envelope.of(Ack(), "dev").msg_id
    for kwargs in ({"kind": "stop"}, {"sender": "a/b"}, {"sender": ""}, {"round": -2}, {"msg_id": "x" * 65}):
        args = {"kind": "ack", "sender": "dev", "body": Ack(), **kwargs}
        with pytest.raises(ValueError):
            Envelope(**args)


# ----------------------------------------------------------------------------- rejection


def wire_of(env_map: dict, data: bytes = b"") -> bytes:
    """A frame built by hand: plain msgpack header map, then the raw data region."""
    return packb(env_map) + data


def base_map(**overrides) -> dict:
    m = {"v": 1, "kind": "ack", "id": "abc", "reply_to": None, "round": 0, "sender": "dev-1", "body": {"note": ""}}
    m.update(overrides)
    return m


def code_of(payload: bytes, limits: CodecLimits = CodecLimits()) -> str:
    with pytest.raises(ProtocolError) as e:
        decode_envelope(payload, limits)
    assert str(e.value)
    return e.value.code


def test_header_rejections() -> None:
    assert decode_envelope(wire_of(base_map())).body == Ack("")
    assert code_of(wire_of(base_map(v=2))) == "version"
    assert code_of(wire_of(base_map(v=2, kind="nope"))) == "version"  # version is checked first
    assert code_of(wire_of(base_map(kind="nope"))) == "kind"
    bad = [{"v": "1"}, {"v": True}, {"kind": 3}, {"id": ""}, {"id": "x" * 65}, {"id": 5}, {"round": -2},
           {"round": "1"}, {"round": 1.0}, {"sender": ""}, {"sender": "a/b"}, {"sender": "dev+"},
           {"sender": "x" * 129}, {"sender": None}, {"reply_to": 5}, {"reply_to": "r" * 65}, {"body": []}]
    for override in bad:
        assert code_of(wire_of(base_map(**override))) == "malformed", override
    for key in ("v", "kind", "id", "round", "sender", "body"):
        m = base_map()
        del m[key]
        assert code_of(wire_of(m)) == "malformed", key
    assert code_of(packb([1, 2])) == "malformed"
    assert code_of(b"\x87\xa1v") == "malformed"  # truncated
    assert code_of(b"garbage!") == "malformed"


def body_code(kind: str, body: dict, data: bytes = b"") -> str:
    return code_of(wire_of(base_map(kind=kind, body=body), data))


GOOD_TENSOR = {"dtype": "float32", "shape": [1], "offset": 0, "nbytes": 4}
ABC = {"offset": 0, "nbytes": 3}


@pytest.mark.parametrize(
    "kind, body, code",
    [
        ("register", {"profile": {"ram": 1}, "num_samples": -1}, "malformed"),
        ("register", {"profile": {"ram": 1}, "num_samples": True}, "malformed"),
        ("register", {"profile": {"ram": 1}, "num_samples": "3"}, "malformed"),
        ("register", {"profile": {"ram": {"nested": 1}}, "num_samples": 1}, "malformed"),
        ("register", {"profile": {"ram": None}, "num_samples": 1}, "malformed"),
        ("register", {"profile": {"ram": 1}, "num_samples": 1, "capabilities": [1]}, "malformed"),
        ("register", {"num_samples": 1}, "malformed"),
        ("plan", {"method": "m", "label": "l", "model_spec": {"x": b"bin"}, "tensors": {}, "train": {}}, "malformed"),
        ("plan", {"method": "m", "label": "l", "model_spec": {"x": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]},
                  "tensors": {}, "train": {}}, "limit"),
        ("plan", {"method": "m", "label": "l", "model_spec": {}, "tensors": [], "train": {}}, "malformed"),
        ("plan", {"method": "m", "label": "l", "model_spec": {}, "tensors": {}}, "malformed"),
        ("round_start", {"deadline_s": -1.0, "participants": []}, "malformed"),
        ("round_start", {"deadline_s": float("nan"), "participants": []}, "malformed"),
        ("round_start", {"deadline_s": 5, "participants": "dev-1"}, "malformed"),
        ("update", {"label": "l", "tensors": {"w": GOOD_TENSOR}, "num_samples": 1, "metrics": {"a": "x"}},
         "malformed"),
        ("update", {"label": "l", "tensors": {"w": {**GOOD_TENSOR, "dtype": "object"}}, "num_samples": 1,
                    "metrics": {}}, "dtype"),
        ("update", {"label": "l", "tensors": {"w": {**GOOD_TENSOR, "shape": [2]}}, "num_samples": 1,
                    "metrics": {}}, "shape"),
        ("update", {"label": "l", "tensors": {"w": {**GOOD_TENSOR, "shape": [-1]}}, "num_samples": 1,
                    "metrics": {}}, "shape"),
        ("update", {"label": 1, "tensors": {}, "num_samples": 1, "metrics": {}}, "malformed"),
        ("update", {"label": "l", "tensors": {}, "num_samples": 1, "metrics": {}, "fixed": {"b": "ab"}},
         "malformed"),  # a digest is 64 hex characters
        ("update", {"label": "l", "tensors": {}, "num_samples": 1, "metrics": {}, "fixed": {"b": "AB" * 32}},
         "malformed"),
        ("update", {"label": "l", "tensors": {}, "num_samples": 1, "metrics": {},
                    "fixed": {f"t{i}": "ab" * 32 for i in range(65)}}, "malformed"),  # more than MAX_FIXED
        ("plan", {"method": "m", "label": "l", "model_spec": {}, "tensors": {}, "train": {}, "fixed": ["b"]},
         "malformed"),
        ("plan", {"method": "m", "label": "l", "model_spec": {}, "tensors": {}, "train": {},
                  "fixed": {"": "ab" * 32}}, "malformed"),
        ("error", {"code": "x"}, "malformed"),
        ("status", {"state": None}, "malformed"),
        ("ack", {"note": 1}, "malformed"),
        ("stop", {"reason": b"x"}, "malformed"),
        ("chunk", {"transfer_id": "t", "index": 3, "count": 3, "total_bytes": 9, "sha256": b"\0" * 32,
                   "data": ABC}, "malformed"),
        ("chunk", {"transfer_id": "t", "index": 0, "count": 3, "total_bytes": 9, "sha256": b"\0" * 31,
                   "data": ABC}, "malformed"),
        ("chunk", {"transfer_id": "t", "index": 0, "count": 1, "total_bytes": 2, "sha256": b"\0" * 32,
                   "data": ABC}, "malformed"),
        ("chunk", {"transfer_id": "", "index": 0, "count": 1, "total_bytes": 3, "sha256": b"\0" * 32,
                   "data": ABC}, "malformed"),
    ],
)
def test_body_rejections(kind: str, body: dict, code: str) -> None:
    tensors = body.get("tensors")
    data = b"\0" * 4 if isinstance(tensors, dict) and tensors else b"abc" if kind == "chunk" else b""
    assert body_code(kind, body, data) == code


def update_body(*tensors: dict) -> dict:
    return {"label": "l", "tensors": {f"t{i}": t for i, t in enumerate(tensors)}, "num_samples": 1, "metrics": {}}


def f32(offset: int, n: int = 1) -> dict:
    return {"dtype": "float32", "shape": [n], "offset": offset, "nbytes": 4 * n}


CHUNK_BODY = {"transfer_id": "t", "index": 0, "count": 1, "total_bytes": 3, "sha256": b"\0" * 32}


@pytest.mark.parametrize(
    "kind, body, data",
    [
        ("ack", {"note": ""}, b"\0"),  # data region nobody references
        ("update", update_body(f32(0)), b"\0" * 5),  # trailing byte after the last tensor
        ("update", update_body(f32(0)), b"\0" * 3),  # data region too short
        ("update", update_body(f32(0), f32(8)), b"\0" * 12),  # gap
        ("update", update_body(f32(0, 2), f32(4)), b"\0" * 12),  # overlap
        ("update", update_body(f32(4), f32(0)), b"\0" * 8),  # out of header order
        ("update", update_body({**f32(0), "offset": -4}), b"\0" * 4),
        ("update", update_body({**f32(0), "offset": None}), b"\0" * 4),
        ("update", update_body({"dtype": "float32", "shape": [1], "data": b"\0" * 4}), b""),  # old inline form
        ("chunk", {**CHUNK_BODY, "data": {"offset": 0, "nbytes": 4}}, b"abc"),
        ("chunk", {**CHUNK_BODY, "data": {"offset": 1, "nbytes": 2}}, b"abc"),
        ("chunk", {**CHUNK_BODY, "data": b"abc"}, b""),  # old inline form
        ("chunk", {**CHUNK_BODY, "data": ABC}, b"abcd"),
    ],
)
def test_data_region_rejections(kind: str, body: dict, data: bytes) -> None:
    assert body_code(kind, body, data) == "malformed"
    out = decode_envelope(wire_of(base_map(kind="update", body=update_body(f32(0, 2), f32(8))), W.tobytes()[:12]))
    assert [t.tolist() for t in out.body.tensors.values()] == [[1.0, 2.0], [3.0]]  # the right frame decodes


def test_forward_compatible_extra_fields_and_optional_defaults() -> None:
    env = decode_envelope(wire_of(base_map(kind="status", body={"state": "online", "future": [1, 2]}, extra=1)))
    assert env.body == Status("online", "", {})
    reg = decode_envelope(wire_of(base_map(kind="register", body={"profile": {}, "num_samples": 0})))
    assert reg.body == Register({}, 0, (), "")


@pytest.mark.parametrize("shape", [[0], [1, -2], ["28"], [1.5], [1] * 9, [2 ** 31], "1x28"])
def test_a_registration_input_shape_must_be_a_few_positive_integers(shape) -> None:
    body = {"profile": {}, "num_samples": 5, "input_shape": shape, "num_classes": 10}
    with pytest.raises(ProtocolError, match="input_shape") as err:
        decode_envelope(wire_of(base_map(kind="register", body=body)))
    assert err.value.code == "malformed"


@pytest.mark.parametrize("classes", [-1, 10 ** 7, 2.5, "10", True])
def test_a_registration_class_count_must_be_a_bounded_integer(classes) -> None:
    body = {"profile": {}, "num_samples": 5, "input_shape": [1, 8, 8], "num_classes": classes}
    with pytest.raises(ProtocolError, match="num_classes") as err:
        decode_envelope(wire_of(base_map(kind="register", body=body)))
    assert err.value.code == "malformed"


def test_limits_apply_to_envelopes() -> None:
    env = Envelope.of(Update("l", {f"t{i}": np.zeros(1, np.float32) for i in range(5)}, 1, {}), "d")
    wire = encode_envelope(env)
    assert code_of(wire, CodecLimits(max_tensors=4)) == "limit"
    assert code_of(wire, CodecLimits(max_message_bytes=len(wire) - 1)) == "oversize"
    assert code_of(wire, CodecLimits(allowed_dtypes=frozenset({"int8"}))) == "dtype"
    assert len(decode_envelope(wire, CodecLimits(max_message_bytes=len(wire))).body.tensors) == 5


def test_ext_types_rejected_inside_envelope() -> None:
    m = msgpack.packb(base_map(kind="status", body={"state": msgpack.ExtType(5, b"x")}), use_bin_type=True)
    assert code_of(m) == "malformed"


# ----------------------------------------------------------------------------- peek_header


def test_peek_header() -> None:
    env = Envelope.of(Ack(), "dev-7", round=2)
    assert peek_header(encode_envelope(env)) == (1, "ack", env.msg_id, "dev-7")
    broken = wire_of(base_map(kind="update", body={"label": 1, "tensors": "junk"}, id="m1"))
    assert code_of(broken) == "malformed"
    assert peek_header(broken) == (1, "update", "m1", "dev-1")
    assert peek_header(wire_of(base_map(v=9, sender="a/b"))) == (9, "ack", "abc", None)
    assert peek_header(encode_envelope(env)[:30])[:2] == (1, "ack")  # truncated: partial answer
    for junk in (b"", b"\xc1\xc1", b"\x87" + b"\xff" * 50, packb([1]), None, 12, "text"):
        assert peek_header(junk) == (None, None, None, None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- fuzzing


def only_protocol_errors(payload: bytes) -> None:
    try:
        env = decode_envelope(payload)
    except ProtocolError as e:
        assert e.code in {"malformed", "oversize", "dtype", "shape", "version", "kind", "limit"}
    else:
        assert isinstance(env, Envelope)
    peek_header(payload)  # must never raise


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
leaf = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
        | st.binary(max_size=40) | st.sampled_from(list(MESSAGE_TYPES) + ["float32", "object", "shape"]))
junk = st.recursive(leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(
    st.sampled_from(["v", "kind", "id", "sender", "body", "round", "tensors", "dtype", "shape", "data",
                     "label", "count", "index"]) | st.text(max_size=5), c, max_size=6), max_leaves=30)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(payload: bytes) -> None:
    only_protocol_errors(payload)


@FUZZ
@given(junk)
def test_fuzz_random_msgpack_objects(obj) -> None:
    try:
        payload = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    only_protocol_errors(payload)


@FUZZ
@given(st.sampled_from(list(MESSAGE_TYPES)), st.dictionaries(st.text(max_size=12), junk, max_size=6), junk)
def test_fuzz_random_bodies_of_every_kind(kind: str, body: dict, rnd) -> None:
    only_protocol_errors(msgpack.packb(base_map(kind=kind, body=body), use_bin_type=True))
    try:
        only_protocol_errors(msgpack.packb(base_map(kind=kind, round=rnd), use_bin_type=True))
    except (OverflowError, ValueError):
        pass


@FUZZ
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_valid_envelopes(body, data) -> None:
    wire = bytearray(encode_envelope(Envelope.of(body, "dev-1", 1)))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(wire) - 1))
        wire[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del wire[data.draw(st.integers(0, len(wire) - 1)):]
    only_protocol_errors(bytes(wire))


@FUZZ
@given(st.sampled_from([b for b in SAMPLES if b.KIND in ("plan", "update", "chunk")]), st.data())
def test_fuzz_mutated_references_and_data_region(body, data) -> None:
    wire = encode_envelope(Envelope.of(body, "dev-1", 1))
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(wire)
    header = unpacker.unpack()
    raw = wire[unpacker.tell():]
    refs = list(header["body"]["tensors"].values()) if "tensors" in header["body"] else [header["body"]["data"]]
    assert sum(r["nbytes"] for r in refs) == len(raw)
    ref = data.draw(st.sampled_from(refs))
    key = data.draw(st.sampled_from(["offset", "nbytes", "shape", "dtype"] if "dtype" in ref else ["offset", "nbytes"]))
    ref[key] = data.draw(st.integers(-(2**63), 2**64 - 1) | st.lists(st.integers(-3, 2**40), max_size=9)
                         | st.sampled_from(["float32", "bool", "int8", "object"]) | st.none())
    raw = raw[:data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=8))
    only_protocol_errors(msgpack.packb(header, use_bin_type=True) + raw)
