"""Calibration statistics (controllers/copy_guard/calibrate.py) and the benchmark's arithmetic
(bench/copy_guard/analysis.py), on fixtures."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
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
    assert argv[argv.index("--parent-pid") + 1] == str(os.getpid())  # the child quits if we vanish
    closed = cal.locust_argv("http://127.0.0.1:8080/shop/", 0, 4, 5, Path("/tmp/t.json"), profile_file=Path("/tmp/p.json"))
    assert closed[closed.index("--shop-rate") + 1] == "0" and closed[closed.index("--profile-file") + 1] == "/tmp/p.json"
    for bad in (("ftp://x/", 100, 1, 1), ("http://127.0.0.1:1/", -1, 1, 1), ("http://127.0.0.1:1/", 10, 0, 1)):
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
    path = cal.publish(c, tmp_path)  # no floor decided: the threshold file's default (the threshold)
    assert path.name == "promreflex_copy_guard_threshold.prom"
    assert 'promreflex_copy_guard_rps_threshold{site="shop"} 20.2' in path.read_text()
    assert "promreflex_copy_guard_response_time_seconds{" not in path.read_text()  # not measured: left out
    t = read_thresholds(tmp_path)["shop"]
    assert t.rps == 20.2 and t.demand_floor_rps == pytest.approx(20.2) and t.response_s is None


def test_healthy_response_time_is_the_median_of_the_runs_95th_percentiles(tmp_path):
    c = cal.Calibration("shop", "robust", 0.05, "locust", 0.0, 4, 30, 3, runs=[[40.0], [40.0], [38.0]],
                        latency_p95_ms=[120.0, 100.0, 0.0])
    # 0 = unknown (no latency recorded), left out; the median of the rest
    assert cal.healthy_response_s(c) == pytest.approx(0.110)
    assert cal.healthy_response_s(cal.Calibration("shop", "robust", 0.05, "locust", 0.0, 4, 30, 3)) is None
    c.threshold, c.response_s = 38.0, cal.healthy_response_s(c)
    cal.publish(c, tmp_path)
    assert read_thresholds(tmp_path)["shop"].response_s == pytest.approx(0.11)


def test_robust_threshold_is_the_median_of_the_runs_low_quantiles_and_ignores_a_bad_run():
    good = [[45.0 + (i % 5) for i in range(40)], [44.0 + (i % 6) for i in range(40)]]
    shared_host = [[4.0] + [46.0] * 39]  # the "4.0 on a shared host": one slow second
    stalled = [[0.0] * 5 + [45.0] * 35]
    runs = good + shared_host
    assert cal.derive_threshold(runs, "min") == 4.0  # the paper's rule is dragged down
    robust = cal.derive_threshold(runs, "robust")
    assert robust == pytest.approx(cal.quantile([cal.quantile(r, 0.05) for r in runs], 0.5))
    assert 44.0 <= robust <= 46.0
    assert 44.0 <= cal.derive_threshold(good + stalled, "robust") <= 46.0
    spread = cal.spread_of(runs, "robust")
    assert spread.over == "runs" and spread.low <= robust <= spread.high and spread.mad >= 0
    assert cal.spread_of(runs, "min").over == "seconds"


def test_floor_has_a_lower_bound_and_low_thresholds_are_refused():
    assert cal.floor_for(40.0) == 40.0  # the threshold itself: overloaded only while visitors ask for that much
    assert cal.floor_for(40.0, ratio=0.5) == 20.0
    assert cal.floor_for(4.0, ratio=0.5) == cal.MIN_FLOOR_RPS  # not half the threshold without a lower bound
    assert cal.floor_for(1.8) == cal.MIN_FLOOR_RPS
    with pytest.raises(ValueError, match="below the lowest sane floor"):
        cal.floor_for(40.0, explicit=0.5)
    assert cal.refusal(0.0, 2.0) and "served nothing" in cal.refusal(0.0, 2.0)
    assert "below twice" in cal.refusal(1.8, cal.floor_for(1.8))  # the idle-shop case
    assert cal.refusal(3.9, 2.0) is not None
    assert cal.refusal(45.0, 22.5) is None
    assert "minute before the load" in cal.refusal(45.0, 3.0, idle_demand=3.5)
    assert "raise --min-floor" in cal.refusal(45.0, 3.0, idle_demand=3.5)
    # a floor above the idle demand would need a threshold of twice it: not advice that can work
    assert "quieter" in cal.refusal(45.0, 22.5, idle_demand=30.0)
    assert "min-floor" not in cal.refusal(45.0, 22.5, idle_demand=30.0)
    assert "own stub_status" in cal.refusal(45.0, 2.0, own_rps=2.0)
    assert cal.refusal(45.0, 22.5, idle_demand=0.2, own_rps=2.0) is None


def test_runs_with_timeouts_stalls_or_nothing_served_are_discarded_with_a_reason():
    ok = cal.LoadRun(ok=900, failed=0, bins={}, bin_s=0.1, started=0, ended=1)
    assert cal.check_run(ok, [30.0, 31.0], 0.01) is None
    timeouts = cal.LoadRun(ok=500, failed=60, bins={}, bin_s=0.1, started=0, ended=1,
                           errors={"ConnectionTimeout: timed out": 60})
    why = cal.check_run(timeouts, [20.0, 21.0], 0.01)
    assert why and "60 of 560 requests failed" in why and "ConnectionTimeout" in why
    assert "stalled" in cal.check_run(ok, [30.0, 0.0, 31.0], 0.01)
    assert "served nothing" in cal.check_run(cal.LoadRun(0, 5, {}, 0.1, 0, 1), [], 0.01)


def test_calibrate_discards_bad_runs_and_refuses_when_too_few_remain(monkeypatch):
    def run(failed: int, served: list[int]) -> cal.LoadRun:
        bins = {int(s / 0.1): [n, 0] for s, n in zip(range(1000, 1000 + len(served)), served)}
        return cal.LoadRun(ok=sum(served), failed=failed, bins=bins, bin_s=0.1, started=0, ended=1)

    loads = iter([run(0, [40, 41, 42, 40, 41, 40]), run(300, [10, 10, 10, 10, 10, 10]), run(0, [42, 40, 41, 43, 40, 1])])
    monkeypatch.setattr(cal, "run_shop_load", lambda *a, **k: next(loads))
    monkeypatch.setattr(cal, "check_reachable", lambda *a, **k: None)  # (a real check: the test below)
    lines: list[str] = []
    c = cal.calibrate("http://127.0.0.1:1/", users=4, runs=3, duration_s=6, warmup_s=0, progress=lines.append)
    assert len(c.runs) == 2 and len(c.discarded) == 1 and "run 2" in c.discarded[0]
    assert any("DISCARDED" in ln for ln in lines)
    assert c.threshold is not None and c.threshold > 30 and c.spread is not None
    loads = iter([run(300, [10] * 6), run(0, [0, 0, 0, 0, 0, 0]), run(0, [40] * 6)])
    with pytest.raises(cal.CalibrationError, match="only 1 of 3 runs"):
        cal.calibrate("http://127.0.0.1:1/", users=4, runs=3, duration_s=6, warmup_s=0, progress=lines.append)


def test_ramp_starts_light_and_stops_at_the_knee_or_at_failures(monkeypatch):
    def fake(served_per_users: dict[int, int], failing_from: int = 99):
        def run(target, rate, users, duration_s, **kw):
            n = served_per_users[users]
            bins = {int(s / 0.1): [n, 0] for s in range(1000, 1010)}
            return cal.LoadRun(ok=10 * n, failed=5 if users >= failing_from else 0, bins=bins, bin_s=0.1, started=0,
                               ended=1, latency_ms={"p95": 50.0})
        return run

    monkeypatch.setattr(cal, "run_shop_load", fake({1: 10, 2: 19, 4: 30, 8: 32, 16: 33}))
    users, steps = cal.ramp_users("http://x:1/", None, max_users=32, step_s=10, progress=lambda s: None)
    assert users == 8 and [s["users"] for s in steps] == [1, 2, 4, 8]  # 8 added < 10% over 4: saturated
    monkeypatch.setattr(cal, "run_shop_load", fake({1: 10, 2: 19, 4: 37, 8: 74, 16: 148, 32: 44}))
    users, steps = cal.ramp_users("http://x:1/", None, max_users=32, step_s=10, progress=lambda s: None)
    assert users == 16 and len(steps) == 6  # 32 served less than 16 (a collapse past the knee): 16
    monkeypatch.setattr(cal, "run_shop_load", fake({1: 10, 2: 19, 4: 30, 8: 50}, failing_from=4))
    users, _ = cal.ramp_users("http://x:1/", None, max_users=32, step_s=10, progress=lambda s: None)
    assert users == 2  # failures at 4: the step before
    monkeypatch.setattr(cal, "run_shop_load", fake({1: 10}, failing_from=1))
    with pytest.raises(cal.CalibrationError, match="failed already under 1 user"):
        cal.ramp_users("http://x:1/", None, progress=lambda s: None)


def test_a_step_that_would_end_the_ramp_is_measured_again(monkeypatch):
    """On a shared host one 10 s step can be slowed by other work: 2 users served what 1 did
    and the ramp stopped there, at half the shop's capacity (a stranger's review: 54 req/s at
    the knee, its runs then served 83). Such a step is measured once more; the better counts."""
    served = iter([50, 54, 95, 180, 190, 188])  # 1, 2 (disturbed), 2 again, 4, 8, 8 again

    def run(target, rate, users, duration_s, **kw):
        n = next(served)
        bins = {int(s / 0.1): [n, 0] for s in range(1000, 1010)}
        return cal.LoadRun(ok=10 * n, failed=0, bins=bins, bin_s=0.1, started=0, ended=1, latency_ms={"p95": 50.0})

    monkeypatch.setattr(cal, "run_shop_load", run)
    lines: list[str] = []
    users, steps = cal.ramp_users("http://x:1/", None, max_users=32, step_s=10, progress=lines.append)
    assert users == 8 and [s["served_median"] for s in steps] == [50, 95, 180, 190]
    assert sum("(measured again)" in ln for ln in lines) == 2


def test_a_ramp_that_ends_at_max_users_still_growing_says_so(monkeypatch):
    def run(target, rate, users, duration_s, **kw):
        bins = {int(s / 0.1): [10 * users, 0] for s in range(1000, 1010)}
        return cal.LoadRun(ok=100 * users, failed=0, bins=bins, bin_s=0.1, started=0, ended=1, latency_ms={"p95": 5.0})

    monkeypatch.setattr(cal, "run_shop_load", run)
    lines: list[str] = []
    users, _ = cal.ramp_users("http://x:1/", None, max_users=16, step_s=10, progress=lines.append)
    assert users == 16
    assert any("did not saturate" in ln and "--max-users 16" in ln and "+100%" in ln for ln in lines), lines


def test_requests_profiles_and_replay():
    assert cal.parse_request("GET /product/{id} 9") == cal.Request("GET", "/product/{id}", 9.0)
    assert cal.parse_request("post /checkout 1 cart=1&qty=1") == cal.Request("POST", "/checkout", 1.0, "cart=1&qty=1")
    assert cal.parse_request("/about") == cal.Request("GET", "/about")
    for bad in ("FETCH /x", "GET nopath", "GET /x many", "GET /x 0", ""):
        with pytest.raises(ValueError):
            cal.parse_request(bad)
    log = [
        '1.2.3.4 - - [23/Nov/2026:10:00:00 +0000] "GET /product/7 HTTP/1.1" 200 5 "-" "Mozilla/5.0" rt=0.1 urt="0.1"',
        '1.2.3.4 - - [23/Nov/2026:10:00:00 +0000] "GET /product/7 HTTP/1.1" 200 5 "-" "Mozilla/5.0"',
        '1.2.3.4 - - [23/Nov/2026:10:00:00 +0000] "GET /?s=shoe HTTP/1.1" 302 5 "-" "Mozilla/5.0"',
        '127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET /stub_status HTTP/1.1" 200 97 "-" "NGINX-Prometheus-Exporter/v0.11.0"',
        '127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET /product/1 HTTP/1.1" 200 5 "-" "promreflex-calibrate"',
        '1.2.3.4 - - [23/Nov/2026:10:00:00 +0000] "POST /checkout HTTP/1.1" 200 5 "-" "Mozilla/5.0"',
        '1.2.3.4 - - [23/Nov/2026:10:00:00 +0000] "GET /gone HTTP/1.1" 404 5 "-" "Mozilla/5.0"',
        "garbage",
    ]
    reqs, skipped = cal.replay_profile(log)
    assert reqs == [cal.Request("GET", "/product/7", 2.0), cal.Request("GET", "/?s=shoe", 1.0)]
    assert skipped == {"our own traffic": 2, "POST (no body in the log)": 1, "status 4xx": 1, "not a request line": 1}
    doc = cal.profile_json(reqs, "/store/", {"post": [1, 2]})
    assert doc["base_path"] == "/store" and doc["vars"] == {"post": ["1", "2"]} and doc["requests"][0]["weight"] == 2.0
    assert cal.split_target("http://h:8080/store/?x=1") == ("http://h:8080", "/store/?x=1")
    assert cal.split_target("http://h:8080") == ("http://h:8080", "/")


def test_profile_file_and_the_target_path_is_honoured(tmp_path):
    f = tmp_path / "profile.yml"
    f.write_text('requests:\n  - {method: GET, path: "/?p={post}", weight: 60}\n'
                 '  - {method: POST, path: /wp-comments-post.php, weight: 10, body: "comment_post_ID={post}&c={uniq}"}\n'
                 "vars: {post: [12, 15]}\n")
    reqs, variables = cal.read_profile(f)
    assert reqs[1] == cal.Request("POST", "/wp-comments-post.php", 10.0, "comment_post_ID={post}&c={uniq}")
    assert variables == {"post": ["12", "15"]}
    (tmp_path / "bad.yml").write_text("requests: []\n")
    with pytest.raises(ValueError, match="non-empty"):
        cal.read_profile(tmp_path / "bad.yml")
    load = cal.ShopLoad("http://127.0.0.1:9/store/", 0, 1, 5, profile=reqs, variables=variables)
    written = json.loads(Path(load.argv[load.argv.index("--profile-file") + 1]).read_text())
    assert written["base_path"] == "/store" and written["vars"] == {"post": ["12", "15"]}  # not silently dropped
    load.kill()
    assert not Path(load.argv[load.argv.index("--profile-file") + 1]).exists()


def test_locustfile_fills_placeholders():
    # importing the locustfile would patch the stdlib: read the function's source and run it alone
    import ast
    import itertools
    import random
    import re

    src = (cal.LOCUSTFILE).read_text()
    tree = ast.parse(src)
    fill_src = ast.get_source_segment(src, next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fill"))
    ns = {"re": re, "random": random, "os": os, "_uniq": itertools.count(), "_PLACEHOLDER": re.compile(r"\{(\w+)\}")}
    exec(fill_src, ns)  # noqa: S102 - our own file
    out = ns["fill"]("/p/{post}/{id}?q={word}&u={uniq}&k={keep}", {"post": ["12"], "word": ["shoe"]}, 5)
    m = re.fullmatch(r"/p/12/(\d)\?q=shoe&u=\d+-\d+-\d+&k=\{keep\}", out)
    assert m and int(m.group(1)) < 5


def test_cli_registers_and_rejects_bad_numbers(capsys):
    parser = argparse.ArgumentParser()
    cal.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--runs", "0", "--duration", "10s", "--textfile.dir", "/nonexistent"])
    assert args.duration == 10.0
    assert args.func(args) == 2
    assert "--runs >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--duration", "soon"])
    assert "MEDIAN OVER THE RUNS" in cal.__doc__ and "``quantile --quantile Q``" in cal.__doc__  # the help explains it
    args = parser.parse_args(["calibrate", "--min-floor", "-1"])
    assert args.func(args) == 2


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


# ------------------------------------------------------------------ the baseline after an earlier load
def test_the_baseline_leaves_out_calibrates_own_earlier_load(tmp_path: Path, monkeypatch) -> None:
    """A retry right after a calibration (a failed or dry run, an interrupted one) counted that
    run's own requests, still in the minute's demand, as the shop's: refused after 48 s of load."""
    marker = tmp_path / "last-load"
    assert cal.baseline_window(1000.0, marker) == (0.0, 60.0)  # no earlier load: the last minute
    # (the window starts 3.5 s after the load ended: the arrivals' 3 s rate then holds none of it)
    marker.write_text("990.0\n")  # ended 10 s ago: wait 5 s, then look at the 11.5 s since it
    assert cal.baseline_window(1000.0, marker) == (5.0, 11.5)
    marker.write_text("970.0\n")  # 30 s ago: no wait, the 26.5 s since
    assert cal.baseline_window(1000.0, marker) == (0.0, 26.5)
    marker.write_text("938.0\n")  # 62 s ago: the minute would still hold its last 1.5 s
    assert cal.baseline_window(1000.0, marker) == (0.0, 58.5)
    marker.write_text("930.0\n")  # over 63.5 s ago: the whole minute
    assert cal.baseline_window(1000.0, marker) == (0.0, 60.0)
    marker.write_text("garbage")
    assert cal.baseline_window(1000.0, marker) == (0.0, 60.0)

    queries: list[str] = []
    slept: list[float] = []
    monkeypatch.setattr(cal, "prometheus_instant", lambda url, q: queries.append(q) or [({}, 1.5)])
    marker.write_text(f"{cal.time.time() - 5:.3f}\n")
    b = cal.measure_baseline("http://prom", "shop", last_load=marker, sleep=slept.append)
    assert slept and 9 <= slept[0] <= 10.5
    assert "[11500ms]" in queries[0] and "[11500ms:1s]" in queries[0]  # (not rounded up into the load)
    assert b.idle_demand == 1.5 and "since the last calibration load" in b.note
    cal.note_load_ended(marker)
    assert abs(float(marker.read_text()) - cal.time.time()) < 5


