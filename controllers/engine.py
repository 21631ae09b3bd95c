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
is stale and ignored: late deliveries cannot re-fire an action. A resolve with an older startsAt
that ends after the held firing episode began is that episode's end (Alertmanager merges the
copies of an alert from a Prometheus HA pair and keeps the earliest startsAt, so the resolve of
what was notified firing with one replica's startsAt can carry the other's). A notification whose
(fingerprint, status, startsAt) was seen within ``dedupe_window`` is a duplicate. startsAt is
compared at millisecond precision (what Alertmanager's API keeps; notifications carry more).

Absence: an alert that leaves Alertmanager's active view while it is desired firing (a silence
starts, an inhibition applies, it ends, or the pre-fire re-check does not find it) is resolved
by the reconciliation ("silencing means stop acting on it"). Alertmanager's peers do not gossip
alerts, and a peer that (re)started lists none until Prometheus re-sends them (its resend delay,
1 m by default, plus an evaluation): so the reconciliation reads every configured peer, an alert
is present when any peer lists it, and absent only when no peer that answered lists it *and*
one of them is a witness: a peer running for ``alertmanager_restart_grace`` or more, one that
listed this alert since it started, or one that started before the alert's episode (Prometheus
sends a new alert to every Alertmanager at once). A rolling restart of the cluster (or of a single
Alertmanager) therefore defers absence decisions instead of undoing every action; an alert that
truly ended meanwhile is resolved by its notification, or once the grace has passed. That
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
alert is still silenced or inhibited. The re-check reads the peer reads stick to; when that one
does not list the alert, every peer (Prometheus posts to each peer separately: the one that
notified may hold it a moment before the others). An action that confirms after a restart what
it held before, or whether what it keeps still fires, asks the same rule, never one peer:
``services["alertmanager_presence"]`` (:meth:`Engine.presence`).

Routing: the reconciliation fires only alerts Alertmanager routes to ``alertmanager_receiver``
(one name or a list; a notification from another receiver is said once in the log) (the
``receivers`` of each listed alert; when Alertmanager knows none of those receivers, every
alert, with a warning) and, with ``reconcile_fire_after``, only alerts active for that long (a
route's ``group_wait``). Absence is judged on every active alert, routed here or not. Time
interval mutes are not in Alertmanager 0.25's API: they do not stop the reconciliation (use
silences).

Durability, the guarantee: *at least once per transition; a completed transition is never run
again.* Before answering a webhook, its effect on the desired state and the dedupe memory is
committed (:meth:`Engine.handle_payload` returns after the commit). Before an action runs, the
intent (the transition in flight) is committed; after it returns, the applied state is
committed before the target's lock is released. A SIGKILL at any point therefore loses no
accepted notification. A run interrupted between its intent and its completion (found at
start, counted in ``promreflex_controller_interrupted_transitions_total``, audited as
``interrupted``), and a run that failed or timed out, may have done all, part or none of its
work: the entry's applied state becomes ``unknown``, and whichever transition is desired then
(at start, or when the alert ends or comes back) runs, ``resolve`` included: an entry whose
fire may have partly run is never forgotten without its resolve. Actions must be idempotent.

Bindings: the state keeps, per route, the route as configured when its entries were applied.
A route that a reload or a start no longer configures keeps resolving what it applied (it
matches nothing new); a route whose ``action`` changes, or whose params change the target the
action names (``Action.target``), is *retired*: its applied entries move to ``<route>~<old
action>``, resolved with the old binding, and the new binding starts fresh, its fire waiting
for that resolve.

Failures: each run is cancelled after its timeout; a failed or timed-out run is retried after
a random delay in [0, min(cap, base * 2^n)) (exponential backoff, full jitter) up to the
route's ``max_retries`` (its applied state is ``unknown`` from the first failure on); then the
transition is *given up*: it keeps its desired state,
``promreflex_controller_transitions_failing`` counts it, and it is tried again (with a fresh
budget) only when something new arrives for the alert (a notification or reconciliation that
changes its status or startsAt, an absence and return) or when the controller restarts. A
failed fire starts the route's cooldown like a successful one.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import random
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, UTC
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from controllers.actions.base import Action, ActionContext, Deferred, broken_actions, registry
from controllers.audit import AuditLog
from controllers.metrics import ControllerMetrics
from controllers.models import FINGERPRINT, Alert, WebhookPayload, alert_from_api, fingerprint
from controllers.store import StateStore
from promreflex.clients import PeerAlerts, why
from promreflex.config import ConfigError, ControllerConfig, Owner, Route, validation_problems
from promreflex.matchers import Matcher, matches_all, parse_matcher

log = logging.getLogger("promreflex.controller")

FIRING, RESOLVED, ABSENT = "firing", "resolved", "absent"
# An entry's applied state after a run that may have done all, part or none of its work (killed
# during it, failed, timed out): equal to no desired state, so the desired transition runs.
UNKNOWN = "unknown"
# A startsAt further in the future than this (clock skew between the sender and us) is not an
# alert's real start: such an alert is skipped ("future"), so that it cannot make the real
# episodes "stale" in the ordering memory.
FUTURE_MARGIN = 300.0
#: A route that is no longer configured keeps resolving what it applied, but matches no alert.
NEVER = parse_matcher('__promreflex_route_removed__="1"')
# An Alertmanager that started this long before an episode's startsAt was up (and listening)
# when Prometheus sent the new alert to every Alertmanager: its silence about it is believed
# (a margin for its start-up and for clock skew between the hosts).
STARTED_BEFORE = 5.0
T = TypeVar("T")
# A resolved episode that Alertmanager lists as active in a listing asked for this long after
# the resolved notification is back (see Engine._back_after_resolved): a margin for a listing
# from another member of an Alertmanager cluster that resolves a moment later.
REOPEN_AFTER = 5.0
RETRY_BASE = 1.0  # seconds: the first retry waits up to this long
MAX_RETRY_DELAY = 60.0  # the backoff's cap
IN_FLIGHT = 256  # per action: transitions between their intent and their completion at once
GC_THRESHOLD = 50_000  # allocations between young collections (CPython's default: 700)
EXPIRE_EVERY = 1.0  # seconds between two sweeps of the dedupe and ordering memory
#: The service (in ``services``, with an Alertmanager) that tells actions whether alerts are
#: still active, judged as the reconciliation judges an absence: :meth:`Engine.presence`.
PRESENCE = "alertmanager_presence"


