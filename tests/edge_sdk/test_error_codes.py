"""Error codes are a protocol type (`ErrorCode`, a str enum) whose wire bytes are the strings they
always were; docs/protocol.md §7 names no code that the enum lacks."""

from __future__ import annotations

import json
import re

import msgpack

from edge_sdk.protocol import ERROR_CODES, ErrorCode, ProtocolError
from edge_sdk.protocol.messages import Envelope, Error, decode_envelope, encode_envelope
from tests.support.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "protocol.md"


def test_a_code_is_its_wire_string_wherever_it_is_written() -> None:
    code = ErrorCode.NOT_TRAINING
    assert code == "not_training" and str(code) == "not_training" and f"{code}" == "not_training"
    logged = "%s" % code  # as logging formats it
    assert logged == "not_training" and json.dumps(code) == '"not_training"'
    assert msgpack.packb(code) == msgpack.packb("not_training")
    assert len({c.value for c in ErrorCode}) == len(ErrorCode)
    assert {c.value for c in ErrorCode} >= ERROR_CODES
    error = ProtocolError(ErrorCode.MALFORMED, "bad")
    assert type(error.code) is str and str(error) == "[malformed] bad"


def test_an_error_message_has_the_same_bytes_with_the_enum_or_the_string() -> None:
    for code in ErrorCode:
        head = {"sender": "dev", "round": 3, "msg_id": "m1", "reply_to": "p1"}
        typed = encode_envelope(Envelope("error", body=Error(code, "why"), **head))
        plain = encode_envelope(Envelope("error", body=Error(code.value, "why"), **head))
        assert typed == plain
        decoded = decode_envelope(plain).body
        assert type(decoded.code) is str and decoded.code == code and decoded == Error(code, "why")
    # a code this side does not know is kept as it came
    env = Envelope("error", body=Error("from_a_newer_peer", "?"), sender="dev", msg_id="m2")
    assert decode_envelope(encode_envelope(env)).body.code == "from_a_newer_peer"


def test_every_code_the_protocol_page_names_is_in_the_enum() -> None:
    text = DOCS.read_text()
    section = text[text.index("## 7. Error codes"):]
    section = section[:section.index("On a `ProtocolError` the receiver")]
    named = set(re.findall(r"`([a-z][a-z_]+)`", section)) - {"error", "model", "plan", "profile_update",
                                                               "round", "reply_to", "code", "id", "capabilities",
                                                               "link", "update", "str", "reassembly_timeout_s"}
    assert named and named <= {c.value for c in ErrorCode}, named - {c.value for c in ErrorCode}
