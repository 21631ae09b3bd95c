"""The Swift timing exporter on real captures made in network namespaces.

Three namespaces (client, proxy, storage) joined by two veth pairs; a tiny proxy (it calls the
storage server for each request and passes Swift's X-Trans-Id along, like Swift's proxy) and a
storage server that takes 30 ms per request. tcpdump runs in each namespace (nanosecond stamps;
the proxy's on `-i any`, Linux cooked v2 frames). The test checks that the exporter matches the
segments across the captures, joins the proxy's calls by transaction id and attributes the
30 ms to the storage node, not to the proxy or the network; then that `swift-timing serve
--live` (tcpdump streams) publishes the same through /metrics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import pytest

from exporters.swift.analyze import analyze
from exporters.swift.roles import RoleMap, load_roles
from promreflex.proc import free_port, wait_until

pytestmark = pytest.mark.integration

PY = "/usr/bin/python3"
TAG = f"pswx{os.getpid() % 100000}"
NS = {n: f"{TAG}-{n}" for n in ("client", "proxy", "storage")}
ADDR = {"client": "10.200.91.1", "proxy_front": "10.200.91.2", "proxy_back": "10.200.92.2", "storage": "10.200.92.3"}
N_REQUESTS = 12
STORAGE_DELAY_S = 0.030

STORAGE = textwrap.dedent(f"""
    import http.server, time
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep({STORAGE_DELAY_S})
            body = b"x" * 3000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Trans-Id", self.headers.get("X-Trans-Id", ""))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("{ADDR['storage']}", 6200), H).serve_forever()
""")

PROXY = textwrap.dedent(f"""
    import http.client, http.server, itertools
    ids = itertools.count(1)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            tx = "tx%021x-0000000000" % next(ids)
            c = http.client.HTTPConnection("{ADDR['storage']}", 6200, timeout=10)
            c.request("GET", "/d1/7/AUTH_test/c" + self.path, headers={{"X-Trans-Id": tx}})
            data = c.getresponse().read()
            c.close()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Trans-Id", tx)
            self.end_headers()
            self.wfile.write(data)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("{ADDR['proxy_front']}", 8080), H).serve_forever()
""")

CLIENT = textwrap.dedent(f"""
    import sys, time, urllib.request
    for i in range(int(sys.argv[1])):
        urllib.request.urlopen("http://{ADDR['proxy_front']}:8080/obj-%d" % i, timeout=10).read()
        time.sleep(0.02)
