"""What real captures do that a clean one does not (a stranger's review, M3, M5, M9): a node's
clock that steps by seconds, every packet recorded twice (``tcpdump -i any`` across a bridge),
captures full of empty or tiny records."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

import exporters.swift.pcap as pcap
from exporters.swift.analyze import Breakdown, analyze
from exporters.swift.live import LiveAnalyzer
from exporters.swift.metrics import SwiftTimingCollector
from exporters.swift.pcap import ACK, PSH, StreamParser, read_capture
from exporters.swift.roles import RoleMap
from exporters.swift.synth import NODES, SynthNet, roles_mapping, swift_put, tcp_packet, write_pcap, write_pcapng

T0 = 1_795_448_405_000_000_000
MS = 1_000_000
S = 1_000_000_000


def _roles(shared: bool = True) -> RoleMap:
    r = RoleMap()
    r.add_mapping_dict(roles_mapping(shared_clock=shared))
    return r


def _net(n: int, gap: int = 50 * MS, **kw) -> SynthNet:
    net = SynthNet(dict(NODES), **kw)
    t = T0
    for i in range(n):
        t = swift_put(net, t, f"tx{i:04d}") + gap
    return net


def _pair(b: Breakdown, x: str, y: str):
    return next(p for (a, z), p in b.clocks.pairs.items() if {b.nodes[a], b.nodes[z]} == {x, y})


# -- M3: clock steps of seconds ----------------------------------------------------------------

@pytest.mark.parametrize("node", ["client", "proxy"])
@pytest.mark.parametrize("step_s", [10.0, 2.5, -2.5, -10.0])
def test_a_clock_step_of_seconds_is_followed(tmp_path: Path, node: str, step_s: float) -> None:
    """10 s of PUTs, the client's clock 0.3 s off, one node's clock stepping at 5 s (client: the
    clock the client-proxy pair's windows were kept on; proxy: the other end). Every hop's
    transit stays the true 20 us on both sides of the step, and the step is one jump."""
    net = _net(100, gap=100 * MS, clock_offset={"client": 300 * MS},
               jump_at={node: (T0 + 5 * S, int(step_s * S))})
    b = analyze(net.write(tmp_path), _roles(shared=False))
    for hop, values in b.hops().items():
        assert int(values.max()) <= 20_001 and int(values.min()) >= 19_999, (hop, int(values.max()))
    assert _pair(b, "client", "proxy").jumps == 1
    if step_s < 0:  # tcpdump writes in arrival order: the step shows as stamps going back
        assert b.read[node].rejected["clock_backwards"] > 0


def test_capture_timeline_turns_steps_back_into_steps_forward() -> None:
    from exporters.swift.match import capture_timeline

    ts = np.array([100, 200, 300, 50, 150, 160, 159, 2_000_500], dtype=np.int64) * 10_000
    mono = capture_timeline(ts)
    assert np.all(np.diff(mono[:6]) > 0) and mono[3] - mono[2] == (300 - 50) * 10_000  # 2.5 ms back -> forward
    assert mono[6] - mono[5] == -10_000  # 0.01 ms back (packets reordered): left alone
    assert mono[7] - mono[6] == ts[7] - ts[6]  # forward steps as they are
    same = np.arange(10, dtype=np.int64) * MS
    assert capture_timeline(same) is same


@pytest.mark.parametrize("node", ["client", "proxy", "storage"])
@pytest.mark.parametrize("step_s", [-2.5, -10.0, 2.5])
def test_live_windows_follow_a_clock_step(tmp_path: Path, node: str, step_s: float) -> None:
    """Live mode, the captures fed in 40 slices with a window cut after each: a node whose clock
    steps publishes every request and the true transits, as the offline analysis does. Before,
    a storage node stepping back lost 22 of 100 requests at -2.5 s and 52 at -10 s (its latest
    stamp, still the one from before the step, held the cut; what it received meanwhile fell in
    windows already published)."""
    net = _net(100, gap=100 * MS, jump_at={node: (T0 + 5 * S, int(step_s * S))})
    paths = net.write(tmp_path)
    roles = _roles(shared=False)  # a clock of its own per node: offsets estimated, as for a step
    reg = CollectorRegistry()
    SwiftTimingCollector(list(paths), registry=reg).add(analyze(paths, roles))
    live_reg = CollectorRegistry()
    live = LiveAnalyzer(list(paths), roles, SwiftTimingCollector(list(paths), registry=live_reg),
                        grace_s=0.2, keep_s=30)
    recs = {n: _records(p.read_bytes()) for n, p in paths.items()}
    for n, (head, _) in recs.items():
        live.feed(n, head)
    for j in range(40):
        for n, (_, rs) in recs.items():
            live.feed(n, b"".join(rs[j * len(rs) // 40:(j + 1) * len(rs) // 40]))
        live.tick()
    live.tick(final=True)
    storage = {"node": "storage", "role": "object"}
    hop = {"src_role": "proxy", "dst_role": "object"}
    for name, labels in (("promreflex_swift_node_processing_seconds_count", storage),
                         ("promreflex_swift_hop_transit_seconds_count", hop)):
        assert live_reg.get_sample_value(name, labels) == reg.get_sample_value(name, labels) > 0, name
    n = live_reg.get_sample_value("promreflex_swift_hop_transit_seconds_count", hop)
    mean = live_reg.get_sample_value("promreflex_swift_hop_transit_seconds_sum", hop) / n
    assert mean == pytest.approx(20e-6, abs=1e-6)  # the true transit on both sides of the step
    offline = reg.get_sample_value("promreflex_swift_node_processing_seconds_sum", storage)
    assert live_reg.get_sample_value("promreflex_swift_node_processing_seconds_sum", storage) == pytest.approx(offline, rel=1e-3)


# -- M5: every packet recorded twice -------------------------------------------------------------

def _records(data: bytes) -> tuple[bytes, list[bytearray]]:
    out, off = [], 24
    while off + 16 <= len(data):
        cap = struct.unpack_from("<I", data, off + 8)[0]
        out.append(bytearray(data[off:off + 16 + cap]))
        off += 16 + cap
    return data[:24], out


def _doubled(path: Path, after_ns: int = 3_000) -> int:
    """Every record of a (nanosecond) pcap twice, the copy ``after_ns`` later (a bridge + veth)."""
    head, recs = _records(path.read_bytes())
    out = []
    for r in recs:
        copy = bytearray(r)
        sec, ns = struct.unpack_from("<II", copy, 0)
        struct.pack_into("<II", copy, 0, *divmod(sec * S + ns + after_ns, S))
        out += [r, copy]
    path.write_bytes(head + b"".join(out))
    return len(recs)


def test_duplicated_records_are_collapsed_and_counted(tmp_path: Path) -> None:
    net = SynthNet(dict(NODES))
    t = T0
    for i in range(20):
        t = swift_put(net, t, f"tx{i:04d}", lose_first=i == 3) + 5 * MS  # one real retransmission
    (tmp_path / "clean").mkdir()
    (tmp_path / "dup").mkdir()
    clean = analyze(net.write(tmp_path / "clean"), _roles()).summary()
    paths = net.write(tmp_path / "dup")
    copies = _doubled(paths["proxy"])
    dup = analyze(paths, _roles()).summary()
    assert dup["read"]["proxy"]["duplicate"] == copies and dup["read"]["proxy"]["packets"] == 2 * copies
    assert dup["read"]["proxy"]["segments"] == copies and dup["read"]["proxy"]["rejected"] == {}
    assert dup["read"]["client"]["duplicate"] == 0
    assert clean["matching"]["matched_ambiguous"] == 1  # the retransmitted segment
    for key in ("matching", "hops", "retransmissions", "processing_by_role", "exchanges", "joins"):
        assert dup[key] == clean[key], key
    assert dup["retransmissions"] == {"client->proxy": 1}


def test_only_copies_are_duplicates() -> None:
    """Same segment and IP id within 1 ms: a copy. A new IP id (a retransmission) or more than
    1 ms later: kept. Copies split over two chunks of a stream are found too."""
    def pkt(ipid: int) -> bytes:
        return tcp_packet("10.200.9.10", "10.200.9.20", 40000, 8080, 1000, 5000, PSH | ACK, b"abc", ip_id=ipid)

    def rec(ts: int, frame: bytes) -> bytes:
        return struct.pack("<IIII", *divmod(ts, S), len(frame), len(frame)) + frame

    head = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
    recs = [rec(T0, pkt(7)), rec(T0 + 5_000, pkt(7)),  # copy
            rec(T0 + 9_000, pkt(8)),  # the same segment sent again: a new IP id
            rec(T0 + 10_000, pkt(7)),  # a copy of a copy's copy (the chain of copies 5 us apart)
            rec(T0 + 2 * MS, pkt(7)),  # same id, 2 ms after the last copy: not a copy
            rec(T0 + 2 * MS + 1, pkt(7))]  # ... but this one is
    data = head + b"".join(recs)
    segs, stats = read_capture_bytes(data)
    assert stats.duplicate == 3 and stats.segments == 3 and stats.packets == 6
    assert [int(x) for x in segs.ipid] == [7, 8, 7] and int(segs.ts[2]) == T0 + 2 * MS
    for step in (1, 7, len(recs[0]) + 3):
        p = StreamParser()
        n = sum(len(p.feed(data[i:i + step])) for i in range(0, len(data), step))
        assert (n, p.stats.duplicate) == (3, 3), step


def test_copies_found_among_packets_that_differ_only_in_address() -> None:
    """Packets alike in everything but the address (the duplicate key leaves it out) interleaved
    with their copies: each copy is still found (sorted by every field, not by the key alone)."""
    def rec(ts: int, dst: str) -> bytes:
        frame = tcp_packet("10.200.9.10", dst, 40000, 8080, 1000, 5000, ACK, ip_id=9)
        return struct.pack("<IIII", *divmod(ts, S), len(frame), len(frame)) + frame

    head = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
    data = head + b"".join(rec(T0 + k * 1_000, dst) for k, dst in enumerate(
        ["10.200.9.20", "10.200.9.21", "10.200.9.20", "10.200.9.21", "10.200.9.22"]))
    segs, stats = read_capture_bytes(data)
    assert stats.duplicate == 2 and len(segs) == 3


def read_capture_bytes(data: bytes):
    p = StreamParser()
    segs = p.feed(data, whole_file=True)
    p.close()
    return segs, p.stats


def test_duplicates_in_metrics_offline_and_live(tmp_path: Path) -> None:
    paths = _net(4).write(tmp_path)
    copies = _doubled(paths["proxy"])
    b = analyze(paths, _roles())
    reg = CollectorRegistry()
    SwiftTimingCollector(b.nodes, registry=reg).add(b)
    assert reg.get_sample_value("promreflex_swift_packets_duplicate_total", {"node": "proxy"}) == copies
    assert reg.get_sample_value("promreflex_swift_packets_duplicate_total", {"node": "client"}) == 0

    live_reg = CollectorRegistry()
    live = LiveAnalyzer(list(paths), _roles(), SwiftTimingCollector(list(paths), registry=live_reg),
                        grace_s=0.2, keep_s=5)
    assert live_reg.get_sample_value("promreflex_swift_packets_duplicate_total", {"node": "proxy"}) == 0
    for n, p in paths.items():
        data = p.read_bytes()
        for i in range(0, len(data), 999):
            live.feed(n, data[i:i + 999])
    live.tick(final=True)
    assert live_reg.get_sample_value("promreflex_swift_packets_duplicate_total", {"node": "proxy"}) == copies
    for name, labels in (("promreflex_swift_hop_transit_seconds_count", {"src_role": "proxy", "dst_role": "object"}),
                         ("promreflex_swift_retransmissions_total", {"src_role": "proxy", "dst_role": "object"})):
        assert live_reg.get_sample_value(name, labels) == reg.get_sample_value(name, labels), name


# -- M9: empty and tiny records --------------------------------------------------------------------

def _frames(n: int = 40) -> list[tuple[int, bytes]]:
    out = []
    for i in range(n):
        payload = b"GET /v1/AUTH_t/c HTTP/1.1\r\n\r\n" if i % 4 == 0 else b"z" * (i % 9)
        out.append((T0 + i * 1_000_003, tcp_packet("10.200.9.10", "10.200.9.20", 40000 + i % 3, 8080, 1000 + i,
                                                  5000 + i, PSH | ACK, payload, ip_id=i)))
    return out


def _same(a: pcap.Segments, b: pcap.Segments) -> None:
    for name in ("ts", "src", "dst", "sport", "dport", "seq", "ack", "flags", "win", "plen", "tok"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert dict(a.heads) == dict(b.heads)


ARP = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28  # 42 bytes: not IP
SHORT_IP = tcp_packet("10.200.9.10", "10.200.9.20", 1, 2, 3, 4, ACK)[:40]  # cut inside TCP
TINY = [b"", ARP, SHORT_IP, b"\x01"]


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("batch", [None, 1, 7])
def test_tiny_records_counted_as_before_and_batches_change_nothing(tmp_path: Path, monkeypatch, fmt: str,
                                                                     batch: int | None) -> None:
    good = _frames()
    mixed = []
    for i, (ts, frame) in enumerate(good):
        mixed.append((ts, frame))
        mixed.append((ts + 1, TINY[i % len(TINY)]))
    write = write_pcapng if fmt == "pcapng" else write_pcap
    write(tmp_path / "good", good)
    write(tmp_path / "mixed", mixed)
    ref, ref_stats = read_capture(tmp_path / "good")
    if batch is not None:
        monkeypatch.setattr(pcap, "FRAME_BATCH", batch)
    segs, stats = read_capture(tmp_path / "mixed")
    _same(segs, ref)
    assert stats.packets == 80 and stats.segments == 40
    # as the decoder counted them when they were framed like any other record
    assert stats.rejected == {"snaplen_headers": 30, "non_ip": 10}
    p = StreamParser()
    data = (tmp_path / "mixed").read_bytes()
    parts = [p.feed(data[i:i + 61]) for i in range(0, len(data), 61)]
    _same(pcap.Segments.concat(parts), ref)
    assert p.stats.rejected == stats.rejected


def test_empty_records_cost_no_copy_each(tmp_path: Path) -> None:
    """A pcap header and 100 MB of zeros is 6.5 M empty records: each was copied (a 112-byte
    slice, ~24x the file in memory). Now they are counted in place, in bounded batches."""
    n = 300_000
    path = tmp_path / "zeros.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + bytes(16 * n))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        segs, stats = read_capture(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(segs) == 0 and stats.packets == n and stats.rejected == {"snaplen_headers": n}
    assert peak < size + 16_000_000, peak  # the file, once, and a batch's arrays (16.2 MB; it was 108 MB)


def test_pcapng_interfaces_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(pcap, "MAX_IFACES", 3)

    def block(btype: int, body: bytes) -> bytes:
        body += bytes(-len(body) % 4)
        return struct.pack("<II", btype, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    frames = [tcp_packet("10.200.9.10", "10.200.9.20", 1, 2, 3 + i, 4, ACK) for i in range(5)]
    data = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    data += b"".join(block(1, struct.pack("<HHI", 1, 0, 65535)) for _ in range(5))  # the last 2: too many
    data += b"".join(block(6, struct.pack("<IIIII", i, 0, 1000, len(f), len(f)) + f) for i, f in enumerate(frames))
    segs, stats = read_capture_bytes(data)
    assert len(segs) == 3 and stats.rejected == {"corrupt": 2, "linktype": 2}
