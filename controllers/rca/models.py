"""Typed inputs and outputs of the root-cause analysis.

The engine never learns where data came from (CSV files, a Prometheus server, a test): every
source builds an :class:`AnalysisInput` and gets a :class:`Finding` back. Values are in base
units (seconds for latency; whatever unit a resource series has, since resource scores are
scale-free).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, UTC
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from promreflex.fsutil import atomic_write_text

Resource = Literal["cpu", "memory", "disk_io", "network"]
RESOURCES: tuple[Resource, ...] = ("cpu", "memory", "disk_io", "network")
#: What a scored series measures. Every kind counts towards a service's anomaly score.
Kind = Literal["latency", "cpu", "memory", "disk_io", "network", "errors"]
KINDS: tuple[Kind, ...] = ("latency", "cpu", "memory", "disk_io", "network", "errors")
RESOURCE_NAMES: dict[str, str] = {
    "cpu": "CPU", "memory": "memory", "disk_io": "disk I/O", "network": "network",
    "latency": "latency", "errors": "error ratio",
}

KIND: Literal["promreflex.rca.finding"] = "promreflex.rca.finding"
Group = Literal["root_cause", "symptom", "not_slow"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeSeries(_Model):
    """Samples ``(unix_time, value)`` in time order. Non-finite values (Prometheus answers
    ``NaN`` for a quantile of an idle histogram) are dropped here, once, so no statistic below
    has to think about them."""

    points: list[tuple[float, float]] = Field(default_factory=list)

    @field_validator("points")
    @classmethod
    def _finite_sorted(cls, value: list[tuple[float, float]]) -> list[tuple[float, float]]:
        kept = [(t, v) for t, v in value if math.isfinite(t) and math.isfinite(v)]
        return sorted(kept, key=lambda p: p[0])

    @classmethod
    def of(cls, values: list[float], start: float = 0.0, step: float = 1.0) -> TimeSeries:
        """Evenly spaced samples; convenient for fixtures and tests."""
        return cls(points=[(start + i * step, float(v)) for i, v in enumerate(values)])

    @classmethod
    def max_of(cls, series: list[TimeSeries]) -> TimeSeries:
        """Element-wise maximum by timestamp: a service's latency from several callers' views,
        the paper's "maximum response time"."""
        merged: dict[float, float] = {}
        for s in series:
            for t, v in s.points:
                merged[t] = max(v, merged.get(t, v))
        return cls(points=sorted(merged.items()))

    @property
    def values(self) -> list[float]:
        return [v for _, v in self.points]


class LatencyStats(_Model):
    """Response time of one service (requests it *receives*), in seconds.

    Give the summary values, a series, or both. The summary values win for the threshold test
    (they may come from finer data than the series, e.g. a recorded per-request maximum); the
    series is needed for the robust score against a baseline.
    """

    max_s: float | None = Field(default=None, ge=0)
    p99_s: float | None = Field(default=None, ge=0)
    series: TimeSeries | None = None


class Metric(_Model):
    """One more scored series of a service: a caller-side latency, another latency quantile,
    an error ratio, a second CPU column. ``name`` is what the source called it."""

    kind: Kind
    name: str
    series: TimeSeries
    #: the spread floor in this series' own unit, when the kind's (bytes, bytes/s) is not it: a
    #: count of sockets, a memory column in MB (None: ``AnalysisConfig.resource_scale_floor``)
    scale_floor: float | None = Field(default=None, ge=0)


class ServiceData(_Model):
    """``latency``: callee-side response time (the 3 s line is tested on it); ``resources``:
    one series per resource; ``metrics``: any further series, each scored on its own."""

    latency: LatencyStats | None = None
    resources: dict[Resource, TimeSeries] = Field(default_factory=dict)
    metrics: list[Metric] = Field(default_factory=list)

    def named_series(self) -> list[tuple[str, TimeSeries]]:
        """Every series of the service with its name: latency, each resource, each metric."""
        return ([("latency", self.latency.series)] if self.latency and self.latency.series else []) + [
            (str(k), x) for k, x in self.resources.items()] + [(m.name, m.series) for m in self.metrics]


_SCALE_FLOORS: dict[Kind, float] = {
    "cpu": 0.001, "memory": 1024.0 * 1024.0, "disk_io": 1024.0, "network": 1024.0, "errors": 0.01,
}


