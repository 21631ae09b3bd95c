"""The decision logic of controllers.rca on small synthetic graphs."""

from __future__ import annotations

import json
import re

import pytest

from controllers.rca import AnalysisConfig, AnalysisInput, Finding, LatencyStats, ServiceData, TimeSeries, analyse
from controllers.rca.models import Metric
from controllers.rca.graph import adjacency, root_components, slow_subgraph, strongly_connected_components
from controllers.rca.stats import p99, robust_score

N = 20
WOBBLE = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.3, -0.2, 0.1, 0.0, -0.3, 0.2, -0.1, 0.3, 0.0, -0.2, 0.1, 0.2]


def flat(level: float) -> list[float]:
    """A steady series with a 1.5 % wobble, like a healthy service."""
    return [level * (1 + 0.05 * w) for w in WOBBLE]


def spike(level: float, peak: float, since: int = 14) -> list[float]:
    """Steady, then ``peak`` from sample ``since`` on (the last 30 % of the window)."""
    return [peak if i >= since else v for i, v in enumerate(flat(level))]


def svc(latency: list[float] | None = None, cpu: list[float] | None = None,
        memory: list[float] | None = None, disk: list[float] | None = None) -> ServiceData:
    resources = {}
    for name, values in (("cpu", cpu), ("memory", memory), ("disk_io", disk)):
        if values is not None:
            resources[name] = TimeSeries.of(values)
    lat = LatencyStats(series=TimeSeries.of(latency)) if latency is not None else None
    return ServiceData(latency=lat, resources=resources)


def groups(f: Finding) -> dict[str, str]:
    return {v.service: v.group for v in f.ranking}


def test_chain_blames_the_slow_and_hot_end():
    f = analyse(AnalysisInput(
        edges=[("a", "b"), ("b", "c")],
        services={
            "a": svc(spike(0.05, 0.30), cpu=flat(0.2)),
            "b": svc(spike(0.03, 0.25), cpu=flat(0.2)),
            "c": svc(spike(0.01, 0.20), cpu=spike(0.1, 0.9)),
        },
    ))
    assert f.root_causes == ["c"]
    assert f.top(3) == ["c", "b", "a"]
    assert groups(f) == {"a": "symptom", "b": "symptom", "c": "root_cause"}
    c = f.verdict("c")
    assert c.dependencies_healthy and c.slow_dependencies == []
    assert c.resources["cpu"].anomalous and c.resources["cpu"].z > 50
    assert c.resources["memory"] is None and c.resources["disk_io"] is None
    assert f.verdict("a").slow_dependencies == ["b"]
    text = f.explain()
    assert "so a is a symptom (a -> b -> c)" in text
    assert "so b is a symptom (b -> c)" in text
    assert "c has no dependencies: root-cause candidate" in text
    assert "-> root cause c" in text and "its CPU peaked well above normal" in text
    # Furthest symptom first, then the candidate, then its resources, then the conclusion.
    assert text.index("a is slow") < text.index("b is slow") < text.index("c is slow") < text.index("c resources")


def test_slow_with_healthy_dependency_but_no_resource_evidence():
    f = analyse(AnalysisInput(
        edges=[("a", "b")],
        services={
            "a": svc(spike(0.02, 0.40), cpu=flat(0.3), memory=flat(200e6), disk=flat(1e6)),
            "b": svc(flat(0.01), cpu=flat(0.1)),
        },
    ))
    assert f.root_causes == ["a"]
    a = f.verdict("a")
    assert not any(e.anomalous for e in a.resources.values() if e is not None)
    # below 1.0, the anomaly line: a 1.5 % wobble against the series' own spread (no floor at a
    # share of the level for resources) stays at a third of it
    assert a.resource_score < 0.5
    # The score is the largest robust z over the service's series: here its latency.
    assert a.score == pytest.approx(a.latency_z) and a.top_signal == "latency:latency"
    assert a.dependencies == ["b"] and a.dependencies_healthy
    assert "a's dependencies: b healthy" in f.explain()
    assert "its measured resources stayed normal" in f.explain()