def test_a_shop_that_does_not_answer_fails_before_any_load(monkeypatch):
    """A dead port with --users: the whole run's worth of refused connections went out first."""
    monkeypatch.setattr(cal, "run_shop_load", lambda *a, **k: pytest.fail("no load may start"))
    from promreflex.proc import free_port

    with pytest.raises(cal.CalibrationError, match="does not answer"):
        cal.calibrate(f"http://127.0.0.1:{free_port()}/", users=1, runs=1, duration_s=6, warmup_s=0,
                      progress=lambda *_: None)


@pytest.mark.parametrize("evaluation", ["100ms", "1m"])
def test_own_request_rate_query_holds_when_a_scrape_starts_late(tmp_path: Path, evaluation: str) -> None:
    """OWN_RPS_QUERY on promtool: an exporter scraped every 200 ms (5 stub_status requests/s),
    some scrapes stamped 100 ms late, visitors on top: 5 at every evaluation checked. One
    interval alone read 3.3 just after a late scrape and 10 just after the one that followed.
    At Prometheus's default 1 m evaluation interval too (a subquery without a step takes it:
    one reading, or none)."""
    values, v = [], 0
    late = {30, 31, 80, 299, 599}  # samples (of the 200 ms schedule) stamped 100 ms late
    at = {2 * i + (1 if i in late else 0): i for i in range(901)}
    for t in range(1801):
        if t in at:
            v += (1 if at[t] else 0) + (3 if at[t] % 2 else 0)  # its own request, and 3 visitors every 400 ms
            values.append(str(v))
        else:
            values.append("_")
    times = ("6s100ms", "6s200ms", "6s300ms", "16s100ms", "1m", "2m") if evaluation == "100ms" else ("1m", "2m")
    run = _own_rps_on_promtool(tmp_path / "own.test.yml", evaluation, values, cal.OWN_RPS_QUERY, 5, times)
    assert run.returncode == 0, run.stdout + run.stderr


