"""Swift's access logs as a second source of transaction ids for the proxy's joins.

When the capture's snap length cut the headers (no ``X-Trans-Id`` in the packets), the servers'
access log lines still name each request's transaction id:

- proxy (proxy-logging): ``proxy: CLIENT REMOTE DATE METHOD PATH PROTO STATUS ... TXID ...
  REQUEST_TIME SOURCE LOG_INFO START END POLICY``: a start time to the microsecond.
  Lines with client ``-`` are the proxy's own sub-requests (no packet): skipped.
- account/container/object servers: ``NAME: REMOTE - - [DATE] "METHOD PATH" STATUS LEN
  "REFERER" "TXID" "AGENT" REQUEST_TIME ...``: the end of the request to the second.

A server-side exchange without a transaction id takes the one of the log line with the same
method, path (unquoted, without the query; a prefix when the snap length cut the request line)
and remote address whose time fits (proxy: start
within 0.25 s; storage servers: the logged second, minus the request time, within 1.5 s); the
nearest proxy line (when 5 ms nearer than the next), or a single fitting storage line, is used. The id then spreads to the same exchange seen by the caller's
capture (same connection, start within 0.5 s), which is what the join reads.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from exporters.swift.exchanges import CUT, Exchange
from exporters.swift.pcap import ip_int

_STORAGE = re.compile(r'^\S+: (\S+) - - \[([^\]]+)\] "(\S+) (\S+)" (\d{3}) \S+ "[^"]*" "([^"]*)" "[^"]*" ([\d.]+)')
PRECISE_S = 0.25  # the proxy's logged start vs its capture's first request segment (same machine)
MARGIN_S = 0.005  # the nearest proxy line must be this much nearer than the next
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}


@dataclass(frozen=True)
class LogRequest:
    remote: int
    method: str
    path: str
    trans_id: str
    start: float  # epoch seconds (storage servers: end second minus request time)
    precise: bool  # the proxy's start time (µs), not a whole second


def _path(p: str) -> str:
    return unquote(p.split("?", 1)[0])


def _storage_time(text: str) -> float | None:
    m = re.match(r"(\d{2})/(\w{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})", text)
    if not m or m.group(2) not in _MONTHS:
        return None
    d, mon, y, hh, mm, ss, sign, oh, om = m.groups()
    t = calendar.timegm((int(y), _MONTHS[mon], int(d), int(hh), int(mm), int(ss), 0, 0, 0))
    off = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return float(t - off)


def parse_line(line: str) -> LogRequest | None:
    """One access-log line of a Swift server, or None (not an access line, a sub-request)."""
    try:
        if line.startswith("proxy"):
            f = line.split()
            if len(f) < 21 or f[1] == "-" or not f[14].startswith("tx"):
                return None
            return LogRequest(ip_int(f[1]), f[4], _path(f[5]), f[14], float(f[19]), True)
        m = _STORAGE.search(line)
        if not m or not m.group(6).startswith("tx"):
            return None
        end = _storage_time(m.group(2))
        if end is None:
            return None
        return LogRequest(ip_int(m.group(1)), m.group(3), _path(m.group(4)), m.group(6), end - float(m.group(7)), False)
    except (ValueError, IndexError):
        return None


MAX_LINE = 64 * 1024  # a Swift access line is a few hundred bytes; longer is not one


def read_logs(paths: Iterable[str | Path]) -> tuple[list[LogRequest], int]:
    """Every access line of the files; and how many lines were not access lines (one longer
    than :data:`MAX_LINE` is skipped in bounded pieces: ``/dev/zero`` or a binary file given by
    mistake cannot fill the memory)."""
    out: list[LogRequest] = []
    skipped = 0
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            while line := f.readline(MAX_LINE):
                if len(line) >= MAX_LINE and not line.endswith("\n"):
                    skipped += 1
                    while (rest := f.readline(MAX_LINE)) and not rest.endswith("\n"):
                        pass
                    continue
                r = parse_line(line)
                if r is None:
                    skipped += 1
                else:
                    out.append(r)
    return out, skipped


def apply_logs(exchanges: list[Exchange], logs: list[LogRequest]) -> int:
    """Give server-side exchanges without a transaction id the one of their log line; spread it
    to the caller's view of the same exchange. Returns how many exchanges got one."""
    index: dict[tuple[int, str], list[LogRequest]] = {}
    for r in logs:
        index.setdefault((r.remote, r.method), []).append(r)
    added = 0
    for x in exchanges:
        if x.side != "server" or x.trans_id or not x.target:
            continue
        cut = x.target.endswith(CUT)
        want = _path(x.target.removesuffix(CUT)) if cut else _path(x.target)
        cands = [r for r in index.get((x.client[0], x.method), [])
                 if (r.path.startswith(want) if cut else r.path == want)]
        t = x.req_start / 1e9
        fit = sorted((abs(r.start - t), r.trans_id, r.precise) for r in cands
                     if abs(r.start - t) <= (PRECISE_S if r.precise else 1.5))
        precise = [f for f in fit if f[2]]
        if precise and (len(precise) == 1 or precise[1][0] - precise[0][0] > MARGIN_S):
            x.trans_id = precise[0][1]  # the proxy's start time: the nearest, when clearly nearest
        elif not precise and len({f[1] for f in fit}) == 1:
            x.trans_id = fit[0][1]  # whole seconds: only when a single id fits
        else:
            continue
        added += 1
    by_conn: dict[tuple[tuple[int, int], tuple[int, int]], list[Exchange]] = {}
    for x in exchanges:
        if x.trans_id:
            by_conn.setdefault((x.client, x.server), []).append(x)
    for x in exchanges:
        if x.trans_id:
            continue
        for other in by_conn.get((x.client, x.server), []):
            if other.node != x.node and abs(other.req_start - x.req_start) < 500_000_000:
                x.trans_id = other.trans_id
                added += 1
                break
    return added

