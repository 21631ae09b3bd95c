"""A rolling restart of a real 3-peer Alertmanager cluster does not undo an applied action (a
stranger's review, H3).

Alertmanager's peers do not gossip alerts, and a restarted peer lists none until Prometheus
re-sends them (``--rules.alert.resend-delay``, 1 m by default, plus an evaluation). The
reconciliation read the peer it sticks to and took that empty answer as the end of the
incident: ``resolve`` ran mid-incident, and ``fire`` again a minute later. Here the test plays
Prometheus (it posts the alert to every peer, and re-sends only when it says so), so the window
in which the restarted peers are empty is as long as the test wants: every peer is restarted
one after the other, the controller reconciles every second, and nothing may run until the
alert really ends."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promreflex.clients import iso
from promreflex.ha import HAPath, counts
from promreflex.proc import http_ok, wait_until
from tests.controller_process import ControllerProcess

pytestmark = pytest.mark.integration

LABELS = {"alertname": "HaTestOverload", "shop": "a", "severity": "page"}


def runs(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [r["transition"] for r in map(json.loads, path.read_text().splitlines())]


def post(url: str, starts: datetime, ends: datetime) -> None:
    """What Prometheus sends to each Alertmanager on every evaluation (and on its resend delay)."""
    body = json.dumps([{"labels": LABELS, "startsAt": iso(starts), "endsAt": iso(ends),
                        "generatorURL": "http://prometheus.invalid/graph"}]).encode()
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        assert resp.status == 200


def listed(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true&silenced=false", timeout=10) as resp:  # noqa: S310
        return any(a["labels"].get("alertname") == LABELS["alertname"] for a in json.load(resp))


def reconciliations(ctl: ControllerProcess) -> float:
    return counts(ctl.url, "promreflex_controller_reconcile_runs_total").get("ok", 0.0)


def hold_through_reconciliations(ctl: ControllerProcess, runs_file: Path, expected: list[str], n: int,
                                 what: str) -> None:
    """``n`` more successful reconciliations happen, and the runs stay ``expected`` meanwhile."""
    target = reconciliations(ctl) + n
    deadline = time.monotonic() + 30 + 5 * n
    while reconciliations(ctl) < target:
        assert runs(runs_file) == expected, what
        assert time.monotonic() < deadline, f"the controller did not reconcile {n} times ({what})"
        time.sleep(0.2)
    assert runs(runs_file) == expected, what


def test_a_rolling_restart_of_the_alertmanager_cluster_keeps_the_action_applied(tmp_path):
    runs_file = tmp_path / "runs.jsonl"
    ctl = ControllerProcess(tmp_path / "controller",
                            routes=[{"name": "overload", "matchers": ['alertname="HaTestOverload"'], "action": "log",
                                     "params": {"path": str(runs_file)}}],
                            settings={"reconcile_interval": "1s"})
    cluster = HAPath(tmp_path / "ha", source_port=0, webhook_url=f"{ctl.url}/webhook", replicas=0, peer_timeout="3s")
    try:
        cluster.start()
        ctl.alertmanager_url = cluster.am_urls
        ctl.start()
        starts = datetime.now(UTC) - timedelta(seconds=30)
        for url in cluster.am_urls:
            post(url, starts, datetime.now(UTC) + timedelta(hours=1))
        wait_until(lambda: runs(runs_file) == ["fire"], timeout=60, what="the fire run")

        for i, (peer, url) in enumerate(zip(cluster.alertmanagers, cluster.am_urls)):
            peer.stop()
            peer.start()  # the same flags, storage (silences, notification log) and ports: alerts are gone
            wait_until(lambda u=url: http_ok(f"{u}/-/ready"), timeout=60, what=f"peer {i} ready again")
            assert not listed(url), "a restarted Alertmanager still lists the alert: the test proves nothing"
            hold_through_reconciliations(ctl, runs_file, ["fire"], 3, f"restarting peer {i} undid the action")
        # Every peer restarted, none re-sent yet: still no proof that the incident ended.
        hold_through_reconciliations(ctl, runs_file, ["fire"], 3, "the restarted cluster's empty lists undid it")

        for url in cluster.am_urls:  # Prometheus re-sends (same startsAt): nothing runs again
            post(url, starts, datetime.now(UTC) + timedelta(hours=1))
        hold_through_reconciliations(ctl, runs_file, ["fire"], 3, "the re-sent alert ran the action again")

        ended = datetime.now(UTC)
        for url in cluster.am_urls:  # the incident ends
            post(url, starts, ended)
        wait_until(lambda: runs(runs_file) == ["fire", "resolve"], timeout=60, what="the resolve run")
        hold_through_reconciliations(ctl, runs_file, ["fire", "resolve"], 3, "a transition ran twice")
    finally:
        ctl.stop()
        cluster.stop()