class AnalysisConfig(_Model):
    """Knobs of the decision, each with the reason for its default.

    ``threshold_s``: the paper's candidate line, 3 s (Google's bounce-rate figure: +32 % going
    from 1 s to 3 s).
    ``relative`` / ``z_threshold``: a service whose latency never crosses the absolute line can
    still be the one that changed; the relative test (robust z-score at least ``z_threshold``,
    the Iglewicz-Hoaglin cut-off 3.5) catches that. ``relative=False`` is the paper's rule alone.
    ``min_slowdown``: a relative slowdown must also be practically large (max at least this
    many times the typical value), so a 1 ms wobble of a 3 ms call is not "slow".
    ``statistic``: compare the maximum (paper) or the p99 with ``threshold_s``.
    ``scale_floor_ratio`` / ``latency_scale_floor_s`` / ``resource_scale_floor``: lower bounds
    of the robust spread, so a perfectly flat baseline does not divide by zero and turn a
    rounding error into a huge score. With 5 % of the typical level, a latency peak must stand
    about 18 % (3.5 x 5 %) above it before it can count as anomalous, however quiet the baseline.
    ``resource_scale_floor_ratio``: the same share for resources, 0 by default: their absolute
    floors (``resource_scale_floor``, in their units) guard a flat series, and a share of the
    level capped a clear rise of a large, quiet series (memory doubling from 300 MB with 1 MB of
    noise scored 20 at 5 %, below a second-long noise burst of a latency), as BARO has no such
    floor. ``flat_scale_floor_ratio``: the share for a resource whose baseline has no spread (most
    of it one value: held samples, a quantized series), whose absolute floor may be in another
    unit (RCD's CPU in percent against a floor in cores scored a held 74 % rising to 86 % at
    12,000); 1 %, so a leak of 20 % from a held level still scores 20.
    ``min_baseline_points``: fewer baseline samples than this and the whole window is used as
    its own baseline.
    ``detect_start``: when the input gives no baseline end, find the anomaly's start as the
    most likely change point over all series (:mod:`controllers.rca.changepoint`) and score
    against what came before it; each segment holds at least ``change_min_segment`` samples.
    ``explain_share``: a slow callee explains its slow caller (the caller is then a symptom)
    unless the evidence points at the caller itself: the caller's own resources peaked
    (robust z >= ``resource_z_threshold``) while the callee's did not, AND the callee added
    less than this share of the caller's added latency (each over its own baseline). Then the
    callee's slowness is collateral (a shared host, a shared disk) and both stay candidates for
    the resources to rank, as the paper ranks dependent candidates by CPU and memory. 0 turns
    the test off (every slow callee explains its caller), ``explain_min_share`` with it.
    ``explain_min_share``: whatever the resources, a slow callee that added less than this
    share of its caller's added latency does not explain it (at 1 Hz a burst of noise makes
    many services of a large system "slow" by the relative rule; a callee's +20 ms cannot be
    the reason for its caller's +400 ms). A fifth leaves room for a caller that calls its
    callee several times in a row (each call's delay counts once per call); it holds even when
    the callee's own resources peaked, as at 1 Hz bursts make many services' resources "peak"
    too (applied after them, it let noise explain again: Train Ticket delay AC@1 1.00 -> 0.50
    on generated cases): a caller calling a truly hogged callee five times or more per request
    is then a candidate beside it.
    """

    threshold_s: float = Field(default=3.0, gt=0)
    relative: bool = True
    z_threshold: float = Field(default=3.5, gt=0)
    min_slowdown: float = Field(default=1.5, ge=1.0)
    resource_z_threshold: float = Field(default=3.5, gt=0)
    statistic: Literal["max", "p99"] = "max"
    scale_floor_ratio: float = Field(default=0.05, ge=0)
    resource_scale_floor_ratio: float = Field(default=0.0, ge=0)
    flat_scale_floor_ratio: float = Field(default=0.01, ge=0)
    latency_scale_floor_s: float = Field(default=0.001, ge=0)
    resource_scale_floor: dict[Kind, float] = Field(default_factory=lambda: dict(_SCALE_FLOORS))
    min_baseline_points: int = Field(default=3, ge=1)
    detect_start: bool = True
    change_min_segment: int = Field(default=5, ge=2)
    explain_share: float = Field(default=0.5, ge=0, le=1)
    explain_min_share: float = Field(default=0.2, ge=0, le=1)


class AnalysisInput(_Model):
    """Everything the engine looks at.

    ``edges``: caller -> callee. ``alerting``: services whose ``ServiceResponseTimeHigh`` fires.
    ``notes``: lines a data source wants in the explanation (skipped cells, assumptions).
    ``baseline_end``: unix time splitting each series into a baseline (up to it) and the recent
    window scored against it; ``None`` scores each series against itself (median and MAD stay
    meaningful while less than half the window is anomalous).
    """

    edges: list[tuple[str, str]] = Field(default_factory=list)
    services: dict[str, ServiceData] = Field(default_factory=dict)
    alerting: list[str] = Field(default_factory=list)
    baseline_end: float | None = None
    source: str = ""
    notes: list[str] = Field(default_factory=list)  # what the source skipped or assumed, and why

    def all_services(self) -> list[str]:
        names = set(self.services) | set(self.alerting)
        for a, b in self.edges:
            names.update((a, b))
        return sorted(names)


