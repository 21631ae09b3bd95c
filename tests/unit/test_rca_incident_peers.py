"""The rca incident's end, judged against an Alertmanager cluster whose peers restart too.

The incident (root-cause gauge, posted MeshRootCause/MeshRootCauseSymptom alerts inhibiting the
dependants' alerts) ended when ONE peer (the one reads stick to) listed none of the watched
services' alerts. At start a restored incident is checked at once: when the controller's host
rebooted, its Alertmanager peer restarted with it and lists nothing until Prometheus re-sends,
so a live incident was ended (the dependants' alerts paged again, and the engine, which still
had the alert applied, never fired it again).

Now the incident keeps the fingerprints and ``startsAt`` of the alerts it watches and asks the
engine's judgement (``services["alertmanager_presence"]``, inhibited and silenced alerts included): it
continues while any is listed by a peer or unproven, and ends only when every one's absence is
proven.

The controller is the real engine with the rca route; each Alertmanager peer is the fake of
``tests/fake_alertmanager.py`` behind the real client (its ``cluster``); Prometheus is the
rca tests' ``FakePrometheus`` (the chain a -> b -> c, c the root). The refresh loop is idle:
each test runs the check the loop runs at start and every ``lease / 3`` itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers.audit import AuditLog
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from controllers.rca.action import RcaAction, incident_path
from promreflex.clients import iso
from promreflex.config import ControllerConfig, Route
from tests.fake_alertmanager import cluster
from tests.payloads import alert, payload
from tests.unit.test_copy_guard_recovery_peers import Clock, crash
from tests.unit.test_rca_action import FakePrometheus

GRACE = 120.0  # controller.alertmanager_restart_grace
STARTS = iso(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10))  # whole ms, as listed
SLOW_A = alert("ServiceResponseTimeHigh", starts=STARTS, service="a", severity="warning")
SLOW_C = alert("ServiceResponseTimeHigh", starts=STARTS, service="c", severity="warning")  # the root's
# Another alert of the root's service (another label set: its own fingerprint).
OTHER_C = alert("ServiceResponseTimeHigh", starts=STARTS, service="c", severity="warning", instance="c-2")


@pytest.fixture(autouse=True)
def _checks_by_the_test(monkeypatch):
    """The incident's refresh loop does nothing: each test runs the check itself."""

    async def idle(self: RcaAction, first_wait: float | None = None) -> None:
        return None

    monkeypatch.setattr(RcaAction, "_refresh_loop", idle)


def make_engine(tmp_path, client: Any, clock: Clock) -> Engine:
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
        alertmanager_restart_grace=GRACE,
        routes=[Route(name="rca", matchers=['alertname="ServiceResponseTimeHigh"'], action="rca",
                      params={"settle": "10ms", "pending_wait": 0, "lease": "30s",
                              "report": str(tmp_path / "rca" / "latest.json"),
                              "source": {"queries": {"resources": {
                                  "cpu": 'sum(rate(cpu_seconds_total{service="$service"}[1m]))'}}}})],
    )
    return Engine(cfg, ControllerMetrics(CollectorRegistry(), ["rca"]), AuditLog(cfg.audit_log),
                  services={"alertmanager": client, "prometheus": FakePrometheus(), "registry": CollectorRegistry()},
                  clock=clock)


async def boot(engine: Engine) -> RcaAction:
    """Start the controller (the action resumes the incident its file keeps)."""
    await engine.start()
    rca = engine.actions["rca"]
    assert isinstance(rca, RcaAction)
    return rca


async def an_incident_then_a_crash(tmp_path, peers, client: Any, clock: Clock) -> None:
    """Every peer holds a's and c's alerts; the controller names c the root cause, then crashes."""
    for p in peers:
        p.fire(SLOW_A)
        p.fire(SLOW_C)
    engine = make_engine(tmp_path, client, clock)
    rca = await boot(engine)
    await engine.handle_payload(WebhookPayload.model_validate(payload(SLOW_A, SLOW_C)))
    await engine.drain()
    assert rca.incident is not None and set(rca.incident.roots) == {"c"} and rca.incident.watch == {"c"}
    crash(engine)


async def restarted(tmp_path, client: Any, clock: Clock, *young) -> tuple[Engine, RcaAction]:
    """The controller starts again (resuming the incident); the ``young`` peers restarted with
    it (empty until Prometheus re-sends)."""
    for p in young:
        p.restart(started=clock.t)
    engine = make_engine(tmp_path, client, clock)
    return engine, await boot(engine)


async def check(rca: RcaAction) -> str:
    """What the refresh loop runs at start (at once) and every ``lease / 3``."""
    async with rca._lock:
        assert rca.incident is not None
        return await rca._check()


def flagged(engine: Engine, rca: RcaAction) -> bool:
    """The incident is on: in memory, in its file, and on the gauge."""
    reg = engine.services["registry"]
    return (rca.incident is not None and incident_path(rca.incident.params.report).exists()
            and reg.get_sample_value("promreflex_root_cause", {"service": "c"}) is not None)


