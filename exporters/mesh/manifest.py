"""The mesh exporter's manifest: ``promreflex exporter-mesh`` and the mesh rules (per-edge
latency of Envoy/Istio sidecar logs). It runs beside the services it watches, not in the local
stack, so it declares no process; add it to a stack with ``stack.extra_scrape``."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="mesh",
    summary="per-edge requests, latency and response flags from Envoy/Istio sidecar access logs",
    cli=(lazy("exporters.mesh.cli:register"),),
    rules=("mesh.rules.yml", "mesh-exporter.rules.yml"),
    dashboards=("mesh.json",),
)
