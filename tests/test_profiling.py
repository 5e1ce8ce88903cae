"""DeviceProfile validation and round trips, the FLOPS/bandwidth probes and Throttle."""

from __future__ import annotations

import json
import math
import time

import pytest

from edge_sdk.profiling import (NOMINAL_MBPS, DeviceProfile, load_profile, measure_bandwidth,
                                measure_device, measure_flops, measure_flops_detail,
                                profile_to_toml, save_profile)
from edge_sdk.throttle import Throttle


def _profile(**kw: object) -> DeviceProfile:
    base: dict[str, object] = dict(name="test-dev_1.0", gflops=12.5, ram_mb=2048, cpu_count=4,
                                   uplink_mbps=8.0, downlink_mbps=16.0, arch="aarch64",
                                   sources={"gflops": "estimate: test", "ram_mb": "spec \"quoted\""})
    base.update(kw)
    return DeviceProfile(**base)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- DeviceProfile


def test_to_dict_is_flat_and_round_trips() -> None:
    p = _profile()
    d = p.to_dict()
    assert all(isinstance(k, str) for k in d)
    assert all(isinstance(v, (int, float, str, bool)) for v in d.values())
    assert d["source.gflops"] == "estimate: test" and "sources" not in d
    assert DeviceProfile.from_dict(d) == p
    assert DeviceProfile.from_dict(json.loads(json.dumps(d))) == p


def test_ints_and_floats_are_normalised() -> None:
    p = DeviceProfile.from_dict({"name": "x", "gflops": 3, "ram_mb": 512.0, "cpu_count": 2,
                                 "uplink_mbps": 1, "downlink_mbps": 2})
    assert isinstance(p.gflops, float) and isinstance(p.ram_mb, int) and p.ram_mb == 512
    assert p.measured is False and p.sources == {} and p.arch == ""


@pytest.mark.parametrize("change, message", [
    ({"gflops": math.nan}, "finite"),
    ({"gflops": math.inf}, "finite"),
    ({"gflops": -1.0}, "outside"),
    ({"gflops": 0.0}, "outside"),
    ({"gflops": 2e6}, "outside"),
    ({"ram_mb": 8}, "outside"),
    ({"ram_mb": 10**9}, "outside"),
    ({"ram_mb": 1024.5}, "integer"),
    ({"cpu_count": 0}, "outside"),
    ({"cpu_count": 5000}, "outside"),
    ({"uplink_mbps": -5.0}, "outside"),
    ({"downlink_mbps": 1e7}, "outside"),
    ({"gflops": "12"}, "number"),
    ({"cpu_count": True}, "number"),
    ({"name": ""}, "name"),
    ({"name": "a" * 65}, "name"),
    ({"name": "../etc/passwd"}, "name"),
    ({"name": "pi 4"}, "name"),
    ({"name": 7}, "name"),
    ({"arch": "x86 64"}, "arch"),
    ({"measured": "yes"}, "measured"),
    ({"source.gflops": 5}, "source"),
    ({"source.bogus": "x"}, "source key"),
    ({"colour": "red"}, "unknown profile field"),
])
def test_from_dict_rejects_bad_values(change: dict[str, object], message: str) -> None:
    d = _profile().to_dict()
    d.update(change)
    with pytest.raises(ValueError, match=message):
        DeviceProfile.from_dict(d)


def test_from_dict_rejects_missing_fields_and_non_mappings() -> None:
    d = _profile().to_dict()
    del d["ram_mb"]
    with pytest.raises(ValueError, match="missing required field.*ram_mb"):
        DeviceProfile.from_dict(d)
    with pytest.raises(ValueError, match="mapping"):
        DeviceProfile.from_dict([("name", "x")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keys must be str"):
        DeviceProfile.from_dict({1: "x"})  # type: ignore[dict-item]


def test_direct_construction_is_validated_and_sources_copied() -> None:
    with pytest.raises(ValueError, match="outside"):
        _profile(gflops=-3.0)
    sources = {"gflops": "a"}
    p = _profile(sources=sources)
    sources["gflops"] = "changed"
    assert p.sources["gflops"] == "a"
    assert hash(p) == hash(_profile(sources={"gflops": "other"}))  # hashable despite the dict


def test_save_and_load_json_and_toml(tmp_path) -> None:
    p = _profile(measured=True, sources={**_profile().sources, "arch": "measured: platform"})
    for suffix in (".json", ".toml"):
        path = save_profile(p, tmp_path / f"dev{suffix}")
        assert path.exists()
        assert load_profile(str(path)) == p
    assert json.loads((tmp_path / "dev.json").read_text())["gflops"] == 12.5
    assert "[gflops]" in profile_to_toml(p)


def test_load_profile_reports_bad_files(tmp_path) -> None:
    good = profile_to_toml(_profile())
    bad = tmp_path / "bad.toml"
    bad.write_text(good.replace("value = 12.5", "value = nan"))
    with pytest.raises(ValueError, match="invalid profile .*bad.toml.*finite"):
        load_profile(str(bad))
    bad.write_text(good.replace("value = 12.5", 'value = 12.5\nunit = "GFLOPS"'))
    with pytest.raises(ValueError, match="exactly 'value'"):
        load_profile(str(bad))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="invalid profile"):
        load_profile(str(broken))
    with pytest.raises(FileNotFoundError):
        load_profile(str(tmp_path / "absent.json"))


# ----------------------------------------------------------------------------- measurement


def test_measure_flops_is_fast_and_plausible() -> None:
    t0 = time.perf_counter()
    g = measure_flops(seconds=0.3)
    assert time.perf_counter() - t0 < 3.0
    assert 0.05 < g < 1e5


def test_measure_flops_detail_reports_both_workloads() -> None:
    d = measure_flops_detail(seconds=0.2, threads=1)
    assert d["matmul_gflops"] > 0 and d["conv_train_gflops"] > 0
    assert 256 <= d["matmul_n"] <= 512 and d["threads"] == 1 and d["dtype"] == "float32"
    with pytest.raises(ValueError, match="seconds"):
        measure_flops(seconds=0)
    with pytest.raises(ValueError, match="dtype"):
        measure_flops(seconds=0.1, dtype=torch_int())
    with pytest.raises(ValueError, match="threads"):
        measure_flops(seconds=0.1, threads=0)


def torch_int() -> object:
    import torch

    return torch.int32


def test_measure_device_without_transport() -> None:
    p = measure_device("bench-host", seconds=0.2)
    assert p.measured and p.name == "bench-host" and p.gflops > 0
    assert p.ram_mb >= 16 and p.cpu_count >= 1 and p.arch
    assert p.uplink_mbps == p.downlink_mbps == NOMINAL_MBPS
    assert p.sources["uplink_mbps"].startswith("not measured")
    assert p.sources["gflops"].startswith("measured:")
    assert DeviceProfile.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="name"):
        measure_device("bad name", seconds=0.1)


