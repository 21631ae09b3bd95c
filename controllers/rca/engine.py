"""The decision: which slow service is the cause, and why.

1. Candidates are slow services: ``ServiceResponseTimeHigh`` firing, latency above the paper's
   absolute line (3 s), or (``relative``) a peak that is both statistically unusual for that
   service (robust z >= 3.5) and practically large (>= 1.5x its typical value).
2. Root-cause candidates are slow services whose slowness is not explained downstream: none of
   their callees is slow (or, for a cycle of slow services, none outside the cycle is). A slow
   callee does not explain a caller whose own resources peaked while the callee's did not and
   to whose added latency it contributed little (``explain_share``): its slowness is collateral.
3. They are ranked by ``latency_score x (1 + resource_score)``. Both scores are normalised to
   their own line (1.0 = just at the candidate threshold), so a service slow by the absolute
   rule and one slow by the relative rule compare on one scale; resources multiply, so they
   order candidates but cannot make a healthy service slow. The resource score is the largest
   of CPU, memory and disk I/O, not their sum: one saturated resource is enough to explain
   slowness, and summing would favour services that merely have more metrics.
4. Every service gets a place in one ranking (root-cause candidates, then symptoms, then the
   rest; score within each), which is what AC@1 / AC@3 evaluations read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controllers.rca.graph import adjacency, path_to_root, root_components, slow_subgraph
from controllers.rca.models import (
    RESOURCE_NAMES,
    RESOURCES,
    AnalysisConfig,
    AnalysisInput,
    Finding,
    Group,
    LatencyStats,
    Resource,
    ResourceEvidence,
    ServiceData,
    ServiceVerdict,
    fmt_seconds,
)
from controllers.rca.stats import RobustScore, p99, robust_score, split

_GROUP_ORDER: dict[Group, int] = {"root_cause": 0, "symptom": 1, "not_slow": 2}


@dataclass
class _LatencyView:
    value: float | None = None
    robust: RobustScore | None = None
    slow: bool = False
    reasons: list[str] = field(default_factory=list)
    score: float = 0.0

    def describe(self, cfg: AnalysisConfig) -> str:
        """What was seen, in words, for a step of the explanation."""
        if self.reasons:
            return "; ".join(self.reasons)
        if self.value is None:
            return "no latency data"
        text = f"{cfg.statistic} {fmt_seconds(self.value)} <= {fmt_seconds(cfg.threshold_s)}"
        if self.robust is not None:
            text += f", typical {fmt_seconds(self.robust.baseline_median)}, robust z {self.robust.z:.1f}"
        return text


def _latency(stats: LatencyStats | None, alerting: bool, cfg: AnalysisConfig, baseline_end: float | None) -> _LatencyView:
    view = _LatencyView()
    if alerting:
        view.slow = True
        view.reasons.append("ServiceResponseTimeHigh is firing")
    if stats is None:
        return view
    view.value = stats.max_s if cfg.statistic == "max" else stats.p99_s
    series = stats.series
    if series is not None and series.points:
        view.robust = robust_score(
            series, baseline_end,
            min_baseline_points=cfg.min_baseline_points,
            floor_abs=cfg.latency_scale_floor_s, floor_ratio=cfg.scale_floor_ratio,
        )
        if view.value is None:
            recent = split(series, baseline_end, cfg.min_baseline_points)[1]
            view.value = max(recent) if cfg.statistic == "max" else p99(recent)
    scores = [0.0]
    if view.value is not None:
        scores.append(view.value / cfg.threshold_s)
        if view.value > cfg.threshold_s:
            view.slow = True
            view.reasons.append(f"{cfg.statistic} {fmt_seconds(view.value)} > {fmt_seconds(cfg.threshold_s)}")
    rs = view.robust
    if rs is not None:
        scores.append(rs.z / cfg.z_threshold)
        ratio = rs.ratio_to_typical
        if cfg.relative and rs.z >= cfg.z_threshold and (ratio is None or ratio >= cfg.min_slowdown):
            view.slow = True
            times = f"{ratio:.1f}x " if ratio is not None else ""
            view.reasons.append(
                f"max {fmt_seconds(rs.max)} is {times}its typical {fmt_seconds(rs.baseline_median)}, "
                f"robust z {rs.z:.1f} >= {cfg.z_threshold:g}"
            )
    view.score = max(scores)
    return view


def _resources(data: ServiceData | None, cfg: AnalysisConfig, baseline_end: float | None) -> dict[Resource, ResourceEvidence | None]:
    out: dict[Resource, ResourceEvidence | None] = {}
    for res in RESOURCES:
        series = data.resources.get(res) if data else None
        rs = robust_score(
            series, baseline_end,
            min_baseline_points=cfg.min_baseline_points,
            floor_abs=cfg.resource_scale_floor.get(res, 0.0), floor_ratio=cfg.scale_floor_ratio,
        ) if series is not None else None
        out[res] = None if rs is None else ResourceEvidence(
            resource=res, max=rs.max, mean=rs.mean, baseline_median=rs.baseline_median,
            scale=rs.scale, peak_to_mean=rs.peak_to_mean, z=rs.z,
            anomalous=rs.z >= cfg.resource_z_threshold,
        )
    return out


def _describe_resources(service: str, evidence: dict[Resource, ResourceEvidence | None]) -> str:
    if all(e is None for e in evidence.values()):
        return f"{service} resources: no CPU, memory or disk I/O data."
    parts = []
    for res, e in evidence.items():
        name = RESOURCE_NAMES[res]
        if e is None:
            parts.append(f"{name}: no data")
            continue
        gap = f"max/avg = {e.peak_to_mean:.2f}" if e.peak_to_mean is not None else f"max {e.max:.3g}"
        parts.append(
            f"{name} {gap} (max {e.max:.3g} vs typical {e.baseline_median:.3g}, robust z {e.z:.1f}"
            f"{', anomalous' if e.anomalous else ''})"
        )
    return f"{service} resources: " + "; ".join(parts) + "."


def _added(v: ServiceVerdict) -> float | None:
    """Latency above the service's own baseline."""
    if v.latency_s is None or v.latency_baseline_s is None:
        return None
    return v.latency_s - v.latency_baseline_s


