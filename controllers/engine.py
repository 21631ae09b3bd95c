"""The controller engine: desired state from notifications and reconciliation, converged by
per-target workers, kept in a SQLite database.

Why a desired-state engine rather than "run the action when a webhook arrives": Alertmanager
delivers at least once, webhooks get lost, and the controller itself restarts. Every input
(a webhook alert, or an alert read back from Alertmanager's API) only sets what each
(route, alert) *should* be: firing or resolved. A worker compares that with what is *applied*
and runs ``fire`` or ``resolve`` only on a difference. So a duplicate changes nothing, a lost
webhook is made good by the next reconciliation, and a restart resumes from the state.

Ordering: per alert fingerprint the engine remembers the newest (startsAt, status) seen. A
firing notification for an episode already resolved (same startsAt), or for an older episode,
is stale and ignored: late deliveries cannot re-fire an action. A notification whose
(fingerprint, status, startsAt) was seen within ``dedupe_window`` is a duplicate. startsAt is
compared at millisecond precision (what Alertmanager's API keeps; notifications carry more).

Absence: an alert that leaves Alertmanager's active view while it is desired firing (a silence
starts, an inhibition applies, Alertmanager restarts and forgets it, or the pre-fire re-check
does not find it) is resolved by the reconciliation ("silencing means stop acting on it"). That
resolution starts a new *generation* of the alert: the engine forgets the dedupe keys of that
episode and marks it ``absent`` instead of ``resolved``. When the alert comes back with the
same ``startsAt`` (the silence expires, the inhibiting alert ends), the reconciliation or a
notification sees it as new and ``fire`` runs again. Only a ``resolved`` notification from
Alertmanager ends an episode, unless Alertmanager lists the same episode as active again after
it (Alertmanager resolves an alert whose re-sends from Prometheus stopped for longer than its
``endsAt``, and stores them as a new alert when they come back with the same ``startsAt``):
the reconciliation then starts a new generation too, and ``fire`` runs again; the webhook alone
cannot tell that firing notification from a late retry of the first, so without
``alertmanager_url`` it stays a duplicate. A late firing notification sent before the absence is
then accepted too, but the re-check with Alertmanager before every fire skips it while the
alert is still silenced or inhibited.

Durability, the guarantee: *at least once per transition; a completed transition is never run
again.* Before answering a webhook, its effect on the desired state and the dedupe memory is
committed (:meth:`Engine.handle_payload` returns after the commit). Before an action runs, the
intent (the transition in flight) is committed; after it returns, the applied state is
committed before the target's lock is released. A SIGKILL at any point therefore loses no
accepted notification; a run interrupted between its intent and its completion is found at
start (counted in ``promreflex_controller_interrupted_transitions_total``, audited as
``interrupted``) and run again: actions must be idempotent.

Failures: each run is cancelled after its timeout; a failed or timed-out run is retried after
a random delay in [0, min(cap, base * 2^n)) (exponential backoff, full jitter) up to the
route's ``max_retries``; then the transition is *given up*: it keeps its desired state,
``promreflex_controller_transitions_failing`` counts it, and it is tried again (with a fresh
budget) only when something new arrives for the alert (a notification or reconciliation that
changes its status or startsAt, an absence and return) or when the controller restarts. A
failed fire starts the route's cooldown like a successful one.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from controllers.actions.base import Action, ActionContext, Deferred, registry
from controllers.audit import AuditLog
from controllers.metrics import ControllerMetrics
from controllers.models import Alert, WebhookPayload, alert_from_api
from controllers.store import StateStore
from promreflex.clients import why
from promreflex.config import ConfigError, ControllerConfig, Route, validation_problems
from promreflex.matchers import Matcher, matches_all

log = logging.getLogger("promreflex.controller")

FIRING, RESOLVED, ABSENT = "firing", "resolved", "absent"
# A resolved episode that Alertmanager lists as active in a listing asked for this long after
# the resolved notification is back (see Engine._back_after_resolved): a margin for a listing
# from another member of an Alertmanager cluster that resolves a moment later.
REOPEN_AFTER = 5.0
RETRY_BASE = 1.0  # seconds: the first retry waits up to this long
MAX_RETRY_DELAY = 60.0  # the backoff's cap
IN_FLIGHT = 256  # per action: transitions between their intent and their completion at once
GC_THRESHOLD = 50_000  # allocations between young collections (CPython's default: 700)
EXPIRE_EVERY = 1.0  # seconds between two sweeps of the dedupe and ordering memory


@dataclass
class BoundRoute:
    route: Route
    matchers: list[Matcher]
    action: Action
    params: Any

    @property
    def timeout(self) -> float:
        return self.route.timeout if self.route.timeout is not None else self.action.run_timeout(self.params)


@dataclass
class Entry:
    """One (route, alert): what should be and what is."""

    route: str
    alert: Alert
    desired: str
    applied: str = RESOLVED
    inflight: str | None = None  # the transition whose intent is recorded and not yet completed
    failures: int = 0
    failing: bool = False  # given up after max_retries; waits for new input
    not_before: float = 0.0  # loop time before which a retry must not run (backoff)
    retry: asyncio.TimerHandle | None = None


def bind_routes(cfg: ControllerConfig) -> list[BoundRoute]:
    """Check every route's action and parameters; report every problem at once."""
    actions = registry()
    instances: dict[str, Action] = {}
    # A host agent's routes see only its own targets' alerts: one more matcher on every route.
    owned = [Matcher(cfg.owner.label, "=", cfg.owner.resolved())] if cfg.owner is not None else []
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
        bound.append(BoundRoute(route, route.parsed_matchers() + owned, action, params))
    if problems:
        raise ConfigError("controller.routes", problems)
    return bound


