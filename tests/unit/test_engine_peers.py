"""Alertmanager's view, peer by peer (a stranger's review, H3, M3, M1, L2).

- H3: a restarted Alertmanager peer lists no alert until Prometheus re-sends (resend delay 1 m
  plus an evaluation). The reconciliation read the peer it sticks to and took its empty answer
  as the end of every applied alert: a rolling restart of a healthy cluster resolved them
  mid-incident and fired them again a minute later. Now an alert is absent only when no peer
  that answered lists it and one of them can be believed (running past the grace, or it listed
  that alert since it started).
- M3: the pre-fire re-check read one peer; one that had not yet received what another just
  notified made the fire "skipped". Now any peer listing it means it is held.
- M1: the reconciliation acted on alerts Alertmanager routes elsewhere; now only on those routed
  to ``alertmanager_receiver`` (absence is still judged on every alert), and, with
  ``reconcile_fire_after``, only on alerts active for that long (group_wait).
- L2: the ordering memory kept a ``firing`` row forever for every alert it saw active.

Each peer is the fake Alertmanager (tests/fake_alertmanager.py) behind the real client."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers.actions.base import Action, ActionContext, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.config import ControllerConfig, Route
from tests.fake_alertmanager import cluster
from tests.payloads import alert, payload

CALLS: list[tuple[str, str]] = []


@register
class PeerRecorder(Action):
    name = "test-peer-recorder"
    concurrency = 4

    async def fire(self, ctx: ActionContext) -> str:
        CALLS.append(("fire", ctx.alert.name))
        return "fired"

    async def resolve(self, ctx: ActionContext) -> str:
        CALLS.append(("resolve", ctx.alert.name))
        return "resolved"


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


GRACE = 120.0


def make_engine(tmp_path, am: Any, clock: Clock | None = None, **settings: Any) -> tuple[Engine, CollectorRegistry]:
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
        alertmanager_restart_grace=GRACE, **settings,
        routes=[Route(name="r", matchers=['alertname=~"Overload|Other"'], action="test-peer-recorder")],
    )
    registry = CollectorRegistry()
    engine = Engine(cfg, ControllerMetrics(registry, ["test-peer-recorder"]), AuditLog(cfg.audit_log),
                    services={"alertmanager": am}, clock=clock or time.time)
    return engine, registry


async def deliver(engine: Engine, *alerts: dict[str, Any]) -> dict[str, int]:
    return await engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))


async def converge(engine: Engine) -> dict[str, int]:
    summary = await engine.reconcile()
    await engine.drain()
    return summary


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


STARTED = iso(datetime.now(UTC) - timedelta(minutes=10))
FIRING = alert("Overload", starts=STARTED, instance="a")
RESOLVED = alert("Overload", status="resolved", starts=STARTED, instance="a")
FP = FIRING["fingerprint"]


def kinds() -> list[str]:
    return [c[0] for c in CALLS]


# ---------------------------------------------------------------- H3
async def test_a_restarted_alertmanager_is_no_proof_that_an_applied_alert_ended(tmp_path):
    """One Alertmanager restarts mid-incident: it lists nothing until Prometheus re-sends. The
    reconciliation resolved the applied alert and fired it again when the re-send came."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.fire(FIRING)
        await deliver(engine, FIRING)
        await converge(engine)
        assert kinds() == ["fire"]
        am.restart(started=clock.t)  # back at once, empty
        clock.t += 15
        summary = await converge(engine)
        assert kinds() == ["fire"], "an empty listing from a restarted Alertmanager resolved the alert"
        assert summary["absence_deferred"] == 1 and summary["young_peers"] == 1
        clock.t += 45
        am.fire(FIRING)  # Prometheus re-sends: the same episode
        await deliver(engine, FIRING)  # and the restarted Alertmanager notifies it again
        await converge(engine)
        assert kinds() == ["fire"]
        # Now it ends for real: the restarted peer listed it since it started, so its absence counts.
        am.end(FP)
        am.gc()
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        await engine.shutdown()


