"""Node processing and phases when the proxy fans an object PUT out to three replicas with
``Expect: 100-continue`` (synthetic captures, exporters/swift/synth.py): the time a replica waits
for its body (the other replicas' 100 Continue, a slow link) is not its processing, and the time
the proxy waits for its slowest replica is fan-out wait, not proxy processing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters.swift.analyze import Breakdown, analyze
from exporters.swift.roles import RoleMap
from exporters.swift.synth import REPLICA_NODES, SynthNet, replica_roles_mapping, swift_put_replicated

T0 = 1_795_448_405_000_000_000
MS = 1_000_000
# Each replica's own time in swift_put_replicated: header_ns + object_ns + after_update_ns.
OWN = {"header_ns": 500_000, "object_ns": 2 * MS, "after_update_ns": 200_000}


def _run(tmp_path: Path, n: int = 6, **put: object) -> Breakdown:
    tmp_path.mkdir(parents=True, exist_ok=True)
    net = SynthNet(dict(REPLICA_NODES))
    t = T0
    for i in range(n):
        t = swift_put_replicated(net, t, f"tx{i:04d}", **put) + 30 * MS  # type: ignore[arg-type]
    roles = RoleMap()
    roles.add_mapping_dict(replica_roles_mapping())
    return analyze(net.write(tmp_path), roles)


def _object_ms(b: Breakdown, attr: str = "processing") -> dict[str, float]:
    """Mean of ``attr`` (ms) of the object servers' PUTs, per node."""
    out: dict[str, list[int]] = {}
    for x in b.exchanges:
        if x.side == "server" and x.server_role == "object":
            out.setdefault(b.nodes[x.node], []).append(getattr(x, attr))
    return {k: float(np.mean(v)) / MS for k, v in out.items()}


def _proxy_ms(b: Breakdown, attr: str = "processing") -> float:
    v = [getattr(x, attr) for x in b.exchanges if x.side == "server" and x.server_role == "proxy"]
    assert len(v) == 6
    return float(np.mean(v)) / MS


def test_baseline_replica_and_proxy_processing(tmp_path: Path) -> None:
    b = _run(tmp_path)
    own = (OWN["header_ns"] + OWN["object_ns"] + OWN["after_update_ns"]) / MS
    for node, ms in _object_ms(b).items():
        assert ms == pytest.approx(own, abs=0.05), node
    assert _proxy_ms(b) == pytest.approx(0.6, abs=0.05)  # 2 x proxy_ns


def test_slow_replica_before_100_continue_is_its_own_time_only(tmp_path: Path) -> None:
    """s2 answers 100 Continue 50 ms late: the proxy sends the body to every replica only then.
    s2's processing grows by 50 ms; s1's and s3's (whose body waited for s2) do not; nor does
    the proxy's: its wait for the replicas is fan-out wait."""
    b = _run(tmp_path, header_ns={"s2": 50 * MS})
    own = (OWN["header_ns"] + OWN["object_ns"] + OWN["after_update_ns"]) / MS
    got = _object_ms(b)
    assert got["s2"] == pytest.approx(own + 50 - 0.5, abs=0.05)
    assert got["s1"] == pytest.approx(own, abs=0.05)
    assert got["s3"] == pytest.approx(own, abs=0.05)
    assert _proxy_ms(b) == pytest.approx(0.6, abs=0.05)
    # The replicas' wait for their body (100 Continue out -> last body byte in) is published apart.
    waits = _object_ms(b, "receive_wait")
    assert waits["s1"] > 49 and waits["s3"] > 49 and waits["s2"] < 1
    assert _proxy_ms(b, "fanout_wait") > 50


def test_slow_link_into_a_replica_is_not_its_processing_nor_the_proxys(tmp_path: Path) -> None:
    """The body reaches s1 over 200 ms (10 pieces, 20 ms apart: a slow link): s1's processing and
    the proxy's stay put; the proxy's wait for s1 is fan-out wait."""
    b = _run(tmp_path, body=b"y" * 20_000, body_pieces=10, piece_gap_ns={"s1": 20 * MS})
    own = (OWN["header_ns"] + OWN["object_ns"] + OWN["after_update_ns"]) / MS
    for node, ms in _object_ms(b).items():
        assert ms == pytest.approx(own, abs=0.05), node
    assert _proxy_ms(b) == pytest.approx(0.6, abs=0.05)
    assert _object_ms(b, "receive_wait")["s1"] > 180
    assert _proxy_ms(b, "fanout_wait") > 180


def test_object_phase_is_one_span_per_client_request(tmp_path: Path) -> None:
    """The object phase of a PUT is the proxy's first object call out -> last object answer in,
    once per client request (not once per replica, each inflated by the slowest one's wait)."""
    b = _run(tmp_path, header_ns={"s2": 50 * MS})
    ph = b.phases()
    assert len(ph["object"]) == 6
    assert float(np.median(ph["object"])) / MS == pytest.approx(50 + 2 + 0.5 + 0.2 + 0.3, abs=0.5)
    s = b.summary()
    assert s["waits_by_role"]["proxy"]["fanout"]["count"] == 6
    assert s["waits_by_role"]["object"]["receive"]["count"] == 18


