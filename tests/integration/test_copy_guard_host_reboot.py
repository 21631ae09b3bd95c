"""A host reboot does not leave the overloaded shop's copy unguarded (real processes: a 3-peer
Alertmanager cluster, the controller, a ``promreflex copy``).

The controller and the Alertmanager peer of its host restart together. At start the copy
guard resumes every copy and holds again only for the alerts Alertmanager still has; it asked
the peer reads stick to, the first one configured, which has just restarted and lists nothing
until Prometheus re-sends (its resend delay, 1 m by default, plus an evaluation). So it let the
copy run, and the engine, which had the alert applied, never fired it again: the copy ran
unguarded until the alert ended and fired again. Here the test plays Prometheus (it posts to
every peer and re-sends only when it says so), so the restarted peer stays empty as long as
the test runs: the copy must be paused again, and stay paused, while the other peers list the
alert, without the alert being fired again."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from promreflex.clients import iso
from promreflex.ha import HAPath
from promreflex.proc import http_ok, wait_until
from tests.controller_process import ControllerProcess
from tests.integration.test_controller_am_restart import hold_through_reconciliations, runs
from tests.integration.test_copy_guard_copier_process import Copy, copies  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

LABELS = {"alertname": "CopyGuardSiteOverloaded", "site": "shop", "severity": "page"}


def send(url: str, starts: datetime, ends: datetime) -> None:
    """What Prometheus posts to each Alertmanager for the shop's overload alert."""
    body = json.dumps([{"labels": LABELS, "startsAt": iso(starts), "endsAt": iso(ends)}]).encode()
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        assert resp.status == 200


def test_a_host_reboot_keeps_the_copy_guarded(tmp_path, copies):  # noqa: F811 - the fixture
    copy = Copy(tmp_path, "--rate-limit=16K", "--site=shop")  # 4 MiB: minutes of copying
    copies.append(copy)
    runs_file = tmp_path / "runs.jsonl"
    routes = [
        {"name": "copy-guard", "matchers": ['alertname="CopyGuardSiteOverloaded"'], "action": "copy-guard",
         "params": {"registry_dir": str(copy.reg), "mode": "pause", "watchdog": False, "lease": "3s"}},
        {"name": "runs", "matchers": ['alertname="CopyGuardSiteOverloaded"'], "action": "log",
         "params": {"path": str(runs_file)}},
    ]
    ctl = ControllerProcess(tmp_path / "controller", routes=routes, settings={"reconcile_interval": "1s"})
    cluster = HAPath(tmp_path / "ha", source_port=0, webhook_url=f"{ctl.url}/webhook", replicas=0, peer_timeout="3s")
    try:
        cluster.start()
        ctl.alertmanager_url = cluster.am_urls  # peer 0 first: the one reads stick to
        ctl.start()
        starts = datetime.now(UTC) - timedelta(seconds=30)
        for url in cluster.am_urls:
            send(url, starts, datetime.now(UTC) + timedelta(hours=1))
        wait_until(lambda: copy.status()["state"] == "paused", timeout=60, what="the copy paused")
        assert runs(runs_file) == ["fire"]

        # The host reboots: the controller dies with it, its Alertmanager peer comes back empty.
        ctl.kill()
        cluster.alertmanagers[0].stop()
        wait_until(lambda: copy.status()["state"] == "running", timeout=30, what="the pause's lease to end")
        cluster.alertmanagers[0].start()
        wait_until(lambda: http_ok(f"{cluster.am_urls[0]}/-/ready"), timeout=60, what="peer 0 ready again")
        ctl.start()

        wait_until(lambda: copy.status()["state"] == "paused", timeout=30,
                   what="the copy paused again after the reboot (the restarted peer's empty list let it go)")
        hold_through_reconciliations(ctl, runs_file, ["fire"], 3, "the alert was fired again")
        assert copy.status()["state"] == "paused"

        ended = datetime.now(UTC)
        for url in cluster.am_urls:  # the overload ends
            send(url, starts, ended)
        wait_until(lambda: copy.status()["state"] == "running", timeout=60, what="the copy resumed at the end")
        wait_until(lambda: runs(runs_file) == ["fire", "resolve"], timeout=60, what="the resolve run")
    finally:
        ctl.stop()
        cluster.stop()
