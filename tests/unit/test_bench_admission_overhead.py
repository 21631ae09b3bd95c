"""The overhead step's page-queue wait count, read from the proxy's own histogram."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from bench.admission.run import waits_in
from controllers.admission.metrics import AdmissionMetrics


def test_waits_in_counts_requests_that_waited_over_a_millisecond() -> None:
    reg = CollectorRegistry()
    m = AdmissionMetrics(reg, ["browse", "login"])
    for w in (0.0, 0.0002, 0.0009, 0.002, 0.03):
        m.page_wait.labels("browse").observe(w)
    m.page_wait.labels("login").observe(0.5)
    text = generate_latest(reg).decode()
    assert waits_in(text, "browse") == {"requests": 5.0, "waited_over_1ms": 2.0}
    assert waits_in(text, "login") == {"requests": 1.0, "waited_over_1ms": 1.0}
    assert waits_in(text, "search") == {"requests": 0.0, "waited_over_1ms": 0.0}
