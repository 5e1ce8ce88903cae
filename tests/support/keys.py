"""A public key's PEM file, as an operator would write it for a device's ``trusted_keys``."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["public_key_pem"]


def public_key_pem(public_key: bytes) -> bytes:
    """A raw 32-byte public key as a SubjectPublicKeyInfo PEM file's contents."""
    return Ed25519PublicKey.from_public_bytes(public_key).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
