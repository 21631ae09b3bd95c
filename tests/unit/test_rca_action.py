"""The rca action with a fake Prometheus (canned query answers) and a fake Alertmanager (an
HTTP server on loopback, so the real AlertmanagerClient posts to it)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime, UTC
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from controllers.actions.base import ActionContext
from controllers.models import Alert
from controllers.rca.action import MESH_QUERIES, RcaAction, RcaParams, attribute, held_alerts, incident_path
from controllers.rca.engine import analyse
from controllers.rca.models import AnalysisInput, Finding, LatencyStats, ServiceData, TimeSeries
from controllers.rca.promsource import PromSourceError
from promreflex.clients import AlertmanagerClient
from promreflex.config import ControllerConfig, Route

WEIRD = 'c"} or vector(1) #'  # a service name that would break PromQL if pasted raw


class FakePrometheus:
    """Answers collect()'s queries for the chain a -> b -> ROOT; ROOT's CPU peaks at the end."""

    def __init__(self, root: str = "c") -> None:
        self.root = root
        self.base_url = "http://prometheus.test"
        self.queries: list[str] = []
        self.threshold: float | None = 0.2
        self.fail = False
        self.pending: list[str] = []  # services whose ServiceResponseTimeHigh is pending

    async def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        self.queries.append(expr)
        if self.fail:
            raise aiohttp.ClientConnectionError("prometheus unreachable")
        if "promreflex_mesh_edge_info" in expr:
            return [{"metric": {"source": "a", "destination": "b"}, "value": [0, "1"]},
                    {"metric": {"source": "b", "destination": self.root}, "value": [0, "1"]}]
        if 'alertstate="pending"' in expr:
            return [{"metric": {"alertname": "ServiceResponseTimeHigh", "service": s}, "value": [0, "1"]} for s in self.pending]
        if "max_over_time" in expr:
            return [{"metric": {"service": s}, "value": [0, "0.5"]} for s in ("a", "b", self.root)]
        return []  # ALERTS: none in Prometheus; the candidates come from Alertmanager

    async def scalar(self, expr: str, default: float | None = None) -> float | None:
        self.queries.append(expr)
        return self.threshold

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.queries.append(expr)
        n = int((end - start) / step) + 1
        hot = lambda base, peak: [[start + i * step, str(base if i < n - 6 else peak)] for i in range(n)]  # noqa: E731
        if expr == MESH_QUERIES["latency"]:
            return [{"metric": {"service": s}, "values": hot(0.05, 0.4)} for s in ("a", "b", self.root)]
        m = re.search(r'service=("(?:[^"\\]|\\.)*")', expr)
        service = json.loads(m.group(1)) if m else ""
        if service == self.root:
            return [{"metric": {}, "values": hot(0.1, 0.9)}]
        return [{"metric": {}, "values": hot(0.1, 0.1)}]


class FakeAlertmanager:
    """GET /api/v2/alerts answers ``held`` (as inhibited or not); POST records every batch."""

    def __init__(self) -> None:
        self.held: dict[str, bool] = {}  # service -> inhibited
        self.posts: list[list[dict[str, Any]]] = []
        self.gets: list[dict[str, str]] = []

    def hold(self, *services: str, inhibited: bool = False) -> None:
        for s in services:
            self.held[s] = inhibited

    async def get(self, request: web.Request) -> web.Response:
        self.gets.append(dict(request.query))
        with_inhibited = request.query.get("inhibited") == "true"
        items = [{
            "labels": {"alertname": "ServiceResponseTimeHigh", "service": s, "severity": "warning"},
            "annotations": {}, "startsAt": "2026-11-23T10:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
            "fingerprint": f"fp-{s}", "status": {"state": "suppressed" if inh else "active"},
        } for s, inh in self.held.items() if with_inhibited or not inh]
        items.append({"labels": {"alertname": "ServiceResponseTimeHigh", "service": "gone"},
                      "endsAt": "2020-01-01T00:00:00Z"})  # resolved, not yet garbage-collected
        items.append({"labels": {"alertname": "Watchdog"}, "endsAt": "2099-01-01T00:00:00Z"})
        return web.json_response(items)

    async def post(self, request: web.Request) -> web.Response:
        self.posts.append(await request.json())
        return web.json_response({})

    def latest(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The last posted state of each alert, by (alertname, service)."""
        out = {}
        for batch in self.posts:
            for a in batch:
                out[(a["labels"]["alertname"], a["labels"]["service"])] = a
        return out


