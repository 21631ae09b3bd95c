"""The paper's basic experiment on the simulated mesh.

Visitors arrive at a fixed rate (open loop, as the paper's Locust users did not slow down with
the shop), sign in, add and remove a cart item 1, 2, 5, 10 and 15 times, then order. For each
round-trip count: the order service's maximum response time (every request it received, as
its own sidecar and its callers' sidecars logged it), the cart service's, and the CPU of the
cart database process (1 s samples from /proc: maximum and mean).

Paper (Sock Shop on K3s + Istio, 2 vCPU VMs): the order service's maximum response time rose by
1395 ms from 1 to 15 round trips; carts-db CPU went from 25.7 % to 84.1 %.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.rca.logs import read_records
from bench.rca.mesh import Mesh
from bench.rca.procstats import read_usage

ROUNDTRIPS = (1, 2, 5, 10, 15)
PAPER: dict[str, Any] = {"order_max_increase_ms": 1395.0, "carts_db_cpu_pct": {1: 25.7, 15: 84.1}}
WATCH = ("orders", "carts", "carts-db")


def service_max_latency(mesh: Mesh, service: str, t0: float, t1: float) -> float | None:
    """Largest duration of the requests ``service`` received in [t0, t1), from every sidecar."""
    worst = None
    for s in mesh.services:
        for r in read_records(mesh.log_path(s), mesh.log_format_of(s)):
            if not t0 <= r.start < t1:
                continue
            if (s == service and r.inbound) or r.destination == service:
                worst = r.duration_s if worst is None else max(worst, r.duration_s)
    return worst


def run_level(mesh: Mesh, roundtrips: int, duration_s: float, rate: float, think_ms: float, progress=print) -> dict[str, Any]:
    out = mesh.workdir / f"load-basic-{roundtrips}.json"
    t0 = time.time()
    load = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "bench.rca.load", "--url", mesh.url("front-end"), "--duration", str(duration_s),
         "--rate", str(rate), "--users", "16", "--roundtrips", str(roundtrips), "--think-ms", str(think_ms),
         "--out", str(out)],
        start_new_session=True,
    )
    samples: dict[str, list[float]] = {s: [] for s in WATCH}
    try:
        prev = {s: read_usage(mesh.pid(s)).cpu_seconds for s in WATCH}
        prev_t = time.monotonic()
        while load.poll() is None:
            time.sleep(1.0)
            now = time.monotonic()
            for s in WATCH:
                used = read_usage(mesh.pid(s)).cpu_seconds
                samples[s].append((used - prev[s]) / (now - prev_t) * 100)
                prev[s] = used
            prev_t = now
        load.wait(timeout=duration_s + 60)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    t1 = time.time()
    stats = json.loads(out.read_text())
    # The last sample may straddle the end of the load; drop it.
    cpu = {s: v[:-1] or v for s, v in samples.items()}
    row = {
        "roundtrips": roundtrips,
        "flows": stats["flows"],
        "requests": stats["requests"],
        "errors": stats["errors"],
        "flows_per_s": stats["flows"] / stats["elapsed_s"],
        "orders_max_s": service_max_latency(mesh, "orders", t0, t1),
        "carts_max_s": service_max_latency(mesh, "carts", t0, t1),
        "client_order_max_s": stats["by_name"].get("order", {}).get("max_s"),
        "cpu_pct": {s: {"max": max(v), "mean": statistics.fmean(v)} for s, v in cpu.items() if v},
    }
    progress(f"  round trips {roundtrips:>2}: {row['flows']} orders, orders max {row['orders_max_s'] * 1000:.0f} ms, "
             f"carts max {row['carts_max_s'] * 1000:.0f} ms, carts-db CPU max {row['cpu_pct']['carts-db']['max']:.1f} %")
    return row


def run_basic(workdir: Path, *, duration_s: float = 20.0, rate: float = 6.0, think_ms: float = 0.0,
              roundtrips: tuple[int, ...] = ROUNDTRIPS, progress=print) -> dict[str, Any]:
    progress(f"== basic experiment: cart round trips {', '.join(map(str, roundtrips))}; open loop, {rate:g} orders/s "
             f"(Poisson), think {think_ms:g} ms, {duration_s:g} s each")
    with Mesh(workdir / "mesh-basic", exporter=False) as mesh:
        rows = [run_level(mesh, n, duration_s, rate, think_ms, progress) for n in roundtrips]
    return {"duration_s": duration_s, "rate": rate, "think_ms": think_ms, "rows": rows, "paper": PAPER}


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    base = rows[0]["orders_max_s"]
    lines = [
        f"{'round trips':>11} {'orders/s':>9} {'orders max':>11} {'vs first':>9} {'carts max':>10} "
        f"{'carts-db CPU max':>17} {'mean':>6}   paper",
    ]
    for r in rows:
        paper = ""
        if r["roundtrips"] in PAPER["carts_db_cpu_pct"]:
            paper = f"carts-db CPU {PAPER['carts_db_cpu_pct'][r['roundtrips']]} %"
        if r["roundtrips"] == 15:
            paper += f", orders max +{PAPER['order_max_increase_ms']:.0f} ms"
        cpu = r["cpu_pct"]["carts-db"]
        lines.append(
            f"{r['roundtrips']:>11} {r['flows_per_s']:>9.1f} {r['orders_max_s'] * 1000:>9.0f}ms "
            f"{(r['orders_max_s'] - base) * 1000:>+7.0f}ms {r['carts_max_s'] * 1000:>8.0f}ms "
            f"{cpu['max']:>16.1f}% {cpu['mean']:>5.1f}%   {paper}"
        )
    return "\n".join(lines)
