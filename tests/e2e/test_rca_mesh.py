"""End to end on the real stack: Envoy access logs of a chain a -> b -> c where c is slow ->
mesh exporter -> Prometheus rules (ServiceResponseTimeHigh for a, b and c) -> Alertmanager ->
webhook -> rca action -> root cause c flagged: promreflex_root_cause{service="c"} on the
controller, MeshRootCause{service="c"} active in Alertmanager, a's symptom alert inhibited,
and the report explained by ``promreflex rca explain``."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, UTC
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from promreflex.cli import main as promreflex_main
from controllers.rca.models import Finding
from dashboards.queries import panels_without_data
from exporters.mesh.writer import AccessLogWriter, inbound_cluster, outbound_cluster
from promreflex.config import ScrapeJob
from promreflex.proc import free_port, wait_until
from promreflex.stack import Component, Stack
from tests.conftest import REPO, LiveStack, stack_config

pytestmark = pytest.mark.e2e

THRESHOLD_S = 0.2  # fires from the 0.25 s bucket bound up; c answers in 0.3 s
CHAIN = ("a", "b", "c")


def record(duration_ms: int, cluster: str, authority: str) -> dict:
    return {
        "start_time": datetime.now(UTC), "method": "GET", "path": "/", "protocol": "HTTP/1.1",
        "response_code": 200, "response_flags": (), "response_code_details": "via_upstream",
        "bytes_received": 0, "bytes_sent": 10, "duration": duration_ms, "upstream_service_time": duration_ms,
        "user_agent": "e2e", "request_id": "r", "authority": authority, "upstream_host": "127.0.0.1:80",
        "upstream_cluster": cluster, "route_name": "default",
    }


class Chain(threading.Thread):
    """Writes what the three sidecars would log for ~10 requests/s through a -> b -> c, c taking
    ``c_ms``; counts c's CPU seconds faster while it is slow (its resource evidence)."""

    def __init__(self, logs: dict[str, Path], cpu: Counter):
        super().__init__(daemon=True)
        self.writers = {s: AccessLogWriter(p) for s, p in logs.items()}
        self.cpu = cpu
        self.c_ms = 10
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 120  # bounded whatever happens to the test
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                c = self.c_ms
                b, a = c + 5, c + 10
                w = self.writers
                w["a"].write(record(a, inbound_cluster(8080), "a"))
                w["a"].write(record(b, outbound_cluster("b"), "b"))
                w["b"].write(record(b, inbound_cluster(8080), "b"))
                w["b"].write(record(c, outbound_cluster("c"), "c"))
                w["c"].write(record(c, inbound_cluster(8080), "c"))
                for s in CHAIN:
                    self.cpu.labels(s).inc(0.01 if s != "c" or c < 100 else 0.09)
                self.stop.wait(0.1)
        finally:
            for w in self.writers.values():
                w.close()


def http_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return json.load(resp)


def am_alerts(live: LiveStack, alertname: str) -> list[dict]:
    return [a for a in http_json(f"{live.alertmanager_url}/api/v2/alerts?active=true&inhibited=true&silenced=true")
            if a["labels"].get("alertname") == alertname and a["endsAt"] > a["updatedAt"]]


