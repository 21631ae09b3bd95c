"""What applied an alert keeps resolving it (a stranger's review, H4, H5, M2).

- H4: a start with a configuration that no longer lists a route dropped that route's applied
  alerts (a log line, no audit, never resolved), where a reload resolves them. Now the state
  keeps each route's binding, and a start resolves them with it (audited ``retired``).
- H5: a reload that changed a route's ``action`` left the old action applied, ran the new
  action's resolve instead, and drove ``applied_alerts`` to -1. Now the old binding is retired
  (its resolve runs first) and the new one starts fresh; the same when the params change the
  target the action names; the reload's answer says what it resolves.
- M2: a reload zeroed ``transitions_failing`` while transitions were still given up.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict

from controllers.actions.base import Action, ActionContext, register
from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from controllers.server import apply_routes
from promreflex.config import ControllerConfig, Route
from tests.payloads import alert, payload

# (action, transition, route as the action saw it, target param)
RUNS: list[tuple[str, str, str, str]] = []
APPLIED: dict[tuple[str, str], set[str]] = {}  # (action, target) -> fingerprints applied there


class TargetParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str = "t1"
    message: str = ""
    fail: bool = False


class _Base(Action):
    Params = TargetParams
    concurrency = 4

    def target(self, ctx: ActionContext) -> str:
        return f"{self.name}:{ctx.params.target}"  # type: ignore[attr-defined]

    async def fire(self, ctx: ActionContext) -> str:
        p: TargetParams = ctx.params  # type: ignore[assignment]
        RUNS.append((self.name, "fire", ctx.route, p.target))
        if p.fail:
            raise RuntimeError("injected")
        APPLIED.setdefault((self.name, p.target), set()).add(ctx.alert.fingerprint)
        return "on"

    async def resolve(self, ctx: ActionContext) -> str:
        p: TargetParams = ctx.params  # type: ignore[assignment]
        RUNS.append((self.name, "resolve", ctx.route, p.target))
        APPLIED.get((self.name, p.target), set()).discard(ctx.alert.fingerprint)
        return "off"


@register
class Pause(_Base):
    name = "test-bind-pause"


@register
class Throttle(_Base):
    name = "test-bind-throttle"


ACTIONS = ["test-bind-pause", "test-bind-throttle"]


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    APPLIED.clear()


def route(name: str = "r", action: str = "test-bind-pause", **params: Any) -> Route:
    return Route(name=name, matchers=['alertname="Overload"'], action=action, params=params, max_retries=0)


def config(tmp_path, *routes: Route) -> ControllerConfig:
    return ControllerConfig(audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.db",
                            alertmanager_url=None, routes=list(routes))


def make_engine(tmp_path, *routes: Route) -> tuple[Engine, CollectorRegistry]:
    cfg = config(tmp_path, *routes)
    registry = CollectorRegistry()
    return Engine(cfg, ControllerMetrics(registry, ACTIONS), AuditLog(cfg.audit_log)), registry


async def deliver(engine: Engine, *alerts: dict[str, Any]) -> None:
    await engine.handle_payload(WebhookPayload.model_validate(payload(*alerts)))
    await engine.drain()


def applied_now() -> set[tuple[str, str]]:
    return {key for key, fps in APPLIED.items() if fps}


def gauge(registry: CollectorRegistry, action: str) -> float | None:
    return registry.get_sample_value("promreflex_controller_applied_alerts", {"action": action})


FIRING = alert("Overload", starts="2026-11-23T10:00:00Z", instance="a")
RESOLVED = alert("Overload", status="resolved", starts="2026-11-23T10:00:00Z", instance="a")


# ---------------------------------------------------------------- H4
async def test_a_start_without_a_route_resolves_what_it_applied(tmp_path):
    engine, _ = make_engine(tmp_path, route("r"), route("keep", target="t-keep"))
    await deliver(engine, FIRING)
    assert applied_now() == {("test-bind-pause", "t1"), ("test-bind-pause", "t-keep")}
    await engine.shutdown()

    engine2, registry2 = make_engine(tmp_path, route("keep", target="t-keep"))  # "r" removed (or renamed)
    await engine2.start()
    await engine2.drain()
    assert ("test-bind-pause", "resolve", "r", "t1") in RUNS, "the removed route's applied alert was dropped"
    assert applied_now() == {("test-bind-pause", "t-keep")}
    assert [e for e in engine2.snapshot() if e["route"] == "r"] == []
    retired = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "retired"]
    assert [(r["route"], r["result"], r["resolving"]) for r in retired] == [("r", "ok", 1)]
    assert gauge(registry2, "test-bind-pause") == 1  # "keep"'s own, still applied
    await deliver(engine2, RESOLVED)
    assert applied_now() == set() and gauge(registry2, "test-bind-pause") == 0
    await engine2.shutdown()


async def test_a_state_from_before_bindings_keeps_a_removed_routes_rows_and_says_so(tmp_path, caplog):
    """A database written before the bindings were kept does not say which action applied a
    removed route's alerts: the rows are kept (configuring the route again resolves them), the
    start audits and logs it, nothing is silently dropped."""
    engine, _ = make_engine(tmp_path, route("r"))
    await deliver(engine, FIRING)
    await engine.shutdown()
    with sqlite3.connect(tmp_path / "state.db") as db:  # as a schema 1 database has it
        db.execute("DELETE FROM bindings")
    engine2, _ = make_engine(tmp_path, route("other"))
    await engine2.start()
    await engine2.drain()
    await engine2.shutdown()
    errors = [r for r in read_audit(tmp_path / "audit.jsonl") if r["event"] == "retired"]
    assert [(r["route"], r["result"], r["alerts"]) for r in errors] == [("r", "error", 1)]
    assert "no longer configured" in caplog.text
    engine3, _ = make_engine(tmp_path, route("r"))  # the route is back: its alert is there
    await engine3.start()
    await deliver(engine3, RESOLVED)
    assert RUNS[-1] == ("test-bind-pause", "resolve", "r", "t1") and applied_now() == set()
    await engine3.shutdown()


# ---------------------------------------------------------------- H5
async def test_a_reload_that_changes_the_action_resolves_with_the_old_one_first(tmp_path):
    engine, registry = make_engine(tmp_path, route("r", "test-bind-pause"))
    await engine.start()
    await deliver(engine, FIRING)
    assert applied_now() == {("test-bind-pause", "t1")}
    summary = await apply_routes(engine, config(tmp_path, route("r", "test-bind-throttle")))
    await engine.drain()
    assert summary["changed"] == ["r"] and summary["resolving"] == 1
    assert summary["retired"] == [{"route": "r", "action": "test-bind-pause", "as": "r~test-bind-pause",
                                   "alerts": 1, "why": "action changed from test-bind-pause to test-bind-throttle",
                                   "resolving": 1}]
    # The old action's resolve first (the route name it applied with), then the new one's fire.
    assert RUNS == [("test-bind-pause", "fire", "r", "t1"), ("test-bind-pause", "resolve", "r", "t1"),
                    ("test-bind-throttle", "fire", "r", "t1")]
    assert applied_now() == {("test-bind-throttle", "t1")}
    assert (gauge(registry, "test-bind-pause"), gauge(registry, "test-bind-throttle")) == (0, 1)
    await deliver(engine, RESOLVED)
    assert RUNS[-1] == ("test-bind-throttle", "resolve", "r", "t1") and applied_now() == set()
    assert (gauge(registry, "test-bind-pause"), gauge(registry, "test-bind-throttle")) == (0, 0)
    assert engine.entries == {}
    await engine.shutdown()


async def test_a_reload_that_changes_the_target_retires_a_message_change_does_not(tmp_path):
    engine, registry = make_engine(tmp_path, route("r", target="t1", message="v1"))
    await engine.start()
    await deliver(engine, FIRING)
    summary = await apply_routes(engine, config(tmp_path, route("r", target="t1", message="v2")))
    await engine.drain()
    assert summary["changed"] == ["r"] and summary["retired"] == [] and summary["resolving"] == 0
    assert len(RUNS) == 1
    summary = await apply_routes(engine, config(tmp_path, route("r", target="t2", message="v2")))
    await engine.drain()
    assert [r["why"] for r in summary["retired"]] == ["its params changed the target of action test-bind-pause"]
    assert RUNS[1:] == [("test-bind-pause", "resolve", "r", "t1"), ("test-bind-pause", "fire", "r", "t2")]
    assert applied_now() == {("test-bind-pause", "t2")} and gauge(registry, "test-bind-pause") == 1
    await engine.shutdown()


async def test_a_start_with_a_changed_action_resolves_with_the_old_one(tmp_path):
    engine, _ = make_engine(tmp_path, route("r", "test-bind-pause"))
    await deliver(engine, FIRING)
    await engine.shutdown()
    engine2, registry2 = make_engine(tmp_path, route("r", "test-bind-throttle"))
    await engine2.start()
    await engine2.drain()
    assert RUNS[1:] == [("test-bind-pause", "resolve", "r", "t1"), ("test-bind-throttle", "fire", "r", "t1")]
    assert applied_now() == {("test-bind-throttle", "t1")}
    assert (gauge(registry2, "test-bind-pause"), gauge(registry2, "test-bind-throttle")) == (0, 1)
    await engine2.shutdown()


async def test_a_retired_binding_survives_a_restart_before_its_resolve(tmp_path):
    """A reload retired the old binding; the process dies before its resolve ran: the next start
    still resolves it with the old action (the binding is in the state)."""
    engine, _ = make_engine(tmp_path, route("r", "test-bind-pause"))
    await engine.start()
    await deliver(engine, FIRING)
    engine.kick = lambda key: None  # type: ignore[method-assign] - nothing runs: the process dies now
    await apply_routes(engine, config(tmp_path, route("r", "test-bind-throttle")))
    assert len(RUNS) == 1
    engine2, _ = make_engine(tmp_path, route("r", "test-bind-throttle"))
    await engine2.start()
    await engine2.drain()
    assert RUNS[1:] == [("test-bind-pause", "resolve", "r", "t1"), ("test-bind-throttle", "fire", "r", "t1")]
    await engine2.shutdown()


# ---------------------------------------------------------------- M2
async def test_a_reload_keeps_the_count_of_given_up_transitions(tmp_path):
    engine, registry = make_engine(tmp_path, route("r", fail=True))
    await engine.start()
    await deliver(engine, FIRING)

    def failing() -> float | None:
        return registry.get_sample_value("promreflex_controller_transitions_failing",
                                         {"route": "r", "action": "test-bind-pause"})

    assert failing() == 1
    await apply_routes(engine, config(tmp_path, route("r", fail=True)))  # the same file again
    assert failing() == 1, "a reload hid a given-up transition"
    await apply_routes(engine, config(tmp_path, route("r", fail=True, message="new")))
    assert failing() == 1
    await engine.shutdown()


# ---------------------------------------------------------------- the database
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (route TEXT NOT NULL, fingerprint TEXT NOT NULL, alert TEXT NOT NULL,
    desired TEXT NOT NULL, applied TEXT NOT NULL, inflight TEXT, PRIMARY KEY (route, fingerprint));
CREATE TABLE latest (fingerprint TEXT PRIMARY KEY, starts_at TEXT NOT NULL, status TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE seen (fingerprint TEXT NOT NULL, status TEXT NOT NULL, starts_at TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (fingerprint, status, starts_at));
CREATE INDEX seen_at ON seen (at);
CREATE TABLE last_fire (route TEXT NOT NULL, target TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (route, target));
INSERT INTO meta VALUES ('schema', '1');
"""


