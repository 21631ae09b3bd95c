"""The engine's guarantees: one action per transition whatever is delivered, convergence on
Alertmanager's state, re-fire after an absence, restart from the state database (dedupe memory
and interrupted runs included), cooldowns, timeouts, bounded retries."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from controllers.actions.base import Action, ActionContext, Deferred, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine, retry_delay
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import AlertmanagerClient
from promreflex.config import ControllerConfig, Route
from promreflex.errors import UserError
from tests.fake_alertmanager import FakeAlertmanagerAPI
from tests.payloads import FakeAlertmanager, alert, payload

CALLS: list[tuple[str, str, str]] = []


@register
class Recorder(Action):
    """Records transitions; fails while ``failures_left`` > 0; can be slowed down."""

    name = "test-recorder"
    concurrency = 4  # so that serialisation per target is the engine's lock, not the semaphore
    failures_left = 0
    defer_left = 0  # runs that answer Deferred (not now: later)
    delay = 0.0
    running = 0
    max_running = 0
    hang: set[str] = set()  # instances whose runs never return

    def target(self, ctx: ActionContext) -> str:
        return ctx.labels.get("target", super().target(ctx))

    async def _do(self, ctx: ActionContext, what: str) -> str:
        type(self).running += 1
        type(self).max_running = max(type(self).max_running, type(self).running)
        try:
            await asyncio.sleep(self.delay)
            if ctx.labels.get("instance") in self.hang:
                await asyncio.Event().wait()
            if type(self).failures_left > 0:
                type(self).failures_left -= 1
                raise RuntimeError("injected failure")
            if type(self).defer_left > 0:
                type(self).defer_left -= 1
                raise Deferred("not in its window", 1.0)
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
    Recorder.defer_left = 0
    Recorder.hang = set()


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def make_engine(tmp_path, am=None, cooldown=0.0, clock=None, **route):
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
        routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-recorder", cooldown=cooldown, **route)],
    )
    registry = CollectorRegistry()
    engine = Engine(cfg, ControllerMetrics(registry, ["test-recorder"]), AuditLog(cfg.audit_log),
                    services={"alertmanager": am} if am else {}, **({"clock": clock} if clock else {}))
    return engine, registry


async def deliver(engine, *alerts):
    return await engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))


# Notifications carry startsAt with sub-millisecond digits; Alertmanager's API keeps milliseconds.
STARTS = "2026-11-23T10:00:00.123456Z"
FIRING = alert("Overload", starts=STARTS, instance="a")
RESOLVED = alert("Overload", status="resolved", starts=STARTS, instance="a")


async def fire_and_resolve(engine):
    for a in (FIRING, RESOLVED):
        await deliver(engine, a)
        await engine.drain()


async def test_duplicates_cause_one_action(tmp_path):
    engine, registry = make_engine(tmp_path)
    for _ in range(25):
        await deliver(engine, FIRING)
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS
    assert registry.get_sample_value("promreflex_controller_notifications_total", {"status": "firing", "result": "duplicate"}) == 24
    for _ in range(5):
        await deliver(engine, RESOLVED)
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert engine.entries == {}


async def test_a_late_firing_after_resolved_is_stale(tmp_path):
    engine, registry = make_engine(tmp_path)
    await fire_and_resolve(engine)
    late = {**FIRING, "annotations": {"summary": "retried"}}  # same episode, delivered again late
    assert (await deliver(engine, late))["duplicate"] == 1
    older = alert("Overload", starts="2026-11-23T09:00:00Z", instance="a")
    assert (await deliver(engine, older))["stale"] == 1
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    # A new episode (later startsAt) fires again.
    await deliver(engine, alert("Overload", starts="2026-11-23T11:00:00Z", instance="a"))
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve", "fire"]


async def test_a_notification_reusing_a_held_fingerprint_with_other_labels_changes_nothing(tmp_path):
    """With the webhook token, a forged notification took over a real alert's fingerprint with
    another label set and a later startsAt: the real resolve became "stale" and the reconcile
    resolved the wrong target (a stranger's review). It is a counted conflict now."""
    engine, registry = make_engine(tmp_path)
    await deliver(engine, FIRING)
    await engine.drain()
    forged = {**alert("Overload", starts="2026-11-23T11:00:00Z", instance="b"), "fingerprint": FIRING["fingerprint"]}
    assert (await deliver(engine, forged))["conflict"] == 1
    # the genuine resolve's own key (fingerprint, status, startsAt), sent first with other labels:
    # not remembered, so the genuine one is no "duplicate"
    forged_resolve = {**alert("Overload", status="resolved", starts=STARTS, instance="b"),
                      "fingerprint": FIRING["fingerprint"]}
    assert (await deliver(engine, forged_resolve))["conflict"] == 1
    assert registry.get_sample_value("promreflex_controller_notifications_total",
                                     {"status": "firing", "result": "conflict"}) == 1
    assert (await deliver(engine, RESOLVED))["accepted"] == 1  # the real one still resolves
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a"), ("resolve", FIRING["fingerprint"], "a")] == CALLS


async def test_resolved_for_an_alert_never_applied_does_nothing(tmp_path):
    engine, _ = make_engine(tmp_path)
    await deliver(engine, RESOLVED)
    await engine.drain()
    assert CALLS == [] and engine.entries == {}


async def test_unmatched_alerts_cause_nothing(tmp_path):
    engine, _ = make_engine(tmp_path)
    await deliver(engine, alert("Watchdog"))
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
    await deliver(engine, FIRING)
    await engine.drain()
    await engine.shutdown()
    # A new process: the state file says "applied"; Alertmanager still has it firing.
    engine2, registry2 = make_engine(tmp_path, am)
    assert registry2.get_sample_value("promreflex_controller_applied_alerts", {"action": "test-recorder"}) == 1
    await engine2.reconcile()
    await deliver(engine2, FIRING)  # Alertmanager re-sends after the restart
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
    await deliver(engine, FIRING)
    await engine.drain()
    assert CALLS == []
    assert registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "skipped"}) == 1


