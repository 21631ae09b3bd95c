"""The controller's own metrics (``promreflex_controller_*``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REJECTION_REASONS = ("unauthorized", "too_large", "not_json", "invalid_payload", "unsupported_media_type",
                     "timeout", "bad_body", "client_disconnected", "header_too_large", "malformed")
# future: startsAt beyond the clock-skew margin (engine.FUTURE_MARGIN), skipped unremembered.
NOTIFICATION_RESULTS = ("accepted", "duplicate", "stale", "conflict", "future")
ACTION_RESULTS = ("ok", "error", "skipped", "cooldown", "deferred")


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry, actions: list[str]):
        self.webhook_requests = Counter(
            "promreflex_controller_webhook_requests_total", "Webhook HTTP requests by response code.",
            ["code"], registry=registry,
        )
        self.rejections = Counter(
            "promreflex_controller_payload_rejections_total", "Webhook bodies rejected, by reason.",
            ["reason"], registry=registry,
        )
        self.notifications = Counter(
            "promreflex_controller_notifications_total",
            "Alerts received in webhook notifications, by alert status and what the controller made of them.",
            ["status", "result"], registry=registry,
        )
        self.actions = Counter(
            "promreflex_controller_actions_total", "Action transitions by action, transition and result.",
            ["action", "transition", "result"], registry=registry,
        )
        self.action_duration = Histogram(
            "promreflex_controller_action_duration_seconds", "Time an action transition took.",
            ["action"], registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.reconcile_runs = Counter(
            "promreflex_controller_reconcile_runs_total", "Reconciliations against Alertmanager's active alerts.",
            ["result"], registry=registry,
        )
        self.last_reconcile = Gauge(
            "promreflex_controller_last_reconcile_timestamp_seconds",
            "Unix time of the last successful reconciliation.", registry=registry,
        )
        self.applied = Gauge(
            "promreflex_controller_applied_alerts", "Alerts whose firing transition is applied, by action.",
            ["action"], registry=registry,
        )
        self.transitions_failing = Gauge(
            "promreflex_controller_transitions_failing",
            "Transitions the controller gave up on after max_retries failed runs, by route and action; "
            "each is tried again only when something new arrives for its alert (or on restart).",
            ["route", "action"], registry=registry,
        )
        self.interrupted = Counter(
            "promreflex_controller_interrupted_transitions_total",
            "Transitions found in flight at start (the previous process died while running them): run again.",
            registry=registry,
        )
        self.fingerprints_replaced = Counter(
            "promreflex_controller_fingerprints_replaced_total",
            "Alerts whose fingerprint was not one (16 lowercase hex digits): replaced by the one computed "
            "from their labels.", registry=registry,
        )
        self.truncated_alerts = Counter(
            "promreflex_controller_truncated_alerts_total",
            "Alerts Alertmanager left out of notifications (truncatedAlerts: its receiver's max_alerts): "
            "acted on only by the reconciliation, never when no Alertmanager is configured.",
            registry=registry,
        )
        self.last_notification = Gauge(
            "promreflex_controller_last_notification_timestamp_seconds",
            "Unix time of the last accepted webhook notification.", registry=registry,
        )
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for status in ("firing", "resolved"):
            for result in NOTIFICATION_RESULTS:
                self.notifications.labels(status, result)
        for action in actions:
            self.applied.labels(action)
            self.action_duration.labels(action)
            for transition in ("fire", "resolve"):
                for result in ACTION_RESULTS:
                    self.actions.labels(action, transition, result)
        for result in ("ok", "error"):
            self.reconcile_runs.labels(result)
