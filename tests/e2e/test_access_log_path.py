"""One signal through the real stack: requests to nginx -> its access log -> the access-log
exporter -> Prometheus."""

from __future__ import annotations

import urllib.request

import pytest

from promreflex.proc import wait_until

pytestmark = pytest.mark.e2e


def served(live_stack, status_class: str) -> float:
    result = live_stack.query(f'sum(promreflex_http_requests_total{{job="accesslog", site="shop", status_class="{status_class}"}})')
    return float(result[0]["value"][1]) if result else 0.0


def test_requests_reach_prometheus_by_status_class(live_stack):
    before_2xx, before_4xx = served(live_stack, "2xx"), served(live_stack, "4xx")
    for _ in range(25):
        urllib.request.urlopen(f"{live_stack.url('nginx')}/", timeout=5).read()  # noqa: S310 - loopback
    for _ in range(5):
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{live_stack.url('nginx')}/no-such-page", timeout=5)  # noqa: S310
    wait_until(lambda: served(live_stack, "2xx") - before_2xx == 25 and served(live_stack, "4xx") - before_4xx == 5,
               timeout=30, what="25 2xx and 5 4xx requests counted in Prometheus")
    latency = live_stack.query('sum(promreflex_http_request_duration_seconds_count{job="accesslog", site="shop"})')
    assert float(latency[0]["value"][1]) >= 30
