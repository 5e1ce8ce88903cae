"""The simulation's job-long objects: built with the collector paused, frozen, given back at the job's end."""

import gc

import pytest

from simulation.long_lived import building_long_lived, job_lifetime


class _Node:
    pass


def _cycle() -> _Node:
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    return a


def test_building_pauses_the_collector_and_freezes_what_it_made():
    assert gc.isenabled()
    with job_lifetime():
        before = gc.get_freeze_count()
        with building_long_lived():
            assert not gc.isenabled()
            kept = [_cycle() for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + 2000  # the nodes at least
        assert not any(gc.is_finalized(n) for n in kept)
    assert gc.get_freeze_count() == 0


def test_the_job_gives_frozen_cycles_back_to_the_collector_even_on_an_error():
    with pytest.raises(RuntimeError), job_lifetime():
        with building_long_lived():
            garbage = _cycle()
        del garbage  # a cycle nobody holds: frozen, the collector cannot see it
        assert gc.get_freeze_count() > 0
        raise RuntimeError("the job failed")
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert not any(type(o) is _Node for o in gc.get_objects())


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with job_lifetime(), building_long_lived():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_job_that_ends_its_process_leaves_its_objects_frozen():
    with job_lifetime(release=False), building_long_lived():
        kept = _cycle()
    try:
        assert gc.get_freeze_count() > 0 and kept.peer.peer is kept
    finally:
        gc.unfreeze()


def test_a_job_that_ends_its_process_freezes_what_it_made_outside_building_blocks_too():
    """The coordinator's records of the devices are made as they register, not in a building
    block: the process's last collection would walk them all."""
    with job_lifetime(release=False):
        made_later = [_cycle() for _ in range(1000)]
        before = gc.get_freeze_count()
    try:
        assert gc.get_freeze_count() >= before + 2000 and made_later[0].peer.peer is made_later[0]
    finally:
        gc.unfreeze()


def test_registrations_are_frozen_every_thousand_and_at_the_last(monkeypatch):
    """The coordinator's record of the devices grows as they register: frozen every `FREEZE_EVERY`
    registrations and when the last one came; rounds' progress freezes nothing; the caller's
    callback sees every update. "Nothing frozen" is counted in calls to ``gc.freeze``: the frozen
    count itself also falls when a frozen object dies (an earlier test's thread winding down: -2
    once in CI)."""
    from coordinator.runtime.fleet import FleetProgress
    from simulation.long_lived import FREEZE_EVERY, freezing_registrations

    freezes = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), freeze())[1])
    seen = []
    progress = freezing_registrations(seen.append)
    with job_lifetime():
        records = []

        def register(done: int, total: int = 2 * FREEZE_EVERY + 500, rnd: int = -1) -> tuple[int, int]:
            """(calls to gc.freeze, objects newly frozen) while the fleet reports ``done``."""
            records.extend(_cycle() for _ in range(done - len(records)) if rnd == -1)
            calls, before = len(freezes), gc.get_freeze_count()
            progress(FleetProgress(rnd, done, total, 0, 0.0))
            return len(freezes) - calls, gc.get_freeze_count() - before

        assert register(FREEZE_EVERY - 1)[0] == 0
        calls, frozen = register(FREEZE_EVERY)
        assert calls == 1 and frozen >= 2 * FREEZE_EVERY  # the nodes of the first thousand at least
        assert register(FREEZE_EVERY + 10)[0] == 0
        calls, frozen = register(2 * FREEZE_EVERY + 500)
        assert calls == 1 and frozen >= 2 * (FREEZE_EVERY + 500)  # the last one
        assert register(3, total=10, rnd=0)[0] == 0  # a round's updates
        assert [u.done for u in seen] == [FREEZE_EVERY - 1, FREEZE_EVERY, FREEZE_EVERY + 10, 2 * FREEZE_EVERY + 500, 3]
    assert gc.get_freeze_count() == 0
    assert freezing_registrations(None)(FleetProgress(-1, 1, 1, 0, 0.0)) is None  # no callback: freezing alone
    gc.unfreeze()
