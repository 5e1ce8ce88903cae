"""The `edgefl` command.

The edge SDK provides `profile` and `client`; other packages add sub-commands
through the `edgefl.commands` entry-point group (the coordinator adds
`simulate` and `coordinator`), so this module never imports them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path

from edge_sdk.command_defaults import DEVICE_COMMANDS
from edge_sdk.networking.not_authorized import NotAuthorized
from edge_sdk.repeat_filter import install_repeat_filter
from edge_sdk.stop_request import StopRequested, stop_on_sigterm
from edge_sdk.version import SDK_VERSION  # pyproject.toml reads it too (tests/edge_sdk/test_version.py)

__all__ = ["main", "build_parser", "DEFAULT_STATE_DIR", "EXIT_INTERRUPTED", "EXIT_TURNED_AWAY", "HelpFormatter",
           "verbosity"]

#: The device's state directory when no config names one (systemd's StateDirectory=edgefl).
DEFAULT_STATE_DIR = "/var/lib/edgefl"
#: Exit statuses (docs/deploy.md, "Exit statuses"): 0 done or stopped (SIGTERM included); 2 a bad
#: config, option or input, or a connection that failed; 3 turned away: the coordinator will not
#: have this device (a method or task it lacks) or the broker's ACL will not let it publish —
#: restarting cannot help (the units' RestartPreventExitStatus=3); 130 Ctrl-C (128 + SIGINT).
EXIT_TURNED_AWAY = 3
EXIT_INTERRUPTED = 130


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        hidden = default is None or default is False or default is argparse.SUPPRESS or default in ((), [], "")
        if not hidden and "%(default)" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


def verbosity(parser: argparse.ArgumentParser) -> None:
    """``-v``/``-vv`` on a sub-command too (``edgefl simulate -v ...``)."""
    parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="more logging (-vv for debug)")


def _profile_transport(args: argparse.Namespace):  # -> MqttTransport | None
    """The broker connection `edgefl profile` measures bandwidth over: a client TOML's
    [broker] table (URL, user, password file, CA), with --broker/--ca-file/... on top."""
    from dataclasses import replace

    from edge_sdk.networking.transport import MqttTransport, TransportConfig

    if args.config is None and args.broker is None:
        return None
    config = TransportConfig(url=args.broker or "mqtt://localhost:1883")
    if args.config is not None:
        from edge_sdk.config import read_toml, transport_from_toml
        config = transport_from_toml(read_toml(args.config), client_id="")
        if args.broker is not None:
            config = replace(config, url=args.broker)
    password = config.password
    if args.password_file is not None:
        password = Path(args.password_file).read_text().strip()
    config = replace(config, client_id=f"{args.name}-profile", password=password,
                     username=args.username or config.username, ca_file=args.ca_file or config.ca_file)
    transport = MqttTransport(config)
    transport.connect()
    return transport


def _profile(args: argparse.Namespace) -> int:
    from edge_sdk.paths import writable_file
    from edge_sdk.profiling import measure_device, save_profile

    if args.config is not None and args.name == DEVICE_COMMANDS.profile_name:
        from edge_sdk.config import read_toml
        args.name = str(read_toml(args.config).get("device_id", args.name))
    if args.device is None:  # the device the client will train on
        from edge_sdk.config import read_toml
        from edge_sdk.device_config import training_device
        args.device = training_device(read_toml(args.config)) if args.config is not None else "auto"
    if args.save:
        writable_file(args.save, "--save")  # before measuring, not after
    transport = _profile_transport(args)
    try:
        profile = measure_device(name=args.name, seconds=args.seconds, transport=transport,
                                 topic=f"edgefl/profile/{args.name}" if transport else None, device=args.device)
    finally:
        if transport is not None:
            transport.close()
    print(json.dumps(profile.to_dict(quality=True), indent=2))
    if profile.quality is not None and profile.quality.busy:
        print(f"warning: this device looked busy while it was measured ({profile.quality.reason}): "
              f"{profile.gflops:.1f} GFLOPS is likely too low; measure again when it is idle (a running "
              "client re-measures by itself: [device] remeasure_every_s)", file=sys.stderr)
    if args.save:
        save_profile(profile, Path(args.save))
        print(f"saved to {args.save}", file=sys.stderr)
    return 0


def _client(args: argparse.Namespace) -> int:
    from edge_sdk.device_config import client_from_toml

    client = client_from_toml(args.config)

    def said(r) -> None:  # one line per round this device trains
        print(f"round {r.round + 1}: trained {r.method} {r.label} on {r.samples} samples in {r.seconds:.1f} s, "
              f"loss {r.loss:.3f}; got {r.bytes_down / 1e6:.2f} MB, sent {r.bytes_up / 1e6:.2f} MB", flush=True)
    client.on_round = said
    print(f"device {client.config.device_id} ({client.profile.name}, {client.profile.gflops:.1f} GFLOPS, "
          f"training on {client.torch_device}, "
          f"{len(client.data)} samples) joining job {client.config.job!r} on {client.config.transport.url}",
          flush=True)
    from edge_sdk.serving.serve_command import serving_thread

    stop_serving = threading.Event()
    serving = serving_thread(args.config, stop_serving)  # [serve]: its model on live readings, meanwhile
    try:
        reason = client.run()
    finally:
        stop_serving.set()
        if serving is not None:
            serving.join(timeout=5)
    if client.turned_away is not None:
        print(f"edgefl client: error: {reason}", file=sys.stderr)
        return EXIT_TURNED_AWAY
    print(f"client finished: {reason}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from edge_sdk.serving.serve_command import server_from_toml

    server = server_from_toml(args.config)
    if server is None:
        raise ValueError(f"{args.config}: no [serve] table: nothing to serve (docs/serving.md)")
    reads = [repr(i.topic) for i in server.config.inputs] + (["its source's unlabelled rows"] if server.rows else [])
    print(f"device {server.device_id} serving on {', '.join(reads)}; predictions on {server.prediction_topic}",
          flush=True)
    stop = threading.Event()
    try:
        server.run(stop)
    finally:
        server.close()
        counts = {**server.counts, **vars(server.builder.counts)} if server.builder else server.counts
        print("served: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v), flush=True)
        if server.labels is not None or server.corrections.taken:
            labelled = {f"labels {k}": v for k, v in vars(server.labels.counts).items() if v and k != "names"} \
                if server.labels is not None else {}
            kept = {f"kept {k}": v for k, v in server.store.added.items() if v}
            print("labelled: " + (", ".join(f"{k} {v}" for k, v in {**labelled, **kept}.items()) or "nothing"),
                  flush=True)
    return 0


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _predict(args: argparse.Namespace) -> int:
    from edge_sdk.inference import OnnxClassifier, default_model_path, load_batch, normalize

    model = args.model
    if model is None:
        state_dir = DEFAULT_STATE_DIR
        if args.config:
            from edge_sdk.config import read_toml

            state_dir = str(read_toml(args.config).get("state_dir", state_dir))
        model = default_model_path(state_dir)
    if (args.mean is None) != (args.std is None):
        raise ValueError("--mean and --std go together")
    try:
        classifier = OnnxClassifier(model, threads=args.threads)
    except ImportError as exc:
        print(f"edgefl predict: error: {exc}", file=sys.stderr)
        return 2
    if not args.show:
        batch = load_batch(sys.stdin.buffer.read() if args.input == "-" else Path(args.input), key=args.key)
    prep = classifier.preprocessing
    if args.show:
        shape = classifier.sample_shape or (prep.input_shape if prep else ())  # a resampling model: any length
        sys.stdout.write(json.dumps({"model": str(model), "input_shape": list(shape),
                                     "dtype": "float32", "inputs": "raw" if prep else "normalised",
                                     "preprocessing": prep.to_dict() if prep else None}) + "\n")
        return 0
    if prep is not None and args.mean is not None:
        raise ValueError(f"{model} normalises raw inputs itself (mean {list(prep.mean)}, std {list(prep.std)}, "
                         "from its metadata): drop --mean/--std")
    if prep is None and args.mean is None and not args.normalised:
        raise ValueError(f"{model} carries no preprocessing (published before edgefl 0.2): pass the --mean and "
                         "--std its training data was normalised with, or --normalised if the inputs already are")
    batch = classifier.as_samples(batch)
    if args.mean is not None:
        batch = normalize(batch, args.mean, args.std)
    predictions = classifier.predict(batch, batch_size=args.batch_size)
    sys.stdout.write(predictions.to_json_lines(top=args.top, labels=prep.classes if prep else ()))
    return 0


class CommandParser(argparse.ArgumentParser):
    """The `edgefl` parsers: no abbreviated options (``--round`` is not ``--rounds``), and a
    sub-command's unknown option is its own error, shown with its own usage."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "edgefl":  # a sub-command: its usage, not the top level's
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="edgefl", description="Resource-adaptive federated learning over MQTT.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"edgefl {SDK_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)

    p = sub.add_parser("profile", help="measure this device (FLOPS, RAM, CPUs, optional bandwidth)",
                       formatter_class=HelpFormatter)
    verbosity(p)
    p.add_argument("--name", default=DEVICE_COMMANDS.profile_name,
                   help="profile name ([A-Za-z0-9_.-]); with --config, the config's device_id")
    p.add_argument("--seconds", type=float, default=DEVICE_COMMANDS.measure_seconds, help="time per micro-benchmark")
    p.add_argument("--device", help="the torch device to measure, the one training will use: auto (a CUDA GPU "
                                    "when torch sees one, else the CPU), cpu, cuda, cuda:N (default: the "
                                    "config's [device] device, else auto)")
    p.add_argument("--config", help="client TOML whose [broker] table (URL, username, password_file, ca_file) "
                                    "to measure bandwidth over")
    p.add_argument("--broker", help="mqtt[s]://host:port to also measure bandwidth to the broker")
    p.add_argument("--ca-file", help="CA certificate that signed the broker's (mqtts://)")
    p.add_argument("--username", help="MQTT username (the device id on an edgefl broker)")
    p.add_argument("--password-file", help="file holding the MQTT password")
    p.add_argument("--save", help="write the profile as JSON (or TOML, by the suffix) to this file")
    p.set_defaults(func=_profile)

    p = sub.add_parser("client", help="run this device in a federation (TOML config)", formatter_class=HelpFormatter)
    verbosity(p)
    p.add_argument("--config", required=True, help="client TOML file (see deploy/raspberrypi/client.toml)")
    p.set_defaults(func=_client)

    p = sub.add_parser("serve", help="run this device's model on live readings from MQTT topics ([serve]; no torch)",
                       formatter_class=HelpFormatter)
    verbosity(p)
    p.add_argument("--config", required=True, help="client TOML with a [serve] table (docs/serving.md)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("predict", help="classify a batch with this device's ONNX model (onnxruntime, no torch)",
                       formatter_class=HelpFormatter)
    verbosity(p)
    p.add_argument("input", nargs="?", default="-",
                   help="batch file (.npy, .npz, JSON array or one sample per line); '-' = stdin (default)")
    p.add_argument("--model", help="ONNX file (default: <state_dir>/model.onnx)")
    p.add_argument("--config", help="client TOML whose state_dir holds model.onnx "
                                    f"(default state_dir: {DEFAULT_STATE_DIR})")
    p.add_argument("--key", help="array name inside an .npz (default: x, x_test, x_train or inputs)")
    p.add_argument("--mean", type=_floats, help="only for a model published before edgefl 0.2 (newer models "
                                                "normalise raw inputs themselves): per-channel means, e.g. 33.3")
    p.add_argument("--std", type=_floats, help="with --mean: per-channel standard deviations, e.g. 78.6")
    p.add_argument("--normalised", action="store_true",
                   help="a model published before edgefl 0.2, fed inputs that are already normalised")
    p.add_argument("--show", action="store_true",
                   help="print what the model expects (input shape, dtype, normalisation, class names) and exit")
    p.add_argument("--top", type=int, default=DEVICE_COMMANDS.predict_top, help="also list the K most likely classes")
    p.add_argument("--threads", type=int, help="onnxruntime intra-op threads")
    p.add_argument("--batch-size", type=int, default=DEVICE_COMMANDS.predict_batch_size,
                   help="samples per onnxruntime run")
    p.set_defaults(func=_predict)

    for ep in entry_points(group="edgefl.commands"):
        try:
            register = ep.load()
        except ImportError as exc:  # coordinator extra not installed on this device
            sub.add_parser(ep.name, help=f"(unavailable: {exc.name} is not installed; "
                                         "pip install 'edgefl[coordinator]')")
            continue
        register(sub)
    return parser


def one_line(exc: BaseException) -> str:
    """An error's message on one line: a multi-line one (e.g. a broker's log) keeps its first line
    and its last non-empty one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(exc).__name__
    return f"{lines[0].rstrip(':')}: ... {lines[-1]}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_repeat_filter()  # a warning that repeats every few seconds: 5 a minute, then a count
    if not hasattr(args, "func"):
        parser.error(f"{args.command} is not available here; pip install 'edgefl[coordinator]'")
    stop_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        print(f"edgefl {args.command}: error: it trains, with torch, which is not installed here: pip install "
              "'edgefl[train]' (a device that only serves runs `edgefl serve`, which needs no torch)", file=sys.stderr)
        return 2
    except NotAuthorized as exc:  # the broker's ACL: a restart cannot help
        print(f"edgefl {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_TURNED_AWAY
    except (OSError, ValueError) as exc:  # files, connections, the embedded broker (BrokerError), bad input
        print(f"edgefl {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except StopRequested:  # SIGTERM: a requested stop, after the same cleanup as Ctrl-C's
        print(f"edgefl {args.command}: stopped (SIGTERM)", file=sys.stderr)
        return 0
    except KeyboardInterrupt:  # whatever cleanup the command does ran on the way out
        print(f"edgefl {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