def _own_rps_on_promtool(test: Path, evaluation: str, values: list[str], expr: str, value: float,
                         times: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """promtool on one nginx exporter's counter (``values`` on a 100 ms grid): ``expr`` must be
    ``value`` at each of ``times``."""
    checks = "".join(f"""
      - expr: '{expr}'
        eval_time: {t}
        exp_samples: [{{labels: '{{}}', value: {value}}}]""" for t in times)
    test.write_text(f"""rule_files: []
evaluation_interval: {evaluation}
tests:
  - interval: 100ms
    input_series:
      - series: 'nginx_http_requests_total{{job="nginx", instance="127.0.0.1:9113"}}'
        values: '{" ".join(values)}'
    promql_expr_test:{checks}
""")
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    return subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("scrape", [15, 30, 60])
def test_own_request_rate_query_holds_at_slow_scrapes(tmp_path: Path, scrape: int) -> None:
    """OWN_RPS_QUERY on promtool with the nginx exporter scraped every 15-60 s (its own request
    rate 1/scrape), stamped at an odd offset (half a scrape and 300 ms), as a real server's
    scrapes are, never on the query's whole seconds: an irate/idelta over 1m held one sample at
    60 s and read nothing."""
    tokens, v, last = [], 0, -1
    for k in range(20 * 60 // scrape):  # 20 minutes, on a 100 ms grid
        at = k * scrape * 10 + scrape * 5 + 3
        gap = at - last - 1
        if gap:
            tokens.append("_" if gap == 1 else f"_x{gap}")
        v += 1 + 3 * scrape  # its own request, and visitors
        tokens.append(str(v))
        last = at
    run = _own_rps_on_promtool(tmp_path / "own-slow.test.yml", "15s", tokens,
                               f"round({cal.OWN_RPS_QUERY} * {scrape * 1000})", 1000, ("5m", "10m", "15m"))
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_threshold_far_from_the_published_one_is_said(tmp_path: Path) -> None:
    from controllers.copy_guard.threshold import write_threshold

    assert cal.drift_warning(tmp_path, "shop", 28.0) is None  # nothing published yet
    write_threshold(tmp_path, "shop", 39.5, when=1795767956.0)
    write_threshold(tmp_path, "other", 10.0)
    said = cal.drift_warning(tmp_path, "shop", 28.0)
    assert said and "39.50 req/s (from 2026-11-27 " in said and "says 28.00 (-29%)" in said
    assert cal.drift_warning(tmp_path, "shop", 40.0) is None  # within 25%
    assert cal.drift_warning(tmp_path, "shop", 50.0) is not None  # +27%
    assert cal.drift_warning(tmp_path, "new-site", 28.0) is None
    write_threshold(tmp_path, "shop", 39.5, when=1e300)  # a stamp no clock reaches
    assert "(from unknown)" in (cal.drift_warning(tmp_path, "shop", 28.0) or "")
    (tmp_path / "promreflex_copy_guard_threshold.prom").write_bytes(b"\xff\xfe not text")
    assert cal.drift_warning(tmp_path, "shop", 28.0) is None  # unreadable: no warning, no traceback


def test_the_command_prints_the_drift_warning_and_still_publishes(tmp_path: Path, monkeypatch, capsys) -> None:
    """``promreflex calibrate`` itself says the drift (the function alone is tested above)."""
    from controllers.copy_guard.threshold import read_thresholds, write_threshold

    write_threshold(tmp_path, "shop", 39.5, when=1795767956.0)
    bins = {int(s / 0.1): [28, 0] for s in range(1000, 1010)}
    monkeypatch.setattr(cal, "run_shop_load", lambda *a, **k: cal.LoadRun(ok=280, failed=0, bins=bins, bin_s=0.1,
                                                                           started=0, ended=1, latency_ms={"p95": 40.0}))
    monkeypatch.setattr(cal, "check_reachable", lambda *a, **k: None)
    monkeypatch.setattr(cal, "note_load_ended", lambda *a, **k: None)  # (no stamp in the user's state dir)
    parser = argparse.ArgumentParser()
    cal.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--target", "http://127.0.0.1:1/", "--textfile.dir", str(tmp_path),
                              "--runs", "1", "--duration", "10s", "--warmup", "0s", "--users", "4"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "warning: site 'shop' has a published threshold of 39.50 req/s (from 2026-11-27 " in printed
    assert "says 28.00 (-29%)" in printed
    assert read_thresholds(tmp_path)["shop"].rps == pytest.approx(28.0)  # said, and published all the same
