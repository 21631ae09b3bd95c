"""Two versions of the admission proxy side by side: the added latency of each at 1,000 req/s.

One app (no page work), one proxy started from each source tree (``--before`` and ``--after``,
e.g. a ``git worktree`` of an older commit and this checkout), the same configuration, and
open-loop blocks of ``--block`` seconds alternating direct / before / after, the order reversed
every round so drift does not pass for an effect. Prints each block, then per proxy the added
median and p99 (pooled over its blocks, minus the direct blocks') and its CPU per request.
How the README's "before / after" figures of 2026-11-27 were measured::

    git worktree add /tmp/before 1d05212
    uv run --frozen python -m bench.admission.side_by_side --before /tmp/before --after . \\
        --path page_inline --rounds 4 --lock /tmp/promreflex-heavy.lock
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.admission.arms import ArmStack, proxy_config
from bench.admission.contention import CacheModel
from bench.admission.counting import percentile
from bench.admission.overhead import cpu_seconds, open_loop
from bench.admission.pages import PAGES, STATIC_PATH
from promreflex.proc import free_port, http_ok, wait_until

PATHS = {"page_inline": PAGES[1].path + "?inline=1", "static": STATIC_PATH}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.admission.side_by_side", description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree of the first proxy")
    ap.add_argument("--after", type=Path, required=True, help="source tree of the second proxy")
    ap.add_argument("--path", choices=sorted(PATHS), default="page_inline")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=float, default=5.0, help="seconds per block (default 5)")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--lock", type=Path, default=None, help="hold this flock while measuring")
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.lock is not None:
            import fcntl

            fh = stack.enter_context(open(args.lock, "a"))  # noqa: SIM115 - held for the run
            fcntl.flock(fh, fcntl.LOCK_EX)
        return run(args)


def run(args: argparse.Namespace) -> int:
    path = PATHS[args.path]
    login = PAGES[0].path if args.path != "static" else None
    app = ArmStack("full", 0.1, 2, 1.0, with_nginx=False, app_scale=0.0, cache=CacheModel(budget_mb=0),
                   proxy_overrides={"page_scheduler.timeout": 10.0}).start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        ports = {}
        for name, tree in (("before", args.before), ("after", args.after)):
            listen, control = free_port(), free_port()
            cfg = proxy_config(listen, app.app_port, control, 0.1, session_scheduler=True, overrides=app.proxy_overrides)
            cfg_path = app.workdir / f"{name}.yml"
            cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            procs[name] = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "controllers.admission", "proxy", "--config.file", str(cfg_path)],
                cwd=tree.resolve(), stdout=subprocess.DEVNULL, stderr=(app.workdir / f"{name}.log").open("wb"))
            ready = f"http://127.0.0.1:{control}/-/ready"
            wait_until(lambda url=ready: http_ok(url, timeout=0.5), timeout=30, what=f"proxy {name} ready")  # type: ignore[misc]
            ports[name] = listen
            asyncio.run(open_loop("127.0.0.1", listen, path, args.rate, 1.0, login=login))  # warm
        sides = [("direct", app.app_port), ("before", ports["before"]), ("after", ports["after"])]
        lat: dict[str, list[float]] = {k: [] for k, _ in sides}
        cpu = dict.fromkeys(lat, 0.0)
        sent = dict.fromkeys(lat, 0)
        print(f"{args.path} ({path}) at {args.rate:g} req/s, {args.rounds} rounds of {args.block:g} s blocks")
        for r in range(args.rounds):
            for name, port in (sides if r % 2 == 0 else sides[::-1]):
                c0 = cpu_seconds(procs[name].pid) if name in procs else 0.0
                res = asyncio.run(open_loop("127.0.0.1", port, path, args.rate, args.block,
                                            login=login if name != "direct" else None))
                if name in procs:
                    cpu[name] += cpu_seconds(procs[name].pid) - c0
                lat[name] += res.latencies
                sent[name] += res.sent
                print(f"round {r + 1} {name}: {res.summary()}", flush=True)
        d50, d99 = _p(lat["direct"], 50), _p(lat["direct"], 99)
        for name in ("before", "after"):
            print(f"{name}: added p50 {1000 * (_p(lat[name], 50) - d50):+.3f} ms, p99 "
                  f"{1000 * (_p(lat[name], 99) - d99):+.3f} ms; proxy CPU {1000 * cpu[name] / max(1, sent[name]):.3f} ms "
                  "per request")
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
        app.stop()
        app.cleanup()
    return 0


def _p(values: list[float], q: float) -> Any:
    return percentile(values, q) or 0.0


if __name__ == "__main__":
    sys.exit(main())
