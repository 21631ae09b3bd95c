"""The overview dashboard: stack health, controller activity and the demo nginx."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.build import Query, new_dashboard, register, stat_panel, timeseries_panel


@register("overview.json")
def overview() -> dashboard.Dashboard:
    """Stack health, controller activity and the demo nginx: the first page to open."""
    return (
        new_dashboard(
            "promreflex-overview",
            "promreflex / overview",
            "Is the monitoring loop alive (targets, alerts, Watchdog), what is the controller doing, "
            "and how busy is nginx.",
        )
        .with_row(dashboard.Row("Stack health"))
        .with_panel(
            timeseries_panel(
                "Targets up by job",
                "percentunit",
                Query("job:up:ratio", "{{job}}"),
                description="Share of each job's scrape targets answering (1 = all up).",
                width=10,
                max_value=1,
            )
        )
        .with_panel(
            stat_panel(
                "Targets down",
                "short",
                # `up == 0` returns nothing when every target answers: that empty result is
                # a legitimate zero, so `or vector(0)` shows 0 instead of "No data".
                "count(up == 0) or vector(0)",
                description="Scrape targets not answering right now.",
                thresholds=((None, "green"), (1, "red")),
                height=8,
            )
        )
        .with_panel(
            stat_panel(
                "Watchdog",
                "short",
                # The Watchdog alert always fires; its absence is the failure this panel shows,
                # so an empty result is a legitimate 0 ("MISSING"), not missing data.
                'sum(ALERTS{alertname="Watchdog", alertstate="firing"}) or vector(0)',
                description="The always-firing Watchdog alert is present: rule evaluation works.",
                thresholds=((None, "red"), (1, "green")),
                value_text={"0": ("MISSING", "red"), "1": ("OK", "green")},
                height=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Firing alerts by name",
                "short",
                Query('sum by (alertname) (ALERTS{alertstate="firing"})', "{{alertname}}"),
                description="Alerts firing in Prometheus, by alert name (Watchdog always included).",
                width=6,
            )
        )
        .with_row(dashboard.Row("Controller"))
        .with_panel(
            timeseries_panel(
                "Notifications by status and result",
                "ops",
                Query(
                    "sum by (status, result) (status_result:promreflex_controller_notifications:rate1m)",
                    "{{status}} {{result}}",
                ),
                description="Alerts received in webhook notifications per second: accepted, "
                "duplicate (Alertmanager delivers at least once) or stale.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Actions by action and result",
                "ops",
                Query(
                    "sum by (action, result) (action_result:promreflex_controller_actions:rate1m)",
                    "{{action}} {{result}}",
                ),
                description="Action transitions per second, by action and result (ok, error, skipped, cooldown).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Action duration p95",
                "s",
                Query("action:promreflex_controller_action_duration_seconds:p95_5m", "{{action}}"),
                description="95th percentile time an action transition took, over 5 minutes.",
            )
        )
        .with_panel(
            stat_panel(
                "Time since last reconcile",
                "s",
                "time() - max(promreflex_controller_last_reconcile_timestamp_seconds)",
                description="Seconds since the controller last reconciled against Alertmanager's "
                "active alerts (a huge value means never).",
                thresholds=((None, "green"), (60, "orange"), (300, "red")),
                width=6,
            )
        )
        .with_panel(
            stat_panel(
                "Applied alerts",
                "short",
                # No series before the controller's first scrape or without actions: 0 applied.
                "sum(promreflex_controller_applied_alerts) or vector(0)",
                description="Alerts whose firing transition the controller has applied and not yet resolved.",
                width=6,
            )
        )
        .with_panel(
            timeseries_panel(
                "Payload rejections by reason",
                "ops",
                Query(
                    "sum by (reason) (rate(promreflex_controller_payload_rejections_total[$__rate_interval]))",
                    "{{reason}}",
                ),
                description="Webhook bodies rejected per second (unauthorized, too large, invalid...).",
                width=12,
                height=4,
            )
        )
        .with_row(dashboard.Row("nginx"))
        .with_panel(
            timeseries_panel(
                "nginx request rate",
                "reqps",
                Query("sum(rate(nginx_http_requests_total[$__rate_interval]))", "requests"),
                description="HTTP requests per second served by nginx (stub_status).",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "nginx connections",
                "short",
                Query("sum(nginx_connections_active)", "active"),
                Query("sum(nginx_connections_reading)", "reading"),
                Query("sum(nginx_connections_writing)", "writing"),
                Query("sum(nginx_connections_waiting)", "waiting"),
                description="Client connections by state (stub_status).",
                width=12,
            )
        )
    )


