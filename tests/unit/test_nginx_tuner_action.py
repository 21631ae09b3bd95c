"""The retune-nginx action's parameters, window and metrics; the passive measurer and the memory
collector on fakes (controllers.nginx_tuner.action / passive / memory)."""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from controllers.actions.base import ActionContext, Deferred, registry
from controllers.models import Alert
from controllers.nginx_tuner.action import RetuneNginx, RetuneParams, in_window
from controllers.nginx_tuner.memory import NginxMemoryCollector
from controllers.nginx_tuner.nginx_ctl import ApplyResult
from controllers.nginx_tuner.passive import PassiveMeasurer
from controllers.nginx_tuner.sweep import Sweep, SweepSettings
from controllers.nginx_tuner.procfs import children, cmdline
from controllers.nginx_tuner.trial import LoadError
from promreflex.proc import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nginx"
UTC = dt.UTC


def at(hh: int, mm: int) -> dt.datetime:
    return dt.datetime(2026, 1, 2, hh, mm, tzinfo=UTC)


def test_action_is_discovered() -> None:
    assert registry()["retune-nginx"] is RetuneNginx
    assert RetuneNginx.concurrency == 1


@pytest.mark.parametrize(
    ("window", "now", "inside"),
    [
        (None, at(12, 0), True),
        ("02:00-05:00", at(2, 0), True),
        ("02:00-05:00", at(4, 59), True),
        ("02:00-05:00", at(5, 0), False),
        ("02:00-05:00", at(1, 59), False),
        ("22:00-04:00", at(23, 30), True),
        ("22:00-04:00", at(3, 0), True),
        ("22:00-04:00", at(12, 0), False),
    ],
)
def test_window(window: str | None, now: dt.datetime, inside: bool) -> None:
    assert in_window(window, now) is inside


def test_params_defaults_and_rejections() -> None:
    p = RetuneParams.model_validate({"nginx_config": "/etc/nginx/nginx.conf", "dwell": "2m"})
    assert (p.mode, p.dwell, p.candidates, p.site) == ("passive", 120.0, [15, 30, 45, 60, 75], "shop")
    bad = [
        {"nginx_config": "/x", "candidates": [5, 5]},
        {"nginx_config": "/x", "candidates": [0, 5]},
        {"nginx_config": "/x", "candidates": [5]},
        {"nginx_config": "/x", "window": "25:00-01:00"},
        {"nginx_config": "/x", "window": "00:00-00:00"},  # empty: never
        {"nginx_config": "/x", "mode": "active"},  # needs load_url
        {"nginx_config": "/x", "site": 'shop"} or vector(1) #'},
        {"nginx_config": "/x", "surprise": 1},
        {"nginx_config": "/x", "mode": "active", "load_url": "127.0.0.1:8080/"},  # no scheme: every trial would fail
        {"nginx_config": "/x", "health_url": "localhost/health"},
    ]
    for data in bad:
        with pytest.raises(ValidationError):
            RetuneParams.model_validate(data)


def ctx(params: RetuneParams, labels: dict[str, str] | None = None, services: dict | None = None) -> ActionContext:
    alert = Alert.model_validate({
        "status": "firing", "labels": {"alertname": "NginxResponseTimeHigh", **(labels or {})}, "annotations": {},
        "startsAt": "2026-01-02T03:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "abc",
    })
    return ActionContext("retune", alert, params, services or {})


async def test_target_comes_from_params_not_labels_and_metrics_exist_at_start() -> None:
    reg = CollectorRegistry()
    action = RetuneNginx()
    await action.start({"registry": reg})
    p = RetuneParams.model_validate({"nginx_config": "/etc/nginx/nginx.conf"})
    assert action.target(ctx(p, {"instance": "../../etc/passwd"})) == "nginx:/etc/nginx/nginx.conf"
    assert reg.get_sample_value("promreflex_nginx_tuner_state", {"state": "idle"}) == 1
    for r in ("changed", "kept", "outside_window", "failed"):
        assert reg.get_sample_value("promreflex_nginx_tuner_retunes_total", {"result": r}) == 0