async def test_unreachable_alertmanager_does_not_block_the_notification(tmp_path):
    am = FakeAlertmanager()
    am.fail = True
    engine, registry = make_engine(tmp_path, am)
    await deliver(engine, FIRING)
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
    await deliver(engine, first)
    await engine.drain()
    await deliver(engine, {**first, "status": "resolved", "endsAt": "2026-11-23T10:01:00Z"})
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]  # resolve not held back
    second = alert("Overload", starts="2026-11-23T10:02:00Z", instance="a", target="site")
    am.active = [second]
    clock.t += 60
    await deliver(engine, second)
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve"]
    assert registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "cooldown"}) == 1
    clock.t += 600
    await engine.reconcile()
    await engine.drain()
    assert [c[0] for c in CALLS] == ["fire", "resolve", "fire"]
    await engine.shutdown()


async def test_a_deferred_fire_runs_later_without_a_failure_or_a_cooldown(tmp_path):
    """An action that cannot act now (a tuning outside its window) raises Deferred: recorded
    `deferred`, no failure counted (max_retries 0 would give up on a failure), no cooldown
    started, and the fire runs again after the given time while the alert still fires (the
    repeated notifications of the same episode are duplicates and would not)."""
    Recorder.defer_left = 1
    engine, registry = make_engine(tmp_path, cooldown=600, max_retries=0)
    await deliver(engine, FIRING)
    deadline = time.monotonic() + 10
    while not CALLS:
        assert time.monotonic() < deadline, "the deferred fire never ran again"
        await asyncio.sleep(0.05)
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS
    sample = registry.get_sample_value
    assert sample("promreflex_controller_actions_total", {"action": "test-recorder", "transition": "fire", "result": "deferred"}) == 1
    assert sample("promreflex_controller_actions_total", {"action": "test-recorder", "transition": "fire", "result": "error"}) == 0
    assert sample("promreflex_controller_actions_total", {"action": "test-recorder", "transition": "fire", "result": "ok"}) == 1
    await engine.shutdown()


