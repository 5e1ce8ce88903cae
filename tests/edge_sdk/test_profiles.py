"""The shipped profiles/*.toml files: all load, every number is sourced, values are sane."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_sdk.config import tomllib  # tomllib, or tomli on Python 3.10
from edge_sdk.profiling import available_profiles, load_profile, profile_to_toml
from profiles import PROFILE_DIR

REQUIRED = ("raspberry-pi-3b", "raspberry-pi-4b", "raspberry-pi-5", "jetson-nano",
            "jetson-orin-nano", "android-midrange", "laptop")
NUMBERS = ("gflops", "ram_mb", "cpu_count", "uplink_mbps", "downlink_mbps")
CITATION_WORDS = ("spec", "brief", "data sheet", "datasheet", "benchmark")


def test_required_profiles_are_shipped() -> None:
    names = available_profiles()
    assert set(REQUIRED) <= set(names)
    assert names == sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


@pytest.mark.parametrize("name", available_profiles())
def test_profile_loads_and_every_number_has_a_source(name: str, tmp_path: Path) -> None:
    p = load_profile(name)
    assert p.name == name and not p.measured and p.arch in ("aarch64", "x86_64")
    raw = tomllib.loads((PROFILE_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    for field in NUMBERS:
        assert set(raw[field]) == {"value", "source"}, field
        source = p.sources[field]
        assert len(source) >= 20, (field, source)
        assert source.startswith("estimate:") or any(w in source.lower() for w in CITATION_WORDS), \
            (field, source)
    copy = tmp_path / f"{name}.toml"  # the profile round-trips through the TOML writer
    copy.write_text(profile_to_toml(p), encoding="utf-8")
    assert load_profile(str(copy)) == p


def test_profiles_are_mutually_plausible() -> None:
    p = {n: load_profile(n) for n in REQUIRED}
    pis = [p["raspberry-pi-3b"], p["raspberry-pi-4b"], p["raspberry-pi-5"]]
    assert [x.gflops for x in pis] == sorted(x.gflops for x in pis)
    assert [x.downlink_mbps for x in pis] == sorted(x.downlink_mbps for x in pis)
    # sustained PyTorch training on a Pi is far below the ~24 GFLOPS NEON peak of a Pi 4
    assert p["raspberry-pi-4b"].gflops < 24 * 0.5
    assert p["raspberry-pi-3b"].ram_mb == 1024
    assert p["jetson-nano"].gflops > load_profile("jetson-nano-cpu").gflops  # GPU vs CPU figure
    assert p["jetson-orin-nano"].gflops > p["jetson-nano"].gflops
    assert "GPU" in p["jetson-nano"].sources["gflops"]
    assert all(x.gflops < p["laptop"].gflops for n, x in p.items() if n not in ("laptop",
                                                                             "jetson-orin-nano"))
    assert all("estimate" in x.sources["uplink_mbps"] for x in p.values())


def test_unknown_or_bad_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown profile 'commodore-64'.*raspberry-pi-4b"):
        load_profile("commodore-64")
    with pytest.raises(ValueError, match="neither a profile name"):
        load_profile("../../etc/passwd")
