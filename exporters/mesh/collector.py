"""Per-edge request metrics from sidecar access logs, fed line by line.

Event-driven, like every log exporter: a follower hands lines to :meth:`MeshStream.feed` (or
:meth:`MeshStream.observe` one at a time), each line is unwrapped (container runtime), parsed
(the stream's format), turned into an edge ``source -> destination`` and counted. Nothing here
reads files or serves HTTP, so tests feed fixture lines and read a fresh registry.

Every line a stream is given ends up either parsed or rejected with one reason from
:data:`PARSE_ERROR_REASONS` (or skipped with one from :data:`SKIP_REASONS`, counted the same
way), so ``promreflex_mesh_lines_total`` equals the parsed records plus the sum of
``promreflex_mesh_parse_errors_total`` for that workload. A record that cannot be
counted (junk a parser let through, a bug) is rejected as ``bad_value``: no line's failure ever
leaves :meth:`MeshStream.feed`, so a follower never stops on one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter as PromCounter, Gauge, Histogram

from exporters.mesh.envoy_format import MAX_TIMED_MS, ParseError
from exporters.mesh.formats import PROXY_LOG_CONTINUATION, LineFormat, get_format, proxy_log_continues, proxy_log_line
from exporters.mesh.labels import (
    OTHER,
    UNKNOWN,
    LabelBudget,
    code_class,
    derive_edge,
    flags_label,
    grpc_status_label,
    is_tcp_record,
    service_name,
    tcp_class,
    tcp_failed,
)
from exporters.mesh.runtime import RFC3339_PREFIX, RuntimeUnwrapper

log = logging.getLogger("promreflex.exporter.mesh")

# 1 ms .. 30 s, dense around the paper's candidate 3 s threshold so it is a bucket boundary.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)

# Where a record carries the gRPC status: %GRPC_STATUS%, %GRPC_STATUS_NUMBER%, or the
# grpc-status trailer/header logged directly (%TRAILER(GRPC-STATUS)%, %RESP(GRPC-STATUS)%:
# trailers-only responses put it in the headers).
GRPC_STATUS_KEYS = ("grpc_status", "grpc_status_number", "trailer_grpc_status", "resp_grpc_status")

PARSE_ERROR_REASONS = (
    "empty",  # blank line
    "too_long",  # longer than max_line_bytes (or a split message that grew past it)
    "bad_wrapper",  # a Docker json-file line that is not valid JSON
    "other_stream",  # stderr of the container (Envoy's own log), not an access log line
    "truncated",  # a proper prefix of a valid line / JSON object, or a split line never finished
    "format_mismatch",  # text that does not fit the format string
    "invalid_json",  # a JSON line (istio_json, ztunnel's JSON) that is not a JSON object
    "missing_field",  # JSON object without response_code; ztunnel line without src.addr / dst.addr
    "bad_value",  # JSON value of the wrong type (a non-numeric response_code, ...), or a record not countable
)
# Lines that are not records to count (not rejections of the log's format): `proxy_log`, a line
# of the proxy's own log in the same stream (pilot-agent, Envoy as Istio formats it, ztunnel's
# other targets: formats.proxy_log_line), created at 0 for every log; `not_a_record`, ztunnel's
# DEBUG "connection opened" (its "connection complete" line is the record), created at 0 only
# for the logs whose format can write them (ztunnel, auto).
SKIP_REASONS = ("proxy_log", "not_a_record")
_SKIPPING_FORMATS = frozenset({"ztunnel", "auto"})
# What a proxy's own line is rejected as by the access-log formats (text; JSON without the
# access log's fields; a text line in a JSON log), before it is recognised as one.
_PROXY_LOG_REJECTIONS = frozenset({"format_mismatch", "missing_field", "invalid_json"})


class MeshMetrics:
    """The exporter's metric objects, registered on ``registry`` (tests pass a fresh one)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, buckets: tuple[float, ...] = DURATION_BUCKETS):
        self.requests = PromCounter(
            "promreflex_mesh_requests",
            "Requests seen in sidecar access logs, per edge, status class and response flags.",
            ["source", "destination", "code_class", "response_flags"],
            registry=registry,
        )
        def edge_histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["source", "destination"], buckets=buckets, registry=registry)

        self.duration = edge_histogram(
            "promreflex_mesh_request_duration_seconds",
            "Envoy %DURATION% of requests per edge (first byte in to last byte out).",
        )
        self.upstream_time = edge_histogram(
            "promreflex_mesh_upstream_service_time_seconds",
            "x-envoy-upstream-service-time per edge (time the upstream took, as Envoy saw it).",
        )
        self.grpc = PromCounter(
            "promreflex_mesh_grpc_responses",
            "Responses carrying a gRPC status (%GRPC_STATUS%), per edge and status name.",
            ["source", "destination", "grpc_status"],
            registry=registry,
        )
        self.edge_info = Gauge(
            "promreflex_mesh_edge_info",
            "1 for every edge source -> destination seen between known services (the dependency graph).",
            ["source", "destination"],
            registry=registry,
        )
        # self-metrics
        self.label_overflow = PromCounter(
            "promreflex_mesh_label_overflow",
            "Service names folded into \"other\" because max_services distinct names were already in use, by label.",
            ["label"],
            registry=registry,
        )
        for label in ("source", "destination"):
            self.label_overflow.labels(label)
        self.lines = PromCounter(
            "promreflex_mesh_lines",
            "Log lines read per configured workload log (split runtime pieces joined first).",
            ["workload"],
            registry=registry,
        )
        self.parse_errors = PromCounter(
            "promreflex_mesh_parse_errors",
            "Lines rejected per workload log and reason.",
            ["workload", "reason"],
            registry=registry,
        )

    def prepare(self, workload: str, skip_reasons: Iterable[str] = ()) -> None:
        """Create the workload's self-metric series at 0, so increase() works from the first error."""
        self.lines.labels(workload)
        for reason in (*PARSE_ERROR_REASONS, *skip_reasons):
            self.parse_errors.labels(workload, reason)


