"""The controller engine: desired state from notifications and reconciliation, converged by
per-target workers.

Why a desired-state engine rather than "run the action when a webhook arrives": Alertmanager
delivers at least once, webhooks get lost, and the controller itself restarts. Every input
(a webhook alert, or an alert read back from Alertmanager's API) only sets what each
(route, alert) *should* be: firing or resolved. A worker compares that with what is *applied*
(persisted in a state file) and runs ``fire`` or ``resolve`` only on a difference. So a
duplicate changes nothing, a lost webhook is made good by the next reconciliation, and a
restart resumes from the state file.

Ordering: per alert fingerprint the engine remembers the newest (startsAt, status) seen. A
firing notification for an episode already resolved (same startsAt), or for an older episode,
is stale and ignored: late deliveries cannot re-fire an action.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from controllers.actions.base import Action, ActionContext, registry
from controllers.audit import AuditLog
from controllers.metrics import ControllerMetrics
from controllers.models import Alert, WebhookPayload, alert_from_api
from promreflex.config import ConfigError, ControllerConfig, Route, validation_problems
from promreflex.fsutil import atomic_write_json, read_json
from promreflex.matchers import Matcher, matches_all

log = logging.getLogger("promreflex.controller")

FIRING, RESOLVED = "firing", "resolved"
MAX_RETRY_DELAY = 30.0


@dataclass
class BoundRoute:
    route: Route
    matchers: list[Matcher]
    action: Action
    params: Any


@dataclass
class Entry:
    """One (route, alert): what should be and what is."""

    route: str
    alert: Alert
    desired: str
    applied: str = RESOLVED
    failures: int = 0
    retry: asyncio.TimerHandle | None = None


def bind_routes(cfg: ControllerConfig) -> list[BoundRoute]:
    """Check every route's action and parameters; report every problem at once."""
    actions = registry()
    instances: dict[str, Action] = {}
    bound, problems = [], []
    for i, route in enumerate(cfg.routes):
        cls = actions.get(route.action)
        if cls is None:
            problems.append(f"controller.routes[{i}].action: unknown action {route.action!r} (known: {', '.join(sorted(actions))})")
            continue
        try:
            params = cls.Params.model_validate(route.params)
        except ValidationError as e:
            problems += [f"controller.routes[{i}].params.{p}" for p in validation_problems(e)]
            continue
        action = instances.setdefault(route.action, cls())
        bound.append(BoundRoute(route, route.parsed_matchers(), action, params))
    if problems:
        raise ConfigError("controller.routes", problems)
    return bound


