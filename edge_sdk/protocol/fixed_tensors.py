"""The digest that names a fixed tensor in a plan and an update (docs/protocol.md, ``plan`` ``fixed``).

A job's fixed tensors (a MiniRocket layer's biases: fitted once, the same in every round) need not
travel in every plan and every update: a plan names each by its digest, a device that holds it
sends it back as the digest alone, and the coordinator leaves it out of the next plans to that
device. Both sides compute the digest of the same float32 bytes the coordinator holds.
"""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np

__all__ = ["tensor_digest"]


def tensor_digest(tensor: np.ndarray) -> str:
    """SHA-256 (hex) over a tensor's dtype, shape and bytes."""
    array = np.ascontiguousarray(tensor)
    h = hashlib.sha256(msgpack.packb([array.dtype.str, list(array.shape)]))
    h.update(array.reshape(-1).view(np.uint8))
    return h.hexdigest()
