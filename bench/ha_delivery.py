"""Alert -> action through a highly available path against the single-host path, side by side.

Arms, each with the real binaries on loopback and the real controller (`log` action):
- ``single``: one Prometheus, one Alertmanager (what `promreflex stack up` runs);
- ``ha``: two Prometheus replicas (``replica`` dropped by ``alert_relabel_configs``) and a 3-peer
  Alertmanager cluster with its default ``--cluster.peer-timeout`` (15 s);
- ``ha-peer-killed``: the same, with Alertmanager peer 0 (the one that notifies first) and
  Prometheus replica ``a`` SIGKILLed before the first flip: the survivors must deliver.

Each arm flips the incident gauge on and off ``--flips`` times at the scrape/evaluation interval
given (``--interval``; users run 15-60 s, the local stack 200 ms - 1 s) and measures, per flip,
gauge flipped -> the controller's fire (and resolve) run, and counts what the controller received:
accepted, duplicate and stale notifications, and lost flips (no run within the deadline).

    uv run python -m bench.ha_delivery [--interval 1s] [--flips 6]

Writes ``bench/results/ha_delivery/summary.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.conditions import HostSampler, describe
from promreflex.config import parse_duration
from promreflex.ha import GaugeSource, HAPath, counts
from promreflex.proc import Timeout, wait_until
from tests.controller_process import ControllerProcess

OUT = Path("bench/results/ha_delivery")
ARMS = {
    "single": {"replicas": 1, "peers": 1, "kill": False},
    "ha": {"replicas": 2, "peers": 3, "kill": False},
    "ha-peer-killed": {"replicas": 2, "peers": 3, "kill": True},
}


def run_times(path: Path, transition: str) -> list[float]:
    if not path.exists():
        return []
    return [r["ts"] for r in map(json.loads, path.read_text().splitlines()) if r["transition"] == transition]


def run_arm(name: str, spec: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    print(f"\n== {name}: {spec['replicas']} Prometheus, {spec['peers']} Alertmanager peer(s), interval {args.interval}",
          flush=True)
    runs = work / name / "runs.jsonl"
    ctl = ControllerProcess(work / name / "controller", routes=[{
        "name": "overload", "matchers": ['alertname="HaTestOverload"'], "action": "log", "params": {"path": str(runs)}}],
        settings={"reconcile_interval": "5s"})
    deadline = 4 * parse_duration(args.interval) + 30 + (30 if spec["kill"] else 0)
    fire: list[float] = []
    resolve: list[float] = []
    lost = 0
    with GaugeSource() as source:
        source.values = {"a": 0.0}
        path = HAPath(work / name / "ha", source.port, f"{ctl.url}/webhook", interval=args.interval,
                      peers=spec["peers"], replicas=spec["replicas"])
        host = HostSampler()
        conditions: dict[str, Any] = {}
        try:
            path.start()
            ctl.alertmanager_url = path.am_urls
            ctl.start()
            if spec["kill"]:
                HAPath.kill(path.alertmanagers[0])
                HAPath.kill(path.prometheus[0])
                print("  killed alertmanager-0 and prometheus-a", flush=True)
            host.start()
            for i in range(args.flips):
                for value, transition, out in ((1.0, "fire", fire), (0.0, "resolve", resolve)):
                    before = len(run_times(runs, transition))
                    t0 = time.time()
                    source.values["a"] = value
                    try:
                        def ran(transition: str = transition, before: int = before) -> bool:
                            return len(run_times(runs, transition)) > before

                        wait_until(ran, timeout=deadline, interval=0.02, what=f"{transition} {i + 1}")
                        out.append(run_times(runs, transition)[before] - t0)
                    except Timeout:
                        lost += 1
                        print(f"  flip {i + 1}: {transition} LOST (nothing within {deadline:.0f} s)", flush=True)
                        continue
                    # Let stragglers (duplicates, late peers) arrive before the next flip.
                    time.sleep(args.settle)
                print(f"  flip {i + 1:>2}/{args.flips}: fire {fire[-1] * 1000 if fire else float('nan'):7.0f} ms   "
                      f"resolve {resolve[-1] * 1000 if resolve else float('nan'):7.0f} ms", flush=True)
            received = counts(ctl.url, "promreflex_controller_notifications_total")
            extra_runs = len(run_times(runs, "fire")) - len(fire) + len(run_times(runs, "resolve")) - len(resolve)
        finally:
            conditions = host.stop()
            ctl.stop()
            path.stop()
    result = {"arm": name, **spec, "interval": args.interval, "flips": args.flips, "fire_s": fire, "resolve_s": resolve,
              "lost": lost, "extra_runs": extra_runs, "received": received, "conditions": describe(conditions)}
    print(f"  received {received}; lost {lost}; runs beyond one per transition {extra_runs}; {describe(conditions)}", flush=True)
    return result


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f}" if values else "-"


def _max_ms(values: list[float]) -> str:
    return f"{max(values) * 1000:.0f}" if values else "-"


def markdown(results: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        "| arm | Prometheus | AM peers | interval | fire median / max ms | resolve median / max ms | notifications accepted / duplicate / stale | lost flips | extra runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rc = r["received"]
        lines.append(
            f"| {r['arm']} | {r['replicas']} | {r['peers']} | {r['interval']} | {_median_ms(r['fire_s'])} / {_max_ms(r['fire_s'])} | "
            f"{_median_ms(r['resolve_s'])} / {_max_ms(r['resolve_s'])} | {rc.get('accepted', 0):.0f} / "
            f"{rc.get('duplicate', 0):.0f} / {rc.get('stale', 0):.0f} | {r['lost']} | {r['extra_runs']} |")
    lines += ["", "Conditions: " + "; ".join(f"{r['arm']}: {r['conditions']}" for r in results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ha_delivery", description=__doc__.split("\n\n")[0])
    p.add_argument("--interval", default="1s", help="scrape and evaluation interval (default %(default)s)")
    p.add_argument("--flips", type=int, default=6, help="incidents per arm (default %(default)s)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait after each run for stragglers")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="promreflex-ha-") as tmp:
        for name in args.arms.split(","):
            results.append(run_arm(name, ARMS[name], args, Path(tmp)))
    command = "uv run python -m bench.ha_delivery " + " ".join(sys.argv[1:] if argv is None else argv)
    md = markdown(results, command.strip())
    print("\n" + md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "summary.md").write_text(md)
    print(f"wrote {args.out / 'summary.json'}, {args.out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
