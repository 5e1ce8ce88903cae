"""Tests of edge_sdk.protocol.topics: layout, parsing and injection rejection."""

from __future__ import annotations

import pytest

from edge_sdk.protocol import Topics, is_valid_id


def test_default_layout() -> None:
    t = Topics()
    assert t.downlink("pi-01") == "edgefl/default/down/pi-01"
    assert t.uplink("pi-01") == "edgefl/default/up/pi-01"
    assert t.all_uplinks() == "edgefl/default/up/+"
    assert t.broadcast() == "edgefl/default/coord"
    assert t.status("pi-01") == "edgefl/default/status/pi-01"
    assert t.all_status() == "edgefl/default/status/+"


def test_custom_job_and_root() -> None:
    t = Topics(job="cifar.run_2", root="lab")
    assert t.uplink("a_b.c-d") == "lab/cifar.run_2/up/a_b.c-d"
    assert t.device_from_topic("lab/cifar.run_2/up/a_b.c-d") == "a_b.c-d"
    assert t.device_from_topic("lab/cifar.run_2/status/x") == "x"


def test_device_from_topic_rejects_foreign_topics() -> None:
    t = Topics(job="j")
    for topic in ("edgefl/j/down/x", "edgefl/other/up/x", "other/j/up/x", "edgefl/j/up/x/extra",
                  "edgefl/j/up/", "edgefl/j/up/+", "edgefl/j/coord", "edgefl/j/up/a b", "", None, 5):
        assert t.device_from_topic(topic) is None, topic  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "a/b", "+", "#", "dev+", "dev#", "a b", "abc\n", "x" * 129, "é", "a\x00b", None, 3])
def test_injection_rejected(bad) -> None:
    t = Topics()
    assert not is_valid_id(bad)
    for method in (t.downlink, t.uplink, t.status):
        with pytest.raises(ValueError):
            method(bad)
    with pytest.raises(ValueError):
        Topics(job=bad)
    with pytest.raises(ValueError):
        Topics(root=bad)


def test_longest_valid_id_accepted() -> None:
    assert Topics().uplink("x" * 128).endswith("/" + "x" * 128)
