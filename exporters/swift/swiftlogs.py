"""Swift's access logs as a second source of transaction ids for the proxy's joins.

When the capture's snap length cut the headers (no ``X-Trans-Id`` in the packets), the servers'
access log lines still name each request's transaction id. A line is ``NAME: MESSAGE`` or
``NAME[PID]: MESSAGE`` (the lab's console: ``proxy: ...``, ``object-s1: ...``), optionally after a
syslog header, as Swift's lines reach a file through syslog (its default): BSD
(``Nov 23 15:42:24 host proxy-server: ...``, ``journalctl`` short and short-precise), RFC 3339
(rsyslog's ``RSYSLOG_FileFormat``, ``journalctl -o short-iso``: ``2026-11-23T15:42:24.470123+00:00
host proxy-server[123]: ...``) or RFC 5424 (``<134>1 TS HOST proxy-server 123 - - MESSAGE``, the
tag being the APP-NAME). The message is read by its shape, whatever the name:

- proxy (proxy-logging): ``CLIENT REMOTE DATE METHOD PATH PROTO STATUS ... TXID ...
  REQUEST_TIME SOURCE LOG_INFO START END POLICY``: a start time to the microsecond. The TCP peer
  is REMOTE (CLIENT is Swift's guess from ``X-Forwarded-For``, not read). Lines with client or
  remote ``-`` are the proxy's own sub-requests (no packet): skipped. PATH is quoted whole, its
  query too (``?`` logged as ``%3F``): unquoted, then cut at the ``?``.
- account/container/object servers: ``REMOTE - - [DATE] "METHOD PATH" STATUS LEN
  "REFERER" "TXID" "AGENT" REQUEST_TIME ...``: the end of the request to the second.

Addresses are IPv4 (``::ffff:a.b.c.d``, a dual-stack server's, read as ``a.b.c.d``); a line with
another remote address is skipped. A gzip-compressed file is refused (:class:`SwiftLogError`).

A server-side exchange without a transaction id takes the one of the log line with the same
method, path (unquoted, without the query; a prefix when the snap length, or the 512-character
limit on the kept target, cut the request line: a cut inside a ``%XX`` escape or a UTF-8
character is dropped first) and remote address whose time fits (proxy: start
within 0.25 s; storage servers: the logged second, minus the request time, within 1.5 s); the
nearest proxy line (when 5 ms nearer than the next), or a single fitting storage line, is used. The id then spreads to the same exchange seen by the caller's
capture (same connection, start within 0.5 s), which is what the join reads.
"""

from __future__ import annotations

import calendar
import codecs
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes

from exporters.swift.exchanges import CUT, Exchange
from exporters.swift.pcap import ip_int

_STORAGE = re.compile(r'^(\S+) - - \[([^\]]+)\] "(\S+) (\S+)" (\d{3}) \S+ "[^"]*" "([^"]*)" "[^"]*" ([\d.]+)')
# An optional syslog header, then the tag ``NAME:`` or ``NAME[PID]:`` and the message.
_ISO_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_BSD_TS = r"[A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d(?:\.\d+)?"
_TAGGED = re.compile(r"^(?:<\d{1,3}>)?(?:(?:" + _ISO_TS + "|" + _BSD_TS + r") (?:\S+ )?)?"
                     r"([^\s:\[\]]+)(?:\[\d+\])?: (.*)$")
_RFC5424 = re.compile(r"^<\d{1,3}>1 \S+ \S+ (\S+) \S+ \S+ (?:-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: \ufeff?(.*))?$")
PRECISE_S = 0.25  # the proxy's logged start vs its capture's first request segment (same machine)
MARGIN_S = 0.005  # the nearest proxy line must be this much nearer than the next
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}
_GZIP_MAGIC = b"\x1f\x8b"


class SwiftLogError(ValueError):
    """A ``--swift-log`` file that cannot be read as a log (gzip-compressed)."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


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


def _proxy_path(p: str) -> str:
    """The proxy quotes the whole path with its query (``?`` logged as ``%3F``): unquote, then cut."""
    return unquote(p).split("?", 1)[0]


_PARTIAL_ESCAPE = re.compile(r"%[0-9A-Fa-f]?$")


def _cut_path(p: str) -> str:
    """:func:`_path` of a target the snap length cut: a trailing partial ``%XX`` escape and an
    incomplete UTF-8 character are dropped (unquoted, they would not be a prefix of the path)."""
    if "?" in p:  # the path itself is whole
        return _path(p)
    raw = unquote_to_bytes(_PARTIAL_ESCAPE.sub("", p))
    return codecs.getincrementaldecoder("utf-8")("replace").decode(raw, final=False)


def _ip(text: str) -> int:
    """An IPv4 address, also as a dual-stack server logs it (``::ffff:a.b.c.d``)."""
    if text[:7].lower() == "::ffff:" and "." in text:
        text = text[7:]
    return ip_int(text)


def _storage_time(text: str) -> float | None:
    m = re.match(r"(\d{2})/(\w{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})", text)
    if not m or m.group(2) not in _MONTHS:
        return None
    d, mon, y, hh, mm, ss, sign, oh, om = m.groups()
    t = calendar.timegm((int(y), _MONTHS[mon], int(d), int(hh), int(mm), int(ss), 0, 0, 0))
    off = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return float(t - off)


def _message(line: str) -> str | None:
    """The message after the tag (``NAME:``, ``NAME[PID]:``, RFC 5424's APP-NAME), past an
    optional syslog header; None without a tag."""
    line = line.rstrip("\r\n")
    m = _RFC5424.match(line) if line.startswith("<") else None
    if m:
        msg = m.group(2) or ""
        tagged = _TAGGED.match(msg)  # a relay that kept Swift's "NAME: " in the message
        return tagged.group(2) if tagged and tagged.group(1) == m.group(1) else msg
    m = _TAGGED.match(line)
    return m.group(2) if m else None


def parse_line(line: str) -> LogRequest | None:
    """One access-log line of a Swift server, or None (not an access line, a sub-request)."""
    msg = _message(line)
    if msg is None:
        return None
    try:
        m = _STORAGE.match(msg)
        if m:
            if not m.group(6).startswith("tx"):
                return None
            end = _storage_time(m.group(2))
            if end is None:
                return None
            return LogRequest(_ip(m.group(1)), m.group(3), _path(m.group(4)), m.group(6), end - float(m.group(7)),
                              False)
        f = msg.split()
        if len(f) < 20 or f[0] == "-" or f[1] == "-" or not f[13].startswith("tx"):
            return None
        return LogRequest(_ip(f[1]), f[3], _proxy_path(f[4]), f[13], float(f[18]), True)
    except (ValueError, IndexError):
        return None


MAX_LINE = 64 * 1024  # a Swift access line is a few hundred bytes; longer is not one


def read_logs(paths: Iterable[str | Path]) -> tuple[list[LogRequest], int]:
    """Every access line of the files; and how many lines were not access lines (one longer
    than :data:`MAX_LINE` is skipped in bounded pieces: ``/dev/zero`` or a binary file given by
    mistake cannot fill the memory). A gzip-compressed file raises :class:`SwiftLogError`."""
    out: list[LogRequest] = []
    skipped = 0
    for p in paths:
        with open(p, "rb") as raw:
            if raw.peek(2)[:2] == _GZIP_MAGIC:
                raise SwiftLogError(p, "gzip-compressed, decompress it first (gunzip)")
            f = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
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
        want = _cut_path(x.target.removesuffix(CUT)) if cut else _path(x.target)
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

