"""The ``copy-guard`` action: slow down or pause every registered copy of the alert's site while
the site is overloaded, and make sure no copy stays stopped or throttled.

Route it from ``CopyGuardSiteOverloaded`` (and, to act earlier, ``CopyGuardSiteOverloadPredicted``;
the shipped route adds ``CopyGuardSiteCrowded`` with ``crowd: pause``, issue 16's fifth bench):

    - name: copy-guard
      matchers: ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"']
      action: copy-guard
      params: {mode: adaptive, crowd: pause, max_pause: 2m}

Three modes:
- ``adaptive`` (the default, and the shipped route): the alert opens an *episode*; from then on
  the action's supervisor reads the site's signal from Prometheus (served rate, threshold,
  demand, floor; one query for every site, the site label only compared) and runs the AIMD
  throttle of ``throttle.py``: each copy runs a share of its own speed, halved while the site is
  below its line, raised by a tenth while it is above, paused only in an emergency. A resolved
  alert does not resume the copies at once: the share climbs back, and the episode ends (copies
  free) when no alert holds it and the share is back at 1. Without Prometheus it falls back to
  the alert itself (firing: below).
- ``pause``: the paper's rule, pause while an alert fires; ``min_pause`` keeps each copy paused
  at least that long from ITS OWN pause (a copy that joined an open episode is not resumed
  early because the episode began earlier).
- ``throttle``: a fixed ``throttle_bytes_per_second`` for copiers (adopted processes are paused).

How a share reaches a copy: ``promreflex copy`` gets ``POST /throttle?share=S&lease=L`` (it
waits ``(1 - S) / S`` of each chunk's time); an adopted process is duty-cycled by the watchdog:
frozen ``1 - S`` of every ``duty_period`` (cgroup v2 ``cgroup.freeze``, the v1 freezer, or
SIGSTOP/SIGCONT, whichever the host offers; ``freeze.py``). Without the watchdog
(``watchdog: false``) nobody cycles, and an adopted copy below share 1 stays paused.

Control of ``promreflex copy`` processes goes through the controller's aiohttp session, to the
``control_url`` of their registry entry, and only to a loopback address unless the route names
the host in ``control_hosts``; the bearer token sent is the one in the route's
``control_token_file`` (read once by the controller; group/world-readable files are refused).
A registry entry names no token and no token file: whoever can write an entry must not be able
to make the controller send a secret anywhere. At start (and in ``check-config``) the registry
directory must be owned by root or the controller's user and not writable by group (but the
user's private group) or others, and so must every directory and link on the way to it
(:func:`~controllers.copy_guard.registry.check_dir`). Its default is absolute
(:func:`~controllers.copy_guard.registry.default_dir`); a relative ``registry_dir`` is resolved
against the configuration file's directory when validation is given ``config_dir`` in its
context, and refused otherwise (issue 16: resolved against each command's working directory,
the controller and the copies it should guard looked in different places).

An episode per site starts with the first firing alert and its alerts are its holders, by
fingerprint (the predictive alert resolving while the overload alert fires resumes nothing).
During an episode a supervisor task, every ``tick``: holds copies that registered after the
episode began, renews leases, applies the throttle's share, and at ``max_pause`` (from the first
pause of a copy it holds in ``pause`` mode, an emergency pause in ``adaptive`` mode) resumes (counted in
``promreflex_copy_guard_forced_resumes_total``: the CopyGuardForcedResume alert).

Never a copy left stopped or throttled:
- every pause and throttle has a lease: ``promreflex copy`` runs free again when the controller
  stops renewing; adopted processes are resumed by the watchdog process (``watchdog.py``);
- ``shutdown`` (controller stop) resumes everything it holds;
- the state (``<registry_dir>/copy-guard.state``, written atomically at every change, the
  throttle's share included) lists what is held; ``start`` resumes all of it after a crash,
  then holds again (at the saved share) only for holders Alertmanager confirms as still active
  (the engine itself does not fire again for an alert it had applied before the restart).
  Confirmed by the engine's rule for an absence (``services["alertmanager_presence"]``), not
  by one peer: a holder is confirmed when any Alertmanager peer lists it, dropped when one
  that can be believed omits it (running past ``alertmanager_restart_grace``, or it listed the
  alert since it started, or it started before the episode), and kept otherwise, unconfirmed
  and holding nothing: a peer that restarted (with the controller, when a host reboots) lists
  nothing until Prometheus re-sends. The grace bounds the wait.

Alert label values are data: the ``site`` label is only compared with registry entries' site
and with the label of the series Prometheus returns; it is never put into a query.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from controllers.actions.base import Action, ActionContext, register
from controllers.copy_guard import freeze
from controllers.copy_guard.registry import WATCH_NOTE_EVERY, Entry, Registry, check_dir, default_dir, note_watched
from controllers.copy_guard.throttle import EMERGENCY_REASONS, Settings, Signal, Throttle
from controllers.engine import PRESENCE
from promreflex.clients import PrometheusClient
from promreflex.config import Duration, is_loopback
from promreflex.fsutil import atomic_write_json, read_json
from promreflex.httpd import TokenFiles

log = logging.getLogger("promreflex.action.copy-guard")

STATE_NAME = "copy-guard.state"
RESUME_REASONS = ("resolved", "max_pause", "shutdown", "recovery", "ended")
VERDICTS = ("below", "severe", "hold", "above", "light", "quiet", "crowd", "max_pause")
HTTP_TIMEOUT = 2.0
SIGNAL_TIMEOUT = 2.0
#: How often holders left unconfirmed by a restart are asked about (every Alertmanager peer read),
#: from the end of one read to the start of the next.
CONFIRM_EVERY = 1.0
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$|^[0-9A-Fa-f:.]+$")

# The site's signal, every site at once (the site label is compared in Python, never put into
# the query). The recorded series are those of rules/copy-guard.rules.yml; `window` is the
# recorded window of the served rate (the shortest window holding 4 samples of the access-log
# counter), so a decision waits until the served rate holds only data from after the last
# change; for a Prometheus with older rules, the same ladder is computed here.
SIGNAL_QUERY = """
label_replace(site:promreflex_http_requests_served:rate1s, "promreflex_q", "served", "", "")
or label_replace(timestamp(site:promreflex_http_requests_served:rate1s), "promreflex_q", "at", "", "")
or label_replace(site:promreflex_copy_guard_threshold:rps, "promreflex_q", "threshold", "", "")
or label_replace(site:promreflex_copy_guard_demand:rps, "promreflex_q", "demand", "", "")
or label_replace(site:promreflex_copy_guard_asked:rps, "promreflex_q", "asked", "", "")
or label_replace(site:promreflex_copy_guard_demand_floor:rps, "promreflex_q", "floor", "", "")
or label_replace(site:promreflex_copy_guard_crowd:bool, "promreflex_q", "crowd", "", "")
or label_replace(site:promreflex_copy_guard_rate_window:seconds, "promreflex_q", "window", "", "")
or label_replace(120 / (count_over_time(site:promreflex_http_requests_served:rate1s[2m]) - 1 > 0), "promreflex_q", "evaluation", "", "")
or label_replace(
  max by (site) (1 + 0 * (count_over_time(promreflex_http_requests_total[1s]) >= 4))
  or max by (site) (5 + 0 * (count_over_time(promreflex_http_requests_total[5s]) >= 4))
  or max by (site) (60 + 0 * (count_over_time(promreflex_http_requests_total[1m]) >= 4))
  or max by (site) (120 + 0 * (count_over_time(promreflex_http_requests_total[2m]) >= 4))
  or max by (site) (300 + 0 * (count_over_time(promreflex_http_requests_total[5m]) >= 4))
  or max by (site) (120 + 0 * count_over_time(promreflex_http_requests_total[2m]))
  or max by (site) (300 + 0 * count_over_time(promreflex_http_requests_total[5m])),
  "promreflex_q", "window", "", "")
