"""Synthetic Swift traffic as per-node captures: known delays, clock offsets, losses, offload.

Tests and the decode benchmark need captures whose truth is known: how long each node held a
request, how long each hop took, how far each node's clock is off. :class:`SynthNet` simulates
TCP connections between named nodes (handshake, data segments with their ACKs, FIN) on one true
timeline and writes what each node's capture would hold: its own segments stamped with its own
clock (true time + the node's offset, + a step after ``jump_at``). Writers for pcap (ns or us)
and pcapng are here too (the real capture files are tcpdump's; these mimic them byte for byte
in the fields the reader uses).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from exporters.swift.pcap import ACK, FIN, PSH, SYN, ip_int

MSS = 1448


def tcp_packet(src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int,
               payload: bytes = b"", win: int = 502, ip_len: int | None = None, ip_id: int = 0) -> bytes:
    """An Ethernet + IPv4 + TCP frame (no options)."""
    total = 20 + 20 + len(payload) if ip_len is None else ip_len
    iph = struct.pack("!BBHHHBBHII", 0x45, 0, total & 0xFFFF, ip_id & 0xFFFF, 0x4000, 64, 6, 0, ip_int(src),
                      ip_int(dst))
    tcph = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, win, 0, 0)
    return b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00" + iph + tcph + payload


def write_pcap(path: str | Path, packets: list[tuple[int, bytes]], nano: bool = True, snaplen: int = 65535,
               linktype: int = 1) -> None:
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for ts, data in packets:
        sec, ns = divmod(ts, 1_000_000_000)
        frac = ns if nano else ns // 1000
        cap = data[:snaplen]
        out.append(struct.pack("<IIII", sec, frac, len(cap), len(data)) + cap)
    Path(path).write_bytes(b"".join(out))


def write_pcapng(path: str | Path, packets: list[tuple[int, bytes]], tsresol: int = 9, linktype: int = 1,
                 interfaces: list[int] | None = None) -> None:
    """pcapng: one section, one interface with ``if_tsresol`` 10^-tsresol (``interfaces``: each
    packet's interface id, as many interfaces described as the largest id needs)."""
    def block(btype: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        n = len(body) + 12
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    shb = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    opts = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
    idb = block(1, struct.pack("<HHI", linktype, 0, 65535) + opts)
    ids = interfaces or [0] * len(packets)
    out = [shb, *[idb] * (max(ids, default=0) + 1)]
    for (ts, data), ifid in zip(packets, ids):
        raw = ts // (10 ** (9 - tsresol)) if tsresol <= 9 else ts * 10 ** (tsresol - 9)
        out.append(block(6, struct.pack("<IIIII", ifid, raw >> 32, raw & 0xFFFFFFFF, len(data), len(data)) + data))
    Path(path).write_bytes(b"".join(out))


@dataclass
class Conn:
    net: SynthNet
    a: str  # client node
    b: str  # server node
    aport: int
    bport: int
    seq: dict[str, int] = field(default_factory=dict)
    ip_id: dict[str, int] = field(default_factory=dict)  # per sender: Linux counts per connection


@dataclass
class SynthNet:
    """Nodes (name -> IPv4), a one-way delay per directed hop, clocks, and the captures."""

    nodes: dict[str, str]
    delay_ns: int = 20_000
    hop_delay: dict[tuple[str, str], int] = field(default_factory=dict)
    clock_offset: dict[str, int] = field(default_factory=dict)
    jump_at: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (true time, step ns)
    tso: bool = False  # sender captures hold super-segments, receivers MSS pieces
    # node -> (true time, stamp, frame): written in true-time order, as tcpdump writes what the
    # kernel hands it (a clock stepped back shows as stamps going back, not as reordered packets)
    captures: dict[str, list[tuple[int, int, bytes]]] = field(default_factory=dict)
    next_port: int = 40000

    def clock(self, node: str, t: int) -> int:
        off = self.clock_offset.get(node, 0)
        jump = self.jump_at.get(node)
        if jump and t >= jump[0]:
            off += jump[1]
        return t + off

    def _emit(self, node: str, t: int, pkt: bytes) -> None:
        self.captures.setdefault(node, []).append((t, self.clock(node, t), pkt))

    def delay(self, a: str, b: str) -> int:
        return self.hop_delay.get((a, b), self.delay_ns)

    def segment(self, c: Conn, frm: str, t: int, flags: int, payload: bytes = b"", lose_first: bool = False,
                rto_ns: int = 200_000_000) -> int:
        """Send one segment from ``frm``; returns its arrival time at the other end."""
        to = c.b if frm == c.a else c.a
        sport, dport = (c.aport, c.bport) if frm == c.a else (c.bport, c.aport)
        seq, ack = c.seq[frm], c.seq[to]
        src, dst = self.nodes[frm], self.nodes[to]
        ident = c.ip_id.get(frm, 0)
        if self.tso and len(payload) > MSS:
            self._emit(frm, t, tcp_packet(src, dst, sport, dport, seq, ack, flags, payload, ip_id=ident))
            arrive = t + self.delay(frm, to)
            for i in range(0, len(payload), MSS):
                piece = payload[i:i + MSS]
                self._emit(to, arrive + i // MSS * 1000,
                           tcp_packet(src, dst, sport, dport, seq + i, ack, flags if i + MSS >= len(payload) else ACK,
                                      piece, ip_id=ident + i // MSS))
            arrive += (len(payload) - 1) // MSS * 1000
            ident += (len(payload) + MSS - 1) // MSS
        else:
            pkt = tcp_packet(src, dst, sport, dport, seq, ack, flags, payload, ip_id=ident)
            self._emit(frm, t, pkt)
            if lose_first:  # the retransmission is a new IP packet: a new identification
                ident += 1
                pkt = tcp_packet(src, dst, sport, dport, seq, ack, flags, payload, ip_id=ident)
                t += rto_ns
                self._emit(frm, t, pkt)
            arrive = t + self.delay(frm, to)
            self._emit(to, arrive, pkt)
            ident += 1
        c.ip_id[frm] = ident
        c.seq[frm] = seq + len(payload) + (1 if flags & (SYN | FIN) else 0)
        return arrive

    def ack(self, c: Conn, frm: str, t: int) -> int:
        return self.segment(c, frm, t, ACK)

    def connect(self, a: str, b: str, bport: int, t: int, refuse: bool = False) -> tuple[Conn, int]:
        self.next_port += 1
        c = Conn(self, a, b, self.next_port, bport, {a: 1000 * self.next_port, b: 7_000_000 + self.next_port})
        t = self.segment(c, a, t, SYN)
        if refuse:
            from exporters.swift.pcap import RST
            c.seq[b] = 0
            self.segment(c, b, t, RST | ACK)
            return c, t
        t = self.segment(c, b, t, SYN | ACK)
        t = self.segment(c, a, t, ACK)
        return c, t

    def send(self, c: Conn, frm: str, t: int, data: bytes, lose_first: bool = False) -> int:
        """Send ``data`` (one segment, or MSS pieces without TSO); the receiver ACKs at once."""
        to = c.b if frm == c.a else c.a
        if not self.tso:
            arrive = t
            for i in range(0, len(data), MSS * 16):  # up to 16 x MSS per segment (GSO as tcpdump sees it)
                arrive = self.segment(c, frm, t + i // (MSS * 16) * 2000, PSH | ACK, data[i:i + MSS * 16],
                                      lose_first=lose_first and i == 0)
        else:
            arrive = self.segment(c, frm, t, PSH | ACK, data)
        self.ack(c, to, arrive + 5_000)
        return arrive

    def close(self, c: Conn, t: int) -> int:
        t = self.segment(c, c.a, t, FIN | ACK)
        t = self.segment(c, c.b, t, FIN | ACK)
        return self.ack(c, c.a, t)

    def exchange(self, c: Conn, t: int, request: bytes, response: bytes, server_ns: int,
                 lose_first: bool = False) -> int:
        """Client sends ``request``; server answers ``server_ns`` after it arrived; returns when the
        response reached the client."""
        arrive = self.send(c, c.a, t, request, lose_first=lose_first)
        return self.send(c, c.b, arrive + server_ns, response)

    def write(self, directory: str | Path, fmt: str = "pcap", nano: bool = True) -> dict[str, Path]:
        out = {}
        d = Path(directory)
        for node in self.nodes:
            pkts = [(ts, pkt) for _, ts, pkt in sorted(self.captures.get(node, []), key=lambda p: p[0])]
            path = d / f"{node}.{'pcapng' if fmt == 'pcapng' else 'pcap'}"
            if fmt == "pcapng":
                write_pcapng(path, pkts)
            else:
                write_pcap(path, pkts, nano=nano)
            out[node] = path
        return out


def http_request(method: str, path: str, trans_id: str | None = None, body: bytes = b"") -> bytes:
    tx = f"X-Trans-Id: {trans_id}\r\n" if trans_id else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: swift\r\n{tx}Content-Length: {len(body)}\r\n\r\n").encode() + body


def http_response(status: int, trans_id: str | None = None, body: bytes = b"") -> bytes:
    tx = f"X-Trans-Id: {trans_id}\r\n" if trans_id else ""
    return (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{tx}\r\n").encode() + body


NODES = {"client": "10.200.9.10", "proxy": "10.200.9.20", "storage": "10.200.9.30"}
SERVICES = {"10.200.9.20:8080": "proxy", "10.200.9.30:6200": "object", "10.200.9.30:6201": "container",
            "10.200.9.30:6202": "account"}


def roles_mapping(shared_clock: bool = True) -> dict[str, object]:
    return {"nodes": {n: {"addresses": [a], "host": "one" if shared_clock else n} for n, a in NODES.items()},
            "services": dict(SERVICES)}


def swift_put(net: SynthNet, t: int, tx: str, *, proxy_ns: int = 300_000, account_ns: int = 400_000,
              container_ns: int = 500_000, object_ns: int = 2_000_000, body: bytes = b"x",
              lose_first: bool = False, with_trans_id: bool = True) -> int:
    """One object PUT as Swift does it (auth skipped): client -> proxy; the proxy asks the
    account server, the container server, then PUTs to the object server; then answers.
    Each server's processing is given; the proxy spends ``proxy_ns`` before each call and before
    its answer. Returns when the client has the response."""
    t_id = tx if with_trans_id else None
    cp, t = net.connect("client", "proxy", 8080, t)
    arrive = net.send(cp, "client", t, http_request("PUT", "/v1/AUTH_test/c/o", None, body), lose_first=lose_first)
    now = arrive
    for port, path, server_ns, method in ((6202, "/d1/1/AUTH_test", account_ns, "HEAD"),
                                          (6201, "/d1/1/AUTH_test/c", container_ns, "HEAD"),
                                          (6200, "/d1/1/AUTH_test/c/o", object_ns, "PUT")):
        c, t2 = net.connect("proxy", "storage", port, now + proxy_ns)
        req = http_request(method, path, t_id, body if method == "PUT" else b"")
        now = net.exchange(c, t2, req, http_response(201 if method == "PUT" else 204, t_id), server_ns)
        net.close(c, now + 10_000)
    back = net.send(cp, "proxy", now + proxy_ns, http_response(201, t_id))
    net.close(cp, back + 10_000)
    return back


REPLICA_NODES = {"client": "10.200.9.10", "proxy": "10.200.9.20", "s1": "10.200.9.31", "s2": "10.200.9.32",
                 "s3": "10.200.9.33"}


def replica_roles_mapping() -> dict[str, object]:
    """Roles of :data:`REPLICA_NODES`: one clock, an object and a container server per storage node."""
    services = {"10.200.9.20:8080": "proxy"}
    for n in ("s1", "s2", "s3"):
        services[f"{REPLICA_NODES[n]}:6200"] = "object"
        services[f"{REPLICA_NODES[n]}:6201"] = "container"
    return {"nodes": {n: {"addresses": [a], "host": "one"} for n, a in REPLICA_NODES.items()}, "services": services}


def swift_put_replicated(net: SynthNet, t: int, tx: str, *, proxy_ns: int = 300_000,
                         header_ns: dict[str, int] | None = None, object_ns: int = 2_000_000,
                         container_ns: int = 500_000, after_update_ns: int = 200_000, body: bytes = b"x" * 1024,
                         body_pieces: int = 1, piece_gap_ns: dict[str, int] | None = None) -> int:
    """One object PUT to three replicas as Swift's proxy does it (auth and account/container
    lookups skipped): the client sends the PUT (headers and body); after ``proxy_ns`` the proxy
    connects to s1, s2, s3 and sends each the request headers with ``Expect: 100-continue``; each
    object server answers ``100 Continue`` ``header_ns[node]`` after the headers arrived (a slow
    node: its delay sits here, as the lab's WSGI middleware puts it); the proxy sends the body to
    every replica only when all three answered, in ``body_pieces`` segments spaced
    ``piece_gap_ns[node]`` apart (a slow link into that node: the body trickles in). Each object
    server spends ``object_ns`` after the last body byte, sends a container update to the next
    node's container server (``container_ns`` there), spends ``after_update_ns`` and answers
    201; the proxy answers the client ``proxy_ns`` after the last replica's answer.
    The truth: a replica's own time is ``header_ns[node] + object_ns + after_update_ns``; the
    proxy's is ``2 * proxy_ns``. Returns when the client has the response."""
    header_ns = header_ns or {}
    piece_gap_ns = piece_gap_ns or {}
    replicas = ("s1", "s2", "s3")
    cp, t = net.connect("client", "proxy", 8080, t)
    arrive = net.send(cp, "client", t, http_request("PUT", "/v1/AUTH_test/c/o", None, body))
    start = arrive + proxy_ns
    conns, hundred_in = {}, {}
    for n in replicas:
        c, t2 = net.connect("proxy", n, 6200, start)
        head = (f"PUT /d1/1/AUTH_test/c/o HTTP/1.1\r\nHost: {n}\r\nX-Trans-Id: {tx}\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
        got = net.send(c, "proxy", t2, head)
        hundred_in[n] = net.send(c, n, got + header_ns.get(n, 500_000), b"HTTP/1.1 100 Continue\r\n\r\n")
        conns[n] = c
    body_out = max(hundred_in.values()) + 50_000
    done = []
    for k, n in enumerate(replicas):
        c = conns[n]
        size = -(-len(body) // body_pieces)
        last = body_out
        for j in range(body_pieces):
            piece = body[j * size:(j + 1) * size]
            last = net.segment(c, "proxy", body_out + j * piece_gap_ns.get(n, 2_000), PSH | ACK, piece)
        net.ack(c, n, last + 5_000)
        upd, t3 = net.connect(n, replicas[(k + 1) % 3], 6201, last + object_ns)
        back = net.exchange(upd, t3, http_request("PUT", "/d1/1/AUTH_test/c/o", tx), http_response(201, tx),
                            container_ns)
        net.close(upd, back + 10_000)
        done.append(net.send(c, n, back + after_update_ns, http_response(201, tx)))
    resp = net.send(cp, "proxy", max(done) + proxy_ns, http_response(201, tx))
    for c in conns.values():
        net.close(c, resp + 10_000)
    net.close(cp, resp + 10_000)
    return resp
