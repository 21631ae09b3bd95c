"""``promreflex calibrate`` against your own Prometheus at a 15 s scrape (a stranger's review,
/tmp/review-guard, M2 and L3): the shop's demand before the load is read over what Prometheus'
rates really cover (1 m at a 15 s scrape), a previous calibration's load, ended or killed, is
left out of it, and a shop busy already is refused before it is loaded."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from controllers.copy_guard import calibrate as cal
from controllers.copy_guard.threshold import write_threshold
from tests.unit.test_copy_guard_doctor import Quiet, serving

RULES = Path(__file__).resolve().parents[2] / "rules" / "copy-guard.rules.yml"


def at_15s() -> cal.RateWindows:
    """Prometheus scraping and evaluating every 15 s: the rules' rates span 1 m."""
    return cal.RateWindows(60.0, 15.0, known=True)


# ------------------------------------------------------------------ (b) the window at the scrape interval
def test_the_baseline_window_follows_the_rate_window_of_a_15s_scrape(tmp_path: Path) -> None:
    """At 15 s the rules' rates span 1 m: a load that ended 9 s ago was read over the 11.5 s "after"
    it (all of it still inside those rates), and "the last minute" reached back 2 minutes."""
    marker = tmp_path / "last-load"
    # no earlier load: the last evaluation's 1 m rates and one evaluation more (76 s), not 2 minutes
    assert cal.baseline_window(1000.0, marker, at_15s()) == (0.0, 16.0)
    assert at_15s().trail_s == 75.0 and at_15s().lookback_s + at_15s().window_s == 76.0
    marker.write_text("991.0\n")  # ended 9 s ago: wait until it left the 1 m rates (75 s) + one evaluation
    wait, window = cal.baseline_window(1000.0, marker, at_15s())
    assert (wait, window) == (82.0, 16.0)
    marker.write_text("900.0\n")  # 100 s ago: no wait, the 25 s since it left the rates
    assert cal.baseline_window(1000.0, marker, at_15s()) == (0.0, 16.0)
    marker.write_text("800.0\n")  # long ago
    assert cal.baseline_window(1000.0, marker, at_15s()) == (0.0, 16.0)
    # 30 s scrape (2 m rates), and the local stack's figures unchanged
    at_30s = cal.RateWindows(120.0, 30.0, known=True)
    marker.write_text("995.0\n")
    assert cal.baseline_window(1000.0, marker, at_30s) == (150.0 + 31.0 - 5.0, 31.0)
    assert cal.baseline_window(1000.0, marker) == (10.0, 11.5)


def _promtool() -> str:
    return shutil.which("promtool") or "/usr/bin/promtool"


def test_at_15s_the_window_read_holds_none_of_the_previous_load_on_promtool(tmp_path: Path) -> None:
    """The rules themselves on promtool, scraped and evaluated every 15 s: a calibration load of
    100 req/s until 12 min, the next calibration starting 10 s later. What the baseline now reads
    (after its wait) is the idle shop; what it read before (11.5 s from 3.5 s after the load) was
    the load. The windows read from this Prometheus' own series: 60 s, both."""
    marker = tmp_path / "last-load"
    marker.write_text("720.0\n")
    wait, window = cal.baseline_window(730.0, marker, at_15s())
    read_at = 730.0 + wait
    old_wait, old_window = cal.baseline_window(730.0, marker)  # the local stack's 3.5 s + 11.5 s
    assert (old_wait, old_window) == (5.0, 11.5)
    served, nginx, v, n = [], [], 0, 0
    for i in range(81):  # a sample every 15 s, 0 .. 20 min
        t = i * 15
        if 600 < t <= 720:  # the load: 100 req/s, every request counted at both exporters
            v += 1500
            n += 1500
        served.append(str(v))
        n += 1  # the nginx exporter's own stub_status request, every scrape
        nginx.append(str(n))

    def idle(at: float, w: float) -> str:
        return f"""
      - expr: '{cal.IDLE_QUERY.format(site="shop", window=f"{int(w * 1000)}ms")}'
        eval_time: {int(at * 1000)}ms
        exp_samples: [{{labels: '{{}}', value: {{VALUE}}}}]"""

    site = "shop"
    test = tmp_path / "baseline.test.yml"

    def run(checks: str) -> subprocess.CompletedProcess[str]:
        test.write_text(f"""rule_files: ['{RULES}']
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'promreflex_http_requests_total{{site="{site}", status_class="2xx", job="accesslog", instance="a:1"}}'
        values: '{" ".join(served)}'
      - series: 'nginx_http_requests_total{{job="nginx", instance="n:1"}}'
        values: '{" ".join(nginx)}'
    promql_expr_test:{checks}
""")
        return subprocess.run([_promtool(), "test", "rules", str(test)], capture_output=True, text=True, timeout=60)

    windows = f"""
      - expr: '{cal.SERVED_WINDOW_QUERY.format(site=site)}'
        eval_time: {int(read_at)}s
        exp_samples: [{{labels: '{{}}', value: 60}}]
      - expr: '{cal.ARRIVALS_WINDOW_QUERY.format(site=site)}'
        eval_time: {int(read_at)}s
        exp_samples: [{{labels: '{{}}', value: 60}}]"""
    now = run(windows + idle(read_at, window).replace("{VALUE}", "0"))
    assert now.returncode == 0, now.stdout + now.stderr
    before = run(idle(730.0 + old_wait, old_window).replace("{VALUE}", "0"))
    assert before.returncode != 0 and "got: {} 1E+02" in before.stdout + before.stderr  # the old window: the load


