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
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np

from exporters.swift.analyze import analyze
from exporters.swift.metrics import SwiftTimingCollector
from exporters.swift.pcap import ReadStats, Segments, StreamParser
from exporters.swift.roles import RoleMap
from promreflex.errors import UserError

log = logging.getLogger("promreflex.exporter.swift")


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
        tcpdump = shutil.which("tcpdump") or "/usr/bin/tcpdump"
        # --immediate-mode: packets reach tcpdump as they come (not in kernel-buffered batches
        # of up to 1 s, which tcpdump can lose when it is stopped); -U: written out at once.
        cmd = [tcpdump, "-i", str(self.interface), "--immediate-mode", "-U", "-w", "-",
               "--time-stamp-precision=nano", "-s", str(snaplen), "-n", "tcp"]
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd


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
        self._reported = {n: ReadStats() for n in nodes}

    def feed(self, node: str, chunk: bytes) -> None:
        segs = self.parsers[node].feed(chunk)
        if len(segs):
            self.buffers[node].append(segs)
            self.latest[node] = max(self.latest.get(node, 0), int(segs.ts.max()))

    def close(self, node: str) -> None:
        self.parsers[node].close()

    def _read_delta(self) -> dict[str, ReadStats]:
        out = {}
        for n, p in self.parsers.items():
            rep, cur = self._reported[n], p.stats
            d = ReadStats(cur.packets - rep.packets, cur.segments - rep.segments, cur.snapped - rep.snapped,
                          cur.rejected - rep.rejected)
            rep.add(d)
            out[n] = d
        return out

    def tick(self, final: bool = False, now_ns: int | None = None) -> bool:
        """Analyse the buffers; publish what ended since the last cut. False: nothing to do yet.

        ``now_ns`` (the live loop passes the wall clock, which tcpdump's kernel timestamps share):
        when every stream is quiet, the cut still moves up to ``2 x grace`` before now, so the
        last requests before a pause are published without waiting for more traffic."""
        if not self.latest:
            return False
        newest = max(self.latest.values())
        # A stream that has been silent for half of `keep` (an idle node) does not hold the cut back.
        active = [t for t in self.latest.values() if t >= newest - self.keep // 2]
        new_cut = (newest + 1) if final else min(active) - self.grace
        if now_ns is not None and not final:
            new_cut = max(new_cut, min(now_ns - 2 * self.grace, newest + 1))
        start = self.cut if self.cut is not None else min(
            int(s.ts.min()) for parts in self.buffers.values() for s in parts if len(s))
        if new_cut <= start:
            return False
        read = self._read_delta()
        merged = {n: Segments.concat(parts) for n, parts in self.buffers.items()}
        t0 = time.perf_counter()
        b = analyze(merged, self.roles, window_s=self.window_s, read_stats=read, publish=(start, new_cut))
        self.collector.add(b, time.perf_counter() - t0)
        self.cut = new_cut
        floor = new_cut - self.keep
        for n, segs in merged.items():
            self.buffers[n] = [segs.take(np.flatnonzero(segs.ts >= floor))] if len(segs) else []
        return True


async def _pump(node: str, reader: asyncio.StreamReader, live: LiveAnalyzer) -> None:
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            live.close(node)
            return
        live.feed(node, chunk)


async def run_live(sources: list[LiveSource], live: LiveAnalyzer, stop: asyncio.Event, *,
                   interval_s: float = 5.0, snaplen: int = 512) -> None:
    """Start one tcpdump per source (or read stdin), feed the analyzer, tick every ``interval_s``."""
    procs: list[asyncio.subprocess.Process] = []
    tasks = []
    try:
        for src in sources:
            if src.interface is None:
                loop = asyncio.get_running_loop()
                reader = asyncio.StreamReader(limit=1 << 20)
                protocol = asyncio.StreamReaderProtocol(reader)
                await loop.connect_read_pipe(lambda: protocol, sys.stdin.buffer)
            else:
                proc = await asyncio.create_subprocess_exec(*src.command(snaplen), stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.DEVNULL)
                procs.append(proc)
                assert proc.stdout is not None
                reader = proc.stdout
            tasks.append(asyncio.create_task(_pump(src.node, reader, live)))
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        while not stop.is_set() and not done.done():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass
            live.tick(now_ns=time.time_ns())
        if done.done():
            live.tick(final=True)
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
                try:
                    await asyncio.wait_for(p.wait(), 5)
                except TimeoutError:
                    p.kill()
        for t in tasks:
            t.cancel()
