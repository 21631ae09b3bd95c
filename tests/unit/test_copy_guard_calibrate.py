"""Calibration statistics (controllers/copy_guard/calibrate.py) and the benchmark's arithmetic
(bench/copy_guard/analysis.py), on fixtures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from bench.copy_guard import analysis
from controllers.copy_guard import calibrate as cal
from controllers.copy_guard.threshold import read_thresholds


# ------------------------------------------------------------------ statistics
def test_quantile_interpolates_like_numpy_type7():
    xs = [10, 20, 30, 40, 50]
    assert cal.quantile(xs, 0.0) == 10
    assert cal.quantile(xs, 1.0) == 50
    assert cal.quantile(xs, 0.5) == 30
    assert cal.quantile(xs, 0.05) == pytest.approx(12.0)  # 10 + 0.2 * 10
    assert cal.quantile([7], 0.05) == 7
    with pytest.raises(ValueError):
        cal.quantile([], 0.5)
    with pytest.raises(ValueError):
        cal.quantile([1, 2], 1.5)


def test_distribution_of_values():
    d = cal.Distribution.of([22.0, 20.2, 21.0, 22.4, 21.5])
    assert (d.n, d.min, d.max, d.median) == (5, 20.2, 22.4, 21.5)
    assert d.p5 == pytest.approx(20.2 + 0.2 * 0.8)
    assert d.mean == pytest.approx(21.42)


def test_per_second_series_drops_warmup_and_the_partial_last_second_and_fills_stalls():
    # completions by unix second; 103 and 104 missing = the site stalled (0 served)
    per = {100: 5, 101: 20, 102: 21, 105: 19, 106: 3}
    assert cal.per_second_series(per, warmup_s=0) == [5, 20, 21, 0, 0, 19]
    assert cal.per_second_series(per, warmup_s=1) == [20, 21, 0, 0, 19]
    assert cal.per_second_series(per, warmup_s=1.5) == [21, 0, 0, 19]
    assert cal.per_second_series({}, warmup_s=1) == []


def test_derive_threshold_min_is_the_lowest_second_over_all_runs():
    runs = [[22.0, 21.0, 20.2], [22.4, 20.9, 21.3], [20.5, 22.0]]
    assert cal.derive_threshold(runs, "min") == 20.2  # the paper's 20.2 from runs 1 and 3
    q = cal.derive_threshold(runs, "quantile", 0.5)
    assert q == pytest.approx(cal.quantile([v for r in runs for v in r], 0.5))
    assert cal.derive_threshold([[1.0, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50]],
                                "quantile", 0.05) == pytest.approx(50.0)  # one outlier second does not drag it
    with pytest.raises(cal.CalibrationError):
        cal.derive_threshold([[], []])
    with pytest.raises(ValueError):
        cal.derive_threshold([[1.0]], "mean")


def test_saturation_warning_only_when_the_site_kept_up():
    assert cal.saturation_warning(100, cal.Distribution.of([99, 100, 100])) is not None
    assert cal.saturation_warning(100, cal.Distribution.of([70, 72, 74])) is None


def test_load_run_folds_bins_into_seconds():
    run = cal.LoadRun(ok=6, failed=1, bins={1000: [1, 0], 1009: [2, 1], 1010: [3, 0]}, bin_s=0.1, started=0, ended=1)
    assert run.served() == {100: 3, 101: 3}
    assert run.per_second(1) == {100: 1, 101: 0}


def test_locust_argv_validates():
    argv = cal.locust_argv("http://127.0.0.1:8080/", 100, 50, 12.2, Path("/tmp/t.json"))
    assert argv[:3] == [sys.executable, "-m", "locust"]
    assert argv[argv.index("-t") + 1] == "13s"
    assert argv[argv.index("--shop-rate") + 1] == "100"
    assert argv[argv.index("--host") + 1] == "http://127.0.0.1:8080"
    for bad in (("ftp://x/", 100, 1, 1), ("http://127.0.0.1:1/", 0, 1, 1), ("http://127.0.0.1:1/", 10, 0, 1)):
        with pytest.raises(ValueError):
            cal.locust_argv(*bad, Path("/tmp/t.json"))


def test_calibration_table_and_json():
    c = cal.Calibration("shop", "min", 0.05, "locust", 100, 100, 60, 5, runs=[[20.0, 21.0, 22.0], [20.5, 21.5]],
                        totals=[{"ok": 63, "failed": 0}, {"ok": 42, "failed": 1}], threshold=20.0)
    table = c.table().splitlines()
    assert table[2].split() == ["1", "3", "20.0", "20.1", "21.0", "22.0", "63", "0"]
    assert table[-1].split()[:3] == ["all", "5", "20.0"]
    assert table[-1].split()[-2:] == ["105", "1"]
    data = json.loads(json.dumps(c.to_json()))
    assert data["overall"]["min"] == 20.0 and len(data["per_run"]) == 2


def test_publish_writes_the_threshold_file_the_rules_read(tmp_path):
    c = cal.Calibration("shop", "min", 0.05, "locust", 100, 100, 60, 5, runs=[[20.2]], totals=[{"ok": 1, "failed": 0}],
                        threshold=20.2)
    path = cal.publish(c, tmp_path)
    assert path.name == "promreflex_copy_guard_threshold.prom"
    assert 'promreflex_copy_guard_rps_threshold{site="shop"} 20.2' in path.read_text()
    t = read_thresholds(tmp_path)["shop"]
    assert t.rps == 20.2 and t.demand_floor_rps == pytest.approx(10.1)


def test_cli_registers_and_rejects_bad_numbers(capsys):
    parser = argparse.ArgumentParser()
    cal.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--runs", "0", "--duration", "10s", "--textfile.dir", "/nonexistent"])
    assert args.duration == 10.0
    assert args.func(args) == 2
    assert "--runs >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--duration", "soon"])
    assert "lowest" in cal.__doc__ and "--method quantile" in cal.__doc__  # the help explains the derivation


# ------------------------------------------------------------------ the benchmark's arithmetic
def test_saved_share_is_the_papers_formula():
    # the paper: 5065 without the copy, 4874 with it, 4993 with the guard -> 62.3 %
    assert analysis.saved_share(5065, 4874, 4993) == pytest.approx(0.623, abs=0.0005)
    assert analysis.saved_share(100, 50, 100) == 1.0
    assert analysis.saved_share(100, 50, 50) == 0.0
    assert analysis.saved_share(100, 50, 40) == pytest.approx(-0.2)
    assert analysis.saved_share(100, 100, 90) is None  # the copy cost nothing: nothing to save
    assert analysis.slowdown(129, 92) == pytest.approx(0.402, abs=0.001)
    assert analysis.slowdown(None, 92) is None


def test_rolling_rate_counts_the_last_second_at_each_bin_boundary():
    bins = {b: [1, 0] for b in range(100, 130)}  # 10 served per second from t=10.0 to 13.0
    rate = analysis.rolling_rate(bins, 0.1, 10.0, 13.0)
    assert rate[0] == (pytest.approx(11.0), pytest.approx(10.0))
    assert all(r == pytest.approx(10.0) for _, r in rate)
    assert len(rate) == 21  # 11.0, 11.1, ..., 13.0
    half = analysis.rolling_rate({b: [1, 0] for b in range(100, 105)}, 0.1, 10.0, 11.5)
    assert half[-1][1] == pytest.approx(0.0) and half[0][1] == pytest.approx(5.0)


def test_intervals_merge_samples():
    s = [(0.0, False), (0.1, True), (0.2, True), (0.3, False), (0.4, True)]
    assert analysis.intervals(s) == [(0.1, 0.3), (0.4, 0.4)]
    assert analysis.intervals([]) == []


def test_seconds_below_and_reaction_times():
    step = 0.1
    # rate 70 until t=5.0, 30 from 5.1 to 6.5 (pause at 6.5), 70 again after
    rate = [(round(t * step, 1), 70.0 if t <= 50 or t > 65 else 30.0) for t in range(10, 100)]
    assert analysis.seconds_below(rate, 64.0, step) == pytest.approx(1.5)
    assert analysis.seconds_below(rate, 64.0, step, start=6.0) == pytest.approx(0.5)
    # below since 5.0 (the boundary before the first below sample at 5.1); the pause at 6.5
    assert analysis.reaction_times(rate, 64.0, [6.5], step) == [pytest.approx(1.5)]
    # a pause while the rate is still above (predictive) reacts in 0
    assert analysis.reaction_times(rate, 64.0, [3.0], step) == [0.0]
    # before the first sample
    assert analysis.reaction_times(rate, 64.0, [0.5], step) == [0.0]


def test_run_order_alternates_rounds_and_ends_quiet():
    from bench.copy_guard.run import LOADED, run_order

    names = [n for _, n in run_order(2)]
    assert names[:5] == LOADED and names[5:10] == list(reversed(LOADED))
    assert names[-1] == "quiet+copy+guard" and len(names) == 11
    assert [n for _, n in run_order(1, reverse_first=True)][:5] == list(reversed(LOADED))
