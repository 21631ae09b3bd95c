"""Match each TCP segment across the captures of several nodes, with sorted arrays.

A segment sent by node A to node B appears twice: leaving A (A's capture, ``egress``) and
arriving at B (B's capture, ``ingress``). It is identified, as in the paper, by its connection
and sequence number, plus acknowledgement, flags and payload length (``STACK-NOTES``: that
matched every packet between two ends of a veth). The join is a hash join done with numpy:
a 64-bit key per segment, the k-th copy of a key on one side paired with the k-th on the other
(a retransmission is a second copy), every pair checked field by field afterwards.

- **Retransmissions**: a data segment (or SYN/FIN) whose bytes a node already sent on that
  connection (sequence below the highest end sent so far, in serial-number arithmetic: bytes
  from before the capture started are earlier, not 2^32 later; more than 4 GiB on one
  connection does not wrap; a new SYN on a 4-tuple starts a new connection). Counted per
  hop; when the sender and receiver saw a different number of copies of a key (a copy was
  lost), the pairs of that key are ``ambiguous`` (matched, counted, left out of the transit figures).
- **Segmentation offload**: a sender's capture holds TSO/GSO super-segments, a receiver's GRO
  merges pieces differently, so some data segments have no exact twin. Each unmatched received
  data segment is matched to the sent segment of its connection that holds its first byte
  (``offload``): the transit is that of its first byte.
- Segments whose neither end belongs to the capturing node (forwarded by a router node) are
  counted as ``foreign`` and not matched.

Output: :class:`Matches`, one row per matched (send, receive) pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporters.swift.pcap import BACKWARDS_TOLERANCE_NS, FIN, SYN, Segments

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

HOW_EXACT, HOW_OFFLOAD, HOW_AMBIGUOUS = 0, 1, 2
HOW_NAMES = ("exact", "offload", "ambiguous")

_C = [np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                             0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB)]


def _mix(h: U64) -> U64:
    h = h ^ (h >> np.uint64(33))
    h = h * _C[4]
    h = h ^ (h >> np.uint64(33))
    h = h * _C[5]
    return h ^ (h >> np.uint64(33))


def flow_hash(src: npt.NDArray[np.uint32], dst: npt.NDArray[np.uint32], sport: npt.NDArray[np.uint16],
              dport: npt.NDArray[np.uint16]) -> U64:
    with np.errstate(over="ignore"):
        h = (src.astype(np.uint64) << np.uint64(32)) | dst.astype(np.uint64)
        h = _mix(h * _C[0] ^ ((sport.astype(np.uint64) << np.uint64(16)) | dport.astype(np.uint64)) * _C[1])
    return h


def segment_hash(s: Segments) -> U64:
    with np.errstate(over="ignore"):
        h = flow_hash(s.src, s.dst, s.sport, s.dport)
        h = h ^ ((s.seq.astype(np.uint64) << np.uint64(32)) | s.ack.astype(np.uint64)) * _C[2]
        h = h ^ ((s.flags.astype(np.uint64) << np.uint64(48)) | (s.win.astype(np.uint64) << np.uint64(32))
                 | s.plen.astype(np.uint64)) * _C[3]
        return _mix(h)


def _rank(keys: U64) -> tuple[I64, I64]:
    """Per row: its copy number among equal keys and how many copies its key has. Equal keys
    come from one sender, i.e. one capture, kept in capture (time) order: a stable sort keeps it."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    n = len(k)
    start = np.ones(n, dtype=bool)
    start[1:] = k[1:] != k[:-1]
    gid = np.cumsum(start) - 1
    first = np.flatnonzero(start)
    sizes = np.diff(np.append(first, n))
    rank = np.empty(n, dtype=np.int64)
    count = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - first[gid]
    count[order] = sizes[gid]
    return rank, count


