"""A device's fixed tensors (`Plan.fixed`): kept from the plan that carries them, filled into the
plans that leave them out, sent back as their digests when unchanged; bounded."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.device.fixed_cache import FixedCache, MissingFixed
from edge_sdk.protocol.fixed_tensors import tensor_digest
from edge_sdk.protocol.messages import Plan, Update

BIASES = np.linspace(-1, 1, 12, dtype=np.float32)
HEAD = np.ones((2, 12), np.float32)
DIGEST = tensor_digest(BIASES)


def plan(**tensors: np.ndarray) -> Plan:
    return Plan("fedavg", "global", {"layers": []}, tensors, {}, None, {"biases": DIGEST})


def test_the_digest_names_the_dtype_the_shape_and_the_bytes() -> None:
    assert tensor_digest(BIASES.copy()) == DIGEST and len(DIGEST) == 64
    assert tensor_digest(BIASES.astype(np.float64)) != DIGEST
    assert tensor_digest(BIASES.reshape(3, 4)) != DIGEST
    assert tensor_digest(BIASES + np.float32(1e-6)) != DIGEST


def test_a_plan_that_left_them_out_is_filled_and_the_update_sends_digests() -> None:
    cache = FixedCache()
    with pytest.raises(MissingFixed, match="does not hold: biases"):
        cache.resolve(plan(head=HEAD))  # a device that never received them (or restarted)
    whole = plan(head=HEAD, biases=BIASES)
    cache.remember(whole)
    assert DIGEST in cache and cache.resolve(whole) is whole
    filled = cache.resolve(plan(head=HEAD))
    np.testing.assert_array_equal(filled.tensors["biases"], BIASES)
    trained = Update("global", {"head": HEAD * 2, "biases": filled.tensors["biases"].copy()}, 5, {})
    sent = cache.strip(filled, trained)
    assert set(sent.tensors) == {"head"} and sent.fixed == {"biases": DIGEST}
    moved = Update("global", {"head": HEAD, "biases": BIASES + 1}, 5, {})  # changed: it travels
    assert cache.strip(filled, moved) is moved
    cache.clear()
    assert DIGEST not in cache and cache.strip(filled, trained) is trained  # not held: not claimed


def test_the_cache_is_bounded_and_keeps_what_was_used_last() -> None:
    cache = FixedCache(max_entries=2, max_bytes=10 * BIASES.nbytes)
    tensors = [BIASES + i for i in range(3)]
    digests = [tensor_digest(t) for t in tensors]
    for t, d in zip(tensors[:2], digests[:2], strict=True):
        cache.remember(Plan("m", "l", {}, {"b": t}, {}, None, {"b": d}))
    cache.resolve(Plan("m", "l", {}, {}, {}, None, {"b": digests[0]}))  # the first, used again
    cache.remember(Plan("m", "l", {}, {"b": tensors[2]}, {}, None, {"b": digests[2]}))
    assert len(cache) == 2 and digests[0] in cache and digests[1] not in cache and digests[2] in cache
    small = FixedCache(max_bytes=BIASES.nbytes - 1)
    small.remember(plan(head=HEAD, biases=BIASES))  # larger than the whole cache: not kept
    assert len(small) == 0
    kept = FixedCache()
    source = BIASES.copy()
    kept.remember(Plan("m", "l", {}, {"biases": source}, {}, None, {"biases": DIGEST}))
    source[:] = 0  # the plan's array changes after: the kept copy does not
    np.testing.assert_array_equal(kept.resolve(plan()).tensors["biases"], BIASES)
