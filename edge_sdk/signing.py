"""Published models signed by the coordinator (Ed25519) and verified on the device.

The coordinator signs a *manifest* of each `Model` it sends: every field of the message except
the ONNX bytes themselves (those are covered by their SHA-256), plus the job and the device it
is for, so a model signed for one device or job cannot be replayed to another. The manifest is
a msgpack map with its keys in sorted order (see docs/protocol.md, "Model signatures")::

    {"device", "format", "input_shape", "issued_ms", "job", "key_id", "label", "purpose",
     "round", "sha256"}

Keys are PEM files: the coordinator's private key in PKCS8 (``openssl genpkey -algorithm
ed25519``), a device's trusted public keys as SubjectPublicKeyInfo (``openssl pkey -pubout``).
A key id is the hex of the first 8 bytes of SHA-256 of the raw 32-byte public key.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import msgpack
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edge_sdk.protocol.messages import Model

__all__ = ["PURPOSE", "SIGNATURE_BYTES", "PUBLIC_KEY_BYTES", "SignatureRejected", "ModelSigner", "key_id",
           "manifest_bytes", "verify_model", "load_public_key"]

#: Names what the signed bytes are, so a signature over a manifest means nothing anywhere else.
PURPOSE = "edgefl model v1"
SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
#: Largest key file read (a PEM key is ~120 bytes; anything near this is not one).
MAX_KEY_FILE_BYTES = 64 * 1024


class SignatureRejected(ValueError):
    """A published model whose origin, recipient or freshness does not check out."""


def key_id(public_key: bytes) -> str:
    """The id of a raw 32-byte Ed25519 public key: hex of the first 8 bytes of its SHA-256."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return hashlib.sha256(public_key).digest()[:8].hex()


def manifest_bytes(model: Model, job: str, device: str) -> bytes:
    """The canonical bytes a signature of ``model`` for ``device`` of ``job`` covers."""
    manifest = {"device": device, "format": model.format, "input_shape": [int(n) for n in model.input_shape],
                "issued_ms": int(model.issued_ms), "job": job, "key_id": model.key_id, "label": model.label,
                "purpose": PURPOSE, "round": int(model.round), "sha256": bytes(model.sha256)}
    if model.version:  # the version predictions name is signed too (absent when 0: older manifests unchanged)
        manifest["version"] = int(model.version)
    return msgpack.packb({k: manifest[k] for k in sorted(manifest)}, use_bin_type=True)


@dataclass(frozen=True)
class ModelSigner:
    """The coordinator's signing key."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> ModelSigner:
        """A fresh key (e.g. an ephemeral one for `edgefl simulate`)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem_file(cls, path: str | Path) -> ModelSigner:
        """Load an unencrypted PKCS8 PEM Ed25519 private key; any problem is one ValueError line."""
        make = f"`openssl genpkey -algorithm ed25519 -out {path}`"
        data = _read_key_file(path, "signing key", f"; make it with deploy/homeserver/add-device.sh --coordinator "
                              f"or {make}, and give devices its public key (docs/deploy.md, \"Signed models\")")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:
            raise ValueError(f"signing key {path} is encrypted; the coordinator needs it unencrypted "
                             f"(readable by its service user only)") from None
        except (ValueError, UnsupportedAlgorithm):
            raise ValueError(f"signing key {path} is not a PEM private key; make one with {make}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"signing key {path} is not an Ed25519 key; make one with {make}")
        return cls(key)

    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS8 PEM."""
        return self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte public key devices trust."""
        return self.private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def sign(self, model: Model, job: str, device: str, issued_ms: int | None = None) -> Model:
        """``model`` with ``issued_ms`` (default: now), this key's id and a signature for ``device``."""
        return self.sign_each(model, job, [device], issued_ms)[device]

    def sign_each(self, model: Model, job: str, devices: Sequence[str], issued_ms: int | None = None
                  ) -> dict[str, Model]:
        """`sign` for each of ``devices``, the model's bytes checked against their sha256 once (a
        0.5 MB model published to 100 simulated devices hashed 50 MB before)."""
        if hashlib.sha256(bytes(model.data)).digest() != bytes(model.sha256):
            raise ValueError("model bytes do not match their sha256: refusing to sign")
        issued = time.time_ns() // 1_000_000 if issued_ms is None else issued_ms
        unsigned = replace(model, issued_ms=issued, key_id=self.key_id, signature=b"")
        return {device: replace(unsigned, signature=self.private_key.sign(manifest_bytes(unsigned, job, device)))
                for device in devices}


def verify_model(model: Model, trusted: Sequence[bytes], job: str, device: str, not_before_ms: int = 0) -> None:
    """Raise `SignatureRejected` unless ``model`` is intact, signed by one of the ``trusted`` raw
    public keys for ``device`` of ``job``, and issued no earlier than ``not_before_ms``."""
    if hashlib.sha256(bytes(model.data)).digest() != bytes(model.sha256):
        raise SignatureRejected("model bytes do not match their sha256")
    if not model.signature:
        raise SignatureRejected("unsigned model (this device trusts only models signed by the coordinator's key)")
    if len(model.signature) != SIGNATURE_BYTES:
        raise SignatureRejected(f"malformed signature: {len(model.signature)} bytes, not {SIGNATURE_BYTES}")
    keys = {key_id(k): k for k in trusted}
    public = keys.get(model.key_id)
    if public is None:
        raise SignatureRejected(f"signed by key {model.key_id[:64]!r}, which this device does not trust "
                                f"(trusted: {', '.join(sorted(keys)) or 'none'})")
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(bytes(model.signature), manifest_bytes(model, job, device))
    except InvalidSignature:
        raise SignatureRejected(f"bad signature by key {model.key_id}: the model was altered, or signed for "
                                f"another device or job than {device!r} of job {job!r}") from None
    if model.issued_ms < not_before_ms:
        raise SignatureRejected(f"issued at {model.issued_ms} ms, before the installed model ({not_before_ms} ms): "
                                f"an old model replayed")


def load_public_key(path: str | Path) -> bytes:
    """The raw 32-byte Ed25519 public key of a PEM file; any problem is one ValueError line."""
    data = _read_key_file(path, "trusted key", " (the coordinator's model-signing.pub, from the device's bundle)")
    if b"PRIVATE KEY" in data:
        raise ValueError(f"trusted key {path} holds a private key: give devices only the public key "
                         f"(model-signing.pub; `openssl pkey -in KEY -pubout`)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ValueError(f"trusted key {path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"trusted key {path} is not an Ed25519 public key (the coordinator's model-signing.pub is)")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _read_key_file(path: str | Path, what: str, if_missing: str) -> bytes:
    """The bytes of a key file; ``if_missing`` is added to the error when it does not exist."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist{if_missing}") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path} is a directory, not a key file") from None
    except PermissionError:
        raise ValueError(f"{what} {path} is not readable by this user") from None
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"{what} {path} is larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    return data
