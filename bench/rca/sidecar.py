"""The sidecar: one small proxy process per service, logging like Istio's Envoy.

    python -m bench.rca.sidecar --mesh-file MESH.json --name carts

It listens twice, as an Istio sidecar does (15006 inbound, 15001 outbound):

- the *inbound* port is the service's address in the mesh: callers' sidecars send requests
  there; it forwards them to the application on its local port and logs an inbound record
  (``upstream_cluster`` ``inbound|80||``, ``upstream_host`` the application);
- the *outbound* port is where the application sends its own calls, naming the destination in
  the ``Host`` header (``carts:80``); it forwards them to the destination's inbound port and
  logs an outbound record (``outbound|80||carts.sock-shop.svc.cluster.local``).

Durations are measured here, in a process of its own, so a stalled application (CPU hog,
garbage-collection pause, fsync storm) delays its callers' records and its own inbound ones,
and not the records of the calls it makes, exactly as with a real sidecar. Each record also
carries ``x-envoy-upstream-service-time`` (the time to the upstream's response headers).
Lines are written by :class:`exporters.mesh.writer.AccessLogWriter` in the service's format.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.rca.topology import NAMESPACE, SERVICE_PORT
from exporters.mesh.writer import AccessLogWriter, inbound_cluster, outbound_cluster

TIMEOUT_S = 20.0
HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class Sidecar:
    def __init__(self, mesh: dict[str, Any], name: str):
        self.mesh = mesh
        self.name = name
        me = mesh["services"][name]
        self.me = me
        self.log = AccessLogWriter(me["log"], me["format"])
        self.session: aiohttp.ClientSession | None = None
        # Network delay per outbound edge (destination -> seconds), the "link" fault: read from
        # mesh["edge_delays_file"] (written by Mesh.delay_edge), re-read every 0.5 s.
        self.delays: dict[str, float] = {}
        self.delays_file = Path(mesh["edge_delays_file"]) if mesh.get("edge_delays_file") else None

    async def watch_delays(self) -> None:
        while self.delays_file is not None:
            try:
                table = json.loads(self.delays_file.read_text())
                self.delays = {str(d): float(v) for d, v in table.get(self.name, {}).items()}
            except (OSError, ValueError, AttributeError):
                self.delays = {}
            await asyncio.sleep(0.5)

    def destination(self, authority: str) -> str | None:
        host = authority.split(":")[0].split(".")[0]
        return host if host in self.mesh["services"] else None

    async def forward(self, request: web.Request, url: str, host: str) -> tuple[web.Response, float | None, tuple[str, ...], str]:
        """Send ``request`` to ``url``; (response, seconds to upstream headers, response flags, details)."""
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers["Host"] = host
        t0 = time.perf_counter()
        try:
            async with self.session.request(request.method, url, headers=headers, data=body or None) as r:
                ust = time.perf_counter() - t0
                payload = await r.read()
                out_headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP_HEADERS}
                out_headers["x-envoy-upstream-service-time"] = str(_ms(ust))
                return web.Response(status=r.status, body=payload, headers=out_headers), ust, (), "via_upstream"
        except TimeoutError:
            return web.Response(status=504, text="upstream request timeout"), None, ("UT",), "response_timeout"
        except aiohttp.ClientError:
            return (web.Response(status=503, text="upstream connect error"), None, ("UF",),
                    "upstream_reset_before_response_started{connection_failure}")

    def write(self, request: web.Request, resp: web.Response, start: datetime, t0: float, ust: float | None,
              flags: tuple[str, ...], details: str, **fields: Any) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.log.write({
            "start_time": start, "method": request.method, "path": request.path_qs, "protocol": "HTTP/1.1",
            "response_code": resp.status, "response_flags": flags, "response_code_details": details,
            "bytes_received": request.content_length or 0, "bytes_sent": resp.content_length or 0,
            "duration": _ms(time.perf_counter() - t0), "upstream_service_time": None if ust is None else _ms(ust),
            "user_agent": request.headers.get("User-Agent"), "request_id": request.headers.get("x-request-id"),
            "authority": request.host, "downstream_remote_address": f"{peer[0]}:{peer[1]}" if peer else None,
            "route_name": "default", **fields,
        })

    async def inbound(self, request: web.Request) -> web.Response:
        start, t0 = datetime.now(UTC), time.perf_counter()
        app = f"127.0.0.1:{self.me['app_port']}"
        resp, ust, flags, details = await self.forward(request, f"http://{app}{request.path_qs}", request.host)
        self.write(request, resp, start, t0, ust, flags, details,
                   upstream_host=app, upstream_cluster=inbound_cluster(SERVICE_PORT),
                   upstream_local_address="127.0.0.6:0", downstream_local_address=f"127.0.0.1:{self.me['port']}",
                   requested_server_name=f"outbound_.{SERVICE_PORT}_._.{self.name}.{NAMESPACE}.svc.cluster.local")
        return resp

    async def outbound(self, request: web.Request) -> web.Response:
        start, t0 = datetime.now(UTC), time.perf_counter()
        dest = self.destination(request.host)
        if dest is None:  # Envoy: no route (NR), 404, no cluster
            resp = web.Response(status=404)
            self.write(request, resp, start, t0, None, ("NR",), "route_not_found", upstream_cluster=None)
            return resp
        addr = f"127.0.0.1:{self.mesh['services'][dest]['port']}"
        if self.delays.get(dest):  # the link to dest is slow: seen by this (the caller's) side only
            await asyncio.sleep(self.delays[dest])
        resp, ust, flags, details = await self.forward(request, f"http://{addr}{request.path_qs}", f"{dest}:{SERVICE_PORT}")
        self.write(request, resp, start, t0, ust, flags, details,
                   upstream_host=addr if not flags else None,
                   upstream_cluster=outbound_cluster(dest, NAMESPACE, SERVICE_PORT),
                   upstream_local_address="127.0.0.1:0", downstream_local_address=addr)
        return resp

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        self.session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=128),
                                             auto_decompress=False)
        runners = []
        try:
            for handler, port in ((self.inbound, self.me["port"]), (self.outbound, self.me["outbound_port"])):
                app = web.Application()
                app.router.add_route("*", "/{tail:.*}", handler)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", int(port)).start()
                runners.append(runner)
            await self.watch_delays() if self.delays_file is not None else await asyncio.Event().wait()
        finally:
            for r in runners:
                await r.cleanup()
            await self.session.close()
            self.log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mesh-file", required=True, type=Path)
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    mesh = json.loads(args.mesh_file.read_text())
    if args.name not in mesh["services"]:
        ap.error(f"{args.name} is not in {args.mesh_file}")
    try:
        asyncio.run(Sidecar(mesh, args.name).run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