@dataclass
class BoundRoute:
    route: Route
    matchers: list[Matcher]
    action: Action
    params: Any
    # No longer configured (removed, or an old binding of a route whose action or target
    # changed): matches nothing, kept to resolve what it applied.
    lingering: bool = False
    retired_from: str | None = None  # the configured route whose old binding this is

    @property
    def timeout(self) -> float:
        return self.route.timeout if self.route.timeout is not None else self.action.run_timeout(self.params)

    def binding(self) -> str:
        """What the state keeps of this route, to resolve its entries after it is gone."""
        return json.dumps({"route": self.route.model_dump(mode="json"), "retired_from": self.retired_from})

    def linger(self, retired_from: str | None = None) -> BoundRoute:
        return replace(self, matchers=[NEVER], lingering=True, retired_from=retired_from or self.retired_from)


@dataclass
class Entry:
    """One (route, alert): what should be and what is."""

    route: str
    alert: Alert
    desired: str
    applied: str = RESOLVED  # FIRING, RESOLVED or UNKNOWN
    inflight: str | None = None  # the transition whose intent is recorded and not yet completed
    failures: int = 0
    failing: bool = False  # given up after max_retries; waits for new input
    not_before: float = 0.0  # loop time before which a retry must not run (backoff)
    retry: asyncio.TimerHandle | None = None


def _owner_matcher(owner: Owner) -> Matcher:
    """Its own value; with ``match_absent`` also no value (Alertmanager's absent label is "")."""
    if not owner.match_absent:
        return Matcher(owner.label, "=", owner.resolved())
    pattern = f"(?:{re.escape(owner.resolved())})?"
    return Matcher(owner.label, "=~", pattern, re.compile(pattern))


def bind_routes(cfg: ControllerConfig) -> list[BoundRoute]:
    """Check every route's action and parameters; report every problem at once."""
    actions = registry()
    instances: dict[str, Action] = {}
    # A host agent's routes see only its own targets' alerts: one more matcher on every route.
    owned = [_owner_matcher(cfg.owner)] if cfg.owner is not None else []
    bound, problems = [], []
    for i, route in enumerate(cfg.routes):
        cls = actions.get(route.action)
        if cls is None:
            broken = "".join(f"; {where} not loaded: {why}" for where, why in sorted(broken_actions().items()))
            problems.append(f"controller.routes[{i}].action: unknown action {route.action!r} "
                            f"(known: {', '.join(sorted(actions))}{broken})")
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


def wanted(entry: Entry) -> str | None:
    """The transition that converges ``entry`` ("fire", "resolve"), or None when it is converged."""
    if entry.desired == entry.applied:
        return None
    return "fire" if entry.desired == FIRING else "resolve"


def api_fingerprint(item: dict[str, Any]) -> str:
    """An alert's fingerprint as :func:`alert_from_api` makes it, without building the alert."""
    fp = item.get("fingerprint")
    if isinstance(fp, str) and FINGERPRINT.fullmatch(fp):
        return fp
    labels = item.get("labels")
    return fingerprint(labels) if isinstance(labels, dict) else ""


class SharedRead(Generic[T]):
    """Concurrent callers share one read that began after each of them asked: a burst of 5,000
    fires asks Alertmanager a few times, not 5,000 times."""

    def __init__(self, read: Callable[[], Awaitable[T]]):
        self._read = read
        self._next: asyncio.Future[T] | None = None
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.create_future()
            if self._runner is None or self._runner.done():
                self._runner = loop.create_task(self._run())
        return await asyncio.shield(self._next)

    async def _run(self) -> None:
        while self._next is not None:
            waiting, self._next = self._next, None
            try:
                waiting.set_result(await self._read())
            except Exception as e:  # noqa: BLE001 - handed to every caller of this read
                waiting.set_exception(e)


@dataclass
class PeerMemory:
    """What one Alertmanager peer listed since it started (to tell "ended" from "not re-sent")."""

    started: datetime | None
    listed: set[str] = field(default_factory=set)
    # Every (start, name) this URL answered with: a real peer moves to a new one when it restarts
    # and never returns to an old one; a URL that does reaches several Alertmanagers (``shared``).
    seen: list[tuple[datetime | None, str | None]] = field(default_factory=list)
    last: tuple[datetime | None, str | None] | None = None  # the last of them read
    shared: bool = False


@dataclass
class ClusterView:
    """Every peer's answer to one read: the union of their active alerts, and who may say an
    alert is absent."""

    present: dict[str, tuple[Alert, dict[str, Any]]]  # fingerprint -> (alert, API item), any peer
    # Per peer that answered: (running past the grace, what it listed since it started, when it started)
    witnesses: list[tuple[bool, set[str], datetime | None]]
    young: list[str]  # peers that answered and started within the grace

    def proves_absent(self, fp: str, starts: datetime | None = None) -> bool:
        """No peer lists ``fp`` (callers check), and one that answered can be believed: it runs
        past the grace, it listed ``fp`` since it started (it had it, and dropped it), or it
        started before the episode that began at ``starts`` (it was sent the alert then)."""
        before = starts - timedelta(seconds=STARTED_BEFORE) if starts is not None else None
        return any(settled or fp in listed or (before is not None and started is not None and started <= before)
                   for settled, listed, started in self.witnesses)



