"""``retune-nginx``: an alert (``NginxResponseTimeHigh``, ``NginxMemoryHigh``) starts a keepalive sweep.

Route example (``controller.routes[]``)::

    - name: retune-nginx
      matchers: ['alertname=~"NginxResponseTimeHigh|NginxMemoryHigh"']
      action: retune-nginx
      cooldown: 6h                      # the engine delays a new tuning of the same nginx
      params:
        nginx_config: /etc/nginx/nginx.conf
        nginx_prefix: /etc/nginx
        health_url: http://127.0.0.1/
        candidates: [15, 30, 45, 60, 75]
        dwell: 5m                        # passive (default): live traffic, read from Prometheus
        window: "02:00-05:00"            # optional, UTC: only tune then

Behaviour:
- one tuning at a time: ``concurrency = 1`` and the target is the nginx config path (from the
  route's params, never from alert labels), so two alerts about the same proxy queue up behind
  one lock and the route's ``cooldown`` then applies to the second;
- outside ``window`` the firing alert is not acted on yet (counted as ``outside_window``): the
  engine records it ``deferred`` and runs it again when the window opens, if the alert still
  fires then (no cooldown started, no failure counted);
- passive mode by default (``controllers.nginx_tuner.passive``): each candidate is held for
  ``dwell`` under live traffic, then the Pareto choice is applied, or the current value kept
  when the pick is not significantly better. Errors rising during a dwell restore the last
  good value at once; every change is ``nginx -t``-checked and rolled back on failure;
- the "current" value is the one in force for the tuned scope (the named server's own, else
  the http block's, else nginx's 75 s); a config where a server or location below the tuned
  scope sets its own ``keepalive_timeout`` (so a tuned value would not reach its traffic), an
  ambiguous ``server_name`` or a shared snippet is refused before any trial ("tuning
  refused: ...", counted ``failed``, not retried);
- ``resolve`` undoes nothing: the chosen value is the new good configuration;
- metrics on the controller's /metrics: ``promreflex_nginx_tuner_*`` (state, trials, applied
  value) plus ``promreflex_nginx_tuner_retunes_total{result}`` and
  ``promreflex_nginx_tuner_last_retune_timestamp_seconds``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
from pathlib import Path
from typing import Any, Literal

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, Field, field_validator, model_validator

from controllers.actions.base import Action, ActionContext, Deferred, register
from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.config_edit import ConfigEditError
from controllers.nginx_tuner.nginx_ctl import NginxControl
from controllers.nginx_tuner.passive import DEFAULT_MEMORY_QUERY, PassiveMeasurer
from controllers.nginx_tuner.sweep import LoadMeasurer, Measure, Sweep, SweepSettings, write_results
from promreflex.config import Duration, Strict

RETUNE_RESULTS = ("changed", "kept", "outside_window", "failed")
MAX_SECONDS = 3600  # label values of the trial gauges: whole seconds 1..3600, a bounded set

_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def in_window(window: str | None, now: dt.datetime) -> bool:
    """``"HH:MM-HH:MM"`` in UTC, end exclusive; a window may cross midnight (``22:00-04:00``)."""
    if window is None:
        return True
    m = _WINDOW.match(window)
    if m is None:
        raise ValueError(f"window {window!r} is not HH:MM-HH:MM")
    start, end = int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])
    t = now.astimezone(dt.UTC)
    minute = t.hour * 60 + t.minute
    return start <= minute < end if start <= end else (minute >= start or minute < end)


def seconds_to_window(window: str | None, now: dt.datetime) -> float:
    """Seconds from ``now`` until ``window`` next opens (0 inside it)."""
    if window is None or in_window(window, now):
        return 0.0
    m = _WINDOW.match(window)
    assert m is not None  # in_window checked it
    t = now.astimezone(dt.UTC)
    opens = t.replace(hour=int(m[1]), minute=int(m[2]), second=0, microsecond=0)
    if opens <= t:
        opens += dt.timedelta(days=1)
    return (opens - t).total_seconds()


class RetuneParams(Strict):
    nginx_config: Path
    nginx_prefix: Path | None = None  # default: the config's folder
    nginx_binary: str = "/usr/sbin/nginx"
    pid_file: Path | None = None
    server_name: str | None = None
    health_url: str | None = None
    reload_timeout: Duration = 30.0
    candidates: list[int] = Field(default_factory=lambda: [15, 30, 45, 60, 75], min_length=2, max_length=40)
    repeats: int = Field(default=2, ge=1, le=10)
    early_stop: bool = True
    min_repeats: int = Field(default=2, ge=2)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    rule: Literal["sum", "utopia"] = "sum"
    max_error_ratio: float = Field(default=0.01, ge=0, lt=1)
    window: str | None = None
    mode: Literal["passive", "active"] = "passive"
    # passive
    site: str = Field(default="shop", pattern=r"^[a-zA-Z0-9_.-]+$")
    dwell: Duration = 300.0
    settle: Duration = 15.0
    memory_query: str = DEFAULT_MEMORY_QUERY
    min_requests: int = Field(default=20, ge=1)
    # active (a staging proxy, never production traffic)
    load_url: str | None = None
    users: int = Field(default=100, ge=1, le=5000)
    spawn_rate: float = Field(default=20, gt=0)
    duration: Duration = 20.0
    think_min: Duration = 0.5
    think_max: Duration = 8.0
    results_dir: Path | None = None

    @field_validator("candidates")
    @classmethod
    def _grid(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(not 1 <= c <= MAX_SECONDS for c in v):
            raise ValueError(f"candidates must be distinct whole seconds in 1..{MAX_SECONDS}")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            m = _WINDOW.match(v)
            if not m:
                raise ValueError("window must be HH:MM-HH:MM (UTC)")
            if m.group(1, 2) == m.group(3, 4):
                raise ValueError(f"window {v} is empty (start = end)")
        return v

    @field_validator("load_url", "health_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"must be an http(s) URL with a host, not {v!r}")
        return v

    @model_validator(mode="after")
    def _active_needs_url(self) -> RetuneParams:
        if self.mode == "active" and not self.load_url:
            raise ValueError("mode active needs load_url")
        return self


@register
class RetuneNginx(Action):
    """Re-measure keepalive_timeout and apply the Pareto choice, safely, one tuning at a time."""

    name = "retune-nginx"
    Params = RetuneParams
    concurrency = 1
    resolved_means = "nothing: the value the tuning chose stays applied"

    def __init__(self) -> None:
        super().__init__()
        self.metrics: TunerMetrics | None = None
        self.retunes: Counter | None = None
        self.last_run: Gauge | None = None
        self.services: dict[str, Any] = {}
        self._lock = asyncio.Lock()
        self.clock = lambda: dt.datetime.now(dt.UTC)

    def target(self, ctx: ActionContext) -> str:
        params: RetuneParams = ctx.params  # type: ignore[assignment]
        return f"nginx:{params.nginx_config}"

    def run_timeout(self, params: BaseModel) -> float:
        """A sweep measures every candidate ``repeats`` times (a dwell under live traffic, or a
        load run), each with a settle and a reload: far beyond the engine's 5-minute default.
        Bound it by that worst case plus 10 minutes, unless the route sets ``timeout``."""
        p = params if isinstance(params, RetuneParams) else RetuneParams.model_validate(params.model_dump())
        # (the current value is measured too when it is not a candidate; a trial may reload twice:
        # its own and a rollback's)
        per_trial = max(p.dwell, p.duration) + p.settle + 2 * p.reload_timeout
        return (len(p.candidates) + 1) * p.repeats * per_trial + 600.0

    async def start(self, services: dict[str, Any]) -> None:
        self.services = services
        registry = services.get("registry")
        if registry is None or self.metrics is not None:
            return
        self.metrics = TunerMetrics(range(1, MAX_SECONDS + 1), registry=registry)
        self.retunes = Counter("promreflex_nginx_tuner_retunes_total", "Alert-driven retunings, by outcome.", ["result"],
                               registry=registry)
        for r in RETUNE_RESULTS:
            self.retunes.labels(r)
        self.last_run = Gauge("promreflex_nginx_tuner_last_retune_timestamp_seconds",
                              "When the last alert-driven retuning ended (Unix time).", registry=registry)
        # A sweep killed mid-way (SIGKILL) left a trial value live: its original goes back
        # first. Then show the value in force from the start, not only after the first retuning.
        for p in self.route_params:
            if isinstance(p, RetuneParams):
                try:
                    recovered = await asyncio.to_thread(self._control(p).recover)
                    if recovered:
                        self.log.warning("%s: an interrupted sweep's original: %s", p.nginx_config, recovered)
                except Exception as e:  # noqa: BLE001 - said; the next sweep tries again before it starts
                    self.log.error("%s: cannot put back an interrupted sweep's original: %s", p.nginx_config, e)
                try:  # the value in force for the tuned scope (inherited from http, else 75 s)
                    seconds = await asyncio.to_thread(self._control(p).effective_seconds)
                except Exception as e:  # noqa: BLE001 - a config we cannot read yet is not fatal at start
                    self.log.warning("cannot read keepalive_timeout from %s: %s", p.nginx_config, e)
                    continue
                self.metrics.set_applied(seconds)

    def _count(self, result: str) -> None:
        if self.retunes is not None:
            self.retunes.labels(result).inc()
        if self.last_run is not None and result != "outside_window":
            self.last_run.set_to_current_time()

    async def fire(self, ctx: ActionContext) -> str:
        p: RetuneParams = ctx.params  # type: ignore[assignment]
        now = self.clock()
        if not in_window(p.window, now):
            self._count("outside_window")
            wait = seconds_to_window(p.window, now)
            raise Deferred(f"outside the allowed window {p.window} UTC; tuning when it opens if the alert still fires", wait)
        async with self._lock:
            return await self._retune(p, ctx.services or self.services)

    def _control(self, p: RetuneParams) -> NginxControl:
        return NginxControl(p.nginx_config, p.nginx_prefix or p.nginx_config.parent, p.nginx_binary,
                            server_name=p.server_name, health_url=p.health_url, pid_path=p.pid_file,
                            reload_timeout=p.reload_timeout, metrics=self.metrics)

    async def _retune(self, p: RetuneParams, services: dict[str, Any]) -> str:
        try:
            return await self._sweep(p, services)
        except Exception:
            self._count("failed")  # (the engine retries; the sweep put the pre-sweep config back)
            raise

    async def _sweep(self, p: RetuneParams, services: dict[str, Any]) -> str:
        ctl = self._control(p)
        recovered = await asyncio.to_thread(ctl.recover)  # before "current" is read: not a trial's value
        if recovered:
            self.log.warning("%s: an interrupted sweep's original: %s", p.nginx_config, recovered)
        try:
            # nothing to sweep when no value could reach the traffic (an override below the tuned
            # scope), the server name is ambiguous or the config cannot be read: said, not retried
            await asyncio.to_thread(ctl.check_tunable)
        except ConfigEditError as e:
            self._count("failed")
            return f"tuning refused: {e}"
        # the value in force: the scope's own, else inherited from http, else nginx's 75 s
        current = await asyncio.to_thread(ctl.effective_seconds)
        if self.metrics is not None:
            self.metrics.set_applied(current)
        measure: Measure
        if p.mode == "passive":
            prom = services.get("prometheus")
            if prom is None:
                raise RuntimeError("passive mode needs controller.prometheus_url")
            measure = PassiveMeasurer(prom, site=p.site, dwell_s=p.dwell, settle_s=p.settle, memory_query=p.memory_query,
                                      max_error_ratio=p.max_error_ratio, min_requests=p.min_requests)
        else:
            measure = LoadMeasurer(ctl, p.load_url or "", users=p.users, spawn_rate=p.spawn_rate, duration_s=p.duration,
                                   think_min=p.think_min, think_max=p.think_max)
        settings = SweepSettings(candidates=tuple(float(c) for c in p.candidates), repeats=p.repeats, confidence=p.confidence,
                                 rule=p.rule, max_error_ratio=p.max_error_ratio, early_stop=p.early_stop,
                                 min_repeats=p.min_repeats)
        sweep = Sweep(settings, ctl.apply, measure, current, metrics=self.metrics, progress=lambda line: self.log.info("%s", line),
                      journal=ctl)
        result = await sweep.run()
        result.load_average = os.getloadavg()
        if p.results_dir is not None:
            await asyncio.to_thread(write_results, result, p.results_dir, "retune", f"retune-nginx ({p.mode})")
        if ctl.journal_path.exists():  # the pre-sweep config could not be made live: retried
            raise RuntimeError(f"tuning failed and the pre-sweep config is not live yet: {result.final}")
        if not result.final_ok or result.choice is None:
            self._count("failed")
            return f"tuning failed: {result.final}; {result.runs_used} trials"
        c = result.choice
        self._count("kept" if c.kept_current else "changed")
        return f"{result.final.split(':')[0]} ({c.reason}); {result.runs_used} of {result.runs_planned} trials, front {list(c.front)}"
