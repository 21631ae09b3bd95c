"""The Swift packet-timing capability: ``promreflex swift-timing`` (analyze, diagram, serve), its
rules and its dashboard. The exporter runs beside the captures it reads (files of a lab run, or
live tcpdump in the nodes' network namespaces), not in the local stack, so it declares no
process; scrape ``swift-timing serve`` with ``stack.extra_scrape``. ``promreflex swift-lab``
(lab.py: the namespaced Swift that produces such captures) comes with it."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="swift",
    summary="per-hop transit and per-node processing of OpenStack Swift requests from packet captures",
    # swift-timing (this exporter) and swift-lab (lab.py: the namespaced Swift that feeds it).
    cli=(lazy("exporters.swift.cli:register"), lazy("exporters.swift.lab:register")),
    rules=("swift.rules.yml",),
    dashboards=("swift.json",),
)
