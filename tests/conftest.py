"""Shared pytest fixtures: private MQTT brokers on free loopback ports; the ``requires`` marker
(tests/support/requirements.py: a missing part skips a test, or fails it under CI=true)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from tests.support.requirements import require

__all__ = ["amqtt_broker", "broker", "mosquitto_broker", "topic_prefix"]


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """A started broker for the module: mosquitto when installed, else amqtt."""
    with EmbeddedBroker(BrokerConfig()) as b:
        yield b


@pytest.fixture(scope="module")
def amqtt_broker() -> Iterator[EmbeddedBroker]:
    """A started pure-Python amqtt broker (MQTT 3.1.1 only, no size limit)."""
    with EmbeddedBroker(BrokerConfig(prefer="amqtt")) as b:
        yield b


@pytest.fixture(scope="module")
def mosquitto_broker() -> Iterator[EmbeddedBroker]:
    """A started mosquitto broker; without mosquitto the test skips (fails under CI=true)."""
    require("mosquitto")
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as b:
        yield b


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@needs(...)`` / ``pytestmark = needs(...)``: checked before the test's fixtures start."""
    for mark in item.iter_markers("requires"):
        require(*mark.args)


@pytest.fixture
def topic_prefix() -> str:
    """A unique topic prefix so tests sharing a broker never see each other's messages."""
    return f"test/{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread per process: OpenMP threads spin-wait, so on a busy 2-core
    machine several training processes/threads with 2 threads each slow down tenfold."""
    import os

    try:
        import torch
    except ImportError:  # the tests that need no torch, run under Python 3.10 by .ci/run
        yield
        return

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the subprocesses tests start
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _collect_what_a_job_froze() -> Iterator[None]:
    """A simulation run the way ``edgefl simulate`` runs it leaves its objects frozen (its process
    exits after it); in this long-lived process each test gives them back to the collector."""
    yield
    import gc

    gc.unfreeze()


@pytest.fixture(autouse=True)
def _seeded_torch() -> None:
    """Every test starts from torch's global seed 0: a test that builds a model without seeding
    torch itself gets the same weights whatever ran before it (its outcome no longer depends on
    the order of the tests)."""
    try:
        import torch
    except ImportError:  # the tests that need no torch
        return
    torch.manual_seed(0)
