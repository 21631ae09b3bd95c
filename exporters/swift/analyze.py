"""The library API: captures of several nodes in, a per-hop and per-node breakdown out.

    from exporters.swift.analyze import analyze
    from exporters.swift.roles import load_roles
    b = analyze({"client": "client.pcap", "proxy": "proxy.pcap", "storage": "storage.pcap"},
                load_roles(mapping="roles.yml"))
    b.summary()          # JSON-able dict: hops, nodes, roles, phases, clocks, joins, counts

``captures`` values are file paths or already-read :class:`~exporters.swift.pcap.Segments`
(the live reader passes those). A node's own addresses come from the role mapping (``nodes:``);
a node the mapping does not name owns the address seen most often in its capture.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters.swift.clocks import ClockModel, estimate
from exporters.swift.exchanges import Exchange, JoinCounts, exchanges_of, join, phase_samples
from exporters.swift.match import HOW_AMBIGUOUS, HOW_NAMES, Directed, Matches, direct, match, segment_hash
from exporters.swift.pcap import ACK, RST, SYN, ReadStats, Segments, ip_str, read_capture
from exporters.swift.roles import Node, RoleMap
from exporters.swift.swiftlogs import LogRequest, apply_logs, read_logs

I64 = npt.NDArray[np.int64]


def _stats(values_ns: npt.ArrayLike) -> dict[str, float]:
    v = np.asarray(values_ns, dtype=np.float64) / 1e9
    if not len(v):
        return {"count": 0}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"count": int(len(v)), "mean": float(v.mean()), "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": float(v.max()), "sum": float(v.sum())}


class RoleCoder:
    """Vectorised endpoint -> role, cached per address."""

    def __init__(self, roles: RoleMap):
        self.roles = roles
        self.names: list[str] = []
        self._code: dict[str, int] = {}
        svc = roles.services
        self._svc_keys = np.array([(ip << 16) | port for ip, port in svc], dtype=np.uint64)
        self._svc_codes = np.array([self.code(r) for r in svc.values()], dtype=np.int64)

    def code(self, role: str) -> int:
        if role not in self._code:
            self._code[role] = len(self.names)
            self.names.append(role)
        return self._code[role]

    def __call__(self, ip: npt.NDArray[np.uint32], port: npt.NDArray[np.uint16]) -> I64:
        if not len(ip):
            return np.zeros(0, dtype=np.int64)
        uips, inv = np.unique(ip, return_inverse=True)
        # An address' role for a port it does not serve (endpoint_role with an unused port).
        by_ip = np.array([self.code(self.roles.endpoint_role(int(a), 0)) for a in uips], dtype=np.int64)
        out = by_ip[inv]
        if len(self._svc_keys):
            keys = (ip.astype(np.uint64) << np.uint64(16)) | port.astype(np.uint64)
            order = np.argsort(self._svc_keys)
            sk = self._svc_keys[order]
            pos = np.minimum(np.searchsorted(sk, keys), len(sk) - 1)
            hit = sk[pos] == keys
            out = np.where(hit, self._svc_codes[order][pos], out)
        return out


@dataclass
class Breakdown:
    """Everything one analysis found. Arrays stay for the metrics, the diagram and the bench."""

    nodes: list[str]
    read: dict[str, ReadStats]
    matches: Matches
    clocks: ClockModel
    transit: I64  # per match, ns, clock-corrected (ambiguous matches: -1)
    hop_src: I64  # role codes per match
    hop_dst: I64
    role_names: list[str]
    exchanges: list[Exchange]
    joins: JoinCounts
    retransmissions: Counter[tuple[str, str]] = field(default_factory=Counter)
    resets: Counter[tuple[str, str]] = field(default_factory=Counter)
    connection_failures: Counter[str] = field(default_factory=Counter)
    connections: Counter[str] = field(default_factory=Counter)
    # calls that got no answer before their connection closed, by (node called, role called)
    unanswered: Counter[tuple[str, str]] = field(default_factory=Counter)
    trans_ids_from_logs: int = 0
    # per --swift-log file: access lines read, other lines skipped; and what to tell about them
    swift_logs: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    addresses: dict[str, list[str]] = field(default_factory=dict)  # each node's own addresses, as used
    guessed: list[str] = field(default_factory=list)  # nodes whose address was a tie-break guess

    def hop_label(self, i: int) -> tuple[str, str]:
        return self.role_names[int(self.hop_src[i])], self.role_names[int(self.hop_dst[i])]

    def hops(self) -> dict[tuple[str, str], I64]:
        """Clock-corrected transit (ns) of unambiguous matches, per (source role, destination role)."""
        ok = self.matches.how != HOW_AMBIGUOUS
        out: dict[tuple[str, str], I64] = {}
        if not ok.any():
            return out
        pair = self.hop_src[ok] * 1000 + self.hop_dst[ok]
        tr = self.transit[ok]
        for p in np.unique(pair).tolist():
            out[(self.role_names[p // 1000], self.role_names[p % 1000])] = tr[pair == p]
        return out

    def processing_by(self, key: str = "role") -> dict[str, list[int]]:
        """Node processing (ns) of server-side exchanges, per server role or per node name."""
        out: dict[str, list[int]] = {}
        for x in self.exchanges:
            if x.side == "server" and x.processing is not None:
                k = x.server_role if key == "role" else self.nodes[x.node]
                out.setdefault(k, []).append(x.processing)
        return out

    def phases(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for ph, _, ns in phase_samples(self.exchanges):
            out.setdefault(ph, []).append(ns)
        return out

    def waits_by(self, key: str = "role") -> dict[str, dict[str, list[int]]]:
        """What server-side exchanges waited for, ns, per server role or node name: ``receive``
        (the request's body: 100 Continue out -> last byte in, a slow sender or link) and
        ``fanout`` (the node's calls to other nodes, concurrent ones counted once)."""
        out: dict[str, dict[str, list[int]]] = {}
        for x in self.exchanges:
            if x.side == "server" and x.processing is not None:
                k = x.server_role if key == "role" else self.nodes[x.node]
                w = out.setdefault(k, {"receive": [], "fanout": []})
                w["receive"].append(x.receive_wait or 0)
                w["fanout"].append(x.fanout_wait or 0)
        return out

    def summary(self) -> dict[str, Any]:
        m = self.matches
        clocks = {}
        for (a, b), pc in self.clocks.pairs.items():
            clocks[f"{self.nodes[a]}->{self.nodes[b]}"] = {
                "shared_clock": pc.shared, "offset_seconds": pc.median_offset / 1e9,
                "error_seconds": pc.median_error / 1e9, "estimated_offset_seconds": pc.estimated_offset / 1e9,
                "estimated_error_seconds": pc.estimated_error / 1e9, "windows": int(len(pc.offset)),
                "jumps": pc.jumps}
        return {
            "nodes": self.nodes,
            "addresses": self.addresses,
            "address_guesses": self.guessed,
            "read": {n: {"packets": s.packets, "segments": s.segments, "snapped": s.snapped,
                         "duplicate": s.duplicate, "rejected": dict(s.rejected)} for n, s in self.read.items()},
            "matching": dict(m.counts),
            "hops": {f"{a}->{b}": _stats(v) for (a, b), v in sorted(self.hops().items())},
            "processing_by_role": {k: _stats(v) for k, v in sorted(self.processing_by("role").items())},
            "processing_by_node": {k: _stats(v) for k, v in sorted(self.processing_by("node").items())},
            "phases": {k: _stats(v) for k, v in sorted(self.phases().items())},
            "waits_by_role": {k: {w: _stats(v) for w, v in ws.items()} for k, ws in sorted(self.waits_by("role").items())},
            "clocks": clocks,
            "clock_reference": self.nodes[self.clocks.reference] if self.clocks.reference is not None else None,
            "joins": {**self.joins.as_dict(), "ambiguous_ratio": self.joins.ambiguous_ratio,
                      "trans_ids_from_logs": self.trans_ids_from_logs},
            "exchanges": len(self.exchanges),
            "swift_logs": self.swift_logs,
            "notes": self.notes,
            "retransmissions": {f"{a}->{b}": n for (a, b), n in sorted(self.retransmissions.items())},
            "resets": {f"{a}->{b}": n for (a, b), n in sorted(self.resets.items())},
            "connections": dict(self.connections),
            "connection_failures": dict(self.connection_failures),
            "unanswered": {f"{n}/{r}": c for (n, r), c in sorted(self.unanswered.items())},
        }


def _own_addresses(node: str, segs: Segments, roles: RoleMap) -> set[int]:
    known = roles.nodes.get(node)
    if known and known.addresses:
        return set(known.addresses)
    if not len(segs):
        return set()
    ips, counts = np.unique(np.concatenate([segs.src, segs.dst]), return_counts=True)
    claimed = {a for n in roles.nodes.values() for a in n.addresses}
    # The address seen most often; on a tie (a capture between two hosts only), one that no
    # other node owns yet. Ties are guesses: name the addresses in the mapping (nodes:).
    best = [int(ips[i]) for i in np.flatnonzero(counts == counts.max())]
    free = [a for a in best if a not in claimed] or best
    top = free[0]
    roles.add_node(Node(node, [top], known.host if known else None, guessed=len(free) > 1))
    return {top}


#: A node whose address was taken from its capture (no ``nodes:`` in the roles) with more than
#: this share of its segments between other addresses: a second interface, said.
FOREIGN_SHARE = 0.2


def guessed_address_note(node: str, segs: Segments, own: set[int]) -> str | None:
    """For a node given no addresses: its capture holds many segments between other addresses (a
    proxy with a client network and a storage network: only one of its addresses was taken, its
    other side's traffic becomes foreign and its calls look like a client's)."""
    if not len(segs) or not own:
        return None
    mine = np.isin(segs.src, list(own)) | np.isin(segs.dst, list(own))
    share = 1 - float(np.count_nonzero(mine)) / len(segs)
    if share <= FOREIGN_SHARE:
        return None
    return (f"capture of {node}: no address of it in the roles, {', '.join(ip_str(a) for a in sorted(own))} taken (the "
            f"most seen), but {share:.0%} of its segments are between other addresses (a second interface?): name "
            f"its addresses under nodes: in the roles")


def both_ends_note(node: str, segs: Segments, own: set[int]) -> str | None:
    """A capture whose segments are nearly all between the node's own addresses (``tcpdump -i
    lo`` on an all-in-one host, Swift's SAIO): the analysis times a segment between two nodes'
    captures and a request at the node that serves it, so such a capture gives no hop and no
    processing. Said, not silent."""
    if len(segs) < 10 or not own:
        return None
    mine = list(own)
    local = np.isin(segs.src, mine) & np.isin(segs.dst, mine)
    if np.count_nonzero(local) < 0.9 * len(segs):
        return None
    return (f"capture of {node}: {np.count_nonzero(local) / len(segs):.0%} of its segments are between its own addresses "
            f"({', '.join(ip_str(a) for a in sorted(own))}: a loopback capture of an all-in-one host?): the analysis "
            "times what crosses between nodes' captures, one capture per node, each node on addresses of its own, so "
            "one capture holding both ends of every connection gives no hop and no processing")


#: A shared clock the captures contradict: their offset beyond this many times its error, and
#: beyond SHARED_CLOCK_SLACK_NS (a transit's scale on one host).
SHARED_CLOCK_ERRORS = 5
SHARED_CLOCK_SLACK_NS = 200_000


#: Share of ambiguous joins from which the analysis says so (a few happen at any concurrency).
AMBIGUOUS_NOTE = 0.1


def ambiguity_note(joins: JoinCounts, exchanges: list[Exchange]) -> str | None:
    """Said when many calls could not be told apart: their requests have no processing figure."""
    if joins.ambiguous == 0 or joins.ambiguous_ratio < AMBIGUOUS_NOTE:
        return None
    calls = [x for x in exchanges if x.side == "client" and x.join is not None and x.join != "orphan"]
    no_tx = sum(x.trans_id is None for x in calls)
    why = (f"{no_tx} of {len(calls)} calls carry no X-Trans-Id in the capture, a snap length below the "
           "headers? capture with -s 0, or give the Swift access logs with --swift-log"
           if no_tx > len(calls) / 2 else "the transaction ids did not tell them apart")
    # (the subject first: live mode says a note once per subject, the text before its first ':')
    return (f"calls that could serve more than one request open at the time: {joins.ambiguous} of "
            f"{joins.ambiguous + joins.trans_id + joins.timing} ({why}); they are joined to none, and the "
            f"{joins.uncertain} requests they may serve have no processing figure (left out, not guessed)")


def shared_clock_notes(clocks: ClockModel, names: list[str]) -> list[str]:
    """The node pairs the roles say share a clock (one ``host``) whose captures say otherwise:
    their transits are off by the offset (VMs on one hypervisor each have their own clock, a
    capture stamped by its NIC, a lab's roles reused for real hosts). Said, not corrected: the
    roles are the user's word."""
    out = []
    for pc in clocks.pairs.values():
        off, err = pc.estimated_offset, pc.estimated_error
        if pc.shared and len(pc.offset) and abs(off) > max(SHARED_CLOCK_ERRORS * err, SHARED_CLOCK_SLACK_NS):
            out.append(f"clocks of {names[pc.a]} and {names[pc.b]}: one host (one clock) by the roles, but their "
                       f"captures say {names[pc.b]}'s runs {off / 1e9:+.6f} s from {names[pc.a]}'s (error "
                       f"{err / 1e9:.6f} s), so the transits between them are off by that much; if they are two "
                       "machines, give each its own host in the roles")
    return out


def capture_note(name: str, st: ReadStats) -> str | None:
    """Why a capture gave nothing to analyse (None: it gave segments): said, not silent."""
    if st.segments:
        if st.rejected["corrupt"]:  # (a pcap's framing stops there; a pcapng block is skipped)
            return (f"capture of {name}: {st.rejected['corrupt']} damaged record(s) (corrupt) after {st.packets} "
                    "packets read; in a pcap file the first one ends the reading and the rest of the file is not "
                    "read (rotated files joined with cat? join them with mergecap -F pcap -w)")
        return None
    if not st.packets:
        return (f"capture of {name}: no packet in it (an empty file, or a header only: a capture "
                "stopped before its first write, or a rotated file's first slot)")
    why = ", ".join(f"{k} {v}" for k, v in st.rejected.most_common())
    hint = ""
    if st.rejected["ipv6"]:
        hint = "; IPv6 is not decoded (an IPv6 ring)"
    elif st.rejected["snaplen_headers"]:
        hint = "; the snap length cut the IP or TCP header: capture with -s 96 or more (0: whole packets)"
    elif st.rejected["corrupt"] or st.rejected["truncated"]:
        hint = "; a damaged file (rotated files joined with cat? join them with mergecap -F pcap -w)"
    return f"capture of {name}: 0 TCP segments in its {st.packets} packets ({why}){hint}"


def analyze(captures: Mapping[str, str | Path | Segments], roles: RoleMap | None = None, *,
            window_s: float = 1.0, read_stats: Mapping[str, ReadStats] | None = None,
            publish: tuple[int, int] | None = None, logs: Iterable[str | Path] = ()) -> Breakdown:
    """Read (when given paths), match, estimate clocks, split exchanges, join, measure.

    ``publish=(lo, hi)`` (ns, the live reader's windows): everything is computed over the whole
    input, but only what ended in ``[lo, hi)`` is kept (segments by arrival, exchanges by their
    response's end, TCP events by time), so overlapping windows count nothing twice.
    ``logs``: Swift access logs, a second source of transaction ids (:mod:`exporters.swift.swiftlogs`);
    a file with no access line at all is named in ``notes``; a gzip-compressed one raises
    :class:`~exporters.swift.swiftlogs.SwiftLogError`.
    """
    roles = roles if roles is not None else RoleMap()
    names = list(captures)
    segs_by: dict[str, Segments] = {}
    read: dict[str, ReadStats] = {}
    for name, src in captures.items():
        if isinstance(src, Segments):
            segs_by[name] = src
            read[name] = read_stats[name] if read_stats and name in read_stats else ReadStats(len(src), len(src))
        else:
            segs_by[name], read[name] = read_capture(src)
    directed: list[Directed] = []
    address_notes = []
    for i, name in enumerate(names):
        given = roles.nodes.get(name)
        own = _own_addresses(name, segs_by[name], roles)
        if not (given and given.addresses) and (note := guessed_address_note(name, segs_by[name], own)):
            address_notes.append(note)
        if note := both_ends_note(name, segs_by[name], own):
            address_notes.append(note)
        directed.append(direct(i, segs_by[name], own))
    m = match(directed)
    shared = {(i, j) for i in range(len(names)) for j in range(i + 1, len(names))
              if roles.same_clock(names[i], names[j])}
    clocks = estimate(m, shared, window_ns=int(window_s * 1e9))
    transit = m.delay - clocks.offset(m)
    transit = np.where(m.how == HOW_AMBIGUOUS, -1, np.maximum(transit, 0))
    coder = RoleCoder(roles)
    hop_src, hop_dst = coder(m.src, m.sport), coder(m.dst, m.dport)

    exchanges: list[Exchange] = []
    for d in directed:
        exchanges.extend(exchanges_of(d, roles))
    exchanges, foreign_note = _without_other_services(exchanges, roles)
    from_logs = 0
    log_counts: dict[str, dict[str, int]] = {}
    notes: list[str] = [n for n in (capture_note(name, read[name]) for name in names
                                    if not isinstance(captures[name], Segments)) if n]
    notes += address_notes + shared_clock_notes(clocks, names)
    if foreign_note:
        notes.append(foreign_note)
    if logs:
        entries: list[LogRequest] = []
        for log in logs:
            got, skipped = read_logs([log])
            entries.extend(got)
            log_counts[str(log)] = {"access_lines": len(got), "skipped_lines": skipped}
            if not got:
                notes.append(f"swift log {log}: none of its {skipped} lines is a Swift access line "
                             "(proxy or storage server): no transaction id from it")
        from_logs = apply_logs(exchanges, entries)
    note = _missing_calls(exchanges, roles, names)
    if note:
        notes.append(note)
    joins = join(exchanges)
    note = ambiguity_note(joins, exchanges)
    if note:
        notes.append(note)

    transit = transit.astype(np.int64)
    if publish is not None:
        lo, hi = publish
        keep = (m.t_recv >= lo) & (m.t_recv < hi)
        m, transit, hop_src, hop_dst = m.subset(keep), transit[keep], hop_src[keep], hop_dst[keep]
        exchanges = [x for x in exchanges if lo <= x.resp_end < hi]
        # the calls of this window only (joined over everything kept, so a call whose request
        # began in an earlier window finds it; counted once, when the call is published)
        joins = JoinCounts(**{k: sum(1 for x in exchanges if x.join == k and x.answered) for k in JoinCounts().as_dict()})
        joins.late = sum(x.late and x.answered for x in exchanges)
        joins.uncertain = sum(x.side == "server" and x.uncertain for x in exchanges)
    b = Breakdown(names, read, m, clocks, transit, hop_src, hop_dst, coder.names, exchanges, joins,
                  trans_ids_from_logs=from_logs, swift_logs=log_counts, notes=notes)
    _tcp_events(b, directed, coder, publish)
    for x in exchanges:  # (those of the published window, by when the caller gave up)
        if not x.answered and not x.still_open:
            b.unanswered[(roles.node_of(x.server[0]) or ip_str(x.server[0]), x.server_role)] += 1
    for name in names:
        node = roles.nodes.get(name)
        b.addresses[name] = [ip_str(a) for a in node.addresses] if node else []
        if node is not None and node.guessed:
            b.guessed.append(name)
    return b


def _without_other_services(exchanges: list[Exchange], roles: RoleMap) -> tuple[list[Exchange], str | None]:
    """The exchanges without the requests a Swift node served on a port no role names (a
    node_exporter scraped on :9100, an admin UI): another service, not Swift's. They were
    published as the node's Swift processing (``role="storage"``) and could fire SwiftNodeSlow
    (a review). Without any service port in the roles nothing is left out."""
    ports = roles.service_ports()
    if not ports:
        return exchanges, None
    swift_nodes = {roles.node_of(ip) for ip, _ in roles.services} - {None}
    other: Counter[str] = Counter()
    kept = []
    for x in exchanges:
        ip, port = x.server
        if x.side == "server" and port not in ports and roles.node_of(ip) in swift_nodes:
            other[f"{ip_str(ip)}:{port}"] += 1
            continue
        kept.append(x)
    if not other:
        return exchanges, None
    listed = ", ".join(f"{e} ({n})" for e, n in other.most_common(5)) + (", ..." if len(other) > 5 else "")
    return kept, (f"{sum(other.values())} requests served on ports no role names are another service's, not "
                  f"Swift's, and are left out: {listed}")


#: Requests other captures received from a node, with none of them in its own capture, before
#: that node's capture is taken to have missed its calls.
MISSING_CALLS_MIN = 3


def _missing_calls(exchanges: list[Exchange], roles: RoleMap, names: list[str]) -> str | None:
    """A node whose own capture holds none of the calls the other captures saw it make (captured
    with a filter on its listening port, ``tcp port 8080``, a common habit): its waits for them
    would be its processing (a review: the proxy's 3 ms became 107-122 ms, pointing
    SwiftNodeSlow at it). Its requests get no processing figure; the note says why."""
    seen: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for x in exchanges:
        if x.side == "server":
            caller = roles.node_of(x.client[0])
            if caller is not None and caller != names[x.node]:
                seen[caller] += 1
        else:
            calls[names[x.node]] += 1
    blind = sorted(n for n, k in seen.items() if k >= MISSING_CALLS_MIN and n in names and calls[n] == 0)
    if not blind:
        return None
    for x in exchanges:
        if x.side == "server" and names[x.node] in blind:
            x.uncertain = True
    return ("; ".join(f"{n}'s capture holds none of the {seen[n]} calls the other captures received from it"
                      for n in blind)
            + ": a capture filter on its listening port (tcp port 8080)? Its requests get no processing "
              "figure (its waits for its calls would be counted as its own time); capture all its TCP traffic")


def _tcp_events(b: Breakdown, directed: list[Directed], coder: RoleCoder,
                publish: tuple[int, int] | None = None) -> None:
    """Retransmissions (at the sender's capture, or the receiver's when the sender has none),
    resets (each RST once over all captures), connections and failed connection attempts."""
    all_addr = np.array(sorted({a for n in coder.roles.nodes.values() for a in n.addresses}), dtype=np.uint32)
    for d in directed:
        s = d.segs
        sender_uncaptured = ~np.isin(s.src, all_addr)
        sel = d.retrans & (d.egress | (d.ingress & sender_uncaptured))
        if publish is not None:
            sel &= (s.ts >= publish[0]) & (s.ts < publish[1])
        r = np.flatnonzero(sel)
        if len(r):
            src, dst = coder(s.src[r], s.sport[r]), coder(s.dst[r], s.dport[r])
            for (a, c), n in Counter(zip(src.tolist(), dst.tolist())).items():
                b.retransmissions[(coder.names[a], coder.names[c])] += n
    if not directed:
        return
    cat = Segments.concat([d.segs.take(np.flatnonzero((d.segs.flags & (RST | SYN)) != 0), heads=False)
                           for d in directed])
    cat.heads = {}
    if not len(cat):
        return
    key = segment_hash(cat)
    _, first = np.unique(key, return_index=True)
    u = cat.take(np.sort(first), heads=False)
    if publish is not None:
        u = u.take(np.flatnonzero((u.ts >= publish[0]) & (u.ts < publish[1])), heads=False)
    rst = np.flatnonzero((u.flags & RST) != 0)
    if len(rst):
        src, dst = coder(u.src[rst], u.sport[rst]), coder(u.dst[rst], u.dport[rst])
        for (a, c), n in Counter(zip(src.tolist(), dst.tolist())).items():
            b.resets[(coder.names[a], coder.names[c])] += n
    syn = np.flatnonzero(((u.flags & SYN) != 0) & ((u.flags & ACK) == 0))
    if not len(syn):
        return
    synack = np.flatnonzero(((u.flags & SYN) != 0) & ((u.flags & ACK) != 0))
    # A SYN is answered when a SYN-ACK on the reversed tuple acknowledges its sequence number.
    got = {(int(u.src[i]), int(u.dst[i]), int(u.sport[i]), int(u.dport[i]), int(u.ack[i])) for i in synack.tolist()}
    end = max(int(d.segs.ts.max()) for d in directed if len(d.segs))
    # A retransmitted SYN repeats its connection's tuple and initial sequence number; a SYN with
    # a new one on the same tuple is a new connection (the port reused).
    seen: set[tuple[int, int, int, int, int]] = set()
    dst_roles = coder(u.dst[syn], u.dport[syn])
    for k, i in enumerate(syn.tolist()):
        tup = (int(u.src[i]), int(u.dst[i]), int(u.sport[i]), int(u.dport[i]))
        if (*tup, int(u.seq[i])) in seen:  # a retransmitted SYN
            continue
        seen.add((*tup, int(u.seq[i])))
        role = coder.names[int(dst_roles[k])]
        b.connections[role] += 1
        answered = (tup[1], tup[0], tup[3], tup[2], (int(u.seq[i]) + 1) & 0xFFFFFFFF) in got
        if not answered and int(u.ts[i]) < end - 1_000_000_000:
            b.connection_failures[role] += 1


__all__ = ["Breakdown", "HOW_NAMES", "analyze", "ip_str"]
