"""A whole small sweep on a real nginx, with injected failures, while a client counts failed requests.

Reuses the ``live`` nginx fixture of test_nginx_tuner_nginx.py (2 workers, keepalive_timeout 65).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.nginx_ctl import NginxControl
from controllers.nginx_tuner.sweep import LoadMeasurer, Measurement, Sweep, SweepSettings, write_results
from promreflex.proc import http_ok, wait_until
from tests.integration.test_nginx_tuner_nginx import NGINX, BackgroundGets, Live, live, port_conflict  # noqa: F401 - live: the fixture

pytestmark = pytest.mark.integration


async def test_small_sweep_with_injected_failures_never_fails_a_request(live: Live, tmp_path: Path) -> None:  # noqa: F811
    reg = CollectorRegistry()
    ctl = live.control()
    ctl.metrics = TunerMetrics([1, 2, 3, 65], registry=reg)
    original = live.conf.read_text()

    def apply(value: int):  # noqa: ANN202
        if value != 2:
            return ctl.apply(value)
        with port_conflict(live):  # injected: nginx -t passes, the reload fails
            return ctl.apply(value)

    # 2 s measured after the ramp: with 1 s a CI run on a busy machine once had a trial whose Locust
    # (its start-up counts in its run time) failed to load ("load_failed").
    real = LoadMeasurer(ctl, live.url, users=10, spawn_rate=20, duration_s=2.0, think_min=0.1, think_max=0.3, sample_interval=0.2)

    async def measure(value: float) -> Measurement:
        if value == 3:  # injected: errors rising during this trial (no need to load nginx for that)
            return Measurement(0.001, 0.002, 1e6, "pss", 100, 40)
        return await real(value)

    with BackgroundGets(live.url) as gets:
        settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
        result = await Sweep(settings, apply, measure, 65.0, metrics=ctl.metrics, progress=lambda _: None).run()
        gets.more()

    by_value = {r.value: r for r in result.records}
    assert set(by_value) == {1.0, 2.0, 3.0, 65.0}
    assert by_value[2.0].result == "apply_failed" and by_value[2.0].message.startswith("reload:")
    assert by_value[3.0].result == "errors" and "restored 65" in by_value[3.0].message
    assert by_value[1.0].result == by_value[65.0].result == "ok", (by_value[1.0].message, by_value[65.0].message)
    assert by_value[1.0].requests > 0 and by_value[1.0].failures == 0 and by_value[1.0].mean_s > 0 and by_value[1.0].p95_s > 0
    assert by_value[1.0].memory_bytes > 0 and by_value[1.0].memory_method == "pss"
    # One repeat: unbounded intervals, so the current value is kept, and the file is as it was.
    assert result.choice is not None and result.choice.kept_current and result.final_ok
    assert live.conf.read_text() == original and ctl.current_value() == ("65",)
    assert gets.counts["failed"] == 0 and gets.counts["ok"] > 20, gets.counts
    assert http_ok(live.url)
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "ok"}) == 2
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "apply_failed"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "errors"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 65
    paths = write_results(result, tmp_path)
    assert paths["csv"].read_text().count("\n") == 5


async def test_a_sweep_that_fails_any_way_puts_the_pre_sweep_file_back(live: Live) -> None:  # noqa: F811
    """Whatever ends a sweep early (here a measurement raising what no one caught: Prometheus
    unreachable, a disk error), the file goes back as it was before the first trial, not as
    the previous trial left it, and nginx serves it (issue: the trial value stayed live, and
    the retry took it for the original)."""
    ctl = live.control()
    original = live.conf.read_text()
    calls: list[float] = []

    async def measure(value: float) -> Measurement:
        calls.append(value)
        if len(calls) == 2:
            raise ConnectionRefusedError("Prometheus is not answering")
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
    with pytest.raises(ConnectionRefusedError):
        await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert len(calls) == 2
    assert live.conf.read_text() == original and not ctl.journal_path.exists()
    assert http_ok(live.url)


async def test_a_sweep_killed_mid_way_is_undone_before_the_next_reads_the_current_value(live: Live) -> None:  # noqa: F811
    """SIGKILL between two trials leaves a trial value live and the journal on disk: the next
    start (``recover``) puts the pre-sweep text back, `1m`-style spelling included, and makes
    it live; the current value read after that is the original, not the trial's."""
    ctl = live.control()
    live.conf.write_text(live.conf.read_text().replace("keepalive_timeout 65;", "keepalive_timeout 1m5s;"))
    assert ctl.apply(65).ok  # (reload with the respelled file: same value)
    live.conf.write_text(live.conf.read_text().replace("keepalive_timeout 65;", "keepalive_timeout 1m5s;"))
    original = live.conf.read_text()
    ctl.begin_sweep()
    assert ctl.apply(7).ok and ctl.current_value() == ("7",)  # a trial, then the controller dies
    again = NginxControl(live.conf, live.prefix, NGINX, reload_timeout=20.0, health_url=live.url)  # restarted
    said = again.recover()
    assert "put back" in said and said.endswith("and live") and ".at-recovery" in said, said
    assert live.conf.read_text() == original and again.current_value() == ("1m5s",)
    assert not again.journal_path.exists() and again.recover() == ""
    assert http_ok(live.url)


async def test_a_health_blip_after_a_trial_ends_on_the_pre_sweep_file(live: Live) -> None:  # noqa: F811
    """The health check fails for a while after the second trial: its rollback could only
    return to the FIRST trial's file (the per-edit backup); the sweep stops and puts back the
    file from before the sweep once nginx is healthy again."""
    healthy = {"on": True, "blip": False}
    ctl = live.control(health_check=lambda: healthy["on"])
    ctl.health_timeout = 0.5
    original = live.conf.read_text()
    applied: list[int] = []

    real_reload = ctl.reload

    def reload(timeout: float | None = None):  # noqa: ANN202
        out = real_reload(timeout)
        if healthy["blip"]:
            healthy["on"] = False  # down from this trial's reload through its rollback
        return out

    ctl.reload = reload  # type: ignore[method-assign]

    def apply(value: int):  # noqa: ANN202
        applied.append(value)
        healthy["blip"] = len(applied) == 2
        try:
            return ctl.apply(value)
        finally:
            healthy["on"], healthy["blip"] = True, False

    async def measure(value: float) -> Measurement:
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
    result = await Sweep(settings, apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert not result.final_ok and "did not return to health" in result.final, result.final
    assert "restored" in result.final and live.conf.read_text() == original
    assert ctl.current_value() == ("65",) and not ctl.journal_path.exists()


async def test_a_kept_value_is_not_a_good_end_when_nginx_stopped_during_the_sweep(live: Live) -> None:  # noqa: F811
    """The sweep keeps the current value (every trial measured alike) but nginx was stopped
    before its end: the pre-sweep file is back on disk, and the sweep must not report that it
    ended well (it said 'kept 65: restored: ...; nginx is not running' with final_ok True)."""
    ctl = live.control()
    original = live.conf.read_text()
    calls: list[float] = []

    async def measure(value: float) -> Measurement:
        calls.append(value)
        if len(calls) == 3:  # the last trial: nginx is stopped (an operator, a crash)
            live.child.stop()
            wait_until(lambda: not http_ok(live.url), timeout=20, what="nginx to stop")
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0), repeats=1, seed=3)
    result = await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert len(calls) == 3 and result.choice is not None and result.choice.kept_current
    assert not result.final_ok and result.final.endswith("nginx is not running"), result.final
    assert live.conf.read_text() == original and not ctl.journal_path.exists()
