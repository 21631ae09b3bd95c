"""The copy guard's recovery against an Alertmanager cluster whose peers restart too.

After a controller restart the guard resumes every copy and keeps the previous holders as
unconfirmed; it holds again only for those Alertmanager still has. It asked ONE peer (the one
reads stick to). A peer that has just restarted lists nothing until Prometheus re-sends (its
resend delay, 1 m by default, plus an evaluation), so when a host rebooted (the controller and
its Alertmanager peer restart together), or any young or lagging peer answered first, every
holder was dropped within a tick: the overloaded shop's copies ran unguarded, and the engine,
which still had the alert applied, never fired it again until the alert ended and came back.

Now the guard asks the engine's judgement (``services["alertmanager_presence"]``, the rule the
reconciliation resolves by): a holder is confirmed when any peer lists it, dropped when a peer
that can be believed omits it (running past ``alertmanager_restart_grace``, or it listed the
alert since it started, or it started before the episode), and kept, unconfirmed and holding
nothing, otherwise (the grace bounds the wait).

The controller is the real engine with the copy-guard route; each Alertmanager peer is the fake
of ``tests/fake_alertmanager.py`` behind the real client (its ``cluster``, as test_engine_peers);
copies are the ``FakeCopies`` of test_copy_guard_action."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers.audit import AuditLog
from controllers.copy_guard.action import CopyGuardAction
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import iso
from promreflex.config import ControllerConfig, Route
from tests.payloads import alert, payload
from tests.fake_alertmanager import cluster
from tests.unit.test_copy_guard_action import FakeCopies, confirm_at_every_tick, copies, reg  # noqa: F401 - fixtures

GRACE = 120.0  # controller.alertmanager_restart_grace
OVERLOAD = alert("CopyGuardSiteOverloaded", starts=iso(datetime.now(UTC) - timedelta(minutes=10)), site="shop")
FP = OVERLOAD["fingerprint"]
SHOP = {"c1", "c2"}  # the reg fixture's copies of site shop


class Clock:
    """The controller's clock, moved by the test (the peers' start times are compared with it)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def make_engine(tmp_path, reg, client: Any, clock: Clock, mode: str = "pause") -> Engine:  # noqa: F811 - the fixture's value
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
        alertmanager_restart_grace=GRACE,
        routes=[Route(name="copy-guard", matchers=['alertname="CopyGuardSiteOverloaded"'], action="copy-guard",
                      params={"registry_dir": str(reg.dir), "mode": mode, "watchdog": False})],
    )
    return Engine(cfg, ControllerMetrics(CollectorRegistry(), ["copy-guard"]), AuditLog(cfg.audit_log),
                  services={"alertmanager": client, "registry": CollectorRegistry()}, clock=clock)


SUPERVISE = CopyGuardAction._supervise


@pytest.fixture(autouse=True)
def _ticks_by_the_test(monkeypatch):
    """The guard's supervisor does nothing: each test runs the supervisor's ticks itself."""

    async def idle(self: CopyGuardAction) -> None:
        return None

    monkeypatch.setattr(CopyGuardAction, "_supervise", idle)


async def boot(engine: Engine) -> CopyGuardAction:
    """Start the controller (the guard recovers what the state file says it held)."""
    await engine.start()
    guard = engine.actions["copy-guard"]
    assert isinstance(guard, CopyGuardAction)
    return guard


def crash(engine: Engine) -> None:
    """The host loses power: no shutdown code runs (the guard's state file says what it held)."""
    engine._closing = True
    engine.store.close()


async def controller_with_the_alert_applied(tmp_path, reg, client: Any, clock: Clock,  # noqa: F811
                                            copies: FakeCopies, overload: dict = OVERLOAD) -> None:  # noqa: F811
    """A controller that paused the shop's copies for ``overload``, then crashed."""
    engine = make_engine(tmp_path, reg, client, clock)
    await boot(engine)
    await engine.handle_payload(WebhookPayload.model_validate(payload(overload)))
    await engine.drain()
    assert copies.paused() == SHOP
    crash(engine)


