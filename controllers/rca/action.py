"""The ``rca`` action: on ``ServiceResponseTimeHigh``, name the root cause and flag it.

One incident, not one analysis per alert. A fault in a deep service makes every service above
it slow at about the same time, so several ``ServiceResponseTimeHigh`` alerts arrive within a
few evaluations of each other. The first ``fire`` waits ``settle`` seconds, then takes every
``ServiceResponseTimeHigh`` that Alertmanager holds (firing, not silenced; inhibited ones
included, they are still slow) as the candidates, reads the call graph, latencies and resources
from Prometheus (:mod:`controllers.rca.promsource`), and runs :func:`controllers.rca.analyse`.
A later alert of a service the incident already explains is answered at once without a new
analysis; an alert of a service it does not explain starts a new analysis (the incident grows).

The root cause flagged is the head of the engine's ranking, the answer ``rca offline`` and
``rca eval`` give on the same data (what offline finds, the live loop finds); the dependency
rule and the line are evidence in the scores and the report, not a gate. A candidate that
neither is that root nor waits on it (two faults at once) adds its own root when the ranking
shows one with a significant anomaly (:func:`attribute`). They are flagged where people look:

- ``promreflex_root_cause{service}`` = the score, on the controller's ``/metrics``;
- ``MeshRootCause{service=<root>}`` posted to Alertmanager, and for each dependant (a slow
  service that waits on the root through slow callees) ``MeshRootCauseSymptom{service=<dependant>,
  root_cause=<root>}``. Alertmanager can only inhibit on *equal* labels, so the symptom alert
  carries the dependant's own ``service``; the inhibit rule (promreflex/stack.py and
  compose/alertmanager/alertmanager.yml)::

      source_matchers: ['alertname="MeshRootCauseSymptom"']
      target_matchers: ['alertname="ServiceResponseTimeHigh"']
      equal: [service]

  mutes the dependants' ``ServiceResponseTimeHigh`` and never the root's. Posted alerts carry
  ``endsAt = now + lease`` and are posted again every ``lease / 3`` while the incident lasts,
  so a controller that dies leaves nothing behind for longer than the lease;
- the JSON report (``report``), which ``promreflex rca explain`` prints as the chain of reasoning.

The incident lasts while a flagged root that was alerting still fires (or, when no root was
alerting, while any service it explains fires). It is checked on every ``resolve`` and every
refresh; at its end the gauge is cleared and the posted alerts are ended (``endsAt = now``).
A ``resolve`` that only reflects an inhibition or a silence (the engine treats a muted alert
as resolved) therefore changes nothing while the root is still slow.

"Still fires" is the engine's rule for an absence, not one Alertmanager peer's listing: the
incident keeps the fingerprint and ``startsAt`` of each alert it watches (those Alertmanager
listed for the watched services at the analysis, the triggering one, and any later one of a
watched service: its ``fire``, or a peer's listing when the others are gone), and asks ``services["alertmanager_presence"]`` (:meth:`Engine.presence`,
inhibited and silenced alerts included). It continues while any of them is listed by a peer, or its
absence is unproven (only peers that restarted within ``alertmanager_restart_grace``
answered: a peer that restarted with the controller, when a host reboots, lists nothing until
Prometheus re-sends), and ends only when every one's absence is proven. Without that service
(no Alertmanager, or the action used outside a controller), and for an incident file written
before the fingerprints were kept (until a read lists an alert of a watched service, whose
fingerprint it then adopts), the check is by service as before: over the alerts Alertmanager
lists (every peer's, when the client can read them apart).

The incident survives a controller restart: it is kept in ``<report>.incident.json`` (written
atomically whenever it changes, removed when it ends). The engine does not fire again for
alerts it has already handled, so without this a restarted controller would forget the root
cause while it still fires. At start the action reads the file back, sets the gauge, checks
at once whether the incident is over, and renews the posted alerts if it is not.

Label values are data: service names only ever become label values of posted alerts and of
the gauge, and (escaped, via promsource) PromQL string literals. Nothing is executed and no
path is built from them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field, model_validator

from controllers.actions.base import Action, ActionContext, register
from controllers.engine import PRESENCE
from controllers.rca.engine import analyse
from controllers.rca.models import AnalysisConfig, Finding
from controllers.rca.presets import DEFAULT_REPORT, MESH_QUERIES
from controllers.rca.promsource import PromSourceConfig, collect
from promreflex.clients import iso
from promreflex.config import Duration, Strict
from promreflex.fsutil import atomic_write_json

log = logging.getLogger("promreflex.action.rca")

FINDING_RESULTS = ("root_cause", "no_root_cause", "no_candidates", "error")

DEFAULT_THRESHOLD_QUERY = "mesh:promreflex_mesh_response_time_threshold_seconds:default"


class RcaParams(Strict):
    """Route parameters of the ``rca`` action.

    ``settle``: how long the first alert of an incident waits so alerts raised by the same
    fault arrive together (they fire within a rule evaluation or two of each other).
    ``pending_wait``: then, while Prometheus holds ``alertname`` alerts *pending* (their
    condition holds, ``for:`` has not elapsed), wait for them to fire or clear, up to this long
    (0: do not wait). In a cascade the root's own alert can be seconds behind a neighbour's
    that a shared host or disk slowed first; analysing without it names the neighbour.
    ``lease``: ``endsAt`` of the posted alerts, renewed every ``lease / 3``.
    ``source``: what to read from Prometheus (windows, step, PromQL templates; ``resources``
    takes a preset, ``cadvisor`` or ``process``, or a mapping cpu/memory/disk_io -> template
    with ``service="$service"``). ``analysis``: the decision's knobs. ``threshold_query``:
    the candidate line is read from Prometheus (the rules' threshold) when it answers, so the
    analysis and the alert agree; ``null`` uses ``analysis.threshold_s``.
    """

    alertname: str = "ServiceResponseTimeHigh"
    service_label: str = "service"
    settle: Duration = 2.0
    pending_wait: Duration = 20.0  # longer than the rules' for: 15s
    lease: Duration = 60.0
    report: Path = DEFAULT_REPORT
    source: PromSourceConfig = Field(default_factory=lambda: PromSourceConfig.model_validate(
        {"queries": MESH_QUERIES, "window": "2m", "baseline": "10m", "step": "5s"}))
    # Online, the candidates are the services whose ServiceResponseTimeHigh fires (as the issue
    # asks), and a dependency is healthy unless it alerts too: the relative z-score test is for
    # offline data that has no alerts. With it on, small absolute wobbles of a fast callee (a
    # database at 20 ms against 5 ms) made healthy callees "slow" and demoted the true root
    # cause (bench/rca: AC@1 0.72 with it).
    analysis: AnalysisConfig = AnalysisConfig(relative=False)
    threshold_query: str | None = DEFAULT_THRESHOLD_QUERY
    root_alertname: str = "MeshRootCause"
    symptom_alertname: str = "MeshRootCauseSymptom"
    severity: str = "critical"

    @model_validator(mode="before")
    @classmethod
    def _mesh_query_defaults(cls, data: Any) -> Any:
        """A partial ``source`` keeps the mesh defaults for what it does not set."""
        if isinstance(data, dict) and isinstance(data.get("source"), dict):
            source = dict(data["source"])
            queries = source.get("queries")
            if queries is None or isinstance(queries, dict):
                source["queries"] = {**MESH_QUERIES, **(queries or {})}
            source.setdefault("window", "2m")
            source.setdefault("baseline", "10m")
            source.setdefault("step", "5s")
            data = {**data, "source": source}
        return data

    @model_validator(mode="after")
    def _positive(self) -> RcaParams:
        if self.settle < 0 or self.pending_wait < 0 or self.lease <= 0:
            raise ValueError("settle and pending_wait must be >= 0 and lease above 0")
        return self


def _waits_on(service: str, calls: dict[str, list[str]], slow: set[str]) -> set[str]:
    """What ``service`` may be waiting for: its callees, and further down only through slow
    callees (a fast callee passes no slowness up, whatever happens below it)."""
    seen: set[str] = set()
    todo = [service]
    while todo:
        for callee in calls.get(todo.pop(), []):
            if callee not in seen and callee != service:
                seen.add(callee)
                if callee in slow:
                    todo.append(callee)
    return seen


def attribute(finding: Finding, candidates: set[str]) -> tuple[dict[str, float], dict[str, str]]:
    """(flagged roots -> score, in rank order; dependant -> its root) for the given candidates.

    The head of the ranking is the root cause, as offline (``rca offline``/``rca eval`` score
    the same ranking): the dependency rule and the line are evidence inside the scores and the
    report, not a gate here. A candidate that neither is a flagged root nor waits on one (two
    faults at once) gets its own: the best-ranked of itself and what it waits on, flagged when
    its score is a significant anomaly (``config.z_threshold``), never on noise. Dependants are
    the slow services (candidates or not) that wait on a flagged root through slow callees;
    each is attributed to the best-ranked root it waits on.
    """
    ranking = finding.ranking
    if not ranking or ranking[0].score <= 0:
        return {}, {}
    rank = {v.service: v.rank for v in ranking}
    score = {v.service: v.score for v in ranking}
    calls = {v.service: v.dependencies for v in ranking}
    slow = {v.service for v in ranking if v.slow} | candidates
    waits = {s: _waits_on(s, calls, slow) for s in slow}
    flagged = [ranking[0].service]
    for s in sorted(candidates, key=lambda c: rank.get(c, len(rank) + 1)):
        if s in flagged or waits[s] & set(flagged):
            continue
        own = min([x for x in (s, *waits[s]) if x in rank], key=rank.__getitem__, default=None)
        if own is not None and own not in flagged and score[own] >= finding.config.z_threshold:
            flagged.append(own)
    flagged.sort(key=rank.__getitem__)
    roots = {r: score[r] for r in flagged}
    symptoms = {
        s: next(r for r in flagged if r in waits[s])
        for s in sorted(slow) if s not in roots and waits[s] & set(roots)
    }
    return roots, symptoms


@dataclass
class Incident:
    started: datetime
    params: RcaParams
    finding: Finding
    roots: dict[str, float]
    symptoms: dict[str, str]
    covered: set[str]  # services this analysis explains: a new alert of one of them is no news
    watch: set[str]  # the incident lasts while one of these still fires
    posted: dict[tuple[tuple[str, str], ...], dict[str, Any]] = field(default_factory=dict)
    # The watched services' alerts: fingerprint -> {"service", "startsAt" (ISO 8601 or None)}.
    # Empty in an incident file written before they were kept: then judged by service.
    alerts: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "promreflex.rca.incident", "version": 1, "started": iso(self.started),
                "finding": self.finding.model_dump(mode="json"), "roots": self.roots, "symptoms": self.symptoms,
                "covered": sorted(self.covered), "watch": sorted(self.watch), "posted": list(self.posted.values()),
                "alerts": self.alerts}

    def starts(self) -> dict[str, datetime | None]:
        """The watched alerts, as :meth:`Engine.presence` takes them (fingerprint -> startsAt)."""
        return {fp: _when(a.get("startsAt")) for fp, a in self.alerts.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any], params: RcaParams) -> Incident:
        if data.get("kind") != "promreflex.rca.incident" or data.get("version") != 1:
            raise ValueError(f"not a version-1 rca incident (kind {data.get('kind')!r}, version {data.get('version')!r})")
        posted = {tuple(sorted(a["labels"].items())): a for a in data["posted"]}
        return cls(started=datetime.fromisoformat(data["started"].replace("Z", "+00:00")), params=params,
                   finding=Finding.from_json(json.dumps(data["finding"])),
                   roots={str(k): float(v) for k, v in data["roots"].items()},
                   symptoms={str(k): str(v) for k, v in data["symptoms"].items()},
                   covered=set(map(str, data["covered"])), watch=set(map(str, data["watch"])), posted=posted,
                   alerts=_alerts_of(data.get("alerts")))


def incident_path(report: str | Path) -> Path:
    """Where the incident of the action writing ``report`` is kept across restarts."""
    path = Path(report)
    return path.with_name(path.stem + ".incident.json")


class RcaMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.root_cause = Gauge(
            "promreflex_root_cause", "Score of each service flagged as the root cause of the current incident (absent: none).",
            ["service"], registry=registry)
        self.findings = Counter(
            "promreflex_rca_findings_total", "Root-cause analyses run by the rca action, by outcome.",
            ["result"], registry=registry)
        self.last_finding = Gauge(
            "promreflex_rca_last_finding_timestamp_seconds", "Unix time of the last analysis that named a root cause.",
            registry=registry)
        self.posts = Counter(
            "promreflex_rca_alert_posts_total", "Posts of MeshRootCause/MeshRootCauseSymptom alerts to Alertmanager.",
            ["result"], registry=registry)
        for result in FINDING_RESULTS:
            self.findings.labels(result)
        for result in ("ok", "error"):
            self.posts.labels(result)


@register
class RcaAction(Action):
    """Names the root cause of slow services and flags it (gauge, alerts with inhibition, report)."""

    name = "rca"
    Params = RcaParams
    concurrency = 1
    resolved_means = "when the incident's slow root stops firing: gauge cleared, posted alerts ended"

    def __init__(self) -> None:
        super().__init__()
        self.metrics: RcaMetrics | None = None
        self.services: dict[str, Any] = {}
        self.incident: Incident | None = None
        self._refresher: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def target(self, ctx: ActionContext) -> str:
        # One incident at a time: every transition of this action is serialised.
        return "rca"

    async def start(self, services: dict[str, Any]) -> None:
        self.services = services
        self.metrics = RcaMetrics(services.get("registry") or CollectorRegistry())
        for p in self.route_params:
            if isinstance(p, RcaParams) and self.incident is None:
                self.incident = await asyncio.to_thread(self._restore, p)
        if self.incident is not None:
            for root, score in self.incident.roots.items():
                self._m().root_cause.labels(root).set(score)
            try:  # the resumed incident's finding is the last one that named a root (read 0, 1970, before)
                found = datetime.fromisoformat(self.incident.finding.created_at.replace("Z", "+00:00"))
                self._m().last_finding.set(found.timestamp())
            except (AttributeError, ValueError):
                pass
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(first_wait=0.0))

    @staticmethod
    def _restore(p: RcaParams) -> Incident | None:
        """The incident a previous run left in progress, if any; a damaged file is set aside."""
        path = incident_path(p.report)
        try:
            data = json.loads(path.read_text())
            inc = Incident.from_json(data, p)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            aside = path.with_name(path.name + ".unreadable")
            log.error("cannot resume the rca incident in %s (%s); moved it to %s", path, e, aside.name)
            try:
                path.replace(aside)
            except OSError:
                pass
            return None
        log.info("resumed the rca incident of %s: root cause %s", inc.started.isoformat(), ", ".join(inc.roots))
        return inc

    async def _persist(self) -> None:
        inc = self.incident
        if inc is None:
            return
        try:
            await asyncio.to_thread(atomic_write_json, incident_path(inc.params.report), inc.to_json())
        except OSError as e:  # the incident goes on; only a restart would forget it
            log.warning("cannot save the rca incident: %r", e)

    async def shutdown(self) -> None:
        """Stop renewing. The posted alerts expire at the end of their lease by themselves."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None

    def _m(self) -> RcaMetrics:
        if self.metrics is None:
            self.metrics = RcaMetrics(CollectorRegistry())
        return self.metrics

    # ------------------------------------------------------------------ transitions
    async def fire(self, ctx: ActionContext) -> str:
        p: RcaParams = ctx.params  # type: ignore[assignment]
        self.services = ctx.services or self.services
        service = ctx.labels.get(p.service_label, "")
        async with self._lock:
            inc = self.incident
            if inc is not None and service in inc.covered:
                if service in inc.watch and _new_episode(inc.alerts.get(ctx.alert.fingerprint), ctx):
                    inc.alerts[ctx.alert.fingerprint] = {"service": service, "startsAt": _iso(ctx)}
                    await self._persist()
                return f"{service or 'alert'} belongs to the current incident: root cause {', '.join(inc.roots)}"
            await asyncio.sleep(p.settle)
            await self._await_pending(p)
            return await self._analyse(p, service, ctx)

    async def _await_pending(self, p: RcaParams) -> None:
        """Wait (at most ``pending_wait``) until no ``alertname`` alert is pending in Prometheus."""
        prom = self.services.get("prometheus")
        if prom is None or p.pending_wait <= 0:
            return
        expr = f"ALERTS{{alertname={json.dumps(p.alertname)},alertstate=\"pending\"}}"
        deadline = asyncio.get_running_loop().time() + p.pending_wait
        while True:
            try:
                pending = await prom.query(expr)
            except Exception as e:  # noqa: BLE001 - waiting is a refinement; analyse without it
                log.warning("cannot read pending alerts (%r); analysing now", e)
                return
            if not pending or asyncio.get_running_loop().time() >= deadline:
                return
            await asyncio.sleep(min(0.5, p.pending_wait))

    async def resolve(self, ctx: ActionContext) -> str:
        async with self._lock:
            if self.incident is None:
                return "no incident in progress"
            return await self._check()

    # ------------------------------------------------------------------ analysis
    async def _analyse(self, p: RcaParams, trigger: str, ctx: ActionContext | None = None) -> str:
        m = self._m()
        prom = self.services.get("prometheus")
        if prom is None:
            m.findings.labels("error").inc()
            raise RuntimeError("the rca action needs Prometheus (controller.prometheus_url)")
        listed = await self._candidates(p)
        if listed is None:  # Alertmanager unreachable: trust the alert that called us
            listed = {trigger: {}} if trigger else {}
        if trigger in listed and ctx is not None:  # the alert that called us is watched too
            listed[trigger].setdefault(ctx.alert.fingerprint, _iso(ctx))
        candidates = set(listed)
        if not candidates:
            m.findings.labels("no_candidates").inc()
            return f"no {p.alertname} firing any more: nothing to analyse"
        try:
            inputs = await collect(prom, p.source)
            cfg = await self._analysis_config(prom, p)
        except Exception:
            m.findings.labels("error").inc()
            raise
        inputs = inputs.model_copy(update={"alerting": sorted(set(inputs.alerting) | candidates)})
        finding = analyse(inputs, cfg)
        await asyncio.to_thread(finding.save, p.report)
        roots, symptoms = attribute(finding, candidates)
        if not roots:
            m.findings.labels("no_root_cause").inc()
            kept = f"; the current incident (root cause {', '.join(self.incident.roots)}) stays" if self.incident else ""
            return f"candidates {', '.join(sorted(candidates))}: no root cause named{kept}; report {p.report}"
        m.findings.labels("root_cause").inc()
        m.last_finding.set(datetime.now(UTC).timestamp())

        alerting_roots = set(roots) & candidates
        previous = self.incident
        watch = alerting_roots or (candidates | set(symptoms))
        alerts = {fp: a for fp, a in (previous.alerts if previous else {}).items() if a.get("service") in watch}
        alerts.update({fp: {"service": s, "startsAt": starts}
                       for s in sorted(watch) for fp, starts in listed.get(s, {}).items()})
        self.incident = Incident(
            started=previous.started if previous else datetime.now(UTC),
            params=p, finding=finding, roots=roots, symptoms=symptoms,
            covered=candidates | set(roots) | set(symptoms),
            watch=watch, posted=previous.posted if previous else {}, alerts=alerts,
        )
        m.root_cause.clear()
        for root, score in roots.items():
            m.root_cause.labels(root).set(score)
        await self._post()
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())
        flagged = ", ".join(f"{r} (score {s:.2f})" for r, s in roots.items())
        deps = f"; dependants {', '.join(sorted(symptoms))} inhibited" if symptoms else ""
        return f"root cause {flagged} of {', '.join(sorted(candidates))}{deps}; report {p.report}"

    async def _analysis_config(self, prom: Any, p: RcaParams) -> AnalysisConfig:
        if not p.threshold_query:
            return p.analysis
        try:
            value = await prom.scalar(p.threshold_query)
        except Exception as e:  # noqa: BLE001 - the configured line is the fallback
            log.warning("threshold query failed (%r); using analysis.threshold_s", e)
            return p.analysis
        if value is None or not value > 0 or value == float("inf"):
            return p.analysis
        return p.analysis.model_copy(update={"threshold_s": value})

    async def _candidates(self, p: RcaParams) -> dict[str, dict[str, str | None]] | None:
        """Services whose ``alertname`` alert Alertmanager holds firing (inhibited included,
        silenced not: a service muted on purpose is no candidate), each with its alerts: fingerprint -> startsAt. A union over every peer when the client
        reads them apart (a peer that restarted or lags lists less; a listing is proof enough
        to analyse), else the one peer reads stick to; None when no peer can be asked."""
        am = self.services.get("alertmanager")
        if am is None:
            return None
        try:
            items = await held_alerts(am)
        except Exception as e:  # noqa: BLE001 - a failed read is "unknown", never "none firing"
            log.warning("cannot read Alertmanager's alerts: %r", e)
            return None
        out: dict[str, dict[str, str | None]] = {}
        for i in items:
            labels = i.get("labels")
            if not isinstance(labels, dict) or labels.get("alertname") != p.alertname:
                continue
            service = labels.get(p.service_label)
            if not isinstance(service, str) or not service:
                continue
            fps = out.setdefault(service, {})
            fp = i.get("fingerprint")
            if isinstance(fp, str) and fp:
                fps[fp] = i["startsAt"] if isinstance(i.get("startsAt"), str) else None
        return out

    # ------------------------------------------------------------------ incident lifecycle
    async def _check(self) -> str:
        """End the incident when nothing it watches fires any more: with the engine's judgement
        (``services["alertmanager_presence"]``) when every watched alert's absence is proven,
        else (no such service, or an incident file without fingerprints) when Alertmanager
        lists no alert of a watched service."""
        inc = self.incident
        assert inc is not None
        presence = self.services.get(PRESENCE)
        if presence is not None and inc.alerts:
            return await self._check_presence(inc, presence)
        listed = await self._candidates(inc.params)
        if listed is None:
            return "cannot read Alertmanager: the incident is kept until it can"
        still = sorted(inc.watch & set(listed))
        if still:
            if presence is not None:  # an incident from an older file: judged by presence from now on
                inc.alerts.update({fp: {"service": s, "startsAt": starts}
                                   for s in still for fp, starts in listed[s].items()})
                if inc.alerts:
                    await self._persist()
            return f"incident continues: {', '.join(still)} still firing (root cause {', '.join(inc.roots)})"
        await self._end()
        return f"incident over: {', '.join(sorted(inc.watch))} no longer firing; root-cause flags cleared"

    async def _check_presence(self, inc: Incident, presence: Any) -> str:
        try:
            verdict: dict[str, bool | None] = await presence(inc.starts(), inhibited=True, silenced=True)
        except Exception as e:  # noqa: BLE001 - no peer answered: "unknown", never "none firing"
            log.warning("cannot read Alertmanager's alerts: %r", e)
            return "cannot read Alertmanager: the incident is kept until it can"
        roots = ", ".join(inc.roots)

        def services(value: bool | None) -> str:
            return ", ".join(sorted({str(inc.alerts[fp].get("service")) for fp, v in verdict.items() if v is value}))

        if any(verdict.values()):
            return f"incident continues: {services(True)} still firing (root cause {roots})"
        if any(v is None for v in verdict.values()):
            return (f"incident continues: {services(None)} not listed, but only Alertmanager peers that restarted "
                    f"within the grace answered (root cause {roots})")
        # Every watched alert is gone; a watched service may have another one the engine never
        # passed on (one inhibited from its start is never notified): a listing proves it fires.
        listed = await self._candidates(inc.params)
        if listed is None:
            return "cannot read Alertmanager: the incident is kept until it can"
        new = {fp: {"service": s, "startsAt": starts}
               for s in sorted(inc.watch & set(listed)) for fp, starts in listed[s].items() if fp not in inc.alerts}
        if new:
            inc.alerts.update(new)
            await self._persist()
            return (f"incident continues: {', '.join(sorted({str(a['service']) for a in new.values()}))} "
                    f"still firing (root cause {roots})")
        await self._end()
        return f"incident over: {', '.join(sorted(inc.watch))} no longer firing; root-cause flags cleared"

    async def _end(self) -> None:
        inc = self.incident
        assert inc is not None
        self.incident = None
        self._m().root_cause.clear()
        try:
            await asyncio.to_thread(incident_path(inc.params.report).unlink, missing_ok=True)
        except OSError as e:  # a restart would resume it, find nothing firing and end it again
            log.warning("cannot remove the rca incident file: %r", e)
        now = datetime.now(UTC)
        ended = [{**a, "endsAt": iso(now)} for a in inc.posted.values()]
        inc.posted.clear()
        refresher, self._refresher = self._refresher, None
        if refresher is not None and refresher is not asyncio.current_task():
            refresher.cancel()
        await self._send(ended)

    def _desired(self, inc: Incident) -> list[dict[str, Any]]:
        p = inc.params
        explain = "Run `promreflex rca explain` for the chain of reasoning."
        last_step = inc.finding.steps[-1] if inc.finding.steps else ""
        alerts = []
        for root, score in inc.roots.items():
            deps = sorted(d for d, r in inc.symptoms.items() if r == root)
            alerts.append({
                "labels": {"alertname": p.root_alertname, "service": root, "severity": p.severity},
                "annotations": {
                    "summary": f"{root} is the root cause of slow responses"
                               + (f" of {', '.join(deps)}" if deps else "") + ".",
                    "description": f"{last_step} {explain}".strip(),
                    "score": f"{score:.2f}",
                    "runbook_url": "https://github.com/promreflex/promreflex/blob/main/docs/runbook.md#meshrootcause",
                },
            })
        for dep, root in sorted(inc.symptoms.items()):
            alerts.append({
                "labels": {"alertname": p.symptom_alertname, "service": dep, "root_cause": root, "severity": "none"},
                "annotations": {
                    "summary": f"{dep} is slow because {root} is; its {p.alertname} is inhibited.",
                    "description": f"{dep} waits on {root} (chain of slow dependencies). {explain}",
                    "runbook_url": "https://github.com/promreflex/promreflex/blob/main/docs/runbook.md#meshrootcausesymptom",
                },
            })
        return alerts

    async def _post(self) -> None:
        """Post the incident's alerts with a fresh lease; end those it no longer wants."""
        inc = self.incident
        assert inc is not None
        now = datetime.now(UTC)
        ends = iso(now + timedelta(seconds=inc.params.lease))
        wanted: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for a in self._desired(inc):
            key = tuple(sorted(a["labels"].items()))
            starts = inc.posted[key]["startsAt"] if key in inc.posted else iso(now)
            wanted[key] = {**a, "startsAt": starts, "endsAt": ends}
        gone = [{**a, "endsAt": iso(now)} for k, a in inc.posted.items() if k not in wanted]
        inc.posted = wanted
        await self._persist()
        await self._send(gone + list(wanted.values()))

    async def _send(self, alerts: list[dict[str, Any]]) -> None:
        am = self.services.get("alertmanager")
        if am is None or not alerts:
            return
        try:
            await am.post_alerts(alerts)
        except Exception as e:  # noqa: BLE001 - counted; the next refresh posts again
            self._m().posts.labels("error").inc()
            log.warning("posting %d alert(s) to Alertmanager failed: %r", len(alerts), e)
            return
        self._m().posts.labels("ok").inc()

    async def _refresh_loop(self, first_wait: float | None = None) -> None:
        """Renew the lease every ``lease / 3`` until the incident ends (one loop at a time: a
        loop that is no longer the action's refresher stops)."""
        me = asyncio.current_task()
        wait = first_wait
        while (inc := self.incident) is not None and self._refresher is me:
            await asyncio.sleep(inc.params.lease / 3 if wait is None else wait)
            wait = None
            async with self._lock:
                if self.incident is None or self._refresher is not me:
                    return
                try:
                    await self._check()
                    if self.incident is not None:
                        await self._post()
                except Exception:  # noqa: BLE001 - keep renewing; the lease bounds any damage
                    log.exception("rca refresh failed")


