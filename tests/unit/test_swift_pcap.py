"""The capture reader: pcap (ns, us, both byte orders), pcapng, streams, and bad input counted."""

from __future__ import annotations

import struct
from pathlib import Path

import dpkt
import numpy as np
import pytest

from exporters.swift.pcap import (
    ACK, PSH, SYN, TOK_INTERIM, TOK_REQUEST, TOK_RESPONSE, CaptureError, StreamParser, read_capture,
)
from exporters.swift.synth import NODES, SynthNet, swift_put, tcp_packet, write_pcap, write_pcapng

T0 = 1_795_448_405_123_456_789


def _packets(n: int = 50) -> list[tuple[int, bytes]]:
    out = []
    for i in range(n):
        payload = b"GET /v1/AUTH_t/c HTTP/1.1\r\n\r\n" if i % 5 == 0 else b"z" * (i % 7)
        out.append((T0 + i * 1_234_567, tcp_packet("10.200.9.10", "10.200.9.20", 40000 + i % 3, 8080, 1000 + i,
                                                   5000 + i, PSH | ACK, payload)))
    return out


def _dpkt_fields(path: Path) -> list[tuple[int, int, int, int]]:
    """Reference decode with dpkt (per packet, pure Python): ts (us), sport, seq, payload length."""
    with open(path, "rb") as f:
        out = []
        for ts, buf in dpkt.pcap.Reader(f):
            tcp = dpkt.ethernet.Ethernet(buf).data.data
            out.append((int(round(float(ts) * 1e6)), tcp.sport, tcp.seq, len(tcp.data)))
        return out