def test_waits_published_as_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from exporters.swift.metrics import SwiftTimingCollector

    b = _run(tmp_path, header_ns={"s2": 50 * MS})
    reg = CollectorRegistry()
    SwiftTimingCollector(b.nodes, reg).add(b)
    text = generate_latest(reg).decode()
    assert 'promreflex_swift_node_wait_seconds_count{node="proxy",role="proxy",wait="fanout"} 6.0' in text
    assert 'promreflex_swift_node_wait_seconds_count{node="s1",role="object",wait="receive"} 6.0' in text
    assert 'promreflex_swift_phase_seconds_count{phase="object"} 6.0' in text


def test_bench_request_transfer_starts_at_the_body(tmp_path: Path) -> None:
    """The bench's request transfer (caller's first byte out -> callee's last in) starts at the
    body's first byte when the callee answered 100 Continue: s2's late 100 is not s1's link."""
    from bench.swift.attribution import transfer_times

    slow_node = transfer_times(_run(tmp_path / "node", header_ns={"s2": 50 * MS}))
    assert float(np.mean(slow_node["proxy->s1/object"])) / MS < 1
    slow_link = transfer_times(_run(tmp_path / "link", body=b"y" * 20_000, body_pieces=10,
                                    piece_gap_ns={"s1": 20 * MS}))
    assert float(np.mean(slow_link["proxy->s1/object"])) / MS == pytest.approx(180, abs=1)
    assert float(np.mean(slow_link["proxy->s2/object"])) / MS < 1


def test_own_spans_add_up_to_processing(tmp_path: Path) -> None:
    from exporters.swift.exchanges import own_spans

    b = _run(tmp_path, header_ns={"s2": 50 * MS}, body=b"y" * 20_000, body_pieces=10, piece_gap_ns={"s1": 5 * MS})
    served = [x for x in b.exchanges if x.side == "server"]
    assert served
    for x in served:
        spans = own_spans(x, b.exchanges)
        assert sum(e - s for s, e in spans) == x.processing
        assert all(x.req_start <= s < e <= x.resp_start for s, e in spans)


@pytest.mark.parametrize("expect", [False, True])
def test_a_leaf_put_without_100_continue_waits_for_its_body_as_receive_wait(tmp_path: Path, expect: bool) -> None:
    """A PUT straight to an object server (a benchmark, a sync script; Swift's proxy sends
    ``Expect: 100-continue``) over a slow link: the body trickles in over 200 ms, the server
    answers 20 ms after its last byte. Its processing is the 20 ms either way (it was the whole
    220 ms without the header: the body's transfer counted as the server's own time)."""
    from exporters.swift.pcap import ACK, PSH
    from exporters.swift.synth import http_response

    net = SynthNet(dict(REPLICA_NODES))
    t = T0
    for i in range(4):
        c, t = net.connect("proxy", "s1", 6200, t)
        head = (f"PUT /d1/1/AUTH_test/c/o{i} HTTP/1.1\r\nHost: s1\r\nX-Trans-Id: tx{i}\r\nContent-Length: 20000\r\n"
                f"{'Expect: 100-continue' + chr(13) + chr(10) if expect else ''}\r\n").encode()
        got = net.send(c, "proxy", t, head)
        start = net.send(c, "s1", got + 100_000, b"HTTP/1.1 100 Continue\r\n\r\n") if expect else got
        last = start
        for j in range(10):
            last = net.segment(c, "proxy", start + (j + 1) * 20 * MS, PSH | ACK, b"y" * 2000)
        net.ack(c, "s1", last + 5_000)
        resp = net.send(c, "s1", last + 20 * MS, http_response(201, f"tx{i}"))
        net.close(c, resp + 10_000)
        t = resp + 30 * MS
    roles = RoleMap()
    roles.add_mapping_dict(replica_roles_mapping())
    b = analyze(net.write(tmp_path), roles)
    own = 20 + (0.1 if expect else 0)  # (with the header: head in -> 100 Continue out counts too)
    assert _object_ms(b)["s1"] == pytest.approx(own, abs=0.05)
    assert _object_ms(b, "receive_wait")["s1"] == pytest.approx(200, abs=0.5)


def test_an_object_body_that_starts_with_a_method_is_body_not_a_request(tmp_path: Path) -> None:
    """Swift's proxy writes an object's body after the 100 Continue, so a body that starts (or has
    at a write boundary) "COPYRIGHT" or "GET /page" starts a segment: read as a request, it hid
    the replicas' PUTs and published s2's 50 ms as the proxy's processing (a stranger's review on
    a real Swift: a COPYRIGHT file, a web archive)."""
    body = b"COPYRIGHT (c) 2026 Example Corp.\n".ljust(600, b".") + b"GET /page/1 HTTP/1.1\r\n".ljust(600, b".")
    b = _run(tmp_path, header_ns={"s2": 50 * MS}, body=body, body_pieces=2)
    own = (OWN["header_ns"] + OWN["object_ns"] + OWN["after_update_ns"]) / MS
    got = _object_ms(b)
    assert got["s2"] == pytest.approx(own + 50 - 0.5, abs=0.05)
    assert got["s1"] == pytest.approx(own, abs=0.05)
    assert _proxy_ms(b) == pytest.approx(0.6, abs=0.05)
    assert {x.method for x in b.exchanges} == {"PUT"}
