"""What one compromised fleet member does to a real job (issue 35): a reproducible attack bench.

    python bench/hostile.py                                  # every attack alone, then the barrage
    python bench/hostile.py --attacks poison,flood --rounds 4
    python bench/hostile.py --table --out bench/results/hostile/before   # the table again, no run

Each scenario is a whole real fleet in a folder of its own (bench/hostile_fleet.py: the shipped
make-certs.sh, add-device.sh, mosquitto.conf, edgefl.acl, coordinator.toml and bundles, with only
paths, port and the settings below changed): a TLS mosquitto on a free loopback port, the real
``edgefl coordinator`` (FedAvg as shipped, ``--rounds`` rounds, seed ``--seed``, round deadline
``--deadline-s``), two honest ``edgefl client`` devices with 1,200 private MNIST digits each, and
``pi-evil`` (bench/hostile_attacks.py) with valid credentials running the scenario's attacks at
the rates its flags fix. ``none`` (no attacker, same seed) runs first in every invocation: the
ratios compare each scenario with that baseline of the same run. When the attacker registers
(poison, heavy_zero, amplify, barrage) the coordinator waits for three devices instead of two, so
that the attacker is in every round from the first. In the barrage the attacks also act on each
other as they would for a real attacker: the flood can drown pi-evil's own poisoned updates, and
its spoofed transfers can evict its own padding transfer (the oldest).

Per scenario it writes ``OUT/<scenario>-s<seed>.json``: final and per-round accuracy, rounds
completed, which honest devices' updates each round aggregated (an honest update missing from a
round, or a round never run, counts as lost), round times, peak RSS of the coordinator and of
mosquitto (VmRSS every 0.2 s), the coordinator's exit status and last log lines, what the
attacker sent (and its real rates) and the bytes the broker sent back to it, client-id takeovers
(did an honest device or the coordinator lose its connection), blame (``incomplete`` errors sent
to honest devices), the git commit and the product files that differed from it. A scenario that
does not end within ``--time-limit-s`` is stopped and recorded as stalled. Then the table:

    target: |accuracy - baseline| <= 1 point, 0 honest updates lost, every round run, coordinator
    RSS <= 1.5x, mosquitto RSS <= 2x, mean round time <= 2x, a takeover refused by the broker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_attacks import ATTACKS, BARRAGE, OPTIONS, REGISTERING  # noqa: E402
from hostile_fleet import ATTACKER, HONEST, ROOT, Fleet, FleetSettings, RssSampler, die_with_parent  # noqa: E402

SCENARIOS = ("none", *ATTACKS, "barrage")
DEFAULT_OUT = ROOT / "bench" / "results" / "hostile"
SHIPPED = ("deploy/homeserver/mosquitto.conf", "deploy/homeserver/edgefl.acl", "deploy/coordinator.toml",
           "deploy/raspberrypi/client.toml")
#: mosquitto 2.0: "New client connected from 127.0.0.1:40000 as pi-kitchen (p5, c1, k30, u'pi-evil')."
CONNECTED = re.compile(r"New client connected from \S+ as (\S+) \(.*u'([^']*)'\)")
TAKEN_OVER = re.compile(r"Client (\S+) already connected, closing old connection")
TARGETS = {"accuracy_points": 1.0, "coordinator_rss": 1.5, "mosquitto_rss": 2.0, "round_time": 2.0}


class Interrupted(Exception):
    """SIGTERM: stop the scenario (its processes are stopped on the way out)."""


def attacks_of(scenario: str) -> tuple[str, ...]:
    """The attacker's attacks in a scenario: none, one, or all of them (barrage)."""
    return () if scenario == "none" else BARRAGE if scenario == "barrage" else (scenario,)


