"""The port to Prometheus: the capture exporter reads every node of a running lab live (tcpdump in
each namespace, the command ``swift-lab`` prints), and the local stack's Prometheus scrapes it
through ``stack.extra_scrape``: PUT/GET traffic through the lab shows up as per-hop transit and
per-node processing series in Prometheus."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dashboards.queries import panels_without_data
from exporters.swift.lab import LabConfig, SwiftLab, requirements_missing
from promreflex.config import load_config, ports_model
from promreflex.proc import Child, free_port, http_ok, wait_until
from promreflex.stack import Stack

_missing = requirements_missing() + [p for p in ("/usr/bin/prometheus",) if not Path(p).exists()]
if _missing and os.environ.get("CI") == "true":
    raise RuntimeError(f"swift-lab integration tests cannot run under CI=true: missing {', '.join(_missing)}")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(_missing) and os.environ.get("CI") != "true", reason=f"needs {', '.join(_missing)}")]
REPO = Path(__file__).resolve().parents[2]


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_the_stack_scrapes_the_exporter_that_reads_the_lab_live(tmp_path: Path) -> None:
    lab = SwiftLab(LabConfig(lab_dir=tmp_path / "lab", subnet="10.200.143.0/24", storage_nodes=2))
    port = free_port()
    ports = {name: free_port() for name in ports_model().model_fields}
    cfg = load_config(None, {"stack.state_dir": str(tmp_path / "stack"), "stack.ports": ports,
                             "stack.extra_scrape": [{"job": "swift", "targets": [f"127.0.0.1:{port}"],
                                                     "interval": "1s"}]})
    stack = Stack(cfg)
    exporter: Child | None = None
    try:
        lab.up(verify=False)
        argv = lab.serve_argv(f"127.0.0.1:{port}")
        assert argv[:3] == ["promreflex", "swift-timing", "serve"]
        exporter = Child("swift-timing", [sys.executable, "-m", "exporters.swift", *argv[2:], "--interval", "1s",
                                          "--grace", "1s"], log_path=tmp_path / "exporter.log", cwd=REPO).start()
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/metrics"), timeout=60, what="the exporter's /metrics")
        stack.up(progress=lambda *_: None)
        prometheus = stack.url("prometheus")
        wait_until(lambda: _query(prometheus, 'up{job="swift"} == 1'), timeout=60, what="the first swift scrape")

        for _ in range(3):
            assert lab.verify()["ok"] is True  # PUT + GET of 1 B and 1 KB from the client namespace

        hop = 'sum(promreflex_swift_hop_transit_seconds_count{src_role="proxy",dst_role="object"})'
        got = wait_until(lambda: _query(prometheus, f"{hop} > 0"), timeout=90, interval=1,
                         what="proxy->object hop transit in Prometheus")
        assert float(got[0]["value"][1]) > 0
        nodes = wait_until(lambda: _query(prometheus, 'promreflex_swift_node_processing_seconds_count{role="object"} > 0'),
                           timeout=60, interval=1, what="object servers' processing in Prometheus")
        assert {r["metric"]["node"] for r in nodes} <= {"s1", "s2"} and nodes
        # The Swift dashboard's panels all have data from this lab, with requests still flowing
        # (rates need two scrapes that saw the counts grow).
        def has_data(expr: str) -> Any:
            if time.monotonic() - last_verify[0] > 3:
                lab.verify()
                last_verify[0] = time.monotonic()
            return _query(prometheus, expr)

        last_verify = [0.0]
        empty = panels_without_data(REPO / "dashboards" / "swift.json", has_data, timeout=90)
        assert not empty, "swift panels with no data:\n" + "\n".join(empty)
        assert exporter.alive(), exporter.tail()
    finally:
        if exporter is not None:
            exporter.stop()
        stack.down(quiet=True)
        lab.down()
    assert not exporter.alive()
    assert not [ns for ns in lab.status()["leftover_namespaces"]]
