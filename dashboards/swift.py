"""The Swift packet-timing dashboard: where a request's time goes, per node and per hop.

Reads the recorded series of rules/swift.rules.yml, fed by ``promreflex swift-timing serve``
(exporters/swift). The timing diagram of one request (the paper's Figures 15/16) is not a
Grafana panel: ``promreflex swift-timing diagram`` draws it from the same captures.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard, stat

from dashboards.build import Query, new_dashboard, register, stat_panel, timeseries_panel

NODE = "{{node}} {{role}}"
HOP = "{{src_role}} → {{dst_role}}"


def _firing(title: str, alert: str, description: str) -> stat.Panel:
    """How many ``alert`` alerts fire (no firing alert is a legitimate zero)."""
    return stat_panel(title, "short", f'count(ALERTS{{alertname="{alert}", alertstate="firing"}}) or vector(0)',
                      description=f"{description} ({alert})", width=6, thresholds=((None, "green"), (1, "red")))


@register("swift.json")
def swift() -> dashboard.Dashboard:
    """Slow nodes and hops, then the breakdown: node processing, hop transit, phases, TCP trouble."""
    return (
        new_dashboard(
            "promreflex-swift",
            "promreflex / swift packet timing",
            "Where an OpenStack Swift request's time goes, from packet captures on every node: each "
            "server's own processing (request in -> response out, minus its wait for the body and for its calls), each hop's one-way "
            "transit (segments matched between the sender's and the receiver's capture), the phases "
            "the proxy sees (auth, account, container, object), and TCP retransmissions, resets and "
            "failed connections.",
            tags=["swift"],
        )
        .with_row(dashboard.Row("Slow nodes and hops"))
        .with_panel(_firing("Slow nodes", "SwiftNodeSlow",
                            "Swift servers whose p99 processing is above the threshold for 2 minutes."))
        .with_panel(_firing("Slow hops", "SwiftHopSlow",
                            "Hops whose p99 one-way transit is above the threshold for 2 minutes."))
        .with_panel(
            stat_panel(
                "Ambiguous proxy joins",
                "percentunit",
                # No join yet (no traffic) is 0, not "No data".
                "swift:promreflex_swift_joins_ambiguous:ratio_rate5m or vector(0)",
                description="Share of the proxy's calls to storage servers that could not be tied to one "
                "client request (several open, no X-Trans-Id in the capture): their phases are guesses.",
                width=6,
                thresholds=((None, "green"), (0.2, "orange")),
            )
        )
        .with_panel(
            stat_panel(
                "Failed connections (10m)",
                "short",
                "sum(increase(promreflex_swift_connection_failures_total[10m])) or vector(0)",
                description="TCP connection attempts to Swift servers that got no SYN-ACK in 10 minutes.",
                width=6,
                thresholds=((None, "green"), (1, "red")),
            )
        )
        .with_row(dashboard.Row("Node processing"))
        .with_panel(
            timeseries_panel(
                "p99 processing by node",
                "s",
                Query("node_role:promreflex_swift_node_processing_seconds:p99_rate5m", NODE),
                Query("swift:promreflex_swift_node_processing_threshold:seconds", "threshold"),
                description="99th percentile over 5m of the time each server held a request (its own "
                "processing, not the network's nor its callees'), and the SwiftNodeSlow threshold.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Mean processing by node",
                "s",
                Query("node_role:promreflex_swift_node_processing_seconds:mean_rate5m", NODE),
                description="Mean processing per request over 5m: where the time goes on average.",
                width=12,
            )
        )
        .with_row(dashboard.Row("Hops"))
        .with_panel(
            timeseries_panel(
                "p99 one-way transit by hop",
                "s",
                Query("hop:promreflex_swift_hop_transit_seconds:p99_rate5m", HOP),
                Query("swift:promreflex_swift_hop_transit_threshold:seconds", "threshold"),
                description="99th percentile over 5m of each segment's transit between the sender's and "
                "the receiver's capture, clock offsets removed, and the SwiftHopSlow threshold.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Retransmitted share by hop",
                "percentunit",
                Query("hop:promreflex_swift_retransmissions:ratio_rate5m", HOP),
                description="Retransmitted segments over segments matched, per hop, over 5m.",
                width=12,
                max_value=1,
            )
        )
        .with_row(dashboard.Row("Request phases and TCP"))
        .with_panel(
            timeseries_panel(
                "p99 phase time at the proxy",
                "s",
                Query("phase:promreflex_swift_phase_seconds:p99_rate5m", "{{phase}}"),
                description="auth: the /auth request; account, container, object: the proxy's calls to "
                "those servers (connect to response end), as the proxy's capture sees them.",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Resets and failed connections",
                "short",
                Query("sum by (src_role, dst_role) (increase(promreflex_swift_resets_total[5m]))", "reset " + HOP),
                Query("sum by (role) (increase(promreflex_swift_connection_failures_total[5m]))", "failed to {{role}}"),
                description="TCP resets by hop and connection attempts without a SYN-ACK, per 5m.",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Packets read and rejected",
                "pps",
                Query("sum by (node) (rate(promreflex_swift_packets_total[5m]))", "{{node}} read"),
                Query("sum by (node, reason) (rate(promreflex_swift_packets_rejected_total[5m]))",
                      "{{node}} {{reason}}"),
                Query("sum by (node) (rate(promreflex_swift_packets_duplicate_total[5m]))", "{{node}} copies"),
                description="The exporter's input per node, what it could not use, by reason, and the copies of "
                            "a packet it dropped (tcpdump -i any on a host with a bridge, VLAN or bond records "
                            "each packet once per device).",
                width=8,
            )
        )
    )