async def test_a_failed_action_is_retried_until_it_succeeds(tmp_path, monkeypatch):
    monkeypatch.setattr("controllers.engine.MAX_RETRY_DELAY", 0.01)
    Recorder.failures_left = 2
    engine, registry = make_engine(tmp_path)
    await deliver(engine, FIRING)
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
    await deliver(engine, *[alert("Overload", instance=f"i{n}", target="same-copy") for n in range(5)])
    await engine.drain()
    assert len(CALLS) == 5 and Recorder.max_running == 1


async def test_different_targets_run_concurrently_up_to_the_limit(tmp_path):
    Recorder.delay = 0.05
    engine, _ = make_engine(tmp_path)
    await deliver(engine, *[alert("Overload", instance=f"i{n}", target=f"copy-{n}") for n in range(8)])
    await engine.drain()
    assert len(CALLS) == 8 and Recorder.max_running == 4


async def test_audit_log_records_notifications_and_decisions(tmp_path):
    engine, _ = make_engine(tmp_path)
    await deliver(engine, FIRING, alert("Watchdog"))
    await engine.drain()
    events = [(r["event"], r.get("result")) for r in read_audit(tmp_path / "audit.jsonl")]
    assert events.count(("notification", "accepted")) == 2
    assert ("decision", "ok") in events


async def test_actions_get_their_routes_params_before_start(tmp_path):
    engine, _ = make_engine(tmp_path)
    await engine.start()
    (action,) = engine.actions.values()
    assert [type(p).__name__ for p in action.route_params] == ["NoParams"]


# ---------------------------------------------------------------- absence and re-fire
@pytest.fixture
async def am_api():
    """The fake Alertmanager API, read through the real client (its filters included)."""
    api = FakeAlertmanagerAPI()
    async with TestServer(api.app) as server, aiohttp.ClientSession() as session:
        api.client = AlertmanagerClient(str(server.make_url("")), session)
        yield api


async def converge(engine):
    await engine.reconcile()
    await engine.drain()


def kinds():
    return [c[0] for c in CALLS]


@pytest.mark.parametrize("absence", ["silence", "inhibition", "alertmanager restart"])
async def test_an_alert_back_after_an_absence_fires_again(tmp_path, am_api, absence):
    engine, _ = make_engine(tmp_path, am_api.client)
    fp = FIRING["fingerprint"]
    am_api.fire(FIRING)
    await deliver(engine, FIRING)
    await engine.drain()
    assert kinds() == ["fire"]
    if absence == "silence":
        am_api.silence(fp)
    elif absence == "inhibition":
        am_api.fire(alert("Cause"))
        am_api.inhibit(fp, alert("Cause")["fingerprint"])
    else:
        # Restarted longer ago than the grace and Prometheus never re-sent it: it ended (a
        # restart within the grace is no absence: tests/unit/test_engine_peers.py).
        am_api.restart(started=time.time() - 3600)
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    # A late retry of the first firing notification arrives during the absence: the re-check
    # with Alertmanager keeps it from acting.
    await deliver(engine, FIRING)
    await engine.drain()
    assert kinds() == ["fire", "resolve"]
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    # The absence ends; the alert is the same episode (same startsAt): it fires again.
    if absence == "silence":
        am_api.expire_silence(fp)
    elif absence == "inhibition":
        am_api.lift_inhibition(fp)
    else:
        am_api.fire(FIRING)  # Prometheus re-sends it to the restarted Alertmanager
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"]
    await deliver(engine, FIRING)  # Alertmanager's own notification after that changes nothing
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"]
    # A real end (a resolved notification) is final: a late firing of the episode is stale.
    am_api.end(fp)
    await deliver(engine, RESOLVED)
    await converge(engine)
    assert (await deliver(engine, {**FIRING, "annotations": {"retry": "1"}}))["duplicate"] == 1
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire", "resolve"]
    assert engine.entries == {}
    await engine.shutdown()