"""


class CopyGuardParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    registry_dir: Path = Field(default_factory=default_dir)
    sites: list[str] = Field(default_factory=list)  # empty: every site
    mode: Literal["adaptive", "pause", "throttle"] = "adaptive"
    throttle_bytes_per_second: int = Field(default=10 * 1024 * 1024, gt=0)  # mode throttle
    max_pause: Duration = Field(default=120.0, gt=0)
    min_pause: Duration = Field(default=0.0, ge=0)
    lease: Duration = Field(default=10.0, gt=0, le=600)
    tick: Duration = Field(default=0.2, gt=0, le=5)
    # The adaptive throttle (throttle.py): AIMD on the share of each copy's own speed.
    decrease: float = Field(default=0.5, gt=0, lt=1)
    increase: float = Field(default=0.1, gt=0, le=1)
    min_share: float = Field(default=0.1, gt=0, lt=1)
    band: float = Field(default=0.05, ge=0, le=1)
    severe: float = Field(default=0.5, ge=0, lt=1)
    emergency_after: Duration = Field(default=10.0, ge=0)
    period: Duration | None = Field(default=None, gt=0)  # None ("auto"): the signal's rate window
    demand_signal: Literal["demand", "asked"] = "demand"  # throttle.Settings.demand_signal
    crowd: Literal["ignore", "hold", "pause"] = "ignore"  # throttle.Settings.crowd
    duty_period: Duration = Field(default=1.0, ge=0.1, le=60)
    adopt_methods: list[Literal["cgroup2", "cgroup1", "signal"]] | None = None  # default: what the host offers
    watchdog: bool = True  # start the lease keeper (and duty cycler) for adopted copies
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

    @field_validator("period", mode="before")
    @classmethod
    def _auto(cls, value: Any) -> Any:
        return None if value == "auto" else value

    @field_validator("registry_dir")
    @classmethod
    def _absolute(cls, value: Path, info: ValidationInfo) -> Path:
        """Relative: against the configuration file's directory (``config_dir`` in the
        validation context); without one a relative path is refused (module doc)."""
        value = value.expanduser()
        if value.is_absolute():
            return value
        base = (info.context or {}).get("config_dir") if isinstance(info.context, dict) else None
        if not base:
            raise ValueError(f"must be an absolute path, not {str(value)!r}: a relative one would depend on the working "
                             "directory of each command (controller, copy, adopt); write it in full")
        return (Path(base) / value).absolute()

    def settings(self) -> Settings:
        return Settings(decrease=self.decrease, increase=self.increase, min_share=self.min_share, band=self.band,
                        severe=self.severe, emergency_after=self.emergency_after, period=self.period,
                        min_pause=self.min_pause, max_pause=self.max_pause, demand_signal=self.demand_signal,
                        crowd=self.crowd)


@dataclass
class Held:
    id: str
    kind: str
    control_url: str | None = None
    renewed: float = 0.0  # monotonic time of the last command that reached the copy
    since: float = field(default_factory=time.time)  # when this copy was first held (Unix s)
    share: float = 0.0  # what was applied last (adaptive; 0 paused)


@dataclass
class Episode:
    site: str
    params: CopyGuardParams
    since: float = field(default_factory=time.time)
    # fingerprint -> {alertname, confirmed, startsAt (ISO 8601; absent in a state written before)}
    holders: dict[str, dict[str, Any]] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)
    forced: bool = False
    resume_at: float | None = None  # pause mode, resolved: when the last held copy's min_pause ends
    throttle: Throttle | None = None  # adaptive mode
    counted: dict[str, int] = field(default_factory=dict)  # the throttle's counts already in the metrics

    def to_json(self) -> dict[str, Any]:
        return {"site": self.site, "params": self.params.model_dump(mode="json"), "since": self.since,
                "holders": self.holders, "forced": self.forced, "resume_at": self.resume_at,
                "held": {i: {"kind": h.kind, "control_url": h.control_url, "since": h.since}
                         for i, h in self.held.items()},
                "throttle": self.throttle.to_json() if self.throttle else None}

    @classmethod
    def from_json(cls, raw: dict[str, Any], params: CopyGuardParams) -> Episode:
        """Raises KeyError/TypeError/ValueError for a record it cannot read."""
        held = {}
        for i, h in dict(raw.get("held", {})).items():
            since = h.get("since")
            held[str(i)] = Held(str(i), str(h["kind"]), _str_or_none(h.get("control_url")),
                                since=float(since) if isinstance(since, (int, float)) else time.time())
        ep = cls(str(raw["site"]), params, float(raw["since"]),
                 {str(k): {"alertname": str(v.get("alertname", "")), "confirmed": False,
                           **({"startsAt": v["startsAt"]} if isinstance(v.get("startsAt"), str) else {})}
                  for k, v in dict(raw.get("holders", {})).items()},
                 held, bool(raw.get("forced", False)))
        if params.mode == "adaptive":
            ep.throttle = Throttle.from_json(params.settings(), raw.get("throttle"))
        return ep

    def share(self) -> float:
        """What every copy of the site should run at now (0 paused, 1 free)."""
        if self.throttle is not None:
            return self.throttle.share
        return 0.0

    def adaptive(self) -> bool:
        return self.throttle is not None


class GuardMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.paused = Gauge("promreflex_copy_guard_paused_copies", "Copies the guard holds paused now.",
                            ["site"], registry=registry)
        self.throttled = Gauge("promreflex_copy_guard_throttled_copies",
                               "Copies the guard holds throttled now (running a share of their speed, or capped).",
                               ["site"], registry=registry)
        self.registered = Gauge("promreflex_copy_guard_registered_copies", "Copies registered for the site.",
                                ["site"], registry=registry)
        self.episode = Gauge("promreflex_copy_guard_episode_active",
                             "1 while an overload episode of the site is open (an alert holds it, or the "
                             "throttle is climbing back).", ["site"], registry=registry)
        self.pauses = Counter("promreflex_copy_guard_pauses_total", "Copies paused (or throttled), renewals excluded.",
                              ["site"], registry=registry)
        self.episodes = Counter("promreflex_copy_guard_episodes_total", "Overload episodes begun.", ["site"],
                                registry=registry)
        self.resumes = Counter("promreflex_copy_guard_resumes_total", "Copies resumed, by reason.", ["site", "reason"],
                               registry=registry)
        self.forced = Counter("promreflex_copy_guard_forced_resumes_total",
                              "Pauses ended at max_pause while the site was still overloaded.", ["site"],
                              registry=registry)
        self.pause_seconds = Counter("promreflex_copy_guard_pause_seconds_total",
                                     "Seconds during which at least one copy of the site was held.", ["site"],
                                     registry=registry)
        self.errors = Counter("promreflex_copy_guard_errors_total", "Failed pause, renew or resume operations.",
                              ["site", "operation"], registry=registry)
        self.share = Gauge("promreflex_copy_guard_share",
                           "Share of their own speed the site's copies may use (1 free, 0 paused).", ["site"],
                           registry=registry)
        self.copy_share = Gauge("promreflex_copy_guard_copy_share",
                                "Share of its own speed a held copy was last told to use (removed when released; "
                                "adopted copies: the fraction of each duty period they run).", ["site", "id"],
                                registry=registry)
        self.decreases = Counter("promreflex_copy_guard_throttle_decreases_total",
                                 "Multiplicative decreases of the site's share (below the line).", ["site"],
                                 registry=registry)
        self.increases = Counter("promreflex_copy_guard_throttle_increases_total",
                                 "Additive increases of the site's share (above the line).", ["site"],
                                 registry=registry)
        self.emergencies = Counter("promreflex_copy_guard_emergency_pauses_total",
                                   "Emergency pauses of the adaptive throttle, by reason (severe: deficit beyond "
                                   "`severe`; floor: below the line at min_share for emergency_after).",
                                   ["site", "reason"], registry=registry)
        self.decisions = Counter("promreflex_copy_guard_throttle_decisions_total",
                                 "Decisions of the adaptive throttle, by what the signal said.", ["site", "verdict"],
                                 registry=registry)
        self.signal_errors = Counter("promreflex_copy_guard_signal_errors_total",
                                     "Reads of the signal from Prometheus that failed, or gave no usable served rate "
                                     "and threshold for a site the throttle holds (it follows the alerts then).",
                                     ["site"], registry=registry)

    def site(self, site: str) -> None:
        """Create the site's series at 0 (so increase() and absence alerts work from the start)."""
        for m in (self.paused, self.throttled, self.registered, self.episode, self.pauses, self.episodes, self.forced,
                  self.pause_seconds, self.decreases, self.increases, self.signal_errors):
            m.labels(site)
        self.share.labels(site).set(1)
        for reason in RESUME_REASONS:
            self.resumes.labels(site, reason)
        for op in ("pause", "renew", "resume"):
            self.errors.labels(site, op)
        for reason in EMERGENCY_REASONS:
            self.emergencies.labels(site, reason)
        for verdict in VERDICTS:
            self.decisions.labels(site, verdict)


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


