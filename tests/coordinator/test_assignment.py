"""Capacity → level groups: budget, clustering, quantiles, overrides, static and dynamic re-assignment."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.labels import assign, observe

from coordinator.strategies.assignment import LevelAssigner, assign_levels
from coordinator.core.device_record import DeviceRecord
from coordinator.runtime.fleet import Fleet
from simulation.simulate import DEFAULT_FLEET
from coordinator.strategies.flanc import Flanc
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.networking.link import MessageLink
from edge_sdk.methods import LocalData
from edge_sdk.methods.settings.options import parse
from edge_sdk.methods.settings.shared import AssignmentConfig
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig

LEVELS = ["0.25", "0.5", "0.75", "1.0"]


def default_fleet(n: int = 21) -> dict[str, float]:
    return {f"dev{i:03d}": load_profile(DEFAULT_FLEET[i % len(DEFAULT_FLEET)]).gflops for i in range(n)}


def test_cluster_groups_the_default_fleet_by_log_flops():
    gflops = default_fleet()
    labels = assign_levels(gflops, LEVELS)
    by_flops = {g: {labels[d] for d in gflops if gflops[d] == g} for g in set(gflops.values())}
    assert all(len(v) == 1 for v in by_flops.values())  # equal devices, equal level
    level = {g: v.pop() for g, v in by_flops.items()}
    # Pi 3B alone at the bottom, Orin Nano alone at the top, order preserved in between
    assert level[1.0] == "0.25" and level[400.0] == "1.0"
    assert level[4.0] == level[8.0] == level[12.0] == "0.5"
    assert level[70.0] == level[150.0] == "0.75"
    ordered = [LEVELS.index(level[g]) for g in sorted(level)]
    assert ordered == sorted(ordered)


def test_budget_mode_picks_the_largest_level_that_fits():
    costs = {"0.25": 1.0, "0.5": 4.0, "0.75": 9.0, "1.0": 16.0}  # GFLOP per unit of work
    gflops = {"slow": 1.0, "mid": 5.0, "fast": 100.0, "hopeless": 0.01}
    labels = assign_levels(gflops, LEVELS, costs, budget_s=3.0, work_by_device={"mid": 2.0})
    assert labels == {"slow": "0.25", "mid": "0.5", "fast": "1.0", "hopeless": "0.25"}


def test_quantile_mode_makes_equal_groups_and_keeps_ties_together():
    labels = assign_levels({f"d{i}": float(i + 1) for i in range(8)}, LEVELS, mode="quantile")
    assert [labels[f"d{i}"] for i in range(8)] == ["0.25", "0.25", "0.5", "0.5", "0.75", "0.75", "1.0", "1.0"]
    tied = assign_levels({"a": 1.0, "b": 2.0, "c": 2.0, "d": 3.0}, LEVELS, mode="quantile")
    assert tied["b"] == tied["c"]


def test_few_distinct_capacities_spread_over_levels_and_override_pins():
    assert set(assign_levels({"a": 5.0, "b": 5.0}, LEVELS).values()) == {"1.0"}
    two = assign_levels({"a": 1.0, "b": 100.0}, LEVELS)
    assert two == {"a": "0.25", "b": "1.0"}
    pinned = assign_levels({"a": 1.0, "b": 100.0, "c": 50.0}, LEVELS, override={"b": "0.5"})
    assert pinned["b"] == "0.5" and pinned["a"] == "0.25" and pinned["c"] == "1.0"


@pytest.mark.parametrize("kwargs,match", [
    (dict(gflops_by_device={"a": 0.0}), "gflops"),
    (dict(gflops_by_device={"a": float("nan")}), "gflops"),
    (dict(gflops_by_device={"a": 1.0}, override={"a": "2.0"}), "unknown levels"),
    (dict(gflops_by_device={"a": 1.0}, mode="random"), "mode"),
    (dict(gflops_by_device={"a": 1.0}, mode="budget"), "budget_s"),
    (dict(gflops_by_device={"a": 1.0}, levels=[]), "levels"),
])
def test_bad_inputs_raise(kwargs, match):
    kwargs.setdefault("levels", LEVELS)
    with pytest.raises(ValueError, match=match):
        assign_levels(**kwargs)


def _from_options(options: dict[str, str], levels: list[str]) -> AssignmentConfig:
    """The assignment settings of ``options`` for these levels, as a width method reads them."""
    return parse(AssignmentConfig, "flanc", options).for_levels(levels)


def test_options_parse_and_reject():
    config = _from_options({"budget_s": "30", "override": "dev001:1, dev002:0.25", "dynamic": "true"}, LEVELS)
    assert config.mode == "budget" and config.budget_s == 30.0 and config.dynamic
    assert config.override == (("dev001", "1.0"), ("dev002", "0.25"))
    for bad in ({"assign": "magic"}, {"budget_s": "soon"}, {"budget_s": "-1"}, {"override": "dev001"},
                {"override": "dev001:0.3"}, {"dynamic": "maybe"}, {"assign": "budget"}):
        with pytest.raises(ValueError):
            _from_options(bad, LEVELS)


def _record(name: str, profile: str) -> DeviceRecord:
    return DeviceRecord(name, load_profile(profile), 100)


def test_static_labels_freeze_dynamic_labels_follow_new_profiles():
    for dynamic in (False, True):
        assigner = LevelAssigner(AssignmentConfig(dynamic=dynamic), LEVELS)
        records = [_record("pi", "raspberry-pi-3b"), _record("orin", "jetson-orin-nano"), _record("mid", "jetson-nano")]
        for r in records:
            observe(assigner, r, records)
        assert [r.label for r in records] == ["0.25", "1.0", "0.75"]  # 3 groups spread over 4 levels
        assigner.freeze()
        records[1].profile = load_profile("raspberry-pi-3b")  # throttled hard: re-registers
        observe(assigner, records[1], records)
        assert records[1].label == ("0.25" if dynamic else "1.0")
        assert assigner.groups()[records[1].label] == sorted(
            r.device_id for r in records if r.label == records[1].label)


def test_device_reports_new_capacity_and_is_reassigned_over_a_real_broker(broker):
    """DeviceClient.report_capacity re-registers; FLANC (dynamic, budget) moves it to a smaller width."""
    data = load_dataset("digits")
    probe = Flanc.create(StrategyContext(FederationConfig(seed=0), "mlp", data.input_shape, data.num_classes))
    # a budget the Pi 3B (1 GFLOPS) meets only with the smallest width for 200 samples
    budget = 1.2 * probe.assigner.cost_per_level["0.25"] * 200 / 1.0
    assert probe.assigner.cost_per_level["0.5"] * 200 / 1.0 > budget
    ctx = StrategyContext(FederationConfig(seed=0), "mlp", data.input_shape, data.num_classes,
                          options={"budget_s": str(budget), "dynamic": "true"})
    strategy = Flanc.create(ctx)
    transport = MqttTransport(TransportConfig(url=broker.url, client_id="assign-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job="assign"),
                  on_register=lambda device: assign(strategy, device, fleet.devices.values()))
    fleet.start()
    client = DeviceClient(
        ClientConfig(device_id="phone", transport=TransportConfig(url=broker.url, client_id="assign-phone"),
                     job="assign", register_retry_s=0.5),
        LocalData(data.x_train[:200], data.y_train[:200], data.num_classes), load_profile("laptop"))
    thread = threading.Thread(target=client.run, kwargs={"timeout_s": 30.0}, daemon=True)
    thread.start()
    try:
        assert fleet.wait_for_devices(1, 10.0) == ["phone"]
        record = fleet.devices["phone"]
        assert record.label == "1.0"
        strategy.assigner.freeze()  # training started: only dynamic mode may move it now
        client.report_capacity(load_profile("raspberry-pi-3b"))  # e.g. thermal throttling
        end = time.monotonic() + 10.0
        while time.monotonic() < end and record.profile.name != "raspberry-pi-3b":
            fleet.pump(0.2)
        assert record.profile.name == "raspberry-pi-3b"
        assert record.label == "0.25"
        with pytest.raises(ValueError):
            client.report_capacity("fast")  # type: ignore[arg-type]
    finally:
        client.stop()
        thread.join(5.0)
        transport.close()


def _device(device_id: str, gflops: float) -> DeviceRecord:
    from edge_sdk.profiling import DeviceProfile
    profile = DeviceProfile(name=device_id, gflops=gflops, ram_mb=1024, cpu_count=4,
                            uplink_mbps=10.0, downlink_mbps=10.0)
    return DeviceRecord(device_id, profile, 100)


def test_random_sampling_never_exceeds_capacity_and_covers_smaller_levels():
    levels = ["0.25", "0.5", "0.75", "1"]
    assigner = LevelAssigner(AssignmentConfig(sample="random"), levels)
    devices = [_device(f"d{i}", g) for i, g in enumerate([1, 10, 100, 1000])]
    for device in devices:
        observe(assigner, device, devices)
    seen: dict[str, set[str]] = {d.device_id: set() for d in devices}
    for rnd in range(40):
        for device in devices:
            level = assigner.round_level(device, rnd, seed=3)
            assert levels.index(level) <= levels.index(device.label)
            seen[device.device_id].add(level)
    assert seen["d0"] == {"0.25"}
    assert seen["d3"] == set(levels)  # the fastest device trains every width over 40 rounds
    # the draw is a function of (seed, round, device): a resumed job repeats it
    assert [assigner.round_level(devices[3], r, seed=3) for r in range(10)] == \
        [assigner.round_level(devices[3], r, seed=3) for r in range(10)]
    assert [assigner.round_level(devices[3], r, seed=3) for r in range(20)] != \
        [assigner.round_level(devices[3], r, seed=4) for r in range(20)]
    anything = LevelAssigner(AssignmentConfig(sample="any"), levels)
    devices[0].label = anything.observe(devices[0])
    assert {anything.round_level(devices[0], r) for r in range(40)} == set(levels)  # the papers' protocol


def test_fixed_sampling_trains_the_capacity_level_and_bad_sampling_is_refused():
    levels = ["0.5", "1"]
    assigner = LevelAssigner(AssignmentConfig(), levels)
    device = _device("d", 5)
    device.label = "0.5"
    assert {assigner.round_level(device, r) for r in range(10)} == {"0.5"}
    with pytest.raises(ValueError, match="sample"):
        _from_options({"sample": "sometimes"}, levels)
