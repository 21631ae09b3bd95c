"""A failed scrape during an overload, on a real Prometheus with the shipped copy-guard rules
(rules/copy-guard.rules.yml, "Failed scrapes and targets that went away";
rules/tests/copy-guard-failed-scrape.test.yml pins the same on promtool at 15 s).

A failed scrape makes Prometheus write staleness markers for every series of the target. Until
the rules checked liveness by a sample within two scrape intervals, the served rate (access-log
exporter) or the arrivals (nginx exporter) vanished for an evaluation: a firing
CopyGuardSiteOverloaded resolved (the copy resumed) and fired again later with a new start. Here
one scrape of each exporter answers 503 while the alert fires; the alert must stay the same
alert (its ALERTS_FOR_STATE start unchanged). Then the access-log exporter stops answering for
good: the served rate must leave within a few intervals and not come back from the old samples
still in its long windows."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from promreflex.config import REPO_ROOT
from promreflex.proc import Child, free_port, http_ok, wait_until
from tests.metrics_server import MetricsServer

pytestmark = pytest.mark.integration

SERVED_RPS = 10.0  # the shop serves 10 req/s ...
VISITORS_RPS = 20.0  # ... of the 20 visitors ask for (threshold 20, floor 15: only arrivals reach it)


def _query(prom: str, expr: str) -> list:
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
        return json.load(r)["data"]["result"]


def _range(prom: str, expr: str, start: float, end: float) -> list:
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=5) as r:  # noqa: S310 - loopback
        return json.load(r)["data"]["result"]


def _firing_since(prom: str) -> float | None:
    """The start of the firing CopyGuardSiteOverloaded (ALERTS_FOR_STATE), None when not firing."""
    if not _query(prom, 'ALERTS{alertname="CopyGuardSiteOverloaded", alertstate="firing", site="shop"}'):
        return None
    got = _query(prom, 'ALERTS_FOR_STATE{alertname="CopyGuardSiteOverloaded", site="shop"}')
    return float(got[0]["value"][1]) if got else None


def test_one_failed_scrape_keeps_the_overload_alert_and_a_dead_exporter_leaves(tmp_path: Path) -> None:
    t0 = time.monotonic()
    accesslog = MetricsServer(lambda: (
        f'promreflex_http_requests_total{{site="shop",status_class="2xx"}} {(time.monotonic() - t0) * SERVED_RPS:.3f}\n'))
    # nginx counts each stub_status request of its exporter: one per scrape, on top of the visitors
    scrapes = [0]

    def nginx_body() -> str:
        scrapes[0] += 1
        return (f"nginx_http_requests_total {int((time.monotonic() - t0) * VISITORS_RPS) + scrapes[0]}\n"
                "nginx_connections_writing 1\n")

    nginx = MetricsServer(nginx_body)
    thresholds = MetricsServer(lambda: ('promreflex_copy_guard_rps_threshold{site="shop"} 20\n'
                                    'promreflex_copy_guard_demand_floor_rps{site="shop"} 15\n'))
    port = free_port()
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    config = prom_dir / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(REPO_ROOT / "rules" / "copy-guard.rules.yml")],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [exp.addr]}]}
                           for job, exp in (("accesslog", accesslog), ("nginx", nginx), ("node", thresholds))]}))
    prom = Child("prometheus", ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={prom_dir / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "prometheus.out").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), timeout=60, what="Prometheus ready")
        since = wait_until(lambda: _firing_since(url), timeout=90, interval=0.5,
                           what="CopyGuardSiteOverloaded firing (served 10 < 20, visitors 20 >= 15)")
        # A failed scrape leaves a window with fewer samples, and the ladders then read the next
        # window (1 m): one that holds a minute of samples, as on a Prometheus that ran for a
        # while (a younger series' 1 m rate reads low: 4 req/s of the 20 here).
        wait_until(lambda: _query(url, "count_over_time(nginx_http_requests_total[1m]) >= 58"), timeout=120,
                   interval=1, what="a minute of samples")

        for exporter, job in ((accesslog, "accesslog"), (nginx, "nginx")):
            exporter.fail_next = 1
            wait_until(lambda exporter=exporter: exporter.failed >= 1, timeout=30, what=f"a failed scrape of {job}")
            wait_until(lambda job=job: _query(url, f'min_over_time(up{{job="{job}"}}[30s]) == 0'), timeout=30,
                       what=f"Prometheus recorded the failed scrape of {job} (up 0)")
            failed_at = time.time()
            # four more evaluations after it: the same alert throughout (a gap would have
            # resolved it, and its next start would be later)
            wait_until(lambda failed_at=failed_at: time.time() > failed_at + 4.5, timeout=10, interval=0.2,
                       what="four evaluations after the failed scrape")
            assert _firing_since(url) == since, (job, _firing_since(url), since)
            exporter.failed = 0

        accesslog.dead = True
        wait_until(lambda: accesslog.failed >= 1, timeout=30, what="the access-log exporter's first refused scrape")
        dead_at = time.time()
        wait_until(lambda: not _query(url, "site:promreflex_http_requests_served:rate1s"), timeout=30, interval=0.5,
                   what="the served rate gone after the exporter stopped answering")
        gone = time.time()
        # at a 1 s scrape the ladder's window is 5 s, and two intervals are within 3.3 s
        assert gone - dead_at < 10, gone - dead_at
        # ... and it stays away while the old samples fill the 5 s and 1 m windows
        wait_until(lambda: time.time() > gone + 12, timeout=20, interval=0.5, what="12 s after it left")
        assert _range(url, "site:promreflex_http_requests_served:rate1s", gone + 1, time.time()) == []
    finally:
        prom.stop()
        for exporter in (accesslog, nginx, thresholds):
            exporter.shutdown()