async def rebooted_with_the_only_peer(tmp_path, reg, am: Any, client: Any, clock: Clock,  # noqa: F811
                                     copies: FakeCopies) -> tuple[Engine, CopyGuardAction]:  # noqa: F811
    """The controller applied OVERLOAD; its host reboots with the only Alertmanager (back
    empty, until Prometheus re-sends): the controller started again."""
    am.fire(OVERLOAD)
    await controller_with_the_alert_applied(tmp_path, reg, client, clock, copies)
    am.restart(started=clock.t)
    engine = make_engine(tmp_path, reg, client, clock)
    return engine, await boot(engine)


def holder(guard: CopyGuardAction) -> dict[str, Any] | None:
    ep = guard.episodes.get("shop")
    return ep.holders.get(FP) if ep is not None else None


async def test_a_host_reboot_is_confirmed_by_the_other_peer(copies, reg, tmp_path):  # noqa: F811
    """The controller and the Alertmanager peer of its host restart together; the other host's
    peer still lists the alert. The restarted peer is the one reads stick to: it answered
    "nothing active" and the guard dropped the holder, leaving the copies unguarded for the
    rest of the incident (the engine does not fire an alert it has applied)."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        for p in peers:
            p.fire(OVERLOAD)
        await controller_with_the_alert_applied(tmp_path, reg, client, clock, copies)
        peers[0].restart(started=clock.t)  # back with the host: empty until Prometheus re-sends
        engine = make_engine(tmp_path, reg, client, clock)
        guard = await boot(engine)
        assert copies.paused() == set()  # recovery resumed everything first
        await guard.tick()
        assert holder(guard) is not None, "the restarted peer's empty listing dropped the holder"
        assert holder(guard)["confirmed"] and copies.paused() == SHOP
        await engine.reconcile()
        await engine.drain()
        assert copies.paused() == SHOP
        await engine.shutdown()


async def test_a_lagging_first_peer_does_not_drop_a_holder_another_peer_lists(copies, reg, tmp_path):  # noqa: F811
    """The peer reads stick to has not received the alert (Prometheus's post to it failed, or
    it is behind); another peer has it: confirmed."""
    clock = Clock()
    async with cluster(3) as (peers, client):
        for p in peers:
            p.fire(OVERLOAD)
        await controller_with_the_alert_applied(tmp_path, reg, client, clock, copies)
        peers[0].end(FP)  # as if it never got the latest re-send: its copy expired
        peers[0].gc()
        engine = make_engine(tmp_path, reg, client, clock)
        guard = await boot(engine)
        await guard.tick()
        assert holder(guard) is not None and holder(guard)["confirmed"]
        assert copies.paused() == SHOP
        await engine.shutdown()


async def every_peer_restarted(peers: Any, client: Any, tmp_path: Any, registry: Any, clock: Clock,
                               fake_copies: Any) -> tuple[Engine, CopyGuardAction]:
    """The alert applied by a controller, then every peer and the controller restarted: the
    new engine and its guard, booted, its holder unconfirmed."""
    for p in peers:
        p.fire(OVERLOAD)
    await controller_with_the_alert_applied(tmp_path, registry, client, clock, fake_copies)
    for p in peers:
        p.restart(started=clock.t)
    engine = make_engine(tmp_path, registry, client, clock)
    return engine, await boot(engine)


async def test_a_holder_is_kept_unconfirmed_while_only_young_peers_answer(copies, reg, tmp_path):  # noqa: F811
    """Every peer restarted (a whole cluster, or both hosts): none has been re-sent the alert
    yet. No proof either way: the holder stays, unconfirmed, and holds nothing; when Prometheus
    re-sends, it is confirmed and the copies are paused again."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        engine, guard = await every_peer_restarted(peers, client, tmp_path, reg, clock, copies)
        for _ in range(6):  # 60 s of ticks (and reconciliations) inside the grace
            clock.t += 10
            await guard.tick()
            assert holder(guard) is not None, "a young peer's empty listing dropped the holder"
            assert not holder(guard)["confirmed"] and copies.paused() == set()
            summary = await engine.reconcile()
            assert summary.get("absence_deferred") == 1  # the engine defers it by the same rule
        peers[1].fire(OVERLOAD)  # Prometheus re-sends
        await guard.tick()
        assert holder(guard)["confirmed"] and copies.paused() == SHOP
        await engine.shutdown()


