"""The ``copy-guard`` action: pause (or throttle) every registered copy of the alert's site
while the site is overloaded, and make sure no copy stays stopped.

Route it from ``CopyGuardSiteOverloaded`` (and, to act earlier, ``CopyGuardSiteOverloadPredicted``):

    - name: copy-guard
      matchers: ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted"']
      action: copy-guard
      params: {registry_dir: /var/lib/promreflex/copies, max_pause: 2m, lease: 10s}

Control of ``promreflex copy`` processes goes through the controller's aiohttp session, to the
``control_url`` of their registry entry, and only to a loopback address unless the route names
the host in ``control_hosts``; the bearer token sent is the one in the route's
``control_token_file`` (read once by the controller; group/world-readable files are refused).
A registry entry names no token and no token file: whoever can write an entry must not be able
to make the controller send a secret anywhere. At start (and in ``check-config``) the registry
directory must be owned by root or the controller's user and not writable by group or others
(:func:`~controllers.copy_guard.registry.check_dir`).

An *episode* per site starts with the first firing alert and ends when the last one resolves
(the alerts are its holders, by fingerprint: the predictive alert resolving while the overload
alert fires does not resume anything). During an episode a supervisor task, every ``tick``:
pauses copies that registered after the episode began, renews the pause leases, and at
``max_pause`` resumes everything (counted in ``promreflex_copy_guard_forced_resumes_total``:
the CopyGuardForcedResume alert) and pauses no more until the episode ends. ``min_pause`` keeps a
pause at least that long after a resolve (hysteresis against resume/pause flapping).

Never a copy left stopped:
- every pause has a lease: ``promreflex copy`` resumes itself when the controller stops renewing;
  adopted processes are resumed by the watchdog process (``watchdog.py``) the action starts;
- ``shutdown`` (controller stop) resumes everything it holds;
- the state (``<registry_dir>/copy-guard.state``) lists what is held; ``start`` resumes all of it
  after a crash, then re-pauses only for holders Alertmanager confirms as still active (the
  engine itself does not fire again for an alert it had applied before the restart).

Alert label values are data: the ``site`` label is only compared with registry entries' site.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controllers.actions.base import Action, ActionContext, register
from controllers.copy_guard import freeze
from controllers.copy_guard.registry import DEFAULT_DIR, Entry, Registry, check_dir
from promreflex.config import Duration, is_loopback
from promreflex.fsutil import atomic_write_json, read_json
from promreflex.httpd import read_token_file

log = logging.getLogger("promreflex.action.copy-guard")

STATE_NAME = "copy-guard.state"
RESUME_REASONS = ("resolved", "max_pause", "shutdown", "recovery", "ended")
HTTP_TIMEOUT = 2.0
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$|^[0-9A-Fa-f:.]+$")


class CopyGuardParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    registry_dir: Path = DEFAULT_DIR
    sites: list[str] = Field(default_factory=list)  # empty: every site
    mode: Literal["pause", "throttle"] = "pause"
    throttle_bytes_per_second: int = Field(default=10 * 1024 * 1024, gt=0)
    max_pause: Duration = Field(default=120.0, gt=0)
    min_pause: Duration = 0.0
    lease: Duration = Field(default=10.0, gt=0, le=600)
    tick: Duration = Field(default=0.2, gt=0, le=5)
    adopt_methods: list[Literal["cgroup2", "cgroup1", "signal"]] | None = None  # default: what the host offers
    watchdog: bool = True  # start the lease keeper for adopted copies
    # Hosts beyond loopback whose copiers' control endpoints may be called (names or IPs, as
    # the entries' control_url spell them). Empty: loopback only.
    control_hosts: list[str] = Field(default_factory=list)
    # The bearer token sent to copiers' control endpoints (copies started with the same
    # --web.token-file). Read by the controller at start; never a path from a registry entry.
    control_token_file: Path | None = None

    @field_validator("control_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        hosts = [h.strip().lower().removeprefix("[").removesuffix("]") for h in value]
        bad = [h for h, norm in zip(value, hosts, strict=True) if not _HOST.match(norm)]
        if bad:
            raise ValueError(f"not host names or addresses: {', '.join(map(repr, bad))} (no scheme, port or path)")
        return hosts


@dataclass
class Held:
    id: str
    kind: str
    control_url: str | None = None
    renewed: float = 0.0


@dataclass
class Episode:
    site: str
    params: CopyGuardParams
    since: float = field(default_factory=time.time)
    holders: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> {alertname, confirmed}
    held: dict[str, Held] = field(default_factory=dict)
    forced: bool = False
    resume_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"site": self.site, "params": self.params.model_dump(mode="json"), "since": self.since,
                "holders": self.holders, "forced": self.forced, "resume_at": self.resume_at,
                "held": {i: {"kind": h.kind, "control_url": h.control_url} for i, h in self.held.items()}}


class GuardMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.paused = Gauge("promreflex_copy_guard_paused_copies", "Copies the guard holds paused or throttled now.",
                            ["site"], registry=registry)
        self.registered = Gauge("promreflex_copy_guard_registered_copies", "Copies registered for the site.",
                                ["site"], registry=registry)
        self.episode = Gauge("promreflex_copy_guard_episode_active",
                             "1 while an overload episode of the site is open (an alert holds it).", ["site"],
                             registry=registry)
        self.pauses = Counter("promreflex_copy_guard_pauses_total", "Copies paused (or throttled), renewals excluded.",
                              ["site"], registry=registry)
        self.episodes = Counter("promreflex_copy_guard_episodes_total", "Overload episodes begun.", ["site"],
                                registry=registry)
        self.resumes = Counter("promreflex_copy_guard_resumes_total", "Copies resumed, by reason.", ["site", "reason"],
                               registry=registry)
        self.forced = Counter("promreflex_copy_guard_forced_resumes_total",
                              "Episodes whose copies were resumed at max_pause while still overloaded.", ["site"],
                              registry=registry)
        self.pause_seconds = Counter("promreflex_copy_guard_pause_seconds_total",
                                     "Seconds during which at least one copy of the site was held.", ["site"],
                                     registry=registry)
        self.errors = Counter("promreflex_copy_guard_errors_total", "Failed pause, renew or resume operations.",
                              ["site", "operation"], registry=registry)

    def site(self, site: str) -> None:
        """Create the site's series at 0 (so increase() and absence alerts work from the start)."""
        for m in (self.paused, self.registered, self.episode, self.pauses, self.episodes, self.forced,
                  self.pause_seconds):
            m.labels(site)
        for reason in RESUME_REASONS:
            self.resumes.labels(site, reason)
        for op in ("pause", "renew", "resume"):
            self.errors.labels(site, op)


