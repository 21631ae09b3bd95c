"""What the local stack costs the host it guards, idle: CPU per component at each
``stack.fast_interval`` (the scrape and rule-evaluation interval of the jobs the controllers
depend on), side by side in alternating rounds.

The stack runs beside the shop it guards ("Guard a shop you already run"): on a small host the
guard's own Prometheus, which scrapes and evaluates the copy guard's rules every 200 ms by
default, takes CPU the shop would use (and that calibration then measures as the shop's).

    uv run --frozen python -m bench.stack_cost --lock /tmp/promreflex-heavy.lock --out bench/results/stack_cost

Each round starts the stack (every component, the embedded default routes, free loopback ports,
a state directory of its own) once per interval, waits ``--warmup`` seconds, measures each
component's CPU (user + system, its process tree) over ``--seconds``, and stops it.
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

from bench.conditions import HostSampler, describe, heavy_lock, write_result
from promreflex.config import load_config, ports_model
from promreflex.proc import free_port
from promreflex.stack import Stack


def run_once(interval: str, warmup: float, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="promreflex-stack-cost-") as tmp:
        ports = {name: free_port() for name in ports_model().model_fields}
        cfg = load_config(None, {"stack.state_dir": tmp, "stack.ports": ports, "stack.fast_interval": interval})
        stack = Stack(cfg)
        stack.up(progress=lambda _: None)
        try:
            time.sleep(warmup)
            pids = {name: info["pid"] for name, info in stack.record().get("components", {}).items()}
            groups = {name: (lambda pid=pid: [pid]) for name, pid in pids.items()}
            with HostSampler(groups=groups) as host:
                time.sleep(seconds)
            s = host.summary()
        finally:
            stack.down(quiet=True)
    return {"interval": interval, "cores": {g: v["cores"] for g, v in s["groups"].items()},
            "total": round(sum(v["cores"] for v in s["groups"].values()), 3), "conditions": describe(s)}


def table(runs: list[dict[str, Any]], intervals: list[str]) -> str:
    names = sorted({n for r in runs for n in r["cores"]}, key=lambda n: (n != "prometheus", n))
    head = ["fast_interval", *names, "total", "rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for iv in intervals:
        mine = [r for r in runs if r["interval"] == iv]

        def cell(values: list[float]) -> str:
            return f"{statistics.mean(values):.2f}" + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")

        cells = [cell([r["cores"].get(n, 0.0) for r in mine]) for n in names]
        lines.append("| " + " | ".join([iv, *cells, cell([r["total"] for r in mine]), str(len(mine))]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="200ms,1s", help="stack.fast_interval values, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after the stack is up, not measured")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds measured per run")
    ap.add_argument("--lock", type=Path, default=None, help="the heavy-job lock (flock), held per run")
    ap.add_argument("--out", type=Path, default=None, help="folder for summary.md and summary.json")
    a = ap.parse_args(argv)
    intervals = [iv.strip() for iv in a.intervals.split(",") if iv.strip()]
    runs: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    total = a.rounds * len(intervals)
    for r in range(a.rounds):
        order = intervals if r % 2 == 0 else list(reversed(intervals))  # alternate: fair to every arm
        for iv in order:
            print(f"[{len(runs) + 1}/{total}] round {r + 1}, fast_interval {iv}: up, {a.warmup:g}s warm-up, "
                  f"{a.seconds:g}s measured", flush=True)
            with heavy_lock(a.lock):
                run = run_once(iv, a.warmup, a.seconds)
            run["round"] = r + 1
            runs.append(run)
            print(f"    total {run['total']:.2f} cores; prometheus {run['cores'].get('prometheus', 0):.2f}; "
                  f"{run['conditions']}", flush=True)
    text = (f"# The idle stack's CPU per component ({started})\n\n"
            f"Command: `uv run --frozen python -m bench.stack_cost {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
            f"Cores used (CPU seconds per second of wall time; mean of the rounds, min-max), each component's "
            f"process tree, the stack idle (no visitor), {a.warmup:g}s after start, over {a.seconds:g}s; rounds "
            f"alternate the order of the intervals.\n\n" + table(runs, intervals) + "\n\nConditions per run:\n\n"
            + "\n".join(f"- round {r['round']}, {r['interval']}: {r['conditions']}" for r in runs) + "\n")
    print("\n" + table(runs, intervals))
    if a.out is not None:
        rc = write_result(a.out / "summary.md", text)
        return rc or write_result(a.out / "summary.json", json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
