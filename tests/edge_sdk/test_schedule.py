"""When a device may train: windows, idleness, heat, throttling, memory — pure decisions on a fake
/proc and /sys tree and a fixed clock, caps in a child process, and the device loop on a real broker
declining a plan while hot (error `not_training`, status `paused` with the reason) and training
once it cooled down."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.device_config import client_from_toml
from edge_sdk.networking.link import MessageLink, Received
from edge_sdk.methods import LocalData
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Error, Plan, Register, Status, Stop, Update
from edge_sdk.protocol.topics import Topics
from edge_sdk.schedule import (
    Readings, SchedulePolicy, SystemMonitor, TimeWindow, cpu_busy_fraction, decide, read_cpu_times,
    read_mem_available_mb, read_temperature_c, read_throttled,
)
from edge_sdk.tensors import state_to_numpy
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.paths import REPO_ROOT

NIGHT = dt.datetime(2026, 11, 3, 2, 30)
NOON = dt.datetime(2026, 11, 3, 12, 0)


def _sys(root: Path, zones: dict[str, int] | None = None, throttled: str | None = None,
         mem_kb: int | None = None, stat: str | None = None) -> Path:
    """Write a fake /sys and /proc below root."""
    for i, (kind, milli) in enumerate((zones or {}).items()):
        zone = root / "sys" / "class" / "thermal" / f"thermal_zone{i}"
        zone.mkdir(parents=True, exist_ok=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(f"{milli}\n")
    if throttled is not None:
        fw = root / "sys" / "devices" / "platform" / "soc" / "soc:firmware"
        fw.mkdir(parents=True, exist_ok=True)
        (fw / "get_throttled").write_text(throttled + "\n")
    (root / "proc").mkdir(parents=True, exist_ok=True)
    if mem_kb is not None:
        (root / "proc" / "meminfo").write_text(f"MemTotal: 3884000 kB\nMemFree: 1000 kB\nMemAvailable: {mem_kb} kB\n")
    if stat is not None:
        (root / "proc" / "stat").write_text(stat + "cpu0 1 2 3 4 5 6 7 8 0 0\nintr 5\n")
    return root


def _stat(user: int, system: int, idle: int, iowait: int = 0) -> str:
    return f"cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\n"


# ----------------------------------------------------------------------------- pure parts

def test_windows_parse_and_cross_midnight():
    night = TimeWindow.parse("22:00-06:30")
    assert str(night) == "22:00-06:30"
    assert night.contains(dt.time(23, 0)) and night.contains(dt.time(2, 0)) and night.contains(dt.time(22, 0))
    assert not night.contains(dt.time(6, 30)) and not night.contains(dt.time(12, 0))
    day = TimeWindow.parse(" 9:05 - 17:00 ")
    assert day.contains(dt.time(9, 5)) and not day.contains(dt.time(17, 0)) and not day.contains(dt.time(2, 0))
    for bad in ("25:00-01:00", "9-17", "10:00-10:00", "10:61-11:00", 5, None):
        with pytest.raises(ValueError):
            TimeWindow.parse(bad)


def test_policy_from_toml_table_validates():
    policy = SchedulePolicy.from_dict({"windows": ["22:00-07:00", "12:00-13:00"], "max_cpu_load": 0.5,
                                       "max_temp_c": 75, "threads": 2, "min_free_memory_mb": 250,
                                       "wait_s": 60, "pause_when_throttled": False})
    assert [str(w) for w in policy.windows] == ["22:00-07:00", "12:00-13:00"]
    assert (policy.max_cpu_load, policy.max_temp_c, policy.threads, policy.wait_s) == (0.5, 75, 2, 60.0)
    assert SchedulePolicy.from_dict({}) == SchedulePolicy()
    bad_tables = [{"max_cpu_laod": 0.5}, {"max_cpu_load": 2}, {"threads": 0}, {"threads": 1.5},
                  {"windows": "22:00-06:00"}, {"max_temp_c": float("nan")}, {"pause_when_throttled": "yes"},
                  {"wait_s": -1}]
    for table in bad_tables:
        with pytest.raises(ValueError):
            SchedulePolicy.from_dict(table)


def test_decide_gives_every_reason():
    policy = SchedulePolicy(windows=(TimeWindow.parse("22:00-06:00"),), max_cpu_load=0.5, max_temp_c=75.0,
                            min_free_memory_mb=300)
    ok = decide(policy, Readings(cpu_load=0.1, temp_c=50.0, throttled=0x50000, mem_available_mb=900), NIGHT)
    assert ok.allowed and ok.reason == ""  # 0x50000: throttled in the past only, not now
    bad = decide(policy, Readings(cpu_load=0.73, temp_c=81.25, throttled=0x5, mem_available_mb=120), NOON)
    assert not bad.allowed and len(bad.reasons) == 5
    assert bad.reasons[0] == "outside training window 22:00-06:00 (local time 12:00)"
    assert "busy: CPU 73% > 50%" in bad.reason and "hot: 81.2 °C > 75.0 °C" in bad.reason
    assert "firmware reports under-voltage, currently throttled" in bad.reason
    assert "low memory: 120 MB available < 300 MB" in bad.reason
    unknown = decide(policy, Readings(), NIGHT)  # sensors this device lacks never block training
    assert unknown.allowed
    assert decide(SchedulePolicy(), Readings(cpu_load=1.0, temp_c=99.0), NOON).allowed


# ----------------------------------------------------------------------------- sensors

def test_sensors_read_a_fake_pi(tmp_path):
    root = _sys(tmp_path, zones={"cpu-thermal": 81234, "gpu": 90000}, throttled="50005", mem_kb=512000,
                stat=_stat(100, 50, 850))
    assert read_temperature_c(root) == pytest.approx(81.234)  # the CPU zone, not the hotter GPU
    assert read_temperature_c(root, zones=("gpu",)) == pytest.approx(90.0)
    assert read_throttled(root) == 0x50005
    assert read_mem_available_mb(root) == 500
    assert read_cpu_times(root) == (150, 1000)
    assert cpu_busy_fraction((150, 1000), (450, 1400)) == pytest.approx(0.75)


def test_jetson_pmic_zone_is_ignored_and_missing_sensors_are_none(tmp_path):
    jetson = _sys(tmp_path / "jetson", zones={"PMIC-Die": 100000, "CPU-therm": 41500, "AO-therm": 39000})
    assert read_temperature_c(jetson) == pytest.approx(41.5)
    empty = _sys(tmp_path / "empty")
    assert (read_temperature_c(empty), read_throttled(empty), read_mem_available_mb(empty),
            read_cpu_times(empty)) == (None, None, None, None)


def test_monitor_measures_load_between_readings(tmp_path):
    root = _sys(tmp_path, stat=_stat(100, 0, 900), zones={"cpu-thermal": 85000}, mem_kb=2048000)
    slept = []

    def sleep(seconds: float) -> None:  # the machine gets busy while the monitor waits
        slept.append(seconds)
        (root / "proc" / "stat").write_text(_stat(100 + 80, 0, 900 + 20))

    policy = SchedulePolicy(max_cpu_load=0.5, max_temp_c=80.0, sys_root=str(root))
    decision = SystemMonitor(policy, clock=lambda: 100.0, sleep=sleep).check(NIGHT)
    assert slept == [1.0] and decision.readings.cpu_load == pytest.approx(0.8)
    assert not decision.allowed and decision.reasons == ("busy: CPU 80% > 50%", "hot: 85.0 °C > 80.0 °C")
    assert decision.readings.metrics() == {"cpu_load": 0.8, "temp_c": 85.0, "mem_available_mb": 2000.0}
    # no /proc/stat (Android 8+): the 1-minute load average per CPU stands in
    (root / "proc" / "stat").unlink()
    (root / "proc" / "loadavg").write_text("0.50 0.40 0.30 1/100 999\n")
    load = SystemMonitor(policy).cpu_load()
    assert load is not None and 0 < load <= 0.5


def test_caps_apply_to_the_process():
    code = ("import resource, torch; from edge_sdk.schedule import SchedulePolicy, apply_caps; "
            "print(apply_caps(SchedulePolicy(threads=1, max_memory_mb=3000))); "
            "print(torch.get_num_threads(), resource.getrlimit(resource.RLIMIT_DATA)[0] // 2**20)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "1 3000"


def test_client_toml_schedule_table(tmp_path):
    digits = np.random.default_rng(0).random((20, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=digits, y_train=np.arange(20) % 10, x_test=digits[:4],
             y_test=np.arange(4))
    text = (f'device_id = "pi-x"\nstate_dir = "{tmp_path}"\n[device]\nprofile = "raspberry-pi-4b"\n'
            f'[data]\ndataset = "npz:{tmp_path}/data.npz"\n'
            '[schedule]\nwindows = ["22:00-07:00"]\nmax_cpu_load = 0.4\nthreads = 2\n')
    (tmp_path / "client.toml").write_text(text)
    client = client_from_toml(tmp_path / "client.toml")
    assert client.config.schedule.max_cpu_load == 0.4 and client.config.schedule.threads == 2
    (tmp_path / "client.toml").write_text(text + "max_tmp_c = 70\n")
    with pytest.raises(ValueError, match="max_tmp_c"):
        client_from_toml(tmp_path / "client.toml")


def test_example_client_toml_parses():
    from edge_sdk.config import read_toml

    example = read_toml(REPO_ROOT / "deploy" / "raspberrypi" / "client.toml")
    policy = SchedulePolicy.from_dict(example["schedule"])
    assert policy.max_cpu_load == 0.5 and policy.threads == 2


# ----------------------------------------------------------------------------- device loop

def _next(link: MessageLink, kind: type, timeout: float = 20.0, topic: str | None = None) -> Received:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        item = link.poll(0.2)
        if isinstance(item, Received) and isinstance(item.envelope.body, kind) \
                and (topic is None or item.topic == topic):
            return item
    raise AssertionError(f"no {kind.__name__} within {timeout} s")


def test_hot_device_declines_then_trains_when_cool(broker, tmp_path):
    root = _sys(tmp_path, zones={"cpu-thermal": 85000}, mem_kb=2048000)
    job, device = f"sched{uuid.uuid4().hex[:8]}", "pi-hot"
    topics = Topics(job=job)
    rng = np.random.default_rng(0)
    data = LocalData(rng.random((64, 1, 8, 8)).astype(np.float32), np.arange(64) % 10, 10)
    policy = SchedulePolicy(max_temp_c=80.0, threads=1, sys_root=str(root))
    client = DeviceClient(ClientConfig(device, TransportConfig(url=broker.url), job=job, schedule=policy,
                                       heartbeat_s=60.0), data, load_profile("raspberry-pi-4b"))
    coord = MqttTransport(TransportConfig(url=broker.url, client_id=f"coord-{job}"))
    coord.connect()
    link = MessageLink(coord)
    coord.subscribe(topics.all_uplinks())
    coord.subscribe(topics.all_status())
    thread = threading.Thread(target=client.run, kwargs={"timeout_s": 60}, daemon=True)
    thread.start()
    try:
        register = _next(link, Register)
        link.send(topics.downlink(device), Envelope.of(Ack("ok"), "coordinator", reply_to=register.envelope.msg_id))
        spec = mlp(64, 10, hidden=(16,), input_shape=(1, 8, 8))
        plan = Plan("fedavg", "global", spec, state_to_numpy(build_model(spec)),
                    {"epochs": 1, "batch_size": 16, "lr": 0.05, "threads": 4})
        first = Envelope.of(plan, "coordinator", round=0)
        link.send(topics.downlink(device), first)
        error = _next(link, Error)
        assert error.envelope.body.code == "not_training" and error.envelope.reply_to == first.msg_id
        assert error.envelope.round == 0 and "hot: 85.0 °C > 80.0 °C" in error.envelope.body.message
        status = _next(link, Status, topic=topics.status(device))
        while status.envelope.body.state != "paused":
            status = _next(link, Status, topic=topics.status(device))
        assert "hot" in status.envelope.body.reason and status.envelope.body.metrics["temp_c"] == 85.0
        (root / "sys" / "class" / "thermal" / "thermal_zone0" / "temp").write_text("50000\n")
        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=1))
        update = _next(link, Update)
        assert update.envelope.round == 1 and update.envelope.body.num_samples == 64
        link.send(topics.downlink(device), Envelope.of(Stop("done"), "coordinator"))
        thread.join(15)
        assert not thread.is_alive()
        assert client.declined == [0] and client.rounds_trained == [1]
    finally:
        client.stop()
        coord.close()