@dataclass
class FeedStats:
    """What some lines turned into (returned by observe/feed, accumulated per stream)."""

    lines: int = 0
    parsed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def add(self, other: FeedStats) -> None:
        self.lines += other.lines
        self.parsed += other.parsed
        self.rejected.update(other.rejected)


class MeshExporter:
    """Holds the metrics and the label budget; hands out one :class:`MeshStream` per log."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry = REGISTRY,
        namespaces: Iterable[str] = (),
        max_services: int = 200,
        max_line_bytes: int = 64 * 1024,
        buckets: tuple[float, ...] = DURATION_BUCKETS,
    ):
        self.metrics = MeshMetrics(registry, buckets)
        self.namespaces = frozenset(namespaces)
        self.budget = LabelBudget(max_services, on_overflow=lambda label: self.metrics.label_overflow.labels(label).inc())
        self.max_line_bytes = max_line_bytes
        self.streams: dict[str, MeshStream] = {}
        self._edges: set[tuple[str, str]] = set()

    def add_stream(
        self,
        workload: str,
        format: str = "istio_text",
        format_string: str | None = None,
        *,
        json_format: Mapping[str, str] | None = None,
        workload_field: str | None = None,
        name: str | None = None,
    ) -> MeshStream:
        """A stream for one log written by ``workload``'s sidecar (``name`` defaults to it)."""
        if service_name(workload) != workload:
            raise ValueError(f"workload {workload!r} must be a lower-case DNS label (like a Kubernetes app name)")
        fmt = get_format(format, format_string, json_format)
        stream = MeshStream(self, workload, fmt, workload_field=workload_field)
        key = name or workload
        if key in self.streams:
            raise ValueError(f"a stream named {key!r} exists already")
        self.streams[key] = stream
        self.metrics.prepare(workload, SKIP_REASONS if format in _SKIPPING_FORMATS else ("proxy_log",))
        return stream

    def count(self, record: Mapping[str, Any], workload: str) -> tuple[str, str]:
        """Count one parsed record written by ``workload``'s sidecar; return its edge.

        Public so a simulator can count records without writing text first.
        """
        # Every label and value first, then the metrics: a record that raises here (junk the
        # parser let through) is rejected by the stream without having been half counted.
        src, dst = derive_edge(record, workload, self.namespaces)
        m = self.metrics
        grpc = grpc_status_label(next((record[k] for k in GRPC_STATUS_KEYS if record.get(k) not in (None, "", "-")), None))
        flags = flags_label(record.get("response_flags"))
        if record.get("l4"):  # a ztunnel connection: no HTTP status; failed = no answer
            connection, status = True, tcp_class(bool(record.get("failed")))
        elif is_tcp_record(record, grpc):  # a sidecar's TCP connection ("- - -" 0): the same
            connection, status = True, tcp_class(
                tcp_failed(record.get("response_flags"), record.get("connection_termination_details")))
        else:
            connection, status = False, code_class(record.get("response_code"), grpc, record.get("response_flags"))
        # A connection's DURATION is its lifetime (minutes for a pooled one), not a request's
        # latency: it stays out of the request histograms; so does an upgraded one's (a
        # WebSocket's 101, logged when the socket closes) and a CONNECT tunnel's.
        tunnel = record.get("response_code") == 101 or record.get("method") == "CONNECT"
        duration = None if connection or tunnel else record.get("duration")
        if isinstance(duration, int) and duration > MAX_TIMED_MS:
            duration = None  # a day-long "request" is a stream (a watch, server-sent events): counted, not timed
        upstream = None if connection else record.get("upstream_service_time")
        src, dst = self.budget.admit(src, "source"), self.budget.admit(dst, "destination")
        m.requests.labels(src, dst, status, flags).inc()
        if isinstance(duration, int) and not isinstance(duration, bool):
            m.duration.labels(src, dst).observe(duration / 1000.0)
        if isinstance(upstream, int) and not isinstance(upstream, bool):
            m.upstream_time.labels(src, dst).observe(upstream / 1000.0)
        if grpc is not None:
            m.grpc.labels(src, dst, grpc).inc()
        edge = (src, dst)
        if edge not in self._edges and UNKNOWN not in edge and OTHER not in edge:
            self._edges.add(edge)
            m.edge_info.labels(src, dst).set(1)
        return edge

    def edges(self) -> set[tuple[str, str]]:
        """Edges between known services seen so far (what ``promreflex_mesh_edge_info`` lists)."""
        return set(self._edges)