def _names(receiver: str | list[str] | None) -> set[str]:
    """``alertmanager_receiver`` as a set: a name and a one-item list are the same setting."""
    return set() if not receiver else {receiver} if isinstance(receiver, str) else set(receiver)

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
        self._peers: dict[str, PeerMemory] = {}
        self._shared_warned: set[str] = set()  # URLs said to reach several Alertmanagers
        self._receiver_known: bool | None = None
        self._receivers_said: set[str] = set()  # receivers not named by alertmanager_receiver, said once
        self._recheck: SharedRead[set[str] | None] = SharedRead(self._read_first_peer)
        self._recheck_all: SharedRead[list[PeerAlerts] | None] = SharedRead(self._read_every_peer)
        self._presence_reads: dict[tuple[bool, bool], SharedRead[list[PeerAlerts]]] = {
            (inh, sil): SharedRead(functools.partial(self._read_peers, inhibited=inh, silenced=sil))
            for inh in (False, True) for sil in (False, True)}
        if self.services.get("alertmanager") is not None:
            self.services[PRESENCE] = self.presence
        self._closing = False
        self._last_expire = 0.0
        # Every action instance started in this process, by name: one whose routes a reload
        # removed and a later reload adds again gets this instance back (its metrics are in the
        # registry, its held targets and leases in it), never a second one.
        self.started_actions: dict[str, Action] = {}
        for b in self.routes.values():
            self.metrics.transitions_failing.labels(b.route.name, b.action.name).set(0)
        self.store = StateStore(cfg.state_file)
        self._load_state()

    # ------------------------------------------------------------------ persistence
    @property
    def actions(self) -> dict[str, Action]:
        return {b.action.name: b.action for b in self.routes.values()}

    @property
    def known_actions(self) -> dict[str, Action]:
        """The routes' actions and every other instance this process started (a reload removed
        its routes): the instances a reload reuses and a shutdown stops."""
        return {**self.started_actions, **self.actions}

    def _load_state(self) -> None:
        now = self.clock()
        loaded = self.store.load(seen_since=now - self.cfg.dedupe_window)
        configured = dict(self.routes)
        # The bindings the entries were applied with (schema 2 on); a row of a route that is
        # configured and has none (a database from before) was applied by the configured one.
        stored: dict[str, BoundRoute] = {}
        unusable: dict[str, str] = {}
        for name, binding in loaded.bindings.items():
            try:
                stored[name] = self._bind_stored(binding)
            except (ValueError, ConfigError, ValidationError) as e:  # an action no longer installed, ...
                unusable[name] = str(e).replace("\n", " ")[:300]
        unresolvable: Counter[str] = Counter()
        for row in loaded.entries:
            name = row["route"]
            alert = Alert.model_validate(row["alert"])
            if name not in configured and name not in stored:
                # Kept on disk: configuring the route again resolves it.
                unresolvable[name] += 1
                continue
            entry = Entry(route=name, alert=alert, desired=row["desired"], applied=row["applied"])
            if row["inflight"] is not None:
                # Killed during a run: it may have done all, part or none of its work. Its
                # applied state is unknown: the desired transition (whichever it is now, or
                # becomes) runs. At least once, idempotent.
                entry.applied = UNKNOWN
                self.metrics.interrupted.inc()
                self.audit.write("interrupted", route=entry.route, transition=row["inflight"],
                                 fingerprint=alert.fingerprint, startsAt=alert.startsAt.isoformat(), labels=alert.labels,
                                 desired=entry.desired, applied=UNKNOWN, then=wanted(entry))
                self._save(entry)
            elif entry.desired == entry.applied == RESOLVED:
                self.store.delete_entry(entry.route, alert.fingerprint)
                continue
            self.entries[(entry.route, alert.fingerprint)] = entry
        for name, n in unresolvable.items():
            why_not = unusable.get(name, "the state does not say which action applied them (written before bindings "
                                         "were kept)")
            log.error("state names route %r that is no longer configured, with %d alert(s) it may have applied; "
                      "cannot resolve them: %s. Kept: configure the route again to resolve them", name, n, why_not)
            self.audit.write("retired", route=name, result="error", alerts=n,
                             detail=f"route no longer configured; cannot resolve: {why_not}; kept in the state")
        old = {name: stored.get(name) or configured[name] for name in {r for r, _ in self.entries}}
        summary, _ = self._rebind(old, configured)
        for key, entry in list(self.entries.items()):  # resolved by the rebind before anything was applied
            if entry.desired == entry.applied == RESOLVED and entry.inflight is None:
                del self.entries[key]
                self.store.delete_entry(*key)
        for item in summary["retired"]:
            log.warning("route %r: %s; its %d applied alert(s) resolve with the old binding (as %r)",
                        item["route"], item["why"], item["alerts"], item["as"])
            self.audit.write("retired", result="ok", **item)
        held = Counter(r for r, _ in self.entries)
        for name in [n for n, b in self.routes.items() if b.lingering and not held[n]]:
            del self.routes[name]  # nothing left to resolve
        for name in summary["lingering"]:
            if not held[name]:
                continue
            b = self.routes[name]
            why_lingering = (f"an old binding of route {b.retired_from!r}" if b.retired_from
                             else "route no longer configured")
            log.warning("state names route %r (%s): its %d alert(s) are resolved with the binding that applied them",
                        name, why_lingering, held[name])
            self.audit.write("retired", result="ok", route=name, action=b.action.name, alerts=held[name],
                             why=why_lingering, resolving=held[name])
        horizon = datetime.now(UTC) + timedelta(seconds=FUTURE_MARGIN)
        for fp, starts, status, at in loaded.latest:
            episode = datetime.fromisoformat(starts)
            if episode > horizon:  # written before future startsAt were skipped: it blocks the real episodes
                log.warning("ordering memory of alert %s names an episode that starts at %s, in the future: "
                            "forgotten", fp, starts)
                self.store.delete_latest(fp)
                continue
            self._latest[fp] = (episode, status, at)
        for fp, status, starts, at in loaded.seen:
            self._seen[(fp, status, starts)] = at
        self._last_fire.update({(r, t): at for r, t, at in loaded.last_fire})
        # Entries applied before the ordering memory existed (an imported JSON state file).
        for entry in self.entries.values():
            fp = entry.alert.fingerprint
            if fp not in self._latest:
                self._set_latest(fp, episode_start(entry.alert), entry.desired, now)
        self._store_bindings(set(loaded.bindings) - set(unresolvable))
        self._recount_applied()

    def _bind_stored(self, binding: str) -> BoundRoute:
        """A stored binding (:meth:`BoundRoute.binding`) bound again, lingering: its action's
        running instance when one of the routes uses it."""
        data = json.loads(binding)
        route = Route.model_validate(data["route"])
        cls = registry().get(route.action)
        if cls is None:
            raise ValueError(f"action {route.action!r} is not installed")
        params = cls.Params.model_validate(route.params)
        action = self.actions.get(route.action) or cls()
        return BoundRoute(route, [NEVER], action, params, lingering=True, retired_from=data.get("retired_from"))

    def _store_bindings(self, before: set[str]) -> None:
        """Keep every route's binding; forget those of routes gone with their entries."""
        for name, b in self.routes.items():
            self.store.put_binding(name, b.binding())
        for name in before - set(self.routes):
            self.store.delete_binding(name)

    def _binding_differs(self, old: BoundRoute, new: BoundRoute, alert: Alert) -> bool:
        """``old`` and ``new`` act on different things for ``alert``: another action, or a
        target the action names differently (params that name it: a URL, a file)."""
        if old.action.name != new.action.name:
            return True
        try:
            return (old.action.target(ActionContext(old.route.name, alert, old.params, self.services))
                    != new.action.target(ActionContext(new.route.name, alert, new.params, self.services)))
        except Exception:  # noqa: BLE001 - cannot tell: resolve with the old binding, to be safe
            log.exception("route %s: cannot compare the targets of its old and new binding", new.route.name)
            return True

    def _retired_name(self, name: str, old: BoundRoute, taken: dict[str, BoundRoute]) -> str:
        base = f"{name}~{old.action.name}"
        candidate, n = base, 1
        while candidate in taken or any(r == candidate for r, _ in self.entries):
            n += 1
            candidate = f"{base}~{n}"
        return candidate

    def _rebind(self, old: dict[str, BoundRoute], new: dict[str, BoundRoute]
                ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Swap the routes for ``new`` (configured), given ``old``, the bindings the current
        entries were applied with (a reload: the running routes; a start: the stored ones).

        - A route with entries that ``new`` no longer has lingers: it matches nothing, and its
          entries desired firing are resolved with the binding that applied them.
        - A route whose action, or whose action's target for an alert, differs between ``old``
          and ``new``: its entries that may be applied are *retired*: moved to
          ``<route>~<old action>``, a lingering copy of the old binding, and resolved; the new
          binding starts fresh (desired firing when they were), its fire waiting for them.
        - Entries desired firing whose alert no longer matches its route's matchers resolve.

        Returns a summary and the keys to kick (converge) once the event loop runs."""
        routes = dict(new)
        by_route: dict[str, list[tuple[str, str]]] = {}
        for key in self.entries:
            by_route.setdefault(key[0], []).append(key)
        retired: list[dict[str, Any]] = []
        lingering: list[str] = []
        moves: list[tuple[tuple[str, str], str]] = []
        for name, keys in sorted(by_route.items()):
            ob, nb = old.get(name), new.get(name)
            if nb is None:
                if ob is not None:
                    routes[name] = ob if ob.lingering else ob.linger()
                    if not ob.lingering or name not in self.routes:
                        lingering.append(name)
                continue
            if ob is None:
                continue
            moving = [k for k in keys if self.entries[k].applied != RESOLVED
                      and self._binding_differs(ob, nb, self.entries[k].alert)]
            if not moving:
                continue
            as_name = self._retired_name(name, ob, routes)
            routes[as_name] = ob.linger(retired_from=name)
            moves += [(k, as_name) for k in moving]
            why_retired = (f"action changed from {ob.action.name} to {nb.action.name}" if ob.action.name != nb.action.name
                           else f"its params changed the target of action {ob.action.name}")
            retired.append({"route": name, "action": ob.action.name, "as": as_name, "alerts": len(moving),
                            "why": why_retired})
        self.routes = routes
        kick: list[tuple[str, str]] = []
        for (name, fp), as_name in moves:
            entry = self.entries.pop((name, fp))
            was_firing = entry.desired == FIRING
            self._fresh_budget(entry)
            self.store.delete_entry(name, fp)
            entry.route, entry.desired = as_name, RESOLVED
            self.entries[(as_name, fp)] = entry
            self._save(entry, alert=True)
            kick.append((as_name, fp))
            if was_firing:  # the new binding starts fresh
                fresh = self.entries[(name, fp)] = Entry(route=name, alert=entry.alert, desired=FIRING)
                self._save(fresh, alert=True)
                kick.append((name, fp))
        resolving = len(moves)
        for key, entry in self.entries.items():
            if entry.desired == FIRING and not matches_all(routes[entry.route].matchers, entry.alert.labels):
                entry.desired = RESOLVED
                self._fresh_budget(entry)
                self._save(entry)
                kick.append(key)
                resolving += entry.applied != RESOLVED
        for item in retired:
            item["resolving"] = item["alerts"]
        return {"retired": retired, "lingering": lingering, "resolving": resolving}, kick

    async def apply_routes(self, bound: list[BoundRoute], cfg: ControllerConfig) -> dict[str, Any]:
        """A reload: swap the routes for ``bound`` (checked, their actions' instances shared
        with the running ones), keeping the state; start the actions that are new. See
        :meth:`_rebind` for what happens to the entries. Returns what changed."""
        previous = self.routes
        running = self.known_actions
        configured_before = {n for n, b in previous.items() if not b.lingering}
        new = {b.route.name: b for b in bound}
        changed = sorted(n for n in new if n in configured_before and new[n].route != previous[n].route)
        added, removed = sorted(set(new) - configured_before), sorted(configured_before - set(new))
        before = set(previous)
        summary, kick = self._rebind(previous, new)
        # alertmanager_receiver is read at each reconciliation: a reload changes it (a receiver
        # added for a second team); receivers it now names or not are said again.
        if self._receiver_names() != _names(cfg.alertmanager_receiver):
            self._receivers_said.clear()
            self._receiver_known = None
        self.cfg = self.cfg.model_copy(update={"routes": cfg.routes, "alertmanager_receiver": cfg.alertmanager_receiver})
        for action in {id(b.action): b.action for b in self.routes.values()}.values():
            action.route_params = [b.params for b in self.routes.values() if b.action is action and not b.lingering]
        started: set[str] = set()
        for b in self.routes.values():
            if b.action.name not in running and b.action.name not in started:
                started.add(b.action.name)
                self._applied.setdefault(b.action.name, 0)
                await b.action.start(self.services)
                self.started_actions[b.action.name] = b.action
        self._store_bindings(before)
        self._recount_applied()
        self._refresh_failing_gauges(previous)
        for key in kick:
            self.kick(key)
        await self.store.commit()
        return {"routes": sorted(new), "added": added, "changed": changed, "removed": removed,
                "resolving": summary["resolving"], "retired": summary["retired"]}

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
        if applied == entry.applied:
            return
        delta = (applied == FIRING) - (entry.applied == FIRING)
        entry.applied = applied
        if delta:
            name = self.routes[entry.route].action.name
            self._applied[name] = max(0, self._applied.get(name, 0) + delta)
            self._update_applied_gauge()

    def _recount_applied(self) -> None:
        counts = Counter(self.routes[e.route].action.name for e in self.entries.values() if e.applied == FIRING)
        for name in set(self._applied) | set(self.actions):
            self._applied[name] = counts.get(name, 0)
        self._update_applied_gauge()

    def _update_applied_gauge(self) -> None:
        for name, n in self._applied.items():
            self.metrics.applied.labels(name).set(n)

    def _update_failing_gauge(self, route: str) -> None:
        bound = self.routes.get(route)
        if bound is None:
            return
        n = sum(1 for e in self.entries.values() if e.route == route and e.failing)
        self.metrics.transitions_failing.labels(route, bound.action.name).set(n)

    def _refresh_failing_gauges(self, previous: dict[str, BoundRoute]) -> None:
        """From the entries (a reload must not hide a given-up transition); labels of a binding
        that is gone read 0."""
        failing = Counter(e.route for e in self.entries.values() if e.failing)
        for name, b in self.routes.items():
            self.metrics.transitions_failing.labels(name, b.action.name).set(failing.get(name, 0))
        for name, b in previous.items():
            now = self.routes.get(name)
            if now is None or now.action.name != b.action.name:
                self.metrics.transitions_failing.labels(name, b.action.name).set(0)

    # ------------------------------------------------------------------ inputs
    async def handle_payload(self, payload: WebhookPayload) -> dict[str, int]:
        """Take one webhook notification; return counts by result once its effect on the desired
        state and the dedupe memory is on disk (answer the webhook only then). Never waits for
        an action."""
        counts = {"accepted": 0, "duplicate": 0, "stale": 0, "conflict": 0, "future": 0}
        now = self.clock()
        self._expire(now)
        unnamed = self._unnamed_receiver(payload)
        if payload.truncatedAlerts:
            # Alertmanager's max_alerts left these out: only the reconciliation (with an
            # Alertmanager configured; never for Grafana's) can act on them. Said, counted, audited.
            left = min(payload.truncatedAlerts, 2**53)  # (a hand-made 10**400 is no float: counted as 2**53)
            self.metrics.truncated_alerts.inc(left)
            self.audit.write("truncated", groupKey=payload.groupKey, truncatedAlerts=left)
            reconciled = self.services.get("alertmanager") is not None and payload.version == "4" and not unnamed
            log.warning("notification of group %s left out %d alert(s) (truncatedAlerts: the receiver's max_alerts): "
                        "%s", payload.groupKey[:200], left, "the reconciliation acts on them" if reconciled else
                        f"nothing reconciles them (receiver {payload.receiver[:100]!r} is not in "
                        "controller.alertmanager_receiver): not acted on" if unnamed else
                        "nothing reconciles them (no Alertmanager configured, or Grafana's alerts): not acted on")
        horizon = datetime.now(UTC) + timedelta(seconds=FUTURE_MARGIN)
        added: list[tuple[str, str, str]] = []
        try:
            for alert in payload.alerts:
                key = dedupe_key(alert)
                extra: dict[str, Any] = {}
                if alert.given_fingerprint is not None:
                    self.metrics.fingerprints_replaced.inc()
                    extra["given_fingerprint"] = alert.given_fingerprint[:100]
                    log.warning("alert %s: fingerprint %r is not one (16 lowercase hex digits): the one computed from "
                                "its labels is used", alert.name, alert.given_fingerprint[:100])
                if alert.startsAt > horizon:
                    # Not remembered, not observed: a made-up date must not make the real
                    # episodes of this alert "stale" for the dedupe window.
                    result = "future"
                    extra["reason"] = f"startsAt is more than {FUTURE_MARGIN:g}s in the future: skipped"
                    log.warning("alert %s (%s): startsAt %s is more than %gs in the future: skipped", alert.name,
                                alert.fingerprint, alert.startsAt.isoformat(), FUTURE_MARGIN)
                elif self._conflicts(alert):  # before the dedupe memory: the genuine one is not a duplicate
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
                    startsAt=alert.startsAt.isoformat(), labels=alert.labels, groupKey=payload.groupKey, **extra,
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
            if (episode < starts and alert.status == RESOLVED and status == FIRING
                    and alert.endsAt is not None and alert.endsAt > starts):
                # The end of the episode held, not of an older one: Alertmanager merges the
                # copies of one alert from a Prometheus HA pair and keeps the EARLIEST startsAt, so
                # after a firing notification with one replica's startsAt the resolve comes with
                # the other's, earlier one. An older episode ended before the held one began.
                episode = starts
            elif (alert.status == FIRING and episode < starts
                  and (status == FIRING and (alert.endsAt is None or alert.endsAt > starts)
                       or status == ABSENT and alert.endsAt is not None and alert.endsAt > starts)):
                # An earlier startsAt of an episode that lasts past the held one's start: the same
                # episode, the HA pair's earlier copy, which Alertmanager keeps; held from now on.
                # A restarted Prometheus replica gives a `for: 0` alert a later activeAt, and a
                # restarted Alertmanager peer lists whichever replica sent first until the cluster
                # merges back to the earliest: the later one moved the episode forward, and the
                # earliest, listed by every peer again, was "stale", so an alert back from a
                # silence never fired again, nor on a route added later (a review with a real HA
                # pair and 3 peers). An older episode that ended before the held one began is stale.
                # The same when the held episode went ABSENT (a silence set before the cluster
                # merged back ended it) and Alertmanager's listing now shows the earliest copy
                # active, its endsAt past the held start: the alert is back (review P; it never
                # fired again). Only with a real endsAt: Alertmanager zeroes a firing alert's
                # endsAt in webhooks (year 1), and an old episode's late firing notification must
                # not undo an absence; the listing, which has it, brings the alert back.
                pass
            elif episode < starts or (episode == starts and status == RESOLVED and alert.status == FIRING):
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
        # (an earlier startsAt too: after a Prometheus HA pair's merged resolve the ordering memory
        # holds one replica's start, and Alertmanager lists the alert with the earliest)
        if status != RESOLVED or episode_start(alert) > starts or at > asked - REOPEN_AFTER:
            return
        log.info("alert %s is active again in Alertmanager after its resolved notification: a new generation",
                 alert.fingerprint)
        self._forget_episode(alert)
        self._set_latest(alert.fingerprint, episode_start(alert), ABSENT, now)

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
        # A firing row is the ordering memory of an alert that may still be active: with
        # Alertmanager, the reconciliation expires it once no peer lists it
        # (_expire_firing_latest); without, once nothing holds it.
        without_am = self.services.get("alertmanager") is None
        old = [fp for fp, (_, status, at) in self._latest.items() if at < cutoff and (status != FIRING or without_am)]
        if old:
            held = {fp for _, fp in self.entries} if without_am else set()
            for fp in old:
                if self._latest[fp][1] != FIRING or fp not in held:
                    del self._latest[fp]
                    self.store.delete_latest(fp)

    def _expire_firing_latest(self, view: ClusterView, now: float) -> int:
        """Ordering memory in state firing for an alert no peer lists (it ended without a
        resolved notification to this controller: routed elsewhere, or resolved while a
        notification was lost), older than the dedupe window, that no entry holds: forgotten, so
        that the memory does not grow with every alert Alertmanager ever listed."""
        cutoff = now - self.cfg.dedupe_window
        old = [fp for fp, (_, status, at) in self._latest.items()
               if status == FIRING and at < cutoff and fp not in view.present]
        if not old:
            return 0
        held = {fp for _, fp in self.entries}
        gone = [fp for fp in old if fp not in held and view.proves_absent(fp, self._latest[fp][0])]
        for fp in gone:
            del self._latest[fp]
            self.store.delete_latest(fp)
        return len(gone)

    # ------------------------------------------------------------------ Alertmanager's view
    async def _read_peers(self, inhibited: bool = False, silenced: bool = False) -> list[PeerAlerts]:
        """Every peer's active alerts, inhibited and silenced ones too when asked (a client
        without ``alerts_by_peer``: its one answer, from a peer of unknown age)."""
        am = self.services["alertmanager"]
        by_peer = getattr(am, "alerts_by_peer", None)
        kw = {k: True for k, v in (("inhibited", inhibited), ("silenced", silenced)) if v}  # (clients that lack the parameter read the default)
        if by_peer is None:
            return [PeerAlerts("alertmanager", await am.active_alerts(**kw))]
        views: list[PeerAlerts] = await by_peer(**kw)
        return views

    def _cluster_view(self, peers: list[PeerAlerts], now: float) -> ClusterView:
        """The union of the peers' alerts, and which peers are witnesses of an absence: a peer
        that started within ``alertmanager_restart_grace`` lists nothing until Prometheus
        re-sends to it, so its silence about an alert proves nothing unless it listed that
        alert since it started, or it started before the alert's episode did (Prometheus
        sends a new alert to every Alertmanager at once)."""
        grace = self.cfg.alertmanager_restart_grace
        at = datetime.fromtimestamp(now, UTC)
        present: dict[str, tuple[Alert, dict[str, Any]]] = {}
        witnesses: list[tuple[bool, set[str], datetime | None]] = []
        young: list[str] = []
        for peer in peers:
            if peer.alerts is None:
                continue
            listed = set()
            for item in peer.alerts:
                fp = api_fingerprint(item)
                listed.add(fp)
                if fp not in present:
                    present[fp] = (alert_from_api(item), item)
            memory = self._peers.get(peer.url)
            # Who answered, when its status could be read (an unreadable status, a 503 or a
            # timeout, says nothing about who: taken for an identity, the next good read looked
            # like a return to an old one, and a single Alertmanager was "shared" for good).
            who = (peer.started, getattr(peer, "name", None)) if peer.started is not None else None
            if memory is None or memory.started != peer.started:  # first read, or it restarted
                old = memory
                memory = self._peers[peer.url] = PeerMemory(peer.started)
                if old is not None:
                    memory.seen, memory.last, memory.shared = old.seen, old.last, old.shared
            if who is not None and who != memory.last:
                if who in memory.seen:  # back to one it had left: a real peer never returns to an old start
                    memory.shared = True
                else:
                    memory.seen.append(who)
                memory.last = who
            if getattr(peer, "mixed", False) or memory.shared:
                # One URL, several Alertmanagers (a load balancer, a Kubernetes Service): a restarted
                # one's empty list was judged with another's age, and every reconciliation resolved
                # and fired again what still fired. Its lists count; its silences prove nothing.
                if peer.url not in self._shared_warned:
                    self._shared_warned.add(peer.url)
                    log.warning(
                        "Alertmanager URL %s answers as more than one Alertmanager (a load balancer or a "
                        "Service in front of a cluster): its reads never prove an alert ended; give each "
                        "peer's own URL in alertmanager_url", peer.url)
                memory.shared = True
                memory.listed |= listed
                young.append(peer.url)
                continue
            memory.listed |= listed
            settled = (not getattr(peer, "status_unread", False)
                       and (peer.started is None or (at - peer.started).total_seconds() >= grace))
            if not settled:
                young.append(peer.url)
            witnesses.append((settled, memory.listed, peer.started))
        return ClusterView(present, witnesses, young)

    async def presence(self, alerts: Mapping[str, datetime | None], inhibited: bool = False,
                       silenced: bool = False) -> dict[str, bool | None]:
        """Whether Alertmanager still has each alert (fingerprint -> the ``startsAt`` of the
        episode held, or None), for an action that must confirm, after a restart, what it held
        before, or whether what it keeps still fires (offered as
        ``services["alertmanager_presence"]``): True when a peer lists it, False when no peer
        does and one that answered proves its absence (as the reconciliation resolves:
        :meth:`ClusterView.proves_absent`), None when only peers that started within
        ``alertmanager_restart_grace`` answered (the grace bounds the wait). ``inhibited``,
        ``silenced``: such an alert counts as listed (the rca action's incident: muting a slow
        service's alert does not make it fast); by default, as the reconciliation reads, not. Every peer is read
        (concurrent callers asking the same share one read) and what each lists is
        remembered as a reconciliation's read is (a peer that listed an alert had received it,
        inhibited or not). Raises when no peer answered."""
        view = self._cluster_view(await self._presence_reads[(inhibited, silenced)](), self.clock())
        return {fp: True if fp in view.present else False if view.proves_absent(fp, starts) else None
                for fp, starts in alerts.items()}

    def _receiver_names(self) -> set[str]:
        return _names(self.cfg.alertmanager_receiver)

    def _unnamed_receiver(self, payload: WebhookPayload) -> bool:
        """An Alertmanager notification from a receiver ``alertmanager_receiver`` does not name:
        the reconciliation does not act on that receiver's alerts (back from a silence, left out
        by max_alerts); said once per receiver, with the fix. (Learning such names from the
        notifications widened the reconciliation to alerts routed to a person, whenever any
        sender used a common name such as ``default``, and was forgotten at a restart.)"""
        names = self._receiver_names()
        if (not names or payload.version != "4" or payload.receiver in names
                or self.services.get("alertmanager") is None):
            return False
        if payload.receiver not in self._receivers_said and len(self._receivers_said) < 64:
            self._receivers_said.add(payload.receiver)
            log.warning("notifications come from receiver %r, which controller.alertmanager_receiver (%s) does not "
                        "name: the reconciliation does not act on its alerts (one back from a silence or an "
                        "inhibition, or left out by max_alerts, is not fired); add it to alertmanager_receiver (a reload applies it)",
                        payload.receiver[:200], ", ".join(sorted(names)))
        return True

    async def _routed(self, present: list[tuple[Alert, dict[str, Any]]]) -> tuple[list[Alert], bool]:
        """The alerts Alertmanager routes to one of ``alertmanager_receiver`` (all of them when it
        is not set, or Alertmanager knows none of them: said once in the log); and whether it
        filtered."""
        names = self._receiver_names()
        if not names:
            return [alert for alert, _ in present], False
        name = ", ".join(sorted(names))

        def receivers(item: dict[str, Any]) -> list[str] | None:
            rs = item.get("receivers")
            return [str(r.get("name")) for r in rs if isinstance(r, dict)] if isinstance(rs, list) else None

        if any(not names.isdisjoint(receivers(item) or ()) for _, item in present):
            known = True
        else:
            ask = getattr(self.services["alertmanager"], "receivers", None)
            known = self._receiver_known if self._receiver_known is not None else True
            if ask is not None:
                try:
                    known = not names.isdisjoint(await ask())
                except Exception as e:  # noqa: BLE001 - keep the last answer
                    log.debug("cannot list Alertmanager's receivers: %s", why(e))
        if known != self._receiver_known:
            if not known:
                log.warning("Alertmanager has no receiver named %r (controller.alertmanager_receiver): the "
                            "reconciliation acts on every active alert the routes match, whatever Alertmanager "
                            "routes to this controller", name)
            elif self._receiver_known is not None:
                log.info("Alertmanager has the receiver %r again: the reconciliation acts on the alerts routed "
                         "to it", name)
            self._receiver_known = known
        if not known:
            return [alert for alert, _ in present], False
        return [alert for alert, item in present if (rs := receivers(item)) is None or not names.isdisjoint(rs)], True

    async def reconcile(self) -> dict[str, int]:
        """Converge on Alertmanager's active alerts: fire what is active (routed to this
        controller's receiver) and not applied, resolve what is desired firing and absent
        from every peer (an absence, see the module doc)."""
        if self.services.get("alertmanager") is None:
            return {}
        asked = self.clock()
        try:
            peers = await self._read_peers()
            now = self.clock()
            view = self._cluster_view(peers, now)
            routed, filtered = await self._routed(list(view.present.values()))
        except Exception as e:  # noqa: BLE001 - any failure is a counted, logged reconcile error
            self.metrics.reconcile_runs.labels("error").inc()
            self.audit.write("reconcile", result="error", error=why(e))
            log.warning("reconcile failed: %s", why(e))
            return {}
        self._expire(now)
        wall = datetime.now(UTC)
        horizon = wall + timedelta(seconds=FUTURE_MARGIN)
        young_after = wall - timedelta(seconds=self.cfg.reconcile_fire_after)
        future = too_young = 0
        for alert in routed:
            if alert.startsAt > horizon:
                future += 1
                continue
            if self.cfg.reconcile_fire_after > 0 and alert.startsAt > young_after:
                too_young += 1  # Alertmanager's group_wait may still hold it back: the next reconciliation
                continue
            if not self._conflicts(alert):
                self._back_after_resolved(alert, asked, now)
                self._observe(alert, now)
        resolved = deferred = 0
        for entry in list(self.entries.values()):
            fp = entry.alert.fingerprint
            if fp in view.present or entry.desired != FIRING or entry.alert.source != "alertmanager":
                continue
            if view.proves_absent(fp, entry.alert.startsAt):
                self._absent(entry, now)
                resolved += 1
            else:
                deferred += 1
        keep = set(view.present) | {fp for _, fp in self.entries}
        for memory in self._peers.values():
            memory.listed &= keep
        forgotten = self._expire_firing_latest(view, now)
        self.metrics.reconcile_runs.labels("ok").inc()
        self.metrics.last_reconcile.set(now)
        summary = {"active": len(view.present), "resolved_missing": resolved}
        if filtered:
            summary["routed_here"] = len(routed)
        extra = {"absence_deferred": deferred, "young_peers": len(view.young), "future": future,
                 "too_young": too_young, "latest_forgotten": forgotten}
        summary.update({k: v for k, v in extra.items() if v})
        if deferred:
            log.info("%d alert(s) desired firing are not listed by any peer, but only peers that started within "
                     "%gs answered (%s): not resolved yet", deferred, self.cfg.alertmanager_restart_grace,
                     ", ".join(view.young))
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
        # The route's own name, also for a retired binding ("r~marker"): what the action saw
        # when it applied the alert.
        return ActionContext(route=bound.route.name, alert=entry.alert, params=bound.params, services=self.services)

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
        if again is not None:
            self.kick(again)

    def _waits_for_retired(self, entry: Entry) -> bool:
        """A retired binding of this route still has to resolve this alert (a reload or start
        changed the route's action): the new binding's fire comes after it (or after it gave up)."""
        fp = entry.alert.fingerprint
        for name, b in self.routes.items():
            if b.retired_from == entry.route:
                old = self.entries.get((name, fp))
                if old is not None and not old.failing:
                    return True
        return False

    async def _transition(self, key: tuple[str, str], bound: BoundRoute, target: str) -> tuple[str, str] | None:
        """Run at most one transition of ``key`` (the target's lock held). Returns the key to
        converge again when the desired state changed meanwhile and another pass is needed."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        transition = wanted(entry)
        if transition is None:
            self._forget_if_done(entry)
            return None
        if entry.failing:
            return None
        loop = asyncio.get_running_loop()
        if loop.time() < entry.not_before:
            return None  # backing off: the retry timer kicks it
        action = bound.action
        if transition == "fire":
            if self._waits_for_retired(entry):
                return None  # kicked when the old binding's entry is resolved
            wait = self._cooldown_left(bound, target)
            if wait > 0:
                self._record(entry, action, transition, "cooldown", f"cooldown: {wait:.1f}s left", 0.0)
                self._schedule_retry(entry, wait)
                return None
            if not await self._still_active(entry):
                detail = "no longer active in Alertmanager"
                if entry.applied == UNKNOWN:
                    detail += "; an earlier run may have applied it: resolve runs"
                self._record(entry, action, transition, "skipped", detail, 0.0)
                self._absent(entry, self.clock())
                return None
        # The intent, durable before the action runs: a SIGKILL from here on re-runs it at start.
        ctx = self._ctx(entry)
        entry.inflight = transition
        self._save(entry)
        await self.store.commit()
        if self.entries.get(key) is not entry or wanted(entry) != transition:
            # Changed while the intent was written (or during the re-check): nothing to do, or another pass.
            entry.inflight = None
            self._save(entry)
            self._forget_if_done(entry)
            await self.store.commit()
            return self._again(entry)
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
            self._schedule_retry(entry, deferred.seconds)
            await self.store.commit()
            return None
        if transition == "fire" and bound.route.cooldown > 0:
            self._last_fire[(bound.route.name, target)] = now = self.clock()
            self.store.put_last_fire(bound.route.name, target, now)
        if error:
            self._failed(entry, bound, transition, error, seconds)
        else:
            entry.failures = 0
            self._set_applied(entry, FIRING if transition == "fire" else RESOLVED)
            self._record(entry, action, transition, "ok", detail, seconds)
            self._save(entry)
            self._forget_if_done(entry)
        # The completion, durable before the target's lock is released.
        await self.store.commit()
        return self._again(entry)

    def _again(self, entry: Entry) -> tuple[str, str] | None:
        """The entry's key when it still needs a pass now (not converged, not given up, no
        retry timer pending); it may have moved (a reload retired its binding) during the run."""
        key = (entry.route, entry.alert.fingerprint)
        current = self.entries.get(key)
        if current is not None and current.desired != current.applied and not current.failing \
                and current.retry is None:
            return key
        return None

    def _failed(self, entry: Entry, bound: BoundRoute, transition: str, error: str, seconds: float) -> None:
        """A run failed or timed out: it may have done part of its work, so what is applied is
        unknown (an alert that ends, or comes back, runs its transition whatever it is)."""
        entry.failures += 1
        self._set_applied(entry, UNKNOWN)
        self._save(entry)
        now_wanted = wanted(entry)
        if now_wanted != transition:  # the desired state changed during the run: new input
            entry.failures = 0
            self._record(entry, bound.action, transition, "error",
                         f"{error}; the alert is {entry.desired} now: {now_wanted} runs", seconds)
            return
        if entry.failures > bound.route.max_retries:
            entry.failing = True
            self._record(entry, bound.action, transition, "error",
                         f"{error}; gave up after {entry.failures} runs", seconds)
            self._update_failing_gauge(entry.route)
            log.error("gave up on %s %s for %s after %d failed runs: %s", bound.action.name, transition,
                      (entry.route, entry.alert.fingerprint), entry.failures, error)
            self._kick_successor(entry)
            return
        delay = retry_delay(entry.failures)
        self._record(entry, bound.action, transition, "error", f"{error}; retry in {delay:.1f}s", seconds)
        entry.not_before = asyncio.get_running_loop().time() + delay
        self._schedule_retry(entry, delay)

    def _cooldown_left(self, bound: BoundRoute, target: str) -> float:
        last = self._last_fire.get((bound.route.name, target))
        if last is None or bound.route.cooldown <= 0:
            return 0.0
        return max(0.0, last + bound.route.cooldown - self.clock())

    async def _still_active(self, entry: Entry) -> bool:
        """Re-check with Alertmanager before acting; if it cannot be asked, trust the
        notification. The peer reads stick to first; when it does not list the alert, every
        peer: one that notified may hold it a moment before the others, and a peer that just
        started holds nothing yet (it proves no absence, as in the reconciliation)."""
        if self.services.get("alertmanager") is None or entry.alert.source != "alertmanager":
            return True
        fp = entry.alert.fingerprint
        first = await self._recheck()
        if first is None or fp in first:
            return True
        peers = await self._recheck_all()
        if peers is None:
            return False
        view = self._cluster_view(peers, self.clock())
        if fp in view.present:
            log.info("alert %s: not listed by the first Alertmanager peer, listed by another: held", fp)
            return True
        if not view.proves_absent(fp, entry.alert.startsAt):
            log.info("alert %s: no Alertmanager peer lists it, but only peers that started within %gs answered: "
                     "acting on the notification", fp, self.cfg.alertmanager_restart_grace)
            return True
        return False

    async def _read_first_peer(self) -> set[str] | None:
        """The fingerprints the peer reads stick to lists (None: no peer answered). What it
        lists is remembered for that peer as a reconciliation's read is: when a silence then
        empties its listing, that is an absence even if the peer started moments ago."""
        am = self.services["alertmanager"]
        try:
            items = await am.active_alerts()
        except Exception as e:  # noqa: BLE001
            log.warning("could not re-check with Alertmanager (%s); acting on the notification", why(e))
            return None
        fps = {api_fingerprint(i) for i in items}
        memory = self._peers.get(getattr(am, "base_url", ""))  # the peer that answered (reads stick to it)
        if memory is not None:  # (if it restarted since, the next reconciliation starts its memory over)
            memory.listed |= fps
        return fps

    async def _read_every_peer(self) -> list[PeerAlerts] | None:
        try:
            return await self._read_peers()
        except Exception as e:  # noqa: BLE001
            log.warning("could not re-check with every Alertmanager peer (%s)", why(e))
            return None

    def _schedule_retry(self, entry: Entry, delay: float) -> None:
        if entry.retry is not None:
            entry.retry.cancel()
        entry.retry = asyncio.get_running_loop().call_later(delay, self._retry, (entry.route, entry.alert.fingerprint))

    def _retry(self, key: tuple[str, str]) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.retry = None
            entry.not_before = 0.0
            self.kick(key)

    def _forget_if_done(self, entry: Entry) -> None:
        if entry.desired == RESOLVED and entry.applied == RESOLVED and entry.inflight is None:
            if entry.retry is not None:
                entry.retry.cancel()
            key = (entry.route, entry.alert.fingerprint)
            if self.entries.get(key) is entry:
                del self.entries[key]
                self.store.delete_entry(*key)
            if entry.failing:
                self._update_failing_gauge(entry.route)
            self._kick_successor(entry)

    def _kick_successor(self, entry: Entry) -> None:
        """A retired binding's entry is done (or given up): the new binding's fire may run."""
        bound = self.routes.get(entry.route)
        if bound is not None and bound.retired_from is not None:
            successor = (bound.retired_from, entry.alert.fingerprint)
            if successor in self.entries:
                self.kick(successor)

    def _record(self, entry: Entry, action: Action, transition: str, result: str, detail: str, seconds: float) -> None:
        self.metrics.actions.labels(action.name, transition, result).inc()
        if result in ("ok", "error"):
            self.metrics.action_duration.labels(action.name).observe(seconds)
        self.audit.write(
            "decision", action=action.name, route=entry.route, transition=transition, result=result,
            detail=detail, fingerprint=entry.alert.fingerprint, startsAt=entry.alert.startsAt.isoformat(),
            labels=entry.alert.labels, seconds=round(seconds, 6), applied=entry.applied,
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for action in self.actions.values():
            action.route_params = [b.params for b in self.routes.values() if b.action is action]
            await action.start(self.services)
            self.started_actions[action.name] = action
        # What exists now (modules, configuration, the loaded state) lives as long as the
        # process: keep it out of the garbage collector's full passes, which otherwise stall
        # the event loop for tens of milliseconds at a time under a burst (halved webhook p99).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        await self.store.commit()  # what the load changed (unknown applied states, bindings, retired rows)
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
        for action in self.known_actions.values():  # (those a reload removed too)
            try:
                await action.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("action %s failed to shut down cleanly", action.name)
        await asyncio.to_thread(self.store.close)

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"route": e.route, "action": self.routes[e.route].action.name, "fingerprint": e.alert.fingerprint,
             "alertname": e.alert.name, "desired": e.desired, "applied": e.applied, "failures": e.failures,
             "failing": e.failing}
            for e in self.entries.values()
        ]