class _Prometheus:
    """A loopback Prometheus: /api/v1/query answers by the query's text, /api/v1/rules names
    the copy-guard group's evaluation interval."""

    def __init__(self, values: dict[str, float], evaluation: float | None) -> None:
        self.values, self.evaluation, self.asked = values, evaluation, []

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        prom = self

        class Handler(Quiet):
            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/api/v1/query":
                    expr = urllib.parse.parse_qs(url.query)["query"][0]
                    prom.asked.append(expr)
                    value = next((v for k, v in prom.values.items() if k in expr), None)
                    result = [] if value is None else [{"metric": {}, "value": [time.time(), str(value)]}]
                    body: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
                elif url.path == "/api/v1/rules" and prom.evaluation is not None:
                    body = {"status": "success", "data": {"groups": [
                        {"name": "other", "interval": 60, "rules": []},
                        {"name": "copy-guard.rules", "interval": prom.evaluation, "rules": []}]}}
                else:
                    self.send_error(404)
                    return
                self.reply(json.dumps(body).encode())

        return Handler


def test_the_windows_are_read_from_the_target_prometheus() -> None:
    slow = _Prometheus({"rate_window:seconds": 60.0, "count_over_time(nginx_http_requests_total": 60.0}, 15.0)
    with serving(slow.handler()) as address:
        assert cal.read_rate_windows(f"http://{address}", "shop") == at_15s()
    stack = _Prometheus({"rate_window:seconds": 1.0, "count_over_time(nginx_http_requests_total": 3.0}, 0.2)
    with serving(stack.handler()) as address:
        assert cal.read_rate_windows(f"http://{address}", "shop") == cal.RateWindows(3.0, 0.2, known=True)
    rules_only_via_scrapes = _Prometheus({"rate_window:seconds": 60.0}, None)  # no rules API: about the scrape
    with serving(rules_only_via_scrapes.handler()) as address:
        assert cal.read_rate_windows(f"http://{address}", "shop") == cal.RateWindows(60.0, 15.0, known=True)
    assert not cal.read_rate_windows("http://127.0.0.1:9", "shop").known  # none: the local stack's, said so


def test_the_wait_is_said_with_its_length_and_progress(tmp_path: Path, monkeypatch: Any) -> None:
    marker = tmp_path / "last-load"
    marker.write_text(f"{time.time() - 9:.3f}\n")
    queries: list[str] = []
    monkeypatch.setattr(cal, "prometheus_instant", lambda url, q: queries.append(q) or [({}, 0.2)])
    said: list[str] = []
    slept: list[float] = []
    b = cal.measure_baseline("http://prom", "shop", last_load=marker, sleep=slept.append, windows=at_15s(),
                             progress=said.append)
    assert 80 <= sum(slept) <= 83 and max(slept) <= 15  # in steps, each said
    assert said[0].startswith("waiting 8") and "stays in Prometheus' demand figures for 75.0s" in said[0]
    assert "rates there span 1m, evaluated every 15s" in said[0]
    assert any(line.strip().startswith("... ") and line.endswith("s left") for line in said[1:])
    assert "[16000ms]" in queries[0] and "[16000ms:1s]" in queries[0]
    assert "16.0s since the last calibration load left the 1m rates" in b.note and b.span in b.note
    marker.unlink()
    b = cal.measure_baseline("http://prom", "shop", last_load=marker, sleep=slept.append, windows=at_15s())
    assert "0.20 req/s at its highest 1m rate over the last 1m16s (Prometheus' rates there span 1m" in b.note