def test_diamond_with_slow_bottom_names_only_the_bottom():
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    f = analyse(AnalysisInput(edges=edges, services={
        "a": svc(spike(0.05, 0.5)), "b": svc(spike(0.03, 0.4)),
        "c": svc(spike(0.03, 0.4)), "d": svc(spike(0.01, 0.3), cpu=spike(0.1, 0.8)),
    }))
    assert f.root_causes == ["d"]
    assert f.verdict("a").slow_dependencies == ["b", "c"]
    assert groups(f) == {"a": "symptom", "b": "symptom", "c": "symptom", "d": "root_cause"}


def test_diamond_with_two_slow_branches_ranks_them_by_resources():
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    f = analyse(AnalysisInput(edges=edges, services={
        "a": svc(spike(0.05, 0.5)),
        "b": svc(spike(0.03, 0.4), cpu=flat(0.2)),
        "c": svc(spike(0.03, 0.4), cpu=spike(0.2, 0.9)),
        "d": svc(flat(0.01)),
    }))
    assert f.root_causes == ["c", "b"]
    assert f.top(2) == ["c", "b"]
    # a's latency rise is its slow dependencies': not counted in its score.
    assert f.verdict("a").latency_explained and f.verdict("a").score == 0.0
    # Equal latency scores; c's CPU rise (0.2 -> 0.9 against a 1.5 % wobble) scores above them,
    # so c ranks first by its own score, not only by the tie-break.
    assert f.verdict("c").latency_z == pytest.approx(f.verdict("b").latency_z)
    assert f.verdict("c").score > f.verdict("b").score == pytest.approx(f.verdict("b").latency_z)
    assert f.verdict("c").resource_score > f.verdict("b").resource_score
    assert "2 candidates remain" in f.explain()


def test_missing_resource_data_is_neutral_not_a_penalty():
    f = analyse(AnalysisInput(
        edges=[("a", "x"), ("a", "y")],
        services={
            "a": svc(flat(0.05)),
            "x": svc(spike(0.01, 0.2)),                   # no resource data at all
            "y": svc(spike(0.01, 0.2), cpu=flat(0.3)),    # CPU measured, normal
        },
    ))
    x, y = f.verdict("x"), f.verdict("y")
    assert set(f.root_causes) == {"x", "y"}
    assert x.resources == {"cpu": None, "memory": None, "disk_io": None, "network": None}
    assert x.score == pytest.approx(x.latency_z) and x.resource_score == 0.0
    assert y.resource_score < 0.5 and not y.resources["cpu"].anomalous
    assert "x resources: no CPU, memory, disk or network data." in f.explain()


def test_no_candidates_gives_an_empty_finding_with_a_reason():
    f = analyse(AnalysisInput(
        edges=[("a", "b")],
        services={"a": svc(flat(0.05), cpu=flat(0.2)), "b": svc(flat(0.01))},
    ))
    assert f.root_causes == [] and f.root_cause is None
    assert [v.group for v in f.ranking] == ["not_slow", "not_slow"]
    assert [v.rank for v in f.ranking] == [1, 2]
    assert "No service is slow" in f.explain() and "no root cause is named" in f.explain()
    assert Finding.from_json(f.to_json()) == f


def test_cycle_of_slow_services_terminates_and_names_each_member():
    f = analyse(AnalysisInput(
        edges=[("a", "b"), ("b", "a"), ("b", "h")],
        services={"a": svc(spike(0.02, 0.3)), "b": svc(spike(0.02, 0.4)), "h": svc(flat(0.01))},
    ))
    assert set(f.root_causes) == {"a", "b"}
    assert f.verdict("a").cycle_with == ["b"] and f.verdict("a").dependencies_healthy
    assert "in a cycle" in f.explain()


def test_cycle_with_a_slow_exit_blames_the_exit():
    f = analyse(AnalysisInput(
        edges=[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "d")],
        services={
            "a": svc(spike(0.02, 0.3)), "b": svc(spike(0.02, 0.3)),
            "c": svc(spike(0.02, 0.3)), "d": svc(spike(0.01, 0.2)),
        },
    ))
    assert f.root_causes == ["d"]  # its self-call explains nothing
    assert groups(f)["a"] == "symptom" and "a -> b -> c -> d" in f.explain()


