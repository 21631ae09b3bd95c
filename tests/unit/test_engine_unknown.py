"""A run that may have done part of its work leaves the applied state *unknown* (a stranger's
review, H1 and H2): a SIGKILL during ``fire`` or ``resolve``, a run that timed out or raised. The
engine used to assume such a run had done nothing, and the wrong side won when the desired state
changed meanwhile: a fire's effect was never undone (the alert ended, the entry was forgotten as
"no longer wanted" or "skipped: no longer active"), or a new episode's fire never ran after an
interrupted resolve (reported "applied" while the effect was gone). Now whatever is desired runs.

The action here does its effect first (a marker in ``EFFECTS``), then hangs or fails when told:
what the review's throwaway ``marker`` action did on the real controller."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from controllers.actions.base import Action, ActionContext, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import AlertmanagerClient
from promreflex.config import ControllerConfig, Route
from tests.fake_alertmanager import FakeAlertmanagerAPI
from tests.payloads import alert, payload

EFFECTS: set[tuple[str, str]] = set()
CALLS: list[str] = []


@register
class EffectFirst(Action):
    """Applies its effect, then hangs or raises when the alert's instance is listed."""

    name = "test-effect-first"
    concurrency = 4
    hang_fire: set[str] = set()
    hang_resolve: set[str] = set()
    fail_fire: set[str] = set()

    async def fire(self, ctx: ActionContext) -> str:
        CALLS.append("fire")
        EFFECTS.add((ctx.route, ctx.alert.fingerprint))
        if ctx.labels.get("instance") in self.hang_fire:
            await asyncio.Event().wait()
        if ctx.labels.get("instance") in self.fail_fire:
            raise RuntimeError("failed after its effect")
        return "applied"

    async def resolve(self, ctx: ActionContext) -> str:
        CALLS.append("resolve")
        EFFECTS.discard((ctx.route, ctx.alert.fingerprint))
        if ctx.labels.get("instance") in self.hang_resolve:
            await asyncio.Event().wait()
        return "removed"


@pytest.fixture(autouse=True)
def _reset():
    EFFECTS.clear()
    CALLS.clear()
    EffectFirst.hang_fire, EffectFirst.hang_resolve, EffectFirst.fail_fire = set(), set(), set()


def make_engine(tmp_path, am: Any = None, **route: Any) -> tuple[Engine, CollectorRegistry]:
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
        routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-effect-first", **route)],
    )
    registry = CollectorRegistry()
    engine = Engine(cfg, ControllerMetrics(registry, ["test-effect-first"]), AuditLog(cfg.audit_log),
                    services={"alertmanager": am} if am is not None else {})
    return engine, registry


async def deliver(engine: Engine, *alerts: dict[str, Any]) -> dict[str, int]:
    return await engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))


async def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def sigkill(engine: Engine) -> None:
    """The process dies: its running transitions stop where they are, nothing more is written."""
    for task in list(engine._tasks):
        task.cancel()
    await asyncio.sleep(0)


@pytest.fixture
async def am_api():
    api = FakeAlertmanagerAPI()
    async with TestServer(api.app) as server, aiohttp.ClientSession() as session:
        api.client = AlertmanagerClient(str(server.make_url("")), session)
        yield api


STARTS = "2026-11-23T10:00:00.123456Z"
FIRING = alert("Overload", starts=STARTS, instance="a")
RESOLVED = alert("Overload", status="resolved", starts=STARTS, instance="a")
FP = FIRING["fingerprint"]


@pytest.mark.parametrize("ends", ["reconciliation", "resolved notification"])
async def test_a_fire_killed_after_its_effect_is_undone_when_the_alert_ended_meanwhile(tmp_path, am_api, ends):
    """Review H1 (a): SIGKILL during fire (the effect in place), the alert ends while the
    controller is down. The start found "interrupted", re-checked, skipped the fire as "no longer
    active" and forgot the entry: the effect stayed forever. Now the entry's applied state is
    unknown and the end of the alert runs resolve."""
    EffectFirst.hang_fire = {"a"}
    am_api.fire(FIRING)
    engine, _ = make_engine(tmp_path, am_api.client)
    await deliver(engine, FIRING)
    await until(lambda: EFFECTS, "the fire's effect")
    await sigkill(engine)
    EffectFirst.hang_fire = set()
    am_api.end(FP)  # the incident ends while the controller is down
    am_api.gc()

    engine2, registry2 = make_engine(tmp_path, am_api.client)
    loaded = [(e["desired"], e["applied"]) for e in engine2.snapshot()]
    await engine2.start()
    if ends == "reconciliation":
        await engine2.reconcile()
    else:
        await deliver(engine2, RESOLVED)
    await engine2.drain()
    assert set() == EFFECTS, "the interrupted fire's effect was left applied"
    assert CALLS[-1] == "resolve" and engine2.entries == {}
    assert loaded == [("firing", "unknown")]  # neither applied nor not: whatever is desired runs
    assert registry2.get_sample_value("promreflex_controller_applied_alerts", {"action": "test-effect-first"}) == 0
    interrupted = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "interrupted"]
    assert [(r["transition"], r["applied"]) for r in interrupted] == [("fire", "unknown")]
    await engine2.shutdown()

    engine3, _ = make_engine(tmp_path, am_api.client)  # completed: never again
    await engine3.start()
    await engine3.reconcile()
    await engine3.drain()
    assert CALLS.count("resolve") == 1 and engine3.entries == {}
    await engine3.shutdown()


