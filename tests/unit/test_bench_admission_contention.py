"""The admission bench app's contention model: past a shared cache budget, the executing
requests' working sets miss and every page does more real work, so the app's throughput drops
when concurrency rises past the knee (the paper's premise)."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.admission import app as app_mod
from bench.admission.arms import ArmStack
from bench.admission.contention import (
    CACHE_BUDGET_MB,
    WORKING_SET_MB,
    CacheModel,
    SharedPressure,
    parse_working_sets,
    run_work,
)
from bench.admission.pages import PAGES


class FakePressure:
    """Other executing requests' working sets (``others``) plus the ones :func:`run_work` adds;
    ``after`` chunks it switches ``others`` to ``then`` (requests finishing mid-way)."""

    def __init__(self, others: float, then: float | None = None, after: int = 0):
        self.others, self.then, self.after = others, then, after
        self.own = 0.0
        self.reads = 0

    def add(self, mb: float) -> None:
        self.own += mb

    def value(self) -> float:
        self.reads += 1
        if self.then is not None and self.reads > self.after:
            self.others = self.then
        return self.others + self.own


def burnt() -> tuple[list[int], Callable[[int], object]]:
    calls: list[int] = []
    return calls, calls.append


def test_below_the_budget_a_page_costs_its_base_work() -> None:
    m = CacheModel(budget_mb=100, miss_penalty=4, working_set_mb={"search": 20, "login": 2})
    assert m.miss(0) == 0 and m.miss(100) == 0
    assert m.cost_factor(100) == 1.0
    calls, burn = burnt()
    p = FakePressure(others=60)
    assert run_work(1000, 20, m, p, 25, burn) == 1000  # 80 MB executing: all hits
    assert sum(calls) == 1000 and max(calls) <= 25
    assert p.own == 0  # its working set left the cache with it


def test_past_the_budget_the_missing_share_costs_the_penalty_in_real_work() -> None:
    m = CacheModel(budget_mb=100, miss_penalty=4, working_set_mb={"search": 20})
    assert m.miss(200) == pytest.approx(0.5)
    assert m.cost_factor(200) == pytest.approx(3.0)
    assert m.cost_factor(400) == pytest.approx(4.0)  # 75 % misses
    calls, burn = burnt()
    real = run_work(1000, 20, m, FakePressure(others=180), 25, burn)  # 200 MB with its own 20
    assert real == sum(calls)
    assert real == pytest.approx(3000, abs=2)


def test_the_cost_follows_the_pressure_while_the_page_executes() -> None:
    m = CacheModel(budget_mb=100, miss_penalty=4, working_set_mb={})
    calls, burn = burnt()
    # 200 MB for the first 20 chunks of 30 iterations (600 real = 200 base), then alone: 800 base at 1x
    real = run_work(1000, 0, m, FakePressure(others=200, then=0, after=20), 30, burn)
    assert real == pytest.approx(600 + 800, abs=2)


def test_a_failing_worker_still_takes_its_working_set_out() -> None:
    m = CacheModel()
    p = FakePressure(others=0)

    def boom(_: int) -> None:
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        run_work(100, 24, m, p, 10, boom)
    assert p.own == 0


def test_no_budget_means_no_contention() -> None:
    m = CacheModel(budget_mb=0)
    assert not m.enabled and m.cost_factor(1e9) == 1.0
    assert run_work(500, 24, m, FakePressure(others=1e6), 50, lambda _: None) == 500
    assert "no contention" in m.describe()


def test_the_session_mix_rises_to_a_peak_then_falls_with_concurrency() -> None:
    """The declared model on the paper's session: throughput vs executing requests on 2 cores
    rises to the cores, stays while the working sets fit, then falls; all 16 workers busy on
    the mix gives under a third of the peak."""
    m = CacheModel()
    share = {p.name: 0.0 for p in PAGES}
    for p in PAGES:  # executing mix: arrivals x time in execution (Little), the session's pages
        share[p.name] += p.paper_ms
    total = sum(share.values())
    curve = {n: m.throughput({k: n * v / total for k, v in share.items()}, cores=2) for n in (1, 2, 4, 8, 16)}
    peak = max(curve.values())
    assert curve[1] < curve[2] == peak == curve[4]
    assert curve[8] < 0.6 * peak and curve[16] < curve[8] < peak
    assert curve[16] < peak / 3


def test_declared_parameters_are_printed_and_passed_to_the_app() -> None:
    m = CacheModel()
    assert m.budget_mb == CACHE_BUDGET_MB and dict(m.working_set_mb) == WORKING_SET_MB
    text = m.describe()
    assert f"{CACHE_BUDGET_MB:g} MB" in text and "search 24 MB" in text and "5x" in text
    argv = m.argv()
    assert parse_working_sets(argv[argv.index("--working-sets") + 1]) == WORKING_SET_MB
    stack = ArmStack("none", 0.1, 4, 50.0, cache=CacheModel(budget_mb=48, miss_penalty=2))
    assert stack.app_argv(8000)[-6:] == ["--cache-mb", "48", "--miss-penalty", "2", "--working-sets",
                                         ",".join(f"{k}={v:g}" for k, v in WORKING_SET_MB.items())]
    stack.cleanup()


@pytest.mark.parametrize("text", ["search", "search=", "=3", "search=-1", "search=nan", "search=inf", "a=1,b"])
def test_bad_working_sets_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_working_sets(text)


def test_bad_model_flags_are_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        app_mod.main(["--port", "1", "--working-sets", "search=lots"])
    assert e.value.code == 2
    assert "working set" in capsys.readouterr().err


_INHERITED: list[SharedPressure] = []


def _inherit(pressure: SharedPressure) -> None:
    _INHERITED.append(pressure)


def _child_adds() -> float:
    _INHERITED[-1].add(24.0)
    return _INHERITED[-1].value()


def test_the_pressure_is_shared_by_forked_workers() -> None:
    pressure = SharedPressure()
    pressure.add(10.0)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"),
                               initializer=_inherit, initargs=(pressure,))
    try:
        assert pool.submit(_child_adds).result(timeout=30) == 34.0
    finally:
        pool.shutdown()
    assert pressure.value() == 34.0
    pressure.add(-100.0)
    assert pressure.value() == 0.0  # never negative


async def test_the_app_counts_the_extra_work_its_misses_cost() -> None:
    """The app's workers run the model: a lone search whose 24 MB working set overflows a 4 MB
    cache misses 5/6 of its work (factor 1 + 3 x 5/6 = 3.5), a login (1 MB) fits and costs its base."""
    model = CacheModel(budget_mb=4, miss_penalty=3, working_set_mb={"search": 24, "login": 1})
    pressure = SharedPressure()
    pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork"),
                               initializer=app_mod._init_worker, initargs=(model, pressure, 5))
    iters = {name: 200 for name in ("login", "browse", "search", "buy", "logout")}
    state = app_mod.AppState(iterations=iters, cost_ms=dict.fromkeys(iters, 2.0), pool=pool, workers=2,
                             iters_per_ms=100.0, model=model, pressure=pressure)
    client = TestClient(TestServer(app_mod.build(state)))
    await client.start_server()
    try:
        for path in ("/shop/search", "/shop/login"):
            assert (await client.get(path)).status == 200
        stats = await (await client.get("/stats")).json()
    finally:
        await client.close()
        pool.shutdown()
    assert stats["pages"]["search"]["extra_ms"] == pytest.approx(200 * 2.5 / 100.0, abs=0.02)
    assert stats["pages"]["login"]["extra_ms"] == 0
    assert stats["pressure_mb"] == 0 and stats["model"]["budget_mb"] == 4


def test_the_calibration_reads_each_concurrency_stage_in_its_own_window() -> None:
    from bench.admission.counting import parse_events
    from bench.admission.run import by_concurrency, curve_text

    t0 = 1000.0
    lines = [json.dumps({"k": "stage", "t": t0, "users": 2})]
    for stage, per_s in enumerate((70, 140, 35)):  # answered requests per second in each 5 s stage
        for k in range(5 * per_s):
            t = t0 + stage * 5 + k / per_s
            lines.append(json.dumps({"k": "req", "u": 1, "s": k, "n": 1 + k % 7, "t0": t - 0.01, "t1": t, "st": 200, "r": "ok"}))
    curve = by_concurrency(parse_events(lines), (2, 4, 8), 5.0, 1.0)
    assert [r["requests_per_s"] for r in curve] == [70.0, 140.0, 35.0]
    assert [r["sessions_per_s"] for r in curve] == [10.0, 20.0, 5.0]
    assert curve_text({"by_concurrency": curve}) == "2: 10, 4: 20, 8: 5"