@pytest.fixture
async def env(tmp_path):
    fake_am = FakeAlertmanager()
    app = web.Application()
    app.router.add_get("/api/v2/alerts", fake_am.get)
    app.router.add_post("/api/v2/alerts", fake_am.post)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    registry = CollectorRegistry()
    async with aiohttp.ClientSession() as session:
        prom = FakePrometheus()
        services = {"prometheus": prom, "session": session, "registry": registry,
                    "alertmanager": AlertmanagerClient(str(server.make_url("")), session)}
        action = RcaAction()
        await action.start(services)
        yield action, prom, fake_am, registry, services, tmp_path
        await action.shutdown()
    await server.close()


def params(tmp_path, **kw) -> RcaParams:
    base = {"settle": "50ms", "lease": "30s", "report": str(tmp_path / "rca" / "latest.json"),
            "source": {"queries": {"resources": {"cpu": 'sum(rate(cpu_seconds_total{service="$service"}[1m]))'}}}}
    return RcaParams.model_validate({**base, **kw})


def ctx(p: RcaParams, services, service: str, status: str = "firing") -> ActionContext:
    alert = Alert(status=status, labels={"alertname": "ServiceResponseTimeHigh", "service": service, "severity": "warning"},
                  startsAt=datetime(2026, 11, 23, 10, tzinfo=UTC), fingerprint=f"fp-{service}")
    return ActionContext(route="rca", alert=alert, params=p, services=services)


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def ranges(prom: FakePrometheus) -> int:
    """How many analyses ran: each reads the latency series once."""
    return sum(1 for q in prom.queries if q == MESH_QUERIES["latency"])


