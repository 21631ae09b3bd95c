"""The tuner's metrics holder (controllers.nginx_tuner.metrics)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.metrics import STATES, TRIAL_RESULTS, TunerMetrics, value_label

GRID = list(range(5, 105, 5))


def test_counters_and_states_exist_from_the_start() -> None:
    reg = CollectorRegistry()
    TunerMetrics(GRID, registry=reg)
    for result in TRIAL_RESULTS:
        assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": result}) == 0
    assert {s: reg.get_sample_value("promreflex_nginx_tuner_state", {"state": s}) for s in STATES} == {
        "idle": 1, "sweeping": 0, "applying": 0, "rolled_back": 0,
    }


def test_record_trial_and_state() -> None:
    reg = CollectorRegistry()
    m = TunerMetrics(GRID, registry=reg)
    m.set_state("sweeping")
    m.record_trial(75.0, "ok", mean_s=0.0021, p95_s=0.007, memory_bytes=5_500_000)
    m.record_trial("75", "load_failed")
    m.set_applied(75)
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "ok"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "load_failed"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_trial_response_time_seconds", {"value": "75", "stat": "mean"}) == 0.0021
    assert reg.get_sample_value("promreflex_nginx_tuner_trial_response_time_seconds", {"value": "75", "stat": "p95"}) == 0.007
    assert reg.get_sample_value("promreflex_nginx_tuner_trial_memory_bytes", {"value": "75"}) == 5_500_000
    assert reg.get_sample_value("promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 75
    assert reg.get_sample_value("promreflex_nginx_tuner_state", {"state": "sweeping"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_state", {"state": "idle"}) == 0


def test_labels_stay_bounded() -> None:
    m = TunerMetrics(GRID, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="grid"):
        m.record_trial(7, "ok", mean_s=1.0)
    with pytest.raises(ValueError):
        m.record_trial(5, "exploded")
    with pytest.raises(ValueError):
        m.set_state("confused")
    assert value_label(5.0) == value_label("5") == "5" and value_label(2.5) == "2.5"
