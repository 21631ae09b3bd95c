"""The nginx keepalive tuner: what nginx is doing (response time, memory, idle keepalive
connections) and what the tuner did (state, trials, applied keepalive_timeout).

Setup the panels need: the access-log exporter (response time), ``promreflex
exporter-nginx-memory`` scraped by Prometheus (memory), the nginx exporter (connections), and a
controller with a ``retune-nginx`` route (the tuner's own series appear on its /metrics as soon
as it starts, before any tuning).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.build import Query, new_dashboard, register, stat_panel, timeseries_panel


@register("nginx_tuner.json")
def nginx_tuner() -> dashboard.Dashboard:
    """Response time, memory and idle connections of nginx next to the tuner's trials and applied value."""
    return (
        new_dashboard(
            "promreflex-nginx-tuner",
            "promreflex / nginx keepalive tuner",
            "keepalive_timeout trades idle connections held (memory) against new connections (handshakes, "
            "response time): the proxy's side of that trade and the tuner's trials and decisions.",
            tags=("nginx", "tuner"),
        )
        .with_row(dashboard.Row("nginx"))
        .with_panel(
            timeseries_panel(
                "Response time by site",
                "s",
                Query("site:promreflex_http_request_duration_seconds:mean1m", "{{site}} mean"),
                Query("site:promreflex_http_request_duration_seconds:p95_1m", "{{site}} p95"),
                Query("threshold:promreflex_nginx_response_time_p95_seconds:max", "p95 alert threshold"),
                description="From the access log ($request_time), over 1 minute; NginxResponseTimeHigh compares the p95 "
                "with the threshold series.",
            )
        )
        .with_panel(
            timeseries_panel(
                "nginx memory (PSS, master + workers)",
                "bytes",
                Query("instance:promreflex_nginx_memory_bytes:sum", "{{instance}}"),
                description="PSS summed over nginx's master and workers (promreflex exporter-nginx-memory). Each idle "
                "keepalive connection costs the worker about half a KiB of heap on plain HTTP.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Connections: idle keepalive vs active",
                "short",
                Query("sum(nginx_connections_waiting)", "idle (waiting)"),
                Query("sum(nginx_connections_active)", "active"),
                Query("sum(rate(nginx_connections_accepted[$__rate_interval]))", "accepted/s (handshakes)"),
                description="A longer keepalive_timeout holds more idle connections and accepts fewer new ones.",
            )
        )
        .with_row(dashboard.Row("Tuner"))
        .with_panel(
            stat_panel(
                "Applied keepalive_timeout",
                "s",
                # No tuner yet (no retune route, or before its first run) is the same 0 as the
                # tuner's own "not tuned yet".
                "max(promreflex_nginx_tuner_applied_keepalive_timeout_seconds) or vector(0)",
                description="The value the tuner last applied or found in the config (0: not tuned yet).",
                value_text={"0": ("not tuned", "text")},
                width=4,
            )
        )
        .with_panel(
            stat_panel(
                "Tuner state",
                "short",
                # Each state alone `or vector(0)`: a sum with one empty term is empty ("No data").
                '(max(promreflex_nginx_tuner_state{state="sweeping"}) or vector(0)) * 1 '
                '+ (max(promreflex_nginx_tuner_state{state="applying"}) or vector(0)) * 2 '
                '+ (max(promreflex_nginx_tuner_state{state="rolled_back"}) or vector(0)) * 3',
                description="idle, sweeping (measuring candidates), applying (a reload in progress) or rolled_back "
                "(the last change was undone).",
                value_text={"0": ("idle", "green"), "1": ("sweeping", "blue"), "2": ("applying", "orange"),
                            "3": ("rolled back", "red")},
                width=4,
            )
        )
        .with_panel(
            timeseries_panel(
                "Trials and retunings by result",
                "short",
                Query("sum by (result) (increase(promreflex_nginx_tuner_trials_total[15m]))", "trials {{result}}"),
                Query("sum by (result) (increase(promreflex_nginx_tuner_retunes_total[1h]))", "retunes {{result}}"),
                description="Trials: ok, errors (rolled back to the last good value), load_failed, apply_failed "
                "(nginx -t or reload failed, rolled back). Retunes: changed, kept, outside_window, failed.",
                width=16,
            )
        )
        .with_panel(
            timeseries_panel(
                "Applied keepalive_timeout over time",
                "s",
                Query("max(promreflex_nginx_tuner_applied_keepalive_timeout_seconds)", "applied"),
                description="Steps at each trial of a sweep, then the chosen value.",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Latest trial: mean response time by candidate",
                "s",
                Query('max by (value) (promreflex_nginx_tuner_trial_response_time_seconds{stat="mean"})', "{{value}} s"),
                description="Latest trial of each candidate keepalive_timeout (seconds in the legend); the sweep's "
                "intervals and Pareto front are in its JSON/PNG results.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Latest trial: memory by candidate",
                "bytes",
                Query("max by (value) (promreflex_nginx_tuner_trial_memory_bytes)", "{{value}} s"),
                description="nginx memory in the latest trial of each candidate.",
            )
        )
    )