@pytest.mark.parametrize("nano", [True, False])
def test_pcap_fields_match_dpkt(tmp_path: Path, nano: bool) -> None:
    path = tmp_path / "a.pcap"
    write_pcap(path, _packets(), nano=nano)
    segs, stats = read_capture(path)
    ref = _dpkt_fields(path)
    assert stats.packets == len(ref) == len(segs) == 50
    assert sum(stats.rejected.values()) == 0
    assert [int(x) for x in segs.sport] == [r[1] for r in ref]
    assert [int(x) for x in segs.seq] == [r[2] for r in ref]
    assert [int(x) for x in segs.plen] == [r[3] for r in ref]
    assert np.all(np.abs(segs.ts // 1000 - np.array([r[0] for r in ref])) <= 1)
    expected = T0 if nano else T0 // 1000 * 1000
    assert int(segs.ts[0]) == expected
    assert int(segs.tok[0]) == TOK_REQUEST and segs.heads[0].startswith(b"GET /v1/")


def test_pcap_big_endian(tmp_path: Path) -> None:
    pkt = tcp_packet("10.200.9.10", "10.200.9.20", 1, 2, 3, 4, SYN)
    data = struct.pack(">IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1) + struct.pack(">IIII", 10, 5, len(pkt), len(pkt)) + pkt
    path = tmp_path / "be.pcap"
    path.write_bytes(data)
    segs, stats = read_capture(path)
    assert len(segs) == 1 and int(segs.ts[0]) == 10_000_000_005 and int(segs.seq[0]) == 3


@pytest.mark.parametrize("resol", [6, 9])
def test_pcapng_same_as_pcap(tmp_path: Path, resol: int) -> None:
    pk = _packets()
    write_pcap(tmp_path / "a.pcap", pk)
    write_pcapng(tmp_path / "a.pcapng", pk, tsresol=resol)
    a, _ = read_capture(tmp_path / "a.pcap")
    b, stats = read_capture(tmp_path / "a.pcapng")
    assert stats.packets == 50 and not stats.rejected
    assert np.array_equal(a.seq, b.seq) and np.array_equal(a.plen, b.plen)
    unit = 10 ** (9 - resol)
    assert np.array_equal(a.ts // unit * unit, b.ts)


def test_stream_in_small_chunks_equals_whole_file(tmp_path: Path) -> None:
    net = SynthNet(dict(NODES))
    swift_put(net, T0, "tx1", body=b"b" * 70_000)
    paths = net.write(tmp_path)
    data = paths["proxy"].read_bytes()
    whole, _ = read_capture(paths["proxy"])
    p = StreamParser()
    parts = [p.feed(data[i:i + 333]) for i in range(0, len(data), 333)]
    p.close()
    got = np.concatenate([s.seq for s in parts])
    assert np.array_equal(got, whole.seq)
    assert p.stats.packets == len(whole) and not p.stats.rejected


def test_truncated_capture_keeps_what_came_before(tmp_path: Path) -> None:
    path = tmp_path / "t.pcap"
    write_pcap(path, _packets())
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # cut inside the last record
    segs, stats = read_capture(path)
    assert len(segs) == 49 and stats.rejected["truncated"] == 1
    path.write_bytes(data[:30])  # header + part of a record header
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["truncated"] == 1


def test_snaplen_cut_headers_rejected_payload_cut_kept(tmp_path: Path) -> None:
    big = tcp_packet("10.200.9.10", "10.200.9.20", 1, 8080, 7, 8, PSH | ACK, b"PUT /x HTTP/1.1\r\n" + b"a" * 500)
    path = tmp_path / "s.pcap"
    write_pcap(path, [(T0, big)], snaplen=80)  # headers (54 bytes) whole, payload cut
    segs, stats = read_capture(path)
    assert len(segs) == 1 and int(segs.plen[0]) == 517 and stats.snapped == 1 and int(segs.tok[0]) == TOK_REQUEST
    write_pcap(path, [(T0, big)], snaplen=40)  # cut inside the TCP header
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["snaplen_headers"] == 1


def test_non_tcp_and_non_ip_counted(tmp_path: Path) -> None:
    tcp = tcp_packet("10.200.9.10", "10.200.9.20", 1, 2, 3, 4, SYN)
    udp = bytearray(tcp)
    udp[14 + 9] = 17  # protocol UDP
    arp = tcp[:12] + b"\x08\x06" + tcp[14:]
    frag = bytearray(tcp)
    frag[14 + 6:14 + 8] = b"\x20\x10"  # more fragments + offset
    path = tmp_path / "m.pcap"
    write_pcap(path, [(T0, tcp), (T0 + 1, bytes(udp)), (T0 + 2, arp), (T0 + 3, bytes(frag))])
    segs, stats = read_capture(path)
    assert len(segs) == 1
    assert stats.rejected["non_tcp"] == 1 and stats.rejected["non_ip"] == 1 and stats.rejected["ip_fragment"] == 1


def test_unsupported_linktype_and_corrupt_record(tmp_path: Path) -> None:
    path = tmp_path / "l.pcap"
    write_pcap(path, _packets(3), linktype=147)
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["linktype"] == 3
    write_pcap(path, _packets(3))
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 24 + 8, 10_000_000)  # first record claims 10 MB
    path.write_bytes(bytes(data))
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["corrupt"] == 1


def test_clock_backwards_counted_not_dropped(tmp_path: Path) -> None:
    pk = _packets(10)
    pk[5] = (pk[5][0] - 5_000_000_000, pk[5][1])  # a 5 s step back
    path = tmp_path / "c.pcap"
    write_pcap(path, pk)
    segs, stats = read_capture(path)
    assert len(segs) == 10 and stats.rejected["clock_backwards"] == 1


def test_not_a_capture_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    path.write_bytes(b"hello world, not a capture")
    with pytest.raises(CaptureError):
        read_capture(path)
    path.write_bytes(b"")
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["truncated"] == 1


def test_interim_and_final_responses(tmp_path: Path) -> None:
    cont = tcp_packet("10.200.9.30", "10.200.9.20", 6200, 4000, 1, 1, PSH | ACK, b"HTTP/1.1 100 Continue\r\n\r\n")
    final = tcp_packet("10.200.9.30", "10.200.9.20", 6200, 4000, 26, 1, PSH | ACK, b"HTTP/1.1 201 Created\r\n\r\n")
    path = tmp_path / "r.pcap"
    write_pcap(path, [(T0, cont), (T0 + 1, final)])
    segs, _ = read_capture(path)
    assert [int(t) for t in segs.tok] == [TOK_INTERIM, TOK_RESPONSE]


def test_pcapng_truncated_simple_blocks_and_bad_interface(tmp_path: Path) -> None:
    path = tmp_path / "b.pcapng"
    write_pcapng(path, _packets(5))
    data = path.read_bytes()
    pkt = tcp_packet("10.200.9.10", "10.200.9.20", 1, 2, 3, 4, SYN)
    spb = struct.pack("<III", 3, 16 + len(pkt) + (-len(pkt) % 4), len(pkt)) + pkt + b"\0" * (-len(pkt) % 4)
    spb += struct.pack("<I", 16 + len(pkt) + (-len(pkt) % 4))
    body = struct.pack("<IIIII", 7, 0, 0, len(pkt), len(pkt)) + pkt + b"\0" * (-len(pkt) % 4)  # interface 7
    epb = struct.pack("<II", 6, len(body) + 12) + body + struct.pack("<I", len(body) + 12)
    path.write_bytes(data + spb + epb + epb[:20])  # then a block cut short
    segs, stats = read_capture(path)
    assert len(segs) == 5
    assert stats.rejected["no_timestamp"] == 1 and stats.rejected["linktype"] == 1
    assert stats.rejected["truncated"] == 1


def _insert_block(data: bytes, after_blocks: int, btype: int, body: bytes, trailer: int | None = None) -> bytes:
    """``data`` (little-endian pcapng) with one block inserted after its first ``after_blocks`` blocks."""
    off = 0
    for _ in range(after_blocks):
        off += struct.unpack_from("<I", data, off + 4)[0]
    n = len(body) + 12
    return data[:off] + struct.pack("<II", btype, n) + body + struct.pack("<I", trailer or n) + data[off:]


def test_a_big_block_that_is_not_a_packet_is_skipped(tmp_path: Path) -> None:
    """``editcap --inject-secrets`` adds a Decryption Secrets Block as big as the key log (a
    stranger's 264 kB one made the whole capture one ``corrupt`` rejection, read as 0 packets)."""
    path = tmp_path / "dsb.pcapng"
    write_pcapng(path, _packets(5))
    secrets = b"CLIENT_RANDOM " + b"ab" * 160_000 + b"\n"
    dsb = struct.pack("<II", 0x544C534B, len(secrets)) + secrets + b"\0" * (-len(secrets) % 4)
    data = _insert_block(path.read_bytes(), 3, 0x0000000A, dsb)  # after SHB, IDB, the first packet
    path.write_bytes(data)
    segs, stats = read_capture(path)
    assert len(segs) == 5 and not stats.rejected
    for size in (1000, 65_536, 200_001):  # streamed: the block is skipped across chunks, not buffered
        p = StreamParser()
        n = sum(len(p.feed(data[i:i + size])) for i in range(0, len(data), size))
        p.close()
        assert n == 5 and not p.stats.rejected, size
        assert p._skip == 0 and p._trailer is None
    # A block whose trailing length disagrees is damage: corrupt, and what came before is kept.
    path.write_bytes(_insert_block(path.read_bytes()[:len(data)], 3, 0x0000000A, dsb, trailer=12))
    segs, stats = read_capture(path)
    assert len(segs) == 1 and stats.rejected["corrupt"] == 1
    # Cut inside the big block: truncated.
    path.write_bytes(data[:len(data) // 2])
    segs, stats = read_capture(path)
    assert len(segs) == 1 and stats.rejected["truncated"] == 1
    # A block of another type that long is damage, at once: 8 flipped bytes in a live stream
    # (an unknown type, a length of a gigabyte) must not make the reader wait for a gigabyte.
    write_pcapng(path, _packets(3))
    good = path.read_bytes()
    off = struct.unpack_from("<I", good, 4)[0] + struct.unpack_from("<I", good, struct.unpack_from("<I", good, 4)[0] + 4)[0]
    damaged = good[:off] + struct.pack("<II", 0x0BADBEEF, 1 << 30) + good[off + 8:]
    p = StreamParser()
    n = sum(len(p.feed(damaged[i:i + 4096])) for i in range(0, len(damaged), 4096))
    assert n == 0 and p.stats.rejected["corrupt"] == 1 and p._skip == 0
    # A packet block that big is still damage (no capture has one).
    write_pcapng(path, _packets(2))
    path.write_bytes(_insert_block(path.read_bytes(), 3, 6, struct.pack("<IIIII", 0, 0, 0, 8, 8) + b"x" * 300_000))
    segs, stats = read_capture(path)
    assert len(segs) == 1 and stats.rejected["corrupt"] == 1


def test_vlan_and_linux_cooked_frames(tmp_path: Path) -> None:
    eth = tcp_packet("10.200.9.10", "10.200.9.20", 5, 6, 7, 8, ACK, b"hello")
    vlan = eth[:12] + b"\x81\x00\x00\x05" + eth[12:]
    sll2 = b"\x08\x00\x00\x00" + b"\x00" * 16 + eth[14:]  # protocol, reserved, ifindex, ... (20 bytes)
    write_pcap(tmp_path / "v.pcap", [(T0, vlan)])
    write_pcap(tmp_path / "s.pcap", [(T0, sll2)], linktype=276)
    for name in ("v.pcap", "s.pcap"):
        segs, stats = read_capture(tmp_path / name)
        assert len(segs) == 1 and int(segs.seq[0]) == 7 and int(segs.plen[0]) == 5, name


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_damaged_captures_never_crash_the_reader_or_the_analysis(tmp_path: Path, fmt: str) -> None:
    """Random byte flips and cuts anywhere after the file header: every outcome is counted
    segments and rejections, never an exception (fixed seed: reproducible)."""
    import random

    from exporters.swift.analyze import analyze
    from exporters.swift.roles import RoleMap
    from exporters.swift.synth import roles_mapping

    net = SynthNet(dict(NODES))
    swift_put(net, T0, "tx1", body=b"q" * 5000)
    paths = net.write(tmp_path, fmt=fmt)
    good = paths["proxy"].read_bytes()
    rng = random.Random(4)
    roles = RoleMap()
    roles.add_mapping_dict(roles_mapping())
    for trial in range(60):
        data = bytearray(good)
        for _ in range(rng.randint(1, 30)):
            data[rng.randrange(32, len(data))] = rng.randrange(256)
        if trial % 3 == 0:
            data = data[:rng.randrange(32, len(data))]
        bad = tmp_path / f"bad.{fmt}"
        bad.write_bytes(bytes(data))
        segs, stats = read_capture(bad)
        assert stats.packets >= len(segs)
        analyze({"client": paths["client"], "proxy": bad, "storage": paths["storage"]}, roles)


# -- link layers from other people's captures (a stranger's review, findings 4, 5, 3, 7) --------

_MACS = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01"


def _ip_packets(n: int = 3, payload: bytes = b"GET /v1/AUTH_t/c HTTP/1.1\r\n\r\n") -> list[bytes]:
    """IPv4 + TCP packets (no link header): the Ethernet frames of tcp_packet without their 14 bytes."""
    return [tcp_packet("10.200.9.10", "10.200.9.20", 40000, 8080, 1000 + i, 5000, PSH | ACK, payload)[14:]
            for i in range(n)]


def _sll(proto: int) -> bytes:
    return struct.pack("!HHH8sH", 0, 1, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00", proto)


def _sll2(proto: int) -> bytes:
    return struct.pack("!HHIHBB8s", proto, 0, 2, 1, 0, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00")


def _tag(tpid: int, vid: int = 100) -> bytes:
    return struct.pack("!HH", tpid, vid)


_TAGGED = {  # name: (link type, link header + tags up to the IPv4 ethertype)
    "qinq_88a8": (1, _MACS + _tag(0x88A8, 10) + _tag(0x8100) + b"\x08\x00"),
    "qinq_8100x2": (1, _MACS + _tag(0x8100, 10) + _tag(0x8100) + b"\x08\x00"),
    "vlan_9100": (1, _MACS + _tag(0x9100) + b"\x08\x00"),
    "vlan_88a8": (1, _MACS + _tag(0x88A8) + b"\x08\x00"),
    # tcpdump -i any on a VLAN-offloaded device: the cooked protocol is 0x8100, then TCI and type
    "sll_vlan": (113, _sll(0x8100) + struct.pack("!HH", 100, 0x0800)),
    "sll2_vlan": (276, _sll2(0x8100) + struct.pack("!HH", 100, 0x0800)),
}


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("name", sorted(_TAGGED))
def test_vlan_tags_decoded(tmp_path: Path, name: str, fmt: str) -> None:
    link, head = _TAGGED[name]
    ips = _ip_packets()
    packets = [(T0 + i * 1000, head + p) for i, p in enumerate(ips)]
    path = tmp_path / f"{name}.{fmt}"
    (write_pcap if fmt == "pcap" else write_pcapng)(path, packets, linktype=link)
    segs, stats = read_capture(path)
    assert dict(stats.rejected) == {} and stats.segments == 3, stats
    assert [int(x) for x in segs.seq] == [1000, 1001, 1002]
    assert all(int(p) == 29 for p in segs.plen) and int(segs.tok[0]) == TOK_REQUEST
    assert segs.heads[0].startswith(b"GET /v1/")


def test_vlan_tags_mixed_with_untagged_and_other_links(tmp_path: Path) -> None:
    # One pcapng, interfaces of three link types (the vectorised decode's mixed path), tagged
    # and untagged packets interleaved; a third tag is beyond what is read: non_ip.
    frames = [(1, _MACS + b"\x08\x00"), (1, _MACS + _tag(0x88A8) + _tag(0x8100) + b"\x08\x00"),
              (113, _sll(0x8100) + struct.pack("!HH", 7, 0x0800)), (113, _sll(0x0800)),
              (101, b""), (1, _MACS + _tag(0x8100) + b"\x08\x00"),
              (1, _MACS + _tag(0x88A8) + _tag(0x8100) + _tag(0x8100) + b"\x08\x00")]
    links = [1, 113, 101]

    def block(btype: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        return struct.pack("<II", btype, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    out = [block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))]
    out += [block(1, struct.pack("<HHI", lk, 0, 65535)) for lk in links]
    ips = _ip_packets(len(frames))
    for i, (lk, head) in enumerate(frames):
        data = head + ips[i]
        ts = T0 // 1000 + i
        out.append(block(6, struct.pack("<IIIII", links.index(lk), ts >> 32, ts & 0xFFFFFFFF, len(data), len(data))
                         + data))
    path = tmp_path / "mixed.pcapng"
    path.write_bytes(b"".join(out))
    segs, stats = read_capture(path)
    assert dict(stats.rejected) == {"non_ip": 1} and stats.segments == 6, stats
    assert [int(x) for x in segs.seq] == [1000, 1001, 1002, 1003, 1004, 1005]
    assert all(int(p) == 29 for p in segs.plen)


def _null(family: int, order: str) -> bytes:
    return struct.pack(order + "I", family)


@pytest.mark.parametrize("link,head,order", [
    (0, _null(2, "<"), "<"),  # DLT_NULL: the family in the writer's byte order (a little-endian host)
    (0, _null(2, ">"), ">"),  # ... a big-endian one
    (108, _null(2, ">"), "<"),  # DLT_LOOP: network byte order, in a little-endian file
    (14, b"", "<"),  # DLT_RAW, OpenBSD's value
])
def test_bsd_loopback_and_openbsd_raw_decoded(tmp_path: Path, link: int, head: bytes, order: str) -> None:
    ips = _ip_packets()
    out = [struct.pack(order + "IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, link)]
    for i, p in enumerate(ips):
        data = head + p
        out.append(struct.pack(order + "IIII", T0 // 10**9, i, len(data), len(data)) + data)
    path = tmp_path / "loop.pcap"
    path.write_bytes(b"".join(out))
    segs, stats = read_capture(path)
    assert dict(stats.rejected) == {} and stats.segments == 3, stats
    assert [int(x) for x in segs.seq] == [1000, 1001, 1002] and int(segs.plen[0]) == 29


_IP6 = struct.pack("!IHBB16s16s", 0x60000000, 20, 6, 64, b"\x00" * 16, b"\x00" * 16) + b"\x00" * 40


def test_ipv6_is_counted_as_ipv6_not_as_non_ip(tmp_path: Path) -> None:
    """IPv6 is not decoded, but it is IP: a reason of its own (Swift rings may be IPv6), on a BSD
    loopback (family 30), Ethernet (0x86DD) and raw IP; ARP stays non_ip."""
    write_pcap(tmp_path / "v6.pcap", [(T0, _null(30, "<") + _IP6), (T0 + 1, _null(2, "<") + _ip_packets(1)[0])],
               linktype=0)
    segs, stats = read_capture(tmp_path / "v6.pcap")
    assert dict(stats.rejected) == {"ipv6": 1} and stats.segments == 1
    arp = _MACS + b"\x08\x06" + b"\x00" * 28
    write_pcap(tmp_path / "eth.pcap", [(T0, _MACS + b"\x86\xdd" + _IP6), (T0 + 1, arp)])
    segs, stats = read_capture(tmp_path / "eth.pcap")
    assert dict(stats.rejected) == {"ipv6": 1, "non_ip": 1} and stats.segments == 0
    write_pcap(tmp_path / "raw.pcap", [(T0, _IP6), (T0 + 1, _ip_packets(1)[0])], linktype=101)
    segs, stats = read_capture(tmp_path / "raw.pcap")
    assert dict(stats.rejected) == {"ipv6": 1} and stats.segments == 1


def test_a_syn_whose_options_the_snap_length_cut_is_kept(tmp_path: Path) -> None:
    """tcpdump -s 68 (its old default): a SYN's 20 bytes of options are cut, its fixed header is
    whole: kept (connections are counted from SYNs), not rejected as snaplen_headers."""
    syn = bytearray(tcp_packet("10.200.9.10", "10.200.9.20", 40000, 8080, 7, 0, SYN, b"\x02\x04\x05\xb4" * 5))
    syn[14 + 20 + 12] = 10 << 4  # data offset 40: the 20 bytes are options
    write_pcap(tmp_path / "s.pcap", [(T0, bytes(syn))], snaplen=68)
    segs, stats = read_capture(tmp_path / "s.pcap")
    assert len(segs) == 1 and int(segs.flags[0]) == SYN and int(segs.plen[0]) == 0 and not stats.rejected


def test_pcap_link_type_with_fcs_bits(tmp_path: Path) -> None:
    # A DAG card's header: the FCS flag (0x04000000) and an FCS length of 4 above the link type;
    # every frame ends with its 4 FCS bytes.
    packets = [(T0 + i, _MACS + b"\x08\x00" + p + b"\xde\xad\xbe\xef") for i, p in enumerate(_ip_packets())]
    write_pcap(tmp_path / "fcs.pcap", packets, linktype=0x14000001)
    segs, stats = read_capture(tmp_path / "fcs.pcap")
    assert dict(stats.rejected) == {} and stats.segments == 3
    assert [int(x) for x in segs.plen] == [29, 29, 29]


def test_not_a_capture_error_names_the_file_and_gzip(tmp_path: Path) -> None:
    import gzip

    good = tmp_path / "good.pcap"
    write_pcap(good, _packets(5))
    gz = tmp_path / "proxy.pcap.gz"
    gz.write_bytes(gzip.compress(good.read_bytes()))
    with pytest.raises(CaptureError) as e:
        read_capture(gz)
    assert str(e.value).startswith("not a pcap or pcapng capture") and str(gz) in str(e.value)
    assert "gzip" in str(e.value) and "decompress" in str(e.value)
    text = tmp_path / "notes.txt"
    text.write_text("hello world\n")
    with pytest.raises(CaptureError) as e:
        read_capture(text)
    assert str(text) in str(e.value) and "gzip" not in str(e.value)


def test_cli_names_the_capture_that_is_not_one(tmp_path: Path, capsys) -> None:
    import gzip

    from exporters.swift.cli import main

    good = tmp_path / "good.pcap"
    write_pcap(good, _packets(5))
    gz = tmp_path / "proxy.pcap.gz"
    gz.write_bytes(gzip.compress(good.read_bytes()))
    assert main(["analyze", f"--capture=client={good}", f"--capture=proxy={gz}"]) == 1
    err = capsys.readouterr().err
    assert f"--capture proxy={gz}: not a pcap or pcapng capture" in err and "gzip" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_big_tcp_payload_length_from_original_length(tmp_path: Path, fmt: str) -> None:
    # IPv4 BIG TCP (IP total length 0) cut by a 512-byte snap length: the payload length is the
    # record's original length minus the headers, not the captured length's (458).
    payload = b"PUT /v1/AUTH_t/c/o HTTP/1.1\r\n" + b"x" * (150_000 - 29)
    frame = tcp_packet("10.200.9.10", "10.200.9.20", 40000, 6200, 1000, 5000, PSH | ACK, payload, ip_len=0)
    path = tmp_path / f"big.{fmt}"
    if fmt == "pcap":
        write_pcap(path, [(T0, frame)], snaplen=512)
    else:
        write_pcapng(path, [(T0, frame)])
        data = bytearray(path.read_bytes())  # cut the EPB to 512 bytes, keeping orig_len
        shb_len = struct.unpack_from("<I", data, 4)[0]
        idb_len = struct.unpack_from("<I", data, shb_len + 4)[0]
        epb = shb_len + idb_len
        body = bytes(data[epb + 8:epb + 28])
        ifid, hi, lo, _cap, orig = struct.unpack("<IIIII", body)
        blen = 28 + 512 + 4
        data = data[:epb] + struct.pack("<IIIIIII", 6, blen, ifid, hi, lo, 512, orig) + frame[:512] \
            + struct.pack("<I", blen)
        path.write_bytes(bytes(data))
    segs, stats = read_capture(path)
    assert dict(stats.rejected) == {} and stats.segments == 1
    assert int(segs.plen[0]) == 150_000 and stats.snapped == 1
    assert int(segs.tok[0]) == TOK_REQUEST


def test_a_big_tcp_length_no_kernel_sends_is_damage(tmp_path: Path) -> None:
    """The original length is the file's word: a 'BIG TCP' record claiming 4 GiB is bad_header,
    not a segment that long (a review of the change that read it)."""
    frame = tcp_packet("10.200.9.10", "10.200.9.20", 40000, 6200, 1000, 5000, PSH | ACK, b"x" * 400, ip_len=0)
    path = tmp_path / "claim.pcap"
    write_pcap(path, [(T0, frame)], snaplen=512)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 24 + 12, 0xFFFFFFF0)  # the record's original length
    path.write_bytes(bytes(data))
    segs, stats = read_capture(path)
    assert len(segs) == 0 and stats.rejected["bad_header"] == 1


def test_a_capture_that_gives_nothing_is_said(tmp_path: Path) -> None:
    """Empty, header only, all IPv6, headers cut, files joined with cat: the analysis says why
    (it gave an empty breakdown, exit 0, nothing on stderr)."""
    from exporters.swift.analyze import capture_note

    syn = tcp_packet("10.200.9.10", "10.200.9.20", 40000, 8080, 7, 0, SYN)
    files = {
        "empty": b"",
        "header": None,
        "v6": [(T0, _MACS + b"\x86\xdd" + _IP6)],
        "cut": [(T0, syn)],
    }
    notes = {}
    for name, packets in files.items():
        path = tmp_path / f"{name}.pcap"
        if packets == b"":
            path.write_bytes(b"")
        else:
            write_pcap(path, packets or [], snaplen=30 if name == "cut" else 65535)
        _, stats = read_capture(path)
        notes[name] = capture_note(name, stats)
    assert "no packet in it" in notes["empty"] and "no packet in it" in notes["header"]
    assert "IPv6 is not decoded" in notes["v6"]
    assert "-s 96 or more" in notes["cut"]
    write_pcap(tmp_path / "a.pcap", [(T0, syn)])
    (tmp_path / "cat.pcap").write_bytes((tmp_path / "a.pcap").read_bytes() * 2)  # cat a.pcap a.pcap
    segs, stats = read_capture(tmp_path / "cat.pcap")
    assert len(segs) == 1 and "mergecap" in (capture_note("cat", stats) or "")
    _, stats = read_capture(tmp_path / "a.pcap")
    assert capture_note("a", stats) is None


def test_interfaces_of_a_pcapng_interleaving_out_of_order_are_no_clock_step(tmp_path: Path) -> None:
    """dumpcap -i eth0 -i eth1 writes each interface's buffer in turn: the file goes back in
    time by up to a buffer's worth between interfaces, each interface in order. No packet is
    counted clock_backwards (36-75 % were); within one interface a step back still is."""
    from exporters.swift.synth import write_pcapng

    pkts = [tcp_packet("10.200.9.10", "10.200.9.20", 40000 + k, 8080, 1000 + i, 5000, ACK) for i in range(40)
            for k in range(2)]
    stamps = [T0 + i * 1_000_000 for i in range(40) for _ in range(2)]  # 1 ms apart, one per interface
    order = [2 * i + k for block in range(4) for k in range(2) for i in range(10 * block, 10 * block + 10)]
    write_pcapng(tmp_path / "two.pcapng", [(stamps[j], pkts[j]) for j in order], interfaces=[j % 2 for j in order])
    segs, stats = read_capture(tmp_path / "two.pcapng")
    assert len(segs) == 80 and stats.rejected["clock_backwards"] == 0
    write_pcapng(tmp_path / "one.pcapng", [(stamps[j], pkts[j]) for j in order])  # the same order, one interface
    _, stats = read_capture(tmp_path / "one.pcapng")
    assert stats.rejected["clock_backwards"] > 0


def test_a_guessed_address_that_leaves_much_of_the_capture_foreign_is_said(tmp_path: Path) -> None:
    """A proxy with a client network and a storage network, given no addresses in the roles: the
    most seen address is taken, its other side's segments become foreign (its calls were then
    published as a client's). Said when more than a fifth of the capture is foreign."""
    from exporters.swift.analyze import guessed_address_note
    from exporters.swift.pcap import ip_int

    front = [tcp_packet("10.0.0.9", "10.0.0.20", 40000, 8080, i, 1, ACK) for i in range(6)]
    back = [tcp_packet("10.0.1.20", "10.0.1.31", 41000, 6200, i, 1, ACK) for i in range(4)]
    write_pcap(tmp_path / "p.pcap", [(T0 + i, p) for i, p in enumerate(front + back)])
    segs, _ = read_capture(tmp_path / "p.pcap")
    note = guessed_address_note("proxy", segs, {ip_int("10.0.0.20")})
    assert note and "40% of its segments are between other addresses" in note and "nodes:" in note
    assert guessed_address_note("proxy", segs.take(np.arange(6)), {ip_int("10.0.0.20")}) is None


def test_a_capture_holding_both_ends_of_every_connection_is_said(tmp_path: Path) -> None:
    """tcpdump -i lo on an all-in-one host (Swift's SAIO): no hop, no processing, no word (a
    stranger's review). Said; a node's ordinary capture (its peers elsewhere) is not."""
    from exporters.swift.analyze import both_ends_note
    from exporters.swift.pcap import ip_int

    lo = [tcp_packet("127.0.0.1", "127.0.0.1", 40000 + i, 8080, i, 1, ACK) for i in range(20)]
    write_pcap(tmp_path / "lo.pcap", [(T0 + i, p) for i, p in enumerate(lo)])
    segs, _ = read_capture(tmp_path / "lo.pcap")
    note = both_ends_note("saio", segs, {ip_int("127.0.0.1")})
    assert note and "100% of its segments are between its own addresses" in note
    ordinary = [tcp_packet("10.0.0.9", "10.0.0.20", 40000 + i, 8080, i, 1, ACK) for i in range(20)]
    write_pcap(tmp_path / "n.pcap", [(T0 + i, p) for i, p in enumerate(ordinary)])
    segs, _ = read_capture(tmp_path / "n.pcap")
    assert both_ends_note("proxy", segs, {ip_int("10.0.0.20")}) is None