class MeshStream:
    """One workload's log: runtime unwrapping state, its format, its counts."""

    def __init__(self, exporter: MeshExporter, workload: str, fmt: LineFormat, *, workload_field: str | None = None):
        self.exporter = exporter
        self.workload = workload
        self.format = fmt
        self.workload_field = workload_field
        self.unwrapper = RuntimeUnwrapper(exporter.max_line_bytes)
        self.stats = FeedStats()
        # lines since the last proxy's own line began, while they continue it (proxy_log_continues);
        # None: the last line was not one
        self._proxy_log_run: int | None = None

    def observe(self, line: str) -> FeedStats:
        """Handle one physical line (a split runtime piece may complete nothing yet)."""
        out = FeedStats()
        if len(line) > self.exporter.max_line_bytes:
            results = [*self.unwrapper.flush()]
            self._reject(out, "too_long")
        else:
            try:
                results = self.unwrapper.push(line)
            except Exception as e:  # noqa: BLE001 - as below: a counted rejection, never the follower's end
                log.warning("line of %s not unwrapped (%s): counted as bad_wrapper", self.workload, type(e).__name__)
                results = []
                self._reject(out, "bad_wrapper")
        for item in results:
            if item.text is None:
                self._reject(out, item.reason or "format_mismatch")
                continue
            if not item.text.strip():
                self._reject(out, "empty")
                continue
            try:
                record = self._parse(item.text)
            except ParseError as e:
                run, self._proxy_log_run = self._proxy_log_run, None
                if e.reason in _PROXY_LOG_REJECTIONS:
                    if proxy_log_line(item.text):
                        self._proxy_log_run = 0
                    elif run is not None and run < PROXY_LOG_CONTINUATION and proxy_log_continues(item.text):
                        self._proxy_log_run = run + 1
                self._reject(out, "proxy_log" if self._proxy_log_run is not None else e.reason)
                continue
            except Exception as e:  # noqa: BLE001 - a parser's bug: one line lost and counted, not the exporter
                log.warning("line of %s not parsed (%s): counted as bad_value", self.workload, type(e).__name__)
                self._proxy_log_run = None  # a line of its own, not the proxy's message going on
                self._reject(out, "bad_value")
                continue
            self._proxy_log_run = None
            for k, v in item.fields.items():
                record.setdefault(k, v)
            try:
                self.exporter.count(record, self._source_workload(record))
            except Exception as e:  # noqa: BLE001 - one line lost and counted, never the follower
                log.warning("line of %s not counted (%s): counted as bad_value", self.workload, type(e).__name__)
                self._reject(out, "bad_value")
                continue
            self.exporter.metrics.lines.labels(self.workload).inc()
            out.lines += 1
            out.parsed += 1
        self.stats.add(out)
        return out

    def feed(self, lines: Iterable[str]) -> FeedStats:
        """Handle many lines (a follower's poll); returns what they turned into."""
        total = FeedStats()
        for line in lines:
            total.add(self.observe(line))
        return total

    def flush(self) -> FeedStats:
        """End of input: a split message still waiting for its last piece is ``truncated``."""
        out = FeedStats()
        for item in self.unwrapper.flush():
            self._reject(out, item.reason or "truncated")
        self.stats.add(out)
        return out

    def reject(self, reason: str, n: int = 1) -> None:
        """Count ``n`` lines rejected before they reached this stream (the follower's oversized lines)."""
        out = FeedStats()
        for _ in range(n):
            self._reject(out, reason)
        self.stats.add(out)

    def _reject(self, out: FeedStats, reason: str) -> None:
        if reason not in PARSE_ERROR_REASONS and reason not in SKIP_REASONS:
            reason = "format_mismatch"
        m = self.exporter.metrics
        m.lines.labels(self.workload).inc()
        m.parse_errors.labels(self.workload, reason).inc()
        out.lines += 1
        out.rejected[reason] += 1

    def _parse(self, text: str) -> dict[str, Any]:
        """The record of ``text``; a line that does not match and starts with an RFC 3339 time
        and a space is tried once more without it (``kubectl logs --timestamps`` before a format
        the runtime unwrapper cannot tell from one that starts with its own time)."""
        try:
            return self.format.parse(text)
        except ParseError as e:
            stamp = RFC3339_PREFIX.match(text) if e.reason in ("format_mismatch", "truncated") else None
            if stamp is None:
                raise
            try:
                return self.format.parse(text[stamp.end():])
            except ParseError:
                raise e from None

    def _source_workload(self, record: Mapping[str, Any]) -> str:
        """The workload that wrote this record: its ``workload_field`` when valid, else the stream's."""
        if self.workload_field:
            named = service_name(record.get(self.workload_field))
            if named:
                return named
        return self.workload


__all__ = ["DURATION_BUCKETS", "FeedStats", "MeshExporter", "MeshMetrics", "MeshStream", "PARSE_ERROR_REASONS", "SKIP_REASONS"]
