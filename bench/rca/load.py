"""The shop's load: bounded asyncio users walking Sock Shop's flows, in their own process.

    python -m bench.rca.load --url http://127.0.0.1:PORT --duration 30 --users 4 \
        --roundtrips 1 --think-ms 50 [--out stats.json]

One flow: sign in, browse (home, catalogue, a detail page), add and remove a cart item
``roundtrips`` times (the paper's scenario), leave one item in the cart, view it and place an
order. Closed loop (default): ``--users`` users repeat the flow with ``--think-ms`` between
requests. Open loop (``--rate R``): flows arrive at R per second (Poisson), whatever the shop's
speed, as real visitors do; at most ``--max-inflight`` at once (more are shed and counted).
Everything stops at ``--duration`` or ``--max-requests``, whichever comes first. The summary
(JSON on stdout or ``--out``) has, per request name, the count, errors and latency quantiles
and maximum as the client saw them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

MAX_DURATION_S = 7200.0


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.flows = 0
        self.requests = 0
        self.shed = 0

    def summary(self, elapsed: float) -> dict[str, Any]:
        out: dict[str, Any] = {"elapsed_s": elapsed, "flows": self.flows, "requests": self.requests,
                               "errors": sum(self.errors.values()), "shed": self.shed, "by_name": {}}
        for name, values in sorted(self.latency.items()):
            qs = statistics.quantiles(values, n=100) if len(values) >= 2 else values * 99
            out["by_name"][name] = {"count": len(values), "errors": self.errors.get(name, 0),
                                    "p50_s": statistics.median(values), "p99_s": qs[98], "max_s": max(values)}
        return out


class Stop(Exception):
    pass


async def flow(session: aiohttp.ClientSession, base: str, cid: str, args: argparse.Namespace, stats: Stats,
               deadline: float, rng: random.Random) -> None:
    """One visit; raises Stop when the time or request budget is spent."""

    async def req(name: str, method: str, path: str) -> None:
        if time.monotonic() >= deadline or stats.requests >= args.max_requests:
            raise Stop
        stats.requests += 1
        t0 = time.perf_counter()
        try:
            async with session.request(method, base + path, headers={"x-request-id": str(uuid.uuid4())}) as r:
                await r.read()
                ok = r.status < 400
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        stats.latency[name].append(time.perf_counter() - t0)
        if not ok:
            stats.errors[name] += 1
        if args.think_ms:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think_ms / 1000)

    item = f"sock-{rng.randrange(20)}"
    await req("login", "POST", f"/login/{cid}")
    await req("home", "GET", "/")
    await req("catalogue", "GET", "/catalogue")
    await req("detail", "GET", f"/detail/{item}")
    for _ in range(args.roundtrips):
        await req("cart_add", "POST", f"/cart/{cid}/{item}")
        await req("cart_remove", "DELETE", f"/cart/{cid}/{item}")
    await req("cart_add", "POST", f"/cart/{cid}/{item}")
    await req("cart_view", "GET", f"/cart/{cid}")
    await req("order", "POST", f"/orders/{cid}")
    stats.flows += 1


async def closed_user(session, base, uid, args, stats, deadline, rng) -> None:
    try:
        while True:
            await flow(session, base, f"customer-{uid}", args, stats, deadline, rng)
    except Stop:
        return


async def open_arrivals(session, base, args, stats, deadline, rng) -> None:
    inflight: set[asyncio.Task] = set()

    async def one(cid: str, r: random.Random) -> None:
        try:
            await flow(session, base, cid, args, stats, deadline, r)
        except Stop:
            return

    while time.monotonic() < deadline and stats.requests < args.max_requests:
        await asyncio.sleep(rng.expovariate(args.rate))
        if len(inflight) >= args.max_inflight:
            stats.shed += 1
            continue
        t = asyncio.create_task(one(f"customer-{rng.randrange(args.users)}", random.Random(rng.random())))
        inflight.add(t)
        t.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.gather(*inflight)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stats = Stats()
    t0 = time.monotonic()
    deadline = t0 + args.duration
    timeout = aiohttp.ClientTimeout(total=30)
    headers = {"Host": "front-end.sock-shop.svc.cluster.local", "User-Agent": "promreflex-bench-load"}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        rng = random.Random(args.seed)
        base = args.url.rstrip("/")
        if args.rate > 0:
            tasks = [asyncio.create_task(open_arrivals(session, base, args, stats, deadline, rng))]
        else:
            tasks = [asyncio.create_task(closed_user(session, base, i, args, stats, deadline, random.Random(rng.random())))
                     for i in range(args.users)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.duration + 60)
    return stats.summary(time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--roundtrips", type=int, default=1)
    ap.add_argument("--think-ms", type=float, default=50.0)
    ap.add_argument("--rate", type=float, default=0.0, help="open loop: flows per second (0: closed loop)")
    ap.add_argument("--max-inflight", type=int, default=64)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if (not 0 < args.duration <= MAX_DURATION_S or not 1 <= args.users <= 64 or args.roundtrips < 0
            or not 0 <= args.rate <= 200 or not 1 <= args.max_inflight <= 256):
        ap.error(f"--duration must be in (0, {MAX_DURATION_S:g}], --users in [1, 64], --roundtrips >= 0, "
                 "--rate in [0, 200], --max-inflight in [1, 256]")
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
