"""The overhead step's page-queue wait count, read from the proxy's own histogram."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench.admission.run import event_loop_of, waits_in
from controllers.admission.metrics import AdmissionMetrics


def test_waits_in_counts_requests_that_waited_over_a_millisecond() -> None:
    reg = CollectorRegistry()
    m = AdmissionMetrics(reg, ["browse", "login"])
    for w in (0.0, 0.0002, 0.0009, 0.002, 0.03):
        m.page_wait.labels("browse").observe(w)
    m.page_wait.labels("login").observe(0.5)
    text = generate_latest(reg).decode()
    assert waits_in(text, "browse") == {"requests": 5.0, "waited_over_1ms": 2.0}
    assert waits_in(text, "login") == {"requests": 1.0, "waited_over_1ms": 1.0}
    assert waits_in(text, "search") == {"requests": 0.0, "waited_over_1ms": 0.0}


def test_host_busy_counts_neither_idle_nor_iowait_nor_steal() -> None:
    from collections import namedtuple

    from bench.admission.overhead import host_busy

    T = namedtuple("T", "user system idle iowait steal")
    before = T(100.0, 50.0, 800.0, 10.0, 40.0)
    after = T(160.0, 70.0, 890.0, 20.0, 60.0)  # 200 s of core time: 80 busy, 90 idle, 10 iowait, 20 steal
    assert host_busy(before, after) == 40.0
    assert host_busy(before, before) == 0.0


def test_cpu_meter_reports_cores_per_process_and_the_generator_alone(monkeypatch) -> None:
    from bench.admission import overhead

    used = {(1, False): 10.0, (2, True): 100.0, (3, True): 5.0}
    clock = [0.0]
    asked: list[tuple[int, bool]] = []

    def fake_cpu(pid: int, children: bool = True) -> float:
        asked.append((pid, children))
        return used[pid, children]

    waited = {(1, False): 0.0, (2, True): 7.0, (3, True): 1.0}

    def fake_wait(pid: int, children: bool = True) -> float:
        asked.append((pid, children))
        return waited[pid, children]

    monkeypatch.setattr(overhead, "cpu_seconds", fake_cpu)
    monkeypatch.setattr(overhead, "run_delay", fake_wait)
    monkeypatch.setattr(overhead.time, "perf_counter", lambda: clock[0])
    with overhead.CpuMeter({"generator": 1, "app": 2, "proxy": 3}, alone={"generator"}) as m:
        used[1, False] += 1.0
        used[2, True] += 3.0
        used[3, True] += 0.5
        waited[2, True] += 1.2
        waited[3, True] += 0.2
        clock[0] = 2.0
    assert m.cores == {"generator": 0.5, "app": 1.5, "proxy": 0.25}
    assert m.runq_ms_per_s == pytest.approx({"generator": 0.0, "app": 600.0, "proxy": 100.0})
    assert set(asked) == {(1, False), (2, True), (3, True)}  # the generator's children are the others
    blocks = [{"cores": m.cores, "busy_pct": 90.0, "runq_ms_per_s": m.runq_ms_per_s},
              {"cores": {"generator": 0.3, "app": 0.5}, "busy_pct": 70.0, "runq_ms_per_s": {"app": 200.0}}]
    assert overhead.mean_conditions(blocks) == {"cores": {"app": 1.0, "generator": 0.4, "proxy": 0.12},
                                                "runq_ms_per_s": {"app": 400.0, "generator": 0.0, "proxy": 50.0},
                                                "busy_pct": 80.0, "busy_pct_max": 90.0}
    assert overhead.mean_conditions([]) == {}


def test_run_delay_reads_this_process_schedstat() -> None:
    import os

    from bench.admission.overhead import run_delay

    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc schedstat here")
    assert run_delay(os.getpid(), children=False) >= 0.0
    assert run_delay(2**22 + 12345) == 0.0  # no such process: nothing waited


def test_event_loop_of_reads_the_proxys_start_line(tmp_path) -> None:
    log = tmp_path / "proxy.log"
    log.write_text("2026-11-26 INFO promreflex.admission: admission proxy on http://127.0.0.1:1 -> http://127.0.0.1:2; "
                   "control and /metrics on http://127.0.0.1:3; event loop uvloop\n")
    assert event_loop_of(log) == "uvloop"
    log.write_text("WARNING ... uvloop is not installed: running on asyncio's loop\n... event loop asyncio\n")
    assert event_loop_of(log) == "asyncio"
    assert event_loop_of(tmp_path / "missing.log") == "unknown"