def git_state() -> dict[str, Any]:
    """The commit the product ran at, and the product files that differed from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = git("status", "--porcelain", "--", "coordinator", "edge_sdk", "deploy", "profiles").splitlines()
    return {"commit": git("rev-parse", "HEAD").strip(), "dirty_product_files": [line[3:] for line in dirty],
            "shipped_sha256": {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest()[:16] for p in SHIPPED}}


# --------------------------------------------------------------------------- one scenario


def run_scenario(scenario: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Set up the fleet, run the job (with the attacker), stop everything, read what happened."""
    attacks = attacks_of(scenario)
    registers = bool(REGISTERING & set(attacks))
    settings = FleetSettings(rounds=args.rounds, seed=args.seed, round_deadline_s=args.deadline_s,
                             register_timeout_s=args.register_timeout_s, min_devices=len(HONEST) + registers)
    fleet = Fleet(folder, settings)
    sampler = RssSampler(fleet.processes)
    stats = folder / "attacker.json"
    started = time.monotonic()
    ending = "finished"
    try:
        fleet.prepare()
        fleet.start_broker()
        sampler.start()
        fleet.start_coordinator()
        if attacks:
            steal = [fleet.device_client_id(HONEST[0]), fleet.coordinator_client_id()]
            argv = [sys.executable, str(Path(__file__).parent / "hostile_attacks.py"), "--attacks", ",".join(attacks),
                    "--bundle", str(folder / ATTACKER), "--stats", str(stats), "--job", "home",
                    "--method", _toml_value(fleet.coordinator_toml, "method") or "fedavg",
                    "--honest", ",".join(HONEST), "--steal-ids", ",".join(steal),
                    "--max-seconds", str(args.time_limit_s + 60)]
            for name, _, _ in OPTIONS:
                if name != "max_seconds":
                    argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            fleet.processes.start("attacker", argv, fleet.log("attacker"), fleet.env())
        fleet.start_devices()
        ending = _wait_for_job(fleet, started + args.time_limit_s)
    finally:
        sampler.sample()
        procs = fleet.processes.procs
        # exit statuses before the bench stopped anything (None: still running then)
        exits = {name: procs[name].poll() for name in ("coordinator", "attacker") if name in procs}
        fleet.processes.stop_all()
        sampler.stop()
        if "coordinator" in procs:  # what it exited with once stopped (a stalled one: after SIGINT)
            exits["coordinator_after_stop"] = procs["coordinator"].returncode
    wall = time.monotonic() - started
    return _result(scenario, fleet, sampler, stats, ending, exits, wall, args)


def _toml_value(path: Path, key: str) -> str | None:
    from edge_sdk.config import read_toml

    value = read_toml(path).get(key)
    return None if value is None else str(value)


def _wait_for_job(fleet: Fleet, deadline: float) -> str:
    """Until the coordinator exits (then up to 20 s for the devices to finish), the broker dies
    or the time limit passes: ``finished``, ``crashed`` (non-zero exit), ``broker_died`` or ``stalled``."""
    procs = fleet.processes.procs
    while time.monotonic() < deadline:
        if procs["mosquitto"].poll() is not None:
            return "broker_died"
        rc = procs["coordinator"].poll()
        if rc is not None:
            fleet.processes.stop("attacker")
            end = min(deadline, time.monotonic() + 20)
            while time.monotonic() < end and any(procs[n].poll() is None for n in HONEST):
                time.sleep(0.2)
            return "finished" if rc == 0 else "crashed"
        time.sleep(0.2)
    return "stalled"