# ------------------------------------------------------------------ (c) a calibration killed with SIGKILL
def test_a_calibration_killed_during_its_load_is_left_out_too(tmp_path: Path) -> None:
    """L3: after `kill -9` of a calibration (no end written), the next one counted its 2-user load,
    40 req/s, as the shop's demand."""
    marker = tmp_path / "last-load"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that ran and is gone
    gone.wait()
    marker.write_text(f"running {gone.pid} 900.000 http://127.0.0.1:18580/\n")
    beat = time.time() - 10
    os.utime(marker, (beat, beat))
    last = cal.read_last_load(marker)
    assert last is not None and last.how == "killed" and last.ended == pytest.approx(beat + cal.HEARTBEAT_S)
    wait, window = cal.baseline_window(beat + 10, marker)
    assert wait == pytest.approx(15 - 9) and window == 11.5  # as for a load that ended 9 s ago


def test_the_heartbeat_marks_the_load_while_it_runs(tmp_path: Path, monkeypatch: Any) -> None:
    marker = tmp_path / "cache" / "last-load"

    class Live:
        def running(self) -> bool:
            return True

    load: Any = Live()
    with cal.LoadHeartbeat("http://127.0.0.1:18580/", marker, period=0.2) as heart:
        heart.beat()  # (the thread beats too; one now, not waiting for it)
        cal._LIVE.add(load)
        try:
            first = marker.stat().st_mtime
            deadline = time.monotonic() + 30
            while marker.stat().st_mtime == first and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            cal._LIVE.discard(load)
    assert marker.stat().st_mtime > first  # beats while a load runs
    assert marker.read_text() == f"running {os.getpid()} {heart.text.split()[2]} http://127.0.0.1:18580/\n"
    # this very process: not "another calibration running", its last beat is the end
    last = cal.read_last_load(marker)
    assert last is not None and last.how == "killed"
    assert cal.running_calibration("http://127.0.0.1:18580/", marker) is None
    cal.note_load_ended(marker)
    assert cal.read_last_load(marker).how == "ended"  # type: ignore[union-attr]


def test_another_calibration_loading_the_same_shop_now_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    marker = tmp_path / "last-load"
    marker.write_text("running 4242 900.0 http://127.0.0.1:18580/store/\n")
    monkeypatch.setattr(cal, "_calibrating", lambda pid: pid == 4242)
    said = cal.running_calibration("http://127.0.0.1:18580/", marker)
    assert said and "another calibration (pid 4242) is loading http://127.0.0.1:18580/store/ now" in said
    assert cal.running_calibration("http://127.0.0.1:18999/", marker) is None  # another shop
    assert cal.baseline_window(1000.0, marker) == (0.0, 60.0)  # its load is not this shop's


# ------------------------------------------------------------------ (a) busy already: refused before any load
def _cli(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cal.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["calibrate", "--target", "http://127.0.0.1:18580/", "--textfile.dir", str(tmp_path),
                              "--prometheus.url", "http://prom", "--request", "GET /product/{id} 1", *extra])


def _fake_prometheus(monkeypatch: Any, idle: float, published: float | None = None) -> list[str]:
    asked: list[str] = []

    def instant(_url: str, query: str, timeout: float = 10.0) -> list[tuple[dict[str, str], float]]:
        asked.append(query)
        if "rate_window:seconds" in query or "count_over_time(nginx_http_requests_total" in query:
            return [({}, 60.0)]
        if "site:promreflex_http_requests:rate1s" in query:
            return [({}, idle)]
        if "quantile_over_time" in query:
            return [({}, 0.07)]
        if "copy_guard_threshold" in query:
            return [({}, published)] if published is not None else []
        return []

    monkeypatch.setattr(cal, "prometheus_instant", instant)
    monkeypatch.setattr(cal, "_prometheus_get", lambda *a, **k: {"groups": [{"name": "copy-guard.rules",
                                                                            "interval": 15.0}]})
    monkeypatch.setattr(cal, "check_reachable", lambda *a, **k: None)
    return asked