def test_paper_rule_absolute_threshold_only():
    f = analyse(
        AnalysisInput(
            edges=[("orders", "carts"), ("carts", "carts-db")],
            services={
                "orders": ServiceData(latency=LatencyStats(max_s=4.2)),
                "carts": ServiceData(latency=LatencyStats(max_s=4.8)),
                "carts-db": ServiceData(latency=LatencyStats(max_s=0.02)),
            },
        ),
        AnalysisConfig(relative=False),
    )
    assert f.root_causes == ["carts"]
    text = f.explain()
    assert "orders is slow (max 4.2s > 3s); its dependency carts is slow too, so orders is a symptom" in text
    assert "carts's dependencies: carts-db healthy" in text
    assert f.verdict("carts").latency_score == pytest.approx(4.8 / 3)


def test_threshold_is_configurable():
    data = AnalysisInput(services={"a": ServiceData(latency=LatencyStats(max_s=1.2))})
    assert analyse(data, AnalysisConfig(relative=False)).root_causes == []
    assert analyse(data, AnalysisConfig(relative=False, threshold_s=1.0)).root_causes == ["a"]


def test_alerting_service_without_data_is_a_candidate():
    f = analyse(AnalysisInput(
        edges=[("front", "orders")],
        services={"front": svc(spike(0.05, 0.6))},
        alerting=["orders"],
    ))
    assert f.root_causes == ["orders"]
    assert f.verdict("orders").slow_reasons == ["ServiceResponseTimeHigh is firing"]
    assert f.verdict("front").group == "symptom"


def test_small_changes_are_not_slow():
    # z is high (a very quiet baseline) but the peak is only 1.3x typical: not practically slow.
    values = flat(0.1)
    values[15] = 0.13
    v = analyse(AnalysisInput(services={"a": svc(values)})).verdict("a")
    assert v.latency_z > 3.5 and not v.slow
    # A 0.9 ms rise of a 3 ms call stays under the 1 ms spread floor.
    values = flat(0.003)
    values[15] = 0.0039
    v = analyse(AnalysisInput(services={"a": svc(values)})).verdict("a")
    assert v.latency_z < 1.0 and not v.slow


def test_baseline_split_sees_a_change_longer_than_half_the_window():
    # Slow for 70 % of the window: scored against itself the slow level is "typical".
    values = [0.01] * 6 + [0.2 * (1 + 0.01 * w) for w in WOBBLE[:14]]
    series = TimeSeries.of(values, start=1000.0, step=10.0)
    services = {"a": ServiceData(latency=LatencyStats(series=series))}
    # Scored against itself the slow level is "typical"; the change point finds the start.
    assert analyse(AnalysisInput(services=services), AnalysisConfig(detect_start=False)).root_causes == []
    found = analyse(AnalysisInput(services=services))
    assert found.root_causes == ["a"] and found.verdict("a").latency_baseline_s == pytest.approx(0.01)
    assert "earliest significant change point over 1 series is t=1060" in found.explain()
    split = analyse(AnalysisInput(services=services, baseline_end=1055.0))
    assert split.root_causes == ["a"]
    assert split.verdict("a").latency_baseline_s == pytest.approx(0.01)
    assert "scored against the earlier one" in split.explain()


def test_p99_statistic_compares_the_p99():
    data = AnalysisInput(services={"a": ServiceData(latency=LatencyStats(max_s=5.0, p99_s=2.0))})
    assert analyse(data, AnalysisConfig(relative=False)).root_causes == ["a"]
    assert analyse(data, AnalysisConfig(relative=False, statistic="p99")).root_causes == []


def test_json_round_trip_and_foreign_documents_refused():
    f = analyse(AnalysisInput(edges=[("a", "b")], services={"b": svc(spike(0.01, 0.2), cpu=spike(0.1, 0.5))}))
    again = Finding.from_json(f.to_json())
    assert again == f and again.root_cause == "b"
    assert json.loads(f.to_json())["ranking"][0]["resources"]["cpu"]["anomalous"] is True
    with pytest.raises(ValueError, match="kind"):
        Finding.from_json("{}")


def test_non_finite_samples_are_dropped():
    s = TimeSeries(points=[(2.0, float("nan")), (1.0, 0.5), (3.0, float("inf"))])
    assert s.points == [(1.0, 0.5)]