async def test_a_schema_1_database_is_migrated_and_its_entries_resumed(tmp_path):
    from controllers.models import Alert

    with sqlite3.connect(tmp_path / "state.db") as db:
        db.executescript(SCHEMA_1)
        db.execute("INSERT INTO entries VALUES ('r', ?, ?, 'firing', 'firing', NULL)",
                   (FIRING["fingerprint"], Alert.model_validate(FIRING).model_dump_json()))
    engine, registry = make_engine(tmp_path, route("r"))
    assert gauge(registry, "test-bind-pause") == 1
    await engine.start()
    await deliver(engine, RESOLVED)
    assert RUNS == [("test-bind-pause", "resolve", "r", "t1")]
    await engine.shutdown()
    with sqlite3.connect(tmp_path / "state.db") as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("2",)
        names = [n for (n,) in db.execute("SELECT name FROM bindings")]
        assert names == ["r"] and json.loads(db.execute("SELECT binding FROM bindings").fetchone()[0])["route"]["action"] \
            == "test-bind-pause"


def test_a_database_of_a_newer_controller_is_refused(tmp_path):
    from promreflex.errors import UserError

    with sqlite3.connect(tmp_path / "state.db") as db:
        db.executescript(SCHEMA_1.replace("'schema', '1'", "'schema', '9'"))
    with pytest.raises(UserError, match="schema version 9, this controller reads 1 to 2"):
        make_engine(tmp_path, route("r"))