async def test_unconfirmed_holders_are_asked_about_once_a_second_not_at_every_tick(copies, reg, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    """The tick holds the action's lock while it reads every peer: at every 0.2 s tick, a hung
    peer would delay every site's fire and resolve by its timeout for the whole grace."""
    import controllers.copy_guard.action as action_mod

    clock = Clock()
    async with cluster(2) as (peers, client):
        engine, guard = await every_peer_restarted(peers, client, tmp_path, reg, clock, copies)
        monkeypatch.setattr(action_mod, "CONFIRM_EVERY", 3600.0)
        asked = []
        presence = guard.services[action_mod.PRESENCE]

        async def counted(*args: Any, **kw: Any) -> Any:
            asked.append(1)
            return await presence(*args, **kw)

        guard.services[action_mod.PRESENCE] = counted
        for _ in range(5):
            await guard.tick()
        assert len(asked) == 1 and not holder(guard)["confirmed"]
        await engine.shutdown()


async def test_the_supervisor_asks_about_unconfirmed_holders_without_the_lock(copies, reg, tmp_path):  # noqa: F811
    """Every peer read happens before the supervisor takes the action's lock: a peer that hangs
    (up to the client's timeout) delays no site's fire or resolve."""
    import asyncio

    import controllers.copy_guard.action as action_mod

    clock = Clock()
    async with cluster(2) as (peers, client):
        engine, guard = await every_peer_restarted(peers, client, tmp_path, reg, clock, copies)
        locked_when_asked: list[bool] = []
        presence = guard.services[action_mod.PRESENCE]

        async def slow(*args: Any, **kw: Any) -> Any:
            locked_when_asked.append(guard.lock.locked())
            await asyncio.sleep(0.2)
            return await presence(*args, **kw)

        guard.services[action_mod.PRESENCE] = slow
        task = asyncio.create_task(SUPERVISE(guard))  # the real one (the fixture idles the guard's own)
        try:
            deadline = time.monotonic() + 10
            while len(locked_when_asked) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert locked_when_asked and not any(locked_when_asked)
        await engine.shutdown()


async def test_a_settled_peer_that_omits_the_alert_drops_the_holder(copies, reg, tmp_path):  # noqa: F811
    """The alert ended while the host rebooted (its resolved notification lost). The host's
    own peer is young and empty, the other one is down: kept. When the other peer answers
    again (running for long) without the alert, the holder is dropped, nothing was paused."""
    clock = Clock()
    async with cluster(2) as (peers, client):
        for p in peers:
            p.fire(OVERLOAD)
        await controller_with_the_alert_applied(tmp_path, reg, client, clock, copies)
        peers[0].restart(started=clock.t)
        peers[1].end(FP)
        peers[1].gc()
        peers[1].fail = True
        engine = make_engine(tmp_path, reg, client, clock)
        guard = await boot(engine)
        for _ in range(3):
            clock.t += 10
            await guard.tick()
            assert holder(guard) is not None, "a young peer's empty listing dropped the holder"
            assert copies.paused() == set()
        peers[1].fail = False
        await guard.tick()
        assert "shop" not in guard.episodes and copies.paused() == set()
        await engine.reconcile()  # the engine resolves it by the same rule
        await engine.drain()
        assert engine.entries == {}
        await engine.shutdown()


async def test_the_grace_bounds_the_wait(copies, reg, tmp_path):  # noqa: F811
    """The only peer restarted with the host and the alert ended meanwhile: once that peer has
    run for the grace, its empty listing is believed and the holder dropped."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, guard = await rebooted_with_the_only_peer(tmp_path, reg, am, client, clock, copies)
        clock.t += GRACE - 1
        await guard.tick()
        assert holder(guard) is not None and copies.paused() == set()
        clock.t += 1
        await guard.tick()
        assert "shop" not in guard.episodes and copies.paused() == set()
        await engine.shutdown()


async def test_a_young_peer_that_listed_the_alert_since_it_started_proves_its_end(copies, reg, tmp_path):  # noqa: F811
    """A young peer's listing is remembered (by whichever read saw it: here the engine's
    reconciliation, between two of the guard's ticks): when it no longer lists the alert, the
    alert ended, and the holder goes at once, without waiting out the grace."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        engine, guard = await rebooted_with_the_only_peer(tmp_path, reg, am, client, clock, copies)
        clock.t += 5
        await guard.tick()
        assert holder(guard) is not None, "a young peer's empty listing dropped the holder"
        am.fire(OVERLOAD)  # re-sent ...
        await engine.reconcile()  # ... and seen by the reconciliation
        am.end(FP)  # then it ends before the guard's next tick
        am.gc()
        clock.t += 1
        await guard.tick()
        assert "shop" not in guard.episodes and copies.paused() == set()
        await engine.shutdown()


async def test_a_young_peer_that_was_up_when_the_episode_began_proves_its_end(copies, reg, tmp_path):  # noqa: F811
    """The holder keeps its episode's ``startsAt`` in the state file: a peer that started
    before the episode was sent the alert then, so its silence is believed at once even within
    the grace (the engine's third witness). (Also true of the old one-peer read; a state file
    without ``startsAt`` waits for the grace instead.)"""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        am.restart(started=clock.t - 20)
        later = alert("CopyGuardSiteOverloaded", starts=iso(datetime.fromtimestamp(clock.t - 10, UTC)), site="shop")
        am.fire(later)
        await controller_with_the_alert_applied(tmp_path, reg, client, clock, copies, later)
        am.end(later["fingerprint"])  # it ends while the controller is down
        am.gc()
        engine = make_engine(tmp_path, reg, client, clock)
        guard = await boot(engine)
        await guard.tick()
        assert "shop" not in guard.episodes and copies.paused() == set()
        await engine.shutdown()


async def test_an_adaptive_episode_whose_alert_ended_while_down_ends_at_recovery(copies, reg, tmp_path):  # noqa: F811
    """The adaptive throttle held the shop's copies at a low share; the controller was killed,
    the alert ended meanwhile. At restart the copies are released (they run free); when a
    settled peer says the alert is gone, the holder is let go and the episode ends. Before, the
    throttle stepped up from its saved share and pushed the free copies back down to 20 %, one
    step per decision back to 100 % (a review: about 9 minutes at 15 s scrapes)."""
    clock = Clock()
    async with cluster(1) as ((am,), client):
        am.fire(OVERLOAD)
        engine = make_engine(tmp_path, reg, client, clock, mode="adaptive")
        guard = await boot(engine)
        await engine.handle_payload(WebhookPayload.model_validate(payload(OVERLOAD)))
        await engine.drain()
        for _ in range(5):
            clock.t += 1
            await guard.tick()
        assert guard.episodes["shop"].throttle is not None
        crash(engine)
        am.end(FP)
        am.gc()
        engine = make_engine(tmp_path, reg, client, clock, mode="adaptive")
        guard = await boot(engine)
        copies.shares.clear()
        for _ in range(5):
            clock.t += 1
            await guard.tick()
        assert "shop" not in guard.episodes
        assert all(share == 1.0 for share in copies.shares.values()), copies.shares
        await engine.shutdown()
