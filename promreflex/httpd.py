"""Serving HTTP the same way in every promreflex process (controller, exporters, copier):
``/metrics`` from a prometheus_client registry, readiness endpoints, a stop on SIGINT/SIGTERM,
and a clean shutdown."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from promreflex.config import split_host_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """``GET /metrics``; the exposition is rendered in a thread so a large registry never
    stalls the event loop."""

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (handlers installed on the running loop)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    return stop


def add_standard_routes(app: web.Application, registry: CollectorRegistry, title: str = "promreflex") -> web.Application:
    """``/metrics``, ``/-/ready``, ``/-/healthy`` and an index line."""

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=f"{title}: see /metrics\n")

    app.router.add_get("/metrics", metrics_handler(registry))
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/-/healthy", ready)
    app.router.add_get("/", index)
    return app


@asynccontextmanager
async def serving(listen_address: str, app: web.Application) -> AsyncIterator[web.Application]:
    """Serve ``app`` on ``listen_address`` while the block runs. Raises OSError when the address
    cannot be bound."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        host, port = split_host_port(listen_address)
        await web.TCPSite(runner, host, port).start()
        yield app
    finally:
        await runner.cleanup()


def metrics_app(registry: CollectorRegistry, title: str) -> web.Application:
    """An app serving only the standard routes (what an exporter needs)."""
    return add_standard_routes(web.Application(), registry, title)
