"""Routes are reloaded without a restart (issue 16: "changing a route needs stack down + stack
up"): SIGHUP or POST /-/reload on the real controller process swaps the routes in place and keeps
the state (applied alerts, the same process, the same PID); a removed route resolves what it
applied; an invalid file changes nothing."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml

from controllers.audit import read_audit
from promreflex.proc import wait_until
from tests.controller_process import ControllerProcess
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration


def _post(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


def _decisions(ctl: ControllerProcess, route: str, transition: str) -> list[dict[str, Any]]:
    return [r for r in read_audit(ctl.audit_log)
            if r["event"] == "decision" and r.get("route") == route and r.get("transition") == transition
            and r.get("result") == "ok"]


def _reloads(ctl: ControllerProcess, result: str) -> list[dict[str, Any]]:
    return [r for r in read_audit(ctl.audit_log) if r["event"] == "reload" and r.get("result") == result]


def _rewrite(ctl: ControllerProcess, routes: list[dict[str, Any]]) -> None:
    ctl.routes = routes
    ctl.config_file()


def test_sighup_and_post_reload_swap_routes_keeping_state(tmp_path):
    a = {"name": "a", "matchers": ['alertname="A"'], "action": "log", "params": {"message": "a v1"}}
    ctl = ControllerProcess(tmp_path, routes=[a]).start()
    try:
        pid = ctl.child.pid if ctl.child else 0
        status, _ = _post(f"{ctl.url}/webhook", payload(alert("A")))
        assert status == 200
        wait_until(lambda: _decisions(ctl, "a", "fire"), timeout=30, what="route a fired")

        # 1. change a's params, add b: SIGHUP; a's applied alert stays applied, b answers new alerts
        b = {"name": "b", "matchers": ['alertname="B"'], "action": "log", "params": {"message": "b"}}
        _rewrite(ctl, [{**a, "params": {"message": "a v2"}}, b])
        os.kill(pid, signal.SIGHUP)
        wait_until(lambda: _reloads(ctl, "ok"), timeout=30, what="reload ok in the audit log")
        done = _reloads(ctl, "ok")[0]
        assert done["added"] == ["b"] and done["changed"] == ["a"] and done["removed"] == [] and done["resolving"] == 0
        state = json.loads(_get(f"{ctl.url}/api/v1/state"))["entries"]
        assert [(e["route"], e["applied"]) for e in state] == [("a", "firing")]
        assert not _decisions(ctl, "a", "resolve")  # nothing was undone by the reload
        _post(f"{ctl.url}/webhook", payload(alert("B")))
        wait_until(lambda: _decisions(ctl, "b", "fire"), timeout=30, what="the new route b fired")
        metrics = _get(f"{ctl.url}/metrics")
        assert 'promreflex_controller_config_reloads_total{result="ok"} 1.0' in metrics

        # 2. an invalid file: nothing changes, counted and audited
        _rewrite(ctl, [{**a, "action": "no-such-action"}])
        status, body = _post(f"{ctl.url}/-/reload")
        assert status == 400 and body["status"] == "error" and "no-such-action" in body["message"]
        assert _reloads(ctl, "error")
        _post(f"{ctl.url}/webhook", payload(alert("B", instance="2")))
        wait_until(lambda: len(_decisions(ctl, "b", "fire")) == 2, timeout=30, what="b still routes after a bad reload")

        # 3. remove a (POST /-/reload): its applied alert is resolved, b stays
        _rewrite(ctl, [b])
        status, body = _post(f"{ctl.url}/-/reload")
        assert status == 200 and body["removed"] == ["a"] and body["resolving"] == 1, body
        wait_until(lambda: _decisions(ctl, "a", "resolve"), timeout=30, what="the removed route's alert resolved")
        _post(f"{ctl.url}/webhook", payload(alert("A", instance="3")))
        _post(f"{ctl.url}/webhook", payload(alert("B", instance="3")))
        wait_until(lambda: len(_decisions(ctl, "b", "fire")) == 3, timeout=30, what="b fired after the new A")
        assert len(_decisions(ctl, "a", "fire")) == 1  # a matches nothing any more
        assert ctl.alive() and ctl.child is not None and ctl.child.pid == pid  # one process all along
    finally:
        ctl.stop()


def test_a_reload_that_changes_keys_needing_a_restart_says_so(tmp_path):
    a = {"name": "a", "matchers": ['alertname="A"'], "action": "log"}
    ctl = ControllerProcess(tmp_path, routes=[a]).start()
    try:
        ctl.settings = {"reconcile_interval": "7s"}
        ctl.config_file()
        status, body = _post(f"{ctl.url}/-/reload")
        assert status == 200 and body["needs_restart"] == ["reconcile_interval"], body
        assert yaml.safe_load((tmp_path / "promreflex.yml").read_text())["controller"]["reconcile_interval"] == "7s"
    finally:
        ctl.stop()