async def test_a_dependant_still_firing_after_an_incident_is_acted_on_again(tmp_path, am_api):
    """RCA: the root-cause alert inhibits its dependants; when the incident ends, a dependant
    that is still slow (same startsAt) is analysed again."""
    engine, _ = make_engine(tmp_path, am_api.client)
    dependant = alert("Overload", instance="cart")
    root = alert("MeshRootCause", service="db")
    am_api.fire(dependant)
    await deliver(engine, dependant)
    await engine.drain()
    am_api.fire(root)
    am_api.inhibit(dependant["fingerprint"], root["fingerprint"])
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    am_api.end(root["fingerprint"])  # the incident ends, the inhibition with it
    am_api.lift_inhibition(dependant["fingerprint"])
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"]
    await engine.shutdown()


async def test_an_ended_alert_alertmanager_still_lists_is_resolved(tmp_path, am_api):
    engine, _ = make_engine(tmp_path, am_api.client)
    am_api.fire(FIRING)
    await converge(engine)
    am_api.end(FIRING["fingerprint"])  # resolved, not garbage-collected yet: listed as active
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    await engine.shutdown()


# ---------------------------------------------------------------- durability
async def test_dedupe_memory_survives_a_restart(tmp_path):
    engine, _ = make_engine(tmp_path)
    await fire_and_resolve(engine)
    await engine.shutdown()
    engine2, registry2 = make_engine(tmp_path)
    await engine2.start()
    assert (await deliver(engine2, FIRING))["duplicate"] == 1  # a late retry of the resolved episode
    assert (await deliver(engine2, alert("Overload", starts="2026-11-23T09:00:00Z", instance="a")))["stale"] == 1
    await engine2.drain()
    assert kinds() == ["fire", "resolve"]
    await engine2.shutdown()


async def test_a_run_killed_midway_runs_again_at_start_and_a_completed_one_never(tmp_path):
    Recorder.hang = {"a"}
    engine, _ = make_engine(tmp_path)
    await deliver(engine, FIRING)
    for _ in range(500):
        if Recorder.running:
            break
        await asyncio.sleep(0.01)
    assert Recorder.running == 1
    for task in list(engine._tasks):  # the process dies: nothing after this point is written
        task.cancel()
    await asyncio.sleep(0)
    Recorder.hang = set()
    engine2, registry2 = make_engine(tmp_path)
    assert registry2.get_sample_value("promreflex_controller_interrupted_transitions_total") == 1
    await engine2.start()
    await engine2.drain()
    assert kinds() == ["fire"]
    assert [r["transition"] for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "interrupted"] == ["fire"]
    await engine2.shutdown()
    engine3, registry3 = make_engine(tmp_path)
    await engine3.start()
    await engine3.drain()
    assert kinds() == ["fire"]  # completed: never again
    assert registry3.get_sample_value("promreflex_controller_applied_alerts", {"action": "test-recorder"}) == 1
    await engine3.shutdown()