async def test_an_alert_that_ended_while_the_only_alertmanager_restarted_is_resolved_after_the_grace(tmp_path):
    """The price: with a single Alertmanager that restarted, an alert that truly ended (and whose
    resolved notification was lost) is resolved once the grace has passed, not at once."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.fire(FIRING)
        await converge(engine)
        am.restart(started=clock.t)
        for _ in range(7):  # 105 s of reconciliations inside the grace
            clock.t += 15
            await converge(engine)
        assert kinds() == ["fire"]
        clock.t += 20  # past the grace: the restarted Alertmanager's listing is believed
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        await engine.shutdown()


async def test_a_rolling_restart_of_a_cluster_does_not_undo_the_action(tmp_path):
    """Review H3's script: each peer restarted right after a reconciliation, the others holding
    the alert; then every peer restarted (all young, none re-sent yet). Nothing runs. When the
    alert ends, the restarted peers (which listed it since) prove its absence at once."""
    clock = Clock()
    async with cluster(3) as (peers, client):
        engine, _ = make_engine(tmp_path, client, clock)
        for p in peers:
            p.fire(FIRING)
        await deliver(engine, FIRING)
        await converge(engine)
        assert kinds() == ["fire"]
        for i, p in enumerate(peers):
            p.restart(started=clock.t)
            clock.t += 15
            await converge(engine)
            assert kinds() == ["fire"], f"restarting peer {i} undid the action"
        for p in peers:  # Prometheus re-sends to every peer
            p.fire(FIRING)
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire"]
        for p in peers:
            p.end(FP)
            p.gc()
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        await engine.shutdown()


async def test_any_peer_listing_an_alert_keeps_it_and_a_silence_still_resolves_it(tmp_path):
    """Presence from any peer counts (peers do not gossip alerts); a silence (gossiped to every
    peer) empties every listing: resolved at once."""
    async with cluster(3) as (peers, client):
        engine, _ = make_engine(tmp_path, client)
        peers[2].fire(FIRING)  # only the last peer has it (Prometheus's posts to the others failed)
        await converge(engine)
        assert kinds() == ["fire"]
        await converge(engine)
        assert kinds() == ["fire"]
        peers[2].silence(FP)
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        await engine.shutdown()


async def test_a_peer_down_is_no_evidence_either_way(tmp_path):
    async with cluster(2) as (peers, client):
        engine, registry = make_engine(tmp_path, client)
        for p in peers:
            p.fire(FIRING)
        await converge(engine)
        peers[0].fail = True
        await converge(engine)
        assert kinds() == ["fire"]
        peers[1].end(FP)
        peers[1].gc()
        await converge(engine)  # the only peer that answered runs past the grace: it ended
        assert kinds() == ["fire", "resolve"]
        peers[1].fail = True
        await engine.reconcile()
        assert registry.get_sample_value("promreflex_controller_reconcile_runs_total", {"result": "error"}) == 1
        await engine.shutdown()


# ---------------------------------------------------------------- M3
async def test_the_pre_fire_recheck_asks_the_other_peers_before_skipping(tmp_path):
    """Review M3: Prometheus posts to each peer separately; the peer that notified holds the alert
    a moment before the peer the controller reads. The re-check said "no longer active" and the
    fire waited for the next reconciliation."""
    async with cluster(3) as (peers, client):
        engine, registry = make_engine(tmp_path, client)
        peers[1].fire(FIRING)  # it notified; peers 0 (read first) and 2 have not received it yet
        await deliver(engine, FIRING)
        await engine.drain()
        assert kinds() == ["fire"], "the fire was skipped although a peer held the alert"
        skipped = registry.get_sample_value("promreflex_controller_actions_total",
                                            {"action": "test-peer-recorder", "transition": "fire", "result": "skipped"})
        assert skipped == 0
        # No peer lists it (all running for long): the notification is not acted on.
        other = alert("Other", starts=STARTED, instance="b")
        await deliver(engine, other)
        await engine.drain()
        assert kinds() == ["fire"]
        await engine.shutdown()


async def test_the_recheck_acts_on_the_notification_when_only_restarted_peers_answer(tmp_path):
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.restart(started=clock.t - 5)  # restarted 5 s ago: it has not been re-sent the alert yet
        await deliver(engine, FIRING)
        await engine.drain()
        assert kinds() == ["fire"]
        await engine.shutdown()


# ---------------------------------------------------------------- M1
async def test_the_reconciliation_fires_only_alerts_routed_to_the_controllers_receiver(tmp_path):
    """Review M1: an alert Alertmanager routes to another receiver only ("null", a team's
    pager) was fired by the reconciliation."""
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client)
        elsewhere = alert("Other", starts=STARTED, instance="b")
        am.fire(elsewhere, receivers=["null"])
        summary = await converge(engine)
        assert kinds() == [] and summary["routed_here"] == 0
        am.fire(FIRING)  # routed to "promreflex" (and maybe others: continue: true)
        await converge(engine)
        assert kinds() == ["fire"]
        # An alert notified to this controller stays applied while Alertmanager lists it, routed
        # here or not (absence is judged on every alert).
        await deliver(engine, elsewhere)
        am.fire(elsewhere, receivers=["null"])
        await engine.drain()
        await converge(engine)
        assert kinds() == ["fire", "fire"]
        await engine.shutdown()


async def test_a_receiver_alertmanager_does_not_know_reads_every_alert(tmp_path, caplog):
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, alertmanager_receiver="not-configured-there")
        am.fire(alert("Other", starts=STARTED, instance="b"), receivers=["null"])
        summary = await converge(engine)
        assert kinds() == ["fire"] and "routed_here" not in summary
        assert "has no receiver named 'not-configured-there'" in caplog.text
        await engine.shutdown()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path / "off", client, alertmanager_receiver=None)
        am.fire(alert("Other", starts=STARTED, instance="c"), receivers=["null"])
        await converge(engine)
        assert kinds() == ["fire", "fire"]
        await engine.shutdown()


async def test_reconcile_fire_after_leaves_young_alerts_to_alertmanagers_group_wait(tmp_path):
    """With ``reconcile_fire_after`` (a route's group_wait), an alert that flapped on for less is
    not fired by the reconciliation alone; the webhook path is not delayed."""
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, reconcile_fire_after=30.0)
        young = alert("Overload", starts=iso(datetime.now(UTC) - timedelta(seconds=5)), instance="young")
        am.fire(young)
        summary = await converge(engine)
        assert kinds() == [] and summary["too_young"] == 1
        am.fire(FIRING)  # active for 10 minutes
        await converge(engine)
        assert kinds() == ["fire"]
        await deliver(engine, young)  # Alertmanager notified it: acted on at once
        await engine.drain()
        assert kinds() == ["fire", "fire"]
        await engine.shutdown()


# ---------------------------------------------------------------- L2
async def test_the_ordering_memory_forgets_firing_alerts_that_left_alertmanager(tmp_path):
    """Review L2: a ``firing`` row stayed forever for every alert the reconciliation saw active
    that did not end through a resolved notification to the controller."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock, alertmanager_receiver=None)
        unrouted = alert("Unmatched", starts=STARTED, instance="x")  # matches no route
        held = alert("Unmatched", starts=STARTED, instance="still-active")
        am.fire(unrouted)
        am.fire(held)
        await converge(engine)
        assert {unrouted["fingerprint"], held["fingerprint"]} <= set(engine._latest)
        am.end(unrouted["fingerprint"])
        am.gc()
        clock.t += 3601  # past the dedupe window
        summary = await converge(engine)
        assert unrouted["fingerprint"] not in engine._latest and summary["latest_forgotten"] == 1
        assert held["fingerprint"] in engine._latest  # still listed: kept
        await engine.shutdown()
    engine2, _ = make_engine(tmp_path, None)
    assert unrouted["fingerprint"] not in engine2._latest  # on disk too
    assert held["fingerprint"] in engine2._latest


async def test_without_alertmanager_firing_rows_nothing_holds_expire_after_the_window(tmp_path):
    cfg = ControllerConfig(audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
                           routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-peer-recorder")])
    clock = Clock()
    engine = Engine(cfg, ControllerMetrics(CollectorRegistry(), ["test-peer-recorder"]), AuditLog(cfg.audit_log),
                    clock=clock)
    unmatched = alert("Unmatched", starts=STARTED)
    await deliver(engine, unmatched, FIRING)
    await engine.drain()
    clock.t += 3601
    await deliver(engine, alert("Unmatched", starts=STARTED, instance="later"))
    assert unmatched["fingerprint"] not in engine._latest
    assert FP in engine._latest  # an entry holds it (applied)
    await engine.shutdown()


async def test_the_audit_says_why_an_absence_waits(tmp_path):
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.fire(FIRING)
        await converge(engine)
        am.restart(started=clock.t)
        await converge(engine)
        reconciles = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "reconcile"]
        assert reconciles[-1]["absence_deferred"] == 1 and reconciles[-1]["young_peers"] == 1
        await engine.shutdown()


async def test_alerts_by_peer_reads_every_peer_and_when_each_started(tmp_path):
    """The client: every peer at once, with ``/api/v2/status``'s uptime (a timestamp); a peer
    that does not answer is None; none answering raises."""
    from promreflex.clients import APIError

    async with cluster(2) as (peers, client):
        peers[0].fire(FIRING)
        peers[1].restart(started=1_800_000_000.0)
        views = await client.alerts_by_peer()
        assert [len(v.alerts or []) for v in views] == [1, 0]
        assert views[0].started == datetime(1970, 1, 1, tzinfo=UTC)
        assert views[1].started == datetime.fromtimestamp(1_800_000_000.0, UTC)
        assert await client.receivers() == ["null", "promreflex"]
        peers[0].fail = True
        views = await client.alerts_by_peer()
        assert views[0].alerts is None and views[0].error and views[1].alerts == []
        peers[1].fail = True
        with pytest.raises(APIError, match="no Alertmanager peer answered"):
            await client.alerts_by_peer()
        await asyncio.sleep(0)


async def test_a_young_alertmanager_that_held_the_alert_proves_its_absence(tmp_path):
    """A fresh Alertmanager (started within the grace) is believed about an alert it listed
    since it started: the pre-fire re-check's listing counts as well as a reconciliation's, so a
    silence set right after the fire (before any reconciliation listed the alert) resolves it."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.restart(started=clock.t - 2)
        await converge(engine)  # nothing active yet
        am.fire(FIRING)
        await deliver(engine, FIRING)  # fired after the re-check found it
        await engine.drain()
        am.silence(FP)
        clock.t += 1
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        await engine.shutdown()


async def test_a_young_alertmanager_that_was_up_when_the_episode_began_proves_its_end(tmp_path):
    """The stack was just (re)started, the alert resolved while the controller was down, and the
    resolved notification never came (Alertmanager does not send a resolve for an alert whose
    firing notification failed). The controller never saw this Alertmanager list the alert, but
    it was up when the episode began (Prometheus sends a new alert to every Alertmanager at once):
    its silence is the end, resolved at start. An episode that began before it started waits for
    the grace."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        am.restart(started=clock.t - 20)
        later = alert("Overload", starts=iso(datetime.fromtimestamp(clock.t - 10, UTC)), instance="a")
        am.fire(later)
        engine, _ = make_engine(tmp_path, client, clock)
        await deliver(engine, later)
        await engine.drain()
        await engine.shutdown()
        am.end(later["fingerprint"])  # it ends while the controller is down
        am.gc()
        engine2, _ = make_engine(tmp_path, client, clock)
        await engine2.start()
        await converge(engine2)
        assert kinds() == ["fire", "resolve"]
        await engine2.shutdown()

        CALLS.clear()  # the same with an episode older than this Alertmanager: the grace
        am.fire(FIRING)
        engine3, _ = make_engine(tmp_path / "older", client, clock)
        await deliver(engine3, FIRING)
        await engine3.drain()
        await engine3.shutdown()
        am.end(FP)
        am.gc()
        engine4, _ = make_engine(tmp_path / "older", client, clock)
        await engine4.start()
        await converge(engine4)
        assert kinds() == ["fire"]
        clock.t += GRACE
        await converge(engine4)
        assert kinds() == ["fire", "resolve"]
        await engine4.shutdown()


async def test_one_url_in_front_of_two_alertmanagers_never_resolves_what_still_fires(tmp_path, caplog):
    """A load balancer (or a Kubernetes Service) in front of a 2-peer cluster, one URL in the
    configuration; one peer restarts and lists nothing yet. Its empty list was judged with the
    other peer's age (the status read landed there): every reconciliation resolved the alert
    and the next fired it again (a review: 8 fires, 7 resolves in 45 s). Now the URL is seen to
    answer as two Alertmanagers, said once in the log, and no absence is believed from it."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from promreflex.clients import AlertmanagerClient
    from tests.fake_alertmanager import FakeAlertmanagerAPI

    peers = [FakeAlertmanagerAPI(), FakeAlertmanagerAPI()]
    turn = [0]

    def rr(handler: str):
        async def call(request: web.Request) -> web.Response:
            turn[0] += 1
            return await getattr(peers[turn[0] % 2], handler)(request)
        return call

    lb = web.Application()
    lb.router.add_get("/api/v2/alerts", rr("_get"))
    lb.router.add_get("/api/v2/status", rr("_status"))
    lb.router.add_get("/api/v2/receivers", rr("_receivers"))
    clock = Clock()
    async with TestServer(lb) as server, aiohttp_session() as session:
        client = AlertmanagerClient(str(server.make_url("")), session)
        engine, _ = make_engine(tmp_path, client, clock)
        for p in peers:
            p.fire(FIRING)
        await converge(engine)
        assert kinds() == ["fire"]
        peers[1].restart(started=clock.t)  # back at once, empty, young
        after_detection = None
        with caplog.at_level("WARNING"):
            for i in range(12):
                clock.t += 3
                await converge(engine)
                turn[0] += i % 3  # other clients' requests through the balancer shift the parity
                if after_detection is None and "answers as more than one Alertmanager" in caplog.text:
                    after_detection = list(kinds())
        assert after_detection is not None, "the URL was not seen to reach two Alertmanagers"
        assert kinds() == after_detection and kinds()[-1] == "fire"  # no flapping once seen
        assert kinds().count("resolve") <= 1, kinds()  # at most once, before it was seen
        await engine.shutdown()


def aiohttp_session():
    import aiohttp

    return aiohttp.ClientSession()


async def test_a_failed_status_read_is_not_taken_for_another_alertmanager(tmp_path):
    """A single Alertmanager whose status read failed once (a 503, a timeout) was recorded as an
    identity; the next good read looked like a return to an old one: "more than one
    Alertmanager" for good, and the reconciliation never again resolved an alert that ended
    (a review of this fix)."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.fire(FIRING)
        await converge(engine)
        assert kinds() == ["fire"]
        status = am._status
        fails = [2]

        async def flaky(request):
            if fails[0] > 0:
                fails[0] -= 1
                from aiohttp import web

                return web.json_response({"error": "injected"}, status=503)
            return await status(request)

        am._status = flaky  # type: ignore[method-assign]  # (the fake's route calls through the attribute)
        for _ in range(4):
            clock.t += 3
            await converge(engine)
        am.end(FP)
        am.gc()
        clock.t += 3
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        assert not any(m.shared for m in engine._peers.values())
        await engine.shutdown()


async def test_a_restarted_alertmanager_whose_status_cannot_be_read_proves_no_absence(tmp_path):
    """Back empty after a restart, and its /api/v2/status answers 503: its age unknown, it was
    taken for old enough, and the alert that still fired was resolved (a review)."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client, clock)
        am.fire(FIRING)
        await converge(engine)
        am.restart(started=clock.t)

        async def unavailable(request):
            from aiohttp import web

            return web.json_response({"error": "injected"}, status=503)

        am._status = unavailable  # type: ignore[method-assign]
        for _ in range(3):
            clock.t += 3
            await converge(engine)
        assert kinds() == ["fire"]
        await engine.shutdown()


# ---------------------------------------------------------------- a stranger's review (L), 2026-11-28
async def test_a_young_peers_later_starts_at_does_not_replace_the_episode(tmp_path):
    """Review L, F2: a Prometheus replica restarted gives a `for: 0` alert a later activeAt; a
    restarted Alertmanager peer lists that later startsAt until the cluster merges back to the
    earliest. The controller took it for the episode, then every peer's earliest was "stale":
    silenced and unsilenced, the alert never fired again, nor on a route added later."""
    clock = Clock()
    later = alert("Overload", starts=iso(datetime.now(UTC) - timedelta(minutes=2)), instance="a")
    async with cluster(3) as (peers, client):
        engine, _ = make_engine(tmp_path, client, clock)
        for p in peers:
            p.fire(FIRING)
        await converge(engine)
        assert kinds() == ["fire"]
        peers[0].restart(started=clock.t - 200)  # past the grace; the replica that re-sent first restarted too
        peers[0].fire(later)
        clock.t += 15
        await converge(engine)
        peers[0].fire(FIRING)  # merged back to the earliest
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire"]  # nothing ran meanwhile
        for p in peers:
            p.silence(FP)
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        for p in peers:
            p.expire_silence(FP)
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve", "fire"], "the alert back from its silence was not fired"
        await engine.shutdown()


async def test_an_earlier_start_of_the_same_episode_is_held_from_then_on(tmp_path):
    """The controller starts while a young peer lists the later startsAt first: the earliest,
    listed next by the other peers, is the same episode (it lasts past the later start), not a
    stale one; it is held, so a silence and its expiry fire it again."""
    clock = Clock()
    later = alert("Overload", starts=iso(datetime.now(UTC) - timedelta(minutes=2)), instance="a")
    async with cluster(2) as (peers, client):
        engine, _ = make_engine(tmp_path, client, clock)
        peers[0].fire(later)  # the young peer has the later copy
        await deliver(engine, later)
        await engine.drain()
        assert kinds() == ["fire"]
        for p in peers:
            p.fire(FIRING)  # the cluster merged back to the earliest
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire"]
        for p in peers:
            p.silence(FP)
        clock.t += 15
        await converge(engine)
        for p in peers:
            p.expire_silence(FP)
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve", "fire"]
        await engine.shutdown()


async def test_the_earliest_copy_listed_after_a_silence_that_ended_the_later_one_fires_again(tmp_path):
    """Review P (F5): the later copy held, a silence set before the cluster merged back ended it
    (absent), and when the silence expired every peer listed the earliest startsAt: "stale", and
    the alert never fired again. An earlier start that Alertmanager lists active (its endsAt past
    the held start) after the held episode went absent is the alert, back."""
    clock = Clock()
    later = alert("Overload", starts=iso(datetime.now(UTC) - timedelta(minutes=2)), instance="a")
    async with cluster(2) as (peers, client):
        engine, _ = make_engine(tmp_path, client, clock)
        for p in peers:
            p.fire(later)  # every peer lists the restarted replica's later copy for now
        await deliver(engine, later)
        await engine.drain()
        assert kinds() == ["fire"]
        for p in peers:
            p.silence(FP)  # a silence set before the cluster merged back
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve"]
        for p in peers:
            p.expire_silence(FP)
            p.fire(FIRING)  # merged back to the earliest copy; the silence ends
        clock.t += 15
        await converge(engine)
        assert kinds() == ["fire", "resolve", "fire"]
        await engine.shutdown()


async def test_a_second_receiver_named_in_the_configuration_is_reconciled_too(tmp_path, caplog):
    """Review L, F1: alerts routed to a second receiver that posts to this controller
    (promreflex-ops) were resolved by a silence but never fired again after it, and those its
    max_alerts left out were never fired, although the log said the reconciliation acts on them.
    Named in alertmanager_receiver, it is reconciled; not named, the log says so (learning names
    from notifications widened the reconciliation to any sender's `default`: review G)."""
    ops = [alert("Overload", starts=STARTED, instance=str(i)) for i in range(3)]
    body = payload(ops[0])
    body.update(receiver="promreflex-ops", truncatedAlerts=2)

    async def notified(am, engine) -> None:
        am.receivers = ["null", "promreflex", "promreflex-ops"]
        for a in ops:
            am.fire(a, receivers=["promreflex-ops"])
        await engine.handle_payload(WebhookPayload.model_validate(body))
        await engine.drain()
        await converge(engine)

    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path / "unnamed", client)
        await notified(am, engine)
        assert kinds() == ["fire"]  # only the notified one
        assert "receiver 'promreflex-ops', which controller.alertmanager_receiver (promreflex) does not name" in caplog.text
        assert "nothing reconciles them (receiver 'promreflex-ops' is not in" in caplog.text
        await engine.shutdown()
    CALLS.clear()
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path / "named", client, alertmanager_receiver=["promreflex", "promreflex-ops"])
        await notified(am, engine)
        assert kinds() == ["fire"] * 3, "the alerts max_alerts left out were not reconciled"
        am.silence(ops[0]["fingerprint"])
        await converge(engine)
        am.expire_silence(ops[0]["fingerprint"])
        await converge(engine)
        assert kinds() == ["fire"] * 3 + ["resolve", "fire"]
        # an alert routed only to a person's receiver stays out
        am.fire(alert("Other", starts=STARTED, instance="mail"), receivers=["null"])
        await converge(engine)
        assert kinds() == ["fire"] * 3 + ["resolve", "fire"]
        await engine.shutdown()


async def test_a_late_resolve_of_the_previous_episode_does_not_end_the_current_one(tmp_path):
    """Review G, G1: episode T1 resolved and the alert fired again as T2; T2's firing notification
    came before T1's resolve (the other Alertmanager's retry). T1's resolve ended before T2 began:
    stale, T2's action stays."""
    t1 = iso(datetime.now(UTC) - timedelta(minutes=20))
    t2 = iso(datetime.now(UTC) - timedelta(minutes=5))
    first = alert("Overload", starts=t1, instance="a")
    second = alert("Overload", starts=t2, instance="a")
    ended = alert("Overload", status="resolved", starts=t1, instance="a")
    ended["endsAt"] = iso(datetime.now(UTC) - timedelta(minutes=8))
    async with cluster(1) as ((am,), client):
        engine, _ = make_engine(tmp_path, client)
        am.fire(first)
        await deliver(engine, first)
        await engine.drain()
        am.fire(second)
        assert (await deliver(engine, second))["accepted"] == 1
        await engine.drain()
        assert (await deliver(engine, ended))["stale"] == 1
        await engine.drain()
        await converge(engine)
        assert kinds() == ["fire"]
        await engine.shutdown()
