"""The paper's shop app: seven pages doing real CPU work in a bounded pool of worker processes.

Like a servlet container (the paper's Tomcat): an HTTP front (aiohttp, one process) hands each
page request to a fixed pool of ``--workers`` processes through an unbounded FIFO queue. A page
costs a base amount of CPU work (SHA-256 over an in-memory buffer), ``paper_ms x --scale``
milliseconds of one core, calibrated once by the bench (``--iters-per-ms``) so every arm runs
the same app. With more busy workers than cores the OS time-shares them, so every page slows
down as concurrency rises: contention is real on this machine's 2 cores.

And contention costs work, as in a real app: the executing requests' working sets share one
cache (:mod:`bench.admission.contention`: ``--cache-mb``, ``--miss-penalty``,
``--working-sets``); past it every page does more real CPU work for the same answer, so the
app's throughput DROPS as concurrency rises past the knee. ``--cache-mb 0`` turns that off.

Like a servlet container, the app finishes every request it accepted, even when the client has
gone in the meantime (it notices only when it writes the answer): that work is wasted, and
``/stats`` counts it (``wasted_ms``), the paper's "requests already served for abandoned
sessions".

    python -m bench.admission.app --port 8000 --workers 16 --scale 0.1 --iters-per-ms 60

Pages: see :mod:`bench.admission.pages`; ``/shop/static/logo.svg`` answers at once (no work);
``/stats`` (JSON) counts per page class (``extra_ms``: CPU the cache misses cost) and the
current cache pressure. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from aiohttp import web

from bench.admission import contention
from bench.admission.contention import CHUNK_MS, CacheModel, SharedPressure, run_work
from bench.admission.pages import PAGE_CLASSES, PAGES, STATIC_PATH

_BUF = os.urandom(16 * 1024)
_BY_PATH = {p.path: p for p in PAGES}
_LOGO = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>'


def burn(iterations: int) -> int:
    """Real CPU work: ``iterations`` SHA-256 updates over 16 KiB (runs in a worker process)."""
    h = hashlib.sha256()
    for _ in range(iterations):
        h.update(_BUF)
    return h.digest()[0]


# set in every worker process by the pool's initializer (fork: the shared pressure is inherited)
_WORKER: tuple[CacheModel, SharedPressure, int] | None = None


def _init_worker(model: CacheModel, pressure: SharedPressure, chunk: int) -> None:
    global _WORKER
    _WORKER = (model, pressure, chunk)


def page_work(page: str, iterations: int) -> int:
    """One page's work in a worker under the cache model; the real iterations burnt."""
    if _WORKER is None:
        burn(iterations)
        return iterations
    model, pressure, chunk = _WORKER
    return run_work(iterations, model.ws(page), model, pressure, chunk, burn)


def calibrate_iters_per_ms(target_s: float = 0.05, repeats: int = 5) -> float:
    """Iterations of :func:`burn` per millisecond of one core's CPU time (best of ``repeats``,
    so other work on the machine makes it at most slightly low, never high)."""
    n = 64
    while True:  # grow n until one measurement takes about target_s of CPU
        t = time.process_time()
        burn(n)
        used = time.process_time() - t
        if used >= target_s / 4:
            break
        n *= 4
    best = 0.0
    for _ in range(repeats):
        t = time.process_time()
        burn(n)
        used = max(1e-6, time.process_time() - t)
        best = max(best, n / (used * 1000.0))
    return best


@dataclass
class PageStats:
    started: int = 0
    served: int = 0
    gone: int = 0  # served to a client that had already closed its connection
    wasted_ms: float = 0.0
    extra_ms: float = 0.0  # CPU the cache misses cost beyond the base work


@dataclass
class AppState:
    iterations: dict[str, int]
    cost_ms: dict[str, float]
    pool: ProcessPoolExecutor
    workers: int
    iters_per_ms: float = 1.0
    model: CacheModel = field(default_factory=CacheModel)
    pressure: SharedPressure | None = None
    pages: dict[str, PageStats] = field(default_factory=lambda: {name: PageStats() for name in PAGE_CLASSES})
    queued: int = 0  # accepted, not yet finished (waiting for a worker or running)
    inline: bool = False  # ?inline=1 answers a page in the main process (only with --scale 0)


