"""The metrics of the access-log exporter, held per registry so tests can build fresh ones.

Two groups, as the conventions ask: what the logs say about HTTP traffic
(``promreflex_http_*``), and what the exporter says about itself (``promreflex_accesslog_*``).

The ``route`` label exists only when at least one log maps paths to routes; logs without
routes then carry ``route=""``, which Prometheus stores as "no route label", so a query like
``sum by (site) (rate(promreflex_http_requests_total[1m]))`` reads the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from exporters.accesslog.parse import REASONS

STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


class AccessLogMetrics:
    """Every metric family the exporter writes; one instance per registry."""

    def __init__(
        self,
        *,
        route_label: bool,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.route_label = route_label
        http_labels = ["site", "status_class"] + (["route"] if route_label else [])
        timed_labels = ["site"] + (["route"] if route_label else [])
        # --- HTTP traffic, from the lines
        self.requests = Counter(
            "promreflex_http_requests",
            "HTTP requests read from access logs, by site and status class (route: configured path group).",
            http_labels,
            registry=registry,
        )
        self.duration = Histogram(
            "promreflex_http_request_duration_seconds",
            "Request duration as the web server logged it ($request_time), for logs that carry it.",
            timed_labels,
            buckets=tuple(buckets),
            registry=registry,
        )
        self.upstream = Histogram(
            "promreflex_http_upstream_response_duration_seconds",
            "Time spent waiting for upstreams ($upstream_response_time, every try summed), "
            "for requests that reached one.",
            ["site"],
            buckets=tuple(buckets),
            registry=registry,
        )
        self.response_bytes = Counter(
            "promreflex_http_response_bytes",
            "Response body bytes sent ($body_bytes_sent / %b).",
            ["site"],
            registry=registry,
        )
        # --- the exporter itself
        self.lines = Counter(
            "promreflex_accesslog_lines",
            "Complete lines read from the log, parsed or not.",
            ["site"],
            registry=registry,
        )
        self.parse_errors = Counter(
            "promreflex_accesslog_parse_errors",
            "Lines that were not counted as requests, by reason.",
            ["site", "reason"],
            registry=registry,
        )
        self.last_line = Gauge(
            "promreflex_accesslog_last_line_timestamp_seconds",
            "Wall-clock time at which the exporter last read a line of this log (absent until the first).",
            ["site"],
            registry=registry,
        )
        self.rotations = Counter(
            "promreflex_accesslog_rotations",
            "Rename rotations of the log noticed (while running or across a restart).",
            ["site"],
            registry=registry,
        )
        self.truncations = Counter(
            "promreflex_accesslog_truncations",
            "Truncations (copytruncate) of the log noticed; reading restarted at offset 0.",
            ["site"],
            registry=registry,
        )

    def add_site(self, site: str, routes: Sequence[str], timed: bool, upstream_timed: bool) -> None:
        """Create every series of a site at 0, so ``rate()`` and ``increase()`` work from the start.

        ``routes`` is the site's full route set (configured names plus ``other``), or empty
        when the site has no routes.
        """
        route_values = list(routes) if self.route_label and routes else ([""] if self.route_label else [])
        for cls in STATUS_CLASSES:
            if self.route_label:
                for r in route_values:
                    self.requests.labels(site, cls, r)
            else:
                self.requests.labels(site, cls)
        if timed:
            if self.route_label:
                for r in route_values:
                    self.duration.labels(site, r)
            else:
                self.duration.labels(site)
        if upstream_timed:
            self.upstream.labels(site)
        self.response_bytes.labels(site)
        self.lines.labels(site)
        for reason in REASONS:
            self.parse_errors.labels(site, reason)
        self.rotations.labels(site)
        self.truncations.labels(site)
