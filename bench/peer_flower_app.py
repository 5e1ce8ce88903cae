"""The Flower 1.42 side of bench/peer_sim.py: the job of a `JobSpec` file run by Flower's
simulation engine (``flwr.simulation.run_simulation``, Ray backend), in Flower's own venv:

    PYTHONPATH=bench /work/flower-venv/bin/python bench/peer_flower_app.py \\
        --job JOB.json --events EVENTS.json [--cpus-per-client 2]

bench/peer_sim.py writes JOB.json (and the arrays it names) and runs this; it reads EVENTS.json
(``time.monotonic()`` of each round's start and end, and the final accuracy) afterwards.

The ServerApp runs Flower's ``serverapp.strategy.FedAvg`` with two hooks replaced so that the job
is edgefl's: ``configure_train`` sends round r's train message to the devices edgefl draws
(device i is the node with the i-th smallest node id: the ServerApp cannot see Flower's own
node-to-partition map, so the message names the device whose shard the ClientApp trains), and
``aggregate_train`` averages in float64 in edgefl's order of the devices (their sorted ids). No
federated evaluation; the centralised ``evaluate_fn`` evaluates the test set after the last round
only. Each ClientApp run builds cnn4, loads the global weights from the message, trains one epoch
on its device's shard (memory-mapped arrays, loaded once per Ray actor) and replies with its
weights.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import OrderedDict
from typing import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.simulation import run_simulation
from peer_sim import Cnn4, Events, JobSpec, PeerJob, digest, fold, train_device, train_seed
from peer_sim import evaluate as evaluate_model

#: the job file, for the ClientApps in Ray's actor processes (they inherit the environment)
JOB_ENV = "PEER_SIM_JOB"

_job: PeerJob | None = None


def job_here() -> PeerJob:
    """This process's `PeerJob` (loaded once per process: the arrays are memory-mapped)."""
    global _job
    if _job is None:
        _job = PeerJob(JobSpec.load(os.environ[JOB_ENV]))
        torch.set_num_threads(_job.spec.threads)
    return _job


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the device the message names, on its shard, from the message's weights."""
    job = job_here()
    config = msg.content["config"]
    device, rnd = int(config["device"]), int(config["round"])
    model = Cnn4()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = job.shard(device)
    n = train_device(model, x, y, job.spec, train_seed(job.spec.seed, device, rnd))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": n, "device": device})})
    return Message(content=content, reply_to=msg)


class EdgeflFedAvg(FedAvg):
    """FedAvg with edgefl's draw of devices and edgefl's float64 averaging in its order."""

    def __init__(self, job: PeerJob, events: Events) -> None:
        super().__init__(fraction_train=job.spec.devices_per_round / job.spec.clients,
                         fraction_evaluate=0.0, min_available_nodes=job.spec.clients)
        self.job, self.events = job, events
        self.node_of: list[int] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        rnd = server_round - 1
        if not self.node_of:  # the engine registers its nodes while the ServerApp starts: wait for all,
            # as FedAvg's own sampling does (min_available_nodes, polled every second)
            _, nodes = sample_nodes(grid, self.job.spec.clients, 0)
            self.node_of = sorted(nodes)
            if len(self.node_of) != self.job.spec.clients:
                raise RuntimeError(f"{len(self.node_of)} nodes, expected {self.job.spec.clients}")
        self.events.mark(rnd, "round_begin")
        messages = []
        for device in self.job.sample(rnd):
            config = ConfigRecord({"device": device, "round": rnd, "server-round": server_round})
            record = RecordDict({"arrays": arrays, "config": config})
            messages.append(Message(content=record, dst_node_id=self.node_of[device], message_type=MessageType.TRAIN))
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, errors = self._check_and_log_replies(replies, is_train=True)
        if errors or len(valid) != self.job.spec.devices_per_round:
            raise RuntimeError(f"round {server_round}: {len(valid)} replies, {len(errors)} errors: "
                               + "; ".join(m.error.reason for m in errors))
        # edgefl sums in the order of the sorted device ids (as strings: dev1000 before dev101)
        position = {device: i for i, device in enumerate(self.job.sample(server_round - 1))}
        by_device = sorted(valid, key=lambda m: position[int(m.content["metrics"]["device"])])
        states = [{k: v.numpy() for k, v in m.content["arrays"].to_torch_state_dict().items()} for m in by_device]
        counts = [int(m.content["metrics"]["num-examples"]) for m in by_device]
        folded = fold(states, counts)
        arrays = ArrayRecord(OrderedDict((k, torch.from_numpy(v)) for k, v in folded.items()))
        return arrays, MetricRecord({"num-examples": sum(counts)})


def server_app_for(job: PeerJob, events: Events) -> ServerApp:
    """The ServerApp: initial weights from the job, R rounds, evaluation after the last."""
    app = ServerApp()
    x_test, y_test = job.test_set()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        rnd = server_round - 1
        result = None
        if server_round == job.spec.rounds:
            model = Cnn4()
            model.load_state_dict(arrays.to_torch_state_dict())
            events.result["accuracy"], events.result["test_loss"] = evaluate_model(model, x_test, y_test)
            events.result["weights_sha256"] = digest({k: v.numpy() for k, v in arrays.to_torch_state_dict().items()})
            result = MetricRecord({"accuracy": events.result["accuracy"], "loss": events.result["test_loss"]})
        events.mark(rnd, "round_end")
        return result

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = EdgeflFedAvg(job, events)
        initial = ArrayRecord(OrderedDict((k, torch.from_numpy(v)) for k, v in job.initial_state().items()))
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=job.spec.rounds, evaluate_fn=evaluate)
        events.write()

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True, help="the JobSpec file bench/peer_sim.py wrote")
    p.add_argument("--events", required=True, help="where the round timestamps and accuracy go")
    p.add_argument("--cpus-per-client", type=float, default=2.0, help="Ray num_cpus per ClientApp (Flower's default 2)")
    args = p.parse_args(argv)
    os.environ[JOB_ENV] = os.path.abspath(args.job)
    # the ClientApp from the module, not from __main__: Ray then pickles its functions by reference
    # (each actor imports this module) instead of by value with this process's globals
    import peer_flower_app

    job = job_here()
    events = Events(args.events)
    run_simulation(server_app=server_app_for(job, events), client_app=peer_flower_app.client_app,
                   num_supernodes=job.spec.clients,
                   backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}})
    if not events.path.exists():
        print("the ServerApp did not finish", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