def parse_signals(result: list[dict[str, Any]]) -> dict[str, Signal]:
    """The answer to :data:`SIGNAL_QUERY` -> one :class:`Signal` per site (values that are not
    finite numbers are dropped)."""
    values: dict[str, dict[str, float]] = {}
    for r in result:
        try:
            metric = r.get("metric", {})
            site, q, value = metric.get("site"), metric.get("promreflex_q"), float(r["value"][1])
        except (AttributeError, KeyError, IndexError, TypeError, ValueError):
            continue
        if isinstance(site, str) and isinstance(q, str) and math.isfinite(value):
            values.setdefault(site, {})[q] = value
    return {site: Signal(served=v.get("served"), threshold=v.get("threshold"), demand=v.get("demand"),
                         floor=v.get("floor"), at=v.get("at", 0.0), window=v.get("window", 1.0), asked=v.get("asked"),
                         crowd=v.get("crowd"), evaluation=v.get("evaluation", 0.0))
            for site, v in values.items()}


def release_adopted(registry: Registry, copy_id: str) -> None:
    """Resume an adopted copy and clear its pause record, under the entry's lock (so the
    watchdog's duty cycle cannot freeze it again in between)."""
    if registry.get(copy_id) is None:
        return
    with registry.locked(copy_id):
        entry = registry.get(copy_id)
        if entry is None or not entry.pause:
            return
        freeze.resume(entry.pause)
        entry.pause = None
        registry.update(entry)


