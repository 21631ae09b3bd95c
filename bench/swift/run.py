"""The Swift sweep and the injections, against a running lab (``promreflex swift-lab up``).

    python -m bench.swift sweep  [--sizes 1,1024,1048576] [--levels 1,2,...,256] [--lock PATH]
    python -m bench.swift inject [--lock PATH]
    python -m bench.swift report                     # summary.{json,md} + plots from what ran

``sweep``: for each size, each concurrency level, PUT then GET (the GETs read the objects that
level's PUTs wrote) with python-swiftclient inside the client namespace (bench/swift/client.py),
``count = max(64, 2 x level)`` objects (1 MB: ``max(32, level)``), at most ``--deadline`` seconds
per run. Fresh captures on every node for each run, analysed by the capture exporter
(``exporters.swift.analyze``) into the per-node breakdown (bench/swift/attribution.py).

``inject``: side by side, alternating baseline and treatment rounds:
- slow object server: ``--delay-ms`` (50) on s2's object server (WSGI middleware) for 1 KB PUTs
  and GETs at concurrency 4. Expected: s2's processing grows by the delay, no other node's does.
- slow link: a token bucket (``tbf rate --rate``, 40 Mbit/s) on the bridge port into s1 for 1 MB
  PUTs at concurrency 1. Expected: the proxy->s1 hop grows by about the serialization time of the
  object at that rate (1 MiB / 40 Mbit/s = 210 ms), no node's processing and no other hop does.

Every run appends one JSON line to ``<work>/levels.jsonl`` or ``<work>/inject.jsonl`` (the work
directory defaults to ``.promreflex/bench-swift``), so a sweep can run in chunks (one size per
heavy-lock hold, each under ten minutes) and ``report`` gathers them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.conditions import HostSampler, describe, heavy_lock
from bench.swift.attribution import analyze_dir
from exporters.swift.lab import AUTH_KEY, AUTH_USER, ROLES_FILE, SwiftLab
from promreflex.errors import UserError

SIZES = (1, 1024, 1024 * 1024)
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "swift"
WORK = Path(".promreflex/bench-swift")


def count_for(size: int, level: int) -> int:
    return max(32, level) if size >= 1024 * 1024 else max(64, 2 * level)


def size_name(size: int) -> str:
    return "1 MB" if size >= 1024 * 1024 else "1 KB" if size >= 1024 else f"{size} B"


def client_pids(lab: SwiftLab) -> list[int]:
    from exporters.swift.lab import netns_pids

    return netns_pids(lab.node("client").namespace)


def swift_pids(lab: SwiftLab) -> list[int]:
    return [p.pid for p in (lab.state.procs if lab.state else []) if p.kind in ("server", "memcached")]


def draw_one(b: Any, path: Path, op: str) -> str | None:
    """A timing diagram (the paper's Fig. 15/16) of one object request of this run: the third
    one the proxy answered (past the first connections' set-up). Returns its transaction id."""
    from exporters.swift.diagram import draw

    served = sorted((x for x in b.exchanges if x.side == "server" and b.nodes[x.node] == "proxy"
                     and x.path_kind == "object" and x.method == op.upper() and x.trans_id), key=lambda x: x.req_start)
    if not served:
        return None
    tid: str = served[min(2, len(served) - 1)].trans_id
    draw(b, path, trans_id=tid, acks=False)
    return tid


def one_run(lab: SwiftLab, op: str, size: int, level: int, count: int, container: str, deadline: float,
            tag: str, keep_captures: bool = False, diagram: Path | None = None) -> dict[str, Any]:
    """One client run with fresh captures, analysed. Returns the client's figures + the breakdown;
    ``diagram``: also draw one of its requests there."""
    subdir = f"bench-captures/{tag}"
    # Start from a settled proxy: a level that overloaded it leaves work queued, or memcached
    # error-limited (every token rejected for 60 s).
    t_settle = time.monotonic()
    while not lab.healthy() and time.monotonic() - t_settle < 120:
        time.sleep(2)
    lab.start_captures(subdir)
    with HostSampler(groups={"swift": lambda: swift_pids(lab), "client": lambda: client_pids(lab)}) as host:
        out = lab.run_in_client(["-m", "bench.swift.client", "--auth", lab.auth_url, "--user", AUTH_USER,
                                 "--key", AUTH_KEY, "--op", op, "--size", str(size), "--concurrency", str(level),
                                 "--count", str(count), "--deadline", str(deadline), "--container", container],
                                timeout=deadline + 200, what=f"{op} {size_name(size)} x{level}")
    time.sleep(0.3)  # the last ACKs and FINs
    lab.stop_captures()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if "error" in result:
        raise UserError(f"bench.swift: the client failed: {result['error']}")
    t0 = time.process_time()
    t_wall = time.monotonic()
    b, view = analyze_dir(lab.dir / subdir, lab.dir / ROLES_FILE, [n.name for n in lab.nodes])
    view["analysis_cpu_s"] = round(time.process_time() - t0, 3)
    view["analysis_wall_s"] = round(time.monotonic() - t_wall, 3)
    if diagram is not None:
        view["diagram"] = {"file": diagram.name, "trans_id": draw_one(b, diagram, op)}
    if not keep_captures:
        shutil.rmtree(lab.dir / subdir, ignore_errors=True)
    result["breakdown"] = view
    result["conditions"] = host.summary()
    return result


def _append(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _progress(r: dict[str, Any], extra: str = "") -> None:
    b = r["breakdown"]
    proc = " ".join(f"{k} {v:.1f}" for k, v in b["processing_ms"].items() if v is not None)
    lat = r["latency_s"]
    p50 = f"{lat['p50'] * 1e3:.1f}" if lat["p50"] is not None else "-"
    print(f"  {r['op'].upper():<3} {size_name(r['size']):>5} x{r['concurrency']:<4} {r['completed']:>4}/"
          f"{r['attempted']:<4} {r['throughput']:>8.1f}/s  retries {r['retries']:<3} failures {r['failures']:<3} "
          f"p50 {p50} ms | node processing ms: {proc}{extra}", flush=True)


def sweep(lab: SwiftLab, sizes: list[int], levels: list[int], work: Path, deadline: float, lock: Path | None,
          keep_captures: bool) -> list[dict[str, Any]]:
    out = []
    stamp = int(time.time())
    for size in sizes:
        print(f"size {size_name(size)}: levels {levels}", flush=True)
        with heavy_lock(lock):
            for level in levels:
                count = count_for(size, level)
                container = f"sweep-{stamp}-{size}-{level}"
                for op in ("put", "get"):
                    try:
                        r = one_run(lab, op, size, level, count, container, deadline, f"{size}-{level}-{op}",
                                    keep_captures)
                    except UserError as e:
                        # The level could not run at all (e.g. no token from an overloaded proxy):
                        # a row that says so, and the sweep goes on.
                        lab.stop_captures()
                        r = {"op": op, "size": size, "concurrency": level, "requested": count, "error": str(e)}
                        print(f"  {op.upper():<3} {size_name(size):>5} x{level:<4} did not run: {e}", flush=True)
                    else:
                        _progress(r)
                    r["kind"] = "sweep"
                    _append(work / "levels.jsonl", r)
                    out.append(r)
    return out


def inject(lab: SwiftLab, work: Path, deadline: float, lock: Path | None, rounds: int, delay_ms: float,
           rate: str, keep_captures: bool, out_dir: Path) -> list[dict[str, Any]]:
    out = []
    stamp = int(time.time())
    scenarios = [
        ("slow-node", "s2", 1024, 4, 120, ("put", "get")),
        ("slow-link", "s1", 1024 * 1024, 1, 16, ("put",)),
    ]
    for name, node, size, level, count, ops in scenarios:
        print(f"{name} on {node}: {size_name(size)} x{level}, {rounds} rounds of baseline/treatment", flush=True)
        with heavy_lock(lock):
            for rnd in range(rounds):
                for arm in ("baseline", "treatment"):
                    if arm == "treatment":
                        if name == "slow-node":
                            lab.set_object_delay(node, delay_ms)
                        else:
                            lab.shape_link(node, rate)
                        time.sleep(1.0)  # the middleware re-reads its file every 0.5 s
                    try:
                        container = f"inject-{stamp}-{name}-{rnd}-{arm}"
                        for op in ops:
                            draw_to = out_dir / f"diagram-{name}-{op}.png" if rnd == 0 and arm == "treatment" else None
                            r = one_run(lab, op, size, level, count, container, deadline,
                                        f"{name}-{rnd}-{arm}-{op}", keep_captures, draw_to)
                            r.update(kind="inject", scenario=name, node=node, arm=arm, round=rnd,
                                     injected={"delay_ms": delay_ms} if name == "slow-node" else {"tbf_rate": rate})
                            _append(work / "inject.jsonl", r)
                            _progress(r, f"  [{name} {arm} {rnd}]")
                            out.append(r)
                    finally:
                        lab.set_object_delay(node, 0) if name == "slow-node" else lab.shape_link(node, None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.swift")
    p.add_argument("command", nargs="?", default="sweep", choices=["sweep", "inject", "report", "all"])
    p.add_argument("--lab.dir", dest="lab_dir", type=Path, default=None, help="the running lab (default: swift-lab's)")
    p.add_argument("--work", type=Path, default=WORK, help=f"raw results, appended per run (default {WORK})")
    p.add_argument("--out", type=Path, default=RESULTS, help="summary and plots (default bench/results/swift)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--levels", default=",".join(map(str, LEVELS)))
    p.add_argument("--deadline", type=float, default=25.0, help="seconds per run: no new request after it")
    p.add_argument("--lock", type=Path, default=None, help="hold this flock per size / per scenario")
    p.add_argument("--rounds", type=int, default=2, help="inject: baseline/treatment rounds")
    p.add_argument("--delay-ms", dest="delay_ms", type=float, default=50.0)
    p.add_argument("--rate", default="40mbit", help="inject: tbf rate of the slow link")
    p.add_argument("--keep-captures", action="store_true", help="keep each run's pcaps in the lab directory")
    a = p.parse_args(argv)
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s]
        levels = [int(s) for s in a.levels.split(",") if s]
    except ValueError:
        print("bench.swift: --sizes and --levels take comma-separated integers", file=sys.stderr)
        return 2
    try:
        if a.command in ("sweep", "inject", "all"):
            lab = SwiftLab.attach(a.lab_dir)
            t0 = time.monotonic()
            with HostSampler() as host:
                # Injections first: they are short, and a sweep cut by a time limit leaves the
                # earlier runs of its levels in place (``report`` takes the last run of each).
                if a.command in ("inject", "all"):
                    a.out.mkdir(parents=True, exist_ok=True)
                    inject(lab, a.work, a.deadline, a.lock, a.rounds, a.delay_ms, a.rate, a.keep_captures, a.out)
                if a.command in ("sweep", "all"):
                    sweep(lab, sizes, levels, a.work, a.deadline, a.lock, a.keep_captures)
            print(f"conditions: {describe(host.summary())}; {time.monotonic() - t0:.0f}s", flush=True)
            lab.start_captures("captures")  # the lab records on its usual files again
        from bench.swift.report import report

        print(report(a.work, a.out))
    except UserError as e:
        print(f"bench.swift: {e}", file=sys.stderr)
        return 1
    return 0
