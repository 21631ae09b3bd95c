"""Build analysis inputs from a Prometheus server.

Every query is a configurable PromQL template. Grouped queries (edges, latency, alerts) return
one series per service label; resource templates are per service and name it as ``"$service"``,
which is replaced by a properly quoted and escaped PromQL string: service names come from
label values (data), so they are never pasted into an expression as raw text. A template may
only use ``$service`` as the whole value of an equality matcher (``container="$service"``),
checked when the configuration loads. ``$window`` is the recent window and ``$span`` the whole
analysed period, both as Prometheus durations.

The time range is ``[end - baseline - window, end]``; the engine scores the last ``window``
against the ``baseline`` before it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

import aiohttp
from pydantic import Field, field_validator, model_validator

from controllers.rca.engine import analyse
from controllers.rca.presets import EDGES_QUERY
from controllers.rca.models import (
    AnalysisConfig,
    AnalysisInput,
    Finding,
    Kind,
    LatencyStats,
    Metric,
    Resource,
    ServiceData,
    TimeSeries,
)
from promreflex.clients import APIError, PrometheusClient
from promreflex.config import Duration, Strict, format_duration

def rate_ladder(selector: str) -> str:
    """``rate(selector[W])`` over the shortest window W of 1m, 2m, 5m that holds at least 4
    samples, per series (rules/*.rules.yml do the same; README, "Scrape and evaluation
    intervals"): a fixed 1m window holds one sample at a 60 s scrape, and its rate is empty.
    Every rung also needs a sample in the last half of its window (``present_over_time``): a
    container that went away would otherwise keep its last rate in the 5m window for 5 minutes
    (not ``and selector``: a failed scrape's staleness markers would blank the rate)."""
    return (f"(rate({selector}[1m]) and count_over_time({selector}[1m]) >= 4 and present_over_time({selector}[30s])"
            f" or rate({selector}[2m]) and count_over_time({selector}[2m]) >= 4 and present_over_time({selector}[1m])"
            f" or rate({selector}[5m]) and present_over_time({selector}[2m]))")


def sum_of_rates(*selectors: str) -> str:
    """The sum of the selectors' laddered rates, each taken alone (a rate drops the metric's
    name, so two metrics in one ladder would be one label set twice: an error), and what there
    is when some of them have no series."""
    parts = [f"sum{rate_ladder(s)}" for s in selectors]
    return " or ".join([" + ".join(parts), *parts]) if len(parts) > 1 else parts[0]


CADVISOR_RESOURCES: dict[Resource, str] = {
    "cpu": sum_of_rates('container_cpu_usage_seconds_total{container="$service"}'),
    "memory": 'sum(container_memory_working_set_bytes{container="$service"})',
    "disk_io": sum_of_rates('container_fs_reads_bytes_total{container="$service"}',
                            'container_fs_writes_bytes_total{container="$service"}'),
}
# prometheus-process-exporter (ncabatoff), one process group per service.
PROCESS_RESOURCES: dict[Resource, str] = {
    "cpu": sum_of_rates('namedprocess_namegroup_cpu_seconds_total{groupname="$service"}'),
    "memory": 'sum(namedprocess_namegroup_memory_bytes{groupname="$service",memtype="resident"})',
    "disk_io": sum_of_rates('namedprocess_namegroup_read_bytes_total{groupname="$service"}',
                            'namedprocess_namegroup_write_bytes_total{groupname="$service"}'),
}
RESOURCE_PRESETS = {"cadvisor": CADVISOR_RESOURCES, "process": PROCESS_RESOURCES}

_PLACEHOLDER = re.compile(r"\$([A-Za-z_]\w*)")
_SERVICE_SLOT = re.compile(r'(?:=|!=)\s*"\$service"')


_QUERY_ERRORS = (APIError, aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError)


class PromSourceError(RuntimeError):
    """The graph or the latencies could not be read; without them there is nothing to analyse."""


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal. PromQL strings take Go's escapes, of
    which JSON's (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``) are a subset."""
    return json.dumps(value, ensure_ascii=False)


def _check_template(template: str, per_service: bool) -> str:
    names = set(_PLACEHOLDER.findall(template))
    unknown = names - {"service", "window", "span"}
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join('$' + n for n in sorted(unknown))} (use $service, $window, $span)")
    if not per_service and "service" in names:
        raise ValueError("this query is grouped by a label and cannot use $service")
    if per_service:
        total = template.count("$service")
        slots = len(_SERVICE_SLOT.findall(template))
        if total == 0:
            raise ValueError('a per-service template must select its service, e.g. container="$service"')
        if slots != total:
            raise ValueError('$service may only be the whole value of an equality matcher: label="$service"')
    return template


_SUBSTITUTION = re.compile(r'"\$service"|\$(window|span)\b')


def render(template: str, *, service: str | None = None, window: float = 0.0, span: float = 0.0) -> str:
    """Fill a template in one pass (so a service name containing ``$window`` stays itself):
    ``"$service"`` becomes a quoted, escaped string literal."""
    durations = {"window": format_duration(window), "span": format_duration(span)}

    def fill(m: re.Match[str]) -> str:
        if m.group(1):
            return durations[m.group(1)]
        if service is None:
            raise ValueError("this template needs a service")
        return promql_string(service)

    return _SUBSTITUTION.sub(fill, template)


class PromQueries(Strict):
    edges: str = EDGES_QUERY
    edge_caller_label: str = "source"
    edge_callee_label: str = "destination"
    # Range query, one series per service: the p99 the mesh exporter's histogram gives.
    latency: str = (
        "histogram_quantile(0.99, sum by (destination, le) "
        + rate_ladder("promreflex_mesh_request_duration_seconds_bucket") + ")"
    )
    latency_service_label: str = "destination"
    # Optional instant query for the per-service maximum over the recent window, e.g.
    # 'max by (destination) (max_over_time(<recorded per-service max>[$window]))'. Without it
    # the maximum of the latency series is used.
    latency_max: str | None = None
    resources: dict[Resource, str] = Field(default_factory=lambda: dict(CADVISOR_RESOURCES))
    # Optional range queries grouped by ``signal_service_label``, each scored as its own
    # series of the service: the caller-side latency (a delay on the network or in the
    # caller's sidecar shows only there) and the error ratio of the calls it receives.
    latency_caller: str | None = None
    errors: str | None = None
    signal_service_label: str = "service"
    alerts: str | None = 'ALERTS{alertname="ServiceResponseTimeHigh",alertstate="firing"}'
    alert_service_labels: list[str] = Field(default_factory=lambda: ["service", "destination"])

    @field_validator("resources", mode="before")
    @classmethod
    def _preset(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in RESOURCE_PRESETS:
                raise ValueError(f"unknown preset {value!r} (use {', '.join(RESOURCE_PRESETS)} or a mapping)")
            return dict(RESOURCE_PRESETS[value])
        return value

    @field_validator("resources")
    @classmethod
    def _per_service(cls, value: dict[Resource, str]) -> dict[Resource, str]:
        for res, template in value.items():
            try:
                _check_template(template, per_service=True)
            except ValueError as e:
                raise ValueError(f"{res}: {e}") from e
        return value

    @field_validator("edges", "latency", "latency_max", "alerts", "latency_caller", "errors")
    @classmethod
    def _grouped(cls, value: str | None) -> str | None:
        return None if value is None else _check_template(value, per_service=False)


class PromSourceConfig(Strict):
    queries: PromQueries = PromQueries()
    window: Duration = 300.0
    baseline: Duration = 900.0
    step: Duration = 15.0
    concurrency: int = Field(default=8, ge=1)

    @model_validator(mode="after")
    def _positive(self) -> PromSourceConfig:
        if self.window <= 0 or self.step <= 0:
            raise ValueError("window and step must be above 0")
        return self


def _labels(result: Any) -> dict[str, str]:
    """A result's label set, or nothing for a malformed entry (skipped, never a crash)."""
    labels = result.get("metric") if isinstance(result, dict) else None
    return labels if isinstance(labels, dict) else {}


def _value(result: Any) -> float | None:
    """An instant-query sample's finite value, or None."""
    try:
        value = float(result["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _series(result: Any) -> TimeSeries:
    """A range-query result's values; unparsable samples are dropped like NaN ones."""
    points = []
    values = result.get("values") if isinstance(result, dict) else None
    for pair in values if isinstance(values, list) else []:
        try:
            points.append((float(pair[0]), float(pair[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return TimeSeries(points=points)


async def collect(
    client: PrometheusClient,
    config: PromSourceConfig | None = None,
    *,
    end: float | None = None,
) -> AnalysisInput:
    """Query edges, latencies, firing alerts and per-service resources into analysis inputs."""
    cfg = config or PromSourceConfig()
    q = cfg.queries
    end = time.time() if end is None else end
    span = cfg.window + cfg.baseline
    start = end - span
    window = cfg.window

    def fill_in(template: str, service: str | None = None) -> str:
        return render(template, service=service, window=window, span=span)
    notes: list[str] = []

    try:
        edge_rows = await client.query(fill_in(q.edges), time=end)
        latency_rows = await client.query_range(fill_in(q.latency), start, end, cfg.step)
    except _QUERY_ERRORS as e:
        raise PromSourceError(f"cannot read the call graph or latencies from {client.base_url}: {e}") from e

    edges = sorted({
        (m[q.edge_caller_label], m[q.edge_callee_label])
        for m in map(_labels, edge_rows)
        if m.get(q.edge_caller_label) and m.get(q.edge_callee_label)
    })
    by_service: dict[str, list[TimeSeries]] = {}
    for row in latency_rows:
        name = _labels(row).get(q.latency_service_label)
        if name:
            by_service.setdefault(name, []).append(_series(row))
    maxima: dict[str, float] = {}
    if q.latency_max:
        try:
            for row in await client.query(fill_in(q.latency_max), time=end):
                name = _labels(row).get(q.latency_service_label)
                value = _value(row)
                if name and value is not None and value >= 0:
                    maxima[name] = max(value, maxima.get(name, 0.0))
        except _QUERY_ERRORS as e:
            notes.append(f"latency maxima query failed ({e}); using the maximum of the latency series.")

    signals: dict[str, list[Metric]] = {}
    for kind, name, template in (("latency", "caller-side latency", q.latency_caller), ("errors", "error ratio", q.errors)):
        if not template:
            continue
        try:
            rows = await client.query_range(fill_in(template), start, end, cfg.step)
        except _QUERY_ERRORS as e:
            notes.append(f"{name} query failed ({e}); deciding without it.")
            continue
        for row in rows if isinstance(rows, list) else []:
            label = _labels(row).get(q.signal_service_label)
            series = _series(row)
            if label and series.points:
                k: Kind = kind  # type: ignore[assignment]
                signals.setdefault(label, []).append(Metric(kind=k, name=name, series=series))

    alerting: set[str] = set()
    if q.alerts:
        try:
            for row in await client.query(fill_in(q.alerts), time=end):
                labels = _labels(row)
                name = next((labels[k] for k in q.alert_service_labels if labels.get(k)), None)
                if name:
                    alerting.add(name)
        except _QUERY_ERRORS as e:
            notes.append(f"alerts query failed ({e}); deciding on latencies only.")

    services = sorted({n for e in edges for n in e} | set(by_service) | set(signals) | alerting)
    if not by_service and not edges:
        # Raw Istio or cAdvisor metrics alone give nothing to these queries: say what they read
        notes.append(
            f"No latency series and no call edge in {client.base_url}: the queries read the recorded series of "
            "rules/mesh.rules.yml (service:promreflex_mesh_request_duration_seconds:p99_1m, "
            "source_destination:promreflex_mesh_edge_info:max), from the mesh exporter or, for Istio's standard "
            "metrics, the mesh-istio.rules group of docs/mesh.md: are those rules loaded in this Prometheus, "
            "and does the range hold their series?")
    limit = asyncio.Semaphore(cfg.concurrency)
    failures: list[str] = []

    async def resource(service: str, res: Resource, template: str) -> tuple[str, Resource, TimeSeries | None]:
        async with limit:
            try:
                rows = await client.query_range(fill_in(template, service=service), start, end, cfg.step)
            except _QUERY_ERRORS as e:
                failures.append(f"{service}/{res}: {e}")
                return service, res, None
        found = [_series(r) for r in rows]
        return service, res, (TimeSeries.max_of(found) if found else None)

    results = await asyncio.gather(*(resource(s, r, t) for s in services for r, t in q.resources.items()))
    if failures:
        notes.append(f"{len(failures)} resource queries failed, treated as missing data: {'; '.join(failures[:5])}.")
    resources: dict[str, dict[Resource, TimeSeries]] = {s: {} for s in services}
    for service, res, got in results:
        if got is not None and got.points:
            resources[service][res] = got

    data = {}
    for s in services:
        latency = None
        if s in by_service or s in maxima:
            latency = LatencyStats(
                max_s=maxima.get(s),
                series=TimeSeries.max_of(by_service[s]) if s in by_service else None,
            )
        data[s] = ServiceData(latency=latency, resources=resources[s], metrics=signals.get(s, []))
    return AnalysisInput(
        edges=edges, services=data, alerting=sorted(alerting),
        baseline_end=end - cfg.window, source=client.base_url, notes=notes,
    )


async def analyse_range(
    base_url: str,
    source: PromSourceConfig,
    analysis: AnalysisConfig | None = None,
    *,
    start: float,
    end: float,
    inject_time: float | None = None,
) -> Finding:
    """``rca offline --prometheus.url``: analyse ``[start, end]`` with the live action's queries.
    The baseline is what came before ``inject_time``; without one, the engine finds the start."""
    split = inject_time if inject_time is not None else start
    cfg = source.model_copy(update={"window": end - split, "baseline": split - start})
    async with aiohttp.ClientSession() as session:
        inputs = await collect(PrometheusClient(base_url, session), cfg, end=end)
    if inject_time is None:
        inputs = inputs.model_copy(update={"baseline_end": None})
    return analyse(inputs, analysis)


async def analyse_prometheus(
    base_url: str,
    source: PromSourceConfig | None = None,
    analysis: AnalysisConfig | None = None,
    *,
    end: float | None = None,
) -> Finding:
    """Collect from the Prometheus at ``base_url`` and analyse, in one call."""
    async with aiohttp.ClientSession() as session:
        inputs = await collect(PrometheusClient(base_url, session), source, end=end)
    return analyse(inputs, analysis)
