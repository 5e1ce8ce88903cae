"""The client TOML of a real `edgefl client` process, for tests that start device processes."""

from __future__ import annotations

from pathlib import Path

__all__ = ["device_toml"]


def device_toml(tmp: Path, url: str, job: str, device_id: str, shard: int, shards: int, extra: str = "") -> Path:
    """``tmp/<device_id>.toml``: a Raspberry Pi 4 profile, shard ``shard`` of ``shards`` of the
    bundled MNIST sample, its state in ``tmp/<device_id>``; ``extra`` TOML appended."""
    path = tmp / f"{device_id}.toml"
    path.write_text(f"""
device_id = "{device_id}"
job = "{job}"
state_dir = "{tmp / device_id}"
[broker]
url = "{url}"
[device]
profile = "raspberry-pi-4b"
[data]
dataset = "mnist-sample"
partition = "iid"
shard = {shard}
shards = {shards}
{extra}""")
    return path
