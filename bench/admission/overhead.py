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
  wait histogram counts those requests; the report prints the share);
- ``page_inline``: the session page again, but the app answers it in its main process
  (``?inline=1``, honoured only by an app doing no page work) instead of through its worker
  pool: the pool's hop (the app's loop, its executor thread, a worker process and back) wakes
  several threads per request, and on 2 cores shared with the generator and the proxy those
  bursts wait for a CPU (measured 2026-11-26: the app's threads ~0.65 s per second runnable
  but not running through the proxy, ~0.1 s direct; ~0.002 s on this path). This row is the
  proxy's own cost on a session page; ``page`` is that plus the contention it adds to such an app.
The app runs with no page work (``--scale 0``), so what differs is the proxy. Added latency =
percentile through the proxy minus the same percentile direct (pooled over the blocks). Every
block records its conditions (:class:`CpuMeter`): the CPU of the generator, the app and the
proxy, the host's busy share, and how long each waited for a CPU (``schedstat``).

Ceiling. A closed loop of ``conns`` connections, back to back, through the proxy for a few
seconds; requests answered per CPU second of the proxy's process = its ceiling per core (the
proxy is one process; the generator and the app share the other core, so the rate itself may
be capped by them and is printed beside it).
"""

from __future__ import annotations

import asyncio
import os
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


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process and (``children``) its descendants (psutil)."""
    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *(p.children(recursive=True) if children else [])]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def host_busy(before: Any, after: Any) -> float:
    """Percent of all cores busy between two ``psutil.cpu_times()`` snapshots (idle, iowait and
    steal are not busy; a snapshot of its own, so a sampler thread's ``cpu_times_percent`` state
    is left alone)."""
    def split(t: Any) -> tuple[float, float]:
        total = sum(t)
        free = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
        return total, free

    (t0, f0), (t1, f1) = split(before), split(after)
    return 100.0 * max(0.0, (t1 - t0) - (f1 - f0)) / (t1 - t0) if t1 > t0 else 0.0


def run_delay(pid: int, children: bool = True) -> float:
    """Seconds the threads of a process (and its descendants) spent runnable but waiting for a
    CPU (Linux ``/proc/<pid>/task/<tid>/schedstat``, second field; 0 where it cannot be read)."""
    try:
        p = psutil.Process(pid)
        procs = [p, *(p.children(recursive=True) if children else [])]
    except psutil.Error:
        return 0.0
    ns = 0
    for q in procs:
        try:
            for tid in os.listdir(f"/proc/{q.pid}/task"):
                with open(f"/proc/{q.pid}/task/{tid}/schedstat") as f:
                    ns += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return ns / 1e9


class CpuMeter:
    """CPU used by each named process (with its children) over one block, in cores (CPU seconds
    per wall second), and the host's busy share: the conditions a block's latency was measured
    in. ``with CpuMeter({"generator": os.getpid(), "app": pid, ...}, alone={"generator"}) as m:``;
    then ``m.cores`` and ``m.busy_pct``. Names in ``alone`` count their own process only (the
    generator is the parent of the processes it measures)."""

    def __init__(self, pids: dict[str, int], alone: frozenset[str] | set[str] = frozenset()):
        self.pids, self.alone = pids, alone
        self.cores: dict[str, float] = {}
        self.runq_ms_per_s: dict[str, float] = {}  # waiting for a CPU, ms per wall second
        self.busy_pct = 0.0

    def __enter__(self) -> CpuMeter:
        self._cpu = {name: cpu_seconds(pid, name not in self.alone) for name, pid in self.pids.items()}
        self._wait = {name: run_delay(pid, name not in self.alone) for name, pid in self.pids.items()}
        self._host = psutil.cpu_times()
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(1e-9, time.perf_counter() - self._t)
        self.cores = {name: (cpu_seconds(pid, name not in self.alone) - self._cpu[name]) / wall
                      for name, pid in self.pids.items()}
        self.runq_ms_per_s = {name: 1000.0 * (run_delay(pid, name not in self.alone) - self._wait[name]) / wall
                              for name, pid in self.pids.items()}
        self.busy_pct = host_busy(self._host, psutil.cpu_times())


def mean_conditions(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of blocks' conditions (``cores`` per process, ``busy_pct``), rounded."""
    if not blocks:
        return {}
    names = sorted({k for b in blocks for k in b["cores"]})
    waits = sorted({k for b in blocks for k in b.get("runq_ms_per_s") or {}})
    return {"cores": {k: round(sum(b["cores"].get(k, 0.0) for b in blocks) / len(blocks), 2) for k in names},
            "runq_ms_per_s": {k: round(sum((b.get("runq_ms_per_s") or {}).get(k, 0.0) for b in blocks) / len(blocks), 1)
                              for k in waits},
            "busy_pct": round(sum(b["busy_pct"] for b in blocks) / len(blocks), 1),
            "busy_pct_max": round(max(b["busy_pct"] for b in blocks), 1)}


def added(direct: dict[str, Any], proxied: dict[str, Any]) -> dict[str, float | None]:
    """Proxy minus direct, per percentile (ms)."""
    out: dict[str, float | None] = {}
    for k in ("p50_ms", "p99_ms"):
        a, b = direct.get(k), proxied.get(k)
        out[k] = None if a is None or b is None else round(b - a, 3)
    return out
