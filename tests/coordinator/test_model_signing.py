"""Published models signed by the coordinator (Ed25519) and verified on the device: the manifest,
sign/verify, key files, the device's refusals over a real broker, a real publish, the configs
and the home server's add-device.sh (edge_sdk/signing.py; docs/protocol.md, "Model signatures")."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.core.device_record import DeviceRecord
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.publish import attach_signer, publish_models
from coordinator.runtime.coordinator_command import coordinator_config_from_toml
from coordinator.strategies.fedavg import FedAvg
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.config import read_toml
from edge_sdk.data.datasets import load_dataset
from edge_sdk.device_config import trusted_keys
from edge_sdk.networking.link import MessageLink
from edge_sdk.methods import LocalData
from edge_sdk.model_store import read_model_info
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.codec import Blob, encode_frame
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import (
    MAX_SIGNATURE_LEN, Ack, Envelope, Error, Model, Register, decode_envelope, encode_envelope,
)
from edge_sdk.protocol.topics import Topics
from edge_sdk.signing import (
    SIGNATURE_BYTES, ModelSigner, SignatureRejected, key_id, load_public_key, manifest_bytes, verify_model,
)
from tests.support.keys import public_key_pem
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.requirements import needs
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
HOME = ROOT / "deploy" / "homeserver"
JOB, DEVICE = "home", "pi-kitchen"
#: RFC 8032 Ed25519 is deterministic: this key signs the model below to the same bytes everywhere
FIXED = ModelSigner(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
A, B = ModelSigner.generate(), ModelSigner.generate()


def _model(data: bytes = b"onnx", rnd: int = 4) -> Model:
    return Model("0.5", rnd, hashlib.sha256(data).digest(), data, (1, 28, 28))


# --------------------------------------------------------------------------- manifest, sign, verify


def test_the_manifest_and_signature_are_pinned_bytes() -> None:
    signed = FIXED.sign(_model(), JOB, DEVICE, issued_ms=1_700_000_000_000)
    assert FIXED.key_id == "56475aa75463474c" == signed.key_id
    assert manifest_bytes(signed, JOB, DEVICE).hex() == (
        "8a"                                                       # map of 10, keys sorted
        "a6646576696365" "aa70692d6b69746368656e"                  # device: "pi-kitchen"
        "a6666f726d6174" "a46f6e6e78"                              # format: "onnx"
        "ab696e7075745f7368617065" "93011c1c"                      # input_shape: [1, 28, 28]
        "a96973737565645f6d73" "cf0000018bcfe56800"                # issued_ms: uint64 1.7e12
        "a36a6f62" "a4686f6d65"                                    # job: "home"
        "a66b65795f6964" "b035363437356161373534363334373463"      # key_id
        "a56c6162656c" "a3302e35"                                  # label: "0.5"
        "a7707572706f7365" "af65646765666c206d6f64656c207631"      # purpose: "edgefl model v1"
        "a5726f756e64" "04"                                        # round: 4
        "a6736861323536" "c420" + hashlib.sha256(b"onnx").hexdigest())  # sha256: bin 32
    assert signed.signature.hex() == (
        "ae309444921ddac813de5eb572a7226731fa5819dfaefd949176eed2dfdf4a34"
        "42248cd7f86baff459cc0ba487acb01ca6eb460764c9a019109972e6f59cbd07")
    verify_model(signed, [FIXED.public_key], JOB, DEVICE)


def test_the_manifest_covers_every_field_of_the_message_but_the_bytes_and_the_signature() -> None:
    """A field added to `Model` must be added to the manifest (or here, on purpose)."""
    import msgpack

    manifest = msgpack.unpackb(manifest_bytes(dataclasses.replace(_model(), version=7), JOB, DEVICE))
    fields = {f.name for f in dataclasses.fields(Model)} - {"data", "signature"}
    assert set(manifest) == fields | {"job", "device", "purpose"}
    assert manifest["version"] == 7


def test_a_model_whose_version_was_changed_in_transit_is_refused() -> None:
    signed = A.sign(dataclasses.replace(_model(), version=3), JOB, DEVICE, issued_ms=5_000)
    verify_model(signed, [A.public_key], JOB, DEVICE)
    for version in (0, 4):
        _refused(dataclasses.replace(signed, version=version), "bad signature by key")


def _refused(model: Model, match: str, trusted: tuple[bytes, ...] = (A.public_key,), job: str = JOB,
             device: str = DEVICE, not_before_ms: int = 0) -> None:
    with pytest.raises(SignatureRejected, match=match) as caught:
        verify_model(model, trusted, job, device, not_before_ms)
    assert "\n" not in str(caught.value)


def test_every_tampered_field_recipient_and_job_is_refused() -> None:
    good = A.sign(_model(), JOB, DEVICE, issued_ms=5_000)
    verify_model(good, [A.public_key], JOB, DEVICE)
    bad_sig = "bad signature by key"
    for changed in (dict(label="1.0"), dict(round=5), dict(round=-1), dict(input_shape=(1, 28, 29)),
                    dict(input_shape=(28, 28)), dict(format="onnx2"), dict(issued_ms=5_001),
                    dict(data=b"evil", sha256=hashlib.sha256(b"evil").digest())):
        _refused(dataclasses.replace(good, **changed), bad_sig)
    _refused(dataclasses.replace(good, data=b"evil"), "do not match their sha256")
    _refused(good, bad_sig, device="pi-den")
    _refused(good, bad_sig, job="garage")
    # another trusted key's id on A's signature: checked against that key, which did not sign it
    _refused(dataclasses.replace(good, key_id=B.key_id), bad_sig, trusted=(A.public_key, B.public_key))


def test_a_wrong_or_unknown_key_is_refused() -> None:
    by_b = B.sign(_model(), JOB, DEVICE)
    _refused(by_b, f"signed by key '{B.key_id}', which this device does not trust \\(trusted: {A.key_id}\\)")
    _refused(dataclasses.replace(by_b, key_id=A.key_id), "bad signature")  # B's signature passed off as A's
    _refused(dataclasses.replace(by_b, key_id="nonsense"), "does not trust")
    _refused(A.sign(_model(), JOB, DEVICE), r"trusted: none", trusted=())
    verify_model(by_b, [A.public_key, B.public_key], JOB, DEVICE)  # rotation: either key will do


def test_an_older_model_than_the_installed_one_is_refused() -> None:
    model = A.sign(_model(), JOB, DEVICE, issued_ms=1_000)
    verify_model(model, [A.public_key], JOB, DEVICE, not_before_ms=1_000)  # the same age: the same model again
    _refused(model, "issued at 1000 ms, before the installed model \\(1001 ms\\)", not_before_ms=1_001)


def test_malformed_signatures_of_every_length_and_every_flipped_bit_are_refused() -> None:
    good = A.sign(_model(), JOB, DEVICE)
    _refused(dataclasses.replace(good, signature=b""), "unsigned model")
    for n in [*range(1, 3 * SIGNATURE_BYTES), MAX_SIGNATURE_LEN]:
        if n == SIGNATURE_BYTES:
            continue
        for sig in (bytes(n), good.signature[:n].ljust(n, b"\x01")):
            _refused(dataclasses.replace(good, signature=sig), f"malformed signature: {n} bytes, not 64")
    for sig in (bytes(64), b"\xff" * 64):
        _refused(dataclasses.replace(good, signature=sig), "bad signature")
    for bit in range(8 * SIGNATURE_BYTES):
        flipped = bytearray(good.signature)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SignatureRejected):
            verify_model(dataclasses.replace(good, signature=bytes(flipped)), [A.public_key], JOB, DEVICE)


def test_the_coordinator_never_signs_bytes_that_do_not_match_their_hash() -> None:
    with pytest.raises(ValueError, match="refusing to sign"):
        A.sign(dataclasses.replace(_model(), data=b"other"), JOB, DEVICE)
    with pytest.raises(ValueError, match="32 bytes"):
        key_id(b"short")
    with pytest.raises(ValueError, match="32 bytes"):  # a device is told at once, not at its first model
        DeviceClient(ClientConfig(device_id="pi", trusted_keys=(A.public_key, b"pem text?")),
                     None, load_profile("raspberry-pi-4b"))  # type: ignore[arg-type]


def test_signing_for_many_devices_gives_each_its_own_signature_and_checks_the_bytes_once(monkeypatch) -> None:
    model = _model(b"x" * 1000)
    hashed: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr("edge_sdk.signing.hashlib.sha256", lambda data=b"": hashed.append(len(data)) or real(data))
    signed = A.sign_each(model, JOB, ["pi-1", "pi-2", "pi-3"], issued_ms=5)
    assert hashed.count(1000) == 1  # the model's bytes, once for three devices
    for device, one in signed.items():
        verify_model(one, [A.public_key], JOB, device)
        assert one == A.sign(model, JOB, device, issued_ms=5)  # Ed25519 is deterministic: what sign gives
        with pytest.raises(SignatureRejected):
            verify_model(one, [A.public_key], JOB, "pi-9")
    with pytest.raises(ValueError, match="refusing to sign"):
        A.sign_each(dataclasses.replace(model, data=b"other"), JOB, ["pi-1"])


# --------------------------------------------------------------------------- the wire


def test_a_signed_model_crosses_the_wire_and_an_old_unsigned_one_still_decodes() -> None:
    signed = A.sign(_model(), JOB, DEVICE)
    back = decode_envelope(encode_envelope(Envelope.of(signed, "coordinator", round=4))).body
    assert (back.signature, back.key_id, back.issued_ms) == (signed.signature, A.key_id, signed.issued_ms)
    verify_model(back, [A.public_key], JOB, DEVICE)

    def frame(**extra: object) -> bytes:  # a model body as an older coordinator (or an attacker) writes it
        body = {"label": "0.5", "round": 4, "format": "onnx", "sha256": hashlib.sha256(b"onnx").digest(),
                "input_shape": [1, 28, 28], "data": Blob(b"onnx"), **extra}
        return encode_frame({"v": 1, "kind": "model", "id": "x", "reply_to": None, "round": 4,
                             "sender": "coordinator", "body": body})

    old = decode_envelope(frame()).body
    assert (old.signature, old.key_id, old.issued_ms) == (b"", "", 0) and old.data == b"onnx"
    assert decode_envelope(frame(signature=bytes(MAX_SIGNATURE_LEN))).body.signature == bytes(MAX_SIGNATURE_LEN)
    for extra, why in ((dict(signature=bytes(MAX_SIGNATURE_LEN + 1)), "signature must be at most 1024"),
                       (dict(signature="abc"), "signature must be"), (dict(issued_ms=-1), "issued_ms"),
                       (dict(issued_ms=1.5), "issued_ms"), (dict(key_id="k" * 65), "key_id"),
                       (dict(key_id=7), "key_id")):
        with pytest.raises(ProtocolError, match=why) as caught:
            decode_envelope(frame(**extra))
        assert caught.value.code == "malformed"


# --------------------------------------------------------------------------- key files


def _pem_private(key: object) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[attr-defined]
                             serialization.NoEncryption())


def test_key_files_load_and_every_bad_one_is_one_clear_line(tmp_path) -> None:
    key, pub = tmp_path / "model-signing.key", tmp_path / "model-signing.pub"
    key.write_bytes(A.private_pem())
    pub.write_bytes(public_key_pem(A.public_key))
    assert ModelSigner.from_pem_file(key).key_id == A.key_id and load_public_key(pub) == A.public_key
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.key").write_bytes(_pem_private(ec_key))
    (tmp_path / "ec.pub").write_bytes(ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "locked.key").write_bytes(A.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    (tmp_path / "garbage").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n")
    (tmp_path / "huge").write_bytes(bytes(100_000))
    (tmp_path / "junk.pub").write_text("ssh-ed25519 AAAA... not PEM\n")
    cases: list[tuple[Callable[[Path], object], Path, str]] = [
        (ModelSigner.from_pem_file, tmp_path / "missing.key",
         "does not exist; make it with deploy/homeserver/add-device.sh --coordinator or `openssl genpkey"),
        (ModelSigner.from_pem_file, tmp_path / "garbage" / "key", "cannot be read: Not a directory"),
        (ModelSigner.from_pem_file, tmp_path, "is a directory, not a key file"),
        (ModelSigner.from_pem_file, tmp_path / "ec.key", "is not an Ed25519 key; make one with"),
        (ModelSigner.from_pem_file, tmp_path / "locked.key", "is encrypted"),
        (ModelSigner.from_pem_file, tmp_path / "garbage", "is not a PEM private key"),
        (ModelSigner.from_pem_file, pub, "is not a PEM private key"),
        (ModelSigner.from_pem_file, tmp_path / "huge", "larger than 65536 bytes"),
        (load_public_key, tmp_path / "missing.pub", "does not exist \\(the coordinator's model-signing.pub"),
        (load_public_key, key, "holds a private key: give devices only the public key"),
        (load_public_key, tmp_path / "ec.pub", "is not an Ed25519 public key"),
        (load_public_key, tmp_path / "huge", "larger than 65536 bytes"),
        (load_public_key, tmp_path / "junk.pub", "is not a PEM public key"),
    ]
    for load, path, why in cases:
        with pytest.raises(ValueError, match=why) as caught:
            load(path)
        assert str(path) in str(caught.value) and "\n" not in str(caught.value), caught.value
    if os.geteuid() != 0:  # root reads any file
        key.chmod(0)
        with pytest.raises(ValueError, match="is not readable by this user"):
            ModelSigner.from_pem_file(key)


@needs("openssl")
def test_keys_made_by_openssl_as_add_device_makes_them_load(tmp_path) -> None:
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True)
    signer = ModelSigner.from_pem_file(key)
    assert load_public_key(pub) == signer.public_key
    verify_model(signer.sign(_model(), JOB, DEVICE), [load_public_key(pub)], JOB, DEVICE)


# --------------------------------------------------------------------------- configs


def test_the_client_toml_names_its_trusted_keys(tmp_path) -> None:
    for signer, name in ((A, "a.pub"), (B, "b.pub")):
        (tmp_path / name).write_bytes(public_key_pem(signer.public_key))
    assert trusted_keys({}) == ()
    both = {"security": {"trusted_keys": [str(tmp_path / "a.pub"), str(tmp_path / "b.pub")]}}
    assert trusted_keys(both) == (A.public_key, B.public_key)
    for bad, why in (({"trusted_keys": str(tmp_path / "a.pub")}, "must be a list of PEM file paths"),
                     ({"trusted_keys": [""]}, "must be a list"),
                     ({"trusted_keys": [str(tmp_path / "nope.pub")]}, "does not exist"),
                     ({"trusted_key": []}, "unknown keys \\['trusted_key'\\]")):
        with pytest.raises(ValueError, match=why):
            trusted_keys({"security": bad})
    # the example config parses, with the line add-device.sh un-comments
    example = (ROOT / "deploy" / "raspberrypi" / "client.toml").read_text()
    assert example.count('\n# trusted_keys = ["/etc/edgefl/model-signing.pub"]\n') == 1
    assert read_toml(ROOT / "deploy" / "raspberrypi" / "client.toml")["security"] == {}


def test_the_coordinator_toml_names_its_signing_key(tmp_path) -> None:
    example = read_toml(ROOT / "deploy" / "coordinator.toml")
    assert example["security"] == {"signing_key": "/etc/edgefl/model-signing.key"}
    path = tmp_path / "coordinator.toml"
    path.write_text('dataset = "digits"\n[security]\nsigning_key = "/etc/edgefl/model-signing.key"\n')
    assert coordinator_config_from_toml(path).signing_key == "/etc/edgefl/model-signing.key"
    path.write_text('dataset = "digits"\n[security]\nsigning_key = ""\n')
    with pytest.raises(ValueError, match="signing_key must be the path"):
        coordinator_config_from_toml(path)
    path.write_text('dataset = "digits"\n[security]\nsigning_keys = "x"\n')
    with pytest.raises(ValueError, match="unknown keys"):
        coordinator_config_from_toml(path)
    path.write_text('dataset = "digits"\n')
    assert coordinator_config_from_toml(path).signing_key is None


@pytest.mark.slow
@pytest.mark.parametrize("key, why", [
    ("missing.key", "does not exist; make it with deploy/homeserver/add-device.sh --coordinator"),
    ("coordinator.toml/key", "cannot be read: Not a directory"),
    ("model.pub", "is not a PEM private key"),
])
def test_a_bad_signing_key_stops_the_coordinator_in_one_line_before_it_connects(tmp_path, key, why) -> None:
    (tmp_path / "model.pub").write_bytes(public_key_pem(A.public_key))
    config = tmp_path / "coordinator.toml"
    # port 1: nothing listens there, so a key checked only after connecting would be a connection error
    config.write_text(f'job = "x"\ndataset = "digits"\n[broker]\nurl = "mqtt://127.0.0.1:1"\n[security]\n'
                      f'signing_key = "{tmp_path / key}"\n')
    proc = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "coordinator", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"edgefl coordinator: error: signing key {tmp_path / key} ") and why in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr + proc.stdout


# --------------------------------------------------------------------------- a device over a real broker


@contextlib.contextmanager
def _device(broker, job: str, device: str, state_dir: Path, keys: tuple[bytes, ...]
            ) -> Iterator[Callable[[Model], Ack | Error]]:
    """A running device; yields ``send(model) -> its reply`` (sent as the coordinator would)."""
    topics = Topics(job=job)
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-{device}-coordinator"))
    coordinator.connect()
    coordinator.subscribe(topics.uplink(device))
    data = load_dataset("digits")
    client = DeviceClient(ClientConfig(device_id=device, job=job, state_dir=str(state_dir), register_retry_s=30.0,
                                       transport=TransportConfig(url=broker.url, client_id=f"{job}-{device}"),
                                       trusted_keys=keys),
                          LocalData(data.x_train[:20], data.y_train[:20], data.num_classes),
                          load_profile("raspberry-pi-4b"))
    thread = threading.Thread(target=client.run, kwargs={"timeout_s": 60}, daemon=True)
    thread.start()
    link = MessageLink(coordinator)

    def send(model: Model) -> Ack | Error:
        env = Envelope.of(model, "coordinator", round=max(model.round, -1))
        link.send(topics.downlink(device), env)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            incoming = coordinator.receive(1.0)
            if incoming is not None:
                reply = decode_envelope(incoming.payload)
                if reply.reply_to == env.msg_id:
                    return reply.body
        raise AssertionError("the device did not answer the model")

    try:
        end = time.monotonic() + 10  # the device's registration: it is listening now
        while not any(isinstance(decode_envelope(m.payload).body, Register)
                      for m in [coordinator.receive(1.0)] if m is not None):
            assert time.monotonic() < end, "the device did not register"
        yield send
    finally:
        client.stop()
        thread.join(timeout=10)
        coordinator.close()


def _installed(state: Path) -> tuple[bytes, dict | None]:
    path = state / "model.onnx"
    return (path.read_bytes() if path.exists() else b""), read_model_info(state)


@pytest.mark.slow
def test_a_device_with_a_key_installs_only_models_signed_for_it(broker, tmp_path, caplog) -> None:
    job, device, state = "signed-device", "pi-signed", tmp_path / "state"
    caplog.set_level(logging.INFO, logger="edge_sdk.client")
    with _device(broker, job, device, state, (A.public_key,)) as send:
        refusals = [
            (_model(b"unsigned"), "unsigned model"),
            (B.sign(_model(b"by b"), job, device), "which this device does not trust"),
            (dataclasses.replace(B.sign(_model(b"forged"), job, device), key_id=A.key_id), "bad signature"),
            (A.sign(_model(b"for pi-den"), job, "pi-den"), "bad signature"),
            (A.sign(_model(b"for another job"), "garage", device), "bad signature"),
            (dataclasses.replace(A.sign(_model(b"short"), job, device), signature=bytes(63)),
             "malformed signature: 63 bytes"),
        ]
        for model, why in refusals:
            reply = send(model)
            assert isinstance(reply, Error) and reply.code == "bad_model" and why in reply.message, reply
            assert _installed(state) == (b"", None)  # nothing written
        good = A.sign(_model(b"good", rnd=5), job, device, issued_ms=2_000)
        assert send(good) == Ack("model for round 6 installed")
        data, info = _installed(state)
        assert data == b"good" and info["issued_ms"] == 2_000 and info["key_id"] == A.key_id
        older = A.sign(_model(b"older", rnd=6), job, device, issued_ms=1_999)
        reply = send(older)
        assert isinstance(reply, Error) and "before the installed model (2000 ms)" in reply.message
        assert send(good) == Ack("model for round 6 already installed")  # the retained copy on a reconnect
        newer = A.sign(_model(b"newer", rnd=7), job, device, issued_ms=3_000)
        assert send(newer) == Ack("model for round 8 installed") and _installed(state)[0] == b"newer"
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == len(refusals) + 1 and all("\n" not in m for m in refused)
    assert not [r for r in caplog.records if "without checking who signed" in r.getMessage()]


def test_a_device_without_a_key_installs_unsigned_models_and_warns_once(broker, tmp_path, caplog) -> None:
    job, device, state = "legacy-device", "pi-legacy", tmp_path / "state"
    caplog.set_level(logging.INFO, logger="edge_sdk.client")
    with _device(broker, job, device, state, ()) as send:
        assert send(_model(b"first", rnd=1)) == Ack("model for round 2 installed")
        assert send(B.sign(_model(b"second", rnd=2), job, device)) == Ack("model for round 3 installed")
        assert send(_model(b"first", rnd=1)) == Ack("model for round 2 installed")  # no age check either
    assert _installed(state)[0] == b"first"
    warnings = [r.getMessage() for r in caplog.records if "without checking who signed" in r.getMessage()]
    assert len(warnings) == 1 and "[security] trusted_keys" in warnings[0], warnings


@pytest.mark.slow
def test_a_real_publish_signs_each_model_for_its_device(broker, tmp_path) -> None:
    """The coordinator's publish over a real broker, retained for two offline devices: each installs
    its own when it connects; one's model replayed to the other is refused."""
    job = "signed-publish"
    data = load_dataset("digits")
    strategy = FedAvg.create(StrategyContext(FederationConfig(rounds=1), "mlp", data.input_shape, data.num_classes))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-coordinator"))
    transport.connect()
    try:
        fleet = Fleet(MessageLink(transport), Topics(job=job))
        attach_signer(fleet, A)
        for device in ("dev-a", "dev-b"):
            fleet.devices[device] = DeviceRecord(device, load_profile("raspberry-pi-4b"), 20, online=False)
            fleet.devices[device].label = strategy.assign(fleet.devices[device])
        published, = publish_models(strategy.inference_model, fleet, 0, wait_s=1.0, inputs=data.x_test)
        transport.wait_published(10.0)
    finally:
        transport.close()
    assert published.left_for == ("dev-a", "dev-b")

    sniffer = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-sniffer"))
    sniffer.subscribe(f"edgefl/{job}/down/+")
    sniffer.connect()
    retained: dict[str, Model] = {}
    try:
        while len(retained) < 2 and (incoming := sniffer.receive(5.0)) is not None:
            retained[incoming.topic.rsplit("/", 1)[1]] = decode_envelope(incoming.payload).body
    finally:
        sniffer.close()
    a, b = retained["dev-a"], retained["dev-b"]
    assert a.sha256 == b.sha256 and a.issued_ms == b.issued_ms and a.key_id == b.key_id == A.key_id
    assert a.signature != b.signature  # the recipient is in what is signed

    states = {d: tmp_path / d for d in ("dev-a", "dev-b", "dev-c")}
    with _device(broker, job, "dev-b", states["dev-b"], (A.public_key,)):
        end = time.monotonic() + 10  # the retained model arrives right after the device subscribes
        while read_model_info(states["dev-b"]) is None and time.monotonic() < end:
            time.sleep(0.1)
    assert read_model_info(states["dev-b"])["key_id"] == A.key_id
    assert hashlib.sha256((states["dev-b"] / "model.onnx").read_bytes()).digest() == b.sha256
    with _device(broker, job, "dev-c", states["dev-c"], (A.public_key,)) as send_to_c:
        reply = send_to_c(a)  # dev-a's signed model, replayed on the downlink of a device of the same job
        assert isinstance(reply, Error) and "signed for another device or job than 'dev-c'" in reply.message
    with _device(broker, job, "dev-a", states["dev-a"], (B.public_key,)):  # trusts another coordinator
        time.sleep(1.0)
    assert read_model_info(states["dev-a"]) is None and read_model_info(states["dev-c"]) is None