def test_measure_bandwidth_through_a_real_broker(broker, topic_prefix) -> None:
    from edge_sdk.transport import MqttTransport, TransportConfig

    with MqttTransport(TransportConfig(url=broker.url, connect_timeout=5.0)) as t:
        mbps = measure_bandwidth(t, f"{topic_prefix}/bw", nbytes=64 * 1024, rounds=2, timeout=5.0)
        assert math.isfinite(mbps) and mbps > 0.5  # loopback: far faster than that
        p = measure_device("bw-dev", seconds=0.1, transport=t, topic=f"{topic_prefix}/bw2")
        assert p.uplink_mbps == p.downlink_mbps > 0.5
        assert p.sources["uplink_mbps"].startswith("measured")
    with pytest.raises(ValueError, match="wildcards"):
        measure_bandwidth(None, "a/#")
    with pytest.raises(ValueError, match="nbytes"):
        measure_bandwidth(None, "a/b", nbytes=0)


# ----------------------------------------------------------------------------- throttle


def test_throttle_arithmetic() -> None:
    p = _profile(gflops=10.0, uplink_mbps=8.0, downlink_mbps=16.0)
    th = Throttle(p)
    assert th.compute_seconds(20 * 10**9) == pytest.approx(2.0)  # 20 GFLOP at 10 GFLOPS
    assert th.transfer_seconds(1_000_000, "up") == pytest.approx(1.0)
    assert th.transfer_seconds(1_000_000, "down") == pytest.approx(0.5)
    t0 = time.perf_counter()
    assert th.apply_compute(20 * 10**9, host_seconds=0.3) == pytest.approx(2.0)  # virtual: no sleeping
    assert th.apply_transfer(1_000_000, "up") == pytest.approx(1.0)
    assert time.perf_counter() - t0 < 0.2
    off = Throttle(p, mode="off")
    assert off.apply_compute(20 * 10**9, host_seconds=0.3) == 0.3 and off.apply_transfer(10**6, "up") == 0.0


def test_simulated_compute_ignores_how_fast_the_host_was() -> None:
    th = Throttle(_profile(gflops=4.0))
    work = 6 * 10**9
    assert th.apply_compute(work, host_seconds=0.01) == th.apply_compute(work, host_seconds=5.0) == 1.5


def test_throttle_sleep_mode_sleeps_the_difference() -> None:
    p = _profile(gflops=10.0, uplink_mbps=8.0, downlink_mbps=8.0)
    th = Throttle(p, mode="sleep")
    t0 = time.perf_counter()
    assert th.apply_compute(2 * 10**9, host_seconds=0.1) == pytest.approx(0.2)
    assert 0.09 <= time.perf_counter() - t0 < 0.4  # slept simulated - host = 0.1 s
    t0 = time.perf_counter()
    assert th.apply_transfer(100_000, "down") == pytest.approx(0.1)
    assert 0.09 <= time.perf_counter() - t0 < 0.4
    t0 = time.perf_counter()  # the device is faster than the host was: no sleep
    assert th.apply_compute(10**9, host_seconds=0.5) == pytest.approx(0.1)
    assert time.perf_counter() - t0 < 0.05


def test_throttle_sleep_is_capped() -> None:
    th = Throttle(_profile(gflops=1.0), mode="sleep", max_sleep_s=0.05)
    t0 = time.perf_counter()
    assert th.apply_compute(1000 * 10**9, host_seconds=1.0) == pytest.approx(1000.0)  # not capped
    assert time.perf_counter() - t0 < 0.3


@pytest.mark.parametrize("kw, message", [
    ({"mode": "fast"}, "mode"),
    ({"max_sleep_s": -1.0}, "max_sleep_s"),
])
def test_throttle_rejects_bad_config(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"profile": _profile(), **kw}
    with pytest.raises(ValueError, match=message):
        Throttle(**args)  # type: ignore[arg-type]


def test_throttle_rejects_bad_arguments() -> None:
    th = Throttle(_profile())
    with pytest.raises(ValueError, match="direction"):
        th.transfer_seconds(10, "sideways")
    with pytest.raises(ValueError, match="nbytes"):
        th.transfer_seconds(-1, "up")
    with pytest.raises(ValueError, match="flops"):
        th.compute_seconds(-5)
    with pytest.raises(ValueError, match="flops"):
        th.compute_seconds(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host_seconds"):
        th.apply_compute(10, host_seconds=math.inf)
    with pytest.raises(ValueError, match="DeviceProfile"):
        Throttle(_profile().to_dict())  # type: ignore[arg-type]