async def test_fire_names_the_root_and_flags_it_everywhere(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    p = params(tmp)
    detail = await action.fire(ctx(p, services, "a"))
    assert detail.startswith("root cause c (score ")
    assert "dependants a, b inhibited" in detail

    score = value(registry, "promreflex_root_cause", service="c")
    assert score is not None and score > 1.0
    assert value(registry, "promreflex_root_cause", service="a") is None
    assert value(registry, "promreflex_rca_findings_total", result="root_cause") == 1
    assert value(registry, "promreflex_rca_findings_total", result="error") == 0
    assert time.time() - 5 < value(registry, "promreflex_rca_last_finding_timestamp_seconds") <= time.time()

    posted = am.latest()
    assert set(posted) == {("MeshRootCause", "c"), ("MeshRootCauseSymptom", "a"), ("MeshRootCauseSymptom", "b")}
    root = posted[("MeshRootCause", "c")]
    assert root["labels"] == {"alertname": "MeshRootCause", "service": "c", "severity": "critical"}
    assert root["annotations"]["score"] == f"{score:.2f}"
    assert root["annotations"]["runbook_url"] == "https://github.com/promreflex/promreflex/blob/main/docs/runbook.md#meshrootcause"
    assert posted[("MeshRootCauseSymptom", "a")]["labels"] == {
        "alertname": "MeshRootCauseSymptom", "service": "a", "root_cause": "c", "severity": "none"}
    ends = datetime.fromisoformat(root["endsAt"].replace("Z", "+00:00"))
    assert 25 < (ends - datetime.now(UTC)).total_seconds() <= 30  # the lease
    assert am.gets[0]["inhibited"] == "true" and am.gets[0]["silenced"] == "false"

    report = Finding.load(tmp / "rca" / "latest.json")
    assert report.root_cause == "c"
    assert report.config.threshold_s == 0.2  # read from the rules' threshold series
    assert "root cause c" in report.explain()
    assert DEFAULT_THRESHOLD in prom.queries


DEFAULT_THRESHOLD = "mesh:promreflex_mesh_response_time_threshold_seconds:default"


async def test_an_alert_the_incident_explains_is_not_analysed_again(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    p = params(tmp)
    await action.fire(ctx(p, services, "a"))
    assert ranges(prom) == 1
    detail = await action.fire(ctx(p, services, "c"))
    assert detail == "c belongs to the current incident: root cause c"
    assert ranges(prom) == 1
    # A slow service the incident does not explain starts a new analysis.
    am.hold("z")
    await action.fire(ctx(p, services, "z"))
    assert ranges(prom) == 2
    assert value(registry, "promreflex_rca_findings_total", result="root_cause") == 2


async def test_simultaneous_alerts_are_settled_into_one_analysis(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a")
    p = params(tmp, settle="300ms")

    async def c_turns_up():
        await asyncio.sleep(0.05)
        am.hold("c")

    results = await asyncio.gather(action.fire(ctx(p, services, "a")), action.fire(ctx(p, services, "c")), c_turns_up())
    assert ranges(prom) == 1
    assert sorted(r.split(" ")[0] for r in results[:2]) == ["c", "root"]
    assert action.incident is not None and {"a", "c"} <= action.incident.covered
    assert set(Finding.load(tmp / "rca" / "latest.json").top(1)) == {"c"}


async def test_resolve_keeps_the_incident_while_the_root_fires_then_clears(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    p = params(tmp)
    await action.fire(ctx(p, services, "a"))
    # a's alert is inhibited now: the engine sees it as resolved. c still fires.
    am.hold("a", inhibited=True)
    detail = await action.resolve(ctx(p, services, "a", "resolved"))
    assert detail.startswith("incident continues: c still firing")
    assert value(registry, "promreflex_root_cause", service="c") is not None

    am.held.clear()
    detail = await action.resolve(ctx(p, services, "c", "resolved"))
    assert detail.startswith("incident over")
    assert value(registry, "promreflex_root_cause", service="c") is None
    assert action.incident is None
    now = datetime.now(UTC)
    for a in am.latest().values():
        assert datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00")) <= now, a["labels"]
    assert await action.resolve(ctx(p, services, "a", "resolved")) == "no incident in progress"


async def test_the_lease_is_renewed_and_the_incident_ends_without_a_resolve(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    p = params(tmp, lease="300ms")
    await action.fire(ctx(p, services, "a"))
    first = am.latest()[("MeshRootCause", "c")]["endsAt"]
    deadline = time.monotonic() + 5
    while len(am.posts) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(am.posts) >= 3
    assert am.latest()[("MeshRootCause", "c")]["endsAt"] > first
    assert am.latest()[("MeshRootCause", "c")]["startsAt"] == am.posts[0][0]["startsAt"]

    am.held.clear()  # the fault is over; no resolve arrives (e.g. the webhook was lost)
    while action.incident is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert action.incident is None
    assert value(registry, "promreflex_root_cause", service="c") is None

    # A new incident gets its own renewal loop, and only one.
    am.hold("a", "c")
    await action.fire(ctx(p, services, "a"))
    loop = action._refresher
    assert loop is not None and not loop.done()
    before = len(am.posts)
    while len(am.posts) < before + 2 and time.monotonic() < deadline + 5:
        await asyncio.sleep(0.02)
    assert len(am.posts) >= before + 2 and action._refresher is loop
    await action.shutdown()
    await asyncio.sleep(0)
    assert loop.cancelled() or loop.done()


async def test_no_candidates_means_no_analysis(env):
    action, prom, am, registry, services, tmp = env
    p = params(tmp)
    detail = await action.fire(ctx(p, services, "a"))  # resolved during the settle time
    assert detail == "no ServiceResponseTimeHigh firing any more: nothing to analyse"
    assert value(registry, "promreflex_rca_findings_total", result="no_candidates") == 1
    assert ranges(prom) == 0 and am.posts == []
    assert not (tmp / "rca" / "latest.json").exists()


async def test_prometheus_failure_raises_for_the_engine_to_retry(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    prom.fail = True
    with pytest.raises(PromSourceError):
        await action.fire(ctx(params(tmp), services, "a"))
    assert value(registry, "promreflex_rca_findings_total", result="error") == 1
    assert action.incident is None and am.posts == []


async def test_service_names_are_only_data(env):
    action, prom, am, registry, services, tmp = env
    prom.root = WEIRD
    am.hold("a", WEIRD)
    await action.fire(ctx(params(tmp), services, "a"))
    assert value(registry, "promreflex_root_cause", service=WEIRD) is not None
    assert ("MeshRootCause", WEIRD) in am.latest()
    assert f"service={json.dumps(WEIRD)}" in "".join(prom.queries)  # quoted as a PromQL string
    assert not any(f'service="{WEIRD}"' in q for q in prom.queries)


async def test_alertmanager_down_falls_back_to_the_alert_itself(env):
    action, prom, am, registry, services, tmp = env
    services = {**services, "alertmanager": AlertmanagerClient("http://127.0.0.1:9", services["session"])}
    action.services = services
    detail = await action.fire(ctx(params(tmp), services, "a"))
    assert detail.startswith("root cause c ")  # b and c are slow by their latency alone
    assert value(registry, "promreflex_rca_alert_posts_total", result="error") >= 1


async def test_held_alerts_include_inhibited_and_drop_ended(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", inhibited=True)
    am.hold("c")
    items = await held_alerts(services["alertmanager"])
    assert sorted(i["labels"].get("service", "") for i in items) == ["", "a", "c"]  # Watchdog has none


def test_params_merge_partial_queries_over_the_mesh_defaults():
    p = RcaParams.model_validate({"source": {"queries": {"resources": "process"}, "step": "1s"}})
    assert p.source.queries.latency == MESH_QUERIES["latency"]
    assert "namedprocess" in p.source.queries.resources["cpu"]
    assert p.source.step == 1.0 and p.source.window == 120.0
    assert RcaParams().source.queries.latency_max == MESH_QUERIES["latency_max"]
    with pytest.raises(ValidationError):
        RcaParams.model_validate({"lease": "0s"})
    with pytest.raises(ValidationError):
        RcaParams.model_validate({"source": {"queries": {"resources": {"cpu": "up{job=~$service}"}}}})
    with pytest.raises(ValidationError):
        RcaParams.model_validate({"typo": 1})


def test_a_route_binds_the_rca_action(tmp_path):
    from controllers.engine import bind_routes

    cfg = ControllerConfig(audit_log=tmp_path / "a.jsonl", state_file=tmp_path / "s.json", routes=[
        Route(name="mesh-rca", matchers=['alertname="ServiceResponseTimeHigh"'], action="rca",
              params={"settle": "1s", "source": {"queries": {"resources": "cadvisor"}}})])
    (bound,) = bind_routes(cfg)
    assert isinstance(bound.action, RcaAction) and bound.params.settle == 1.0


def _series(values: list[float]) -> TimeSeries:
    return TimeSeries.of(values)


def test_attribute_flags_only_roots_that_explain_a_candidate():
    quiet, hot = [0.05] * 20, [0.05] * 15 + [0.5] * 5
    data = AnalysisInput(
        edges=[("a", "b"), ("b", "c"), ("x", "y")],
        services={s: ServiceData(latency=LatencyStats(series=_series(hot if s != "q" else quiet)))
                  for s in ("a", "b", "c", "x", "y", "q")},
        alerting=["a"],
    )
    finding = analyse(data)
    assert set(finding.root_causes) == {"c", "y"}
    roots, symptoms = attribute(finding, {"a"})
    assert list(roots) == ["c"]
    assert symptoms == {"a": "c", "b": "c"}
    roots, symptoms = attribute(finding, {"a", "y"})
    assert set(roots) == {"c", "y"} and symptoms == {"a": "c", "b": "c", "x": "y"}


async def test_a_restarted_controller_resumes_the_incident_and_ends_it_later(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a", "c")
    p = params(tmp, lease="300ms")
    await action.fire(ctx(p, services, "a"))
    saved = incident_path(p.report)
    assert saved.exists()
    first = am.latest()[("MeshRootCause", "c")]
    await action.shutdown()  # the controller stops (or dies) mid-incident

    registry2 = CollectorRegistry()
    again = RcaAction()
    again.route_params = [p]
    await again.start({**services, "registry": registry2})
    try:
        assert again.incident is not None and set(again.incident.roots) == {"c"}
        assert value(registry2, "promreflex_root_cause", service="c") == value(registry, "promreflex_root_cause", service="c")
        before = len(am.posts)
        deadline = time.monotonic() + 30
        while len(am.posts) == before and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        renewed = am.latest()[("MeshRootCause", "c")]
        assert renewed["endsAt"] > first["endsAt"] and renewed["startsAt"] == first["startsAt"]
        # The resumed incident answers alerts it explains without a new analysis ...
        n = ranges(prom)
        assert (await again.fire(ctx(p, services, "b"))).startswith("b belongs to the current incident")
        assert ranges(prom) == n
        # ... and ends by itself when the root stops firing: gauge cleared, file removed.
        am.held.clear()
        deadline = time.monotonic() + 30  # its own deadline: the wait above may have used most of one
        # The end is asynchronous (the incident is dropped, then its file removed in a thread):
        # wait for all of it.
        def ended() -> bool:
            return (again.incident is None and not saved.exists()
                    and value(registry2, "promreflex_root_cause", service="c") is None)

        while not ended() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert again.incident is None and not saved.exists()
        assert value(registry2, "promreflex_root_cause", service="c") is None
    finally:
        await again.shutdown()


async def test_an_unreadable_incident_file_is_set_aside_not_fatal(env):
    action, prom, am, registry, services, tmp = env
    p = params(tmp)
    saved = incident_path(p.report)
    saved.parent.mkdir(parents=True, exist_ok=True)
    for text in ("{not json", '{"kind": "promreflex.rca.incident", "version": 1}', '["a list"]'):
        saved.write_text(text)
        again = RcaAction()
        again.route_params = [p]
        await again.start({**services, "registry": CollectorRegistry()})
        assert again.incident is None
        assert not saved.exists() and saved.with_name(saved.name + ".unreadable").read_text() == text
        await again.shutdown()


PENDING = 'ALERTS{alertname="ServiceResponseTimeHigh",alertstate="pending"}'


async def test_the_analysis_waits_for_pending_alerts_to_fire(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a")
    prom.pending = ["c"]

    async def c_fires():
        deadline = time.monotonic() + 5
        while prom.queries.count(PENDING) < 3 and time.monotonic() < deadline:  # the action polls while c is pending
            await asyncio.sleep(0.01)
        am.hold("c")
        prom.pending = []

    p = params(tmp, pending_wait="10s")
    detail, _ = await asyncio.gather(action.fire(ctx(p, services, "a")), c_fires())
    assert detail.startswith("root cause c")
    first_analysis_query = prom.queries.index(MESH_QUERIES["latency"])
    assert prom.queries.count(PENDING) >= 3
    assert max(i for i, q in enumerate(prom.queries) if q == PENDING) < first_analysis_query
    report = Finding.load(tmp / "rca" / "latest.json")
    assert "ServiceResponseTimeHigh is firing" in report.verdict("c").slow_reasons  # c was a candidate


async def test_pending_wait_is_bounded_and_can_be_off(env):
    action, prom, am, registry, services, tmp = env
    am.hold("a")
    prom.pending = ["x"]  # pending for ever (a flapping blip)
    detail = await action.fire(ctx(params(tmp, pending_wait="300ms"), services, "a"))
    assert detail.startswith("root cause c") and prom.queries.count(PENDING) >= 1
    n = prom.queries.count(PENDING)
    am.held.clear()
    await action._end()
    am.hold("a")
    await action.fire(ctx(params(tmp, pending_wait="0s"), services, "a"))
    assert prom.queries.count(PENDING) == n  # not even asked


class LeafWithoutLatency(FakePrometheus):
    """a -> b -> c with latency measured only for a and b (c is a database nobody times) and
    c's CPU far out of its baseline: the dependency rule stops at b (its only dependency is
    not slow), the ranking is headed by c."""

    async def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        rows = await super().query(expr, time)
        return [r for r in rows if r["metric"].get("service") != self.root or "max_over_time" not in expr]

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        rows = await super().query_range(expr, start, end, step)
        if expr == MESH_QUERIES["latency"]:
            return [r for r in rows if r["metric"]["service"] != self.root]
        if f'service="{self.root}"' in expr:
            n = len(rows[0]["values"])
            return [{"metric": {}, "values": [[t, "0.1" if i < n - 6 else "5"] for i, (t, _) in enumerate(rows[0]["values"])]}]
        return rows


async def test_the_action_names_the_ranking_head_where_the_dependency_rule_names_another(env):
    action, _, am, registry, services, tmp = env
    prom = LeafWithoutLatency()
    services["prometheus"] = prom
    am.hold("a", "b")
    p = params(tmp)
    detail = await action.fire(ctx(p, services, "a"))

    report = Finding.load(tmp / "rca" / "latest.json")
    assert report.root_causes == ["b"]  # the rule's candidate: slow, its dependency c is not
    assert report.ranking[0].service == "c" and report.ranking[0].top_signal == "cpu:cpu"
    assert detail.startswith("root cause c (score ")  # the head, as `rca offline` would say
    assert value(registry, "promreflex_root_cause", service="c") == pytest.approx(report.ranking[0].score)
    assert value(registry, "promreflex_root_cause", service="b") is None
    posted = am.latest()
    assert set(posted) == {("MeshRootCause", "c"), ("MeshRootCauseSymptom", "a"), ("MeshRootCauseSymptom", "b")}
    assert posted[("MeshRootCauseSymptom", "b")]["labels"]["root_cause"] == "c"
    assert "the dependency rule alone would name b" in report.explain()


def test_attribute_adds_a_second_root_only_for_an_unexplained_candidate_with_a_significant_anomaly():
    quiet, hot = [0.05] * 20, [0.05] * 15 + [0.5] * 5
    tiny = [0.05] * 15 + [0.0505] * 5  # rises, but within the noise floor: z < 3.5
    data = AnalysisInput(
        edges=[("a", "b"), ("x", "y")],
        services={"a": ServiceData(latency=LatencyStats(series=_series(hot))),
                  "b": ServiceData(resources={"cpu": _series([0.1] * 15 + [9.0] * 5)}),
                  "x": ServiceData(latency=LatencyStats(series=_series(hot))),
                  "y": ServiceData(latency=LatencyStats(series=_series(quiet))),
                  "q": ServiceData(latency=LatencyStats(series=_series(tiny)))},
        alerting=["a", "x", "q"],
    )
    finding = analyse(data)
    assert finding.ranking[0].service == "b"  # a and x tie behind it (the same latency rise)
    roots, symptoms = attribute(finding, {"a", "x", "q"})
    assert list(roots) == ["b", "x"]  # b: the head; x waits on nothing flagged and is anomalous itself
    assert symptoms == {"a": "b"}  # q's own anomaly is noise: not flagged, not anyone's symptom
    roots, _ = attribute(finding, {"a"})
    assert list(roots) == ["b"]