# --------------------------------------------------------------------------- the home server's scripts

needs_tools = needs("mosquitto_passwd", "openssl")


def _add_device(tmp: Path, *args: object, check: bool = True) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "EDGEFL_CA_FILE": str(tmp / "no-ca.crt"),
           "EDGEFL_SIGNING_PUB": str(tmp / "nowhere.pub")}
    proc = subprocess.run(["bash", HOME / "add-device.sh", "--passwd", tmp / "edgefl.passwd", "--no-reload",
                           *map(str, args)], capture_output=True, text=True, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@needs_tools
def test_add_device_makes_the_signing_key_once_and_bundles_its_public_key(tmp_path) -> None:
    first = _add_device(tmp_path, "--coordinator", "--out", tmp_path / "coordinator")
    key, pub = tmp_path / "coordinator" / "model-signing.key", tmp_path / "coordinator" / "model-signing.pub"
    assert f"made the model-signing key {key}" in first.stdout
    assert key.stat().st_mode & 0o777 == 0o600 and pub.stat().st_mode & 0o777 == 0o644
    signer = ModelSigner.from_pem_file(key)
    assert load_public_key(pub) == signer.public_key
    again = _add_device(tmp_path, "--out", tmp_path / "coordinator", "--coordinator")  # a new password only
    assert f"kept the model-signing key {key}" in again.stdout
    assert ModelSigner.from_pem_file(key).key_id == signer.key_id

    signed = _add_device(tmp_path, "pi-a", "--signing-pub", pub, "--out", tmp_path / "pi-a")
    bundle = tmp_path / "pi-a"
    assert load_public_key(bundle / "model-signing.pub") == signer.public_key and "public key" not in signed.stderr
    assert read_toml(bundle / "client.toml")["security"] == {"trusted_keys": ["/etc/edgefl/model-signing.pub"]}

    unsigned = _add_device(tmp_path, "pi-b", "--out", tmp_path / "pi-b")  # no key where it looks
    assert f"warning: no coordinator public key at {tmp_path / 'nowhere.pub'}" in unsigned.stderr
    assert not (tmp_path / "pi-b" / "model-signing.pub").exists()
    assert read_toml(tmp_path / "pi-b" / "client.toml")["security"] == {}

    wrong = _add_device(tmp_path, "pi-c", "--signing-pub", key, "--out", tmp_path / "pi-c", check=False)
    assert wrong.returncode == 1 and "is not a PEM public key" in wrong.stderr and wrong.stderr.count("\n") == 1


@needs_tools
def test_add_device_gives_a_second_coordinator_user_the_coordinators_acl(tmp_path) -> None:
    _add_device(tmp_path, "pi-a", "--out", tmp_path / "pi-a")
    proc = _add_device(tmp_path, "--coordinator", "coord-b", "--out", tmp_path / "coord-b")
    assert "user coord-b in" in proc.stdout and 'set username = "coord-b"' in proc.stdout
    template = (HOME / "edgefl.acl").read_text()
    block = template.split("\nuser coordinator\n", 1)[1].split("\n\n", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("topic ")]  # its comments are not copied
    assert lines[0] == "topic read edgefl/+/up/+" and len(lines) == 9  # 4 for the fleet, 5 for Home Assistant
    acl = (tmp_path / "edgefl.acl").read_text()
    assert acl == template + "\nuser pi-a\ntopic read edgefl/+/coord\n" + "\nuser coord-b\n" + "\n".join(lines) + "\n"
    _add_device(tmp_path, "--out", tmp_path / "coord-b", "--coordinator", "coord-b")  # again: a new password
    assert (tmp_path / "edgefl.acl").read_text() == acl
    users = [line.split(":")[0] for line in (tmp_path / "edgefl.passwd").read_text().splitlines()]
    assert sorted(users) == ["coord-b", "pi-a"]
    default = _add_device(tmp_path, "--coordinator", "--out", tmp_path / "coordinator")  # as before
    assert "user coordinator in" in default.stdout and (tmp_path / "edgefl.acl").read_text() == acl
    bad = _add_device(tmp_path, "--coordinator", "bad/name", check=False)
    assert bad.returncode == 1 and "invalid name 'bad/name'" in bad.stderr
    passwd = (tmp_path / "edgefl.passwd").read_text()
    for args, why in ((["coord-b", "--out", tmp_path / "x"], "'coord-b' is a coordinator user"),
                      (["--coordinator", "pi-a", "--out", tmp_path / "x"], "'pi-a' is a device")):
        clash = _add_device(tmp_path, *args, check=False)  # a name keeps its role
        assert clash.returncode == 1 and why in clash.stderr, clash.stderr
    assert (tmp_path / "edgefl.acl").read_text() == acl and (tmp_path / "edgefl.passwd").read_text() == passwd


def test_signing_state_is_plain_json(tmp_path) -> None:
    """What a device keeps about its installed model is JSON it can read back (never pickle)."""
    from edge_sdk.model_store import installed_issued_ms, save_model

    save_model(tmp_path, A.sign(_model(), JOB, DEVICE, issued_ms=42))
    assert json.loads((tmp_path / "model.json").read_text())["issued_ms"] == 42 == installed_issued_ms(tmp_path)
    (tmp_path / "model.json").write_text("{not json")
    assert installed_issued_ms(tmp_path) == 0
    assert installed_issued_ms(tmp_path / "none") == 0