STATE = web.AppKey("state", AppState)


async def page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    p = _BY_PATH.get(request.path)
    if p is None:
        raise web.HTTPNotFound(text="no such page\n")
    stats = state.pages[p.name]
    stats.started += 1
    state.queued += 1
    loop = asyncio.get_running_loop()
    try:
        if state.inline and request.query.get("inline") == "1":
            # The overhead step's control (an app doing no page work): answer without the
            # pool's hop (main -> worker process -> main), which wakes several threads.
            real = page_work(p.name, state.iterations[p.name])
        else:
            # shield: the work goes on if the client goes (the handler is not cancelled by
            # default in aiohttp 3.9+ either); the container only notices when it answers
            real = await asyncio.shield(loop.run_in_executor(state.pool, page_work, p.name, state.iterations[p.name]))
    finally:
        state.queued -= 1
    stats.served += 1
    stats.extra_ms += max(0, real - state.iterations[p.name]) / state.iters_per_ms
    transport = request.transport
    if transport is None or transport.is_closing():
        stats.gone += 1
        stats.wasted_ms += state.cost_ms[p.name]
    body = f"<html><body><h1>{p.name}</h1><p>page {p.number} of 7</p></body></html>\n"
    return web.Response(text=body, content_type="text/html")


async def static(request: web.Request) -> web.Response:
    return web.Response(body=_LOGO, content_type="image/svg+xml")


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({
        "workers": state.workers, "queued": state.queued, "cost_ms": state.cost_ms,
        "model": state.model.as_dict(), "pressure_mb": state.pressure.value() if state.pressure else 0.0,
        "pages": {name: vars(s) for name, s in state.pages.items()},
    })


def build(state: AppState) -> web.Application:
    app = web.Application()
    app[STATE] = state
    app.router.add_get(STATIC_PATH, static)
    app.router.add_get("/stats", stats)
    for p in PAGES:
        app.router.add_get(p.path, page)
    return app


def _warm(pool: ProcessPoolExecutor, workers: int) -> None:
    """Start every worker now (not on the first requests of a measured run)."""
    list(pool.map(time.sleep, [0.05] * workers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.admission.app", description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workers", type=int, default=16, help="worker processes (the bounded pool)")
    ap.add_argument("--scale", type=float, default=0.1, help="time scale: a page costs paper_ms x scale of CPU")
    ap.add_argument("--iters-per-ms", type=float, default=0.0, help="calibrated work per CPU ms (0: calibrate now)")
    contention.add_arguments(ap)
    args = ap.parse_args(argv)
    if not 1 <= args.workers <= 256 or not 0 <= args.scale <= 10:
        ap.error("--workers must be 1..256 and --scale in [0, 10]")
    model = contention.from_arguments(ap, args)
    ipm = args.iters_per_ms or calibrate_iters_per_ms()
    cost = {name: ms * args.scale for name, ms in PAGE_CLASSES.items()}
    iterations = {name: max(1, round(ms * ipm)) for name, ms in cost.items()}
    pressure = SharedPressure()
    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_init_worker, initargs=(model, pressure, max(1, round(CHUNK_MS * ipm))))
    _warm(pool, args.workers)
    state = AppState(iterations=iterations, cost_ms=cost, pool=pool, workers=args.workers, iters_per_ms=ipm,
                     model=model, pressure=pressure, inline=args.scale == 0)
    print(f"app on 127.0.0.1:{args.port}: {args.workers} workers, {ipm:.1f} iterations/ms, cost ms {cost}; "
          f"{model.describe()}", flush=True)
    try:  # SIGTERM/SIGINT end run_app gracefully
        web.run_app(build(state), host="127.0.0.1", port=args.port, print=None, access_log=None, backlog=4096)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