""")

ROLES = {
    "nodes": {"client": {"addresses": [ADDR["client"]], "host": "this"},
              "proxy": {"addresses": [ADDR["proxy_front"], ADDR["proxy_back"]], "host": "this"},
              "storage": {"addresses": [ADDR["storage"]], "host": "this"}},
    "services": {f"{ADDR['proxy_front']}:8080": "proxy", f"{ADDR['storage']}:6200": "object"},
}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _netns_down() -> None:
    for ns in NS.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture()
def lab(tmp_path: Path) -> Iterator[Path]:
    _netns_down()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for ns in NS.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", f"{TAG}c", "netns", NS["client"], "type", "veth", "peer", "name", f"{TAG}pf",
            "netns", NS["proxy"])
        _ip("link", "add", f"{TAG}pb", "netns", NS["proxy"], "type", "veth", "peer", "name", f"{TAG}s",
            "netns", NS["storage"])
        for ns, dev, addr in ((NS["client"], f"{TAG}c", ADDR["client"]), (NS["proxy"], f"{TAG}pf", ADDR["proxy_front"]),
                              (NS["proxy"], f"{TAG}pb", ADDR["proxy_back"]), (NS["storage"], f"{TAG}s", ADDR["storage"])):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        for name, code in (("storage", STORAGE), ("proxy", PROXY)):
            script = tmp_path / f"{name}.py"
            script.write_text(code)
            procs.append(subprocess.Popen(["ip", "netns", "exec", NS[name], PY, str(script)]))
        (tmp_path / "client.py").write_text(CLIENT)
        (tmp_path / "roles.json").write_text(json.dumps(ROLES))

        def up() -> bool:
            r = subprocess.run(["ip", "netns", "exec", NS["client"], PY, "-c",
                                f"import urllib.request; urllib.request.urlopen('http://{ADDR['proxy_front']}:8080/warm',"
                                " timeout=2).read()"], capture_output=True, timeout=20)
            return r.returncode == 0

        wait_until(up, timeout=30, what="the namespaced proxy and storage server")
        yield tmp_path
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        _netns_down()


def _tcpdump(ns: str, iface: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "-i", iface, "-s", "512", "--immediate-mode", "-U",
                             "-n", "--time-stamp-precision=nano", "-w", str(out), "tcp"],
                            stderr=subprocess.DEVNULL)


def _settled(paths: Collection[Path], quiet: float = 1.0) -> None:
    """Until no capture file has grown for ``quiet`` seconds (tcpdump writes each packet at once,
    ``-U``): a tcpdump a second behind on a busy machine lost the last request's segments to a
    fixed 1 s sleep and SIGINT."""
    seen: list[list[int]] = [[]]
    since = [time.monotonic()]

    def quiet_now() -> bool:
        sizes = [p.stat().st_size for p in paths]
        if sizes != seen[0]:
            seen[0], since[0] = sizes, time.monotonic()
        return time.monotonic() - since[0] >= quiet

    wait_until(quiet_now, timeout=30, interval=0.1, what="the captures to stop growing")


def _client(lab_dir: Path, n: int) -> None:
    subprocess.run(["ip", "netns", "exec", NS["client"], PY, str(lab_dir / "client.py"), str(n)], check=True,
                   timeout=120)


def test_captures_attribute_the_storage_delay_to_the_storage_node(lab: Path) -> None:
    files = {"client": lab / "client.pcap", "proxy": lab / "proxy.pcap", "storage": lab / "storage.pcap"}
    dumps = [_tcpdump(NS["client"], f"{TAG}c", files["client"]), _tcpdump(NS["proxy"], "any", files["proxy"]),
             _tcpdump(NS["storage"], f"{TAG}s", files["storage"])]
    try:
        wait_until(lambda: all(f.exists() and f.stat().st_size >= 24 for f in files.values()), timeout=20,
                   what="tcpdump to open its files")
        time.sleep(0.5)
        _client(lab, N_REQUESTS)
        _settled(files.values())  # the last segments reach every capture
    finally:
        for d in dumps:
            d.send_signal(signal.SIGINT)
            d.wait(15)
    roles = load_roles(mapping=lab / "roles.json")
    b = analyze(files, roles)
    c = b.matches.counts
    # Every segment that arrived was sent from a captured node: all but those at the very
    # edges of the captures (tcpdump starts and stops one namespace after another) match.
    assert c["matched_exact"] + c["matched_offload"] >= c["ingress"] - 2, (c, _unmatched(files, roles))
    assert c["matched_ambiguous"] == 0
    proc = b.processing_by("role")
    obj = np.asarray(proc["object"]) / 1e9
    assert len(obj) == N_REQUESTS
    assert np.median(obj) == pytest.approx(STORAGE_DELAY_S, abs=0.015)
    # The proxy's own time is small against the 30 ms, and so is every hop.
    assert np.median(np.asarray(proc["proxy"]) / 1e9) < 0.015
    for hop, v in b.hops().items():
        assert np.median(v) / 1e9 < 0.001, hop
    assert b.joins.trans_id == N_REQUESTS and b.joins.ambiguous == 0
    assert b.read["proxy"].rejected["linktype"] == 0  # `-i any` (Linux cooked) frames decoded
    ph = b.phases()
    assert len(ph["object"]) == N_REQUESTS and np.median(ph["object"]) / 1e9 >= STORAGE_DELAY_S
    drawn = subprocess.run([sys.executable, "-m", "exporters.swift", "diagram", *(f"--capture={n}={p}" for n, p in
                            files.items()), f"--roles={lab / 'roles.json'}", f"--out={lab / 'one.png'}",
                            "--request-index=1"], capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    assert (lab / "one.png").stat().st_size > 10_000


def _unmatched(files: dict[str, Path], roles: RoleMap) -> list[str]:
    """The received segments without a twin in another capture (for a failure message)."""
    from exporters.swift.match import segment_hash
    from exporters.swift.pcap import ip_str, read_capture

    segs = {n: read_capture(f)[0] for n, f in files.items()}
    keys = {n: set(segment_hash(s).tolist()) for n, s in segs.items()}
    out = []
    for n, s in segs.items():
        own = set(roles.nodes[n].addresses)
        k = segment_hash(s)
        for i in range(len(s)):
            if int(s.src[i]) in own or any(int(k[i]) in keys[m] for m in segs if m != n):
                continue
            out.append(f"{n}: {ip_str(s.src[i])}:{s.sport[i]} > {ip_str(s.dst[i])}:{s.dport[i]} "
                       f"flags {int(s.flags[i]):#x} len {int(s.plen[i])} t {int(s.ts[i])}")
    return out[:20]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_live_tcpdump_streams_publish_the_breakdown(lab: Path) -> None:
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "exporters.swift", "serve", f"--roles={lab / 'roles.json'}",
                              f"--live=client={TAG}c@{NS['client']}", f"--live=proxy=any@{NS['proxy']}",
                              f"--live=storage={TAG}s@{NS['storage']}", f"--web.listen-address=127.0.0.1:{port}",
                              "--interval=1s", "--grace=500ms"], stderr=subprocess.PIPE)
    key = 'promreflex_swift_node_processing_seconds_count{node="storage",role="object"}'
    try:
        wait_until(lambda: _ok(port), timeout=30, what="the exporter's /metrics")
        # The tcpdumps attach after /metrics answers: one request at a time until one is
        # published (no fixed wait for them), then the measured ones.
        def warmed_up() -> bool:
            _client(lab, 1)
            return _scrape(port).get(key, 0) >= 1

        wait_until(warmed_up, timeout=60, what="a first object request on /metrics (the tcpdumps attached)")
        seen = _scrape(port).get(key, 0)
        _client(lab, N_REQUESTS)
        wait_until(lambda: _scrape(port).get(key, 0) >= seen + N_REQUESTS, timeout=60,
                   what=f"{N_REQUESTS} more object requests on /metrics")
        m = _scrape(port)
        total = m['promreflex_swift_node_processing_seconds_sum{node="storage",role="object"}']
        assert total / m[key] == pytest.approx(STORAGE_DELAY_S, abs=0.015)
        assert m['promreflex_swift_joins_total{result="trans_id"}'] >= N_REQUESTS
        assert m['promreflex_swift_hop_transit_seconds_count{dst_role="object",src_role="proxy"}'] > 0
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(20)
        except subprocess.TimeoutExpired:
            serve.kill()
    # No tcpdump left behind in the namespaces.
    left = subprocess.run(["ip", "netns", "pids", NS["proxy"]], capture_output=True, text=True).stdout.split()
    names = [Path(f"/proc/{p}/comm").read_text().strip() for p in left if Path(f"/proc/{p}/comm").exists()]
    assert "tcpdump" not in names


def _ok(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).status == 200
    except OSError:
        return False


def test_rings_built_by_swift_ring_builder_are_read(tmp_path: Path) -> None:
    """Debian's swift-ring-builder writes the rings; roles.py reads them without Swift's code."""
    from exporters.swift.pcap import ip_int

    for role, port in (("account", 6202), ("container", 6201), ("object", 6200)):
        builder = str(tmp_path / f"{role}.builder")
        for args in (["create", "8", "1", "1"], ["add", f"r1z1-10.200.93.31:{port}/d1", "1"],
                     ["add", f"r1z2-10.200.93.32:{port}/d1", "1"], ["rebalance"]):
            r = subprocess.run(["/usr/bin/swift-ring-builder", builder, *args], capture_output=True, text=True,
                               timeout=60, cwd=tmp_path)
            assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: rebalance warnings
    (tmp_path / "proxy-server.conf").write_text("[DEFAULT]\nbind_ip = 10.200.93.20\nbind_port = 8080\n")
    roles = load_roles(swift_dir=tmp_path)
    assert roles.endpoint_role(ip_int("10.200.93.32"), 6201) == "container"
    assert roles.endpoint_role(ip_int("10.200.93.31"), 6200) == "object"
    assert roles.endpoint_role(ip_int("10.200.93.20"), 8080) == "proxy"
