"""What aiohttp's client and server cost per request, beside the leanest code that could replace
them: the question "would a hand-made HTTP path take the proxy under its p99 target?".

- *client*: aiohttp's ``ClientSession.request`` called as the proxy calls it (keep-alive, no
  cookie jar, no decompression, the skipped headers, a prebuilt URL, a per-page timeout) against
  a bare asyncio.Protocol with aiohttp's own C response parser, each reading one small answer
  from a trivial server in another process; CPU of the measuring process only.
- *server*: ``web.Application`` with a catch-all route and one middleware (how the proxy serves)
  against aiohttp's low-level ``web.Server``, each loaded by a bare keep-alive client in another
  process; CPU of the server only.

16 connections in flight, so the loop batches events: this is the code's cost, not the cost of
one request alone at 1,000 req/s (the overhead step, ``overhead.py``, measures that whole:
0.43-0.49 ms of proxy CPU a request, most of it the loop's wakeups and the kernel). Arms
alternate, ``--rounds`` times::

    uv run --frozen python -m bench.admission.http_cost --lock /tmp/promreflex-heavy.lock --out bench/results/admission/http-cost
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from yarl import URL

from bench.conditions import heavy_lock, write_result

CONNS = 16
CHILD_TIMEOUT_S = 300.0  # one load client's run, at most
BODY = b"x" * 512
HEADERS = [("Host", "shop"), ("Cookie", "a=b"), ("X-Forwarded-For", "127.0.0.1")]

#: A server that answers every request on a connection at once (no parsing beyond the blank line).
BARE_SERVER = r'''
import asyncio, uvloop
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 512\r\n\r\n" + b"x" * 512
class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.buf = t, b""
    def data_received(self, d):
        self.buf += d
        while b"\r\n\r\n" in self.buf:
            _, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.t.write(RESP)
async def main():
    s = await asyncio.get_running_loop().create_server(P, "127.0.0.1", 0)
    print(s.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
uvloop.run(main())
'''

#: A client that sends N requests over CONNS keep-alive connections and reads each answer.
BARE_CLIENT = r'''
import asyncio, sys, uvloop
n, conns, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
REQ = b"GET /shop/page?x=1 HTTP/1.1\r\nHost: shop\r\nCookie: a=b\r\n\r\n"
async def worker(k):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(k):
        w.write(REQ)
        head = await r.readuntil(b"\r\n\r\n")
        size = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        await r.readexactly(size)
    w.close()
async def main():
    await asyncio.gather(*(worker(n // conns) for _ in range(conns)))
uvloop.run(main())
'''


async def _in_flight(one: Any, n: int) -> float:
    """CPU microseconds per request of ``one()`` called n times over CONNS concurrent workers."""
    async def worker(k: int) -> None:
        for _ in range(k):
            await one()
    await asyncio.gather(*(worker(200 // CONNS + 1) for _ in range(CONNS)))  # warm-up
    c0 = time.process_time()
    await asyncio.gather(*(worker(n // CONNS) for _ in range(CONNS)))
    return (time.process_time() - c0) / (n // CONNS * CONNS) * 1e6


async def client_aiohttp(port: int, n: int) -> float:
    client = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0), auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=10.0)
    url = f"http://127.0.0.1:{port}/shop/page?x=1"

    async def one() -> None:
        async with client.request("GET", URL(url, encoded=True), headers=HEADERS, allow_redirects=False,
                                  timeout=timeout, compress=None, chunked=None) as resp:
            list(resp.headers.items())
            await resp.read()
    try:
        return await _in_flight(one, n)
    finally:
        await client.close()


async def client_bare(port: int, n: int) -> float:
    from aiohttp._http_parser import HttpResponseParser  # type: ignore[import-not-found]
    from aiohttp.base_protocol import BaseProtocol

    loop = asyncio.get_running_loop()

    class Conn(BaseProtocol):
        def __init__(self) -> None:
            super().__init__(loop)
            self.parser = HttpResponseParser(self, loop, 2 ** 16, max_line_size=8190, max_field_size=8190,
                                             auto_decompress=False)
            self.waiter: asyncio.Future[Any] | None = None

        def data_received(self, data: bytes) -> None:
            messages, _, _ = self.parser.feed_data(data)
            for message, payload in messages:
                assert self.waiter is not None
                self.waiter.set_result((message, payload))

        def connection_lost(self, exc: BaseException | None) -> None:
            super().connection_lost(exc)
            if self.waiter is not None and not self.waiter.done():  # (else a request would wait forever)
                self.waiter.set_exception(ConnectionError(f"the server closed the connection: {exc}"))

    idle: list[Conn] = []
    every: list[Conn] = []
    for _ in range(CONNS):
        _, proto = await loop.create_connection(Conn, "127.0.0.1", port)
        idle.append(proto)
        every.append(proto)

    async def one() -> None:
        conn = idle.pop()
        request = "GET /shop/page?x=1 HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in HEADERS) + "\r\n"
        conn.waiter = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(request.encode("latin-1"))
        message, payload = await conn.waiter
        list(message.headers.items())
        await payload.read()
        idle.append(conn)
    try:
        return await _in_flight(one, n)
    finally:
        for conn in every:  # (also those a failed request still held)
            if conn.transport is not None:
                conn.transport.close()


async def _handle(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(body=BODY, content_type="text/html")


@web.middleware
async def _passing(request: web.Request, handler: Any) -> Any:
    return await handler(request)


async def server(kind: str, n: int) -> float:
    if kind == "app":
        app = web.Application(middlewares=[_passing])
        app.router.add_route("*", "/{tail:.*}", _handle)
        runner: web.BaseRunner = web.AppRunner(app, access_log=None)
    else:
        runner = web.ServerRunner(web.Server(_handle, access_log=None))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        used = 0.0
        for k in (max(CONNS, n // 10), n):  # a warm-up load, then the measured one
            c0 = time.process_time()
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", BARE_CLIENT, str(k), str(CONNS), str(port))
            try:
                rc = await asyncio.wait_for(proc.wait(), timeout=CHILD_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise SystemExit(f"http_cost: the load client did not finish in {CHILD_TIMEOUT_S:g}s") from None
            if rc != 0:
                raise SystemExit("http_cost: the load client failed")
            used = time.process_time() - c0
        return used / (n // CONNS * CONNS) * 1e6
    finally:
        await runner.cleanup()


ARMS = {
    "client: aiohttp (as the proxy)": ("client", client_aiohttp),
    "client: bare protocol + aiohttp's C parser": ("client", client_bare),
    "server: web.Application + route + middleware (as the proxy)": ("server", "app"),
    "server: low-level web.Server": ("server", "lowlevel"),
}


def measure(n: int, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in ARMS}
    srv = subprocess.Popen([sys.executable, "-c", BARE_SERVER], stdout=subprocess.PIPE, text=True)  # noqa: S603
    try:
        assert srv.stdout is not None
        line = srv.stdout.readline()
        srv.stdout.close()
        if not line.strip().isdigit():
            raise SystemExit(f"http_cost: the bare server did not start (it said {line.strip()!r})")
        port = int(line)
        for rnd in range(rounds):
            for name, (side, what) in ARMS.items():
                us = uvloop.run(what(port, n) if side == "client" else server(what, n))  # type: ignore[operator, arg-type]
                out[name].append(us)
                print(f"  round {rnd + 1}/{rounds}  {name:62s} {us:7.1f} us", flush=True)
    finally:
        srv.kill()
        srv.wait()
    return out


def table(results: dict[str, list[float]]) -> str:
    lines = ["| arm | CPU per request, median (rounds) |", "|---|---|"]
    for name, values in results.items():
        lines.append(f"| {name} | {statistics.median(values):.1f} us ({', '.join(f'{v:.0f}' for v in values)}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.admission.http_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000, help="requests per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lock", type=Path, default=None, help="heavy-job lock to hold while measuring")
    ap.add_argument("--out", type=Path, default=None, help="also write the table and its conditions to DIR/summary.md")
    a = ap.parse_args(argv)
    if a.requests < CONNS or a.rounds < 1:
        ap.error(f"--requests must be at least {CONNS} and --rounds at least 1")
    conditions = (f"aiohttp {aiohttp.__version__}, uvloop, {CONNS} connections in flight, {a.requests} requests per arm "
                  f"and round, {a.rounds} round(s), arms alternating")
    print(conditions, flush=True)
    with heavy_lock(a.lock):
        start, load0 = time.gmtime(), os.getloadavg()[0]
        results = measure(a.requests, a.rounds)
        load1 = os.getloadavg()[0]
    text = table(results)
    sys.stdout.write(text)
    if a.out is not None:
        cmd = " ".join(["uv run --frozen python -m bench.admission.http_cost", *(argv if argv is not None else sys.argv[1:])])
        head = (f"HTTP code cost per request, {time.strftime('%Y-%m-%d %H:%M', start)}-{time.strftime('%H:%M', time.gmtime())} "
                f"UTC; {conditions}; {os.cpu_count()} cores, load average (1m) {load0:.2f} -> {load1:.2f}"
                + (f", heavy lock {a.lock} held" if a.lock else "") + f".\nCommand: `{cmd}`\n\n")
        return write_result(a.out / "summary.md", head + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
