"""What the rules assume about the running stack, checked on the real one: the Watchdog heartbeat
reaches the controller (PromreflexWatchdogNotReceived's input moves), and at the stack's 200 ms
scrape the copy guard's 1 s window really holds the 4 samples its window ladder asks for
(rules/copy-guard.rules.yml), so the fast reaction is kept."""

from __future__ import annotations

import pytest

from promreflex.proc import wait_until

pytestmark = pytest.mark.e2e


def test_the_watchdog_heartbeat_reaches_the_controller(live_stack):
    # Watchdog fires from the first evaluation and Alertmanager sends it at once (group_wait 0s).
    wait_until(lambda: live_stack.query("time() - promreflex_controller_last_notification_timestamp_seconds < 70"),
               timeout=90, interval=1, what="a Watchdog notification at the controller")
    assert not live_stack.query('ALERTS{alertname="PromreflexWatchdogNotReceived"}')


def test_the_200ms_scrape_keeps_the_copy_guards_one_second_window(live_stack):
    """Every evaluation of the last 10 s found at least 4 samples in the 1 s window: the ladder
    never fell back to 5 s on this machine's real scrape timing."""
    query = ("min_over_time((min(count_over_time(promreflex_http_requests_total[1s])))[10s:200ms]) >= 4")
    wait_until(lambda: live_stack.query(query), timeout=60, interval=1, what="4 samples in every 1 s window for 10 s")
