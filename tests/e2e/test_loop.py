"""End to end on the real stack: node_exporter textfile gauge -> Prometheus rule ->
Alertmanager -> webhook -> controller -> log action, and back when the condition clears."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections import Counter

import pytest

from controllers.audit import read_audit
from promreflex.clients import alert_ended
from promreflex.proc import http_ok, wait_until
from promreflex.stack import write_selftest_switch

pytestmark = pytest.mark.e2e


def decisions(stack, alertname="PromreflexSelftest"):
    return [r for r in read_audit(stack.audit_log)
            if r["event"] == "decision" and r["labels"].get("alertname") == alertname and r["result"] == "ok"]


def transitions(stack, alertname="PromreflexSelftest"):
    return Counter(d["transition"] for d in decisions(stack, alertname))


def reconciles(stack) -> int:
    return sum(1 for r in read_audit(stack.audit_log) if r["event"] == "reconcile" and r["result"] == "ok")


def wait_reconciles(stack, n: int = 2):
    """Let the controller reconcile ``n`` more times: any duplicate action would have run by then."""
    start = reconciles(stack)
    wait_until(lambda: reconciles(stack) >= start + n, timeout=30, what=f"{n} more reconciliations")


def post(stack, body: dict, token: str | None) -> int:
    req = urllib.request.Request(f"{stack.controller_url}/webhook", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def selftest_firing_in_am(stack):
    return [a for a in stack.am_alerts() if a["labels"].get("alertname") == "PromreflexSelftest"
            and not alert_ended(a["endsAt"]) and a["status"]["state"] == "active"]


def clear_and_wait(stack, resolves: int):
    write_selftest_switch(stack.textfile_dir, False)
    wait_until(lambda: transitions(stack)["resolve"] >= resolves, timeout=60, what="resolve action")


def test_condition_fires_once_and_resolves(live_stack):
    before = transitions(live_stack)
    write_selftest_switch(live_stack.textfile_dir, True)
    wait_until(lambda: transitions(live_stack)["fire"] == before["fire"] + 1, timeout=60, what="fire action")
    wait_reconciles(live_stack)
    assert transitions(live_stack)["fire"] == before["fire"] + 1

    # Duplicate deliveries: replay the notification Alertmanager sent, 20 times, with the token.
    token = live_stack.token_file.read_text().strip()
    sent = [r for r in read_audit(live_stack.audit_log)
            if r["event"] == "notification" and r["labels"].get("alertname") == "PromreflexSelftest"][-1]
    body = {"version": "4", "groupKey": sent["groupKey"], "status": "firing", "receiver": "promreflex",
            "alerts": [{"status": "firing", "labels": sent["labels"], "annotations": {},
                        "startsAt": sent["startsAt"], "endsAt": "0001-01-01T00:00:00Z", "fingerprint": sent["fingerprint"]}]}
    assert [post(live_stack, body, token) for _ in range(20)] == [200] * 20
    assert post(live_stack, body, None) == 401
    wait_reconciles(live_stack)
    assert transitions(live_stack)["fire"] == before["fire"] + 1

    clear_and_wait(live_stack, before["resolve"] + 1)
    wait_reconciles(live_stack)
    after = transitions(live_stack)
    assert (after["fire"] - before["fire"], after["resolve"] - before["resolve"]) == (1, 1)


def test_controller_killed_and_restarted_while_an_alert_fires(live_stack):
    before = transitions(live_stack)
    try:
        live_stack.stop_component("controller", signal.SIGKILL)  # the firing notification will be lost
        write_selftest_switch(live_stack.textfile_dir, True)
        wait_until(lambda: selftest_firing_in_am(live_stack), timeout=60, what="alert firing in Alertmanager")
        assert transitions(live_stack)["fire"] == before["fire"]  # nobody listened
        live_stack.start_component("controller", progress=lambda *_: None)
        wait_until(lambda: transitions(live_stack)["fire"] == before["fire"] + 1, timeout=60,
                   what="reconcile on start to fire the action")

        # Killed again after acting, restarted while still firing: no second fire.
        live_stack.stop_component("controller", signal.SIGKILL)
        live_stack.start_component("controller", progress=lambda *_: None)
        wait_reconciles(live_stack)
        assert transitions(live_stack)["fire"] == before["fire"] + 1

        # Resolved while the controller is down: the next start resolves.
        live_stack.stop_component("controller")
        write_selftest_switch(live_stack.textfile_dir, False)
        wait_until(lambda: not selftest_firing_in_am(live_stack), timeout=60, what="alert resolved in Alertmanager")
        live_stack.start_component("controller", progress=lambda *_: None)
        wait_until(lambda: transitions(live_stack)["resolve"] == before["resolve"] + 1, timeout=60,
                   what="reconcile on start to resolve")
        wait_reconciles(live_stack)
        after = transitions(live_stack)
        assert (after["fire"] - before["fire"], after["resolve"] - before["resolve"]) == (1, 1)
    finally:
        write_selftest_switch(live_stack.textfile_dir, False)
        if not http_ok(f"{live_stack.controller_url}/-/ready"):
            live_stack.start_component("controller", progress=lambda *_: None)