def test_robust_score_values():
    rs = robust_score(TimeSeries.of([1.0, 2.0, 3.0, 4.0, 100.0]))
    # median 3, MAD 1 -> scale 1.4826
    assert rs.baseline_median == 3.0 and rs.scale == pytest.approx(1.4826)
    assert rs.z == pytest.approx(97 / 1.4826)
    assert rs.peak_to_mean == pytest.approx(100 / 22)
    flat_rs = robust_score(TimeSeries.of([2.0] * 5), floor_ratio=0.05)
    assert flat_rs.scale == pytest.approx(0.1) and flat_rs.z == 0.0
    assert robust_score(TimeSeries()) is None
    assert p99([1.0, 2.0]) == pytest.approx(1.99) and p99([7.0]) == 7.0


def test_scc_handles_deep_chains_without_recursion():
    n = 5000
    adj = adjacency([(f"s{i}", f"s{i + 1}") for i in range(n)] + [(f"s{n}", "s0")])
    comps = strongly_connected_components(adj)
    assert len(comps) == 1 and len(comps[0]) == n + 1
    chain = adjacency([(f"s{i}", f"s{i + 1}") for i in range(n)])
    assert len(strongly_connected_components(chain)) == n + 1


def test_root_components_on_a_mixed_graph():
    adj = adjacency([("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "c"), ("e", "e")])
    comp_of, roots = root_components(slow_subgraph(adj, {"a", "b", "c", "d", "e"}))
    assert roots == {"c", "d", "e"}
    assert comp_of["a"] == frozenset({"a", "b"})


def collateral_input(callee_peak: float, callee_memory: list[float] | None = None) -> AnalysisInput:
    """orders leaks memory and slows from 50 to 250 ms; carts, which it calls, shares the host
    and slows from 25 ms to ``callee_peak``. Both alert."""
    return AnalysisInput(
        edges=[("front-end", "orders"), ("orders", "carts")],
        alerting=["orders", "carts"],
        services={
            "front-end": svc(flat(0.1), cpu=flat(0.2), memory=flat(80e6)),
            "orders": svc(spike(0.05, 0.25), cpu=flat(0.2), memory=spike(80e6, 600e6)),
            "carts": svc(spike(0.025, callee_peak), cpu=flat(0.1), memory=callee_memory or flat(60e6)),
        },
    )


def test_a_callee_slowed_a_little_does_not_explain_a_caller_whose_own_memory_peaked():
    f = analyse(collateral_input(0.1))  # carts added 75 ms, orders 200 ms: less than half
    assert groups(f)["orders"] == "root_cause" and groups(f)["carts"] == "root_cause"
    assert f.root_causes[0] == "orders"  # ranked by resources: orders' memory peaked
    v = f.verdict("orders")
    assert v.slow_dependencies == ["carts"] and v.unexplaining_dependencies == ["carts"] and v.dependencies_healthy
    text = f.explain()
    assert "carts is slow but does not explain orders: orders's own memory peaked" in text
    assert re.search(r"carts added 7\d\.\dms to its typical latency against orders's (19\d|200)\.\dms \(less than 50%\)", text)
    assert "orders's dependencies: carts slow, but not enough to explain it" in text


def test_a_callee_that_added_half_the_latency_explains_its_caller():
    f = analyse(collateral_input(0.15))  # carts added 125 ms of orders' 200 ms
    assert groups(f)["orders"] == "symptom" and f.root_causes == ["carts"]
    assert f.verdict("orders").unexplaining_dependencies == []
    assert "so orders is a symptom (orders -> carts)" in f.explain()


def test_a_callee_whose_own_resources_peaked_explains_its_caller():
    f = analyse(collateral_input(0.1, callee_memory=spike(60e6, 400e6)))
    assert groups(f)["orders"] == "symptom" and f.root_causes == ["carts"]


def test_a_callee_slow_by_a_blip_does_not_explain_a_caller_that_rose_twenty_times_as_much():
    """Whatever the caller's resources (here none peaked: a delay fault): carts "slow" by a
    burst (+20 ms, 1.8x its typical) cannot be why orders rose by 400 ms (Train Ticket at 1 Hz:
    with the call graph, the delayed service fell from first to thirtieth)."""
    data = AnalysisInput(
        edges=[("front-end", "orders"), ("orders", "carts")],
        services={
            "front-end": svc(spike(0.1, 0.5), cpu=flat(0.2), memory=flat(80e6)),
            "orders": svc(spike(0.05, 0.45), cpu=flat(0.2), memory=flat(80e6)),
            "carts": svc(spike(0.025, 0.045), cpu=flat(0.1), memory=flat(60e6)),
        },
    )
    f = analyse(data)
    assert f.top(1) == ["orders"] and groups(f)["orders"] == "root_cause"
    assert groups(f)["front-end"] == "symptom"  # orders' +400 ms explains front-end's
    assert f.verdict("orders").unexplaining_dependencies == ["carts"]
    assert re.search(r"carts is slow but does not explain orders: carts added 20\.0ms to its typical latency "
                     r"against orders's 400\.0ms \(less than 20%\)", f.explain())
    plain = analyse(data, AnalysisConfig(explain_share=0))
    assert groups(plain)["orders"] == "symptom"


def test_explain_share_zero_is_the_plain_graph_rule():
    f = analyse(collateral_input(0.1), AnalysisConfig(explain_share=0))
    assert groups(f)["orders"] == "symptom" and f.root_causes == ["carts"]


def test_below_the_significance_cut_off_the_dependency_rule_orders_the_ranking():
    flat = TimeSeries.of([0.05] * 20)
    wobble = TimeSeries.of([0.10, 0.11] * 8 + [0.12] * 4)  # a rise of about 2 robust sigma: noise
    data = AnalysisInput(
        services={"a": ServiceData(latency=LatencyStats(series=flat)),  # alerting, nothing measured moved
                  "b": ServiceData(latency=LatencyStats(series=flat), resources={"cpu": wobble})},
        alerting=["a"], baseline_end=15.0,
    )
    f = analyse(data, AnalysisConfig(relative=False))
    b = f.verdict("b")
    assert 0 < b.score < f.config.z_threshold and f.verdict("a").score < b.score
    assert f.top(2) == ["a", "b"]  # the rule's candidate first: b's higher score is noise
    spiked = data.model_copy(update={"services": {
        **data.services, "b": ServiceData(latency=LatencyStats(series=flat), resources={"cpu": TimeSeries.of([0.1] * 16 + [0.9] * 4)})}})
    assert analyse(spiked, AnalysisConfig(relative=False)).top(1) == ["b"]  # a significant anomaly leads


def _noisy(rng, n: int, level: float, sd: float) -> list[float]:
    return [level + rng.gauss(0, sd) for _ in range(n)]


def test_a_memory_leak_outranks_a_second_long_latency_burst():
    """A stranger's RCAEval-layout case: cartservice's working set doubles (300 -> 600 MB over
    5 minutes, 0.5 MB of noise), adservice's p90 has one 3-second burst (20 -> 60 ms) after the
    fault. Against a spread floored at 5 % of its level the leak scored 20 and adservice was named."""
    import random

    rng = random.Random(7)
    n, inject = 1200, 600
    mem = [v + (min(i - inject, 300) / 300 * 300e6 if i > inject else 0.0)
           for i, v in enumerate(_noisy(rng, n, 300e6, 0.5e6))]
    burst = [60e-3 if 900 <= i < 903 else v for i, v in enumerate(_noisy(rng, n, 20e-3, 1e-3))]
    f = analyse(AnalysisInput(
        baseline_end=float(inject),
        services={
            "cartservice": svc(_noisy(rng, n, 30e-3, 1e-3), cpu=_noisy(rng, n, 0.2, 0.005), memory=mem),
            "adservice": svc(burst, cpu=_noisy(rng, n, 0.1, 0.005), memory=_noisy(rng, n, 200e6, 0.5e6)),
        },
    ))
    assert f.top(1) == ["cartservice"], [(v.service, v.score) for v in f.ranking]
    assert f.verdict("cartservice").resources["memory"].z > 100


def test_sporadic_errors_seen_before_the_fault_are_not_an_anomaly():
    """A gateway whose error series is 0 in most seconds and 1-2 in about 1 % of them, before and
    after the fault alike (a flaky client): its IQR is 0; scored against the errors floor, two
    errors in a second were z 200 and named it in 21 of 25 of a stranger's cases."""
    import random

    rng = random.Random(3)
    n, inject = 1200, 600
    errors = [float(rng.choice((1, 2))) if rng.random() < 0.01 else 0.0 for _ in range(n)]
    errors[inject + 50] = 2.0  # one after the fault for sure
    slow = [v * (12 if i > inject else 1) for i, v in enumerate(_noisy(rng, n, 20e-3, 1e-3))]
    def gateway_with(errors: list[float]) -> ServiceData:
        return ServiceData(latency=LatencyStats(series=TimeSeries.of(lat)), resources={"cpu": TimeSeries.of(cpu)},
                           metrics=[Metric(kind="errors", name="ts-ui-dashboard_error", series=TimeSeries.of(errors))])

    lat, cpu = _noisy(rng, n, 30e-3, 1e-3), _noisy(rng, n, 0.2, 0.005)
    gateway = gateway_with(errors)
    f = analyse(AnalysisInput(
        baseline_end=float(inject),
        services={"gateway": gateway, "route": svc(slow, cpu=_noisy(rng, n, 0.2, 0.005))},
    ))
    assert f.top(1) == ["route"], [(v.service, v.score) for v in f.ranking]
    assert f.verdict("gateway").score < 3.5
    # an error burst beyond anything the baseline did still stands out
    errors[inject + 60] = 20.0
    f = analyse(AnalysisInput(baseline_end=float(inject), services={"gateway": gateway_with(errors)}))
    assert max(s.z for s in f.verdict("gateway").signals if s.kind == "errors") >= 20


def test_a_baseline_without_spread_is_not_judged_by_its_one_excursion():
    """A review of the sparse rule: one excursion in a baseline whose IQR is 0 set the scale, so
    a sustained fault up to 1.17x that excursion scored below 3.5 (one GC pause hid a 21x
    latency rise; one bad second a sustained error rate); and a held baseline kept the 5 % floor
    while one sample 4 KiB off lost it (z 2 against 30 for the same leak)."""
    def z(base: list[float], recent: list[float], **kw) -> float:
        rs = robust_score(TimeSeries.of(base + recent), baseline_end=len(base) - 1, **kw)
        assert rs is not None
        return rs.z

    gc = [0.002] * 300 + [0.045] + [0.002] * 299
    assert z(gc, [0.042] * 300, floor_abs=0.001, floor_ratio=0.05) > 30  # the level is anomalous
    assert z(gc, [0.002] * 299 + [0.045], floor_abs=0.001, floor_ratio=0.05) < 3.5  # its excursion again is not
    errors = [0.0] * 20 + [5.0] + [0.0] * 19
    assert z(errors, [4.0] * 30, floor_abs=0.01) >= 300
    assert z(errors, [0.0] * 29 + [5.0], floor_abs=0.01) < 3.5
    held = [300e6] * 40
    jitter = [300e6] * 39 + [300e6 + 4096]
    leak = [360e6] * 30
    kw = {"floor_abs": 1024.0 * 1024.0, "flat_floor_ratio": 0.01}
    assert z(held, leak, **kw) == pytest.approx(z(jitter, leak, **kw)) == pytest.approx(20.0)


def test_a_level_needs_a_few_samples_and_a_floor():
    """Review P: with 1-2 recent samples the "level" is the peak (an ordinary baseline burst
    scored 100-200), and with every floor at 0 a tiny steady level scored z 1e9."""
    base = [0.0] * 20 + [5.0] + [0.0] * 19
    rs = robust_score(TimeSeries.of(base + [5.0]), baseline_end=39, floor_abs=0.01)
    assert rs is not None and rs.z < 3.5  # one sample as high as the baseline's excursion
    rs = robust_score(TimeSeries.of(base + [0.001] * 30), baseline_end=39)  # no floor at all
    assert rs is not None and rs.z < 3.5


def test_a_found_start_that_leaves_a_short_baseline_is_said_to_be_doubtful():
    """A review: without an inject time the change point landed in a recording's first minutes
    on autocorrelated data, and the report said "what came before it is the baseline"."""
    f = analyse(AnalysisInput(services={
        "a": svc([0.01] * 8 + [0.2] * 292, cpu=[0.1] * 8 + [0.9] * 292),
        "b": svc(flat(0.02) * 15),
    }))
    assert "the start may not be the fault's" in f.explain()
    g = analyse(AnalysisInput(services={"a": svc([0.01] * 200 + [0.2] * 100), "b": svc(flat(0.02) * 15)}))
    assert "earliest significant change point" in g.explain() and "may not be the fault's" not in g.explain()
