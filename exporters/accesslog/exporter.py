"""Follow each configured access log, parse its lines, and count them into the metrics.

One :class:`SiteLog` per log (a :class:`~promreflex.follow.LogFollower`, a compiled parser, an
optional router); :class:`AccessLogExporter` owns them all and the poll loop. The per-line path
does one regex match and bumps plain local integers; the prometheus_client metrics are updated
once per poll with the totals, so the cost of the metrics library does not grow with traffic
(only the duration histograms need one ``observe`` per line).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

from exporters.accesslog.config import OTHER_ROUTE, AccessLogConfig, LogSource, Route
from exporters.accesslog.metrics import STATUS_CLASSES, AccessLogMetrics
from exporters.accesslog.parse import REASONS, build_parser
from promreflex.follow import FollowStats, LogFollower, follow

log = logging.getLogger(__name__)


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

    def route(self, path: str | None) -> str:
        if not path:
            return OTHER_ROUTE
        q = path.find("?")
        if q >= 0:
            path = path[:q]
        for name, prefix, regex in self._rules:
            if prefix is not None:
                if path.startswith(prefix):
                    return name
            elif regex is not None and regex.match(path):
                return name
        return OTHER_ROUTE


def state_file_for(state_dir: Path, source: LogSource) -> Path:
    """One state file per log, named after the site and a hash of the absolute path."""
    digest = hashlib.blake2b(str(source.path.absolute()).encode(), digest_size=6).hexdigest()
    return state_dir / f"{source.site}-{digest}.json"


class SiteLog:
    """One followed log: its lines become that site's counters."""

    def __init__(self, source: LogSource, config: AccessLogConfig, metrics: AccessLogMetrics) -> None:
        self.source = source
        self.site = source.site
        self.metrics = metrics
        self.parser = build_parser(source.format, source.log_format)
        self.router = Router(source.routes) if source.routes else None
        state_file = state_file_for(config.state_dir, source) if config.state_dir else None
        self.follower = LogFollower(
            source.path,
            state_file=state_file,
            from_start=config.from_start,
            max_line_bytes=config.max_line_bytes,
        )
        metrics.add_site(
            self.site,
            self.router.names if self.router else [],
            timed=self.parser.has_times,
            upstream_timed=self.parser.has_upstream_times,
        )
        m, site = metrics, self.site
        self._lines = m.lines.labels(site)
        self._bytes = m.response_bytes.labels(site)
        self._errors = {r: m.parse_errors.labels(site, r) for r in REASONS}
        self._rotations = m.rotations.labels(site)
        self._truncations = m.truncations.labels(site)
        self._upstream = m.upstream.labels(site) if self.parser.has_upstream_times else None
        # (status class, route) -> child; route "" when the metric has a route label but this
        # site has no routes, and no route at all when no site has routes
        self._requests = {}
        self._duration = {}
        route_values = self.router.names if self.router else [""]
        for r in route_values:
            for cls in STATUS_CLASSES:
                labels = (site, cls, r) if m.route_label else (site, cls)
                self._requests[(cls, r)] = m.requests.labels(*labels)
            if self.parser.has_times:
                self._duration[r] = m.duration.labels(*((site, r) if m.route_label else (site,)))
        self._seen = FollowStats()
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
            return
        parse = self.parser.parse
        router = self.router
        want_path = router is not None
        per_key: dict[tuple[str, str], int] = {}
        errors: dict[str, int] = {}
        body_total = 0
        durations = self._duration
        upstream = self._upstream
        classes = (None, *STATUS_CLASSES)  # status 100..599 was checked by the parser
        for line in lines:
            r = parse(line, want_path)
            if r.__class__ is str:
                errors[r] = errors.get(r, 0) + 1  # type: ignore[index]
                continue
            status, body, rt, urt, path = r  # type: ignore[misc]
            route = router.route(path) if router is not None else ""
            key = (classes[status // 100], route)
            per_key[key] = per_key.get(key, 0) + 1
            body_total += body
            if rt is not None:
                durations[route].observe(rt)
            if urt is not None and upstream is not None:
                upstream.observe(urt)
        for key, n in per_key.items():
            self._requests[key].inc(n)
        for reason, n in errors.items():
            self._errors[reason].inc(n)
        if body_total:
            self._bytes.inc(body_total)
        self._lines.inc(len(lines) + oversized)
        self.metrics.last_line.labels(self.site).set(time.time())  # created by the first line

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
        return d.oversized_lines

    def close(self) -> None:
        self.follower.close()


class AccessLogExporter:
    """All configured logs, counted into one registry. Call :meth:`poll` or run :meth:`run`."""

    def __init__(self, config: AccessLogConfig, *, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.config = config
        self.metrics = AccessLogMetrics(
            route_label=config.has_routes, buckets=config.duration_buckets, registry=registry
        )
        self.sites = [SiteLog(s, config, self.metrics) for s in config.logs]

    def resume_infos(self) -> list[str]:
        """Where each log resumed (or why it started fresh): logged at start."""
        return [f"site {s.site}: {s.resume_info()}" for s in self.sites]

    def poll(self) -> int:
        """One round over every log; return the number of lines read."""
        return sum(s.poll() for s in self.sites)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow every log until ``stop`` is set."""
        by_follower = {id(s.follower): s for s in self.sites}

        def on_lines(follower: LogFollower, lines: list[str]) -> None:
            by_follower[id(follower)].handle(lines)

        await follow([s.follower for s in self.sites], on_lines, interval=self.config.poll_interval, stop=stop)

    def close(self) -> None:
        """Persist every log's position and release its file."""
        for s in self.sites:
            s.close()