@register
class CopyGuardAction(Action):
    """Throttles (or pauses) the alert's site's copies on fire; lets them go on resolve, after
    the throttle climbed back (or min_pause); every hold has a lease."""

    name = "copy-guard"
    Params = CopyGuardParams
    concurrency = 4
    alert_names = ("CopyGuardSiteOverloaded", "CopyGuardSiteOverloadPredicted", "CopyGuardSiteCrowded")
    resolved_means = ("let the site's copies run free once no alert of the site holds them: adaptive, when the "
                      "throttle's share is back at 1; pause, when each copy's min_pause has passed")

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
        self._tokens = TokenFiles()  # read again when the file changes (a rotated token)
        self._own_session: aiohttp.ClientSession | None = None
        self._signals: dict[str, Signal] | None = None
        self._signals_read = -math.inf  # monotonic time of the last read
        self._confirm_read = -math.inf  # monotonic time of the last confirmation read
        self._warned_watchers: set[tuple[Path, str]] = set()  # (registry, other controller) said once

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
        self._note_watches()
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
        signals = await self.signals(max_age=params.tick, sites=(site,)) if params.mode == "adaptive" else None
        async with self.lock:
            ep = self.episodes.get(site)
            if ep is None:
                ep = self.episodes[site] = Episode(site, params)
                self._m().episodes.labels(site).inc()
                if params.mode == "adaptive":
                    ep.throttle = Throttle(params.settings())
                    ep.throttle.open(time.time(), (signals or {}).get(site))
                    self._count(ep)
            ep.holders[ctx.alert.fingerprint] = {"alertname": ctx.alert.name, "confirmed": True,
                                                 "startsAt": ctx.alert.startsAt.isoformat()}
            ep.resume_at = None
            if ep.forced:
                self._save()
                return f"site {site}: resumed at max_pause earlier in this episode; not pausing again until it ends"
            held = await self._enforce(ep)
            self._save()
        if ep.throttle is not None:
            # The alert is the episode's reason, the throttle's own decisions (one per fresh
            # sample) set the share: a crowd alert joining an episode pauses at the next one.
            later = ("; a crowd pauses them at the throttle's next decision"
                     if ep.throttle.settings.crowd == "pause" and ctx.alert.name == "CopyGuardSiteCrowded"
                     and ep.throttle.share > 0
                     else "")
            return f"site {site}: {held} cop{'y' if held == 1 else 'ies'} at share {ep.throttle.share:g} now{later}"
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
            if ep.throttle is not None and not ep.throttle.free and ep.held:
                self._save()
                return f"site {site}: share {ep.throttle.share:g}, climbing back before the copies run free"
            if ep.throttle is None and ep.held:
                ep.resume_at = max(h.since for h in ep.held.values()) + ep.params.min_pause
                if time.time() < ep.resume_at:
                    self._save()
                    return f"site {site}: resume in {ep.resume_at - time.time():.1f}s (min_pause)"
            n = await self._end(ep, "resolved")
            self._save()
        return f"site {site}: {n} cop{'y' if n == 1 else 'ies'} resumed"

    # ------------------------------------------------------------------ the signal
    async def signals(self, max_age: float = 0.0, sites: tuple[str, ...] = ()) -> dict[str, Signal] | None:
        """Every site's signal from Prometheus (None without Prometheus or when it cannot be
        read: the throttle then follows the alerts). Reuses a reading younger than ``max_age``.
        A new reading that has nothing usable for one of ``sites`` is counted for it (the
        throttle of that site is blind: CopyGuardThrottleBlind)."""
        prom = self.services.get("prometheus")
        if prom is None:
            return None
        if self._signals is not None and time.monotonic() - self._signals_read < max_age:
            return self._signals
        try:
            if isinstance(prom, PrometheusClient):  # each replica of a pair gets the whole timeout
                servers = len(prom.base_urls)
                reading = prom.query(SIGNAL_QUERY, timeout=SIGNAL_TIMEOUT)
            else:
                servers, reading = 1, prom.query(SIGNAL_QUERY)
            result = await asyncio.wait_for(reading, SIGNAL_TIMEOUT * servers + 0.5)
        except Exception as e:  # noqa: BLE001 - counted; the alerts are the fallback
            log.debug("cannot read the sites' signal from Prometheus: %r", e)
            self._signals = None
        else:
            self._signals = parse_signals(result)
        self._signals_read = time.monotonic()
        for site in sites:
            sig = (self._signals or {}).get(site)
            if sig is None or not sig.usable():
                self._m().signal_errors.labels(site).inc()
        return self._signals

    # ------------------------------------------------------------------ recovery
    async def recover(self, params_list: list[CopyGuardParams]) -> int:
        """Resume everything a previous controller held (its state files), keep its holders as
        unconfirmed: the supervisor holds again only for those Alertmanager still has active
        (:meth:`_confirm`)."""
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
                        # hosts and token), not under what the state file says: the route that
                        # opened it, when several routes share the registry.
                        ep = Episode.from_json(raw, _route_of(raw, reg_dir, params_list, self.known[reg_dir]))
                    except (KeyError, TypeError, ValueError, AttributeError, ValidationError) as e:
                        log.warning("ignoring unreadable episode in %s: %r", reg_dir / STATE_NAME, e)
                        continue
                    resumed += await self._release_all(ep, "recovery")
                    if ep.throttle is not None and ep.throttle.paused:
                        # The copies ran again from their leases' end (and now, released): a pause
                        # taken up again starts over, or the controller's downtime counted toward
                        # max_pause (a false forced resume and its warning: a stranger's review).
                        ep.throttle.paused_since = time.time()
                    if ep.holders and ep.site not in self.episodes:
                        self.episodes[ep.site] = ep
                        log.info("recovered episode of %s (held by %d alert(s), awaiting confirmation)",
                                 ep.site, len(ep.holders))
            self._save()
        return resumed

    def _pending(self) -> dict[str, dict[str, Any]]:
        """The holders a previous controller left, not confirmed yet (fingerprint -> holder)."""
        return {fp: h for ep in self.episodes.values() for fp, h in ep.holders.items() if not h["confirmed"]}

    async def _ask_presence(self) -> dict[str, bool | None] | None:
        """The engine's judgement of the pending holders' alerts (``services["alertmanager_
        presence"]``: every peer read), at most once per ``CONFIRM_EVERY`` counted from the end
        of the last read; None when there is nothing to ask, it is not time yet, or no peer
        answered. The supervisor asks before it takes the action's lock: a peer that hangs
        delays no fire or resolve."""
        pending = self._pending()
        presence = self.services.get(PRESENCE)
        if not pending or presence is None or time.monotonic() - self._confirm_read < CONFIRM_EVERY:
            return None
        try:
            verdict: dict[str, bool | None] = await presence({fp: _starts(h) for fp, h in pending.items()})
        except Exception as e:  # noqa: BLE001 - unconfirmed holders simply wait for the next read
            log.debug("cannot confirm holders with Alertmanager: %r", e)
            return None
        finally:
            self._confirm_read = time.monotonic()
        return verdict

    async def _confirm(self, verdict: dict[str, bool | None] | None = None) -> bool:
        """Confirm or drop the holders a previous controller left (unconfirmed), every episode's
        at once, by the engine's judgement (``verdict``, read by the supervisor before it took
        the lock; else read here): confirmed when an Alertmanager peer lists the alert, dropped
        when one that can be believed omits it, kept (holding nothing) while only peers that
        restarted within the grace answered. Without Alertmanager every holder is confirmed;
        with one but without that judgement (outside a controller) they wait: the engine's
        resolve ends them. An episode whose every holder is let go ends there: its copies were
        released at the restart and run free (a throttle that climbed back from its saved share
        pushed a free copy down to 20 %, a review). Returns whether an episode ended."""
        pending = self._pending()
        if not pending:
            return False
        if self.services.get(PRESENCE) is None:
            if self.services.get("alertmanager") is None:
                for h in pending.values():
                    h["confirmed"] = True
            return False
        active = verdict if verdict is not None else await self._ask_presence()
        if active is None:
            return False
        ended = []
        for ep in self.episodes.values():
            for fp in [fp for fp in ep.holders if fp in pending]:
                if active.get(fp):
                    ep.holders[fp]["confirmed"] = True
                    log.info("site %s: alert %s (%s) is still active: held again", ep.site,
                             ep.holders[fp]["alertname"], fp)
                elif active.get(fp) is False:
                    log.info("site %s: alert %s (%s) is no longer active in Alertmanager: let go", ep.site,
                             ep.holders.pop(fp)["alertname"], fp)
                    if not ep.holders:
                        ended.append(ep)
        for ep in ended:
            log.info("site %s: every alert that held it ended while the controller was down: the episode ends",
                     ep.site)
            await self._end(ep, "resolved")
        return bool(ended)

    # ------------------------------------------------------------------ the supervisor
    def _note_watches(self) -> None:
        """Note this controller in every registry its routes watch (``copy-guard.watch``: what
        ``promreflex copy`` reads to tell a registry no guard watches), at the start and then
        every WATCH_NOTE_EVERY: a reload that adds a route on another registry is noted too."""
        self._watch_noted = time.monotonic()
        for reg_dir in {Path(p.registry_dir) for p in self.route_params if isinstance(p, CopyGuardParams)}:
            try:
                others = note_watched(reg_dir)
            except OSError as e:
                log.warning("cannot note the watch in %s: %r", reg_dir, e)
                continue
            for other in others:
                if (reg_dir, other) not in self._warned_watchers:
                    self._warned_watchers.add((reg_dir, other))
                    log.warning("copy registry %s is also watched by the controller %s: both guards write its "
                                "copy-guard.state and take up each other's episodes after a restart; give each "
                                "controller its own registry_dir", reg_dir, other)

    async def _supervise(self) -> None:
        while True:
            if time.monotonic() - getattr(self, "_watch_noted", 0.0) > WATCH_NOTE_EVERY:
                await asyncio.to_thread(self._note_watches)
            try:
                signals = None
                adaptive = tuple(site for site, ep in self.episodes.items() if ep.adaptive())
                if adaptive:
                    signals = await self.signals(max_age=self._read_every(), sites=adaptive)
                # Outside the lock (every peer read); {} when not asked: tick() does not ask then.
                verdict = await self._ask_presence() or {}
                async with self.lock:
                    await self.tick(signals, verdict)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the supervisor must survive anything
                log.exception("copy-guard supervisor tick failed")
            await asyncio.sleep(min([p.tick for p in self.known.values()] or [0.2]))

    def _read_every(self) -> float:
        """How often to read the signal: a quarter of the shortest rate window (a new sample
        every scrape), at least every tick."""
        windows = [s.window for s in (self._signals or {}).values()] or [1.0]
        return max(min(p.tick for p in self.known.values()) if self.known else 0.2, min(windows) / 4)

    async def tick(self, signals: dict[str, Signal] | None = None,
                   presence: dict[str, bool | None] | None = None) -> None:
        """One pass (caller holds the lock): confirm (with ``presence`` when the caller read it),
        decide, enforce, time out, release, count."""
        now, mono = time.time(), time.monotonic()
        elapsed, self._last_tick = mono - self._last_tick, mono
        m = self._m()
        changed = await self._confirm(presence)
        for site, ep in list(self.episodes.items()):
            if ep.held:
                m.pause_seconds.labels(site).inc(elapsed)
            if ep.throttle is not None:
                changed |= await self._tick_adaptive(ep, now, (signals or {}).get(site) if signals else None)
                continue
            if not ep.holders:
                # Resolved: each copy is let go once its own min_pause has passed; the others
                # keep their leases renewed (or they would resume by themselves), nothing new
                # is paused.
                for h in [h for h in ep.held.values() if now >= h.since + ep.params.min_pause]:
                    await self._release(ep, h, "resolved")
                    del ep.held[h.id]
                    changed = True
                if not ep.held:
                    await self._end(ep, "resolved")
                    changed = True
                else:
                    await self._enforce(ep, pause_new=False)
                continue
            if ep.forced or not any(h["confirmed"] for h in ep.holders.values()):
                continue
            # max_pause counts from the first pause of a copy held now, not from the episode's
            # start: an episode that held nothing (no copy registered: calibrate's own load, a
            # crowd before the backup) resumed nothing, raised CopyGuardForcedResume, and stood
            # down, and a copy that came later ran unguarded through the overload (reviews).
            if ep.held and now - min(h.since for h in ep.held.values()) >= ep.params.max_pause:
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
            held = list(current.held.values()) if current else []
            paused = sum(1 for h in held if h.share <= 0 and not (current and current.params.mode == "throttle"
                                                                  and h.kind == "copier"))
            m.paused.labels(site).set(paused)
            m.throttled.labels(site).set(len(held) - paused)
            m.episode.labels(site).set(1 if current else 0)
            m.share.labels(site).set(current.share() if current and (current.held or current.throttle) else 1)
        if changed:
            self._save()

    async def _tick_adaptive(self, ep: Episode, now: float, sig: Signal | None) -> bool:
        """One step of the throttle; returns True when something worth saving changed."""
        t = ep.throttle
        assert t is not None
        confirmed = any(h["confirmed"] for h in ep.holders.values())
        if ep.holders and not confirmed:
            return False  # after a restart: wait for Alertmanager before holding anything
        before = (t.share, t.forced)
        stepped = t.step(now, sig, alert_below=confirmed)
        self._count(ep)
        if t.forced != before[1]:
            if ep.held:
                self._m().forced.labels(ep.site).inc()
                log.warning("site %s: emergency pause reached max_pause (%.0fs): back to share %g", ep.site,
                            ep.params.max_pause, t.share)
            else:
                # No copy was held (none registered, say while calibrate loads the shop): nothing
                # was resumed, and CopyGuardForcedResume ("the site now suffers from the copy")
                # fired for 10 minutes after every calibration (a stranger's review). Not a stand-
                # down either: a copy that comes later still gets the emergency pause.
                t.forced, t.no_emergency = before[1], False
                log.info("site %s: the emergency pause reached max_pause holding no copy: back to share %g",
                         ep.site, t.share)
        if stepped:
            log.info("site %s: %s -> share %g (was %g)", ep.site, t.last_verdict, t.share, before[0])
        if not ep.holders and t.free:
            await self._end(ep, "resolved")
            return True
        held_before = set(ep.held)
        await self._enforce(ep)
        return stepped or set(ep.held) != held_before

    def _count(self, ep: Episode) -> None:
        """Carry the throttle's counts over to the metrics (both only grow)."""
        t, m, site = ep.throttle, self._m(), ep.site
        if t is None:
            return
        for key, n in t.counts().items():
            new = n - ep.counted.get(key, 0)
            if new <= 0:
                continue
            ep.counted[key] = n
            kind, _, label = key.partition(":")
            if kind == "decreases":
                m.decreases.labels(site).inc(new)
            elif kind == "increases":
                m.increases.labels(site).inc(new)
            elif kind == "emergency":
                m.emergencies.labels(site, label).inc(new)
            elif kind == "verdict":
                m.decisions.labels(site, label).inc(new)

    async def _enforce(self, ep: Episode, pause_new: bool = True) -> int:
        """Hold every registered copy of the site (only those already held unless ``pause_new``)
        at the episode's share; renew leases that are due; forget copies that ended. Returns
        how many copies are held."""
        reg = Registry(ep.params.registry_dir)
        entries = {e.id: e for e in reg.for_site(ep.site)}
        for copy_id in [i for i in ep.held if i not in entries]:
            del ep.held[copy_id]  # the copy finished (or died): nothing to hold
            self._m().resumes.labels(ep.site, "ended").inc()
            self._forget_share(ep.site, copy_id)
        mono = time.monotonic()
        share = ep.share()
        jobs = []
        for copy_id, entry in entries.items():
            held = ep.held.get(copy_id)
            if held is None:
                if pause_new:
                    jobs.append(self._hold(ep, entry, renew=False))
            elif held.share != share or mono - held.renewed >= ep.params.lease / 3:
                jobs.append(self._hold(ep, entry, renew=True))
        if jobs:
            await asyncio.gather(*jobs)
        return len(ep.held)

    async def _hold(self, ep: Episode, entry: Entry, renew: bool) -> None:
        p = ep.params
        held = ep.held.get(entry.id) or Held(entry.id, entry.kind, entry.control_url)
        share = ep.share()
        op = "renew" if renew else "pause"
        try:
            if entry.kind == "copier":
                control = self._client(p)
                if p.mode == "throttle":
                    await control(held, "throttle", bytes_per_second=p.throttle_bytes_per_second, lease=p.lease)
                elif p.mode == "adaptive" and share > 0:
                    await control(held, "throttle", share=f"{share:g}", lease=p.lease)
                else:
                    await control(held, "pause", lease=p.lease)
            else:
                await asyncio.to_thread(self._hold_adopted, ep, entry, share)
        except Exception as e:  # noqa: BLE001 - counted; retried at the next tick
            self._m().errors.labels(ep.site, op).inc()
            log.warning("site %s: could not %s copy %s: %r", ep.site, op, entry.id, e)
            return
        held.renewed = time.monotonic()
        held.share = share
        if ep.throttle is not None:
            self._m().copy_share.labels(ep.site, entry.id).set(share)
        if not renew:
            ep.held[entry.id] = held
            self._m().pauses.labels(ep.site).inc()
            how = (f"share {share:g}" if p.mode == "adaptive" else
                   "throttled" if p.mode == "throttle" and entry.kind == "copier" else "paused")
            log.info("site %s: copy %s (%s, pid %d): %s", ep.site, entry.id, entry.kind, entry.pid, how)

    def _hold_adopted(self, ep: Episode, entry: Entry, share: float) -> None:
        """Hold a foreign process at ``share`` (0: paused; else the watchdog runs it ``share`` of
        each duty period), or renew its lease. Under the entry's lock: the watchdog acts under
        it too."""
        reg = Registry(ep.params.registry_dir)
        with reg.locked(entry.id):
            current = reg.get(entry.id) or entry
            now = time.time()
            if current.pause and not freeze.intact(current.pause):
                freeze.forget(current.pause)  # its cgroup was removed, or its processes are gone
                current.pause = None
            if current.pause is None:
                current.pause = freeze.pause(freeze.cgroup_name(reg.dir, entry.id), pid=None if entry.pgid else entry.pid, pgid=entry.pgid,
                                             methods=list(ep.params.adopt_methods) if ep.params.adopt_methods else None)
                current.pause["since"] = now
            current.pause.update(until=now + ep.params.lease, duty=share, period=ep.params.duty_period)
            if share <= 0:
                freeze.set_frozen(current.pause, True)
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
                await asyncio.to_thread(release_adopted, Registry(ep.params.registry_dir), held.id)
        except Exception as e:  # noqa: BLE001
            self._m().errors.labels(ep.site, "resume").inc()
            log.warning("site %s: could not resume copy %s: %r", ep.site, held.id, e)
            return False
        self._m().resumes.labels(ep.site, reason).inc()
        self._forget_share(ep.site, held.id)
        return True

    def _forget_share(self, site: str, copy_id: str) -> None:
        try:
            self._m().copy_share.remove(site, copy_id)
        except KeyError:
            pass

    async def _release_all(self, ep: Episode, reason: str) -> int:
        results = await asyncio.gather(*(self._release(ep, h, reason) for h in ep.held.values()))
        ep.held.clear()
        self._m().paused.labels(ep.site).set(0)
        self._m().throttled.labels(ep.site).set(0)
        return sum(results)

    async def _end(self, ep: Episode, reason: str) -> int:
        n = await self._release_all(ep, reason)
        self.episodes.pop(ep.site, None)
        self._m().episode.labels(ep.site).set(0)
        self._m().share.labels(ep.site).set(1)
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
        return self._tokens.get(path, "copy-guard control_token_file")

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


def _route_of(raw: Any, reg_dir: Path, params_list: list[CopyGuardParams],
              fallback: CopyGuardParams) -> CopyGuardParams:
    """The current params of the route whose saved params the episode ``raw`` carries: of the
    routes on ``reg_dir``, the one agreeing with them on the most keys (the mode first). With two
    copy-guard routes on one registry (a pause route beside the shipped adaptive one), recovery
    took the first route's for every episode: a pause came back as a throttle at share 1."""
    saved = raw.get("params") if isinstance(raw, dict) else None
    candidates = [p for p in params_list if Path(p.registry_dir) == reg_dir]
    if not isinstance(saved, dict) or not candidates:
        return fallback

    def agreement(p: CopyGuardParams) -> tuple[bool, int]:
        mine = p.model_dump(mode="json")
        return mine.get("mode") == saved.get("mode"), sum(mine.get(k) == v for k, v in saved.items())

    return max(candidates, key=agreement)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _starts(holder: dict[str, Any]) -> datetime | None:
    """The ``startsAt`` of the episode a holder is the alert of (None: unknown, or not readable)."""
    try:
        starts = datetime.fromisoformat(str(holder.get("startsAt")))
    except ValueError:
        return None
    return starts if starts.tzinfo is not None else None
