"""`ClientConfig`: everything a device needs to join a federation (edge_sdk/client.py runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_sdk.protocol.capabilities import FEATURES, SERVE
from edge_sdk.data.holdout import NO_HOLDOUT, SOURCE_TEST_SET, check_holdout
from edge_sdk.networking.link import LinkConfig
from edge_sdk.schedule import SchedulePolicy
from edge_sdk.networking.transport import TransportConfig

__all__ = ["ClientConfig"]


@dataclass(frozen=True)
class ClientConfig:
    """Everything a device needs to join a federation."""

    device_id: str
    transport: TransportConfig = field(default_factory=TransportConfig)
    job: str = "default"
    link: LinkConfig = field(default_factory=LinkConfig)
    state_dir: str | None = None
    heartbeat_s: float = 30.0
    register_retry_s: float = 5.0
    seed: int = 0
    schedule: SchedulePolicy = field(default_factory=SchedulePolicy)
    #: where local training runs: auto (a CUDA GPU when torch sees one), cpu, cuda or cuda:N
    device: str = "auto"
    #: keep retrying a failed first connection to the broker this long (0: fail at once, with
    #: the reason), e.g. while a simulation's hundreds of devices connect at the same time
    connect_retry_s: float = 0.0
    #: raw Ed25519 public keys of the coordinator (edge_sdk/signing.py): with any, only models signed
    #: by one of them for this device and job, and not older than the installed one, are installed;
    #: with none, published models are installed unchecked (as before signing), with a warning
    trusted_keys: tuple[bytes, ...] = ()
    #: measure the compute again this often (seconds; 0: never), between rounds and only when the
    #: machine looks idle; a figure more than 25 % off the reported one is sent (`ProfileUpdate`)
    remeasure_every_s: float = 0.0
    #: seconds a (re-)measurement takes (`edge_sdk.profiling.measure_flops_detail`)
    measure_seconds: float = 1.0
    #: share of its data the device holds out of training for federated evaluation, chosen by each
    #: sample's stable key (edge_sdk/data/holdout.py): a fraction in (0, 0.9]; `NO_HOLDOUT`: none (it
    #: answers an evaluation with none); `SOURCE_TEST_SET`: the held-out set its source names
    holdout: float | None = NO_HOLDOUT
    #: an update the coordinator has not answered (ack or error) after this many seconds is sent
    #: again, then after twice and four times as long, while its round is open (0: never); its loss
    #: on the way (e.g. the broker's queue to the coordinator full after a flood) costs no round
    update_resend_s: float = 15.0
    #: how many times at most (edge_sdk/device/update_resend.py)
    update_resends: int = 3
    #: between rounds, read its data source again every this many seconds and tell the coordinator
    #: when its counts change (edge_sdk/device/data_watch.py); 0: only when it trains
    reread_s: float = 60.0
    #: it serves its model on live readings (``[serve]``, docs/serving.md): it says so when it registers
    serves: bool = False

    @property
    def features(self) -> tuple[str, ...]:
        """What it names in its registration's capabilities besides its device parts."""
        return (*FEATURES, SERVE) if self.serves else FEATURES

    def __post_init__(self) -> None:
        if self.holdout is not SOURCE_TEST_SET and self.holdout != NO_HOLDOUT:
            check_holdout(self.holdout, "holdout")
        if not (isinstance(self.update_resend_s, (int, float)) and 0 <= self.update_resend_s < float("inf")):
            raise ValueError(f"update_resend_s must be a number of seconds >= 0, got {self.update_resend_s!r}")
        if not (isinstance(self.reread_s, (int, float)) and 0 <= self.reread_s < float("inf")):
            raise ValueError(f"reread_s must be a number of seconds >= 0, got {self.reread_s!r}")
        if type(self.update_resends) is not int or not 0 <= self.update_resends <= 100:
            raise ValueError(f"update_resends must be an integer in [0, 100], got {self.update_resends!r}")
