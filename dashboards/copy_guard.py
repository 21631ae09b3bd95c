"""The copy-guard dashboard (seed 000): is the shop suffering, is a copy to blame, what did the
guard do. Served RPS against the calibrated threshold (and where it is heading), demand against
the floor that tells "overloaded" from "quiet", each copy's state and progress, and the pauses.

Data needs: the copy-guard rules and a threshold (``promreflex calibrate``), the controller with
a ``copy-guard`` route, and each ``promreflex copy`` scraped (``stack.extra_scrape`` job, e.g.
``copy``); tests/e2e/test_copy_guard_loop.py builds exactly that stack and checks every query.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard, statetimeline
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import ValueMap, ValueMappingResult

from dashboards.build import DATASOURCE, Query, _targets, new_dashboard, register, stat_panel, timeseries_panel


def state_timeline(title: str, *queries: Query, description: str = "", width: int = 12, height: int = 6):
    """A state timeline of 0/1 series: a band where the value is 1 (paused, firing...)."""
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries, instant=False))
        .span(width)
        .height(height)
        .show_value(common.VisibilityMode.NEVER)
        .mappings([ValueMap(options={"0": ValueMappingResult(text="no", color="transparent"),
                                     "1": ValueMappingResult(text="yes", color="orange")})])
    )


@register("copy_guard.json")
def copy_guard() -> dashboard.Dashboard:
    """Copy guard: site throughput vs threshold, demand, copies and pauses."""
    return (
        new_dashboard(
            "promreflex-copy-guard",
            "promreflex / copy guard",
            "Pause a backup copy while the shop suffers: served RPS against the calibrated threshold, "
            "demand against the quiet-site floor, each copy's state and progress, the guard's pauses.",
            tags=("copy-guard",),
        )
        .with_row(dashboard.Row("Is the site suffering?"))
        .with_panel(
            timeseries_panel(
                "Served RPS vs threshold",
                "reqps",
                Query("site:promreflex_http_requests_served:rate1s", "served {{site}}"),
                Query("site:promreflex_copy_guard_threshold:rps", "threshold {{site}}"),
                Query("site:promreflex_http_requests_served:predict2s", "projected +2s {{site}}"),
                description="2xx/3xx responses per second over 1 s (access log), the calibrated threshold "
                "below which the site suffers, and the 2 s linear projection the predictive alert uses.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Demand vs quiet floor",
                "reqps",
                Query("site:promreflex_copy_guard_demand:rps", "demand {{site}}"),
                Query("site:promreflex_copy_guard_demand_floor:rps", "floor {{site}}"),
                description="Largest of completions/s, arrivals/s at nginx and requests in flight. Below the "
                "floor the site is quiet (night): a low RPS then never pauses a copy.",
                width=12,
            )
        )
        .with_panel(
            state_timeline(
                "Guard alerts",
                Query('max by (alertname) (ALERTS{alertname=~"CopyGuard.*", alertstate="firing"})', "{{alertname}}"),
                description="When the overload (and predicted overload) alerts fired, and the guard's own alerts.",
                width=12,
            )
        )
        .with_panel(
            state_timeline(
                "Copies paused (guard episode)",
                Query("max by (site) (promreflex_copy_guard_episode_active)", "episode {{site}}"),
                Query('max by (instance) (promreflex_copy_state{state="paused"})', "paused {{instance}}"),
                Query('max by (instance) (promreflex_copy_state{state="throttled"})', "throttled {{instance}}"),
                description="Overload episodes of each site (an alert holds its copies) and each copier's "
                "paused / throttled state: the pauses, as the paper's Figure 17 shades them.",
                width=12,
            )
        )
        .with_row(dashboard.Row("Copies"))
        .with_panel(
            timeseries_panel(
                "Copy progress",
                "percentunit",
                Query("promreflex_copy_done_bytes / promreflex_copy_size_bytes", "{{instance}}"),
                description="Share of each copy done (a resumed copy counts its earlier runs).",
                max_value=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Copy throughput",
                "Bps",
                Query("rate(promreflex_copy_copied_bytes_total[$__rate_interval])", "{{instance}}"),
                Query("promreflex_copy_rate_limit_bytes_per_second", "cap {{instance}}"),
                description="Bytes written per second by each copier, and the rate cap in force (0: none).",
            )
        )
        .with_panel(
            stat_panel(
                "Copies held now",
                "short",
                # The gauge has a series per site only once the guard saw one: none yet is 0.
                "sum(promreflex_copy_guard_paused_copies) or vector(0)",
                description="Copies the guard holds paused or throttled right now.",
                thresholds=((None, "green"), (1, "orange")),
            )
        )
        .with_panel(
            stat_panel(
                "Registered copies",
                "short",
                "sum(promreflex_copy_guard_registered_copies) or vector(0)",
                description="Copies (own and adopted) the guard can see in its registry.",
            )
        )
        .with_row(dashboard.Row("The guard"))
        .with_panel(
            timeseries_panel(
                "Pauses and resumes",
                "short",
                Query("sum by (site) (increase(promreflex_copy_guard_pauses_total[$__rate_interval]))", "paused {{site}}"),
                Query("sum by (site, reason) (increase(promreflex_copy_guard_resumes_total[$__rate_interval]))",
                      "resumed {{site}} ({{reason}})"),
                Query("sum by (site) (increase(promreflex_copy_guard_forced_resumes_total[$__rate_interval]))",
                      "forced {{site}}"),
                description="Copies paused and resumed (by reason: resolved, max_pause, shutdown, recovery, "
                "ended); forced resumes mean the maximum pause was hit while the site still suffered.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Time held",
                "s",
                Query("sum by (site) (increase(promreflex_copy_guard_pause_seconds_total[$__rate_interval]))", "{{site}}"),
                Query("sum by (instance) (increase(promreflex_copy_paused_seconds_total[$__rate_interval]))",
                      "copier {{instance}}"),
                description="Seconds copies were held, per site (guard) and per copier (its own count).",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Copy share",
                "percentunit",
                Query("max by (site) (promreflex_copy_guard_share)", "guard {{site}}"),
                Query("max by (instance) (promreflex_copy_throttle_share)", "copier {{instance}}"),
                description="The share of its full speed each site's copies may use (adaptive throttle: 1 runs "
                "free, 0 is an emergency pause), and the share each copier applies.",
                max_value=1,
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Throttle decisions",
                "short",
                # Per minute, averaged over $__rate_interval: a fixed [1m] holds one sample at a
                # 60 s scrape and the series stayed empty.
                Query("60 * sum by (site, verdict) (rate(promreflex_copy_guard_throttle_decisions_total[$__rate_interval]))",
                      "{{site}} {{verdict}}"),
                Query("sum by (site, reason) (increase(promreflex_copy_guard_emergency_pauses_total[10m]))",
                      "emergency {{site}} ({{reason}})"),
                description="Decisions of the adaptive throttle per minute by verdict (back off, hold, probe up), "
                "and emergency pauses over 10 minutes by reason.",
                width=12,
            )
        )
    )