class Engine:
    def __init__(
        self,
        cfg: ControllerConfig,
        metrics: ControllerMetrics,
        audit: AuditLog,
        services: dict[str, Any] | None = None,
        clock=time.time,
    ):
        self.cfg = cfg
        self.routes = {b.route.name: b for b in bind_routes(cfg)}
        self.metrics = metrics
        self.audit = audit
        self.services = services or {}
        self.clock = clock
        self.entries: dict[tuple[str, str], Entry] = {}
        self._seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._latest: dict[str, tuple[datetime, str, float]] = {}
        self._target_locks: dict[str, asyncio.Lock] = {}
        self._action_sems: dict[str, asyncio.Semaphore] = {}
        self._last_fire: dict[tuple[str, str], float] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._load_state()

    # ------------------------------------------------------------------ persistence
    @property
    def actions(self) -> dict[str, Action]:
        return {b.action.name: b.action for b in self.routes.values()}

    def _load_state(self) -> None:
        data = read_json(self.cfg.state_file, default={}) or {}
        for item in data.get("applied", []):
            if item.get("route") not in self.routes:
                log.warning("state file names route %r that is no longer configured; dropped", item.get("route"))
                continue
            alert = Alert.model_validate(item["alert"])
            entry = Entry(route=item["route"], alert=alert, desired=FIRING, applied=FIRING)
            self.entries[(entry.route, alert.fingerprint)] = entry
            self._latest[alert.fingerprint] = (alert.startsAt, FIRING, self.clock())
        self._last_fire.update({tuple(k.split("\x00", 1)): v for k, v in data.get("last_fire", {}).items()})
        self._update_applied_gauge()

    def _save_state(self) -> None:
        applied = [
            {"route": e.route, "alert": e.alert.model_dump(mode="json")}
            for e in self.entries.values()
            if e.applied == FIRING
        ]
        last_fire = {f"{r}\x00{t}": ts for (r, t), ts in self._last_fire.items()}
        atomic_write_json(self.cfg.state_file, {"applied": applied, "last_fire": last_fire})

    def _update_applied_gauge(self) -> None:
        counts = {name: 0 for name in self.actions}
        for e in self.entries.values():
            if e.applied == FIRING:
                counts[self.routes[e.route].action.name] += 1
        for name, n in counts.items():
            self.metrics.applied.labels(name).set(n)

    # ------------------------------------------------------------------ inputs
    def handle_payload(self, payload: WebhookPayload) -> dict[str, int]:
        """Take one webhook notification. Returns counts by result; never blocks on actions."""
        counts = {"accepted": 0, "duplicate": 0, "stale": 0}
        now = self.clock()
        self._expire(now)
        for alert in payload.alerts:
            if alert.dedupe_key in self._seen:
                result = "duplicate"
            else:
                self._seen[alert.dedupe_key] = now
                result = "accepted" if self._observe(alert, now) else "stale"
            counts[result] += 1
            self.metrics.notifications.labels(alert.status, result).inc()
            self.audit.write(
                "notification", result=result, status=alert.status, fingerprint=alert.fingerprint,
                startsAt=alert.startsAt.isoformat(), labels=alert.labels, groupKey=payload.groupKey,
            )
        self.metrics.last_notification.set(now)
        return counts

    def _observe(self, alert: Alert, now: float) -> bool:
        """Record the alert's newest known status and set the desired state of matching routes.
        Returns False when the alert is stale (an older episode, or firing after resolved)."""
        latest = self._latest.get(alert.fingerprint)
        if latest is not None:
            starts, status, _ = latest
            if alert.startsAt < starts or (alert.startsAt == starts and status == RESOLVED and alert.status == FIRING):
                return False
        self._latest[alert.fingerprint] = (alert.startsAt, alert.status, now)
        for name, bound in self.routes.items():
            key = (name, alert.fingerprint)
            entry = self.entries.get(key)
            if not matches_all(bound.matchers, alert.labels):
                continue
            if entry is None:
                if alert.status == RESOLVED:
                    continue  # never applied: nothing to undo
                entry = self.entries[key] = Entry(route=name, alert=alert, desired=FIRING)
            entry.alert, entry.desired = alert, alert.status
            self.kick(key)
        return True

    def _expire(self, now: float) -> None:
        window = self.cfg.dedupe_window
        while self._seen and next(iter(self._seen.values())) < now - window:
            self._seen.popitem(last=False)
        for fp in [fp for fp, (_, status, at) in self._latest.items() if at < now - window and status == RESOLVED]:
            del self._latest[fp]

    async def reconcile(self) -> dict[str, int]:
        """Converge on Alertmanager's active alerts: fire what is active and not applied,
        resolve what is applied and no longer active."""
        am = self.services.get("alertmanager")
        if am is None:
            return {}
        try:
            items = await am.active_alerts()
            active = [alert_from_api(i) for i in items]
        except Exception as e:  # noqa: BLE001 - any failure is a counted, logged reconcile error
            self.metrics.reconcile_runs.labels("error").inc()
            self.audit.write("reconcile", result="error", error=repr(e))
            log.warning("reconcile failed: %r", e)
            return {}
        now = self.clock()
        active_fps = {a.fingerprint for a in active}
        for alert in active:
            self._observe(alert, now)
        resolved = 0
        for key, entry in list(self.entries.items()):
            if entry.alert.fingerprint not in active_fps and entry.desired == FIRING:
                entry.desired = RESOLVED
                self._latest[entry.alert.fingerprint] = (entry.alert.startsAt, RESOLVED, now)
                resolved += 1
                self.kick(key)
        self.metrics.reconcile_runs.labels("ok").inc()
        self.metrics.last_reconcile.set(now)
        summary = {"active": len(active), "resolved_missing": resolved}
        self.audit.write("reconcile", result="ok", **summary)
        return summary

    # ------------------------------------------------------------------ convergence
    def kick(self, key: tuple[str, str]) -> None:
        if self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._converge(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ctx(self, entry: Entry) -> ActionContext:
        bound = self.routes[entry.route]
        return ActionContext(route=entry.route, alert=entry.alert, params=bound.params, services=self.services)

    async def _converge(self, key: tuple[str, str]) -> None:
        entry = self.entries.get(key)
        if entry is None:
            return
        bound = self.routes[entry.route]
        action = bound.action
        target = action.target(self._ctx(entry))
        lock = self._target_locks.setdefault(target, asyncio.Lock())
        sem = self._action_sems.setdefault(action.name, asyncio.Semaphore(action.concurrency))
        async with lock, sem:
            entry = self.entries.get(key)
            if entry is None or entry.desired == entry.applied:
                return
            transition = "fire" if entry.desired == FIRING else "resolve"
            ctx = self._ctx(entry)
            if transition == "fire":
                wait = self._cooldown_left(bound, target)
                if wait > 0:
                    self._record(entry, action, transition, "cooldown", f"cooldown: {wait:.1f}s left", 0.0)
                    self._schedule_retry(key, entry, wait)
                    return
                if not await self._still_active(entry):
                    self._record(entry, action, transition, "skipped", "no longer active in Alertmanager", 0.0)
                    entry.desired = RESOLVED
                    self._forget_if_done(key, entry)
                    return
            started = time.monotonic()
            try:
                detail = await (action.fire(ctx) if transition == "fire" else action.resolve(ctx))
            except Exception as e:  # noqa: BLE001 - an action's failure is counted, audited, retried
                entry.failures += 1
                delay = min(2.0 ** entry.failures, MAX_RETRY_DELAY)
                self._record(entry, action, transition, "error", f"{type(e).__name__}: {e}", time.monotonic() - started)
                log.exception("action %s %s failed for %s", action.name, transition, key)
                self._schedule_retry(key, entry, delay)
                return
            entry.failures = 0
            entry.applied = FIRING if transition == "fire" else RESOLVED
            if transition == "fire":
                self._last_fire[(entry.route, target)] = self.clock()
            self._record(entry, action, transition, "ok", detail, time.monotonic() - started)
            self._forget_if_done(key, entry)
            self._save_state()
            self._update_applied_gauge()
        # The desired state may have changed while the action ran.
        entry = self.entries.get(key)
        if entry is not None and entry.desired != entry.applied:
            self.kick(key)

    def _cooldown_left(self, bound: BoundRoute, target: str) -> float:
        last = self._last_fire.get((bound.route.name, target))
        if last is None or bound.route.cooldown <= 0:
            return 0.0
        return max(0.0, last + bound.route.cooldown - self.clock())

    async def _still_active(self, entry: Entry) -> bool:
        """Re-check with Alertmanager before acting; if it cannot be asked, trust the notification."""
        am = self.services.get("alertmanager")
        if am is None:
            return True
        try:
            items = await am.active_alerts()
        except Exception as e:  # noqa: BLE001
            log.warning("could not re-check with Alertmanager (%r); acting on the notification", e)
            return True
        return any((i.get("fingerprint") or "") == entry.alert.fingerprint for i in items)

    def _schedule_retry(self, key: tuple[str, str], entry: Entry, delay: float) -> None:
        if entry.retry is not None:
            entry.retry.cancel()
        entry.retry = asyncio.get_running_loop().call_later(delay, self.kick, key)

    def _forget_if_done(self, key: tuple[str, str], entry: Entry) -> None:
        if entry.desired == RESOLVED and entry.applied == RESOLVED:
            if entry.retry is not None:
                entry.retry.cancel()
            self.entries.pop(key, None)

    def _record(self, entry: Entry, action: Action, transition: str, result: str, detail: str, seconds: float) -> None:
        self.metrics.actions.labels(action.name, transition, result).inc()
        if result in ("ok", "error"):
            self.metrics.action_duration.labels(action.name).observe(seconds)
        self.audit.write(
            "decision", action=action.name, route=entry.route, transition=transition, result=result,
            detail=detail, fingerprint=entry.alert.fingerprint, startsAt=entry.alert.startsAt.isoformat(),
            labels=entry.alert.labels, seconds=round(seconds, 6),
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for action in self.actions.values():
            action.route_params = [b.params for b in self.routes.values() if b.action is action]
            await action.start(self.services)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for running transitions to finish (bounded)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def shutdown(self) -> None:
        self._closing = True
        for entry in self.entries.values():
            if entry.retry is not None:
                entry.retry.cancel()
        await self.drain()
        for action in self.actions.values():
            try:
                await action.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("action %s failed to shut down cleanly", action.name)

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"route": e.route, "fingerprint": e.alert.fingerprint, "alertname": e.alert.name,
             "desired": e.desired, "applied": e.applied, "failures": e.failures}
            for e in self.entries.values()
        ]