async def test_a_resolve_killed_midway_then_a_new_episode_fires(tmp_path):
    """Review H1 (b): SIGKILL during resolve (the effect removed), a new episode starts while the
    controller is down. The start took the resolve as not run (applied: firing), the new episode
    made the desired state firing too: no fire for the whole episode, the state API saying
    "applied". Now the new episode's fire runs."""
    engine, _ = make_engine(tmp_path)
    await deliver(engine, FIRING)
    await engine.drain()
    EffectFirst.hang_resolve = {"a"}
    await deliver(engine, RESOLVED)
    await until(lambda: not EFFECTS, "the resolve's effect")
    await sigkill(engine)
    EffectFirst.hang_resolve = set()

    engine2, _ = make_engine(tmp_path)
    await engine2.start()
    later = alert("Overload", starts="2026-11-23T11:00:00Z", instance="a")  # the next episode
    assert (await deliver(engine2, later))["accepted"] == 1
    await engine2.drain()
    assert {("r", FP)} == EFFECTS, "the new episode's fire never ran"
    assert [(e["desired"], e["applied"]) for e in engine2.snapshot()] == [("firing", "firing")]
    await engine2.shutdown()


@pytest.mark.parametrize("how", ["timed out", "raised"])
async def test_a_failed_fire_that_did_part_of_its_work_is_resolved_when_the_alert_ends(tmp_path, am_api, how):
    """Review H2: a fire that timed out (or raised) after its effect, given up; the alert ends
    (the reconciliation sees it leave): the effect stayed ("resolved_missing": 1, nothing ran)."""
    if how == "timed out":
        EffectFirst.hang_fire = {"a"}
    else:
        EffectFirst.fail_fire = {"a"}
    am_api.fire(FIRING)
    engine, registry = make_engine(tmp_path, am_api.client, timeout="200ms", max_retries=0)
    await deliver(engine, FIRING)
    await engine.drain()
    assert {("r", FP)} == EFFECTS
    assert registry.get_sample_value("promreflex_controller_transitions_failing",
                                     {"route": "r", "action": "test-effect-first"}) == 1
    after_failure = [e["applied"] for e in engine.snapshot()]
    am_api.end(FP)
    am_api.gc()
    await engine.reconcile()
    await engine.drain()
    assert set() == EFFECTS, "the failed fire's effect was left applied"
    assert CALLS == ["fire", "resolve"] and engine.entries == {}
    assert after_failure == ["unknown"]
    assert registry.get_sample_value("promreflex_controller_transitions_failing",
                                     {"route": "r", "action": "test-effect-first"}) == 0
    await engine.shutdown()


async def test_an_alert_that_ends_during_a_failing_fire_is_resolved(tmp_path):
    """The alert ended while the fire ran and then timed out: "no longer wanted" forgot the entry
    (the effect stayed). Now the resolve runs at once."""
    EffectFirst.hang_fire = {"a"}
    engine, _ = make_engine(tmp_path, timeout="500ms", max_retries=3)
    await deliver(engine, FIRING)
    await until(lambda: EFFECTS, "the fire's effect")
    await deliver(engine, RESOLVED)  # during the run
    await engine.drain()
    assert CALLS == ["fire", "resolve"] and set() == EFFECTS and engine.entries == {}
    details = [r["detail"] for r in read_audit(tmp_path / "audit.jsonl") if r.get("result") == "error"]
    assert details == ["timed out after 0.5s (cancelled); the alert is resolved now: resolve runs"]
    await engine.shutdown()


async def test_a_fire_retried_after_a_failure_still_runs_once_it_succeeds(tmp_path, monkeypatch):
    """Unknown after a failure, the retry of the same transition runs (at least once), and once
    it completed the entry is applied: nothing runs again."""
    monkeypatch.setattr("controllers.engine.MAX_RETRY_DELAY", 0.01)
    EffectFirst.fail_fire = {"a"}
    engine, registry = make_engine(tmp_path, max_retries=5)
    await deliver(engine, FIRING)
    await until(lambda: len(CALLS) >= 2, "a retry")
    EffectFirst.fail_fire = set()
    await until(lambda: [e["applied"] for e in engine.snapshot()] == ["firing"], "the fire applied")
    await engine.drain()
    runs = len(CALLS)
    await deliver(engine, FIRING)  # a duplicate
    await engine.drain()
    assert len(CALLS) == runs and set(CALLS) == {"fire"}
    assert registry.get_sample_value("promreflex_controller_applied_alerts", {"action": "test-effect-first"}) == 1
    await engine.shutdown()
