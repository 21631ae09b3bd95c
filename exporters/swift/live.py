"""Live analysis: read each node's ``tcpdump -w -`` as a stream and analyse it in windows.

Each source is a byte stream in pcap or pcapng (``tcpdump -U -w - --time-stamp-precision=nano``
writes pcap with nanosecond stamps; ``-U`` flushes every packet). :class:`LiveAnalyzer` parses
each chunk as it comes (:class:`~exporters.swift.pcap.StreamParser`) and keeps the segments of
the last ``keep`` seconds. Every ``interval`` it analyses what it holds and publishes what ended
between the previous cut and the new one, the cut being ``grace`` seconds behind the slowest
source's latest packet (a segment's arrival at the other end, the response of an exchange must
have been read from every capture before it is counted); a source silent for ``keep``/2 (an
idle node) does not hold the cut back. An exchange that lasts longer than ``keep`` is in no
window and is not published: keep ``keep`` above the slowest request of interest. Segments seen
at one end only are not counted in live mode (a window cannot tell "lost" from "its twin is in
the next window").

Sources: ``NODE=IFACE@NETNS`` (tcpdump runs in that network namespace through ``ip netns exec``),
``NODE=IFACE`` (tcpdump in this namespace), ``NODE=-`` (standard input, one node only).

A node's clock stepping back (more than 1 ms between two packets in capture order) becomes a
step forward as large on that node's timeline (:meth:`LiveAnalyzer._unwrap`), so its latest
stamp keeps moving and the cut does not wait for it.

Hostile streams: a segment stamped more than ``keep`` ahead of the wall clock (which tcpdump's
kernel stamps share) is dropped and counted (``bad_timestamp``): one such packet would otherwise
hold the cut in the future. Each source runs in its own task: a tcpdump that exits (no such
interface or namespace) or a stream that is no capture is logged (exit code, tcpdump's last
words; at most once a minute per node), counted (``promreflex_swift_stream_failures_total``),
shown (``promreflex_swift_stream_up``) and restarted after a backoff (1 s doubling to 30 s);
the other sources go on. Standard input is not restarted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from exporters.swift.analyze import analyze
from exporters.swift.metrics import PREFIX, SwiftTimingCollector
from exporters.swift.match import capture_timeline
from exporters.swift.pcap import ReadStats, Segments, StreamParser
from exporters.swift.roles import RoleMap
from promreflex.errors import UserError

log = logging.getLogger("promreflex.exporter.swift")

BACKOFF_S = (1.0, 30.0)  # a failed source is restarted after 1 s, doubling up to 30 s
LOG_EVERY_S = 60.0  # a failing source is logged at most this often


@dataclass(frozen=True)
class LiveSource:
    node: str
    interface: str | None  # None: standard input
    netns: str | None = None

    @classmethod
    def parse(cls, text: str) -> LiveSource:
        node, eq, rest = text.partition("=")
        if not eq or not node or not rest:
            raise UserError(f"--live {text!r}: expected NODE=IFACE[@NETNS] or NODE=-")
        if rest == "-":
            return cls(node, None)
        iface, _, ns = rest.partition("@")
        return cls(node, iface, ns or None)

    def command(self, snaplen: int) -> list[str]:
        tcpdump = shutil.which("tcpdump") or "tcpdump"
        # --immediate-mode: packets reach tcpdump as they come (not in kernel-buffered batches
        # of up to 1 s, which tcpdump can lose when it is stopped); -U: written out at once.
        cmd = [tcpdump, "-i", str(self.interface), "--immediate-mode", "-U", "-w", "-",
               "--time-stamp-precision=nano", "-s", str(snaplen), "-n", "tcp"]
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd


def missing_tools(sources: list[LiveSource]) -> list[str]:
    """The executables the sources need (``tcpdump``; ``ip`` for a network namespace) not on PATH."""
    need = {"tcpdump"} if any(s.interface is not None for s in sources) else set()
    if any(s.netns for s in sources):
        need.add("ip")
    return sorted(t for t in need if shutil.which(t) is None)


class StreamHealth(Collector):
    """Per-source state of the live streams: ``promreflex_swift_stream_up{node}`` and
    ``promreflex_swift_stream_failures_total{node}``."""

    def __init__(self, nodes: list[str], registry: CollectorRegistry | None = None):
        self.up = dict.fromkeys(nodes, 0)
        self.failures = dict.fromkeys(nodes, 0)
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        g = GaugeMetricFamily(f"{PREFIX}_stream_up", "1 while a live source's capture stream delivers, 0 while "
                                                     "it is down (tcpdump failed, restarting) or ended.", labels=["node"])
        for node, v in sorted(self.up.items()):
            g.add_metric([node], v)
        yield g
        c = CounterMetricFamily(f"{PREFIX}_stream_failures", "Live capture streams that failed (tcpdump exited, "
                                                             "not a capture); each is restarted after a backoff.",
                                labels=["node"])
        for node, v in sorted(self.failures.items()):
            c.add_metric([node], v)
        yield c


class LiveAnalyzer:
    """Buffers each node's segments; ``tick()`` analyses and publishes one window."""

    def __init__(self, nodes: list[str], roles: RoleMap, collector: SwiftTimingCollector, *,
                 grace_s: float = 2.0, keep_s: float = 30.0, window_s: float = 1.0):
        self.nodes = nodes
        self.roles = roles
        self.collector = collector
        self.grace = int(grace_s * 1e9)
        self.keep = int(keep_s * 1e9)
        self.window_s = window_s
        self.parsers = {n: StreamParser() for n in nodes}
        self.buffers: dict[str, list[Segments]] = {n: [] for n in nodes}
        self.latest: dict[str, int] = {}
        self.cut: int | None = None
        self._noted: set[str] = set()  # the analysis' notes already logged (see tick)
        self._reported = {n: ReadStats() for n in nodes}
        self._ended = {n: ReadStats() for n in nodes}  # the counts of the parsers of restarted streams
        self._shift = dict.fromkeys(nodes, 0)  # ns added to a node's stamps: its clock's steps back
        self._last_raw: dict[str, int] = {}  # a node's last stamp as captured

    def feed(self, node: str, chunk: bytes) -> None:
        # Stamped beyond `keep` ahead of now: damage or a clock far off; it would hold the cut there.
        segs = self.parsers[node].feed(chunk, not_after=time.time_ns() + self.keep)
        if len(segs):
            segs.ts = self._unwrap(node, segs.ts)
            self.buffers[node].append(segs)
            self.latest[node] = max(self.latest.get(node, 0), int(segs.ts.max()))

    def _unwrap(self, node: str, ts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """A node's stamps with its clock's steps back turned into steps forward as large, across
        chunks and restarts (as :func:`~exporters.swift.match.capture_timeline` does for grouping
        offline): after a step back of D between two packets in capture order (more than 1 ms),
        every later stamp is moved up by 2 D. On the stamps as captured, the node's latest packet
        stayed ahead of its new ones: the cut (slowest source minus grace) waited for it, and what
        it received meanwhile fell in windows already published (a storage node stepping back 10 s
        lost 52 of 100 requests; offline analysis: none). Why not D (the timeline continued
        without a jump): D is the step minus the time between the two packets, which stays hidden
        as a small step back no window could see (transits off by up to 50 ms in a test); a step
        forward is what the clock estimator follows, as for a clock stepped forward. What the node
        received after the step is published once the other nodes' stamps pass its own (up to
        the step later); a step forward is left as it is."""
        prev = self._last_raw.get(node)
        self._last_raw[node] = int(ts[-1])
        # this chunk's steps (the one from the last chunk's last packet included), then the earlier ones'
        mono = capture_timeline(ts) if prev is None else capture_timeline(np.concatenate(([prev], ts)))[1:]
        steps, before = int(mono[-1] - ts[-1]), self._shift[node]
        if before + steps > 2 ** 61:  # absurd stamps: the shift would wrap int64; no further steps undone
            mono, steps = ts, 0
        self._shift[node] = before + steps
        return mono + before if before else mono

    def close(self, node: str) -> None:
        self.parsers[node].close()

    def restart(self, node: str) -> None:
        """The node's stream starts again (a new tcpdump, a new capture header): a new parser."""
        old = self.parsers[node]
        old.close()
        self._ended[node].add(old.stats)
        self.parsers[node] = StreamParser()

    def _read_delta(self) -> dict[str, ReadStats]:
        out = {}
        for n, p in self.parsers.items():
            rep, cur = self._reported[n], ReadStats()
            cur.add(self._ended[n])
            cur.add(p.stats)
            d = cur.minus(rep)
            rep.add(d)
            out[n] = d
        return out

    def tick(self, final: bool = False, now_ns: int | None = None) -> bool:
        """Analyse the buffers; publish what ended since the last cut. False: nothing to do yet.

        ``now_ns`` (the live loop passes the wall clock, which tcpdump's kernel timestamps share):
        when every stream is quiet, the cut still moves up to ``2 x grace`` before now, so the
        last requests before a pause are published without waiting for more traffic. The packet
        counts are published on every call, a window cut or not."""
        self._publish_read()
        if not self.latest:
            return False
        newest = max(self.latest.values())
        # A stream that has been silent for half of `keep` (an idle node) does not hold the cut back;
        # silent measured from the wall clock at the latest (a node stamping ahead of it must not
        # make the others look idle).
        ref = newest if now_ns is None else min(newest, now_ns)
        active = [t for t in self.latest.values() if t >= ref - self.keep // 2]
        new_cut = (newest + 1) if final else min(active) - self.grace
        if now_ns is not None and not final:
            new_cut = max(new_cut, min(now_ns - 2 * self.grace, newest + 1))
        start = self.cut if self.cut is not None else min(
            int(s.ts.min()) for parts in self.buffers.values() for s in parts if len(s))
        if new_cut <= start:
            return False
        merged = {n: Segments.concat(parts) for n, parts in self.buffers.items()}
        t0 = time.perf_counter()
        read = {n: ReadStats() for n in self.nodes}  # published by _publish_read
        b = analyze(merged, self.roles, window_s=self.window_s, read_stats=read, publish=(start, new_cut))
        self.collector.add(b, time.perf_counter() - t0)
        for note in b.notes:  # (a shared clock the captures contradict, a guessed address): once
            key = note.split(":")[0]  # per subject ("capture of X", "A and B share a clock ..."),
            if key not in self._noted and len(self._noted) < 1000:  # whatever its figures
                self._noted.add(key)
                log.warning("%s", note)
        self.cut = new_cut
        floor = new_cut - self.keep
        for n, segs in merged.items():
            self.buffers[n] = [segs.take(np.flatnonzero(segs.ts >= floor))] if len(segs) else []
        return True

    def _publish_read(self) -> None:
        """The packet counts read since the last call, to the collector (no analysis needed)."""
        self.collector.add_read(self._read_delta())


async def _pump(node: str, reader: asyncio.StreamReader, live: LiveAnalyzer, health: StreamHealth) -> None:
    while chunk := await reader.read(1 << 16):
        live.feed(node, chunk)
        health.up[node] = 1


async def _stdin(src: LiveSource, live: LiveAnalyzer, health: StreamHealth) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    protocol = asyncio.StreamReaderProtocol(reader)
    await loop.connect_read_pipe(lambda: protocol, sys.stdin.buffer)
    await _pump(src.node, reader, live, health)
    live.close(src.node)


async def _tcpdump(src: LiveSource, live: LiveAnalyzer, health: StreamHealth, snaplen: int) -> str:
    """Run one tcpdump until it exits; what it said last, with its exit code."""
    proc = await asyncio.create_subprocess_exec(*src.command(snaplen), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
                                                start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    err = bytearray()

    async def drain(stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            err.extend(chunk)
            del err[:-2048]

    drainer = asyncio.create_task(drain(proc.stderr))
    try:
        await _pump(src.node, proc.stdout, live, health)
        rc = await proc.wait()
        await asyncio.wait({drainer}, timeout=1)
    finally:
        drainer.cancel()
        await _stop_group(proc)
    lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    return f"tcpdump exited with code {rc}" + (f": {' | '.join(lines[-3:])[:400]}" if lines else "")


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """End tcpdump and whatever it started (its own process group: a wrapper's children too,
    which would hold the pipes open), TERM then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), 5)
            return
        except TimeoutError:
            pass


async def _source(src: LiveSource, live: LiveAnalyzer, health: StreamHealth, stop: asyncio.Event, snaplen: int,
                  backoff: tuple[float, float]) -> None:
    """One source, restarted with a backoff when it fails; its failures never end the others."""
    delay, logged, unlogged = backoff[0], -LOG_EVERY_S, 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            if src.interface is None:
                await _stdin(src, live, health)
                health.up[src.node] = 0
                return
            why = await _tcpdump(src, live, health, snaplen)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # not a capture, tcpdump not startable, ...: this source only
            why = f"{type(e).__name__}: {e}"
        if stop.is_set():
            return
        health.up[src.node] = 0
        health.failures[src.node] += 1
        live.restart(src.node)
        if time.monotonic() - started > backoff[1]:
            delay = backoff[0]  # it ran a while: start the backoff over
        retry = src.interface is not None
        if time.monotonic() - logged >= LOG_EVERY_S:
            more = f" ({unlogged} more failures since the last report)" if unlogged else ""
            log.warning("live source %s: %s%s; %s", src.node, why, more,
                        f"restarting in {delay:g}s" if retry else "not restarted")
            logged, unlogged = time.monotonic(), 0
        else:
            unlogged += 1
        if not retry:
            return
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
        delay = min(delay * 2, backoff[1])


async def run_live(sources: list[LiveSource], live: LiveAnalyzer, stop: asyncio.Event, *,
                   interval_s: float = 5.0, snaplen: int = 512, health: StreamHealth | None = None,
                   backoff: tuple[float, float] = BACKOFF_S) -> None:
    """One task per source (tcpdump, restarted when it fails; or stdin), feeding the analyzer;
    tick every ``interval_s`` until ``stop`` or every source has ended (stdin only ends)."""
    health = health if health is not None else StreamHealth([s.node for s in sources])
    tasks = [asyncio.create_task(_source(src, live, health, stop, snaplen, backoff)) for src in sources]
    try:
        while not stop.is_set() and not all(t.done() for t in tasks):
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass
            live.tick(now_ns=time.time_ns())
        if all(t.done() for t in tasks):
            live.tick(final=True)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
