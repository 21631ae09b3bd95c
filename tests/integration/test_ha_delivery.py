"""The controller's contract through an HA alerting path (two Prometheus replicas, a 3-peer
Alertmanager cluster), on the real binaries: every notification arrives more than once, and a
Prometheus replica and an Alertmanager peer are SIGKILLed in the middle of an incident. Each
transition still runs exactly once: fire when the incident starts, resolve when it ends."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from promreflex.proc import wait_until
from tests.controller_process import ControllerProcess
from promreflex.ha import GaugeSource, HAPath, counts

pytestmark = pytest.mark.integration


def runs(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    return [(r["transition"], r["labels"]["shop"]) for r in map(json.loads, path.read_text().splitlines())]


def accepted_notifications(url: str) -> dict[str, float]:
    """The controller's own count of alerts received, by result (accepted / duplicate / stale)."""
    return counts(url, "promreflex_controller_notifications_total")


def hold(condition, seconds: float, what: str) -> None:
    """``condition`` stays true for ``seconds`` (duplicates arriving late must change nothing)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition(), what
        time.sleep(0.2)


@pytest.fixture
def ha(tmp_path, request):
    ctl_dir = tmp_path / "controller"
    runs_file = tmp_path / "runs.jsonl"
    ctl = ControllerProcess(ctl_dir, routes=[{"name": "overload", "matchers": ['alertname="HaTestOverload"'],
                                              "action": "log", "params": {"path": str(runs_file)}}],
                            settings={"reconcile_interval": "2s"})
    with GaugeSource() as source:
        # A partitioned cluster (gossip down) delivers every notification once per peer.
        path = HAPath(tmp_path / "ha", source.port, f"{ctl.url}/webhook", peer_timeout="3s",
                      joined=getattr(request, "param", "joined") == "joined")
        try:
            path.start()
            ctl.alertmanager_url = path.am_urls  # every peer: reconciliation fails over
            ctl.start()
            yield source, path, ctl, runs_file
        finally:
            ctl.stop()
            path.stop()


@pytest.mark.parametrize("ha", ["partitioned"], indirect=True)
def test_duplicates_from_both_replicas_and_every_peer_run_each_transition_once(ha):
    source, path, ctl, runs_file = ha
    source.values = {"a": 1.0}
    wait_until(lambda: runs(runs_file) == [("fire", "a")], timeout=60, what="the fire run")
    # Both replicas send to all three peers: duplicates do arrive, and change nothing.
    # Both replicas send to all three peers, which each notify: duplicates arrive, change nothing.
    wait_until(lambda: accepted_notifications(ctl.url).get("duplicate", 0) >= 2,
               timeout=60, what="duplicate deliveries reaching the controller")
    hold(lambda: runs(runs_file) == [("fire", "a")], 8, "a duplicate ran the action again")
    source.values["a"] = 0.0
    wait_until(lambda: runs(runs_file) == [("fire", "a"), ("resolve", "a")], timeout=90, what="the resolve run")
    hold(lambda: runs(runs_file) == [("fire", "a"), ("resolve", "a")], 8, "a late duplicate re-ran a transition")


def test_a_replica_and_a_peer_killed_mid_incident_still_fire_and_resolve_once(ha):
    source, path, ctl, runs_file = ha
    source.values = {"a": 1.0}
    wait_until(lambda: runs(runs_file) == [("fire", "a")], timeout=60, what="the fire run")
    # Mid-incident: one Prometheus replica and one Alertmanager peer (the first the controller
    # reconciles against) die without a word.
    HAPath.kill(path.prometheus[0])
    HAPath.kill(path.alertmanagers[0])
    # Reconciliation fails over to a live peer: it keeps succeeding.
    before = counts(ctl.url, "promreflex_controller_reconcile_runs_total")
    wait_until(lambda: counts(ctl.url, "promreflex_controller_reconcile_runs_total").get("ok", 0) >= before.get("ok", 0) + 3,
               timeout=60, what="reconciliations against the surviving peers")
    assert counts(ctl.url, "promreflex_controller_reconcile_runs_total").get("error", 0) == before.get("error", 0)
    hold(lambda: runs(runs_file) == [("fire", "a")], 10, "a peer failure re-ran or undid the action")
    source.values["a"] = 0.0
    wait_until(lambda: runs(runs_file) == [("fire", "a"), ("resolve", "a")], timeout=120,
               what="the resolve run after the failures")
    # A second incident on the survivors: fires and resolves again, once each.
    source.values["a"] = 1.0
    wait_until(lambda: runs(runs_file)[2:] == [("fire", "a")], timeout=90, what="the second incident's fire")
    source.values["a"] = 0.0
    wait_until(lambda: runs(runs_file)[2:] == [("fire", "a"), ("resolve", "a")], timeout=120,
               what="the second incident's resolve")
    hold(lambda: len(runs(runs_file)) == 4, 8, "a late notification re-ran a transition")
