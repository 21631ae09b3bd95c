"""The metrics of the access-log exporter, held per registry so tests can build fresh ones.

Two groups, as the conventions ask: what the logs say about HTTP traffic
(``promreflex_http_*``), and what the exporter says about itself (``promreflex_accesslog_*``).

The ``route`` label exists only when at least one log maps paths to routes; logs without
routes then carry ``route=""``, which Prometheus stores as "no route label", so a query like
``sum by (site) (rate(promreflex_http_requests_total[1m]))`` reads the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporters.accesslog.parse import REASONS

STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


class LocalHistogram:
    """One histogram series kept as plain integers: ``counts[i]`` is the number of observations
    in bucket ``i`` (not cumulative; ``bisect_left(bounds, v)`` finds it, so ``le`` is inclusive
    as Prometheus wants), the last slot is ``+Inf``. The hot loop bumps these directly; the
    cumulative buckets are computed only when ``/metrics`` is scraped. Cheaper by about 0.5 µs
    per observation than prometheus_client's ``Histogram.observe`` (a lock and a bucket scan)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0


class HistogramFamily(Collector):
    """A histogram family whose series are :class:`LocalHistogram` objects: the custom-collector
    way prometheus_client recommends for values counted elsewhere. Same exposition as a
    ``Histogram`` (without ``_created``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry | None) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = list(labelnames)
        self.bounds = [float(b) for b in buckets]
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], LocalHistogram] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> LocalHistogram:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LocalHistogram(self.bounds)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, h in list(self._children.items()):
            running, buckets = 0, []
            for le, n in zip(self._les, h.counts, strict=True):
                running += n
                buckets.append((le, float(running)))
            fam.add_metric(list(values), buckets, h.sum if math.isfinite(h.sum) else math.inf)
        yield fam


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
        self.duration = HistogramFamily(
            "promreflex_http_request_duration_seconds",
            "Request duration as the web server logged it ($request_time), for logs that carry it.",
            timed_labels,
            buckets,
            registry,
        )
        self.upstream = HistogramFamily(
            "promreflex_http_upstream_response_duration_seconds",
            "Time spent waiting for upstreams ($upstream_response_time, every try summed), "
            "for requests that reached one.",
            ["site"],
            buckets,
            registry,
        )
        def per_site(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["site"], registry=registry)

        self.response_bytes = per_site("promreflex_http_response_bytes", "Response body bytes sent ($body_bytes_sent / %b).")
        # --- the exporter itself
        self.lines = per_site("promreflex_accesslog_lines", "Complete lines read from the log, parsed or not.")
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
        self.rotations = per_site(
            "promreflex_accesslog_rotations",
            "Rename rotations of the log noticed (while running or across a restart).")
        self.truncations = per_site(
            "promreflex_accesslog_truncations",
            "Truncations (copytruncate) of the log noticed; the unread rest was read from the copy, "
            "then the log from offset 0.")
        self.skipped_bytes = per_site(
            "promreflex_accesslog_skipped_bytes",
            "Bytes already in the log at a first start without saved position, not counted "
            "(the default starts at the end; --log.from-start reads them).")
        self.unrecovered = per_site(
            "promreflex_accesslog_unrecovered_rotations",
            "Truncations or restarts after which the unread rest of the previous file was not found "
            "among the rotated files: lines may be missing from the counts.")
        self.info = Gauge(
            "promreflex_accesslog_log_info",
            "1 per followed log, with its format (names the format when its lines are rejected).",
            ["site", "format"],
            registry=registry,
        )

    def add_site(self, site: str, routes: Sequence[str], timed: bool, upstream_timed: bool, fmt: str = "") -> None:
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
        self.skipped_bytes.labels(site)
        self.unrecovered.labels(site)
        if fmt:
            self.info.labels(site, fmt).set(1)
