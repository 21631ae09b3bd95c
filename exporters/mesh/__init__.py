"""Mesh exporter: per-edge request metrics from Istio/Envoy sidecar access logs.

Reads what Istio sidecars write (the default text format, the JSON encoding, or any Envoy
format string, compiled; Envoy's own default; Istio ambient's ztunnel logs, text or JSON, and
waypoint logs), behind CRI, Docker, ``kubectl logs --timestamps`` or Filebeat wrappers, and counts
requests per edge ``source -> destination`` with status class, response flags, duration and upstream service
time. The dependency graph is ``promreflex_mesh_edge_info``.

Modules: ``envoy_format`` (format-string compiler: parser and writer), ``json_format``,
``ztunnel_format``, ``formats`` (names -> formats, ``auto``),
``runtime`` (container wrappers), ``labels`` (edges, bounded label values), ``collector``
(metrics, ``feed``/``observe``), ``writer`` (log like Istio), ``config``, ``cli``.
"""

from exporters.mesh.collector import DURATION_BUCKETS, PARSE_ERROR_REASONS, FeedStats, MeshExporter, MeshStream
from exporters.mesh.envoy_format import (
    ISTIO_LEGACY_TEXT_FORMAT,
    ISTIO_TEXT_FORMAT,
    CompiledFormat,
    FormatStringError,
    ParseError,
)
from exporters.mesh.formats import get_format
from exporters.mesh.json_format import ISTIO_JSON_FORMAT, JsonFormat
from exporters.mesh.labels import derive_edge
from exporters.mesh.writer import AccessLogWriter, inbound_cluster, outbound_cluster

__all__ = [
    "AccessLogWriter",
    "CompiledFormat",
    "DURATION_BUCKETS",
    "FeedStats",
    "FormatStringError",
    "ISTIO_JSON_FORMAT",
    "ISTIO_LEGACY_TEXT_FORMAT",
    "ISTIO_TEXT_FORMAT",
    "JsonFormat",
    "MeshExporter",
    "MeshStream",
    "PARSE_ERROR_REASONS",
    "ParseError",
    "derive_edge",
    "get_format",
    "inbound_cluster",
    "outbound_cluster",
]
