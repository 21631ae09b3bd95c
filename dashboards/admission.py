"""The session-admission dashboard (seed 002): are sessions completing, what the session
scheduler does (queue, interval, active sessions, waiting room), what the page scheduler does
(queue, limit and in-flight by page class), and how long requests wait.

Data needs: the admission proxy's control listener scraped as job ``admission``
(``stack.extra_scrape``) and rules/admission.rules.yml.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.build import Query, new_dashboard, register, stat_panel, timeseries_panel


@register("admission.json")
def admission() -> dashboard.Dashboard:
    """Session admission: sessions, the session scheduler, the page scheduler, waits."""
    return (
        new_dashboard(
            "promreflex-admission",
            "promreflex / session admission",
            "Keep shop sessions completing under a flash crowd: sessions completed vs abandoned, the session "
            "queue and admission interval, each page class' queue, concurrency limit and in-flight requests.",
            tags=("admission",),
        )
        .with_row(dashboard.Row("Sessions"))
        .with_panel(
            timeseries_panel(
                "Sessions ending",
                "short",
                Query("instance:promreflex_admission_sessions_completed:rate2m", "completed/s {{instance}}"),
                Query("instance:promreflex_admission_sessions_abandoned:rate2m", "abandoned/s {{instance}}"),
                Query("sum by (instance) (rate(promreflex_admission_sessions_admitted_total[$__rate_interval]))",
                      "admitted/s {{instance}}"),
                description="Sessions per second that reached a logout page (completed), went idle before it "
                "(abandoned: their requests were wasted), and were admitted. The scheme's goal: completed/s holds "
                "under a flash crowd.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Abandoned, by last page",
                "short",
                Query("sum by (page) (rate(promreflex_admission_sessions_abandoned_total[$__rate_interval]))",
                      "{{page}}"),
                description="Where visitors gave up. With the full scheme, failures should happen only at the "
                "first page (in the session queue), never mid-session.",
                width=12,
            )
        )
        .with_panel(
            stat_panel("Active sessions", "short", "sum(promreflex_admission_active_sessions) or vector(0)",
                       description="Sessions admitted and neither logged out nor idle.")
        )
        .with_panel(
            stat_panel("Abandoned share (2 m)", "percentunit",
                       "max(instance:promreflex_admission_sessions_abandoned:ratio_rate2m) or vector(0)",
                       description="Abandoned / (completed + abandoned) over 2 minutes.",
                       thresholds=((None, "green"), (0.1, "orange"), (0.3, "red")))
        )
        .with_panel(
            stat_panel("Waiting-room mode", "short", "max(promreflex_admission_waiting_room_mode) or vector(0)",
                       description="1 while a hold (the admission action) sends every new session to the "
                       "waiting room.", thresholds=((None, "green"), (1, "orange")),
                       value_text={"0": ("off", "green"), "1": ("ON", "orange")})
        )
        .with_panel(
            stat_panel("Session cap", "short", "max(promreflex_admission_session_cap) or vector(-1)",
                       description="Session cap set by a hold (-1: none).",
                       value_text={"-1": ("none", "green")})
        )
        .with_panel(
            stat_panel("Holds", "short", "sum(promreflex_admission_holds) or vector(0)",
                       description="Tightenings in force, each with a lease the controller renews.")
        )
        .with_panel(
            stat_panel("Holds expired (1 h)", "short",
                       "sum(increase(promreflex_admission_holds_expired_total[1h])) or vector(0)",
                       description="Holds dropped because their lease was not renewed (the controller stopped).",
                       thresholds=((None, "green"), (1, "orange")))
        )
        .with_row(dashboard.Row("Session scheduler"))
        .with_panel(
            timeseries_panel(
                "Session queue and waiting room",
                "short",
                Query("sum by (instance) (promreflex_admission_session_queue_length)", "queued {{instance}}"),
                Query("sum by (reason) (rate(promreflex_admission_sessions_rejected_total[$__rate_interval]))",
                      "turned away/s ({{reason}})"),
                description="New sessions waiting for admission, and those sent to the waiting room (queue full, "
                "waiting-room mode, waited too long) or that left the queue.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Admission interval",
                "s",
                Query("max by (instance) (promreflex_admission_admission_interval_seconds)", "{{instance}}"),
                description="Time between two admissions: grows while the page queues hold more than the "
                "threshold, shrinks below it (the paper's Figure: the interval follows the queue).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Page queues vs threshold",
                "short",
                Query("instance:promreflex_admission_page_queue_length:avg1m", "mean 1m {{instance}}"),
                Query("sum by (instance) (promreflex_admission_page_queue_length)", "now {{instance}}"),
                Query("max by (instance) (promreflex_admission_session_queue_threshold)", "threshold {{instance}}"),
                description="The total the session scheduler compares with its threshold.",
            )
        )
        .with_row(dashboard.Row("Page scheduler"))
        .with_panel(
            timeseries_panel(
                "Concurrency limit by page",
                "short",
                Query("max by (page) (promreflex_admission_page_concurrency_limit)", "limit {{page}}"),
                Query("sum by (page) (promreflex_admission_page_in_flight)", "in flight {{page}}"),
                description="Progress-based regulation: the limit rises while the page's throughput improves and "
                "backs off when it does not (contention).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Page throughput",
                "reqps",
                Query("max by (page) (promreflex_admission_page_throughput)", "{{page}}"),
                description="Served requests per second in the regulator's last window: its measure of progress.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Page queue length",
                "short",
                Query("sum by (page) (promreflex_admission_page_queue_length)", "{{page}}"),
                description="Requests of each page class waiting for a slot.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Queue wait p95",
                "s",
                Query("histogram_quantile(0.95, sum by (page, le) "
                      "(rate(promreflex_admission_page_queue_wait_seconds_bucket[$__rate_interval])))", "page {{page}}"),
                Query("histogram_quantile(0.95, sum by (le) "
                      "(rate(promreflex_admission_session_queue_wait_seconds_bucket[$__rate_interval])))", "session queue"),
                description="How long requests wait in their page queue and new sessions in the session queue.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Requests by outcome",
                "reqps",
                Query("sum by (outcome) (rate(promreflex_admission_requests_total[$__rate_interval]))", "{{outcome}}"),
                description="served, the app's 5xx, timeouts (per-page), unreachable app, page queue full or waited "
                "too long, client gone while waiting, a session over its in-flight limit.",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                "Bad requests refused at the door",
                "reqps",
                Query("sum by (reason) (rate(promreflex_admission_request_rejections_total[$__rate_interval]))",
                      "{{reason}}"),
                Query("sum by (reason) (rate(promreflex_admission_cookie_rejections_total[$__rate_interval]))",
                      "cookie {{reason}}"),
                description="Requests refused before reaching a page class (headers too large: 431, unparsable, "
                "not origin-form, body too large or too slow) and session cookies refused (the request then "
                "queues as a new session).",
                width=12,
            )
        )
    )
