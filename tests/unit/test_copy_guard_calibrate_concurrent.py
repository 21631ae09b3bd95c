"""One calibration per site (and per shop) at a time, refused at once, and sites that do not wait
for one another: an exclusive lock taken when a calibration starts (before its baseline wait), and
one last-load record per site (a load of shop A ending never erases shop B's "running")."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from controllers.copy_guard import calibrate as cal

SHOP_B = "http://127.0.0.1:18580/"
SHOP_A = "http://127.0.0.1:18581/"


def _cli(tmp_path: Path, target: str, site: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cal.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["calibrate", "--target", target, "--site", site, "--textfile.dir", str(tmp_path),
                              "--prometheus.url", "http://prom", "--request", "GET /product/{id} 1",
                              "--users", "4", "--runs", "1", "--duration", "10s", "--warmup", "0s"])


def _load(served_per_s: int = 40) -> cal.LoadRun:
    bins = {s: [served_per_s, 0] for s in range(1000, 1030)}
    return cal.LoadRun(ok=served_per_s * 30, failed=0, bins=bins, bin_s=1.0, started=0, ended=1,
                       latency_ms={"p95": 40.0})


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: Any) -> Path:
    """A quiet shop behind a fake Prometheus (1 s rate windows, 15 s rule interval); records in tmp."""
    monkeypatch.setattr(cal, "LAST_LOAD", tmp_path / "cache" / "calibrate-last-load")
    monkeypatch.setattr(cal, "cleanup_on_signals", lambda *a, **k: None)  # (signals: main thread only)

    def instant(_url: str, query: str, timeout: float = 10.0) -> list[tuple[dict[str, str], float]]:
        if "rate_window:seconds" in query or "count_over_time(nginx_http_requests_total" in query:
            return [({}, 60.0)]
        if "site:promreflex_http_requests:rate1s" in query:
            return [({}, 0.5)]
        if "quantile_over_time" in query:
            return [({}, 0.07)]
        return []

    monkeypatch.setattr(cal, "prometheus_instant", instant)
    monkeypatch.setattr(cal, "_prometheus_get", lambda *a, **k: {"groups": [{"name": "copy-guard.rules",
                                                                            "interval": 15.0}]})
    monkeypatch.setattr(cal, "check_reachable", lambda *a, **k: None)
    return tmp_path


def test_a_second_calibration_of_a_site_during_the_firsts_baseline_is_refused_at_once(stack: Path, monkeypatch: Any,
                                                                                        capsys: Any) -> None:
    """Both started together: the first is still in its baseline wait (no load yet, nothing says
    "running"); the second must not pass and load the shop at the same time."""
    in_baseline, release = threading.Event(), threading.Event()
    real_baseline = cal.measure_baseline
    calls = {"baseline": 0}

    def baseline(*a: Any, **k: Any) -> cal.Baseline:
        calls["baseline"] += 1
        if calls["baseline"] == 1:
            in_baseline.set()
            release.wait(30)
        return real_baseline(*a, **k)

    loads: list[str] = []
    monkeypatch.setattr(cal, "measure_baseline", baseline)
    monkeypatch.setattr(cal, "run_shop_load", lambda target, *a, **k: loads.append(threading.current_thread().name)
                        or _load())
    first: dict[str, int] = {}
    args1 = _cli(stack / "tf1", SHOP_B, "shop")
    t = threading.Thread(target=lambda: first.update(rc=args1.func(args1)), name="first")
    (stack / "tf1").mkdir()
    (stack / "tf2").mkdir()
    t.start()
    try:
        assert in_baseline.wait(30)
        started = time.monotonic()
        args = _cli(stack / "tf2", SHOP_B, "shop")
        rc = args.func(args)
        took = time.monotonic() - started
        err = capsys.readouterr().err
    finally:
        release.set()
        t.join(60)
    assert loads.count("MainThread") == 0, "the second calibration loaded the shop while the first one ran"
    assert rc == 1 and "refused before any load" in err and "another calibration" in err, err
    assert took < 5  # at once, not after a baseline wait
    assert first.get("rc") == 0  # the first one goes on and publishes
    # and once the first has ended, the site may be calibrated again
    args = _cli(stack / "tf2", SHOP_B, "shop")
    assert args.func(args) == 0


def test_other_sites_neither_wait_for_nor_erase_a_running_calibration(stack: Path, monkeypatch: Any,
                                                                     capsys: Any) -> None:
    """Site B loads its shop; site A (another shop) calibrates meanwhile: A does not wait for B's
    load to leave the rates, and A's load ending does not erase B's record: a second calibration
    of B is still refused."""
    loading, release = threading.Event(), threading.Event()
    record_b = cal.last_load_path("b") if hasattr(cal, "last_load_path") else cal.LAST_LOAD

    class Live:
        def running(self) -> bool:
            return True

    def run_shop_load(target: str, *a: Any, **k: Any) -> cal.LoadRun:
        cal.LOADS_STARTED += 1
        if target.startswith(SHOP_B) and not loading.is_set():
            live: Any = Live()
            cal._LIVE.add(live)
            try:
                deadline = time.monotonic() + 10
                while not (record_b.exists() and record_b.read_text().startswith("running")):
                    assert time.monotonic() < deadline, "no heartbeat"
                    time.sleep(0.05)
                loading.set()
                release.wait(30)
            finally:
                cal._LIVE.discard(live)
        return _load()

    waited: list[float] = []
    real_sleep_progress = cal._sleep_progress
    monkeypatch.setattr(cal, "run_shop_load", run_shop_load)
    monkeypatch.setattr(cal, "_sleep_progress", lambda seconds, *a, **k: waited.append(seconds)
                        or real_sleep_progress(0, *a, **k))
    for d in ("tfa", "tfb", "tfb2"):
        (stack / d).mkdir()
    b: dict[str, int] = {}
    args_b = _cli(stack / "tfb", SHOP_B, "b")
    t = threading.Thread(target=lambda: b.update(rc=args_b.func(args_b)), name="site-b")
    t.start()
    try:
        assert loading.wait(30)
        args_a = _cli(stack / "tfa", SHOP_A, "a")
        assert args_a.func(args_a) == 0  # another site, another shop: not refused
        assert waited == [], "site a waited for site b's load"
        capsys.readouterr()
        args_b2 = _cli(stack / "tfb2", SHOP_B, "b")
        rc = args_b2.func(args_b2)  # after a's load ended: b's first calibration still loads
        err = capsys.readouterr().err
    finally:
        release.set()
        t.join(60)
    assert rc == 1 and "another calibration" in err, err
    assert b.get("rc") == 0


def test_a_calibration_of_the_same_shop_under_another_site_name_is_refused(tmp_path: Path) -> None:
    with cal.CalibrationLock("shop", SHOP_B, tmp_path / "calibrate-last-load"):
        with pytest.raises(cal.CalibrationBusy, match=r"another calibration \(pid \d+\) of site 'shop'"):
            cal.CalibrationLock("shop", SHOP_A, tmp_path / "calibrate-last-load").acquire()
        with pytest.raises(cal.CalibrationBusy, match="of the shop at http://127.0.0.1:18580"):
            cal.CalibrationLock("other", SHOP_B + "store/", tmp_path / "calibrate-last-load").acquire()
        with cal.CalibrationLock("other", SHOP_A, tmp_path / "calibrate-last-load"):
            pass  # another site, another shop: side by side
    with cal.CalibrationLock("shop", SHOP_B, tmp_path / "calibrate-last-load"):
        pass  # released at the end


def test_records_are_per_site(tmp_path: Path) -> None:
    base = tmp_path / "calibrate-last-load"
    assert cal.last_load_path("shop", base) == base  # (the default site keeps the record of before)
    a, b = cal.last_load_path("a", base), cal.last_load_path("b/../x", base)
    assert len({a, b, base}) == 3 and a.parent == b.parent == tmp_path and "/" not in b.name
    b.parent.mkdir(exist_ok=True)
    b.write_text("running 1 2 http://x/\n")
    cal.note_load_ended(a)
    assert b.read_text() == "running 1 2 http://x/\n"