async def test_the_state_api_names_the_binding(tmp_path):
    engine, _ = make_engine(tmp_path, route("r"))
    await deliver(engine, FIRING)
    assert [(e["route"], e["action"], e["applied"]) for e in engine.snapshot()] == [("r", "test-bind-pause", "firing")]
    await engine.shutdown()
    await asyncio.sleep(0)


@register
class Counted(_Base):
    """Registers its metrics in start(), as the shipped actions do (rca, copy-guard, ...)."""

    name = "test-bind-counted"
    starts = 0

    async def start(self, services: dict[str, Any]) -> None:
        from prometheus_client import Gauge

        Counted.starts += 1
        self.gauge = Gauge("test_bind_counted_held", "held", registry=services["registry"])


async def test_an_action_removed_by_a_reload_and_added_again_keeps_its_instance(tmp_path):
    """A reload back to a route list holding an action that an earlier reload removed started a
    new instance, whose metrics clashed with the first one's ("Duplicated timeseries in
    CollectorRegistry: promreflex_root_cause": the reload said it kept its routes, and had
    swapped them). The first instance is kept, with its metrics and state."""
    cfg = config(tmp_path, route("r", "test-bind-counted"))
    registry = CollectorRegistry()
    engine = Engine(cfg, ControllerMetrics(registry, [*ACTIONS, "test-bind-counted"]), AuditLog(cfg.audit_log),
                    services={"registry": registry})
    Counted.starts = 0
    await engine.start()
    first = engine.actions["test-bind-counted"]
    summary = await apply_routes(engine, config(tmp_path, route("p", "test-bind-pause")))
    assert summary["removed"] == ["r"] and "test-bind-counted" not in engine.actions
    summary = await apply_routes(engine, config(tmp_path, route("r", "test-bind-counted")))
    assert summary["added"] == ["r"] and engine.actions["test-bind-counted"] is first and Counted.starts == 1
    await deliver(engine, FIRING)
    assert RUNS == [("test-bind-counted", "fire", "r", "t1")]
    await engine.shutdown()