class SignalScore(_Model):
    """One scored series of one service: its peak after the baseline against the baseline's
    median, in robust standard deviations (``z``). ``counted``: whether it entered the
    service's score (a latency whose rise a slow dependency explains does not)."""

    kind: Kind
    name: str
    max: float
    baseline_median: float
    scale: float
    z: float
    counted: bool = True


class ResourceEvidence(_Model):
    """One resource of one service (its strongest series). ``peak_to_mean`` is the paper's
    signal (a gap between the maximum and the average); ``z`` is the robust score."""

    resource: Kind
    max: float
    mean: float
    baseline_median: float
    scale: float
    peak_to_mean: float | None
    z: float
    anomalous: bool


class ServiceVerdict(_Model):
    service: str
    rank: int
    group: Group
    slow: bool
    slow_reasons: list[str] = Field(default_factory=list)
    latency_s: float | None = None
    latency_baseline_s: float | None = None
    latency_z: float | None = None
    latency_score: float = 0.0
    resource_score: float = 0.0
    # The ranking key: the largest robust z over every counted series of the service.
    score: float = 0.0
    top_signal: str | None = None  # "<kind>:<name>" of the series that gave the score
    latency_explained: bool = False  # its latency rise is explained by a slow dependency
    signals: list[SignalScore] = Field(default_factory=list)
    resources: dict[Kind, ResourceEvidence | None] = Field(default_factory=dict)
    dependencies: list[str] = Field(default_factory=list)
    slow_dependencies: list[str] = Field(default_factory=list)
    # slow callees whose slowness does not explain this service's (AnalysisConfig.explain_share)
    unexplaining_dependencies: list[str] = Field(default_factory=list)
    dependencies_healthy: bool = True
    cycle_with: list[str] = Field(default_factory=list)


class Finding(_Model):
    """The answer: root-cause candidates first, then every service, and the reasoning."""

    kind: Literal["promreflex.rca.finding"] = KIND
    version: Literal[1] = 1
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat().replace("+00:00", "Z"))
    source: str = ""
    config: AnalysisConfig = AnalysisConfig()
    root_causes: list[str] = Field(default_factory=list)
    ranking: list[ServiceVerdict] = Field(default_factory=list)
    steps: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _roots_are_ranked(self) -> Finding:
        ranked = {v.service for v in self.ranking}
        missing = [s for s in self.root_causes if s not in ranked]
        if missing:
            raise ValueError(f"root causes missing from the ranking: {', '.join(missing)}")
        return self

    @property
    def root_cause(self) -> str | None:
        return self.root_causes[0] if self.root_causes else None

    def top(self, k: int) -> list[str]:
        """The first ``k`` services of the full ranking (for AC@k)."""
        return [v.service for v in self.ranking[:k]]

    def rank_of(self, service: str) -> int | None:
        return next((v.rank for v in self.ranking if v.service == service), None)

    def verdict(self, service: str) -> ServiceVerdict:
        for v in self.ranking:
            if v.service == service:
                return v
        raise KeyError(service)

    def explain(self) -> str:
        """The chain of reasoning, one numbered step a line."""
        head = f"Root-cause analysis{f' of {self.source}' if self.source else ''} ({self.created_at})"
        lines = [head] + [f"{i}. {step}" for i, step in enumerate(self.steps, 1)]
        return "\n".join(lines)

    def table(self, limit: int | None = None) -> str:
        """The ranking as a fixed-width table."""
        rows = [("rank", "service", "group", "score", "latency", "typical", "z", "resources")]
        for v in self.ranking[:limit]:
            res = ", ".join(
                f"{r} z={e.z:.1f}" for r, e in v.resources.items() if e is not None
            ) or "-"
            rows.append((
                str(v.rank), v.service, v.group, f"{v.score:.2f}",
                fmt_seconds(v.latency_s), fmt_seconds(v.latency_baseline_s),
                "-" if v.latency_z is None else f"{v.latency_z:.1f}", res,
            ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows
        ).rstrip()

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> Finding:
        """Parse a report; a JSON document without our ``kind`` is refused, not defaulted."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("kind") != KIND:
            raise ValueError(f'not a finding: "kind" must be "{KIND}"')
        return cls.model_validate(raw)

    def save(self, path: str | Path) -> None:
        """Write the report atomically, so ``rca explain`` never reads half of one."""
        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Finding:
        return cls.from_json(Path(path).read_text())


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f}ms" if value < 1 else f"{value:.3g}s"
