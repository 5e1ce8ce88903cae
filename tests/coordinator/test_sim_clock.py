"""A simulated fleet's clock: who is online when, and when paused work ends."""

from __future__ import annotations

import pytest

from coordinator.runtime.sim_clock import Availability, SimClock, parse_offline


def test_a_device_online_half_of_each_period() -> None:
    a = Availability(online_fraction=0.5, period_s=100.0, phase=10.0)
    assert a.online(10.0) and a.online(59.9) and not a.online(60.0) and not a.online(109.9) and a.online(110.0)
    assert a.next_online(70.0) == pytest.approx(110.0)
    assert a.next_online(20.0) == 20.0


def test_work_pauses_while_the_device_is_away() -> None:
    a = Availability(online_fraction=0.5, period_s=100.0, phase=0.0)
    assert a.finish(0.0, 30.0) == pytest.approx(30.0)
    assert a.finish(40.0, 30.0) == pytest.approx(120.0)  # 10 s, away 50 s, 20 s
    assert a.finish(70.0, 120.0) == pytest.approx(320.0)  # starts at 100: 50 + 50 + 20 online seconds
    assert Availability().finish(7.0, 3.0) == 10.0
    assert a.finish(0.0, 100.0) == pytest.approx(150.0)  # two whole windows: done at the second's end


def test_work_that_ends_at_a_windows_edge_ends_there() -> None:
    a = Availability(online_fraction=0.7, period_s=0.3, phase=0.1)  # windows whose ends float rounds
    t = 0.1
    for _ in range(1000):  # each from the last one's end: no loop may stall at an edge
        end = a.finish(t, 0.21)
        assert end - t >= 0.21 - 1e-9
        t = end


def test_the_share_of_intermittent_devices_is_fixed_by_the_seed() -> None:
    clock = SimClock(seed=3, offline_share=0.2, online_fraction=0.5, period_s=600.0)
    ids = [f"dev{i:03d}" for i in range(1000)]
    away = [d for d in ids if not clock.availability(d).always]
    assert 150 < len(away) < 250
    again = SimClock(seed=3, offline_share=0.2, online_fraction=0.5, period_s=600.0)
    assert away == [d for d in ids if not again.availability(d).always]
    assert SimClock().availability("dev000").always


@pytest.mark.parametrize("text", ["x", "1.5", "0.2:0", "0.2:0.5:-1", "0.2:0.5:600:1", "0.2:nan"])
def test_a_bad_offline_setting_is_a_one_line_error(text) -> None:
    with pytest.raises(ValueError, match="offline"):
        parse_offline(text)


def test_offline_settings_fill_their_defaults() -> None:
    assert parse_offline("0.2") == (0.2, 0.5, 3600.0)
    assert parse_offline("0.2:0.25") == (0.2, 0.25, 3600.0)
    assert parse_offline("0.3:0.5:600") == (0.3, 0.5, 600.0)
    with pytest.raises(ValueError, match="deadline"):
        SimClock(deadline_s=0)


def test_devices_go_by_their_profiles_availability_with_offline_profiles() -> None:
    phones = {f"dev{i:03d}": (0.5, 86400.0) for i in range(1, 200, 2)}
    clock = SimClock.from_text(3, "profiles", by_device=phones)
    assert all(clock.online(f"dev{i:03d}", t) for i in range(0, 200, 2) for t in (0.0, 50_000.0))  # no [availability]
    for device in phones:
        a = clock.availability(device)
        assert (a.online_fraction, a.period_s) == (0.5, 86400.0) and 0 <= a.phase < 86400.0
    at_noon = sum(clock.online(d, 43_200.0) for d in phones)
    assert 30 < at_noon < 70  # seeded phases: about half of the phones are home at any moment
    assert SimClock.from_text(4, "profiles", by_device=phones).availability("dev001").phase != \
        clock.availability("dev001").phase