@pytest.mark.parametrize("name", ["state.db", "state.json"])
async def test_an_old_json_state_file_is_imported_once(tmp_path, name):
    from controllers.models import Alert

    old = tmp_path / "state.json"
    old.write_text('{"applied": [{"route": "r", "alert": %s}], "last_fire": {"r\\u0000x": 5.0}}'
                   % Alert.model_validate(FIRING).model_dump_json())
    cfg_path = tmp_path / name
    cfg = ControllerConfig(audit_log=tmp_path / "audit.jsonl", state_file=cfg_path, alertmanager_url=None,
                           routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-recorder")])
    engine = Engine(cfg, ControllerMetrics(CollectorRegistry(), ["test-recorder"]), AuditLog(cfg.audit_log))
    assert [(e.desired, e.applied) for e in engine.entries.values()] == [("firing", "firing")]
    assert (tmp_path / "state.json.migrated").exists() and engine._last_fire == {("r", "x"): 5.0}
    await engine.start()
    await deliver(engine, FIRING)  # already applied before the upgrade: no second fire
    await deliver(engine, RESOLVED)
    await engine.drain()
    assert kinds() == ["resolve"]
    await engine.shutdown()


def test_an_unusable_state_database_is_one_clear_error(tmp_path):
    db = tmp_path / "state.db"
    db.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    with pytest.raises(UserError, match=r"state\.db is unusable \(.*\); fix or move it aside"):
        make_engine(tmp_path)
    db.unlink()
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(UserError, match="another program"):
        make_engine(tmp_path)
    db.unlink()
    db.write_text("{not json")
    with pytest.raises(UserError, match="old JSON state file"):
        make_engine(tmp_path)


# ---------------------------------------------------------------- actions that hang or fail
async def test_a_hung_action_times_out_and_frees_its_target(tmp_path):
    Recorder.hang = {"stuck"}
    engine, registry = make_engine(tmp_path, timeout="100ms", max_retries=0)
    stuck = alert("Overload", instance="stuck", target="site")
    other = alert("Overload", instance="other", target="site")
    await deliver(engine, stuck, other)
    await engine.drain(timeout=10)
    assert [("fire", other["fingerprint"], "other")] == CALLS
    errors = [r["detail"] for r in read_audit(tmp_path / "audit.jsonl") if r.get("result") == "error"]
    assert errors == ["timed out after 0.1s (cancelled); gave up after 1 runs"]
    assert registry.get_sample_value("promreflex_controller_transitions_failing",
                                     {"route": "r", "action": "test-recorder"}) == 1


async def test_failures_are_retried_a_bounded_number_of_times_then_wait_for_new_input(tmp_path, monkeypatch):
    monkeypatch.setattr("controllers.engine.MAX_RETRY_DELAY", 0.01)
    Recorder.failures_left = 100
    am = FakeAlertmanager()
    am.active = [FIRING]
    engine, registry = make_engine(tmp_path, am, max_retries=3)

    def failing():
        return registry.get_sample_value("promreflex_controller_transitions_failing", {"route": "r", "action": "test-recorder"})

    def errors():
        return registry.get_sample_value("promreflex_controller_actions_total",
                                         {"action": "test-recorder", "transition": "fire", "result": "error"})

    await deliver(engine, FIRING)
    for _ in range(500):
        await engine.drain()
        if failing():
            break
        await asyncio.sleep(0.01)
    assert failing() == 1 and errors() == 4  # the first run and 3 retries
    await asyncio.sleep(0.1)
    await converge(engine)  # a reconcile that finds nothing new does not retry
    assert errors() == 4 and CALLS == []
    Recorder.failures_left = 0
    later = alert("Overload", starts="2026-11-23T11:00:00Z", instance="a")  # new input: a new episode
    am.active = [later]
    await deliver(engine, later)
    await engine.drain()
    assert [("fire", FIRING["fingerprint"], "a")] == CALLS and failing() == 0


async def test_a_failed_fire_starts_the_cooldown(tmp_path, monkeypatch):
    monkeypatch.setattr("controllers.engine.MAX_RETRY_DELAY", 0.01)
    Recorder.failures_left = 1
    clock = Clock()
    engine, registry = make_engine(tmp_path, cooldown=600, clock=clock)
    await deliver(engine, FIRING)
    for _ in range(500):
        await engine.drain()
        if registry.get_sample_value("promreflex_controller_actions_total",
                                     {"action": "test-recorder", "transition": "fire", "result": "cooldown"}):
            break
        await asyncio.sleep(0.01)
    assert CALLS == []  # the retry waits for the cooldown the failed run started
    clock.t += 601
    engine.kick(("r", FIRING["fingerprint"]))
    await engine.drain()
    assert kinds() == ["fire"]
    await engine.shutdown()


def test_retry_delays_grow_exponentially_with_full_jitter():
    assert [retry_delay(n, rng=lambda lo, hi: hi) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert all(0 <= retry_delay(n) <= min(60, 2 ** (n - 1)) for n in range(1, 12) for _ in range(50))


async def test_a_burst_of_fires_shares_its_rechecks_with_alertmanager(tmp_path):
    am = FakeAlertmanager()
    burst = [alert("Overload", instance=f"i{n}") for n in range(200)]
    am.active = burst
    engine, _ = make_engine(tmp_path, am)
    await deliver(engine, *burst)
    await engine.drain()
    assert len(CALLS) == 200
    assert am.calls < 20  # each re-check still starts after its fire was decided


async def test_a_host_agent_acts_only_on_its_own_targets(tmp_path, monkeypatch):
    """``controller.owner``: one configuration for every host of a fleet, each agent's routes see
    only alerts whose owner label is its own host (read from the environment at start)."""
    from promreflex.config import Owner

    monkeypatch.setenv("PROMREFLEX_TEST_NODE", "shop-2")
    owner = Owner(label="instance", value_from_env="PROMREFLEX_TEST_NODE")
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None, owner=owner,
        routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-recorder")],
    )
    engine = Engine(cfg, ControllerMetrics(CollectorRegistry(), ["test-recorder"]), AuditLog(cfg.audit_log), services={})
    for host in ("shop-1", "shop-2", "shop-3"):
        await deliver(engine, alert("Overload", starts=STARTS, instance=host))
    await deliver(engine, alert("Overload", starts=STARTS))  # no instance label: not a host's alert
    await engine.drain()
    assert [(c[0], c[2]) for c in CALLS] == [("fire", "shop-2")]


def test_an_owner_needs_one_value_that_is_set(monkeypatch):
    from pydantic import ValidationError

    from promreflex.config import Owner

    monkeypatch.delenv("PROMREFLEX_TEST_NODE", raising=False)
    with pytest.raises(ValidationError, match="PROMREFLEX_TEST_NODE is not set"):
        Owner(label="instance", value_from_env="PROMREFLEX_TEST_NODE")
    with pytest.raises(ValidationError, match="exactly one"):
        Owner(label="instance")
    with pytest.raises(ValidationError, match="exactly one"):
        Owner(label="instance", value="a", value_from_env="HOME")
    assert Owner(label="node", value="n1").resolved() == "n1"


async def test_an_episode_alertmanager_lists_again_after_its_resolve_fires_again(tmp_path, am_api):
    """Alertmanager resolves an alert whose re-sends from Prometheus stopped for longer than its
    endsAt (a partition, a stalled evaluation); when they come back with the same startsAt it
    stores a new alert and notifies 'firing' again. That notification is a duplicate of the
    first (a stranger's review: the action stayed resolved for the hour of the dedupe window);
    the reconciliation's listing says it is active, and the action fires again."""
    clock = Clock()
    engine, _ = make_engine(tmp_path, am_api.client, clock=clock)
    fp = FIRING["fingerprint"]
    am_api.fire(FIRING)
    await deliver(engine, FIRING)
    await engine.drain()
    am_api.end(fp)
    await deliver(engine, RESOLVED)
    await engine.drain()
    assert kinds() == ["fire", "resolve"]
    am_api.gc()
    clock.t += 1.0
    await converge(engine)  # not listed: nothing to do
    assert kinds() == ["fire", "resolve"]
    am_api.fire(FIRING)  # Prometheus's re-sends are back: the same startsAt
    # A listing asked within REOPEN_AFTER of the resolve is not trusted yet (an Alertmanager
    # cluster's other member may resolve a moment later); the webhook's firing is a duplicate.
    assert (await deliver(engine, FIRING))["duplicate"] == 1
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    clock.t += 10.0
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"]
    await deliver(engine, FIRING)  # Alertmanager's own notification of it changes nothing more
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"]
    am_api.end(fp)  # and its resolve ends it
    await deliver(engine, RESOLVED)
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire", "resolve"]
    await engine.shutdown()


async def test_a_grafana_alert_is_neither_rechecked_nor_resolved_for_its_absence_in_alertmanager(tmp_path, am_api):
    """Grafana's webhook contact point (version 1) sends alerts no Alertmanager lists: with
    alertmanager_url set (the default) the pre-fire re-check skipped them and the reconciliation
    resolved them (a stranger's review of the change that took version 1)."""
    engine, _ = make_engine(tmp_path, am_api.client)
    body = {**payload(FIRING), "version": "1"}
    p = WebhookPayload.model_validate(body)
    assert p.alerts[0].source == "grafana"
    await engine.handle_payload(p)
    await converge(engine)
    await converge(engine)
    assert kinds() == ["fire"]
    await engine.handle_payload(WebhookPayload.model_validate({**payload(RESOLVED), "version": "1"}))
    await converge(engine)
    assert kinds() == ["fire", "resolve"]
    # The version decides, not the sender: a version 4 alert claiming Grafana is Alertmanager's.
    forged = WebhookPayload.model_validate(payload({**FIRING, "source": "grafana"}))
    assert forged.alerts[0].source == "alertmanager"
    await engine.shutdown()


async def test_a_notification_whose_commit_failed_is_taken_again(tmp_path, monkeypatch):
    """A full disk at the commit answers 500 (Alertmanager retries); the retry was a 'duplicate'."""
    engine, _ = make_engine(tmp_path)
    commit, calls = engine.store.commit, []

    async def fail_once():
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        await commit()

    monkeypatch.setattr(engine.store, "commit", fail_once)
    with pytest.raises(OSError):
        await deliver(engine, FIRING)
    assert (await deliver(engine, FIRING))["accepted"] == 1
    await engine.drain()
    assert kinds() == ["fire"]
    await engine.shutdown()


R1 = "2026-11-23T10:00:00Z"  # replica 1's startsAt (the earliest: what Alertmanager keeps after the merge)
R2 = "2026-11-23T10:00:10Z"  # replica 2's startsAt (notified first, group_wait 0s)


async def test_ha_merged_resolve_then_alertmanager_lists_it_again(tmp_path, am_api):
    """A stranger's review of 065b0d5. R1 resolves at 10:00:20 while R2 still fires: Alertmanager's merge resolves the alert
    (endsAt 10:00:20), notifies resolved (startsAt R1), then R2's re-send overlaps and is merged
    into the same alert: active again, startsAt R1. The single-replica version of this is
    test_an_episode_alertmanager_lists_again_after_its_resolve_fires_again (fires again)."""
    clock = Clock()
    engine, _ = make_engine(tmp_path, am_api.client, clock=clock)
    r2 = alert("Overload", starts=R2, instance="a")
    fp = r2["fingerprint"]
    am_api.fire(r2)
    await deliver(engine, r2)
    await engine.drain()
    assert kinds() == ["fire"]
    merged_resolve = alert("Overload", status="resolved", starts=R1, ends="2026-11-23T10:00:20Z", instance="a")
    am_api.end(fp)
    await deliver(engine, merged_resolve)
    await engine.drain()
    assert kinds() == ["fire", "resolve"]  # the change under review: the resolve ends it
    am_api.gc()
    clock.t += 1.0
    await converge(engine)
    r1_active = alert("Overload", starts=R1, instance="a")
    am_api.fire(r1_active)  # R2's re-send merged: active again, with the earliest startsAt
    await deliver(engine, r1_active)
    clock.t += 10.0
    await converge(engine)
    clock.t += 60.0
    await converge(engine)
    assert kinds() == ["fire", "resolve", "fire"], f"Alertmanager lists it active, the action stays resolved: {kinds()}"
    await engine.shutdown()