async def test_the_resolve_of_a_merged_ha_episode_ends_it_a_late_older_one_does_not(tmp_path):
    """A stranger's review with a real Alertmanager 0.25: two Prometheus replicas send one alert
    with startsAt 10 s apart; Alertmanager notified the first copy (group_wait 0s), merged the
    other and kept the EARLIEST startsAt, so the resolve came with a startsAt older than the one
    held, was "stale", answered 200: the action stayed applied (for good without an
    Alertmanager to reconcile with). A resolve that ends after the held episode began is its end;
    one of an older episode (it ended before the held one began) still changes nothing."""
    engine, _ = make_engine(tmp_path, route("r"))
    await engine.start()
    await deliver(engine, alert("Overload", starts="2026-11-23T10:00:10Z", instance="a"))
    assert applied_now() == {("test-bind-pause", "t1")}
    late = alert("Overload", status="resolved", starts="2026-11-23T09:50:00Z", ends="2026-11-23T09:55:00Z",
                 instance="a")  # an older episode's end, delivered late
    await deliver(engine, late)
    assert applied_now() == {("test-bind-pause", "t1")}
    merged = alert("Overload", status="resolved", starts="2026-11-23T10:00:00Z", ends="2026-11-23T10:05:00Z",
                   instance="a")
    await deliver(engine, merged)
    assert applied_now() == set() and RUNS[-1] == ("test-bind-pause", "resolve", "r", "t1")
    # the episode ended: a late firing copy of it (either startsAt) does not fire again
    await deliver(engine, alert("Overload", starts="2026-11-23T10:00:00Z", instance="a"),
                  alert("Overload", starts="2026-11-23T10:00:10Z", instance="a"))
    assert applied_now() == set()
    await engine.shutdown()