def episode_start(alert: Alert) -> datetime:
    """The alert's ``startsAt`` at the precision both of Alertmanager's outputs share:
    notifications carry nanoseconds, ``GET /api/v2/alerts`` truncates to milliseconds. Compared
    at full precision, the API's copy of an episode would look older than the notified one
    (stale), and the reconciliation could never fire it again."""
    return alert.startsAt.replace(microsecond=alert.startsAt.microsecond // 1000 * 1000)


def dedupe_key(alert: Alert, status: str | None = None) -> tuple[str, str, str]:
    return (alert.fingerprint, status or alert.status, episode_start(alert).isoformat())


def retry_delay(failures: int, rng: Callable[[float, float], float] = random.uniform) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(failures-1)))."""
    return rng(0.0, min(MAX_RETRY_DELAY, RETRY_BASE * 2.0 ** max(0, failures - 1)))


class Engine:
    def __init__(
        self,
        cfg: ControllerConfig,
        metrics: ControllerMetrics,
        audit: AuditLog,
        services: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
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
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._last_fire: dict[tuple[str, str], float] = {}
        self._applied: dict[str, int] = {name: 0 for name in self.actions}
        self._tasks: set[asyncio.Task] = set()
        self._recheck_next: asyncio.Future[set[str] | None] | None = None
        self._recheck_runner: asyncio.Task | None = None
        self._closing = False
        self._last_expire = 0.0
        for b in self.routes.values():
            self.metrics.transitions_failing.labels(b.route.name, b.action.name).set(0)
        self.store = StateStore(cfg.state_file)
        self._load_state()

    # ------------------------------------------------------------------ persistence
    @property
    def actions(self) -> dict[str, Action]:
        return {b.action.name: b.action for b in self.routes.values()}

    def _load_state(self) -> None:
        now = self.clock()
        loaded = self.store.load(seen_since=now - self.cfg.dedupe_window)
        for row in loaded.entries:
            if row["route"] not in self.routes:
                log.warning("state names route %r that is no longer configured; dropped", row["route"])
                self.store.delete_entry(row["route"], row["fingerprint"])
                continue
            alert = Alert.model_validate(row["alert"])
            entry = Entry(route=row["route"], alert=alert, desired=row["desired"], applied=row["applied"])
            if row["inflight"] is not None:
                # Killed during a run: it may have done all, part or none of its work. Run the
                # desired transition again (whichever it is now): at least once, idempotent.
                entry.applied = RESOLVED if entry.desired == FIRING else FIRING
                self.metrics.interrupted.inc()
                self.audit.write("interrupted", route=entry.route, transition=row["inflight"],
                                 fingerprint=alert.fingerprint, startsAt=alert.startsAt.isoformat(), labels=alert.labels)
            elif entry.desired == entry.applied == RESOLVED:
                self.store.delete_entry(entry.route, alert.fingerprint)
                continue
            self.entries[(entry.route, alert.fingerprint)] = entry
            if entry.applied == FIRING:
                self._applied[self.routes[entry.route].action.name] += 1
        for fp, starts, status, at in loaded.latest:
            self._latest[fp] = (datetime.fromisoformat(starts), status, at)
        for fp, status, starts, at in loaded.seen:
            self._seen[(fp, status, starts)] = at
        self._last_fire.update({(r, t): at for r, t, at in loaded.last_fire})
        # Entries applied before the ordering memory existed (an imported JSON state file).
        for entry in self.entries.values():
            fp = entry.alert.fingerprint
            if fp not in self._latest:
                self._set_latest(fp, episode_start(entry.alert), entry.desired, now)
        self._update_applied_gauge()

    def _save(self, entry: Entry, alert: bool = False) -> None:
        """Queue the entry's row: whole with ``alert`` (the alert changed), else its states only."""
        if alert:
            self.store.put_entry(entry.route, entry.alert.fingerprint, entry.alert.model_dump_json(), entry.desired,
                                 entry.applied, entry.inflight)
        else:
            self.store.update_entry(entry.route, entry.alert.fingerprint, entry.desired, entry.applied, entry.inflight)

    def _set_latest(self, fp: str, starts: datetime, status: str, now: float) -> None:
        self._latest[fp] = (starts, status, now)
        self.store.put_latest(fp, starts.isoformat(), status, now)

    def _set_applied(self, entry: Entry, applied: str) -> None:
        if applied != entry.applied:
            self._applied[self.routes[entry.route].action.name] += 1 if applied == FIRING else -1
            entry.applied = applied
            self._update_applied_gauge()

    def _update_applied_gauge(self) -> None:
        for name, n in self._applied.items():
            self.metrics.applied.labels(name).set(n)

    def _update_failing_gauge(self, route: str) -> None:
        bound = self.routes[route]
        n = sum(1 for e in self.entries.values() if e.route == route and e.failing)
        self.metrics.transitions_failing.labels(route, bound.action.name).set(n)

    # ------------------------------------------------------------------ inputs
    async def handle_payload(self, payload: WebhookPayload) -> dict[str, int]:
        """Take one webhook notification; return counts by result once its effect on the desired
        state and the dedupe memory is on disk (answer the webhook only then). Never waits for
        an action."""
        counts = {"accepted": 0, "duplicate": 0, "stale": 0, "conflict": 0}
        now = self.clock()
        self._expire(now)
        added: list[tuple[str, str, str]] = []
        try:
            for alert in payload.alerts:
                key = dedupe_key(alert)
                if self._conflicts(alert):  # before the dedupe memory: the genuine one is not a duplicate
                    result = "conflict"
                elif key in self._seen:
                    result = "duplicate"
                else:
                    self._seen[key] = now
                    self.store.put_seen(key, now)
                    added.append(key)
                    result = self._observe(alert, now)
                counts[result] += 1
                self.metrics.notifications.labels(alert.status, result).inc()
                self.audit.write(
                    "notification", result=result, status=alert.status, fingerprint=alert.fingerprint,
                    startsAt=alert.startsAt.isoformat(), labels=alert.labels, groupKey=payload.groupKey,
                )
            self.metrics.last_notification.set(now)
            await self.store.commit()
        except BaseException:
            # Answered 500 so that Alertmanager retries: the retry must be taken, not be a
            # "duplicate" of a notification whose effect did not reach the disk (a full disk at
            # the commit) or was not recorded at all (an error while observing it).
            for key in added:
                self._seen.pop(key, None)
                self.store.delete_seen(key)
            raise
        return counts

    def _conflicts(self, alert: Alert) -> bool:
        """The fingerprint names an alert held with other labels. A fingerprint is
        Alertmanager's hash of the labels; one that arrives with other labels is not that alert
        (a forged or broken notification: with the webhook token, one took over a real alert's
        fingerprint with another site's label, so the real alert's resolve was "stale" and the
        reconcile resolved the wrong site): it changes nothing, and is not remembered as seen."""
        for name in self.routes:
            held = self.entries.get((name, alert.fingerprint))
            if held is not None and held.alert.labels != alert.labels:
                log.warning("notification for fingerprint %s with labels other than the alert held: ignored",
                            alert.fingerprint)
                return True
        return False

    def _observe(self, alert: Alert, now: float) -> str:
        """Record the alert's newest known status and set the desired state of matching routes.
        Returns "accepted" or "stale" (an older episode, or firing after resolved). Callers
        check :meth:`_conflicts` first."""
        latest = self._latest.get(alert.fingerprint)
        episode = episode_start(alert)
        if latest is not None:
            starts, status, _ = latest
            if episode < starts or (episode == starts and status == RESOLVED and alert.status == FIRING):
                return "stale"
        new = latest is None or latest[:2] != (episode, alert.status)
        if new:
            self._set_latest(alert.fingerprint, episode, alert.status, now)
        for name, bound in self.routes.items():
            if not matches_all(bound.matchers, alert.labels):
                continue
            key = (name, alert.fingerprint)
            entry = self.entries.get(key)
            if entry is None:
                if alert.status == RESOLVED:
                    continue  # never applied: nothing to undo
                entry = self.entries[key] = Entry(route=name, alert=alert, desired=FIRING)
            elif not new and entry.desired == alert.status:
                if entry.desired != entry.applied:
                    self.kick(key)  # nothing new; converge still runs only after any backoff
                continue
            entry.alert, entry.desired = alert, alert.status
            self._fresh_budget(entry)
            self._save(entry, alert=True)
            self.kick(key)
        return "accepted"

    def _fresh_budget(self, entry: Entry) -> None:
        """New input for an alert: a given-up or backing-off transition is tried again now."""
        was_failing = entry.failing
        entry.failures, entry.failing, entry.not_before = 0, False, 0.0
        if entry.retry is not None:
            entry.retry.cancel()
            entry.retry = None
        if was_failing:
            self._update_failing_gauge(entry.route)

    def _absent(self, entry: Entry, now: float) -> None:
        """The alert left Alertmanager's active view: resolve it, and let the same episode fire
        again if it comes back (a new generation: its dedupe keys are forgotten)."""
        alert = entry.alert
        self._set_latest(alert.fingerprint, episode_start(alert), ABSENT, now)
        self._forget_episode(alert)
        for route in self.routes:
            key = (route, alert.fingerprint)
            other = self.entries.get(key)
            if other is not None and other.desired == FIRING:
                other.desired = RESOLVED
                self._fresh_budget(other)
                self._save(other)
                self.kick(key)

    def _back_after_resolved(self, alert: Alert, asked: float, now: float) -> None:
        """Alertmanager lists as active an episode that a resolved notification ended before this
        listing was asked for (by :data:`REOPEN_AFTER` s): it started again with the same
        ``startsAt``. Alertmanager resolves an alert whose ``endsAt`` passed when Prometheus's
        re-sends stopped (a partition, a stalled evaluation); Prometheus keeps the start of an
        alert that stayed active, and Alertmanager stores the re-sent one as a new alert. Its
        firing notification is then a "duplicate" of the first; the listing says what is true
        now, so the episode starts a new generation, as after an absence."""
        latest = self._latest.get(alert.fingerprint)
        if latest is None:
            return
        starts, status, at = latest
        if status != RESOLVED or starts != episode_start(alert) or at > asked - REOPEN_AFTER:
            return
        log.info("alert %s is active again in Alertmanager after its resolved notification: a new generation",
                 alert.fingerprint)
        self._forget_episode(alert)
        self._set_latest(alert.fingerprint, starts, ABSENT, now)

    def _forget_episode(self, alert: Alert) -> None:
        for status in (FIRING, RESOLVED):
            seen = dedupe_key(alert, status)
            if self._seen.pop(seen, None) is not None:
                self.store.delete_seen(seen)

    def _expire(self, now: float) -> None:
        if now - self._last_expire < EXPIRE_EVERY:
            return
        self._last_expire = now
        cutoff = now - self.cfg.dedupe_window
        while self._seen and next(iter(self._seen.values())) < cutoff:
            self._seen.popitem(last=False)
        self.store.expire_seen(cutoff)
        for fp in [fp for fp, (_, status, at) in self._latest.items() if at < cutoff and status != FIRING]:
            del self._latest[fp]
            self.store.delete_latest(fp)

    async def reconcile(self) -> dict[str, int]:
        """Converge on Alertmanager's active alerts: fire what is active and not applied,
        resolve what is desired firing and no longer active (an absence, see the module doc)."""
        am = self.services.get("alertmanager")
        if am is None:
            return {}
        asked = self.clock()
        try:
            items = await am.active_alerts()
            active = [alert_from_api(i) for i in items]
        except Exception as e:  # noqa: BLE001 - any failure is a counted, logged reconcile error
            self.metrics.reconcile_runs.labels("error").inc()
            self.audit.write("reconcile", result="error", error=why(e))
            log.warning("reconcile failed: %s", why(e))
            return {}
        now = self.clock()
        self._expire(now)
        active_fps = {a.fingerprint for a in active}
        for alert in active:
            if not self._conflicts(alert):
                self._back_after_resolved(alert, asked, now)
                self._observe(alert, now)
        resolved = 0
        for entry in list(self.entries.values()):
            if entry.alert.fingerprint not in active_fps and entry.desired == FIRING and entry.alert.source == "alertmanager":
                self._absent(entry, now)
                resolved += 1
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
        # At most IN_FLIGHT transitions of one action past their target lock: a burst of thousands
        # must not fill the event loop's ready queue ahead of the webhooks (their latency).
        gate = self._gates.setdefault(action.name, asyncio.Semaphore(IN_FLIGHT))
        async with lock, gate:
            again = await self._transition(key, bound, target)
        if again:
            self.kick(key)

    async def _transition(self, key: tuple[str, str], bound: BoundRoute, target: str) -> bool:
        """Run at most one transition of ``key`` (the target's lock held). Returns True when the
        desired state changed meanwhile and another pass is needed."""
        entry = self.entries.get(key)
        if entry is None:
            return False
        if entry.desired == entry.applied:
            self._forget_if_done(key, entry)
            return False
        if entry.failing:
            return False
        loop = asyncio.get_running_loop()
        if loop.time() < entry.not_before:
            return False  # backing off: the retry timer kicks it
        action = bound.action
        transition = "fire" if entry.desired == FIRING else "resolve"
        if transition == "fire":
            wait = self._cooldown_left(bound, target)
            if wait > 0:
                self._record(entry, action, transition, "cooldown", f"cooldown: {wait:.1f}s left", 0.0)
                self._schedule_retry(key, entry, wait)
                return False
            if not await self._still_active(entry):
                self._record(entry, action, transition, "skipped", "no longer active in Alertmanager", 0.0)
                self._absent(entry, self.clock())
                return False
        # The intent, durable before the action runs: a SIGKILL from here on re-runs it at start.
        ctx = self._ctx(entry)
        entry.inflight = transition
        self._save(entry)
        await self.store.commit()
        if entry.desired == entry.applied:  # changed back while the intent was written: nothing to do
            entry.inflight = None
            self._save(entry)
            self._forget_if_done(key, entry)
            await self.store.commit()
            return False
        error = detail = ""
        deferred: Deferred | None = None
        sem = self._action_sems.setdefault(action.name, asyncio.Semaphore(action.concurrency))
        async with sem:
            started = time.monotonic()
            try:
                run = action.fire(ctx) if transition == "fire" else action.resolve(ctx)
                detail = await asyncio.wait_for(run, timeout=bound.timeout)
            except TimeoutError:
                error = f"timed out after {bound.timeout:g}s (cancelled)"
            except Deferred as e:
                deferred = e
            except Exception as e:  # noqa: BLE001 - an action's failure is counted, audited, retried
                error = f"{type(e).__name__}: {e}"
                log.warning("action %s %s failed for %s: %s", action.name, transition, key, error)
        seconds = time.monotonic() - started
        entry.inflight = None
        if deferred is not None:  # not done, not failed: again later, if still wanted
            self._save(entry)
            self._record(entry, action, transition, "deferred", f"{deferred}; again in {deferred.seconds:.0f}s", seconds)
            entry.not_before = loop.time() + deferred.seconds
            self._schedule_retry(key, entry, deferred.seconds)
            await self.store.commit()
            return False
        if transition == "fire" and bound.route.cooldown > 0:
            self._last_fire[(entry.route, target)] = now = self.clock()
            self.store.put_last_fire(entry.route, target, now)
        if error:
            self._failed(key, entry, bound, transition, error, seconds)
        else:
            entry.failures = 0
            self._set_applied(entry, FIRING if transition == "fire" else RESOLVED)
            self._record(entry, action, transition, "ok", detail, seconds)
            self._save(entry)
            self._forget_if_done(key, entry)
        # The completion, durable before the target's lock is released.
        await self.store.commit()
        current = self.entries.get(key)
        return current is not None and current.desired != current.applied and not current.failing \
            and current.retry is None

    def _failed(self, key: tuple[str, str], entry: Entry, bound: BoundRoute, transition: str, error: str,
                seconds: float) -> None:
        entry.failures += 1
        self._save(entry)
        if entry.desired == entry.applied:  # no longer wanted (it changed back during the run)
            self._record(entry, bound.action, transition, "error", f"{error}; no longer wanted", seconds)
            entry.failures = 0
            self._forget_if_done(key, entry)
            return
        if entry.failures > bound.route.max_retries:
            entry.failing = True
            self._record(entry, bound.action, transition, "error",
                         f"{error}; gave up after {entry.failures} runs", seconds)
            self._update_failing_gauge(entry.route)
            log.error("gave up on %s %s for %s after %d failed runs: %s", bound.action.name, transition, key,
                      entry.failures, error)
            return
        delay = retry_delay(entry.failures)
        self._record(entry, bound.action, transition, "error", f"{error}; retry in {delay:.1f}s", seconds)
        entry.not_before = asyncio.get_running_loop().time() + delay
        self._schedule_retry(key, entry, delay)

    def _cooldown_left(self, bound: BoundRoute, target: str) -> float:
        last = self._last_fire.get((bound.route.name, target))
        if last is None or bound.route.cooldown <= 0:
            return 0.0
        return max(0.0, last + bound.route.cooldown - self.clock())

    async def _still_active(self, entry: Entry) -> bool:
        """Re-check with Alertmanager before acting; if it cannot be asked, trust the notification."""
        if self.services.get("alertmanager") is None or entry.alert.source != "alertmanager":
            return True
        active = await self._active_fingerprints()
        return active is None or entry.alert.fingerprint in active

    async def _active_fingerprints(self) -> set[str] | None:
        """Alertmanager's active fingerprints, read *after* this call began (None: it cannot be
        asked). Concurrent callers share one request: a burst of 5,000 fires asks a few times,
        not 5,000 times."""
        if self._recheck_next is None:
            self._recheck_next = asyncio.get_running_loop().create_future()
            if self._recheck_runner is None or self._recheck_runner.done():
                self._recheck_runner = asyncio.get_running_loop().create_task(self._run_rechecks())
        return await asyncio.shield(self._recheck_next)

    async def _run_rechecks(self) -> None:
        am = self.services["alertmanager"]
        while self._recheck_next is not None:
            waiting, self._recheck_next = self._recheck_next, None
            try:
                items = await am.active_alerts()
                waiting.set_result({i.get("fingerprint") or "" for i in items})
            except Exception as e:  # noqa: BLE001
                log.warning("could not re-check with Alertmanager (%r); acting on the notification", e)
                waiting.set_result(None)

    def _schedule_retry(self, key: tuple[str, str], entry: Entry, delay: float) -> None:
        if entry.retry is not None:
            entry.retry.cancel()
        entry.retry = asyncio.get_running_loop().call_later(delay, self._retry, key)

    def _retry(self, key: tuple[str, str]) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.retry = None
            entry.not_before = 0.0
            self.kick(key)

    def _forget_if_done(self, key: tuple[str, str], entry: Entry) -> None:
        if entry.desired == RESOLVED and entry.applied == RESOLVED and entry.inflight is None:
            if entry.retry is not None:
                entry.retry.cancel()
            self.entries.pop(key, None)
            self.store.delete_entry(*key)
            if entry.failing:
                self._update_failing_gauge(entry.route)

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
        # What exists now (modules, configuration, the loaded state) lives as long as the
        # process: keep it out of the garbage collector's full passes, which otherwise stall
        # the event loop for tens of milliseconds at a time under a burst (halved webhook p99).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        # Resume what the previous process left undone (interrupted runs, pending transitions).
        for key, entry in list(self.entries.items()):
            if entry.desired != entry.applied:
                self.kick(key)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for running transitions to finish (bounded)."""
        deadline = time.monotonic() + timeout
        while self._tasks and time.monotonic() < deadline:
            await asyncio.wait(list(self._tasks), timeout=deadline - time.monotonic())

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
        await asyncio.to_thread(self.store.close)

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"route": e.route, "fingerprint": e.alert.fingerprint, "alertname": e.alert.name,
             "desired": e.desired, "applied": e.applied, "failures": e.failures, "failing": e.failing}
            for e in self.entries.values()
        ]
