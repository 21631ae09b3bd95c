"""The simulated mesh (bench/rca) writes Envoy logs the mesh exporter parses, with the real
call graph, and an injected latency fault shows on the faulty service's edges."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.blkio import BLKIO, EmulatedDisk
from bench.rca.mesh import Mesh
from promreflex.proc import wait_until

pytestmark = pytest.mark.integration


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def value(samples, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def shop_flow(base: str, cid: str) -> None:
    for method, path in [("POST", f"/login/{cid}"), ("GET", "/catalogue"), ("POST", f"/cart/{cid}/sock-1"),
                         ("DELETE", f"/cart/{cid}/sock-1"), ("POST", f"/cart/{cid}/sock-2"), ("GET", f"/cart/{cid}"),
                         ("POST", f"/orders/{cid}")]:
        req = urllib.request.Request(base + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            assert resp.status == 200, (method, path, resp.status)


def serviced_writes(vol: EmulatedDisk) -> int:
    return vol.io_counts().get("write", 0)


def slow_requests(samples, source: str, destination: str, above: str = "0.25") -> float:
    """Requests on an edge slower than ``above`` seconds (count minus that bucket)."""
    count = value(samples, "promreflex_mesh_request_duration_seconds_count", source=source, destination=destination)
    fast = value(samples, "promreflex_mesh_request_duration_seconds_bucket", source=source, destination=destination, le=above)
    return count - fast


def test_simulated_mesh_feeds_the_exporter_and_a_latency_fault_shows_on_carts_edges() -> None:
    work = Path(tempfile.mkdtemp(prefix="promreflex-mesh-sim-"))
    mesh = Mesh(work).start(timeout=30)
    try:
        base = mesh.url("front-end")
        for i in range(3):
            shop_flow(base, f"c{i}")
        # Every record written so far (7 front-end requests per flow, each logged by several
        # sidecars) reaches the exporter's counters.
        # (waited for whole: each sidecar's file is read in its own turn of the exporter)
        wanted = {("front-end", "carts"), ("orders", "carts"), ("carts", "carts-db"), ("front-end", "orders"),
                  ("orders", "payment"), ("catalogue", "catalogue-db")}

        def every_edge() -> dict | None:
            s = scrape(mesh.exporter_url)
            seen = {(lab["source"], lab["destination"]) for lab, v in s["promreflex_mesh_edge_info"] if v == 1}
            counted = value(s, "promreflex_mesh_requests_total", source="orders", destination="carts") >= 3
            return s if counted and value(s, "promreflex_mesh_lines_total") > 50 and wanted <= seen else None

        m = wait_until(every_edge, timeout=15, what="every edge of the 3 flows counted")
        assert value(m, "promreflex_mesh_parse_errors_total") == 0, [s for s in m["promreflex_mesh_parse_errors_total"] if s[1]]
        # Both log formats are in play (carts and orders log JSON, the others text).
        assert {mesh.log_format_of(s) for s in mesh.services} == {"istio_text", "istio_json"}
        assert slow_requests(m, "front-end", "carts") == 0
        assert slow_requests(m, "orders", "carts") == 0

        mesh.inject("carts", "latency", duration_s=30, delay_ms=300)
        for i in range(2):
            shop_flow(base, f"d{i}")
        mesh.clear("carts")

        def carts_slow():
            s = scrape(mesh.exporter_url)
            return slow_requests(s, "front-end", "carts") >= 6 and slow_requests(s, "orders", "carts") >= 2 and s

        m = wait_until(carts_slow, timeout=15, what="slow carts requests counted")
        # Only carts was slowed: its database's edge stayed fast.
        assert slow_requests(m, "carts", "carts-db") == 0
        assert slow_requests(m, "orders", "payment") == 0
        assert value(m, "promreflex_mesh_parse_errors_total") == 0
    finally:
        mesh.stop()
        shutil.rmtree(work, ignore_errors=True)
    assert not [n for n, c in mesh.children.items() if c.alive()]


@pytest.mark.skipif(not EmulatedDisk.available(), reason="needs root and the cgroup v1 blkio hierarchy")
def test_each_service_gets_its_own_iops_volume_and_the_disk_fault_writes_through_it() -> None:
    work = Path(tempfile.mkdtemp(prefix="promreflex-mesh-vol-"))
    mesh = Mesh(work, ["carts", "carts-db"], exporter=False, volume_iops=1000).start(timeout=30)
    try:
        assert set(mesh.volumes) == {"carts", "carts-db"}
        for s, vol in mesh.volumes.items():
            assert (vol.dir / "cgroup.procs").read_text().split() == [str(mesh.pid(s))]  # the app, not its sidecar
            assert (vol.dir / "blkio.throttle.write_iops_device").read_text().split() == [vol.device, "1000"]
        db = mesh.volumes["carts-db"]
        mesh.inject("carts-db", "disk", duration_s=30, writes=20, interval_ms=50)
        status = wait_until(lambda: (st := mesh.fault_status("carts-db")).get("fsyncs", 0) >= 100 and st,
                            timeout=30, what="100 writes by the disk fault")
        assert status["direct"] is True
        mesh.clear("carts-db")
        # The writes went through carts-db's own volume (and so its throttle), none through carts'.
        assert serviced_writes(db) >= 100
        assert serviced_writes(mesh.volumes["carts"]) < 100
    finally:
        mesh.stop()
        shutil.rmtree(work, ignore_errors=True)
    assert not mesh.volumes and not list(BLKIO.glob(f"promreflex-bench-rca-{os.getpid()}-*"))
