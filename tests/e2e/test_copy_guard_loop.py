"""End to end on the real stack: requests against nginx -> access log -> exporter -> the
copy-guard rules -> CopyGuardSiteOverloaded -> Alertmanager -> controller -> copy-guard action
-> a real ``promreflex copy`` paused; load gone -> resolved -> resumed -> identical copy. And a
quiet site (a trickle of night-time requests, far below the threshold) never pauses the copy.

The threshold is written absurdly high (1e6 req/s) so that any load counts as "suffering": what
is tested is the loop and the demand gate, not this machine's capacity (bench/copy_guard does
that). The route is the shipped default (`mode: adaptive`): such a deficit is severe, so the
throttle's emergency pause holds the copy; once the load is gone the site is quiet, the share
goes back to 1 and the episode ends."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from controllers.audit import read_audit
from controllers.copy_guard.registry import Registry
from controllers.copy_guard.threshold import write_threshold
from dashboards.queries import panels_without_data
from promreflex.config import ScrapeJob
from promreflex.proc import free_port, wait_until
from promreflex.stack import Stack
from tests.conftest import REPO, LiveStack, stack_config

pytestmark = pytest.mark.e2e

THRESHOLD, FLOOR = 1e6, 50.0
MIB = 1 << 20


class Requests:
    """A bounded loop of GET / against nginx in a thread: ``rate`` per second (0: as fast as it
    goes), for at most ``seconds`` and ``limit`` requests."""

    def __init__(self, url: str, rate: float = 0.0, seconds: float = 30.0, limit: int = 200_000):
        self.host, self.port = url.removeprefix("http://").rstrip("/").split(":")
        self.rate, self.seconds, self.limit = rate, seconds, limit
        self.stop = threading.Event()
        self.sent = self.ok = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Requests:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=5)
        deadline = time.monotonic() + self.seconds
        try:
            while not self.stop.is_set() and time.monotonic() < deadline and self.sent < self.limit:
                self.sent += 1
                conn.request("GET", "/")
                resp = conn.getresponse()
                resp.read()
                self.ok += resp.status == 200
                if self.rate:
                    self.stop.wait(1 / self.rate)
        finally:
            conn.close()


class CopyRun:
    def __init__(self, tmp: Path, registry: Path, port: int, size: int, rate: str):
        self.src, self.dst = tmp / "backup-src.bin", tmp / "backup-dst.bin"
        self.src.write_bytes(os.urandom(size))
        self.reg = registry
        self.log = tmp / "copy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "promreflex", "copy", str(self.src), str(self.dst),
                 "--site=shop", f"--registry.dir={registry}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--rate-limit={rate}", "--chunk-size=64K", "--linger=2", "--id=backup"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        wait_until(lambda: Registry(registry).get("backup"), timeout=20, what="the copy to register")

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/status", timeout=5) as r:  # noqa: S310 - loopback
            return json.load(r)

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    state = tmp_path_factory.mktemp("copy-guard-stack")
    registry = state / "copies"
    copy_port = free_port()
    cfg = stack_config(state, routes=[{
        "name": "copy-guard", "matchers": ['alertname="CopyGuardSiteOverloaded"'], "action": "copy-guard",
        "params": {"registry_dir": str(registry), "lease": "3s", "max_pause": "60s", "watchdog": False},
    }])
    cfg = cfg.model_copy(update={"stack": cfg.stack.model_copy(update={
        "extra_scrape": [ScrapeJob(job="copy", targets=[f"127.0.0.1:{copy_port}"])]})})
    stack = Stack(cfg)
    stack.up(progress=lambda *_: None)
    live = LiveStack(stack)
    try:
        write_threshold(stack.textfile_dir, "shop", THRESHOLD, demand_floor_rps=FLOOR)
        wait_until(lambda: live.query('site:promreflex_copy_guard_threshold:rps{site="shop"}'), timeout=30,
                   what="the threshold in Prometheus")
        live.registry, live.copy_port = registry, copy_port
        yield live
    finally:
        stack.down(quiet=True)


def copy_guard_decisions(stack) -> list[tuple[str, str]]:
    return [(r["transition"], r["result"]) for r in read_audit(stack.audit_log)
            if r["event"] == "decision" and r["action"] == "copy-guard"]


def test_a_quiet_site_never_pauses_the_copy(guard, tmp_path):
    # Night: 3 requests a second. Served RPS is far below the threshold (the paper's raw rule
    # would pause), but demand is below the floor.
    with Requests(guard.url("nginx"), rate=3, seconds=30):
        wait_until(lambda: guard.query('site:promreflex_http_requests_served:rate1s{site="shop"} > 0'),
                   timeout=30, what="the trickle to be served")
        copy = CopyRun(tmp_path, guard.registry, guard.copy_port, size=3 * MIB, rate="1M")
        assert copy.finish() == 0
        below = guard.query(f'max_over_time(site:promreflex_http_requests_served:rate1s{{site="shop"}}[20s]) < {THRESHOLD}')
        assert below, "the site must have been below the threshold the whole time"
        demand = float(guard.query('max_over_time(site:promreflex_copy_guard_demand:rps{site="shop"}[20s])')[0]["value"][1])
        assert 0 < demand < FLOOR
    assert copy.dst.read_bytes() == copy.src.read_bytes()
    assert "paused 0.0s" in copy.log.read_text()
    assert not guard.query('max_over_time(ALERTS{alertname="CopyGuardSiteOverloaded"}[1m])')
    assert copy_guard_decisions(guard) == []


def test_overload_pauses_the_copy_and_its_end_resumes_it(guard, tmp_path):
    # 16 MiB at 1 MB/s: after the lease runs out the copy still has seconds of work left
    # while the killed controller restarts (over 5 s on a loaded CI machine), so the re-pause
    # is observable instead of racing the copy's end.
    copy = CopyRun(tmp_path, guard.registry, guard.copy_port, size=16 * MIB, rate="1M")
    try:
        wait_until(lambda: copy.status()["done_bytes"] > 0, timeout=20, what="the copy to progress")
        with Requests(guard.url("nginx"), seconds=40) as load:
            t0 = time.monotonic()
            wait_until(lambda: copy.status()["state"] == "paused", timeout=20, what="the guard to pause the copy")
            paused_after = time.monotonic() - t0
            # The decision is audited only after `fire` returns, i.e. after the copy reports paused.
            wait_until(lambda: ("fire", "ok") in copy_guard_decisions(guard), timeout=30, what="the fire decision audited")
            wait_until(lambda: copy.status()["paused_seconds"] >= 0.5, timeout=10, what="paused 0.5 s")
            held = copy.status()["done_bytes"]
            wait_until(lambda: copy.status()["paused_seconds"] >= 1.5, timeout=10, what="paused 1.5 s")
            assert copy.status()["done_bytes"] == held < 16 * MIB

            # Every copy-guard dashboard panel has data in this stack (the paused copy scraped).
            empty = panels_without_data(REPO / "dashboards" / "copy_guard.json", guard.query, timeout=15)
            assert not empty, "panels with no data:\n" + "\n".join(empty)

            # The controller is SIGKILLed while the copy is paused: the copy's lease runs out and
            # it resumes by itself; the restarted controller recovers its state, Alertmanager
            # confirms the overload still holds, and the copy is paused again.
            guard.stop_component("controller", signal.SIGKILL)
            wait_until(lambda: copy.status()["lease_expiries"] >= 1, timeout=15, what="the lease to expire")
            assert copy.status()["state"] == "running"
            guard.start_component("controller", progress=lambda *_: None)
            wait_until(lambda: copy.status()["state"] == "paused", timeout=20, what="the restarted guard to re-pause")
            assert "recovered episode of shop" in (guard.dir / "logs" / "controller.log").read_text()
            assert load.ok > 0
        # Load gone: demand under the floor, the alert resolves, the copy resumes and completes.
        wait_until(lambda: ("resolve", "ok") in copy_guard_decisions(guard), timeout=30, what="the resolve")
        assert copy.finish() == 0
        assert copy.dst.read_bytes() == copy.src.read_bytes()
        print(f"\ncopy paused {paused_after:.2f}s after the load started")
    finally:
        copy.finish()
    metrics = urllib.request.urlopen(guard.url("controller") + "/metrics", timeout=5).read().decode()  # noqa: S310
    assert 'promreflex_copy_guard_pauses_total{site="shop"} 1.0' in metrics
    assert 'promreflex_copy_guard_resumes_total{reason="resolved",site="shop"} 1.0' in metrics
    # The throttle read its signal from the real Prometheus every time (the query is valid and
    # the site's series were there), and let the copy go because the site went quiet.
    assert 'promreflex_copy_guard_signal_errors_total{site="shop"} 0.0' in metrics
    quiet = re.search(r'promreflex_copy_guard_throttle_decisions_total\{site="shop",verdict="quiet"\} (\S+)', metrics)
    assert quiet and float(quiet.group(1)) >= 1
    assert 'promreflex_copy_guard_share{site="shop"} 1.0' in metrics
