"""The controller under a burst: N alerts firing at once (then resolved at once) against the real
controller process on loopback.

Each alert is its own webhook (Alertmanager grouping by a per-alert label: the worst case for
the receiver), sent over ``--concurrency`` connections. Measured:
- webhook latency (request sent -> 200 received, the 200 meaning "recorded on disk"): p50,
  p99, max;
- time to converge: first request sent -> ``promreflex_controller_applied_alerts`` reaches N
  (every fire ran and its completion is committed), and back to 0 after the resolved burst;
- the state on disk (SQLite database + WAL) while N alerts are applied;
- the engine alone: the same burst handed to ``Engine.handle_payload`` in this process;
- the conditions: CPU busy/steal, load, the controller's CPU seconds.

    flock /tmp/promreflex-heavy.lock uv run --frozen python -m bench.controller_scale \\
        --out bench/results/controller_scale/summary.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.conditions import HostSampler, describe
from tests.controller_process import ControllerProcess
from tests.payloads import alert, payload

TARGETS = {"converge_s": 5.0, "webhook_p99_ms": 50.0}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def applied(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith('promreflex_controller_applied_alerts{action="log"}'):
                return float(line.split()[-1])
    return float("nan")


async def burst(url: str, alerts: list[dict[str, Any]], concurrency: int, want_applied: int,
                timeout: float) -> dict[str, Any]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    sem = asyncio.Semaphore(concurrency)
    bodies = [json.dumps(payload(a)).encode() for a in alerts]
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency + 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def send(body: bytes) -> None:
            async with sem:
                t0 = time.perf_counter()
                async with session.post(f"{url}/webhook", data=body, headers=headers) as resp:
                    await resp.read()
                latencies.append(time.perf_counter() - t0)
                codes[resp.status] = codes.get(resp.status, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(send(b) for b in bodies))
        answered = time.perf_counter() - start
        deadline = start + timeout
        while await applied(session, url) != want_applied:
            if time.perf_counter() > deadline:
                raise SystemExit(f"not converged to {want_applied} applied within {timeout:.0f}s")
            await asyncio.sleep(0.05)
        converged = time.perf_counter() - start
    return {
        "webhooks": len(bodies), "codes": {str(k): v for k, v in sorted(codes.items())},
        "all_answered_s": round(answered, 3), "converge_s": round(converged, 3),
        "webhook_p50_ms": round(quantile(latencies, 0.50) * 1000, 2),
        "webhook_p99_ms": round(quantile(latencies, 0.99) * 1000, 2),
        "webhook_max_ms": round(max(latencies) * 1000, 2),
        "webhook_mean_ms": round(statistics.fmean(latencies) * 1000, 2),
    }


def disk_bytes(db: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(db.parent.glob(db.name + "*")) if p.is_file()}


async def run(args: argparse.Namespace, concurrency: int, workdir: Path) -> dict[str, Any]:
    """One fresh controller: a firing burst, then a resolved burst of the same alerts."""
    ctl = ControllerProcess(workdir, routes=[{"name": "scale", "matchers": ['alertname="Scale"'], "action": "log"}])
    firing = [alert("Scale", instance=f"host-{n:05d}") for n in range(args.alerts)]
    resolved = [{**a, "status": "resolved", "endsAt": "2026-11-23T10:05:00Z"} for a in firing]
    ctl.start()
    try:
        assert ctl.child is not None
        pid = ctl.child.pid
        with HostSampler(groups={"controller": lambda: [pid]}) as host:
            fire = await burst(ctl.url, firing, concurrency, args.alerts, args.timeout)
            on_disk = disk_bytes(ctl.state_file)
            resolve = await burst(ctl.url, resolved, concurrency, 0, args.timeout)
        conditions = host.summary()
    finally:
        ctl.stop()
    return {
        "client_connections": concurrency,
        "fire": {**fire, "state_on_disk_bytes": on_disk},
        "resolve": resolve,
        "state_after_stop_bytes": disk_bytes(ctl.state_file),
        "met": {"converge_s": fire["converge_s"] < TARGETS["converge_s"],
                "webhook_p99_ms": fire["webhook_p99_ms"] < TARGETS["webhook_p99_ms"]},
        "host": conditions,
    }


async def engine_only(args: argparse.Namespace, concurrency: int, workdir: Path) -> dict[str, Any]:
    """The same firing burst handed straight to the engine in this process (no HTTP, no
    pydantic parsing of bodies): what the engine and its state store cost on their own."""
    from prometheus_client import CollectorRegistry

    from controllers.audit import AuditLog
    from controllers.engine import Engine
    from controllers.metrics import ControllerMetrics
    from controllers.models import WebhookPayload
    from promreflex.config import ControllerConfig, Route

    logging.getLogger("promreflex").setLevel(logging.WARNING)
    cfg = ControllerConfig(audit_log=workdir / "audit.jsonl", state_file=workdir / "state.db", alertmanager_url=None,
                           routes=[Route(name="scale", matchers=['alertname="Scale"'], action="log")])
    engine = Engine(cfg, ControllerMetrics(CollectorRegistry(), ["log"]), AuditLog(cfg.audit_log))
    await engine.start()
    payloads = [WebhookPayload.model_validate(payload(alert("Scale", instance=f"host-{n:05d}")))
                for n in range(args.alerts)]
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(p: WebhookPayload) -> None:
        async with sem:
            t0 = time.perf_counter()
            await engine.handle_payload(p)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in payloads))
    await engine.drain(timeout=args.timeout)
    converged = time.perf_counter() - start
    applied = sum(1 for e in engine.entries.values() if e.applied == "firing")
    await engine.shutdown()
    return {"concurrent_calls": concurrency, "applied": applied, "converge_s": round(converged, 3),
            "handle_p50_ms": round(quantile(latencies, 0.50) * 1000, 2),
            "handle_p99_ms": round(quantile(latencies, 0.99) * 1000, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alerts", type=int, default=5000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64],
                   help="client connections sending webhooks at once; one run (a fresh controller) per value")
    p.add_argument("--timeout", type=float, default=120.0, help="give up converging after this many seconds")
    p.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    args = p.parse_args(argv)
    runs = []
    for concurrency in args.concurrency:
        with tempfile.TemporaryDirectory(prefix="promreflex-scale-") as tmp:
            runs.append(asyncio.run(run(args, concurrency, Path(tmp))))
    with tempfile.TemporaryDirectory(prefix="promreflex-scale-") as tmp:
        engine = asyncio.run(engine_only(args, max(args.concurrency), Path(tmp)))
    result = {
        "runs": runs, "engine_only": engine, "targets": TARGETS,
        "conditions": {
            "alerts": args.alerts, "alerts_per_webhook": 1, "action": "log (to the controller's log, no file)",
            "alertmanager": "none (no pre-fire re-check)", "client": "aiohttp, another process on the same 2 cores",
            "state": "SQLite WAL, one transaction per event-loop iteration, WAL fsynced before answering",
            "cpus": os.cpu_count(), "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        },
        "command": "python -m bench.controller_scale " + " ".join(sys.argv[1:]),
    }
    for r in runs:
        for phase in ("fire", "resolve"):
            f = r[phase]
            print(f"{phase:8s} {f['webhooks']} webhooks over {r['client_connections']:3d} connections: converged in "
                  f"{f['converge_s']:.2f}s (all answered {f['all_answered_s']:.2f}s), webhook p50 "
                  f"{f['webhook_p50_ms']:.1f} ms p99 {f['webhook_p99_ms']:.1f} ms max {f['webhook_max_ms']:.1f} ms, "
                  f"codes {f['codes']}")
        print(f"  state on disk with {args.alerts} applied: {r['fire']['state_on_disk_bytes']}; "
              f"after stop: {r['state_after_stop_bytes']}")
        print(f"  targets {TARGETS}: met {r['met']}")
        print("  conditions:", describe(r["host"]))
    print(f"engine only (no HTTP), {engine['concurrent_calls']} concurrent calls: {engine['applied']} applied in "
          f"{engine['converge_s']:.2f}s, handle_payload p50 {engine['handle_p50_ms']:.1f} ms "
          f"p99 {engine['handle_p99_ms']:.1f} ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(all(r["met"].values()) for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
