"""One simulated shop service (the application container; its sidecar is bench.rca.sidecar).

    python -m bench.rca.service --mesh-file MESH.json --name carts

The mesh file (written by :class:`bench.rca.mesh.Mesh`) gives every service's ports, log path,
log format and data directory. The service:

- answers its endpoints (:mod:`bench.rca.topology`) on its application port, doing a little CPU
  work, short-lived memory and, for databases, disk I/O per request, and calls its
  dependencies through its sidecar's outbound port (``Host: carts:80``);
- serves ``/metrics`` (its CPU, memory and disk I/O from /proc, and which fault is active),
  ``/fault`` (GET status, POST ``{"kind", "duration_s", "params"}``, DELETE) and ``/-/ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from bench.rca.faults import FAULT_KINDS, FaultController, FaultError
from bench.rca.procstats import ProcessUsageCollector
from bench.rca.topology import SERVICE_PORT, SERVICES, Endpoint, Service

CONTROL_PATHS = ("/metrics", "/fault", "/-/ready")
CALL_TIMEOUT_S = 20.0
DB_FILE_BYTES = 1024 * 1024
DB_LOG_MAX_BYTES = 16 * 1024 * 1024


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class Work:
    """The per-request work: hashing for ``cpu_ms`` (iterations calibrated once, so a starved
    CPU makes it take longer, as real work would), a short-lived buffer, a little disk I/O."""

    def __init__(self, data_dir: Path, database: bool = False):
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.block = os.urandom(1024)
        self.per_ms = self._calibrate()
        self.table = data_dir / "table.bin"
        if database and (not self.table.exists() or self.table.stat().st_size < DB_FILE_BYTES):
            self.table.write_bytes(os.urandom(DB_FILE_BYTES))
        self.wal = data_dir / "wal.log"
        self._wal_fd: int | None = None

    def _calibrate(self) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            self.hash(200)
            best = min(best, time.perf_counter() - t0)
        return 200 / (best * 1000)

    def hash(self, n: int) -> bytes:
        h = hashlib.sha256()
        for _ in range(n):
            h.update(self.block)
        return h.digest()

    def cpu(self, ms: float) -> bytes:
        return self.hash(max(1, int(ms * self.per_ms)))

    def read(self) -> bytes:
        with open(self.table, "rb") as f:
            f.seek(random.randrange(0, DB_FILE_BYTES - 4096))
            return f.read(4096)

    def write(self, record: bytes) -> None:
        if self._wal_fd is None or os.fstat(self._wal_fd).st_size > DB_LOG_MAX_BYTES:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
            self._wal_fd = os.open(self.wal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        os.write(self._wal_fd, record.ljust(512, b" ") + b"\n")
        os.fsync(self._wal_fd)


class FaultStateCollector(Collector):
    def __init__(self, service: str, faults: FaultController):
        self.service, self.faults = service, faults

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("promreflex_bench_fault_active", "1 while a fault of this kind is injected into the service.",
                              labels=["service", "kind"])
        active = self.faults.fault.kind if self.faults.fault else None
        for kind in FAULT_KINDS:
            g.add_metric([self.service, kind], 1.0 if kind == active else 0.0)
        yield g


class ShopService:
    def __init__(self, mesh: dict[str, Any], name: str):
        self.mesh = mesh
        self.name = name
        self.spec: Service = SERVICES[name]
        me = mesh["services"][name]
        self.port = int(me["app_port"])
        self.outbound_port = int(me["outbound_port"])
        self.data_dir = Path(me["data_dir"])
        self.work = Work(self.data_dir, self.spec.database)
        self.faults = FaultController(self.data_dir)
        self.registry = CollectorRegistry()
        self.registry.register(ProcessUsageCollector(name))
        self.registry.register(FaultStateCollector(name, self.faults))
        self.session: aiohttp.ClientSession | None = None

    # ----------------------------------------------------------------- faults and calls
    @web.middleware
    async def fault_delay(self, request: web.Request, handler) -> web.StreamResponse:
        """The ``latency`` fault: requests wait before the application handles them."""
        if request.path not in CONTROL_PATHS:
            delay = self.faults.request_delay()
            if delay:
                await asyncio.sleep(delay)
        return await handler(request)

    async def call(self, service: str, method: str, path: str, request_id: str) -> int:
        """Call ``service`` through this service's sidecar (its outbound port), as an
        application in an Istio pod does: plain HTTP to ``service:80``, intercepted."""
        assert self.session is not None
        try:
            async with self.session.request(method, f"http://127.0.0.1:{self.outbound_port}{path}",
                                            headers={"Host": f"{service}:{SERVICE_PORT}", "x-request-id": request_id}) as r:
                await r.read()
                return r.status
        except (TimeoutError, aiohttp.ClientError):
            return 0

    # ----------------------------------------------------------------- app
    def endpoint_handler(self, ep: Endpoint):
        async def handle(request: web.Request) -> web.Response:
            rid = request.headers.get("x-request-id") or str(uuid.uuid4())
            params = dict(request.match_info)
            scratch = bytearray(ep.alloc_kb * 1024)  # short-lived memory, like parsing a payload
            digest = self.work.cpu(ep.cpu_ms)
            if ep.disk == "read":
                scratch[:4096] = self.work.read()
            elif ep.disk == "write":
                self.work.write(json.dumps(params).encode())
            for c in ep.calls:
                code = await self.call(c.service, c.method, c.path.format(**params), rid)
                if not 200 <= code < 300:
                    return web.json_response({"error": f"{c.service} answered {code or 'nothing'}"}, status=503)
            items = [{"id": f"sock-{i}", "price": 9.99 + i} for i in range(8 if ep.method == "GET" else 1)]
            return web.json_response({"service": self.name, "items": items, "digest": digest.hex()[:16]})

        return handle

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def fault(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            return web.json_response({"cleared": self.faults.clear()})
        if request.method == "POST":
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise FaultError("the body must be a JSON object")
                self.faults.inject(str(body.get("kind")), body.get("duration_s", 60.0), body.get("params") or {})
            except (FaultError, json.JSONDecodeError) as e:
                return web.json_response({"error": str(e)}, status=400)
        return web.json_response(self.faults.status())

    async def _expiry(self) -> None:
        while True:
            self.faults.expire()
            await asyncio.sleep(0.1)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.fault_delay])
        for ep in self.spec.endpoints:
            app.router.add_route(ep.method, ep.path, self.endpoint_handler(ep))
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/-/ready", self.ready)
        app.router.add_route("*", "/fault", self.fault)

        async def lifecycle(app: web.Application):
            timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
            self.session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64))
            expiry = asyncio.create_task(self._expiry())
            yield
            expiry.cancel()
            self.faults.clear()
            await self.session.close()

        app.cleanup_ctx.append(lifecycle)
        return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mesh-file", required=True, type=Path)
    ap.add_argument("--name", required=True, choices=sorted(SERVICES))
    args = ap.parse_args(argv)
    mesh = json.loads(args.mesh_file.read_text())
    svc = ShopService(mesh, args.name)
    web.run_app(svc.app(), host="127.0.0.1", port=svc.port, access_log=None, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
