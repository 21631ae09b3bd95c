"""The proxy's metrics (``promreflex_admission_*``), every labelled series created at start."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controllers.admission.cookies import REASONS as COOKIE_REASONS

#: What became of a request that reached a page class.
OUTCOMES = ("served", "upstream_5xx", "upstream_timeout", "upstream_error", "queue_full", "queue_timeout",
            "client_gone", "session_busy", "body_timeout")
#: Why a new session was not admitted (answered with the waiting-room page, or gone).
REJECT_REASONS = ("queue_full", "waiting_room_mode", "queue_timeout", "sessions_full", "client_gone", "stopping")
#: What became of an exempt request (forwarded without a session or a page class).
EXEMPT_OUTCOMES = ("served", "upstream_5xx", "upstream_timeout", "upstream_error", "client_gone", "body_timeout")
#: Requests refused before they reached a page class (bad input at the proxy's door).
REQUEST_REJECT_REASONS = ("header_too_large", "malformed", "bad_target", "body_too_large", "body_timeout", "upgrade",
                          "transfer_coding")
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry, pages: list[str]):
        p = "promreflex_admission_"
        self.page_queue = Gauge(p + "page_queue_length", "Requests waiting in the page class' queue.", ["page"],
                                registry=registry)
        self.page_limit = Gauge(p + "page_concurrency_limit",
                                "Concurrency limit of the page class (progress-based regulation).", ["page"],
                                registry=registry)
        self.page_in_flight = Gauge(p + "page_in_flight", "Requests of the page class at the app now.", ["page"],
                                    registry=registry)
        self.page_throughput = Gauge(p + "page_throughput",
                                     "Served requests per second of the page class in the regulator's last window.",
                                     ["page"], registry=registry)
        self.requests = Counter(p + "requests_total", "Requests of each page class by outcome.", ["page", "outcome"],
                                registry=registry)
        self.page_wait = Histogram(p + "page_queue_wait_seconds", "Time requests waited in the page queue.", ["page"],
                                   buckets=WAIT_BUCKETS, registry=registry)
        self.upstream = Histogram(p + "upstream_duration_seconds",
                                  "Time the app took, request sent to response complete.", ["page"],
                                  buckets=UPSTREAM_BUCKETS, registry=registry)
        self.session_queue = Gauge(p + "session_queue_length", "New sessions waiting for admission.",
                                   registry=registry)
        self.interval = Gauge(p + "admission_interval_seconds", "Interval between two session admissions.",
                              registry=registry)
        self.active = Gauge(p + "active_sessions", "Sessions admitted and neither logged out nor idle.",
                            registry=registry)
        self.session_wait = Histogram(p + "session_queue_wait_seconds", "Time new sessions waited for admission.",
                                      buckets=WAIT_BUCKETS, registry=registry)
        self.admitted = Counter(p + "sessions_admitted_total", "Sessions admitted.", registry=registry)
        self.readmitted = Counter(p + "sessions_readmitted_total",
                                  "Sessions of a signed cookie issued before this process started, tracked again.",
                                  registry=registry)
        self.completed = Counter(p + "sessions_completed_total", "Sessions that reached a logout page.",
                                 registry=registry)
        self.abandoned = Counter(p + "sessions_abandoned_total",
                                 "Sessions that went idle before logout, by the last page class they reached.",
                                 ["page"], registry=registry)
        self.rejected = Counter(p + "sessions_rejected_total",
                                "New sessions not admitted: the waiting-room page (queue full, waiting-room mode, "
                                "waited too long, session.max_sessions active) or the client left the queue.", ["reason"], registry=registry)
        self.cookies = Counter(p + "cookie_rejections_total",
                               "Session cookies refused (the request is then a new session).", ["reason"],
                               registry=registry)
        self.waiting_room = Gauge(p + "waiting_room_mode", "1 while a hold puts new sessions in the waiting room.",
                                  registry=registry)
        self.session_cap = Gauge(p + "session_cap", "Session cap set by a hold (-1: none).", registry=registry)
        self.holds = Gauge(p + "holds", "Tightenings in force (control endpoint, each with a lease).",
                           registry=registry)
        self.holds_expired = Counter(p + "holds_expired_total",
                                     "Holds that ended because their lease ran out (the controller stopped renewing).",
                                     registry=registry)
        self.threshold = Gauge(p + "session_queue_threshold",
                               "The session scheduler's threshold on the mean total page-queue length.",
                               registry=registry)
        self.abandon_threshold = Gauge(p + "abandon_ratio_threshold",
                                       "Abandoned / (completed + abandoned) sessions above which the alert fires.",
                                       registry=registry)
        self.bad_requests = Counter(p + "request_rejections_total",
                                    "Requests refused before reaching a page class: headers too large (431), "
                                    "unparsable or HTTP/0.9 (400), not origin-form or climbing above the root "
                                    "(400), body too large (413) or too slow (408), a WebSocket or other upgrade "
                                    "(501), a transfer coding other than chunked (501).",
                                    ["reason"], registry=registry)
        self.exempt_requests = Counter(p + "exempt_requests_total",
                                       "Requests of exempt paths (no session, no page class) by outcome.",
                                       ["outcome"], registry=registry)
        self.control = Counter(p + "control_requests_total", "Control endpoint requests by result.", ["result"],
                               registry=registry)
        for page in pages:
            for m in (self.page_queue, self.page_limit, self.page_in_flight, self.page_throughput, self.page_wait,
                      self.upstream, self.abandoned):
                m.labels(page)
            for outcome in OUTCOMES:
                self.requests.labels(page, outcome)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for reason in (*COOKIE_REASONS, "not_readmitted"):
            self.cookies.labels(reason)
        for reason in REQUEST_REJECT_REASONS:
            self.bad_requests.labels(reason)
        for outcome in EXEMPT_OUTCOMES:
            self.exempt_requests.labels(outcome)
        for result in ("ok", "unauthorized", "bad_request", "not_found"):
            self.control.labels(result)
