"""Sender data the engine must not trust (a stranger's review, L1 and L3).

- L1: one hand-made notification with a real alert's labels and ``startsAt`` in 2030 moved the
  ordering memory: every real notification and reconciliation of that alert was "stale" for
  the dedupe window (an hour). A ``startsAt`` beyond the clock-skew margin (5 min) is skipped:
  counted (``notifications_total{result="future"}``), logged, audited; the rest of the
  notification is processed.
- L3: the payload's fingerprint was taken as given (``../../x?y#z`` reached the state, the audit
  log, and an action that put it in a URL path). One that is not 16 lowercase hex digits is
  replaced by the one computed from the labels (counted); Alertmanager's and Grafana's pass.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers.actions.base import Action, ActionContext, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload, fingerprint
from promreflex.config import ControllerConfig, Route
from tests.payloads import alert, payload

CALLS: list[tuple[str, str]] = []


@register
class InputRecorder(Action):
    name = "test-input-recorder"

    async def fire(self, ctx: ActionContext) -> str:
        CALLS.append(("fire", ctx.alert.fingerprint))
        return "fired"

    async def resolve(self, ctx: ActionContext) -> str:
        CALLS.append(("resolve", ctx.alert.fingerprint))
        return "resolved"


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def make_engine(tmp_path) -> tuple[Engine, CollectorRegistry]:
    cfg = ControllerConfig(audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db", alertmanager_url=None,
                           routes=[Route(name="r", matchers=['alertname="Overload"'], action="test-input-recorder")])
    registry = CollectorRegistry()
    return Engine(cfg, ControllerMetrics(registry, ["test-input-recorder"]), AuditLog(cfg.audit_log)), registry


async def deliver(engine: Engine, *alerts: dict[str, Any]) -> dict[str, int]:
    counts = await engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))
    await engine.drain()
    return counts


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_a_future_starts_at_does_not_make_the_real_alert_stale(tmp_path):
    engine, registry = make_engine(tmp_path)
    now = datetime.now(UTC)
    made_up = alert("Overload", starts="2030-01-01T00:00:00Z", instance="a")
    other = alert("Overload", starts=iso(now - timedelta(seconds=30)), instance="b")
    counts = await deliver(engine, made_up, other)  # the rest of the notification is processed
    real = alert("Overload", starts=iso(now), instance="a")
    assert (await deliver(engine, real))["accepted"] == 1, "the made-up date made the real episode stale"
    assert [("fire", other["fingerprint"]), ("fire", real["fingerprint"])] == CALLS
    assert counts.get("future") == 1 and counts["accepted"] == 1
    assert registry.get_sample_value("promreflex_controller_notifications_total",
                                     {"status": "firing", "result": "future"}) == 1
    records = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "notification"]
    assert records[0]["result"] == "future" and "in the future" in records[0]["reason"]
    assert (await deliver(engine, made_up))["future"] == 1  # not remembered: never a "duplicate"
    await engine.shutdown()


async def test_a_starts_at_within_the_clock_skew_margin_is_taken(tmp_path):
    engine, _ = make_engine(tmp_path)
    ahead = alert("Overload", starts=iso(datetime.now(UTC) + timedelta(seconds=90)), instance="a")
    assert (await deliver(engine, ahead))["accepted"] == 1
    assert len(CALLS) == 1
    await engine.shutdown()


@pytest.mark.parametrize("given", ["../../x?y#z", "C6EADFFA33FCDF37", "abc", "c6eadffa33fcdf37ff", 'a"b'])
async def test_a_fingerprint_that_is_not_one_is_computed_from_the_labels(tmp_path, given):
    engine, registry = make_engine(tmp_path)
    hostile = {**alert("Overload", instance="a"), "fingerprint": given}
    computed = fingerprint(hostile["labels"])
    assert (await deliver(engine, hostile))["accepted"] == 1
    assert [("fire", computed)] == CALLS
    assert [e["fingerprint"] for e in engine.snapshot()] == [computed]
    assert given not in engine._latest
    assert registry.get_sample_value("promreflex_controller_fingerprints_replaced_total") == 1
    (record,) = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "notification"]
    assert record["fingerprint"] == computed and record["given_fingerprint"] == given
    await engine.shutdown()


async def test_real_fingerprints_and_empty_ones_are_kept_or_computed_without_a_count(tmp_path):
    engine, registry = make_engine(tmp_path)
    grafana = {**alert("Overload", instance="g"), "fingerprint": "c6eadffa33fcdf37"}  # Grafana's own hash
    empty = {**alert("Overload", instance="e"), "fingerprint": ""}
    await deliver(engine, grafana, empty)
    assert sorted(fp for _, fp in CALLS) == sorted(["c6eadffa33fcdf37", fingerprint(empty["labels"])])
    assert registry.get_sample_value("promreflex_controller_fingerprints_replaced_total") == 0
    await engine.shutdown()


async def test_a_future_episode_already_in_the_ordering_memory_is_forgotten_at_start(tmp_path):
    """A state written before future startsAt were skipped (the review's 2030 row) would keep
    the real alert stale for the dedupe window after the upgrade: the start drops it."""
    engine, _ = make_engine(tmp_path)
    made_up = alert("Overload", starts="2030-01-01T00:00:00Z", instance="a")
    engine._set_latest(made_up["fingerprint"], datetime(2030, 1, 1, tzinfo=UTC), "absent", engine.clock())
    await engine.store.commit()
    await engine.shutdown()
    engine2, _ = make_engine(tmp_path)
    real = alert("Overload", starts=iso(datetime.now(UTC)), instance="a")
    assert (await deliver(engine2, real))["accepted"] == 1
    assert [("fire", real["fingerprint"])] == CALLS
    await engine2.shutdown()