def _names(items: list[str]) -> str:
    return ", ".join(items)


def analyse(data: AnalysisInput, config: AnalysisConfig | None = None) -> Finding:
    """Rank the services of ``data`` as root causes of slowness, with the reasoning."""
    cfg = config or AnalysisConfig()
    services = data.all_services()
    adj = adjacency(data.edges, services)
    alerting = set(data.alerting)
    latency = {
        s: _latency(data.services[s].latency if s in data.services else None, s in alerting, cfg, data.baseline_end)
        for s in services
    }
    evidence = {s: _resources(data.services.get(s), cfg, data.baseline_end) for s in services}
    slow = {s for s, v in latency.items() if v.slow}
    peaked = {s for s in services if any(e is not None and e.anomalous for e in evidence[s].values())}

    def added(s: str) -> float | None:
        lv = latency[s]
        return None if lv.value is None or lv.robust is None else lv.value - lv.robust.baseline_median

    def explains(callee: str, caller: str) -> bool:
        if cfg.explain_share <= 0 or caller not in peaked or callee in peaked:
            return True
        a_caller, a_callee = added(caller), added(callee)
        if a_caller is None or a_callee is None or a_caller <= 0:
            return True
        return a_callee >= cfg.explain_share * a_caller

    slow_calls = slow_subgraph(adj, slow)
    unexplaining = {s: [c for c in deps if not explains(c, s)] for s, deps in slow_calls.items()}
    slow_adj = {s: [c for c in deps if c not in unexplaining[s]] for s, deps in slow_calls.items()}
    comp_of, roots = root_components(slow_adj)

    verdicts: list[ServiceVerdict] = []
    for s in services:
        lv = latency[s]
        ev = evidence[s]
        resource_score = max(
            [max(0.0, e.z) / cfg.resource_z_threshold for e in ev.values() if e is not None], default=0.0
        )
        group: Group = "not_slow" if s not in slow else ("root_cause" if s in roots else "symptom")
        cycle = sorted(comp_of[s] - {s}) if s in comp_of else []
        slow_deps = [c for c in adj[s] if c in slow]
        collateral = unexplaining.get(s, [])
        verdicts.append(ServiceVerdict(
            service=s, rank=0, group=group, slow=lv.slow, slow_reasons=lv.reasons,
            latency_s=lv.value,
            latency_baseline_s=lv.robust.baseline_median if lv.robust else None,
            latency_z=lv.robust.z if lv.robust else None,
            latency_score=lv.score, resource_score=resource_score,
            score=lv.score * (1.0 + resource_score),
            resources=ev, dependencies=adj[s], slow_dependencies=slow_deps, unexplaining_dependencies=collateral,
            dependencies_healthy=not [c for c in slow_deps if c not in cycle and c not in collateral],
            cycle_with=cycle,
        ))
    verdicts.sort(key=lambda v: (_GROUP_ORDER[v.group], -v.score, -v.resource_score, -v.latency_score, v.service))
    ranking = [v.model_copy(update={"rank": i}) for i, v in enumerate(verdicts, 1)]
    root_causes = [v.service for v in ranking if v.group == "root_cause"]
    steps = _reasoning(cfg, data, ranking, latency, slow_adj, roots)
    return Finding(source=data.source, config=cfg, root_causes=root_causes, ranking=ranking, steps=steps)