def _serial_diff(a: I64, b: I64) -> I64:
    """``a - b`` of 32-bit TCP sequence numbers in serial-number arithmetic (RFC 1982): the
    signed 32-bit difference, so bytes before ``b`` come out negative, not 2^32 ahead."""
    return ((a - b + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def retransmissions(s: Segments, fh: U64) -> npt.NDArray[np.bool_]:
    """Which segments of one capture's one direction resend bytes already sent on their connection.

    Sequence numbers are unwrapped per connection in serial-number arithmetic: each segment's
    position is its predecessor's plus the signed 32-bit difference of their sequence numbers
    (a sender's consecutive segments are never 2^31 bytes apart), so a resend of bytes sent
    before the capture started lies before the first segment (not 2^32 after it: every later
    segment would then look like a resend), and a connection moving more than 4 GiB does not
    wrap. A SYN with a new sequence number on a 4-tuple starts a new connection (the port reused);
    a SYN repeating the previous one's is a retransmission."""
    n = len(s)
    out = np.zeros(n, dtype=bool)
    carries = (s.plen > 0) | ((s.flags & (SYN | FIN)) != 0)
    idx = np.flatnonzero(carries)
    if len(idx) < 2:
        return out
    f = fh[idx]
    order = np.argsort(f, kind="stable")  # capture order (time) kept within a 4-tuple
    idx, f = idx[order], f[order]
    seq = s.seq[idx].astype(np.int64)
    syn = (s.flags[idx] & SYN) != 0
    start = np.ones(len(idx), dtype=bool)
    start[1:] = f[1:] != f[:-1]
    # A new connection on the same 4-tuple: a SYN that does not repeat the SYN just before it.
    resyn = np.zeros(len(idx), dtype=bool)
    resyn[1:] = syn[1:] & ~(syn[:-1] & (seq[1:] == seq[:-1]))
    start |= resyn
    first = np.flatnonzero(start)
    gid = np.cumsum(start) - 1
    step = np.zeros(len(idx), dtype=np.int64)
    step[1:] = _serial_diff(seq[1:], seq[:-1])
    step[start] = 0
    rel = np.cumsum(step)
    rel -= rel[first][gid]  # position relative to the connection's first segment sent here
    length = s.plen[idx].astype(np.int64) + ((s.flags[idx] & (SYN | FIN)) != 0)
    endpos = rel + length
    # Highest end sent so far on the connection, before this segment: a running maximum over
    # all connections at once, each connection's positions lifted above every earlier one's.
    lo = np.minimum.reduceat(rel, first)
    span = np.maximum.reduceat(endpos, first) - lo + 1
    base = np.concatenate(([0], np.cumsum(span)[:-1])) - lo
    shifted = endpos + base[gid]
    prev_max = np.empty(len(idx), dtype=np.int64)
    prev_max[0] = 0
    prev_max[1:] = np.maximum.accumulate(shifted)[:-1]
    out[idx] = (~start) & (rel + base[gid] < prev_max)
    return out


@dataclass
class Directed:
    """One capture's segments with their direction at the capturing node."""

    node: int
    segs: Segments
    egress: npt.NDArray[np.bool_]
    ingress: npt.NDArray[np.bool_]
    retrans: npt.NDArray[np.bool_]
    fh: U64
    key: U64
    mono: I64  # the capture's timeline: its clock with steps back undone (see capture_timeline)


def capture_timeline(ts: I64, tolerance: int = BACKWARDS_TOLERANCE_NS) -> I64:
    """Timestamps of one capture (capture order: the order the kernel saw the packets in) made
    monotonic: a step back of more than ``tolerance`` (a clock stepped back: NTP, a VM
    migration) becomes a step forward as large, every later stamp moved up by twice the step.
    The packets before and after the step then lie apart, as they do around a forward step, so
    the clock estimator's windows (kept on this timeline) never mix both sides of it (by the
    stamps as captured, a step back makes times repeat: windows mixing two offsets). Only
    groupings use this timeline; delays are always computed from the stamps as captured."""
    if len(ts) < 2:
        return ts
    d = np.diff(ts)
    back = np.where(d < -tolerance, -2 * d, 0)
    if not back.any() or float(back.astype(np.float64).sum()) > 2.0 ** 61:  # none, or absurd (int64 would wrap)
        return ts
    return ts + np.concatenate(([0], np.cumsum(back)))


def direct(node: int, segs: Segments, addresses: set[int]) -> Directed:
    addr = np.fromiter(addresses, dtype=np.uint32, count=len(addresses))
    egress = np.isin(segs.src, addr)
    ingress = np.isin(segs.dst, addr) & ~egress
    fh = flow_hash(segs.src, segs.dst, segs.sport, segs.dport)
    retrans = np.zeros(len(segs), dtype=bool)
    for mask in (egress, ingress):
        sel = np.flatnonzero(mask)
        if len(sel):
            retrans[sel] = retransmissions(segs.take(sel, heads=False), fh[sel])
    return Directed(node, segs, egress, ingress, retrans, fh, segment_hash(segs), capture_timeline(segs.ts))


@dataclass
class Matches:
    """Matched (send, receive) pairs; arrays of equal length."""

    snode: I64
    rnode: I64
    t_send: I64
    t_recv: I64
    mono_send: I64  # t_send and t_recv on their capture's timeline (capture_timeline): the clock
    mono_recv: I64  # estimator's windows, which a clock stepping back must not mix
    src: npt.NDArray[np.uint32]
    dst: npt.NDArray[np.uint32]
    sport: npt.NDArray[np.uint16]
    dport: npt.NDArray[np.uint16]
    seq: npt.NDArray[np.uint32]
    flags: npt.NDArray[np.uint8]
    plen: npt.NDArray[np.uint32]
    how: npt.NDArray[np.int8]
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.t_send)

    def subset(self, mask: npt.NDArray[np.bool_]) -> Matches:
        names = ("snode", "rnode", "t_send", "t_recv", "mono_send", "mono_recv", "src", "dst", "sport", "dport",
                 "seq", "flags", "plen", "how")
        counts = dict(self.counts)
        for i, name in enumerate(HOW_NAMES):
            counts[f"matched_{name}"] = int(np.count_nonzero(self.how[mask] == i))
        # Unmatched segments cannot be placed in a window (overlapping windows would count the
        # same segment several times): a subset reports none.
        counts["unmatched_egress"] = counts["unmatched_ingress"] = 0
        return Matches(**{n: getattr(self, n)[mask] for n in names}, counts=counts)

    @property
    def delay(self) -> I64:
        """Receive minus send time, uncorrected for clock offsets (ns)."""
        return self.t_recv - self.t_send


def _concat(ds: list[Directed], side: str) -> tuple[I64, I64, Segments, U64, U64]:
    nodes, monos, parts, keys, fhs = [], [], [], [], []
    for d in ds:
        sel = np.flatnonzero(getattr(d, side))
        nodes.append(np.full(len(sel), d.node, dtype=np.int64))
        monos.append(d.mono[sel])
        parts.append(d.segs.take(sel, heads=False))
        keys.append(d.key[sel])
        fhs.append(d.fh[sel])
    segs = Segments.concat([p for p in parts])
    segs.heads = {}
    cat = np.concatenate
    return (cat(nodes) if nodes else np.zeros(0, np.int64), cat(monos) if monos else np.zeros(0, np.int64), segs,
            cat(keys) if keys else np.zeros(0, np.uint64), cat(fhs) if fhs else np.zeros(0, np.uint64))


def match(ds: list[Directed]) -> Matches:
    """Pair every sent segment with its arrival at another captured node."""
    en, emono, snd, ek, efh = _concat(ds, "egress")
    inn, imono, rcv, ik, ifh = _concat(ds, "ingress")
    counts = {"egress": len(snd), "ingress": len(rcv),
              "foreign": int(sum(len(d.segs) - int(d.egress.sum()) - int(d.ingress.sum()) for d in ds))}
    erank, ecount = _rank(ek)
    irank, icount = _rank(ik)
    low = np.uint64(0xFF)
    ek2 = (ek & ~low) | np.minimum(erank, 255).astype(np.uint64)
    ik2 = (ik & ~low) | np.minimum(irank, 255).astype(np.uint64)
    eorder = np.argsort(ek2, kind="stable")
    es = ek2[eorder]
    pos = np.searchsorted(es, ik2)
    pos_c = np.minimum(pos, max(len(es) - 1, 0))
    found = (pos < len(es)) & (es[pos_c] == ik2) if len(es) else np.zeros(len(ik2), dtype=bool)
    ii = np.flatnonzero(found)
    ei = eorder[pos_c[ii]]
    same = ((snd.src[ei] == rcv.src[ii]) & (snd.dst[ei] == rcv.dst[ii]) & (snd.sport[ei] == rcv.sport[ii])
            & (snd.dport[ei] == rcv.dport[ii]) & (snd.seq[ei] == rcv.seq[ii]) & (snd.ack[ei] == rcv.ack[ii])
            & (snd.flags[ei] == rcv.flags[ii]) & (snd.plen[ei] == rcv.plen[ii]) & (en[ei] != inn[ii]))
    ii, ei = ii[same], ei[same]
    how = np.where(ecount[ei] == icount[ii], HOW_EXACT, HOW_AMBIGUOUS).astype(np.int8)

    # Offload: received data segments without an exact twin -> the sent segment holding their first byte.
    matched_in = np.zeros(len(rcv), dtype=bool)
    matched_in[ii] = True
    rest = np.flatnonzero(~matched_in & (rcv.plen > 0))
    oe, oi = np.zeros(0, np.intp), np.zeros(0, np.intp)
    if len(rest) and len(snd):
        data = np.flatnonzero(snd.plen > 0)
        hi = np.uint64(0xFFFFFFFF00000000)
        ekey = (efh[data] & hi) | snd.seq[data].astype(np.uint64)
        order = np.argsort(ekey, kind="stable")
        data, ekey = data[order], ekey[order]
        rkey = (ifh[rest] & hi) | rcv.seq[rest].astype(np.uint64)
        p = np.searchsorted(ekey, rkey, side="right") - 1
        okp = p >= 0
        p = np.maximum(p, 0)
        cand = data[p] if len(data) else np.zeros(len(rest), np.intp)
        into = (rcv.seq[rest].astype(np.int64) - snd.seq[cand].astype(np.int64)) % (1 << 32)
        good = (okp & (efh[cand] == ifh[rest]) & (snd.src[cand] == rcv.src[rest]) & (snd.dst[cand] == rcv.dst[rest])
                & (snd.sport[cand] == rcv.sport[rest]) & (snd.dport[cand] == rcv.dport[rest])
                & (into < snd.plen[cand].astype(np.int64)) & (en[cand] != inn[rest]))
        oe, oi = cand[good], rest[good]
    allE = np.concatenate([ei, oe])
    allI = np.concatenate([ii, oi])
    how = np.concatenate([how, np.full(len(oi), HOW_OFFLOAD, dtype=np.int8)])
    counts.update({
        "matched_exact": int(np.count_nonzero(how == HOW_EXACT)),
        "matched_offload": int(len(oi)),
        "matched_ambiguous": int(np.count_nonzero(how == HOW_AMBIGUOUS)),
    })
    counts["unmatched_ingress"] = len(rcv) - len(allI)
    sent_matched = np.zeros(len(snd), dtype=bool)
    sent_matched[allE] = True
    counts["unmatched_egress"] = int(np.count_nonzero(~sent_matched))
    return Matches(
        snode=en[allE], rnode=inn[allI], t_send=snd.ts[allE], t_recv=rcv.ts[allI],
        mono_send=emono[allE], mono_recv=imono[allI],
        src=rcv.src[allI], dst=rcv.dst[allI], sport=rcv.sport[allI], dport=rcv.dport[allI], seq=rcv.seq[allI],
        flags=rcv.flags[allI], plen=rcv.plen[allI], how=how, counts=counts,
    )
