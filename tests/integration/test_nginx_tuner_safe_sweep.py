"""A whole small sweep on a real nginx, with injected failures, while a client counts failed requests.

Reuses the ``live`` nginx fixture of test_nginx_tuner_nginx.py (2 workers, keepalive_timeout 65).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.sweep import LoadMeasurer, Measurement, Sweep, SweepSettings, write_results
from promreflex.proc import http_ok
from tests.integration.test_nginx_tuner_nginx import BackgroundGets, Live, live, port_conflict  # noqa: F401 - live: the fixture

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

    real = LoadMeasurer(ctl, live.url, users=10, spawn_rate=20, duration_s=1.0, think_min=0.1, think_max=0.3, sample_interval=0.2)

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
    assert by_value[1.0].result == by_value[65.0].result == "ok"
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
