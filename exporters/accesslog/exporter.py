"""Follow each configured access log, parse its lines, and count them into the metrics.

One :class:`SiteLog` per log (a :class:`~promreflex.follow.LogFollower`, a compiled parser, an
optional router); :class:`AccessLogExporter` owns them all and the poll loop. The per-line path
is one regex match, one ``group`` call and a few plain integer increments (status class by a
dict lookup, histogram bucket by ``bisect``); the prometheus_client counters are updated once
per poll with the totals, and the histograms are :class:`~exporters.accesslog.metrics.LocalHistogram`
counts read only at scrape time, so the cost of the metrics library does not grow with traffic.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

from exporters.accesslog.config import OTHER_ROUTE, AccessLogConfig, LogSource, Route
from exporters.accesslog.metrics import STATUS_CLASSES, AccessLogMetrics, LocalHistogram
from exporters.accesslog.parse import REASONS, LineParser, build_parser, request_path, sum_times
from promreflex.errors import UserError
from promreflex.follow import FollowStats, LogFollower, NotTextError, check_text, follow

log = logging.getLogger(__name__)

# "200" -> index of "2xx" in STATUS_CLASSES: validates and classifies a status in one lookup
_STATUS_INDEX = {str(code): code // 100 - 1 for code in range(100, 600)}
_INF = math.inf

REJECTION_WINDOW_S = 60.0
"""A log whose lines are mostly rejected is reported at most once per this many seconds."""
REJECTION_MIN_LINES = 100

_NO_TIME_HINT = (
    "the lines carry no request time where nginx_timed expects it (` rt=$request_time` right after "
    "the user agent; a plain combined log has none, and a field such as \"$http_x_forwarded_for\" before it "
    "is read as the time; ingress-nginx's default has $request_length there: format custom with its "
    "log-format-upstream): use the promreflex log_format in nginx (exporters/accesslog/README.md), or "
    "format nginx_combined (no latency histogram)"
)
_HINTS = {("nginx_timed", "bad_time"): _NO_TIME_HINT, ("nginx_timed", "no_match"): _NO_TIME_HINT}


class Router:
    """Map a request path to one of a bounded set of route names (first match wins, else ``other``).

    The query string is cut off before matching. Regexes are matched from the path's start.
    """

    def __init__(self, routes: Sequence[Route]) -> None:
        self._rules: list[tuple[str, str | None, re.Pattern[str] | None]] = [
            (r.name, r.prefix, re.compile(r.regex) if r.regex else None) for r in routes
        ]
        self.names: list[str] = [r.name for r in routes]
        if OTHER_ROUTE not in self.names:
            self.names.append(OTHER_ROUTE)
        self._other = self.names.index(OTHER_ROUTE)

    def index(self, path: str | None) -> int:
        """Position in :attr:`names` of the route ``path`` belongs to."""
        if not path:
            return self._other
        q = path.find("?")
        if q >= 0:
            path = path[:q]
        for i, (_, prefix, regex) in enumerate(self._rules):
            if prefix is not None:
                if path.startswith(prefix):
                    return i
            elif regex is not None and regex.match(path):
                return i
        return self._other

    def route(self, path: str | None) -> str:
        return self.names[self.index(path)]


def state_file_for(state_dir: Path, source: LogSource) -> Path:
    """One state file per log, named after the site and a hash of the absolute path."""
    digest = hashlib.blake2b(str(source.path.absolute()).encode(), digest_size=6).hexdigest()
    return state_dir / f"{source.site}-{digest}.json"


def check_followable(path: Path) -> None:
    """Refuse, at start, a path that cannot be a followed text log (UserError says why)."""
    if path.is_dir():
        raise UserError(f"{path} is a directory: give the access log file itself")
    if path.exists() and not path.is_file():  # (exists() and is_file() follow a symbolic link)
        target = f" (a link to {path.resolve()})" if path.is_symlink() else ""
        raise UserError(f"{path}{target} is not a regular file (a FIFO, a device, /dev/stdout as in the official "
                        "nginx image): the exporter follows a log file; have nginx write one (access_log with a file path)")
    if not path.is_file():
        return  # not there yet: followed from its start when it appears
    try:
        problem = check_text(path, allow_gzip=False)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from e
    if problem:
        raise NotTextError(f"{path} is {problem}")


class SiteLog:
    """One followed log: its lines become that site's counters."""

    def __init__(self, source: LogSource, config: AccessLogConfig, metrics: AccessLogMetrics,
                 follower: LogFollower | None = None) -> None:
        self.source = source
        self.site = source.site
        self.metrics = metrics
        self.parser: LineParser = build_parser(source.format, source.log_format, source.backslash_escapes)
        self.router = Router(source.routes) if source.routes else None
        if follower is None:
            check_followable(source.path)
            state_file = state_file_for(config.state_dir, source) if config.state_dir else None
            follower = LogFollower(
                source.path,
                state_file=state_file,
                from_start=config.from_start,
                max_line_bytes=config.max_line_bytes,
                rotated=source.rotated,
            )
        self.follower = follower
        metrics.add_site(
            self.site,
            self.router.names if self.router else [],
            timed=self.parser.has_times,
            upstream_timed=self.parser.has_upstream_times,
            fmt=source.format,
        )
        m, site = metrics, self.site
        self._lines = m.lines.labels(site)
        self._bytes = m.response_bytes.labels(site)
        self._errors = {r: m.parse_errors.labels(site, r) for r in REASONS}
        self._rotations = m.rotations.labels(site)
        self._truncations = m.truncations.labels(site)
        self._skipped = m.skipped_bytes.labels(site)
        self._unrecovered = m.unrecovered.labels(site)
        self._upstream: LocalHistogram | None = m.upstream.labels(site) if self.parser.has_upstream_times else None
        # one requests child per (status class, route index), flattened: class * n_routes + route
        route_values = self.router.names if self.router else [""]
        self._n_routes = len(route_values)
        self._requests = [
            m.requests.labels(*((site, cls, r) if m.route_label else (site, cls)))
            for cls in STATUS_CLASSES
            for r in route_values
        ]
        self._duration: list[LocalHistogram] = (
            [m.duration.labels(*((site, r) if m.route_label else (site,))) for r in route_values]
            if self.parser.has_times else []
        )
        self._seen = FollowStats()
        self._window_start = time.monotonic()
        self._window_lines = 0
        self._window_reasons: Tally[str] = Tally()
        self._window_sample: str | None = None
        self._warned = False
        self._account_follower_stats()

    def resume_info(self) -> str:
        return self.follower.resume_info()

    def poll(self) -> int:
        """Read and count what is new; return the number of lines read."""
        lines = self.follower.poll()
        self.handle(lines)
        return len(lines)

    def handle(self, lines: list[str]) -> None:
        """Count one poll's lines (and the follower's dropped oversized lines) into the metrics."""
        oversized = self._account_follower_stats()
        if not lines and not oversized:
            self._watch_rejections(0, {}, None)
            return
        batch = (self._count_batch(lines) or self._count_exact(lines)) if lines else _Batch(self._n_routes)
        for i, n in enumerate(batch.counts):
            if n:
                self._requests[i].inc(n)
        for h, values in zip(self._duration, batch.durations, strict=True) if batch.durations else ():
            _observe(h, values)  # (a poll of only over-long lines has no durations at all)
        if self._upstream is not None:
            _observe(self._upstream, batch.upstream)
        for reason, n in batch.errors.items():
            self._errors[reason].inc(n)
        if batch.body_bytes:
            self._bytes.inc(batch.body_bytes)
        self._lines.inc(len(lines) + oversized)
        if lines:
            self.metrics.last_line.labels(self.site).set(time.time())  # created by the first line
        if oversized:
            batch.errors["oversized"] = batch.errors.get("oversized", 0) + oversized
        self._watch_rejections(len(lines) + oversized, batch.errors, batch.sample)

    def _count_batch(self, lines: list[str]) -> _Batch | None:
        """The hot path: the whole poll parsed by one ``findall`` of the format's
        :class:`~exporters.accesslog.parse.BatchPattern` (a tuple per line, built in C), then
        counted column by column (``Counter``, ``map(float)``, ``sum``). Lines the strict pattern
        leaves to its catch-all go through :meth:`_count_exact`. None: no batch pattern for this
        format, or damaged bytes in the batch (then every line is judged exactly)."""
        bp = self.parser.batch if self.router is not None else self.parser.batch_without_path
        if bp is None:
            return None
        text = "\n".join(lines) + "\n"
        if "\ufffd" in text or "\x00" in text:
            return None
        rows = bp.regex.findall(text)
        if len(rows) != len(lines):  # a quoted field ran across a newline: judge every line exactly
            return None
        cols = list(zip(*rows, strict=True))
        exact = None
        if "" in cols[bp.status]:  # some lines fell to the catch-all
            bad = bp.bad
            exact = self._count_exact([r[bad] for r in rows if not r[bp.status]])
            rows = [r for r in rows if r[bp.status]]
            cols = list(zip(*rows, strict=True)) if rows else [() for _ in cols]
        n_routes = self._n_routes
        batch = _Batch(n_routes)
        if self.router is None:
            for st, n in Tally(cols[bp.status]).items():
                batch.counts[_STATUS_INDEX[st]] += n
            if bp.request_time is not None:
                batch.durations = [_tally_seconds(Tally(cols[bp.request_time]), bp.time_divisor)]
        else:
            path_col = cols[bp.uri] if bp.uri is not None else map(request_path, cols[bp.request or 0])
            routes = list(map(self.router.index, path_col))
            for (st, r), n in Tally(zip(cols[bp.status], routes, strict=True)).items():
                batch.counts[_STATUS_INDEX[st] * n_routes + r] += n
            if bp.request_time is not None:
                batch.durations = [Tally() for _ in range(n_routes)]
                div = bp.time_divisor
                for (r, rt), n in Tally(zip(routes, cols[bp.request_time], strict=True)).items():
                    batch.durations[r][float(rt) if div == 1.0 else float(rt) / div] += n
        if bp.bytes is not None:
            batch.body_bytes = sum(map(int, filter(None, cols[bp.bytes])))
        if bp.upstream_time is not None:
            # the batch pattern leaves "-" and "" empty; "0.010, 0.020" (several tries) is summed
            batch.upstream = _tally_seconds(Tally(filter(None, cols[bp.upstream_time])))
        if exact is not None:
            batch.merge(exact)
        return batch

    def _count_exact(self, lines: list[str]) -> _Batch:
        """Line by line through :meth:`LineParser.parse`: the reference the fast loop must equal."""
        batch = _Batch(self._n_routes)
        want_path = self.router is not None
        batch.durations = [Tally() for _ in range(self._n_routes)]
        for line in lines:
            r = self.parser.parse(line, want_path)
            if isinstance(r, str):
                batch.errors[r] = batch.errors.get(r, 0) + 1
                batch.sample = batch.sample or line
                continue
            route = self.router.index(r.path) if self.router is not None else 0
            batch.counts[(r.status // 100 - 1) * self._n_routes + route] += 1
            batch.body_bytes += r.body_bytes
            if r.request_time is not None:
                batch.durations[route][r.request_time] += 1
            if r.upstream_time is not None:
                batch.upstream[r.upstream_time] += 1
        if not self._duration:
            batch.durations = []
        return batch

    def _diagnose(self, sample: str) -> str | None:
        """A cause recognised from the log itself, for the warning: nginx compressing it
        (``access_log ... gzip``: the file was empty when the exporter started, so the start
        check passed), or runs of spaces where the format has one (Bitnami's ``main``)."""
        try:
            with open(self.source.path, "rb") as f:
                head = f.read(2)
        except OSError:
            head = b""
        if head == b"\x1f\x8b":
            return ("nginx writes this log gzip-compressed (`access_log ... gzip`): drop `gzip` (and its "
                    "level) from that access_log line; the exporter reads the plain log, and rotated .gz "
                    "copies with the one-shot backfill")
        src = self.source
        if (src.format == "custom" and src.log_format and src.backslash_escapes is None and '\\"' in sample
                and not isinstance(build_parser("custom", src.log_format, True).parse(sample), str)):
            return ("quoted fields hold \\\" (an Apache log, or nginx's escape=json on a text format): add "
                    "`backslash_escapes: true` to this log")
        if "  " in sample and not isinstance(self.parser.parse(re.sub(" {2,}", " ", sample)), str):
            return (f"the lines have two or more spaces between fields where format {self.source.format!r} "
                    "has one (Bitnami's nginx `main`: `$status  $body_bytes_sent`): use `format: custom` "
                    "with the log_format string nginx uses")
        return None

    def _reject_reason(self, line: str) -> str:
        r = self.parser.parse(line)
        return r if isinstance(r, str) else "no_match"

    def _watch_rejections(self, n_lines: int, errors: dict[str, int], sample: str | None) -> None:
        """Log loudly (at most once per window) when most lines of a log are rejected: a wrong
        ``format`` otherwise only shows as zeros. The metrics say it too:
        ``promreflex_accesslog_parse_errors_total / promreflex_accesslog_lines_total``."""
        self._window_lines += n_lines
        self._window_reasons.update(errors)
        if sample is not None and self._window_sample is None:
            self._window_sample = sample
        age = time.monotonic() - self._window_start
        lines = self._window_lines
        if not ((lines >= REJECTION_MIN_LINES and (not self._warned or age >= REJECTION_WINDOW_S))
                or (age >= REJECTION_WINDOW_S and lines > 0)):
            if age >= REJECTION_WINDOW_S:
                self._window_start = time.monotonic()
            return
        rejected = sum(self._window_reasons.values())
        if rejected * 2 > lines:
            top, _ = self._window_reasons.most_common(1)[0]
            hint = self._diagnose(self._window_sample or "") or _HINTS.get((self.source.format, top)) or (
                f"the lines do not have the shape of format {self.source.format!r}: check `format:` "
                "against the nginx/Apache log_format"
            )
            reasons = ", ".join(f"{r} {n}" for r, n in self._window_reasons.most_common())
            first = (self._window_sample or "")[:300]
            log.warning("site %s: %d of %d lines of %s rejected (%s): %s. First rejected line: %r",
                        self.site, rejected, lines, self.source.path, reasons, hint, first)
            self._warned = True
        self._window_start = time.monotonic()
        self._window_lines = 0
        self._window_reasons.clear()
        self._window_sample = None

    def _account_follower_stats(self) -> int:
        """Export what the follower counted since last time; return the new oversized lines."""
        now = self.follower.stats.snapshot()
        d = now.since(self._seen)
        self._seen = now
        if d.oversized_lines:
            self._errors["oversized"].inc(d.oversized_lines)
        if d.rotations:
            self._rotations.inc(d.rotations)
        if d.truncations:
            self._truncations.inc(d.truncations)
        if d.skipped_bytes:
            self._skipped.inc(d.skipped_bytes)
        if d.unrecovered:
            self._unrecovered.inc(d.unrecovered)
        return d.oversized_lines

    def close(self) -> None:
        self.follower.close()


class _Batch:
    """What one poll's lines add: request counts by (status class, route), errors by reason,
    body bytes, durations per route and upstream times (seconds -> how many times seen: log
    times have millisecond resolution, so a batch holds far fewer distinct values than lines)."""

    __slots__ = ("body_bytes", "counts", "durations", "errors", "sample", "upstream")

    def __init__(self, n_routes: int) -> None:
        self.counts = [0] * (len(STATUS_CLASSES) * n_routes)
        self.errors: dict[str, int] = {}
        self.body_bytes = 0
        self.durations: list[Tally[float]] = []
        self.upstream: Tally[float] = Tally()
        self.sample: str | None = None

    def merge(self, other: _Batch) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        for reason, n in other.errors.items():
            self.errors[reason] = self.errors.get(reason, 0) + n
        self.body_bytes += other.body_bytes
        if other.durations:
            self.durations = self.durations or [Tally() for _ in other.durations]
            for mine, theirs in zip(self.durations, other.durations, strict=True):
                mine.update(theirs)
        self.upstream.update(other.upstream)
        self.sample = self.sample or other.sample


def _tally_seconds(texts: Tally[str], divisor: float = 1.0) -> Tally[float]:
    """Times as text (``"0.012"``, ``"0.010, 0.020"``) with their counts -> seconds with counts.
    Converting each distinct value once is what makes counting them per batch cheap. ``divisor``:
    the unit of a request time (1e3 for ``$request_time_ms``, 1e6 for ``$request_time_us``)."""
    out: Tally[float] = Tally()
    for text, n in texts.items():
        try:
            v: float | None = float(text) if divisor == 1.0 else float(text) / divisor
        except ValueError:
            v = sum_times(text)
        if v is not None:
            out[v] += n
    return out


def _observe(h: LocalHistogram, values: Tally[float]) -> None:
    """Add a batch of observations (value -> count): one ``bisect`` per distinct value
    (``le`` is inclusive: a value equal to a bound is in its bucket)."""
    counts, bounds = h.counts, h.bounds
    total = 0.0
    for v, n in values.items():
        counts[bisect_left(bounds, v)] += n
        total += v * n
    h.sum += total


class AccessLogExporter:
    """All configured logs, counted into one registry. Call :meth:`poll` or run :meth:`run`."""

    def __init__(self, config: AccessLogConfig, *, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.config = config
        self.metrics = AccessLogMetrics(
            route_label=config.has_routes, buckets=config.duration_buckets, registry=registry
        )
        self.sites: list[SiteLog] = []
        try:
            for s in config.logs:
                self.sites.append(SiteLog(s, config, self.metrics))
        except BaseException:
            self.close()
            raise

    def resume_infos(self) -> list[str]:
        """Where each log resumed (or why it started fresh): logged at start."""
        out = []
        for s in self.sites:
            info = f"site {s.site}: {s.resume_info()}"
            if s.follower.stats.skipped_bytes:
                info += " (--log.from-start, or from_start: true, reads them)"
            out.append(info)
        return out

    def poll(self) -> int:
        """One round over every log; return the number of lines read."""
        return sum(s.poll() for s in self.sites)

    async def run(self, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
        """Follow every log until ``stop`` is set (``wake``: poll at once)."""
        by_follower = {id(s.follower): s for s in self.sites}

        def on_lines(follower: LogFollower, lines: list[str]) -> None:
            by_follower[id(follower)].handle(lines)

        await follow([s.follower for s in self.sites], on_lines, interval=self.config.poll_interval,
                     stop=stop, wake=wake)

    def close(self) -> None:
        """Persist every log's position and release its file."""
        for s in self.sites:
            s.close()