class ControlError(Exception):
    """A copier's control endpoint refused or failed a command."""


class ControlClient:
    """Sends ``pause``/``throttle``/``resume`` to ``promreflex copy`` processes' control
    endpoints over an aiohttp session: plain http, to loopback or to a host in ``hosts`` only,
    no redirects followed, with ``token`` (if any) as the bearer token."""

    def __init__(self, session: aiohttp.ClientSession, token: str = "", hosts: list[str] | tuple[str, ...] = ()):
        self.session = session
        self.token = token
        self.hosts = frozenset(h.lower() for h in hosts)

    def url(self, control_url: str | None, command: str) -> str:
        """The command's URL; ValueError for a control URL the route does not allow."""
        u = urllib.parse.urlsplit(control_url or "")
        host = (u.hostname or "").lower()
        if u.scheme != "http" or not host or u.username is not None or u.password is not None:
            raise ValueError(f"refusing control URL {control_url!r}: plain http://HOST:PORT only")
        if not is_loopback(host) and host not in self.hosts:
            raise ValueError(f"refusing control URL {control_url!r}: {host} is neither loopback nor in the route's "
                             "control_hosts")
        return f"http://{u.netloc}/{command}"

    async def __call__(self, held: Held, command: str, **query: Any) -> dict[str, Any]:
        url = self.url(held.control_url, command)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with self.session.post(url, params={k: str(v) for k, v in query.items()}, headers=headers,
                                     allow_redirects=False, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as resp:
            if resp.status != 200:
                raise ControlError(f"{command} on copy {held.id}: HTTP {resp.status} {(await resp.text())[:200]}")
            body = await resp.json(content_type=None)
        return body if isinstance(body, dict) else {}


@register
class CopyGuardAction(Action):
    """Pauses the alert's site's copies on fire, resumes them on resolve (with a lease)."""

    name = "copy-guard"
    Params = CopyGuardParams
    concurrency = 4
    resolved_means = "resume the site's copies (after min_pause) once no alert of the site holds them"

    def __init__(self) -> None:
        super().__init__()
        self.episodes: dict[str, Episode] = {}
        self.lock = asyncio.Lock()
        self.services: dict[str, Any] = {}
        self.metrics: GuardMetrics | None = None
        self.known: dict[Path, CopyGuardParams] = {}  # registry dir -> params, for scanning
        self._task: asyncio.Task | None = None
        self._watchdogs: dict[Path, subprocess.Popen] = {}
        self._last_tick = time.monotonic()
        self._seen_sites: set[str] = set()
        self._tokens: dict[Path, str] = {}
        self._own_session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ engine hooks
    def target(self, ctx: ActionContext) -> str:
        return f"copy-guard/{ctx.labels.get('site', '')}"

    def preflight(self, params: CopyGuardParams) -> None:
        """What ``check-config`` and the start check for a route (UserError, one line): a registry
        directory nobody else can write, a readable private control token file."""
        check_dir(params.registry_dir)
        self._token(params)

    async def start(self, services: dict[str, Any]) -> None:
        self.services = services
        self.metrics = GuardMetrics(services.get("registry") or CollectorRegistry())
        mine = [p for p in self.route_params if isinstance(p, CopyGuardParams)]
        for params in mine:
            check_dir(params.registry_dir, create=True)
            self._token(params)
        await self.recover(mine)
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        async with self.lock:
            for ep in self.episodes.values():
                await self._release_all(ep, "shutdown")
                for h in ep.holders.values():
                    h["confirmed"] = False  # re-pause after a restart only if Alertmanager confirms
            self._save()
        if self._own_session is not None:
            await self._own_session.close()
            self._own_session = None

    async def fire(self, ctx: ActionContext) -> str:
        params: CopyGuardParams = ctx.params  # type: ignore[assignment]
        site = ctx.labels.get("site")
        if not site:
            return "no site label: nothing to pause"
        if params.sites and site not in params.sites:
            return f"site {site!r} is not guarded by this route"
        self._know(params)
        async with self.lock:
            ep = self.episodes.get(site)
            if ep is None:
                ep = self.episodes[site] = Episode(site, params)
                self._m().episodes.labels(site).inc()
            ep.holders[ctx.alert.fingerprint] = {"alertname": ctx.alert.name, "confirmed": True}
            ep.resume_at = None
            if ep.forced:
                self._save()
                return f"site {site}: resumed at max_pause earlier in this episode; not pausing again until it ends"
            held = await self._enforce(ep)
            self._save()
        return f"site {site}: {held} cop{'y' if held == 1 else 'ies'} {'paused' if params.mode == 'pause' else 'throttled'}"

    async def resolve(self, ctx: ActionContext) -> str:
        site = ctx.labels.get("site")
        if not site:
            return "no site label: nothing to resume"
        async with self.lock:
            ep = self.episodes.get(site)
            if ep is None or ep.holders.pop(ctx.alert.fingerprint, None) is None:
                return f"site {site}: nothing held for this alert"
            if ep.holders:
                self._save()
                return f"site {site}: still held by {', '.join(sorted(h['alertname'] for h in ep.holders.values()))}"
            resume_at = ep.since + ep.params.min_pause
            if time.time() < resume_at and ep.held:
                ep.resume_at = resume_at
                self._save()
                return f"site {site}: resume in {resume_at - time.time():.1f}s (min_pause)"
            n = await self._end(ep, "resolved")
            self._save()
        return f"site {site}: {n} cop{'y' if n == 1 else 'ies'} resumed"

    # ------------------------------------------------------------------ recovery
    async def recover(self, params_list: list[CopyGuardParams]) -> int:
        """Resume everything a previous controller held (its state files), keep its holders as
        unconfirmed: the supervisor re-pauses only for those Alertmanager still has active."""
        resumed = 0
        for params in params_list:
            self._know(params)
            for site in params.sites:
                self._m().site(site)
        async with self.lock:
            for reg_dir in list(self.known):
                data = read_json(reg_dir / STATE_NAME, default=None)
                if not isinstance(data, dict):
                    continue
                for raw in data.get("episodes", []):
                    try:
                        # The episode goes on under the route's current params (its control
                        # hosts and token), not under what the state file says.
                        params = self.known[reg_dir]
                        ep = Episode(str(raw["site"]), params, float(raw["since"]),
                                     {str(k): {"alertname": str(v.get("alertname", "")), "confirmed": False}
                                      for k, v in dict(raw.get("holders", {})).items()},
                                     {str(i): Held(str(i), str(h["kind"]), _str_or_none(h.get("control_url")))
                                      for i, h in dict(raw.get("held", {})).items()},
                                     bool(raw.get("forced", False)))
                    except (KeyError, TypeError, ValueError, ValidationError) as e:
                        log.warning("ignoring unreadable episode in %s: %r", reg_dir / STATE_NAME, e)
                        continue
                    resumed += await self._release_all(ep, "recovery")
                    if ep.holders and ep.site not in self.episodes:
                        self.episodes[ep.site] = ep
                        log.info("recovered episode of %s (held by %d alert(s), awaiting confirmation)",
                                 ep.site, len(ep.holders))
            self._save()
        return resumed

    async def _confirm(self, ep: Episode) -> None:
        pending = [fp for fp, h in ep.holders.items() if not h["confirmed"]]
        if not pending:
            return
        am = self.services.get("alertmanager")
        if am is None:
            for fp in pending:
                ep.holders[fp]["confirmed"] = True
            return
        try:
            active = {i.get("fingerprint") for i in await am.active_alerts()}
        except Exception as e:  # noqa: BLE001 - unconfirmed holders simply wait for the next tick
            log.debug("cannot confirm holders with Alertmanager: %r", e)
            return
        for fp in pending:
            if fp in active:
                ep.holders[fp]["confirmed"] = True
            else:
                del ep.holders[fp]

    # ------------------------------------------------------------------ the supervisor
    async def _supervise(self) -> None:
        while True:
            try:
                async with self.lock:
                    await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the supervisor must survive anything
                log.exception("copy-guard supervisor tick failed")
            await asyncio.sleep(min([p.tick for p in self.known.values()] or [0.2]))

    async def tick(self) -> None:
        """One pass (caller holds the lock): confirm, enforce, time out, release, count."""
        now, mono = time.time(), time.monotonic()
        elapsed, self._last_tick = mono - self._last_tick, mono
        m = self._m()
        changed = False
        for site, ep in list(self.episodes.items()):
            if ep.held:
                m.pause_seconds.labels(site).inc(elapsed)
            await self._confirm(ep)
            if not ep.holders and (ep.resume_at is None or now >= ep.resume_at or not ep.held):
                await self._end(ep, "resolved")
                changed = True
                continue
            if not ep.holders:
                # Resolved, waiting out min_pause: keep the leases of held copies alive (or they
                # resume by themselves after one lease), pause nothing new.
                await self._enforce(ep, pause_new=False)
                continue
            if ep.forced or not any(h["confirmed"] for h in ep.holders.values()):
                continue
            if now - ep.since >= ep.params.max_pause:
                await self._release_all(ep, "max_pause")
                ep.forced = True
                m.forced.labels(site).inc()
                log.warning("site %s: copies held for max_pause (%.0fs): resumed while still overloaded",
                            site, ep.params.max_pause)
                changed = True
                continue
            before = set(ep.held)
            await self._enforce(ep)
            changed |= set(ep.held) != before
        counts: dict[str, int] = {}
        for reg_dir in self.known:
            for site, n in Registry(reg_dir).sites().items():
                counts[site] = counts.get(site, 0) + n
        for site in set(counts) | self._seen_sites | set(self.episodes):
            if site not in self._seen_sites:
                m.site(site)
                self._seen_sites.add(site)
            m.registered.labels(site).set(counts.get(site, 0))
            current = self.episodes.get(site)
            m.paused.labels(site).set(len(current.held) if current else 0)
            m.episode.labels(site).set(1 if current else 0)
        if changed:
            self._save()

    async def _enforce(self, ep: Episode, pause_new: bool = True) -> int:
        """Hold every registered copy of the site (only those already held unless ``pause_new``);
        renew leases that are due; forget copies that ended. Returns how many copies are held."""
        reg = Registry(ep.params.registry_dir)
        entries = {e.id: e for e in reg.for_site(ep.site)}
        for copy_id in [i for i in ep.held if i not in entries]:
            del ep.held[copy_id]  # the copy finished (or died): nothing to hold
            self._m().resumes.labels(ep.site, "ended").inc()
        mono = time.monotonic()
        jobs = []
        for copy_id, entry in entries.items():
            held = ep.held.get(copy_id)
            if held is None:
                if pause_new:
                    jobs.append(self._hold(ep, entry, renew=False))
            elif mono - held.renewed >= ep.params.lease / 3:
                jobs.append(self._hold(ep, entry, renew=True))
        if jobs:
            await asyncio.gather(*jobs)
        return len(ep.held)

    async def _hold(self, ep: Episode, entry: Entry, renew: bool) -> None:
        p = ep.params
        held = ep.held.get(entry.id) or Held(entry.id, entry.kind, entry.control_url)
        op = "renew" if renew else "pause"
        try:
            if entry.kind == "copier":
                control = self._client(p)
                if p.mode == "throttle":
                    await control(held, "throttle", bytes_per_second=p.throttle_bytes_per_second, lease=p.lease)
                else:
                    await control(held, "pause", lease=p.lease)
            else:
                await asyncio.to_thread(self._hold_adopted, ep, entry)
        except Exception as e:  # noqa: BLE001 - counted; retried at the next tick
            self._m().errors.labels(ep.site, op).inc()
            log.warning("site %s: could not %s copy %s: %r", ep.site, op, entry.id, e)
            return
        held.renewed = time.monotonic()
        if not renew:
            ep.held[entry.id] = held
            self._m().pauses.labels(ep.site).inc()
            log.info("site %s: %s copy %s (%s, pid %d)", ep.site, "throttled" if p.mode == "throttle" and
                     entry.kind == "copier" else "paused", entry.id, entry.kind, entry.pid)

    def _hold_adopted(self, ep: Episode, entry: Entry) -> None:
        """Pause a foreign process (or renew its lease). Throttle mode pauses too: this host has
        no cgroup v2 io.max and v1 blkio does not limit buffered writes (STACK-NOTES)."""
        reg = Registry(ep.params.registry_dir)
        current = reg.get(entry.id) or entry
        until = time.time() + ep.params.lease
        if current.pause and freeze.is_frozen(current.pause):
            current.pause["until"] = until
        else:
            if current.pause:  # the watchdog resumed it (lease ran out): pause again
                freeze.resume(current.pause)
            record = freeze.pause(entry.id, pid=None if entry.pgid else entry.pid, pgid=entry.pgid,
                                  methods=list(ep.params.adopt_methods) if ep.params.adopt_methods else None)
            record["until"] = until
            current.pause = record
        reg.update(current)
        if ep.params.watchdog:
            self._ensure_watchdog(reg.dir)

    def _ensure_watchdog(self, reg_dir: Path) -> None:
        proc = self._watchdogs.get(reg_dir)
        if proc is not None and proc.poll() is None:
            return
        log_path = reg_dir / "watchdog.log"
        with open(log_path, "ab") as out:
            self._watchdogs[reg_dir] = subprocess.Popen(  # noqa: S603 - our own module, fixed argv
                [sys.executable, "-m", "controllers.copy_guard.watchdog", f"--registry.dir={reg_dir}",
                 f"--parent-pid={os.getpid()}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=str(Path(__file__).resolve().parents[2]),
            )

    async def _release(self, ep: Episode, held: Held, reason: str) -> bool:
        try:
            if held.kind == "copier":
                try:
                    await self._client(ep.params)(held, "resume")
                except (aiohttp.ClientError, ConnectionError, TimeoutError) as e:
                    log.info("copy %s did not answer resume (%r): it ended, or its lease will resume it", held.id, e)
            else:
                await asyncio.to_thread(self._release_adopted, ep.params.registry_dir, held.id)
        except Exception as e:  # noqa: BLE001
            self._m().errors.labels(ep.site, "resume").inc()
            log.warning("site %s: could not resume copy %s: %r", ep.site, held.id, e)
            return False
        self._m().resumes.labels(ep.site, reason).inc()
        return True

    @staticmethod
    def _release_adopted(reg_dir: Path, copy_id: str) -> None:
        reg = Registry(reg_dir)
        entry = reg.get(copy_id)
        if entry is None or not entry.pause:
            return
        freeze.resume(entry.pause)
        entry.pause = None
        reg.update(entry)

    async def _release_all(self, ep: Episode, reason: str) -> int:
        results = await asyncio.gather(*(self._release(ep, h, reason) for h in ep.held.values()))
        ep.held.clear()
        self._m().paused.labels(ep.site).set(0)
        return sum(results)

    async def _end(self, ep: Episode, reason: str) -> int:
        n = await self._release_all(ep, reason)
        self.episodes.pop(ep.site, None)
        self._m().episode.labels(ep.site).set(0)
        return n

    # ------------------------------------------------------------------ helpers
    def _m(self) -> GuardMetrics:
        if self.metrics is None:
            self.metrics = GuardMetrics(CollectorRegistry())
        return self.metrics

    def _token(self, params: CopyGuardParams) -> str:
        path = params.control_token_file
        if path is None:
            return ""
        if path not in self._tokens:
            self._tokens[path] = read_token_file(path, "copy-guard control_token_file")
        return self._tokens[path]

    def _client(self, params: CopyGuardParams) -> ControlClient:
        """A control client with the route's token and hosts, on the controller's session."""
        session = self.services.get("session")
        if session is None:  # outside a controller (tests, tools): a session of our own
            if self._own_session is None:
                self._own_session = aiohttp.ClientSession()
            session = self._own_session
        return ControlClient(session, self._token(params), params.control_hosts)

    def _know(self, params: CopyGuardParams) -> None:
        self.known.setdefault(Path(params.registry_dir), params)

    def _save(self) -> None:
        by_dir: dict[Path, list[dict[str, Any]]] = {d: [] for d in self.known}
        for ep in self.episodes.values():
            by_dir.setdefault(Path(ep.params.registry_dir), []).append(ep.to_json())
        for reg_dir, episodes in by_dir.items():
            path = reg_dir / STATE_NAME
            if not episodes and not path.exists():
                continue
            atomic_write_json(path, {"episodes": episodes, "updated": time.time()})


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