async def held_alerts(am: Any) -> list[dict[str, Any]]:
    """Alerts Alertmanager holds as firing, inhibited ones included (silenced ones not): the
    candidates of an analysis, since inhibiting a symptom does not make it fast, while a service
    silenced on purpose (maintenance, retired) is no one's candidate. An incident in progress
    asks the engine's presence with silenced ones too (:meth:`_check_presence`). Every peer's, when
    the client reads them apart (the union; raises only when no peer answered)."""
    by_peer = getattr(am, "alerts_by_peer", None)
    if by_peer is None:
        items: list[dict[str, Any]] = await am.active_alerts(inhibited=True)
        return items
    return [i for peer in await by_peer(inhibited=True) for i in peer.alerts or ()]


def _iso(ctx: ActionContext) -> str:
    return ctx.alert.startsAt.isoformat()


def _new_episode(watched: dict[str, str | None] | None, ctx: ActionContext) -> bool:
    """Whether the alert of ``ctx`` is not watched yet, or is a later episode of a watched one
    (Alertmanager's listing keeps milliseconds, a notification more: a second's slack)."""
    if watched is None:
        return True
    starts = _when(watched.get("startsAt"))
    return starts is None or ctx.alert.startsAt > starts + timedelta(seconds=1)


def _when(value: Any) -> datetime | None:
    """A saved ``startsAt`` (None: unknown, or not readable)."""
    try:
        starts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return starts if starts.tzinfo is not None else None


def _alerts_of(raw: Any) -> dict[str, dict[str, str | None]]:
    """The watched alerts of an incident file (none in a file written before they were kept)."""
    if not isinstance(raw, dict):
        return {}
    return {str(fp): {"service": str(a.get("service", "")),
                      "startsAt": a["startsAt"] if isinstance(a.get("startsAt"), str) else None}
            for fp, a in raw.items() if isinstance(a, dict)}
