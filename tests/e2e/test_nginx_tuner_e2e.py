"""End to end on a real stack: access log -> histogram -> NginxResponseTimeHigh -> Alertmanager ->
controller -> retune-nginx (passive mode: each candidate held under live traffic and read back
from Prometheus) -> nginx reloaded, while a client sees no failed request.

The stack is this module's own (the session ``live_stack`` has no retune route): the shipped
rules, except that ``NginxResponseTimeHigh``'s ``for: 5m`` is rewritten to ``for: 1s`` in a copy
so the test stays short, plus ``promreflex exporter-nginx-memory`` as an extra component and
scrape job. The response-time threshold is the named series the rules read, published through
the node_exporter textfile: 10 s (silent) first, then 0 (any traffic fires).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from controllers.audit import read_audit
from controllers.nginx_tuner.passive import PassiveMeasurer
from dashboards.queries import panels_without_data
from promreflex.clients import PrometheusClient
from promreflex.config import Ports, load_config
from promreflex.fsutil import atomic_write_text
from promreflex.proc import free_port, http_ok, wait_until
from promreflex.stack import Component, Stack

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


class Traffic:
    """Fresh-connection GETs in a thread, bounded in count; counts failures."""

    def __init__(self, url: str):
        self.url = url
        self.ok = self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in range(100_000):
            if self.stop.wait(0.01):
                return
            if http_ok(self.url, timeout=5):
                self.ok += 1
            else:
                self.failed += 1


def set_threshold(stack: Stack, seconds: float) -> None:
    atomic_write_text(stack.textfile_dir / "nginx_threshold.prom",
                      f"promreflex_nginx_response_time_p95_threshold_seconds {seconds}\n")


@pytest.fixture(scope="module")
def tuned_stack() -> Iterator[tuple[Stack, Traffic, Path]]:
    base = Path(tempfile.mkdtemp(prefix="promreflex-e2e-nginx-tuner-"))
    base.chmod(0o755)
    rules = base / "rules"
    rules.mkdir()
    for f in (REPO / "rules").glob("*.yml"):
        shutil.copy(f, rules / f.name)
    text = (rules / "nginx.rules.yml").read_text()
    assert text.count("for: 5m") == 1
    (rules / "nginx.rules.yml").write_text(text.replace("for: 5m", "for: 1s"))
    state = base / "state"
    results = base / "results"
    mem_port = free_port()
    cfg = load_config(None, {
        "stack.state_dir": str(state),
        "stack.ports": {p: free_port() for p in Ports.model_fields},
        "stack.rules_dir": str(rules),
        "stack.extra_scrape": [{"job": "nginx_memory", "targets": [f"127.0.0.1:{mem_port}"]}],
        "controller.reconcile_interval": "1s",
        "controller.routes": [{
            "name": "retune-nginx", "matchers": ['alertname="NginxResponseTimeHigh"'], "action": "retune-nginx",
            "cooldown": "1h",
            "params": {
                "nginx_config": str(state / "nginx" / "nginx.conf"), "nginx_prefix": str(state / "nginx"),
                "candidates": [10, 65], "repeats": 1, "dwell": "1500ms", "settle": "300ms", "min_requests": 5,
                "reload_timeout": "20s", "results_dir": str(results),
            },
        }],
    })
    memory_exporter = Component("nginx_memory", mem_port, f"http://127.0.0.1:{mem_port}/-/ready", [
        sys.executable, "-m", "promreflex", "exporter-nginx-memory",
        f"--nginx.pid-file={state / 'nginx' / 'nginx.pid'}", f"--web.listen-address=127.0.0.1:{mem_port}",
    ])
    stack = Stack(cfg, extra_components=[memory_exporter])
    stack.up(progress=lambda *_: None)
    traffic = Traffic(stack.url("nginx") + "/")
    try:
        set_threshold(stack, 10)
        traffic.thread.start()
        yield stack, traffic, results
    finally:
        traffic.stop.set()
        traffic.thread.join(timeout=10)
        stack.down(quiet=True)
        shutil.rmtree(base, ignore_errors=True)


def prom_value(stack: Stack, expr: str) -> float | None:
    import json
    import urllib.parse

    url = f"{stack.url('prometheus')}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        res = json.load(resp)["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def controller_metric(stack: Stack, name: str, labels: str = "") -> float | None:
    with urllib.request.urlopen(stack.url("controller") + "/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        for line in resp.read().decode().splitlines():
            if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_passive_measurement_against_the_live_stack(tuned_stack) -> None:
    stack, traffic, _ = tuned_stack
    wait_until(lambda: (prom_value(stack, "sum(promreflex_nginx_memory_bytes)") or 0) > 0, timeout=30, what="nginx memory series")
    wait_until(lambda: traffic.ok > 20, timeout=30, what="traffic")
    async with aiohttp.ClientSession() as session:
        m = PassiveMeasurer(PrometheusClient(stack.url("prometheus"), session), site="shop", dwell_s=2, settle_s=0.5,
                            min_requests=5, check_interval=1)
        res = await m(65.0)
    assert res.requests >= 5 and res.failures == 0 and not res.aborted
    # A static page: nginx logs $request_time in whole ms, so 0.000 s, and the p95 estimate lies
    # inside the histogram's first bucket (0..5 ms).
    assert 0 <= res.mean_s < 0.005 and 0 < res.p95_s <= 0.005
    assert 1 << 20 < res.memory_bytes < 1 << 30 and res.memory_method == "prometheus"


def test_alert_drives_a_passive_retune(tuned_stack) -> None:
    stack, traffic, results = tuned_stack
    conf = stack.dir / "nginx" / "nginx.conf"
    original = conf.read_text()
    assert controller_metric(stack, "promreflex_nginx_tuner_state", '{state="idle"}') == 1
    failed_before = traffic.failed
    t0 = time.monotonic()
    set_threshold(stack, 0)

    def decisions() -> list[dict]:
        return [r for r in read_audit(stack.audit_log) if r["event"] == "decision" and r.get("route") == "retune-nginx"]

    wait_until(lambda: controller_metric(stack, "promreflex_nginx_tuner_state", '{state="sweeping"}') == 1
               or decisions(), timeout=30, interval=0.1, what="the retune to start")
    wait_until(lambda: decisions(), timeout=40, interval=0.2, what="the retune-nginx decision")
    elapsed = time.monotonic() - t0
    set_threshold(stack, 10)
    d = decisions()[0]
    assert (d["transition"], d["result"]) == ("fire", "ok"), d
    # One repeat gives unbounded intervals: the tuning must keep the current 65 s and say why.
    assert d["detail"].startswith("kept 65"), d["detail"]
    assert controller_metric(stack, "promreflex_nginx_tuner_trials_total", '{result="ok"}') == 2
    assert controller_metric(stack, "promreflex_nginx_tuner_retunes_total", '{result="kept"}') == 1
    assert controller_metric(stack, "promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 65
    assert controller_metric(stack, "promreflex_nginx_tuner_state", '{state="idle"}') == 1
    assert conf.read_text() == original
    assert (results / "retune.json").exists() and (results / "retune-trials.csv").read_text().count("\n") == 3
    assert traffic.failed == failed_before == 0, (traffic.ok, traffic.failed)
    print(f"threshold lowered -> retune decided in {elapsed:.1f}s, of which the action ran {d['seconds']:.1f}s")


def test_every_panel_query_of_the_dashboard_returns_data(tuned_stack) -> None:
    """dashboards/nginx_tuner.json needs this stack (memory exporter, retune route): checked here."""
    stack, _, _ = tuned_stack
    empty = panels_without_data(REPO / "dashboards" / "nginx_tuner.json",
                                lambda expr: prom_value(stack, expr) is not None, timeout=30)
    assert not empty, "panels with no data:\n" + "\n".join(empty)