def test_a_shop_busy_already_is_refused_before_any_load(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """M2: 111 req/s printed before the load, above the floor of the threshold published for the
    shop (73.30): a ramp and 3 runs at saturation of the live shop (2.5 min), then refused."""
    monkeypatch.setattr(cal, "LAST_LOAD", tmp_path / "last-load")
    _fake_prometheus(monkeypatch, idle=111.13)
    write_threshold(tmp_path, "shop", 73.30)
    loads: list[Any] = []
    monkeypatch.setattr(cal, "run_shop_load", lambda *a, **k: loads.append(a) or pytest.fail("no load may start"))
    args = _cli(tmp_path, "--duration", "30s")
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "refused before any load, nothing loaded or published" in err
    assert "111.13 req/s" in err and "73.30 req/s" in err and "busy already" in err
    assert loads == []
    # an explicit --demand-floor at or below the demand: the same, before any load
    args = _cli(tmp_path / "none", "--demand-floor", "100")
    assert args.func(args) == 1 and "the --demand-floor 100.00" in capsys.readouterr().err
    # and a --demand-floor below the lowest sane one is said before the load, not after it
    args = _cli(tmp_path / "none", "--demand-floor", "1")
    assert args.func(args) == 1 and "below the lowest sane floor" in capsys.readouterr().err


def _load(served_per_s: int) -> cal.LoadRun:
    bins = {s: [served_per_s, 0] for s in range(1000, 1030)}
    return cal.LoadRun(ok=served_per_s * 30, failed=0, bins=bins, bin_s=1.0, started=0, ended=1,
                       latency_ms={"p95": 40.0})


def test_without_a_published_threshold_the_ramp_decides_before_the_runs(tmp_path: Path, monkeypatch: Any,
                                                                          capsys: Any) -> None:
    """The first calibration: nothing says the shop's capacity before it is loaded; the ramp (light
    steps) does, and the runs at saturation are not started when even what the knee served gives
    a floor at or below the demand."""
    monkeypatch.setattr(cal, "LAST_LOAD", tmp_path / "last-load")
    _fake_prometheus(monkeypatch, idle=50.0)
    calls: list[int] = []
    monkeypatch.setattr(cal, "run_shop_load", lambda target, rate, users, duration, **k: calls.append(users) or _load(40))
    args = _cli(tmp_path, "--step-duration", "3s", "--duration", "30s")
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "refused after the ramp, before the runs, nothing published" in err and "40.00 req/s" in err
    assert calls == [1, 2, 2]  # the ramp's steps only (saturated at 2 users, measured twice): no run
    # with --users (no ramp): after the first run, not the third
    calls.clear()
    args = _cli(tmp_path, "--users", "4", "--duration", "10s", "--warmup", "0s")
    assert args.func(args) == 1
    assert "refused after run 1 of 3" in capsys.readouterr().err and calls == [4]
    # a quiet shop: ramp and runs, published
    calls.clear()
    _fake_prometheus(monkeypatch, idle=0.5)
    args = _cli(tmp_path, "--step-duration", "3s", "--duration", "10s", "--warmup", "0s")
    assert args.func(args) == 0 and calls == [1, 2, 2, 2, 2, 2]


# ------------------------------------------------------------------ (d) the message
def test_a_demand_above_the_threshold_itself_is_said_as_such() -> None:
    said = cal.refusal(98.0, 98.0, idle_demand=99.73, span="its highest 1m rate over the last 1m16s")
    assert said and "at or above the threshold 98.00 req/s itself" in said and "more than half" not in said
    assert "peaked at 99.73 req/s (its highest 1m rate over the last 1m16s)" in said
    half = cal.refusal(98.0, 60.0, idle_demand=60.0)
    assert half and "more than half the threshold" in half


def test_the_windows_calibrate_waits_for_at_a_60_s_scrape(tmp_path: Path) -> None:
    """At a 60 s scrape the rules take the served rate and the arrivals over 5m (their ladder's
    last rung, rules/copy-guard.rules.yml): calibrate reads 300 s for both, so it waits for a
    previous load to leave 5m windows (it read 120 for the arrivals, the old last rung)."""
    values = " ".join(str(i * 60 * 30) for i in range(21))  # a sample every 60 s, 30 req/s
    test = tmp_path / "windows-60s.test.yml"
    test.write_text(f"""rule_files: ['{RULES}']
evaluation_interval: 60s
tests:
  - interval: 60s
    input_series:
      - series: 'promreflex_http_requests_total{{site="shop", status_class="2xx", job="accesslog", instance="a:1"}}'
        values: '{values}'
      - series: 'nginx_http_requests_total{{job="nginx", instance="n:1"}}'
        values: '{values}'
    promql_expr_test:
      - expr: '{cal.SERVED_WINDOW_QUERY.format(site="shop")}'
        eval_time: 15m
        exp_samples: [{{labels: '{{}}', value: 300}}]
      - expr: '{cal.ARRIVALS_WINDOW_QUERY.format(site="shop")}'
        eval_time: 15m
        exp_samples: [{{labels: '{{}}', value: 300}}]
""")
    run = subprocess.run([_promtool(), "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
