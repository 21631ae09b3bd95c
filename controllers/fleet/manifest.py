"""The fleet's manifest: ``promreflex fleet``; no process of the local stack, no route of its own
(the shops' agents carry the copy guard's)."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="fleet",
    summary="a simulated fleet of shop hosts (network namespaces) with host agents, an HA Prometheus pair and an Alertmanager cluster",
    cli=(lazy("controllers.fleet.cli:register"),),
)
