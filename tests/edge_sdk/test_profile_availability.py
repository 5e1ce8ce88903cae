"""A profile's [availability] (issue 61): when a device class is online, in profile files only —
never in a registration — and what a simulation's ``--offline profiles`` reads."""

from __future__ import annotations

import json

import pytest

from edge_sdk.availability import OnlineShare
from edge_sdk.profiling import DeviceProfile, load_profile, profile_to_toml, save_profile
from simulation.config import SimulationConfig


def test_the_shipped_phone_profile_is_online_half_the_day_and_a_pi_always() -> None:
    phone = load_profile("android-midrange")
    assert phone.availability is not None and phone.availability.online_fraction == 0.5
    assert phone.availability.period_s == 86400.0 and "half the day" in phone.availability.source
    assert load_profile("raspberry-pi-4b").availability is None


def test_a_registration_never_carries_it_and_files_keep_it(tmp_path) -> None:
    phone = load_profile("android-midrange")
    assert not [k for k in phone.to_dict() if k.startswith("availability")]  # what a device registers with
    for name in ("phone.toml", "phone.json"):
        again = load_profile(save_profile(phone, tmp_path / name))
        assert again.availability == phone.availability and again == phone
    assert "[availability]" in profile_to_toml(phone)


@pytest.mark.parametrize(("table", "message"), [
    ({"online_fraction": 0.0}, "online_fraction must be a finite number > 0"),
    ({"online_fraction": 1.5}, "at most 1"),
    ({"online_fraction": 0.5, "period_s": float("inf")}, "period_s must be a finite number > 0"),
    ({"period_s": 60.0}, "missing required field 'online_fraction'"),
    ({"online_fraction": 0.5, "weekdays": 5}, "unknown availability field"),
])
def test_a_bad_availability_is_a_one_line_error(tmp_path, table, message) -> None:
    flat = {**load_profile("raspberry-pi-4b").to_dict(), **{f"availability.{k}": v for k, v in table.items()}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(flat))
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_offline_profiles_gives_each_phone_its_day_and_the_rest_no_absence() -> None:
    config = SimulationConfig(clients=6, offline="profiles", profiles=("raspberry-pi-4b", "android-midrange"))
    clock = config.sim_clock()
    assert sorted(clock.by_device) == ["dev001", "dev003", "dev005"]
    assert all(clock.online(d, t) for d in ("dev000", "dev002", "dev004") for t in (0.0, 3e4, 6e4))
    assert isinstance(DeviceProfile.from_dict({**load_profile("android-midrange").to_dict(quality=True)})
                      .availability, OnlineShare)