def _reasoning(
    cfg: AnalysisConfig,
    data: AnalysisInput,
    ranking: list[ServiceVerdict],
    latency: dict[str, _LatencyView],
    slow_adj: dict[str, list[str]],
    roots: set[str],
) -> list[str]:
    rule = f"ServiceResponseTimeHigh firing, or {cfg.statistic} latency above {fmt_seconds(cfg.threshold_s)}"
    if cfg.relative:
        rule += (
            f", or a max at least {cfg.min_slowdown:g}x the service's typical latency with a "
            f"robust z-score of {cfg.z_threshold:g} or more"
        )
    base = (
        "each series is scored against itself (median and MAD of the whole window)"
        if data.baseline_end is None
        else f"the recent window (after t={data.baseline_end:.0f}) is scored against the earlier one"
    )
    steps = [*data.notes, f"{len(ranking)} services, {len(data.edges)} call edges. A service is slow when: {rule}; {base}."]
    slow = [v for v in ranking if v.slow]
    if not slow:
        measured = [v for v in ranking if v.latency_s is not None]
        worst = max(measured, key=lambda v: v.latency_score, default=None)
        tail = f" The closest is {worst.service}: {latency[worst.service].describe(cfg)}." if worst else ""
        steps.append(f"No service is slow, so there is nothing to explain and no root cause is named.{tail}")
        return steps

    chains = {v.service: path_to_root(v.service, slow_adj, roots) for v in slow if v.group == "symptom"}
    for v in sorted((v for v in slow if v.group == "symptom"), key=lambda v: (-len(chains[v.service]), v.service)):
        chain = chains[v.service]
        explaining = [d for d in v.slow_dependencies if d not in v.unexplaining_dependencies]
        deps = [d for d in explaining if d not in v.cycle_with] or explaining
        word = "dependency" if len(deps) == 1 else "dependencies"
        verb = "is" if len(deps) == 1 else "are"
        steps.append(
            f"{v.service} is slow ({latency[v.service].describe(cfg)}); its {word} {_names(deps)} "
            f"{verb} slow too, so {v.service} is a symptom ({' -> '.join(chain)})."
        )
    candidates = [v for v in ranking if v.group == "root_cause"]
    by_name = {v.service: v for v in ranking}
    for v in candidates:
        head = f"{v.service} is slow ({latency[v.service].describe(cfg)})"
        healthy = [d for d in v.dependencies if d not in v.slow_dependencies]
        collateral = v.unexplaining_dependencies
        if v.cycle_with:
            deps = f" and its dependencies outside it ({_names(healthy)}) are healthy" if healthy else ""
            steps.append(
                f"{head}; it calls and is called by the slow {_names(v.cycle_with)} in a cycle{deps}, "
                "so the cycle is not explained downstream and each member is a candidate."
            )
        elif healthy or collateral:
            measured = [d for d in healthy if by_name[d].latency_s is not None]
            unmeasured = [d for d in healthy if by_name[d].latency_s is None]
            said = []
            if measured:
                said.append(f"{_names(measured)} healthy")
            if unmeasured:
                said.append(f"{_names(unmeasured)} not measured (no latency data, no alert)")
            if collateral:
                said.append(f"{_names(collateral)} slow, but not enough to explain it")
            steps.append(
                f"{head}; {v.service}'s dependencies: {'; '.join(said)}. So its slowness "
                "is not explained downstream: root-cause candidate."
            )
        else:
            steps.append(f"{head}; {v.service} has no dependencies: root-cause candidate.")
        for d in collateral:
            mine, theirs = v, by_name[d]
            own = " and ".join(RESOURCE_NAMES[r] for r, e in mine.resources.items() if e is not None and e.anomalous)
            steps.append(
                f"{d} is slow but does not explain {v.service}: {v.service}'s own {own} peaked while "
                f"{d}'s resources stayed normal, and {d} added {fmt_seconds(_added(theirs))} to its "
                f"typical latency against {v.service}'s {fmt_seconds(_added(mine))} (less than "
                f"{cfg.explain_share:.0%}), so {d}'s slowness is collateral and both stay candidates."
            )
        steps.append(_describe_resources(v.service, v.resources))
    top = candidates[0]
    formula = f"score {top.score:.2f} = latency {top.latency_score:.2f} x (1 + resources {top.resource_score:.2f})"
    if len(candidates) > 1:
        order = ", ".join(f"{v.service} ({v.score:.2f})" for v in candidates)
        steps.append(f"{len(candidates)} candidates remain; ranked by latency score x (1 + resource score): {order}.")
    anomalous = [RESOURCE_NAMES[r] for r, e in top.resources.items() if e is not None and e.anomalous]
    if anomalous:
        why = f"its {' and '.join(anomalous)} peaked well above normal"
    elif all(e is None for e in top.resources.values()):
        why = (
            "no resource data was collected for it, so the graph and latency alone name it; "
            "resources neither confirm nor rule out a resource cause"
        )
    else:
        why = (
            "its measured resources stayed normal: look at locks, connection pools, external "
            "calls and configuration"
        )
    steps.append(f"-> root cause {top.service} ({formula}); {why}.")
    return steps
