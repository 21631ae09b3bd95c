"""Re-fire after absence with the real Alertmanager: a firing alert is silenced (the controller
reconciles it to resolved: ``resolve`` runs), the silence is expired, and the same episode
(same ``startsAt``) fires again."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta, UTC

import pytest

from controllers.audit import read_audit
from promreflex.clients import iso
from promreflex.proc import free_port, wait_until
from tests.alertmanager_process import running_alertmanager
from tests.controller_process import ControllerProcess

pytestmark = pytest.mark.integration



def api(url: str, method: str = "GET", body: object | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read()
    return json.loads(text) if text.strip() else None


@pytest.fixture
def alertmanager(tmp_path):
    controller_port = free_port()
    config = {
        "route": {"receiver": "promreflex", "group_by": ["alertname"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "promreflex", "webhook_configs": [
            {"url": f"http://127.0.0.1:{controller_port}/webhook", "send_resolved": True}]}],
    }
    with running_alertmanager(tmp_path, config) as url:
        yield url, controller_port


def test_a_silenced_alert_resolves_and_fires_again_when_the_silence_expires(tmp_path, alertmanager):
    am_url, controller_port = alertmanager
    runs_file = tmp_path / "runs.jsonl"
    ctl = ControllerProcess(tmp_path / "controller", port=controller_port, alertmanager_url=am_url,
                            settings={"reconcile_interval": "500ms"},
                            routes=[{"name": "refire", "matchers": ['alertname="Refire"'], "action": "log",
                                     "params": {"path": str(runs_file)}}])

    def runs() -> list[tuple[str, str]]:
        if not runs_file.exists():
            return []
        return [(r["transition"], r["startsAt"]) for r in map(json.loads, runs_file.read_text().splitlines())]

    now = datetime.now(UTC)
    starts = iso(now - timedelta(seconds=30))
    ctl.start()
    try:
        api(f"{am_url}/api/v2/alerts", "POST", [{"labels": {"alertname": "Refire", "severity": "info"},
                                                 "startsAt": starts, "endsAt": iso(now + timedelta(hours=1))}])
        wait_until(lambda: [t for t, _ in runs()] == ["fire"], timeout=30, what="the first fire")

        silence = api(f"{am_url}/api/v2/silences", "POST", {
            "matchers": [{"name": "alertname", "value": "Refire", "isRegex": False, "isEqual": True}],
            "startsAt": iso(), "endsAt": iso(now + timedelta(hours=1)), "createdBy": "test", "comment": "absence"})
        assert isinstance(silence, dict)
        wait_until(lambda: [t for t, _ in runs()] == ["fire", "resolve"], timeout=30,
                   what="the silence reconciled to resolved")

        api(f"{am_url}/api/v2/silence/{silence['silenceID']}", "DELETE")  # expire it
        wait_until(lambda: [t for t, _ in runs()] == ["fire", "resolve", "fire"], timeout=30,
                   what="the same episode to fire again once the silence expired")
        # One episode throughout: the same startsAt (to the millisecond, as Alertmanager's API has it).
        assert len({s[:len("2026-01-01T00:00:00.000")] for _, s in runs()}) == 1
        decisions = [r for r in read_audit(ctl.audit_log) if r["event"] == "decision" and r["result"] == "ok"]
        assert [d["transition"] for d in decisions] == ["fire", "resolve", "fire"]
    finally:
        ctl.stop()
