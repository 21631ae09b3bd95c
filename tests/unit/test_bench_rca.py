"""bench/rca: AC@k arithmetic, fault controllers, calibration and rule rendering (no processes)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from bench.rca.cases import all_cases, line_for, render_rules
from bench.rca.faults import (
    AddedLatency,
    CpuHog,
    DiskHog,
    FaultController,
    FaultError,
    MemoryGrowth,
)
from bench.rca.procstats import RESOURCE_TEMPLATES, ProcessUsageCollector, read_usage
from bench.rca.scoring import CaseOutcome, ac_at, avg_at, flag_times, summarise
from bench.rca.topology import CORE_SERVICES, SERVICES, edges
from controllers.rca.promsource import PromQueries

# ---------------------------------------------------------------- AC@k


def test_rank_is_one_based_and_none_when_missing_or_unflagged() -> None:
    assert CaseOutcome("carts", ["carts-db", "carts"]).rank == 2
    assert CaseOutcome("carts", ["orders"]).rank is None
    assert CaseOutcome("carts", None).rank is None


def test_ac_at_k_counts_hits_over_all_cases_and_unflagged_cases_are_misses() -> None:
    cases = [
        CaseOutcome("a", ["a", "b", "c"], 5.0),  # rank 1
        CaseOutcome("b", ["a", "b", "c"], 7.0),  # rank 2
        CaseOutcome("c", ["a", "b", "d", "c"], 9.0),  # rank 4
        CaseOutcome("d", None),  # not flagged
    ]
    assert ac_at(cases, 1) == 0.25
    assert ac_at(cases, 2) == 0.5
    assert ac_at(cases, 3) == 0.5
    assert ac_at(cases, 4) == 0.75
    assert avg_at(cases, 3) == pytest.approx((0.25 + 0.5 + 0.5) / 3)
    assert flag_times(cases) == {"flagged": 3, "cases": 4, "median_s": 7.0, "max_s": 9.0}
    s = summarise(cases)
    assert (s["ac1"], s["ac3"]) == (0.25, 0.5)


def test_ac_at_rejects_k_below_one_and_is_nan_without_cases() -> None:
    with pytest.raises(ValueError):
        ac_at([CaseOutcome("a", ["a"])], 0)
    assert math.isnan(ac_at([], 1))
    assert math.isnan(flag_times([CaseOutcome("a", None)])["median_s"])


# ---------------------------------------------------------------- fault controllers


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_controller_injects_one_fault_at_a_time_and_ends_it_at_its_deadline() -> None:
    clock = FakeClock()
    fc = FaultController(clock=clock)
    fc.inject("latency", duration_s=10, params={"delay_ms": 250})
    assert fc.request_delay() == 0.25
    assert fc.status()["kind"] == "latency"
    clock.now += 9.9
    assert fc.request_delay() == 0.25
    clock.now += 0.2
    assert fc.request_delay() == 0.0  # expired
    assert fc.status() == {"kind": None}
    assert fc.injected_total["latency"] == 1


def test_controller_rejects_bad_requests_without_touching_the_active_fault() -> None:
    fc = FaultController(clock=FakeClock())
    fc.inject("latency", duration_s=5)
    for kind, duration, params in [
        ("fire", 5, {}),  # unknown kind
        ("latency", 5, {"delay_ms": 60_000}),  # out of bounds
        ("latency", 5, {"delay": 1}),  # unknown parameter
        ("latency", 601, {}),  # longer than allowed
        ("latency", "soon", {}),  # not a number
        ("memory", 5, {"max_mb": 4096}),
    ]:
        with pytest.raises(FaultError):
            fc.inject(kind, duration, params)
    assert fc.status()["kind"] == "latency"
    assert fc.clear() is True
    assert fc.clear() is False


def test_added_latency_defaults_and_bounds() -> None:
    assert AddedLatency().request_delay() == 0.25
    assert AddedLatency({"delay_ms": 1000}).request_delay() == 1.0


def test_cpu_hog_spins_its_threads_and_stops_them() -> None:
    hog = CpuHog({"threads": 2, "duty": 0.5})
    hog.start()
    try:
        deadline = time.monotonic() + 5
        while hog.spins == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hog.running and hog.spins > 0
    finally:
        hog.stop()
    assert not hog.running
    spins = hog.spins
    time.sleep(0.05)
    assert hog.spins == spins


def test_memory_growth_grows_by_its_rate_up_to_its_bound_and_gives_it_back() -> None:
    m = MemoryGrowth({"rate_mb_s": 10, "max_mb": 3})
    m.step()  # one 100 ms tick at 10 MB/s: 1 MB
    assert m.held_bytes == pytest.approx(1024 * 1024, rel=0.01)
    for _ in range(10):
        m.step()
    assert m.held_bytes <= 3 * 1024 * 1024
    assert m.held_bytes == pytest.approx(3 * 1024 * 1024, rel=0.01)
    m.stop()
    assert m.held_bytes == 0


def test_memory_growth_runs_on_the_event_loop_until_stopped() -> None:
    async def scenario() -> int:
        m = MemoryGrowth({"rate_mb_s": 10, "max_mb": 100})
        m.start()
        await asyncio.sleep(0.35)
        held = m.held_bytes
        m.stop()
        return held

    held = asyncio.run(scenario())
    assert 1024 * 1024 <= held <= 6 * 1024 * 1024


def test_disk_hog_writes_durably_within_its_file_bound_and_removes_the_file(tmp_path: Path) -> None:
    async def scenario() -> DiskHog:
        hog = DiskHog({"writes": 20, "block_kb": 4, "file_mb": 1, "interval_ms": 10}, tmp_path)
        hog.start()
        deadline = time.monotonic() + 10
        while hog.syncs < 100 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert hog.path.stat().st_size <= 1024 * 1024
        hog.stop()
        return hog

    hog = asyncio.run(scenario())
    assert hog.syncs >= 100 and hog.syncs % 20 == 0  # whole bursts, each write fsynced
    assert hog.written == hog.syncs * 4096
    assert not hog.path.exists()


def test_controller_disk_fault_uses_its_data_dir(tmp_path: Path) -> None:
    fc = FaultController(tmp_path, clock=FakeClock())
    fault = fc.make("disk", {"writes": 1})
    assert isinstance(fault, DiskHog) and fault.path.parent == tmp_path


# ---------------------------------------------------------------- topology, metrics, calibration


def test_topology_has_sock_shops_call_structure() -> None:
    e = edges()
    for edge in [("front-end", "carts"), ("front-end", "orders"), ("front-end", "catalogue"), ("front-end", "user"),
                 ("orders", "carts"), ("orders", "user"), ("orders", "payment"), ("orders", "shipping"),
                 ("orders", "orders-db"), ("carts", "carts-db"), ("catalogue", "catalogue-db"), ("user", "user-db")]:
        assert edge in e
    assert set(CORE_SERVICES) <= set(SERVICES)
    assert {d for _, d in e} <= set(SERVICES)
    assert len(all_cases()) == len(CORE_SERVICES) * 4 >= 20


def test_process_usage_collector_reports_this_process() -> None:
    reg = CollectorRegistry()
    reg.register(ProcessUsageCollector("carts"))
    u = read_usage()
    assert u.rss_bytes > 1024 * 1024
    cpu = reg.get_sample_value("promreflex_bench_process_cpu_seconds_total", {"service": "carts"})
    assert cpu is not None and cpu >= u.cpu_seconds
    assert reg.get_sample_value("promreflex_bench_process_resident_memory_bytes", {"service": "carts"}) > 1024 * 1024
    assert reg.get_sample_value("promreflex_bench_process_disk_io_bytes_total",
                                {"service": "carts", "direction": "write"}) is not None


def test_resource_templates_are_valid_rca_templates() -> None:
    q = PromQueries(resources=RESOURCE_TEMPLATES)
    assert set(q.resources) == {"cpu", "memory", "disk_io"}


@pytest.mark.parametrize(("typical", "line"), [(None, 0.05), (0.004, 0.05), (0.03, 0.1), (0.1, 0.25), (0.2, 0.5), (2.0, 5.0)])
def test_line_is_the_bucket_bound_above_twice_the_typical_maximum(typical: float | None, line: float) -> None:
    assert line_for(typical) == line


def test_render_rules_time_scales_only_the_mesh_rules(tmp_path: Path) -> None:
    out = render_rules(tmp_path, "10s", "5s")
    rules = [r for g in yaml.safe_load((out / "mesh.rules.yml").read_text())["groups"] for r in g["rules"]]
    assert all("[1m]" not in r["expr"] for r in rules)
    assert any("[10s]" in r["expr"] for r in rules)
    alerts = [r for r in rules if "alert" in r]
    assert alerts and all(r["for"] == "5s" for r in alerts)
    repo_rules = Path(__file__).resolve().parents[2] / "rules"
    for f in repo_rules.glob("*.yml"):
        if f.name != "mesh.rules.yml":
            assert (out / f.name).read_text() == f.read_text()


def test_held_out_cases_two_faults_and_a_slow_edge(tmp_path: Path) -> None:
    from bench.rca.cases import HELD_OUT_CASES, CaseResult, Spec, spec_of
    from bench.rca.mesh import Mesh

    assert spec_of(("carts", "cpu")) == Spec("cpu", ("carts",), faults=(("carts", "cpu"),))
    kinds = {s.kind for s in HELD_OUT_CASES}
    assert kinds == {"two", "edge"} and all(s.truth for s in HELD_OUT_CASES)
    assert HELD_OUT_CASES[2].label == "+400 ms on orders->payment"
    # Two causes: the better-ranked one counts; unflagged is a miss.
    two = CaseResult("carts+payment", "two", 0.0, truths=["carts", "payment"], flagged=True,
                     ranking=["payment", "orders", "carts"])
    assert two.outcome().rank == 1
    assert CaseResult("x", "two", 0.0, truths=["carts", "payment"]).outcome().rank is None
    # The slow link is written where the callers' sidecars read it, and cleared again.
    mesh = Mesh(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    mesh.delay_edge("orders", "payment", 0.4)
    assert json.loads(mesh.edge_delays_file.read_text()) == {"orders": {"payment": 0.4}}
    mesh.delay_edge("orders", "payment", 0)
    assert json.loads(mesh.edge_delays_file.read_text()) == {"orders": {}}
