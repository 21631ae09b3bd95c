"""The engine's guarantees: one action per transition whatever is delivered, convergence on
Alertmanager's state, restart from the state file, cooldowns, retries."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from controllers.actions.base import Action, ActionContext, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.config import ControllerConfig, Route
from tests.payloads import FakeAlertmanager, alert, payload

CALLS: list[tuple[str, str, str]] = []


@register
class Recorder(Action):
    """Records transitions; fails while ``failures_left`` > 0; can be slowed down."""

    name = "test-recorder"
    concurrency = 4  # so that serialisation per target is the engine's lock, not the semaphore
    failures_left = 0
    delay = 0.0
    running = 0
    max_running = 0

    def target(self, ctx: ActionContext) -> str:
        return ctx.labels.get("target", super().target(ctx))

    async def _do(self, ctx: ActionContext, what: str) -> str:
        type(self).running += 1
        type(self).max_running = max(type(self).max_running, type(self).running)
        try:
            await asyncio.sleep(self.delay)
            if type(self).failures_left > 0:
                type(self).failures_left -= 1
                raise RuntimeError("injected failure")
            CALLS.append((what, ctx.alert.fingerprint, ctx.labels.get("instance", "")))
            return what
        finally:
            type(self).running -= 1

    async def fire(self, ctx):
        return await self._do(ctx, "fire")

    async def resolve(self, ctx):
        return await self._do(ctx, "resolve")


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()
    Recorder.failures_left, Recorder.delay, Recorder.running, Recorder.max_running = 0, 0.0, 0, 0


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def make_engine(tmp_path, am=None, cooldown=0.0, clock=None):
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.json", alertmanager_url=None,
        routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-recorder", cooldown=cooldown)],
    )
    registry = CollectorRegistry()
    engine = Engine(cfg, ControllerMetrics(registry, ["test-recorder"]), AuditLog(cfg.audit_log),
                    services={"alertmanager": am} if am else {}, **({"clock": clock} if clock else {}))
    return engine, registry


def deliver(engine, *alerts):
    return engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))


FIRING = alert("Overload", instance="a")
RESOLVED = alert("Overload", status="resolved", instance="a")


async def test_duplicates_cause_one_action(tmp_path):
    engine, registry = make_engine(tmp_path)
    for _ in range(25):
        deliver(engine, FIRING)
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS
    assert registry.get_sample_value("promreflex_controller_notifications_total", {"status": "firing", "result": "duplicate"}) == 24
    for _ in range(5):
        deliver(engine, RESOLVED)
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert engine.entries == {}


async def test_a_late_firing_after_resolved_is_stale(tmp_path):
    engine, registry = make_engine(tmp_path)
    deliver(engine, FIRING)
    await engine.drain()
    deliver(engine, RESOLVED)
    await engine.drain()
    late = {**FIRING, "annotations": {"summary": "retried"}}  # same episode, delivered again late
    assert deliver(engine, late)["duplicate"] == 1
    older = alert("Overload", starts="2026-11-23T09:00:00Z", instance="a")
    assert deliver(engine, older)["stale"] == 1
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    # A new episode (later startsAt) fires again.
    deliver(engine, alert("Overload", starts="2026-11-23T11:00:00Z", instance="a"))
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve", "fire"]


async def test_resolved_for_an_alert_never_applied_does_nothing(tmp_path):
    engine, _ = make_engine(tmp_path)
    deliver(engine, RESOLVED)
    await engine.drain()
    assert CALLS == [] and engine.entries == {}


async def test_unmatched_alerts_cause_nothing(tmp_path):
    engine, _ = make_engine(tmp_path)
    deliver(engine, alert("Watchdog"))
    await engine.drain()
    assert CALLS == []


async def test_reconcile_makes_good_a_lost_webhook(tmp_path):
    am = FakeAlertmanager()
    engine, registry = make_engine(tmp_path, am)
    am.active = [FIRING]  # firing in Alertmanager, webhook lost
    await engine.reconcile()
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS
    await engine.reconcile()  # nothing changed: nothing happens
    await engine.drain()
    assert len(CALLS) == 1
    am.active = []  # resolved, resolved webhook lost too
    await engine.reconcile()
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert registry.get_sample_value("promreflex_controller_reconcile_runs_total", {"result": "ok"}) == 3


async def test_restart_resumes_from_the_state_file(tmp_path):
    am = FakeAlertmanager()
    am.active = [FIRING]
    engine, _ = make_engine(tmp_path, am)
    deliver(engine, FIRING)
    await engine.drain()
    await engine.shutdown()
    # A new process: the state file says "applied"; Alertmanager still has it firing.
    engine2, registry2 = make_engine(tmp_path, am)
    assert registry2.get_sample_value("promreflex_controller_applied_alerts", {"action": "test-recorder"}) == 1
    await engine2.reconcile()
    deliver(engine2, FIRING)  # Alertmanager re-sends after the restart
    await engine2.drain()
    assert [c[0] for c in CALLS] == ["fire"]
    # Resolved while the controller was down: the next start resolves it.
    await engine2.shutdown()
    am.active = []
    engine3, _ = make_engine(tmp_path, am)
    await engine3.reconcile()
    await engine3.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert engine3.entries == {}


async def test_fire_is_skipped_when_alertmanager_no_longer_has_the_alert(tmp_path):
    am = FakeAlertmanager()  # active list empty: the alert ended before we got to it
    engine, registry = make_engine(tmp_path, am)
    deliver(engine, FIRING)
    await engine.drain()
    assert CALLS == []
    assert registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "skipped"}) == 1


async def test_unreachable_alertmanager_does_not_block_the_notification(tmp_path):
    am = FakeAlertmanager()
    am.fail = True
    engine, registry = make_engine(tmp_path, am)
    deliver(engine, FIRING)
    await engine.drain()
    assert len(CALLS) == 1
    await engine.reconcile()
    assert registry.get_sample_value("promreflex_controller_reconcile_runs_total", {"result": "error"}) == 1


async def test_cooldown_delays_a_new_fire_but_never_a_resolve(tmp_path):
    am = FakeAlertmanager()
    clock = Clock()
    engine, registry = make_engine(tmp_path, am, cooldown=600, clock=clock)
    first = alert("Overload", instance="a", target="site")
    am.active = [first]
    deliver(engine, first)
    await engine.drain()
    deliver(engine, {**first, "status": "resolved", "endsAt": "2026-11-23T10:01:00Z"})
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]  # resolve not held back
    second = alert("Overload", starts="2026-11-23T10:02:00Z", instance="a", target="site")
    am.active = [second]
    clock.t += 60
    deliver(engine, second)
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "cooldown"}) == 1
    clock.t += 600
    await engine.reconcile()
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve", "fire"]
    await engine.shutdown()


async def test_a_failed_action_is_retried_until_it_succeeds(tmp_path, monkeypatch):
    monkeypatch.setattr("controllers.engine.MAX_RETRY_DELAY", 0.01)
    Recorder.failures_left = 2
    engine, registry = make_engine(tmp_path)
    deliver(engine, FIRING)
    for _ in range(200):
        await engine.drain()
        if CALLS:
            break
        await asyncio.sleep(0.01)
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS
    assert registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "error"}) == 2
    errors = [r for r in read_audit(tmp_path / "audit.jsonl") if r.get("result") == "error"]
    assert len(errors) == 2 and "injected failure" in errors[0]["detail"]


async def test_one_run_at_a_time_per_target(tmp_path):
    Recorder.delay = 0.02
    engine, _ = make_engine(tmp_path)
    deliver(engine, *[alert("Overload", instance=f"i{n}", target="same-copy") for n in range(5)])
    await engine.drain()
    assert len(CALLS) == 5 and Recorder.max_running == 1


async def test_different_targets_run_concurrently_up_to_the_limit(tmp_path):
    Recorder.delay = 0.05
    engine, _ = make_engine(tmp_path)
    deliver(engine, *[alert("Overload", instance=f"i{n}", target=f"copy-{n}") for n in range(8)])
    await engine.drain()
    assert len(CALLS) == 8 and Recorder.max_running == 4


async def test_audit_log_records_notifications_and_decisions(tmp_path):
    engine, _ = make_engine(tmp_path)
    deliver(engine, FIRING, alert("Watchdog"))
    await engine.drain()
    events = [(r["event"], r.get("result")) for r in read_audit(tmp_path / "audit.jsonl")]
    assert events.count(("notification", "accepted")) == 2
    assert ("decision", "ok") in events


async def test_actions_get_their_routes_params_before_start(tmp_path):
    engine, _ = make_engine(tmp_path)
    await engine.start()
    (action,) = engine.actions.values()
    assert [type(p).__name__ for p in action.route_params] == ["NoParams"]