def _rounds_from(folder: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """report.json (written even when the job was interrupted), else the checkpoint's rounds."""
    report_path = folder / "coordinator" / "report" / "report.json"
    if report_path.exists():
        report = json.loads(report_path.read_text())
        return report, report.get("rounds", [])
    from coordinator.runtime.state import load_checkpoint

    try:
        checkpoint = load_checkpoint(folder / "coordinator" / "checkpoint")
    except Exception:  # a checkpoint torn by a killed coordinator: nothing to read
        checkpoint = None
    return None, (checkpoint.rounds if checkpoint is not None else [])


def _log(fleet: Fleet, name: str) -> str:
    path = fleet.log(name)
    return path.read_text(errors="replace") if path.exists() else ""


def _tail(text: str, lines: int = 15) -> list[str]:
    clean = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return [line[:400] for line in clean.splitlines() if line.strip()][-lines:]


def _takeovers(broker_log: str, coordinator_id: str) -> dict[str, Any]:
    """Connections the broker accepted under an honest client id with pi-evil's username, and
    connections it closed because another came with the same id."""
    honest_ids = {*HONEST, coordinator_id}
    stolen = [cid for cid, user in CONNECTED.findall(broker_log) if user == ATTACKER and cid in honest_ids]
    closed = [cid for cid in TAKEN_OVER.findall(broker_log) if cid in honest_ids]
    return {"stolen_connections_accepted": {cid: stolen.count(cid) for cid in sorted(set(stolen))},
            "old_connections_closed": {cid: closed.count(cid) for cid in sorted(set(closed))}}


def _result(scenario: str, fleet: Fleet, sampler: RssSampler, stats: Path, ending: str,
            exits: dict[str, int | None], wall: float, args: argparse.Namespace) -> dict[str, Any]:
    report, rounds = _rounds_from(fleet.folder)
    per_round = []
    for r in rounds:
        accuracy = next(iter(r.get("accuracy", {}).values()), None)
        per_round.append({"round": r["round"], "accuracy": accuracy, "host_seconds": round(r["host_seconds"], 2),
                          "accepted": r["participants"], "aggregated": r["aggregated"],
                          "honest_accepted": [d for d in HONEST if d in r["participants"]]})
    honest_accepted = sum(len(r["honest_accepted"]) for r in per_round)
    final = None
    if report is not None and report.get("final", {}).get("accuracy"):
        final = next(iter(report["final"]["accuracy"].values()))
    elif per_round and per_round[-1]["accuracy"] is not None:
        final = per_round[-1]["accuracy"]
    coordinator_log = _log(fleet, "coordinator")
    broker_log = _log(fleet, "mosquitto")
    device_logs = {name: _log(fleet, name) for name in HONEST}
    lost_connection = {name: text.count("disconnected from broker")
                       for name, text in {**device_logs, "coordinator": coordinator_log}.items()}
    coordinator_id = fleet.coordinator_client_id()
    attacker = json.loads(stats.read_text()) if stats.exists() else None
    return {
        "bench": "hostile", "schema": 1, "scenario": scenario, "attacks": list(attacks_of(scenario)),
        "seed": args.seed, "run_id": args.run_id, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": args.git,
        "settings": {"rounds": args.rounds, "round_deadline_s": args.deadline_s,
                     "register_timeout_s": args.register_timeout_s, "time_limit_s": args.time_limit_s,
                     "min_devices": fleet.settings.min_devices, "changed_from_shipped": fleet.changes,
                     "honest_devices": list(HONEST), "coordinator_client_id": coordinator_id},
        "outcome": {"ending": ending, "report_status": report.get("status") if report else None,
                    "coordinator_exit": exits.get("coordinator"),
                    "coordinator_exit_after_stop": exits.get("coordinator_after_stop"), "wall_s": round(wall, 1),
                    # an attacker that exited on its own before the end failed (its log says why)
                    "attacker_failed": exits.get("attacker") not in (None, 0),
                    "attacker_log_tail": _tail(_log(fleet, "attacker"), 8),
                    "coordinator_log_tail": _tail(coordinator_log), "mosquitto_log_tail": _tail(broker_log, 8)},
        "accuracy": {"final": final, "per_round": [r["accuracy"] for r in per_round]},
        "rounds_completed": len(per_round),
        "rounds": per_round,
        "honest_updates_lost": len(HONEST) * args.rounds - honest_accepted,
        "mean_round_s": round(statistics.fmean(r["host_seconds"] for r in per_round), 2) if per_round else None,
        "rss_peak_mb": dict(sampler.peak_mb),
        "cpu_s": dict(sampler.cpu_s),  # CPU seconds per process over the scenario (at its last sample)
        "rejections": report.get("rejection_count") if report else None,
        "connections_lost": lost_connection,
        "takeover": _takeovers(broker_log, coordinator_id),
        "blamed_honest": {name: text.count("coordinator error incomplete") for name, text in device_logs.items()},
        "attacker": attacker,
    }


# --------------------------------------------------------------------------- the table


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def verdicts(result: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The scenario against its baseline: each figure of the targets and whether it is met."""
    acc, base_acc = result["accuracy"]["final"], base["accuracy"]["final"]
    diff = None if acc is None or base_acc is None else 100 * (acc - base_acc)
    rss, base_rss = result["rss_peak_mb"], base["rss_peak_mb"]
    coord = _ratio(rss.get("coordinator"), base_rss.get("coordinator"))
    mosq = _ratio(rss.get("mosquitto"), base_rss.get("mosquitto"))
    rounds = _ratio(result["mean_round_s"], base["mean_round_s"])
    lost = sum(result["connections_lost"].values()) - sum(base["connections_lost"].values())
    refused = None
    tried = any(h.get("connects") or h.get("attempts") for h in ((result.get("attacker") or {}).get("takeover") or {}).values())
    if "takeover" in result["attacks"] and tried:  # not measured when the attacker never tried
        refused = lost <= 0 and not any(result["takeover"]["old_connections_closed"].values())
    checks = {
        "finished": result["outcome"]["ending"] == "finished" and result["outcome"]["coordinator_exit"] == 0,
        "accuracy": diff is not None and abs(diff) <= TARGETS["accuracy_points"],
        "honest_lost": result["honest_updates_lost"] == 0,
        "rounds": result["rounds_completed"] == result["settings"]["rounds"],
        "no_blame": sum(result["blamed_honest"].values()) <= sum(base["blamed_honest"].values()),
        "coordinator_rss": coord is not None and coord <= TARGETS["coordinator_rss"],
        "mosquitto_rss": mosq is not None and mosq <= TARGETS["mosquitto_rss"],
        "round_time": rounds is not None and rounds <= TARGETS["round_time"],
    }
    if refused is not None:
        checks["takeover_refused"] = refused
    return {"accuracy_diff_points": diff, "coordinator_rss_x": coord, "mosquitto_rss_x": mosq,
            "round_time_x": rounds, "takeover_refused": refused, "checks": checks,
            "failed": [k for k, ok in checks.items() if not ok]}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict[str, Any]]) -> str:
    """Each scenario against the ``none`` baseline of the same run (else of the same seed)."""
    bases = {(r["run_id"], r["seed"]): r for r in results if r["scenario"] == "none"}
    by_seed = {r["seed"]: r for r in results if r["scenario"] == "none"}
    head = ("scenario", "acc", "Δ pts", "rounds", "honest lost", "coord MB", "×", "mosq MB", "×", "round s", "×",
            "takeover refused", "blamed", "exit", "back MB", "fails")
    rows = [head]
    ordered = sorted(results, key=lambda r: SCENARIOS.index(r["scenario"]) if r["scenario"] in SCENARIOS else 99)
    for r in ordered:
        base = bases.get((r["run_id"], r["seed"])) or by_seed.get(r["seed"])
        v = verdicts(r, base) if base is not None else None
        back = (r.get("attacker") or {}).get("back", {}).get("bytes")
        refused = "-" if v is None or v["takeover_refused"] is None else ("yes" if v["takeover_refused"] else "NO")
        rows.append((
            r["scenario"], _fmt(r["accuracy"]["final"], ".3f"), _fmt(v and v["accuracy_diff_points"], "+.1f"),
            f"{r['rounds_completed']}/{r['settings']['rounds']}", str(r["honest_updates_lost"]),
            _fmt(r["rss_peak_mb"].get("coordinator"), ".0f"), _fmt(v and v["coordinator_rss_x"], ".2f"),
            _fmt(r["rss_peak_mb"].get("mosquitto"), ".1f"), _fmt(v and v["mosquitto_rss_x"], ".2f"),
            _fmt(r["mean_round_s"], ".1f"), _fmt(v and v["round_time_x"], ".2f"), refused,
            str(sum(r["blamed_honest"].values())),
            f"{r['outcome']['ending']}({r['outcome']['coordinator_exit']})",
            _fmt(back / 1e6 if back is not None else None, ".1f"),
            "-" if v is None or r["scenario"] == "none" else
            ("ATTACKER FAILED (see its log tail); " if r["outcome"].get("attacker_failed") else "")
            + (",".join(v["failed"]) or "none")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    t = TARGETS
    rates = []
    for r in ordered:
        sent = (r.get("attacker") or {}).get("sent", {})
        each = [f"{name} {s['messages']} msgs at {s['messages_per_s']:g}/s, {s['bytes_per_s'] / 1e6:.2f} MB/s"
                for name, s in sent.items() if name in ATTACKS and s["messages"]]
        if each:
            rates.append(f"  {r['scenario']}: " + "; ".join(each))
    if rates:
        lines += ["", "attacker (achieved rates, over the time each attack was sending):", *rates]
    lines.append(f"targets: coordinator exits 0 (finished), |Δ| <= {t['accuracy_points']:g} point, 0 honest updates lost, every round, coordinator "
                 f"RSS <= {t['coordinator_rss']:g}x, mosquitto <= {t['mosquitto_rss']:g}x, round time <= "
                 f"{t['round_time']:g}x, takeover refused, no honest device blamed (blamed: `incomplete` errors "
                 "sent to honest devices); × = against 'none' of the same run")
    return "\n".join(lines)


def load_results(out: Path) -> list[dict[str, Any]]:
    results = []
    for path in sorted(out.glob("*-s*.json")):
        data = json.loads(path.read_text())
        if data.get("bench") == "hostile":
            results.append(data)
    return results


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attacks", default=",".join(SCENARIOS[1:]),
                   help=f"scenarios to run after the 'none' baseline, of {', '.join(SCENARIOS[1:])} "
                        "(default: all of them)")
    p.add_argument("--seed", type=int, default=0, help="the coordinator's seed (default 0)")
    p.add_argument("--rounds", type=int, default=8, help="rounds of the job (default 8)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON results (default %(default)s)")
    p.add_argument("--table", action="store_true", help="print the table of the JSONs in --out, run nothing")
    p.add_argument("--deadline-s", type=float, default=15.0, help="round deadline (shipped: 900; default 15)")
    p.add_argument("--register-timeout-s", type=float, default=60.0, help="registration timeout (default 60)")
    p.add_argument("--time-limit-s", type=float, default=None,
                   help="a scenario still running after this is stopped and recorded as stalled "
                        "(default: 120 + rounds x (deadline + 10))")
    p.add_argument("--workdir", type=Path, default=None, help="where the fleets' folders go (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the fleets' folders (logs, configs, reports)")
    p.add_argument("--checkout", metavar="REV", default=None,
                   help="measure the product at git revision REV (a clone of it in the work dir, this "
                        "bench's files copied in) instead of this working tree")
    attacker = p.add_argument_group("attacker (bench/hostile_attacks.py; its defaults)")
    from hostile_attacks import AttackConfig

    defaults = AttackConfig((), "", "", "", "")
    for name, kind, text in OPTIONS:
        if name != "max_seconds":
            attacker.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(defaults, name),
                                  help=f"{text} (default {getattr(defaults, name)})")
    args = p.parse_args(argv)
    args.scenarios = [s for s in args.attacks.split(",") if s]
    if unknown := set(args.scenarios) - set(SCENARIOS):
        p.error(f"unknown attacks {sorted(unknown)}; known: {', '.join(SCENARIOS[1:])}")
    if args.time_limit_s is None:
        args.time_limit_s = 120 + args.rounds * (args.deadline_s + 10)
    return args


def run_at_revision(rev: str, argv: list[str], workdir: Path, out: Path) -> int:
    """Clone this repository at ``rev`` into ``workdir``, copy the bench in, and run it there
    (with that product on PYTHONPATH); the results still go to ``out``."""
    clone = workdir / "product"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "--detach", rev], check=True)
    for path in Path(__file__).parent.glob("hostile*.py"):
        shutil.copy2(path, clone / "bench" / path.name)
    rest, skip = [], False
    for arg in argv:  # the same flags, without --checkout, with absolute --out and --workdir
        if skip or arg == "--checkout" or arg.startswith("--checkout="):
            skip = arg == "--checkout"
            continue
        rest.append(arg)
    rest += ["--out", str(out.resolve()), "--workdir", str(workdir / "fleets")]
    env = dict(os.environ, PYTHONPATH=str(clone))
    # the bench there gets SIGTERM if this one dies, and stops its fleet in order either way
    inner = subprocess.Popen([sys.executable, str(clone / "bench" / "hostile.py"), *rest], env=env,
                             preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    try:
        return inner.wait()
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached it too: let it stop its fleet
        try:
            return inner.wait(60)
        except subprocess.TimeoutExpired:
            inner.kill()
            return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored (`cmd &`)
    if args.table:
        results = load_results(args.out)
        print(table(results) if results else f"no results in {args.out}")
        return 0
    if args.checkout:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edgefl-hostile-"))
        try:
            return run_at_revision(args.checkout, argv, workdir, args.out)
        except KeyboardInterrupt:
            return 130
        finally:
            if not args.keep and args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    args.run_id, args.git = uuid.uuid4().hex[:12], git_state()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edgefl-hostile-"))
    args.out.mkdir(parents=True, exist_ok=True)

    def on_term(*_: object) -> None:
        raise Interrupted()
    signal.signal(signal.SIGTERM, on_term)
    started, results = time.monotonic(), []
    try:
        for scenario in ["none", *[s for s in args.scenarios if s != "none"]]:
            t0 = time.monotonic()
            print(f"[{time.monotonic() - started:6.0f} s] {scenario}: running (folder {workdir / scenario})", flush=True)
            result = run_scenario(scenario, args, workdir / scenario)
            path = args.out / f"{scenario}-s{args.seed}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            results.append(result)
            print(f"[{time.monotonic() - started:6.0f} s] {scenario}: {result['outcome']['ending']}, "
                  f"accuracy {_fmt(result['accuracy']['final'], '.3f')}, {result['rounds_completed']} rounds, "
                  f"{time.monotonic() - t0:.0f} s -> {path}", flush=True)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted: every process of the scenario was stopped", file=sys.stderr)
        return 130
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{len(results)} scenarios in {time.monotonic() - started:.0f} s (commit {args.git['commit'][:10]}"
          f"{', product files changed: ' + ', '.join(args.git['dirty_product_files']) if args.git['dirty_product_files'] else ''})\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
