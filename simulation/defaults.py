"""The defaults of a simulated job, in one place, without torch.

`SimulationConfig`, `sim_federation` and ``edgefl simulate``'s options all read them from
:data:`SIMULATION`. Where a simulation differs from a real fleet on purpose, the real fleet's
default lives with the real fleet (``FederationConfig``, ``TrainConfig``, the client's TOML) and the
field here says why it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_sdk.train_config import TrainConfig

__all__ = ["SimulationDefaults", "SIMULATION"]


@dataclass(frozen=True)
class SimulationDefaults:
    """What a simulated job does unless told otherwise."""

    method: str = "fedavg"
    clients: int = 4
    #: a real coordinator's job: `FederationConfig.rounds` (5); a first simulation ends sooner
    rounds: int = 3
    dataset: str = "mnist-sample"  # ships with the package: runs offline
    partition: str = "iid"
    model: str = "auto"  # the input's shape decides (`edge_sdk.model_names.default_family`)
    out: str = "runs/latest"
    throttle: str = "virtual"  # report the profiled devices' time
    sim_device: str = "cpu"
    backend: str = "auto"
    connections: str = "auto"
    ray_cpus_per_worker: float = 1.0
    ray_actors_per_worker: int = 2
    seed: int = 0
    eval_every: int = 1
    publish_every: int = 0  # the final model only
    #: each device holds out nothing (`edge_sdk.data.holdout.NO_HOLDOUT`; that module needs torch): the
    #: simulation evaluates on the dataset's test set
    holdout: float = 0.0
    #: ``edgefl simulate``'s training: two local epochs, the rest `TrainConfig`'s. A real device
    #: trains what its coordinator's ``[train]`` says (one epoch unless set), and so does a job built
    #: in Python with `sim_federation` (the tests and benches rely on its one epoch)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2))


#: The defaults every simulated job starts from.
SIMULATION = SimulationDefaults()