async def test_outside_the_window_nothing_is_touched(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    action = RetuneNginx()
    await action.start({"registry": reg})
    action.clock = lambda: at(12, 0)
    conf = tmp_path / "nginx.conf"
    conf.write_text((FIXTURES / "simple" / "nginx.conf").read_text())
    before = conf.read_bytes()
    p = RetuneParams.model_validate({"nginx_config": str(conf), "window": "02:00-05:00"})
    with pytest.raises(Deferred, match="outside the allowed window") as deferred:
        await action.fire(ctx(p))
    assert deferred.value.seconds == 14 * 3600  # 12:00 -> 02:00 the next day
    assert conf.read_bytes() == before
    assert reg.get_sample_value("promreflex_nginx_tuner_retunes_total", {"result": "outside_window"}) == 1


class FakeProm:
    """Answers the passive measurer's queries from a table keyed by query kind."""

    def __init__(self, answers: dict[str, float | None]):
        self.answers = answers
        self.seen: list[str] = []

    async def query(self, expr: str, time: float | None = None) -> list[dict]:
        self.seen.append(expr)
        kind = ("errors" if "5xx" in expr else "p95" if "histogram_quantile" in expr else "memory" if "avg_over_time" in expr
                else "mean" if "/" in expr else "requests")
        v = self.answers.get(kind)
        return [] if v is None else [{"metric": {}, "value": [0, str(v)]}]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.t += s


async def test_passive_measurement_reads_the_dwell_window() -> None:
    clock = Clock()
    prom = FakeProm({"requests": 600, "errors": 0, "mean": 0.012, "p95": 0.04, "memory": 5_000_000})
    m = PassiveMeasurer(prom, site="shop", dwell_s=60, settle_s=5, check_interval=10, sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]
    res = await m(30.0)
    assert (res.mean_s, res.p95_s, res.memory_bytes, res.requests, res.failures, res.aborted) == (0.012, 0.04, 5e6, 600, 0, "")
    assert clock.t == 1000 + 5 + 60
    assert any('site="shop"' in q and "[60s]" in q for q in prom.seen)
    assert any(q == "avg_over_time((sum(promreflex_nginx_memory_bytes))[60s:1s])" for q in prom.seen)


async def test_passive_aborts_when_errors_rise_and_refuses_thin_traffic() -> None:
    clock = Clock()
    prom = FakeProm({"requests": 100, "errors": 30, "mean": 0.5, "p95": 1.0, "memory": 5e6})
    m = PassiveMeasurer(prom, dwell_s=300, settle_s=0, check_interval=5, sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]
    res = await m(30.0)
    assert "5xx ratio 30.00%" in res.aborted and clock.t - 1000 == pytest.approx(5)  # stopped at the first check
    c2 = Clock()
    thin = PassiveMeasurer(FakeProm({"requests": 3, "errors": 0, "mean": 0.01, "memory": 1}), dwell_s=10, settle_s=0,
                           check_interval=5, sleep=c2.sleep, clock=c2)  # type: ignore[arg-type]
    with pytest.raises(LoadError, match="only 3 requests"):
        await thin(30.0)
    c3 = Clock()
    nomem = PassiveMeasurer(FakeProm({"requests": 100, "errors": 0, "mean": 0.01}), dwell_s=10, settle_s=0, check_interval=5,
                            sleep=c3.sleep, clock=c3)  # type: ignore[arg-type]
    with pytest.raises(LoadError, match="no memory series"):
        await nomem(30.0)


async def test_passive_turns_an_unreachable_prometheus_into_a_failed_trial() -> None:
    """Prometheus restarting or a proxy's HTML error page: the trial fails (LoadError, the sweep
    goes on and restores), not an exception that ends the sweep on a trial value."""
    import aiohttp

    class Down(FakeProm):
        async def query(self, expr: str, time: float | None = None) -> list[dict]:
            raise aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:9090")

    class Garbled(FakeProm):
        async def query(self, expr: str, time: float | None = None) -> list[dict]:
            return [{"metric": {}, "value": [0, "<html>"]}]

    for prom in (Down({}), Garbled({})):
        clock = Clock()
        m = PassiveMeasurer(prom, dwell_s=10, settle_s=0, check_interval=5, sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]
        with pytest.raises(LoadError, match="Prometheus query failed"):
            await m(30.0)


def test_passive_site_is_quoted_as_data() -> None:
    q = PassiveMeasurer(None, site='a"b').queries(10)  # type: ignore[arg-type]
    assert 'site="a\\"b"' in q["mean"]


def test_memory_collector_on_a_master_and_missing_pid(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    pid_file = tmp_path / "nginx.pid"
    NginxMemoryCollector(pid_file, registry=reg)
    assert reg.get_sample_value("promreflex_nginx_memory_up") == 0
    assert reg.get_sample_value("promreflex_nginx_memory_bytes", {"method": "pss"}) is None
    # A process titled the way nginx titles its master, with one "worker".
    master = subprocess.Popen(["bash", "-c", 'sleep 60 & exec -a "nginx: master process" sleep 60'],
                              start_new_session=True)  # a group: its worker goes with it
    try:
        wait_until(lambda: len(children(master.pid)) == 1 and cmdline(master.pid).startswith("nginx: master process"), timeout=10,
                   what="the fake master and its worker")
        pid_file.write_text(f"{master.pid}\n")

        def scrape() -> dict[str, float]:  # one collection: every figure from the same reading
            return {s.name: s.value for m in reg.collect() for s in m.samples}

        # Polled: the fake master has just exec'd (a CI run once read it measured in one scrape
        # and not in the one before).
        wait_until(lambda: scrape().get("promreflex_nginx_memory_up") == 1, timeout=10, what="the master measured")
        got = scrape()
        value = got.get("promreflex_nginx_memory_bytes")
        assert got["promreflex_nginx_memory_up"] == 1
        assert value is not None and value > 0 and not math.isnan(value)
        assert got["promreflex_nginx_processes"] == 2
    finally:
        os.killpg(master.pid, signal.SIGKILL)
        master.wait()


def test_memory_collector_on_this_process_is_not_an_nginx(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    pid_file = tmp_path / "nginx.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    NginxMemoryCollector(pid_file, registry=reg)
    assert reg.get_sample_value("promreflex_nginx_memory_up") == 0


async def test_the_value_in_force_is_published_at_start(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text((FIXTURES / "simple" / "nginx.conf").read_text())
    reg = CollectorRegistry()
    action = RetuneNginx()
    action.route_params = [RetuneParams.model_validate({"nginx_config": str(conf)}),
                           RetuneParams.model_validate({"nginx_config": str(tmp_path / "missing.conf")})]
    await action.start({"registry": reg})  # the unreadable one is logged, not fatal
    assert reg.get_sample_value("promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 65


async def test_passive_sweep_refuses_before_any_change_when_it_could_measure_nothing() -> None:
    """A stranger's review: with Prometheus unreachable, or a wrong --passive.site, every
    candidate was applied to production and held for a whole dwell (five minutes by default)
    before the sweep found it could measure nothing. Now a preflight reads the series first."""
    import aiohttp

    class Down(FakeProm):
        async def query(self, expr: str, time: float | None = None) -> list[dict]:
            raise aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:9090")

    cases = [(Down({}), "Prometheus query failed: ClientConnectionError: Cannot connect"),
             (FakeProm({"memory": 5e6}), "no requests of site 'shop'.*check --passive.site"),
             (FakeProm({"requests": 600}), "no memory series")]
    for prom, said in cases:
        applied: list[int] = []

        def apply(value: int) -> ApplyResult:
            applied.append(value)
            return ApplyResult(True, str(value), "done", "")

        clock = Clock()
        m = PassiveMeasurer(prom, site="shop", dwell_s=300, settle_s=15, sleep=clock.sleep, clock=clock)  # type: ignore[arg-type]
        settings = SweepSettings(candidates=(5.0, 10.0), repeats=1)
        with pytest.raises(LoadError, match=said):
            await Sweep(settings, apply, m, 65.0, progress=lambda _: None).run()
        assert applied == [] and clock.t == 1000.0
