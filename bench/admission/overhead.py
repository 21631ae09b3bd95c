"""The proxy's cost: added latency at 1,000 req/s side by side with the app alone, and its ceiling.

Added latency. An open-loop generator (this module, asyncio over raw keep-alive connections:
requests are sent on a fixed schedule, ``rate`` per second, whatever the answers do, and each
latency runs from the request's SCHEDULED time, so a stall cannot hide its own queue) offers the
same rate to the app directly and through the proxy, in alternating blocks, on two paths:
- ``static``: an exempt path (proxied with no session and no queue);
- ``page``: a page class with a signed session cookie (each connection logs in once and keeps
  its cookie): cookie check, session bookkeeping, the page scheduler, then the app;
- ``page_unbound``: the same through a second proxy whose page limit starts above any burst of
  this load (``run.UNBOUND``), so the page scheduler never holds a request: the difference
  from ``page`` is what queueing bursts at the initial limit (4) costs (the proxy's page-queue
  wait histogram counts those requests; the report prints the share).
The app runs with no page work (``--scale 0``), so what differs is the proxy. Added latency =
percentile through the proxy minus the same percentile direct (pooled over the blocks).

Ceiling. A closed loop of ``conns`` connections, back to back, through the proxy for a few
seconds; requests answered per CPU second of the proxy's process = its ceiling per core (the
proxy is one process; the generator and the app share the other core, so the rate itself may
be capped by them and is printed beside it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.admission.counting import percentile


class HttpError(Exception):
    pass


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    cookie: str = ""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise HttpError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    cookies = []
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            k = k.strip().lower()
            if k == "set-cookie":
                cookies.append(v.strip().split(";", 1)[0])
            headers[k] = v.strip()
    if cookies:
        headers["set-cookie"] = "; ".join(cookies)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(parts[1]), headers, body


async def _connect(host: str, port: int) -> Conn:
    reader, writer = await asyncio.open_connection(host, port)
    return Conn(reader, writer)


async def _get(conn: Conn, host: str, path: str) -> int:
    cookie = f"Cookie: {conn.cookie}\r\n" if conn.cookie else ""
    conn.writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{cookie}\r\n".encode("latin-1"))
    status, headers, _ = await _read_response(conn.reader)
    if "set-cookie" in headers:
        conn.cookie = headers["set-cookie"]
    return status


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)  # seconds, from the scheduled send time
    errors: int = 0
    sent: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "ok": len(self.latencies), "errors": self.errors, "seconds": round(self.seconds, 2),
                "rate": round(len(self.latencies) / self.seconds, 1) if self.seconds else 0.0,
                "p50_ms": _ms(percentile(self.latencies, 50)), "p99_ms": _ms(percentile(self.latencies, 99))}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


async def _open_conns(host: str, port: int, n: int, login: str | None) -> list[Conn]:
    conns = [await _connect(host, port) for _ in range(n)]
    if login:
        for c in conns:
            if await _get(c, host, login) != 200:
                raise HttpError(f"login {login} did not answer 200")
    return conns


async def open_loop(host: str, port: int, path: str, rate: float, seconds: float, conns: int = 16,
                    login: str | None = None) -> LoadResult:
    """``rate`` GETs per second for ``seconds`` over ``conns`` keep-alive connections."""
    idle: asyncio.Queue[Conn] = asyncio.Queue()
    for c in await _open_conns(host, port, conns, login):
        idle.put_nowait(c)
    res = LoadResult()
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float) -> None:
        conn = await idle.get()
        try:
            status = await asyncio.wait_for(_get(conn, host, path), timeout=10)
            if status == 200:
                res.latencies.append(time.perf_counter() - scheduled)
            else:
                res.errors += 1
            idle.put_nowait(conn)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, HttpError, ValueError):
            res.errors += 1
            conn.writer.close()
            try:
                fresh = (await _open_conns(host, port, 1, login))[0]
                idle.put_nowait(fresh)
            except (OSError, HttpError):
                pass

    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        res.sent += 1
    if tasks:
        await asyncio.wait(tasks, timeout=15)
    res.seconds = time.perf_counter() - t0
    while not idle.empty():
        idle.get_nowait().writer.close()
    return res


async def closed_loop(host: str, port: int, path: str, seconds: float, conns: int = 64,
                      login: str | None = None) -> LoadResult:
    """``conns`` connections sending back to back for ``seconds``: the most this path answers."""
    res = LoadResult()
    pool = await _open_conns(host, port, conns, login)
    deadline = time.perf_counter() + seconds

    async def worker(conn: Conn) -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                status = await asyncio.wait_for(_get(conn, host, path), timeout=10)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, HttpError, ValueError):
                res.errors += 1
                return
            res.sent += 1
            if status == 200:
                res.latencies.append(time.perf_counter() - t)
            else:
                res.errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in pool))
    res.seconds = time.perf_counter() - t0
    for c in pool:
        c.writer.close()
    return res


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (psutil)."""
    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def added(direct: dict[str, Any], proxied: dict[str, Any]) -> dict[str, float | None]:
    """Proxy minus direct, per percentile (ms)."""
    out: dict[str, float | None] = {}
    for k in ("p50_ms", "p99_ms"):
        a, b = direct.get(k), proxied.get(k)
        out[k] = None if a is None or b is None else round(b - a, 3)
    return out