def ended(engine: Engine, tmp_path) -> bool:
    reg = engine.services["registry"]
    rca = engine.actions["rca"]
    assert isinstance(rca, RcaAction)
    return (rca.incident is None and not incident_path(tmp_path / "rca" / "latest.json").exists()
            and reg.get_sample_value("promreflex_root_cause", {"service": "c"}) is None)


async def test_a_host_reboot_keeps_the_incident_another_peer_lists(tmp_path):
    """The controller and the Alertmanager peer of its host restart together; the other host's
    peer still lists the root's alert. The restarted peer is the one reads stick to: it
    answered "nothing firing" and the restored incident was ended at once."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        engine, rca = await restarted(tmp_path, client, clock, peers[0])  # back with the host
        assert flagged(engine, rca)
        detail = await check(rca)
        assert flagged(engine, rca), f"a restarted peer's empty listing ended a live incident: {detail}"
        assert detail.startswith("incident continues: c still firing")
        await engine.shutdown()


async def test_a_lagging_first_peer_does_not_end_an_incident_another_peer_lists(tmp_path):
    """The peer reads stick to (running for long) no longer has the root's alert (Prometheus's
    posts to it failed, its copy expired); another peer has it: the incident continues."""
    clock = Clock()
    async with cluster(3) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        peers[0].end(SLOW_C["fingerprint"])
        peers[0].gc()
        engine, rca = await restarted(tmp_path, client, clock)
        detail = await check(rca)
        assert flagged(engine, rca), f"one lagging peer ended a live incident: {detail}"
        await engine.shutdown()


async def test_the_incident_continues_while_only_young_peers_answer_until_the_grace(tmp_path):
    """Every peer restarted (both hosts): none has been re-sent the alert yet. No proof either
    way: the incident continues (every check within the grace); the root's alert ended
    meanwhile, so once the peers have run for the grace their empty listings are believed."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        start = clock.t
        engine, rca = await restarted(tmp_path, client, clock, *peers)
        for _ in range(12):  # 110 s of checks (every lease / 3 = 10 s) inside the grace
            detail = await check(rca)
            assert flagged(engine, rca), f"young peers' empty listings ended a live incident: {detail}"
            assert "restarted within the grace" in detail
            clock.t += 10
        assert clock.t == start + GRACE
        detail = await check(rca)
        assert detail.startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()


async def test_young_peers_then_prometheus_re_sends_the_root_alert(tmp_path):
    """Only young peers; then Prometheus re-sends the root's alert to one: listed, it continues
    past the grace; when it ends there (a peer that listed it since it started), it is over."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        engine, rca = await restarted(tmp_path, client, clock, *peers)
        clock.t += 30
        assert flagged(engine, rca) and "restarted within the grace" in await check(rca)
        peers[1].fire(SLOW_C)  # re-sent
        clock.t += GRACE
        assert (await check(rca)).startswith("incident continues: c still firing")
        peers[1].end(SLOW_C["fingerprint"])
        peers[1].gc()
        assert (await check(rca)).startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()


async def test_a_settled_peer_that_omits_every_watched_alert_ends_the_incident(tmp_path):
    """The root's alert ended while the host rebooted. The host's own peer is young and empty;
    the other one (running for long) lists a's alert but not c's: c's absence is proven, the
    incident is over (also the old behaviour: the guard that it still ends)."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        peers[1].end(SLOW_C["fingerprint"])
        peers[1].gc()
        engine, rca = await restarted(tmp_path, client, clock, peers[0])
        detail = await check(rca)
        assert detail.startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()


async def test_an_inhibited_watched_alert_still_fires(tmp_path):
    """The engine's read for the rca includes inhibited alerts: an inhibited service is still
    slow (the reconciliation's default read would prove it absent on a settled peer)."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        peers[1].inhibit(SLOW_C["fingerprint"], by="some-other-rule")
        engine, rca = await restarted(tmp_path, client, clock, peers[0])
        detail = await check(rca)
        assert flagged(engine, rca), detail
        assert detail.startswith("incident continues: c still firing")
        await engine.shutdown()


async def test_a_silenced_root_alert_still_fires(tmp_path):
    """A silence on the root's own alert ("we are on it") mutes its notifications; the service
    is still slow. It ended the incident ("c no longer firing"), cleared the flag and the
    symptoms' alerts, and so un-inhibited every dependant's alert (they paged)."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        for p in peers:
            p.silence(SLOW_C["fingerprint"], "s1")
        engine, rca = await restarted(tmp_path, client, clock)
        # (and the resumed incident's finding is the last one: the gauge read 0 after a restart)
        found = engine.services["registry"].get_sample_value("promreflex_rca_last_finding_timestamp_seconds")
        assert found == datetime.fromisoformat(rca.incident.finding.created_at.replace("Z", "+00:00")).timestamp()
        detail = await check(rca)
        assert flagged(engine, rca), detail
        assert detail.startswith("incident continues: c still firing")
        for p in peers:
            p.end(SLOW_C["fingerprint"])
            p.gc()
        assert (await check(rca)).startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()


