"""The mesh dashboard: which service is slow against its line, what the rca action flagged as
the root cause, and the service graph's edges with their rates, errors and latency.

Reads the recorded series of rules/mesh.rules.yml (fed by the mesh exporter) and the rca
action's metrics on the controller. Needs a mesh exporter scraped by Prometheus (see
docs/mesh.md); tests/e2e/test_rca_mesh.py runs every query below against such a stack.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.build import Query, new_dashboard, register, stat_panel, timeseries_panel

EDGE = "{{source}} → {{destination}}"


@register("mesh.json")
def mesh() -> dashboard.Dashboard:
    """Slow services, the flagged root cause, and the call graph's edges."""
    return (
        new_dashboard(
            "promreflex-mesh",
            "promreflex / mesh",
            "Which service answers slowly (maximum response time against its line), which one the "
            "rca action names as the root cause, and every caller -> callee edge with its rate, "
            "error ratio and p99 latency.",
            tags=["mesh", "rca"],
        )
        .with_row(dashboard.Row("Slow services and the root cause"))
        .with_panel(
            stat_panel(
                "Flagged root cause",
                "none",
                # No series while no incident is flagged: that empty result is a legitimate
                # "none", shown as 0 -> "none".
                Query("max by (service) (promreflex_root_cause) or vector(0)", "{{service}}"),
                description="Services the rca action names as root cause (promreflex_root_cause, the "
                "score: latency score x (1 + resource score)). `promreflex rca explain` prints why.",
                width=6,
                thresholds=((None, "green"), (0.001, "red")),
                value_text={"0": ("none", "green")},
            )
        )
        .with_panel(
            stat_panel(
                "Slow services",
                "short",
                # No firing alert is a legitimate zero.
                'count(ALERTS{alertname="ServiceResponseTimeHigh", alertstate="firing"}) or vector(0)',
                description="Services whose ServiceResponseTimeHigh fires (inhibited symptoms included).",
                width=6,
                thresholds=((None, "green"), (1, "orange")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Maximum response time vs line",
                "s",
                Query("service:promreflex_mesh_request_duration_seconds:max_1m", "{{service}} max"),
                Query("service:promreflex_mesh_response_time_threshold_seconds:effective", "{{service}} line"),
                description="Upper bound of the slowest request each service received in the last minute "
                "(the highest histogram bucket with a request), and the line ServiceResponseTimeHigh "
                "compares it with (3 s unless promreflex_mesh_response_time_threshold_seconds is published).",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "p99 response time by service",
                "s",
                Query("service:promreflex_mesh_request_duration_seconds:p99_1m", "{{service}}"),
                description="99th percentile over 1m of the requests each service received: the series "
                "the root-cause analysis scores against its own baseline.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Root-cause analyses by result",
                "short",
                Query("sum by (result) (increase(promreflex_rca_findings_total[5m]))", "{{result}}"),
                description="Analyses run by the rca action in the last 5 minutes: root_cause, "
                "no_root_cause, no_candidates, error.",
                width=12,
            )
        )
        .with_row(dashboard.Row("Service graph edges"))
        .with_panel(
            timeseries_panel(
                "Requests per edge",
                "reqps",
                Query("source_destination:promreflex_mesh_requests:rate1m", EDGE),
                description="Requests per second on each caller -> callee edge (source `unknown`: "
                "requests seen by the callee's inbound sidecar).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Error ratio per edge",
                "percentunit",
                Query("source_destination:promreflex_mesh_request_errors:ratio_rate1m", EDGE),
                description="Share of each edge's requests answered 5xx or not at all (code 0: UF, UH, DC...).",
                max_value=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "p99 latency per edge",
                "s",
                Query("source_destination:promreflex_mesh_request_duration_seconds:p99_1m", EDGE),
                description="99th percentile over 1m of each edge's request duration as its sidecar logged it.",
            )
        )
    )
