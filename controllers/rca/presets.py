"""Defaults shared by the ``rca`` action and the ``promreflex rca`` commands.

They live here, not in either of them, so neither imports the other (the action imports
nothing from the CLI and the CLI imports the action lazily at most).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Where the online action writes its latest report and ``rca explain`` reads it.
DEFAULT_REPORT = Path(".promreflex/rca/latest.json")

#: The dependency graph: the mesh exporter's own series, or the recorded one, which is all a mesh
#: read from Istio's standard metrics has (docs/mesh.md: its edge rule records only this name;
#: reading the raw name alone gave 0 call edges there, and the dependency rule never ran).
EDGES_QUERY = ("group by (source, destination) (last_over_time(promreflex_mesh_edge_info[$span]) "
               "or last_over_time(source_destination:promreflex_mesh_edge_info:max[$span]))")

#: The recorded series of rules/mesh.rules.yml, as the analysis reads them. A ``source.queries``
#: given in the route's params is merged over these, key by key. ``rca analyse`` and
#: ``rca offline --prometheus.url`` use the same ones.
MESH_QUERIES: dict[str, Any] = {
    "edges": EDGES_QUERY,
    "latency": "service:promreflex_mesh_request_duration_seconds:p99_1m",
    "latency_service_label": "service",
    "latency_max": "max by (service) (max_over_time(service:promreflex_mesh_request_duration_seconds:max_1m[$window]))",
    "latency_caller": (
        'max by (service) (label_replace(source_destination:promreflex_mesh_request_duration_seconds:p99_1m'
        '{source!="unknown"}, "service", "$1", "destination", "(.+)"))'
    ),
    "errors": (
        'max by (service) (label_replace(source_destination:promreflex_mesh_request_errors:ratio_rate1m, '
        '"service", "$1", "destination", "(.+)"))'
    ),
    "alerts": 'ALERTS{alertname="ServiceResponseTimeHigh",alertstate="firing"}',
    "alert_service_labels": ["service"],
}