async def test_a_service_silenced_before_the_analysis_is_no_candidate(tmp_path):
    """A service muted on purpose (maintenance, its alert silenced for the week) is no one's
    candidate: with silenced alerts counted as candidates it joined an unrelated incident, which
    then lasted as long as the silence (a review of the fix above)."""
    legacy = alert("ServiceResponseTimeHigh", starts=STARTS, service="legacy", severity="warning")
    slow_b = alert("ServiceResponseTimeHigh", starts=STARTS, service="b", severity="warning")
    async with cluster(1) as ((am,), client):
        am.fire(legacy)
        am.silence(legacy["fingerprint"], "maintenance-week")
        am.fire(SLOW_A)
        am.fire(slow_b)
        engine = make_engine(tmp_path, client, Clock())
        rca = await boot(engine)
        await engine.handle_payload(WebhookPayload.model_validate(payload(SLOW_A, slow_b)))
        await engine.drain()
        assert rca.incident is not None and "legacy" not in rca.incident.covered | rca.incident.watch
        for fp in (SLOW_A["fingerprint"], slow_b["fingerprint"]):
            am.end(fp)
        am.gc()
        detail = await check(rca)
        assert detail.startswith("incident over"), detail
        await engine.shutdown()


async def test_the_incident_file_keeps_the_watched_alerts_and_an_old_file_learns_them(tmp_path):
    """The incident file keeps each watched alert's fingerprint and startsAt. A file written
    before (no ``alerts``) is still resumed: it is judged by service over every peer's
    listing (the union) until a listing shows a watched service's alert, whose fingerprint it
    adopts; from then on by the engine's judgement."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        path = incident_path(tmp_path / "rca" / "latest.json")
        saved = json.loads(path.read_text())
        fp = SLOW_C["fingerprint"]
        assert set(saved["alerts"]) == {fp} and saved["alerts"][fp]["service"] == "c"
        assert datetime.fromisoformat(saved["alerts"][fp]["startsAt"].replace("Z", "+00:00")) == \
            datetime.fromisoformat(STARTS.replace("Z", "+00:00"))
        del saved["alerts"]  # as an earlier version wrote it
        path.write_text(json.dumps(saved))

        engine, rca = await restarted(tmp_path, client, clock, peers[0])  # young and empty, answers first
        assert rca.incident is not None and rca.incident.alerts == {}
        detail = await check(rca)
        assert flagged(engine, rca), f"a restarted peer's empty listing ended a live incident: {detail}"
        assert set(rca.incident.alerts) == {fp} and set(json.loads(path.read_text())["alerts"]) == {fp}
        peers[1].restart(started=clock.t)  # now every peer is young: unproven, kept
        assert "restarted within the grace" in await check(rca)
        await engine.shutdown()


async def test_a_later_alert_of_a_watched_service_is_watched_too(tmp_path):
    """A new alert of the root's service (another label set: its own fingerprint) reaches the
    action through the engine: the incident watches it too, and continues on it alone."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        engine, rca = await restarted(tmp_path, client, clock)
        for p in peers:
            p.fire(OTHER_C)
            p.end(SLOW_C["fingerprint"])
            p.gc()
        await engine.handle_payload(WebhookPayload.model_validate(payload(OTHER_C)))
        await engine.drain()
        assert rca.incident is not None and OTHER_C["fingerprint"] in rca.incident.alerts
        assert (await check(rca)).startswith("incident continues: c still firing")
        for p in peers:
            p.end(OTHER_C["fingerprint"])
            p.gc()
        assert (await check(rca)).startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()


async def test_presence_reads_inhibited_alerts_only_when_asked(tmp_path):
    """``Engine.presence``: by default (the copy guard's read, the reconciliation's) an
    inhibited alert is not listed, and a settled peer's omission proves it absent; with
    ``inhibited=True`` (the rca's) it is listed."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        am.fire(SLOW_C)
        am.inhibit(SLOW_C["fingerprint"], by="x")
        engine = make_engine(tmp_path, client, clock)
        await engine.start()
        fp = SLOW_C["fingerprint"]
        assert await engine.presence({fp: None}) == {fp: False}
        assert await engine.presence({fp: None}, inhibited=True) == {fp: True}
        assert await engine.services["alertmanager_presence"]({fp: None}, inhibited=True) == {fp: True}
        await engine.shutdown()


async def test_another_alert_of_a_watched_service_only_listed_keeps_the_incident(tmp_path):
    """Every watched alert is proven gone, but a peer lists another alert of the root's service
    that never reached the action (one inhibited from its start is never notified): the
    listing proves the service still fires; it is watched from then on."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        await an_incident_then_a_crash(tmp_path, peers, client, clock)
        engine, rca = await restarted(tmp_path, client, clock)
        for p in peers:
            p.end(SLOW_C["fingerprint"])
            p.gc()
        peers[1].fire(OTHER_C)
        peers[1].inhibit(OTHER_C["fingerprint"], by="x")
        assert (await check(rca)).startswith("incident continues: c still firing")
        assert rca.incident is not None and OTHER_C["fingerprint"] in rca.incident.alerts
        peers[1].end(OTHER_C["fingerprint"])
        peers[1].gc()
        assert (await check(rca)).startswith("incident over") and ended(engine, tmp_path)
        await engine.shutdown()