async def test_truncated_alerts_are_said_counted_and_audited(tmp_path, caplog):
    engine, registry = make_engine(tmp_path, route("r"))
    await engine.start()
    body = payload(FIRING)
    body["truncatedAlerts"] = 17
    with caplog.at_level("WARNING"):
        await engine.handle_payload(WebhookPayload.model_validate(body))
    assert registry.get_sample_value("promreflex_controller_truncated_alerts_total") == 17
    assert any(r.get("event") == "truncated" and r.get("truncatedAlerts") == 17
               for r in read_audit(tmp_path / "audit.jsonl"))
    assert any("left out 17 alert(s)" in r.getMessage() and "not acted on" in r.getMessage() for r in caplog.records)
    body["truncatedAlerts"] = 10**400  # a hand-made one: no float (was an OverflowError, a 500 at every retry)
    assert (await engine.handle_payload(WebhookPayload.model_validate(body)))["duplicate"] == 1
    assert registry.get_sample_value("promreflex_controller_truncated_alerts_total") == pytest.approx(17 + 2**53)
    await engine.shutdown()


async def test_the_audit_log_and_the_state_are_created_private(tmp_path):
    """Alert labels and routes are in them: created 0600 (a stranger found 0644)."""
    import stat

    engine, _ = make_engine(tmp_path, route("r"))
    await engine.start()
    await deliver(engine, FIRING)
    await engine.shutdown()
    for name in ("audit.jsonl", "state.db"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


async def test_a_reload_applies_alertmanager_receiver_and_a_name_equals_its_one_item_list(tmp_path):
    """A reviewer (P, F7): ``promreflex`` -> ``[promreflex]`` (the same setting) was reported as
    needing a restart, and a receiver added to the list took effect only after a restart, while
    the log's advice said only "add it"."""
    engine, _ = make_engine(tmp_path, route("r", "test-bind-pause"))
    await engine.start()
    same = config(tmp_path, route("r", "test-bind-pause")).model_copy(update={"alertmanager_receiver": ["promreflex"]})
    summary = await apply_routes(engine, same)
    assert summary["needs_restart"] == []
    two = same.model_copy(update={"alertmanager_receiver": ["promreflex", "promreflex-ops"]})
    summary = await apply_routes(engine, two)
    assert summary["needs_restart"] == []
    assert engine._receiver_names() == {"promreflex", "promreflex-ops"}  # noqa: SLF001 - what the reconciliation reads
    await engine.shutdown()