def test_slow_c_is_flagged_and_its_dependants_are_inhibited(tmp_path):
    logs_dir = Path(tempfile.mkdtemp(prefix="rca-e2e-"))
    logs = {s: logs_dir / f"{s}.log" for s in CHAIN}
    for p in logs.values():
        p.touch()
    mesh_port, gauges_port = free_port(), free_port()
    (tmp_path / "mesh.yml").write_text(yaml.safe_dump({
        "listen_address": f"127.0.0.1:{mesh_port}", "poll_interval": "100ms",
        "logs": [{"workload": s, "path": str(p), "from_start": True} for s, p in logs.items()],
    }))
    # The threshold and the resource series a real setup gets from a textfile and cAdvisor.
    reg = CollectorRegistry()
    Gauge("promreflex_mesh_response_time_threshold_seconds", "Candidate line.", registry=reg).set(THRESHOLD_S)
    cpu = Counter("promreflex_bench_process_cpu_seconds", "CPU seconds by service.", ["service"], registry=reg)
    gauges_server, _ = start_http_server(gauges_port, addr="127.0.0.1", registry=reg)

    report = tmp_path / "rca" / "latest.json"
    cfg = stack_config(tmp_path / "stack", routes=[{
        "name": "mesh-rca", "matchers": ['alertname="ServiceResponseTimeHigh"'], "action": "rca",
        "params": {
            "settle": "1s", "lease": "30s", "report": str(report),
            "source": {"window": "30s", "baseline": "1m", "step": "1s", "queries": {"resources": {
                "cpu": 'sum(rate(promreflex_bench_process_cpu_seconds_total{service="$service"}[5s]))'}}},
        },
    }])
    cfg = cfg.model_copy(update={"stack": cfg.stack.model_copy(update={"extra_scrape": [
        ScrapeJob(job="mesh", targets=[f"127.0.0.1:{mesh_port}"]),
        ScrapeJob(job="rca-e2e", targets=[f"127.0.0.1:{gauges_port}"]),
    ]})})
    exporter = Component("mesh-exporter", mesh_port, f"http://127.0.0.1:{mesh_port}/metrics",
                         [sys.executable, "-m", "exporters.mesh", "--config.file", str(tmp_path / "mesh.yml")])
    stack = Stack(cfg, extra_components=[exporter])
    live = LiveStack(stack)
    chain = Chain(logs, cpu)
    try:
        stack.up(progress=lambda *_: None)
        chain.start()
        wait_until(lambda: live.query('service:promreflex_mesh_request_duration_seconds:max_1m{service="c"}'),
                   timeout=20, interval=0.2, what="c's recorded maximum")
        chain.c_ms = 300  # the fault
        fault_at = time.monotonic()

        def firing() -> set[str]:
            return {r["metric"]["service"] for r in
                    live.query('ALERTS{alertname="ServiceResponseTimeHigh", alertstate="firing"}')}

        wait_until(lambda: {"a", "c"} <= firing(), timeout=40, interval=0.25, what="ServiceResponseTimeHigh for a and c")
        wait_until(lambda: am_alerts(live, "MeshRootCause"), timeout=20, interval=0.2, what="MeshRootCause posted")
        print(f"fault -> MeshRootCause in Alertmanager: {time.monotonic() - fault_at:.1f}s")  # for the record, not asserted

        roots = am_alerts(live, "MeshRootCause")
        assert [r["labels"]["service"] for r in roots] == ["c"]
        assert roots[0]["status"]["state"] == "active"

        def a_inhibited() -> list[str]:
            a = [x for x in am_alerts(live, "ServiceResponseTimeHigh") if x["labels"]["service"] == "a"]
            return a[0]["status"]["inhibitedBy"] if a else []

        wait_until(a_inhibited, timeout=10, interval=0.2, what="a's ServiceResponseTimeHigh inhibited")
        (c_alert,) = [x for x in am_alerts(live, "ServiceResponseTimeHigh") if x["labels"]["service"] == "c"]
        assert c_alert["status"] == {"state": "active", "silencedBy": [], "inhibitedBy": []}
        symptoms = {s["labels"]["service"]: s["labels"]["root_cause"] for s in am_alerts(live, "MeshRootCauseSymptom")}
        assert symptoms == {"a": "c", "b": "c"}

        with urllib.request.urlopen(f"{live.controller_url}/metrics", timeout=5) as resp:  # noqa: S310
            metrics = resp.read().decode()
        assert 'promreflex_root_cause{service="c"}' in metrics
        assert 'promreflex_rca_findings_total{result="root_cause"} 1.0' in metrics

        finding = Finding.load(report)
        assert finding.root_cause == "c" and finding.config.threshold_s == THRESHOLD_S
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert promreflex_main(["rca", "explain", "--report", str(report)]) == 0
        assert "-> root cause c" in out.getvalue()

        # The same analysis on demand from the command line.
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert promreflex_main(["rca", "analyse", "--prometheus.url", live.prometheus_url, "--threshold", "200ms",
                                 "--window", "30s", "--baseline", "1m", "--step", "1s", "--json"]) == 0
        assert json.loads(out.getvalue())["root_causes"] == ["c"]

        # The mesh dashboard's panels all have data in this setup.
        empty = panels_without_data(REPO / "dashboards" / "mesh.json", live.query, timeout=10)
        assert not empty, "mesh panels with no data:\n" + "\n".join(empty)
    finally:
        chain.stop.set()
        if chain.is_alive():
            chain.join(timeout=5)
        stack.down(quiet=True)
        gauges_server.shutdown()
