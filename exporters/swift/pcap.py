"""Read TCP segments from pcap and pcapng captures, whole files or a live stream, with numpy.

Only the record framing is walked in Python (one ``struct.unpack_from`` per record or block);
every header field (link layer, IPv4, TCP) is then gathered for all packets at once with fancy
indexing into the capture buffer. That is what makes the decoder an order of magnitude faster
than a per-packet parser (``bench/swift_decode``).

What is read: pcap (microsecond magic ``a1b2c3d4`` and nanosecond ``a1b23c4d``, either byte
order) and pcapng (SHB/IDB/EPB, ``if_tsresol`` and ``if_tsoffset``, several interfaces and
sections, either byte order). Link types: Ethernet, Linux cooked v1/v2 (``-i any``), BSD/macOS
loopback (DLT_NULL 0, DLT_LOOP 108: a 4-byte address family, AF_INET 2 in either byte order),
raw IPv4 (101, 12, OpenBSD's 14, 228); a pcap header's FCS bits above the 16-bit link type
are ignored. After an Ethernet or cooked header up to two VLAN tags are read (802.1Q 0x8100,
802.1ad 0x88a8, 0x9100, QinQ; a cooked header whose protocol is 0x8100 is followed by the
tag, as ``tcpdump -i any`` writes a VLAN-offloaded device's packets). IPv6 is not decoded
(``ipv6``, counted apart from ``non_ip`` so the report can say so). A file that is not a capture raises :class:`CaptureError` naming it (and saying
so when it is gzip-compressed: ``tcpdump -z gzip``; it is not decompressed). Everything else
is counted, never fatal (:data:`REASONS`):

- ``truncated``: the capture ends inside a record (tcpdump killed, a copy cut short); the
  records before it are kept.
- ``corrupt``: a record header that cannot be right (a captured length over 256 KiB, a block
  length that is not a multiple of 4); the rest of the file cannot be framed and is dropped.
  A pcapng block too short for its own fixed fields is counted the same way and skipped.
- ``snaplen_headers``: the snap length cut the packet inside its IP or TCP header (the fixed
  20 bytes; options cut, a SYN's at ``-s 68``, leave the segment kept with no payload captured).
  A snap length that only cuts the payload is fine (the payload length comes from the IP
  header, or for a BIG TCP super-segment, IP total length 0, from the record's original
  length); such packets are counted apart, as ``snapped`` (not a rejection).
- ``non_ip`` / ``ipv6`` / ``non_tcp`` / ``ip_fragment`` / ``bad_header`` / ``linktype`` /
  ``no_timestamp`` (pcapng simple packet blocks) / ``bad_timestamp`` (pcapng: beyond 2116 or
  before 1970 after its interface's resolution and offset; a capture file: a packet stamped
  more than :data:`OUTLIER_GAP_NS` away from the rest of its capture, e.g. one packet in 2097):
  skipped packets.
- ``clock_backwards``: a timestamp earlier than its predecessor's in the same capture by more
  than 1 ms (a clock step). The packet is kept (and counted); the clock estimator
  (:mod:`exporters.swift.clocks`) handles the step.

Duplicates: ``tcpdump -i any`` on a host with a bridge, a VLAN or a bond records each packet
once per device it crosses, microseconds apart. A copy (same segment, same IP identification,
at most :data:`DUPLICATE_WINDOW_NS` after the previous copy in the same capture) is dropped and
counted apart (``ReadStats.duplicate``, not a rejection: nothing is wrong with the capture); a
retransmission carries a new IP identification and is kept. Without this, every segment would
have two copies at one end and one at the other (``ambiguous``: no transit figures) and every
copy would look like a retransmission.

Memory: records are framed in batches of :data:`FRAME_BATCH` (each keeps a row of first bytes
per record until it is decoded), and a record too short to hold IPv4 and TCP headers after its
link header (an empty record costs 16 bytes of file) is never copied: it is decoded in place,
only for its count.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np
import numpy.typing as npt

REASONS = (
    "truncated", "corrupt", "snaplen_headers", "non_ip", "ipv6", "non_tcp", "ip_fragment", "bad_header",
    "linktype", "no_timestamp", "bad_timestamp", "clock_backwards",
)
MAX_TS = 1 << 62  # ns (year 2116): a later or negative timestamp is damage
MAX_RECORD = 256 * 1024
# pcapng blocks that may be longer than MAX_RECORD and are skipped unread (up to MAX_SKIP): a
# section header with long options, name resolution, interface statistics, a systemd journal
# export, decryption secrets (editcap --inject-secrets: as big as the key log), custom blocks.
# Any other block that long is damage (8 flipped bytes in a stream must not make the reader
# wait for a gigabyte): corrupt.
_SKIPPABLE = frozenset({0x0A0D0D0A, 4, 5, 9, 10, 0x00000BAD, 0x40000BAD})
MAX_SKIP = 64 * 1024 * 1024
MAX_BIG_TCP = 1 << 20  # the longest IPv4 packet believed with total length 0 (BIG TCP: 512 KiB)
BACKWARDS_TOLERANCE_NS = 1_000_000
# A capture file's packets more than this away from the bulk of its timestamps are damage (one
# packet stamped in 2097 would add a 73-year transit sample): 1 day.
OUTLIER_GAP_NS = 86_400 * 1_000_000_000
IDB_MIN, EPB_MIN = 20, 32  # pcapng block lengths with the fixed fields (and the trailing length)
MAX_IFACES = 1 << 16  # interfaces per pcapng section (more: corrupt; each costs memory, a block 20 bytes)
FRAME_BATCH = 1 << 18  # records framed (and decoded) at once: bounds the framing's memory
SHORT_BATCH = 1 << 13  # records too short for IP + TCP framed at once (decoded for their count only)
DUPLICATE_WINDOW_NS = 1_000_000  # a same-capture copy of a packet (same IP id) within this is a duplicate
_BAD_IFACE = -1  # link of a damaged interface description: its packets are counted ``corrupt``
_PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),
                b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1)}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_GZIP_MAGIC = b"\x1f\x8b"  # tcpdump -z gzip, a .pcap.gz: named in the error, not read

LINK_ETHERNET, LINK_RAW, LINK_RAW_ALT, LINK_SLL, LINK_IPV4, LINK_SLL2 = 1, 101, 12, 113, 228, 276
LINK_NULL, LINK_LOOP, LINK_RAW_OPENBSD = 0, 108, 14  # BSD/macOS loopback (4-byte family), raw IP
_RAW_LINKS = (LINK_RAW, LINK_RAW_ALT, LINK_IPV4, LINK_RAW_OPENBSD)
_SUPPORTED_LINKS = (LINK_ETHERNET, LINK_SLL, LINK_SLL2, LINK_NULL, LINK_LOOP, *_RAW_LINKS)
AF_INET = 2  # DLT_NULL's family: the writer's byte order; DLT_LOOP's: network order (either is read)
_AF_INET6 = np.array([24, 28, 30], dtype=np.uint32)  # BSD's, FreeBSD's, macOS's AF_INET6
ETHERTYPE_IPV6 = 0x86DD
# The shortest record that can hold IPv4 + TCP headers (20 + 20 bytes) after the link header.
# Shorter records are never TCP segments: they are counted without being copied (see _Frames).
_IP_TCP_MIN = 40
MAX_VLAN_TAGS = 2  # VLAN tags read after a link header (QinQ: two); a third: non_ip
_SHORT = {LINK_ETHERNET: 14 + _IP_TCP_MIN, LINK_SLL: 16 + _IP_TCP_MIN, LINK_SLL2: 20 + _IP_TCP_MIN,
          LINK_NULL: 4 + _IP_TCP_MIN, LINK_LOOP: 4 + _IP_TCP_MIN}

# TCP flags
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

# First 4 payload bytes (big-endian u32) that start an HTTP request or response.
_REQ_TOKENS = np.array([int.from_bytes(t, "big") for t in (
    b"GET ", b"PUT ", b"POST", b"HEAD", b"DELE", b"COPY", b"OPTI", b"PATC")], dtype=np.uint32)
_RESP_TOKEN = int.from_bytes(b"HTTP", "big")
TOK_NONE, TOK_REQUEST, TOK_RESPONSE, TOK_INTERIM = 0, 1, 2, 3
FIRST_BYTES = 96  # data bytes per packet copied at framing: Ethernet/VLAN + IPv4 + TCP with options + 10
HEAD_BYTES = 1024  # payload kept of each HTTP message start (request line, status, X-Trans-Id)

U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
Buffer = bytes  # a whole capture file (read at once) or a stream's chunks
I64 = npt.NDArray[np.int64]
_FIELDS = ("ts", "src", "dst", "sport", "dport", "seq", "ack", "flags", "win", "plen", "tok", "ipid", "iface")


@dataclass
class Segments:
    """TCP segments of one capture, one entry per packet (struct of arrays, capture order).

    ``ts``: nanoseconds since the epoch (int64). ``src``/``dst``: IPv4 as uint32. ``plen``: the
    TCP payload length from the IP header (not the captured length; IP total length 0, BIG
    TCP: from the record's original length). ``tok``: what the payload
    starts with (``TOK_*``). ``ipid``: the IPv4 identification (tells a retransmission from a
    duplicated record). ``heads``: index -> the first payload bytes of each HTTP message start.
    """

    ts: npt.NDArray[np.int64]
    src: U32
    dst: U32
    sport: npt.NDArray[np.uint16]
    dport: npt.NDArray[np.uint16]
    seq: U32
    ack: U32
    flags: npt.NDArray[np.uint8]
    win: npt.NDArray[np.uint16]
    plen: U32
    tok: npt.NDArray[np.uint8]
    ipid: npt.NDArray[np.uint16]
    iface: npt.NDArray[np.uint16]  # the pcapng interface it was captured on (pcap: 0)
    heads: Mapping[int, bytes] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def empty(cls) -> Segments:
        z = np.zeros(0)
        return cls(z.astype(np.int64), z.astype(np.uint32), z.astype(np.uint32), z.astype(np.uint16),
                   z.astype(np.uint16), z.astype(np.uint32), z.astype(np.uint32), z.astype(np.uint8),
                   z.astype(np.uint16), z.astype(np.uint32), z.astype(np.uint8), z.astype(np.uint16),
                   z.astype(np.uint16))

    @classmethod
    def concat(cls, parts: list[Segments]) -> Segments:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        out = cls.empty()
        for n in _FIELDS:
            setattr(out, n, np.concatenate([getattr(p, n) for p in parts]))
        heads: dict[int, bytes] = {}
        base = 0
        for p in parts:
            heads.update({base + i: h for i, h in p.heads.items()})
            base += len(p)
        out.heads = heads
        return out

    def take(self, idx: npt.NDArray[np.intp] | npt.NDArray[np.bool_], heads: bool = True) -> Segments:
        """A subset (indices or a mask), heads renumbered (``heads=False``: dropped)."""
        if idx.dtype == np.bool_:
            idx = np.flatnonzero(idx)
        out = Segments.empty()
        for n in _FIELDS:
            setattr(out, n, getattr(self, n)[idx])
        if heads and self.heads and len(idx):
            keys = np.fromiter(self.heads, dtype=np.int64, count=len(self.heads))
            order = np.argsort(idx, kind="stable")
            sidx = idx[order]
            pos = np.minimum(np.searchsorted(sidx, keys), len(sidx) - 1)
            hit = sidx[pos] == keys
            out.heads = {int(order[p]): self.heads[int(k)] for k, p in zip(keys[hit], pos[hit])}
        return out


@dataclass
class ReadStats:
    """What a reader saw: packets read, segments kept, and every skipped packet by reason."""

    packets: int = 0
    segments: int = 0
    snapped: int = 0  # payload cut by the snap length (headers whole): kept
    rejected: Counter[str] = field(default_factory=Counter)
    duplicate: int = 0  # same-capture copies of a packet (tcpdump -i any across a bridge): dropped

    def add(self, other: ReadStats) -> None:
        self.packets += other.packets
        self.segments += other.segments
        self.snapped += other.snapped
        self.duplicate += other.duplicate
        self.rejected.update(other.rejected)

    def minus(self, other: ReadStats) -> ReadStats:
        return ReadStats(self.packets - other.packets, self.segments - other.segments, self.snapped - other.snapped,
                         self.rejected - other.rejected, self.duplicate - other.duplicate)


class CaptureError(ValueError):
    """Not a pcap or pcapng capture at all (unknown magic). ``reason``: what the first bytes are
    (the magic, and what it looks like); ``path``: the file, when one was read."""

    def __init__(self, reason: str, path: str | Path | None = None):
        self.reason, self.path = reason, path
        where = f": {path}" if path is not None else ""
        super().__init__(f"not a pcap or pcapng capture{where} ({reason})")


@dataclass
class _Frames:
    """Framing of a batch of records: data offset, captured length, ns, link type (as lists
    from the pcapng walk, or as arrays from the pcap one)."""

    off: list[int] = field(default_factory=list)
    cap: list[int] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    link: list[int] = field(default_factory=list)
    off_a: npt.NDArray[np.int64] | None = None
    cap_a: npt.NDArray[np.int64] | None = None
    ts_a: npt.NDArray[np.int64] | None = None
    link_a: npt.NDArray[np.int64] | None = None
    # each record's original length (the packet's on the wire; pcapng: ``orig``, a list while
    # walking); None: the captured length (records framed without it)
    orig: list[int] = field(default_factory=list)
    orig_a: npt.NDArray[np.int64] | None = None
    iface: list[int] = field(default_factory=list)  # pcapng: each record's interface id
    mat: npt.NDArray[np.uint8] | None = None  # each record's first bytes (see _first_bytes)
    prefix: int = 0  # where the packet data starts in a row of ``mat``
    # Records too short for IPv4 + TCP (_SHORT): never copied into ``mat``, decoded in place for
    # their count only (they hold no segment). ``s_before``: pcap records framed before each.
    s_off: array[int] = field(default_factory=lambda: array("q"))
    s_cap: array[int] = field(default_factory=lambda: array("q"))
    s_ts: array[int] = field(default_factory=lambda: array("q"))
    s_link: array[int] = field(default_factory=lambda: array("q"))
    s_before: array[int] = field(default_factory=lambda: array("q"))
    more: bool = False  # framing stopped at FRAME_BATCH records: more may follow

    def arrays(self) -> tuple[npt.NDArray[np.int64], ...]:
        if self.off_a is not None:
            return self.off_a, self.cap_a, self.ts_a, self.link_a  # type: ignore[return-value]
        return tuple(np.asarray(x, dtype=np.int64) for x in (self.off, self.cap, self.ts, self.link))

    def interfaces(self, n: int) -> npt.NDArray[np.uint16]:
        """Each record's interface (pcapng), else 0."""
        if len(self.iface) == n:
            return np.asarray(self.iface, dtype=np.uint16)
        return np.zeros(n, dtype=np.uint16)

    def originals(self, cap: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Each record's original length (at least its captured length: ``cap``)."""
        orig = self.orig_a if self.orig_a is not None else (np.asarray(self.orig, dtype=np.int64)
                                                              if len(self.orig) == len(cap) else cap)
        return np.maximum(orig, cap)

    def short(self) -> _Frames:
        """The short records as frames of their own (no ``mat``: read from the buffer)."""
        a = [np.frombuffer(x, dtype=np.int64) if len(x) else np.zeros(0, np.int64)
             for x in (self.s_off, self.s_cap, self.s_ts, self.s_link)]
        return _Frames(off_a=a[0], cap_a=a[1], ts_a=a[2], link_a=a[3])


    def __len__(self) -> int:
        return len(self.off_a) if self.off_a is not None else len(self.off)


@dataclass
class _Iface:
    link: int
    mult: int  # ns = raw * mult // div + offset_ns
    div: int
    offset_ns: int = 0


class StreamParser:
    """Incremental capture parser: ``feed(chunk)`` returns the segments of every complete
    record so far; ``close()`` counts a partial last record as ``truncated``.

    Used for files (one feed of the whole file) and for a live ``tcpdump -w -`` pipe (chunks).
    The format (pcap or pcapng, byte order, timestamp unit) is taken from the first bytes.
    """

    def __init__(self) -> None:
        self.stats = ReadStats()
        self._buf: bytes = b""
        self._pos = 0  # where the unread records of _buf start
        self._fmt: str | None = None  # "pcap" | "pcapng"
        self._endian = "<"
        self._link = LINK_ETHERNET
        self._ts_mult = 1000  # pcap: fraction unit -> ns
        self._ifaces: list[_Iface] = []
        self._last_ts: dict[int, int] = {}  # interface -> its latest stamp
        self._dead = False
        # pcapng: a block over MAX_RECORD that is not a packet (decryption secrets that
        # ``editcap --inject-secrets`` adds, a long comment, a custom block) is skipped, not
        # buffered: bytes of it still to come, then its trailing length to check.
        self._skip = 0
        self._trailer: int | None = None
        # the last segments' duplicate keys and stamps (a copy may come in the next chunk)
        self._recent: tuple[Segments, U64] = (Segments.empty(), np.zeros(0, np.uint64))

    # -- framing --------------------------------------------------------------------------------
    def _header(self) -> bool:
        """Parse the file header when enough bytes are there; False: need more bytes."""
        buf = self._buf
        if len(buf) < 4:
            return False
        magic = bytes(buf[:4])
        check_magic(magic)
        if magic == _PCAPNG_MAGIC:
            self._fmt = "pcapng"
            return True
        if len(buf) < 24:
            return False
        self._endian, self._ts_mult = _PCAP_MAGICS[magic]
        # The link type is the low 16 bits; above them an FCS flag and length (DAG cards)
        self._link = struct.unpack_from(self._endian + "I", buf, 20)[0] & 0xFFFF
        self._fmt = "pcap"
        self._pos = 24
        return True

    def _frame_pcap(self, fr: _Frames) -> int:
        """Walk the record headers (the only per-record Python work: one unpack each), at most
        :data:`FRAME_BATCH` records; the timestamps and lengths are then gathered with numpy at
        the offsets found."""
        buf = self._buf
        n = len(buf)
        cap_at = struct.Struct(self._endian + "I").unpack_from
        hdr_at = struct.Struct(self._endian + "III").unpack_from
        first = off = self._pos
        width = 16 + FIRST_BYTES
        short = _SHORT.get(self._link, _IP_TCP_MIN)
        # Each record's header and first data bytes, side by side (one contiguous matrix later).
        parts: list[bytes] = []
        append = parts.append
        last = n - 16  # the last offset a record header fits at
        for _ in range(FRAME_BATCH):
            if off > last:
                break
            (cap,) = cap_at(buf, off + 8)
            end = off + 16 + cap
            if cap < short or cap > MAX_RECORD:
                if cap > MAX_RECORD:
                    self.stats.rejected["corrupt"] += 1
                    self._dead = True
                    off = n
                    break
                if end > n:
                    break
                sec, frac, _ = hdr_at(buf, off)
                fr.s_off.append(off + 16)
                fr.s_cap.append(cap)
                fr.s_ts.append(sec * 1_000_000_000 + frac * self._ts_mult)
                fr.s_link.append(self._link)
                fr.s_before.append(len(parts))
                off = end
                if len(fr.s_off) >= SHORT_BATCH:
                    fr.more = True
                    break
                continue
            if end > n:
                break
            append(buf[off:off + width])
            off = end
        else:
            fr.more = True  # the batch is full, not the buffer's end
        if parts:
            mat = _as_matrix(parts, width)
            dt = np.dtype(self._endian + "u4")
            hdr = np.ascontiguousarray(mat[:, :16]).view(dt).astype(np.int64)
            fr.cap_a, fr.orig_a = hdr[:, 2], hdr[:, 3]
            ends = np.cumsum(16 + fr.cap_a)  # record i's data starts 16 bytes after the previous ends
            fr.off_a = first + 16 + np.concatenate(([0], ends[:-1]))
            if len(fr.s_off):  # ... and after the short records before it
                skipped = np.zeros(len(parts) + 1, dtype=np.int64)
                np.add.at(skipped, np.frombuffer(fr.s_before, dtype=np.int64),
                          16 + np.frombuffer(fr.s_cap, dtype=np.int64))
                fr.off_a += np.cumsum(skipped)[:-1]
            fr.ts_a = hdr[:, 0] * 1_000_000_000 + hdr[:, 1] * self._ts_mult
            fr.link_a = np.full(len(parts), self._link, dtype=np.int64)
            fr.mat, fr.prefix = mat, 16
        return off

    def _frame_pcapng(self, fr: _Frames) -> int:
        buf = self._buf
        n = len(buf)
        off = self._pos
        for _ in range(FRAME_BATCH):
            if self._trailer is not None:  # the end of a skipped block: its length again
                if off + 4 > n:
                    break
                if struct.unpack_from(self._endian + "I", buf, off)[0] != self._trailer:
                    self.stats.rejected["corrupt"] += 1
                    self._dead = True
                    return n
                self._trailer = None
                off += 4
                continue
            if off + 12 > n:
                break
            if bytes(buf[off:off + 4]) == _PCAPNG_MAGIC:  # section header: byte order
                bom = bytes(buf[off + 8:off + 12])
                if bom == b"\x4d\x3c\x2b\x1a":
                    self._endian = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    self._endian = ">"
                else:
                    self.stats.rejected["corrupt"] += 1
                    self._dead = True
                    return n
                self._ifaces = []
            e = self._endian
            btype, blen = struct.unpack_from(e + "II", buf, off)
            if blen < 12 or blen % 4 or (blen > MAX_RECORD + 64 and (btype not in _SKIPPABLE or blen > MAX_SKIP)):
                self.stats.rejected["corrupt"] += 1
                self._dead = True
                return n
            if blen > MAX_RECORD + 64:  # not a packet nor an interface: skipped unread
                self._trailer = blen
                end = off + blen - 4
                if end <= n:
                    off = end
                    continue
                self._skip = end - n
                return n
            if off + blen > n:
                break
            if btype == 1 and len(self._ifaces) >= MAX_IFACES:  # beyond any real use: not kept
                self.stats.rejected["corrupt"] += 1  # (each costs memory; its packets: linktype)
            elif btype == 1 and blen < IDB_MIN:  # no room for link type and snap length
                self.stats.rejected["corrupt"] += 1
                self._ifaces.append(_Iface(_BAD_IFACE, 1000, 1))  # keeps the later ids in place
            elif btype == 1:  # interface description
                link, _snap = struct.unpack_from(e + "HxxI", buf, off + 8)
                iface = _Iface(link, 1000, 1)  # default resolution: microseconds
                p, end = off + 16, off + blen - 4
                while p + 4 <= end:
                    code, olen = struct.unpack_from(e + "HH", buf, p)
                    if code == 0 or p + 4 + olen > end:  # end of options, or one that overruns
                        break
                    if code == 9 and olen >= 1:  # if_tsresol
                        r = buf[p + 4]
                        if r & 0x80:
                            iface.mult, iface.div = 1_000_000_000, 1 << (r & 0x7F)
                        elif r <= 9:
                            iface.mult, iface.div = 10 ** (9 - r), 1
                        else:
                            iface.mult, iface.div = 1, 10 ** (r - 9)
                    elif code == 14 and olen >= 8:  # if_tsoffset (seconds)
                        iface.offset_ns = struct.unpack_from(e + "q", buf, p + 4)[0] * 1_000_000_000
                    p += 4 + ((olen + 3) & ~3)
                self._ifaces.append(iface)
            elif btype == 6 and blen < EPB_MIN:  # no room for the packet header fields
                self.stats.packets += 1
                self.stats.rejected["corrupt"] += 1
            elif btype == 6:  # enhanced packet
                ifid, hi, lo, cap, orig = struct.unpack_from(e + "IIIII", buf, off + 8)
                broken = 28 + cap + 4 > blen or (ifid < len(self._ifaces) and self._ifaces[ifid].link == _BAD_IFACE)
                if broken or ifid >= len(self._ifaces):
                    self.stats.packets += 1
                    self.stats.rejected["corrupt" if broken else "linktype"] += 1
                else:
                    iface = self._ifaces[ifid]
                    ts = ((hi << 32) | lo) * iface.mult // iface.div + iface.offset_ns
                    if not 0 <= ts < MAX_TS:
                        self.stats.packets += 1
                        self.stats.rejected["bad_timestamp"] += 1
                    elif cap < _SHORT.get(iface.link, _IP_TCP_MIN):
                        fr.s_off.append(off + 28)
                        fr.s_cap.append(cap)
                        fr.s_ts.append(ts)
                        fr.s_link.append(iface.link)
                        if len(fr.s_off) >= SHORT_BATCH:
                            fr.more = True
                            off += blen
                            break
                    else:
                        fr.off.append(off + 28)
                        fr.cap.append(cap)
                        fr.orig.append(orig)
                        fr.ts.append(ts)
                        fr.link.append(iface.link)
                        fr.iface.append(ifid)
            elif btype in (2, 3):  # obsolete packet block / simple packet block: no usable timestamp
                self.stats.packets += 1
                self.stats.rejected["no_timestamp"] += 1
            off += blen
        else:
            fr.more = True
        if fr.off:
            fr.mat, fr.prefix = _first_bytes(buf, fr.off, FIRST_BYTES), 0
        return off

    # -- public ---------------------------------------------------------------------------------
    def feed(self, chunk: bytes, whole_file: bool = False, not_after: int | None = None) -> Segments:
        """The segments of every record completed by ``chunk``. ``whole_file``: ``chunk`` is a
        whole capture file, whose packets stamped far away from the rest are dropped
        (``bad_timestamp``, see :func:`outliers`); ``not_after`` (ns): a stream's packets stamped
        later are dropped the same way. Both before the clock check, which would otherwise
        count every later packet as ``clock_backwards``."""
        if self._dead:
            return Segments.empty()
        if self._skip:  # the rest of a big pcapng block that is not a packet
            k = min(self._skip, len(chunk))
            self._skip -= k
            chunk = chunk[k:]
            if not chunk:
                return Segments.empty()
        self._buf = bytes(self._buf) + bytes(chunk) if self._buf else chunk
        if self._fmt is None and not self._header():
            return Segments.empty()
        parts = []
        while not self._dead:  # in batches: the framing's memory is per record framed
            fr = _Frames()
            self._pos = self._frame_pcap(fr) if self._fmt == "pcap" else self._frame_pcapng(fr)
            if len(fr.s_off):  # too short for IP + TCP: counted, no segment
                decode(self._buf, fr.short(), self.stats)
            if len(fr):
                parts.append(decode(self._buf, fr, self.stats))
            if not fr.more:
                break
        segs = Segments.concat(parts)
        self._buf = b"" if self._dead else self._buf[self._pos:]
        self._pos = 0
        bad = outliers(segs.ts) if whole_file and len(segs) else None
        if not_after is not None and len(segs):
            late = segs.ts > not_after
            bad = late if bad is None else bad | late
        if bad is not None and bad.any():
            k = int(np.count_nonzero(bad))
            self.stats.rejected["bad_timestamp"] += k
            self.stats.segments -= k
            segs = segs.take(np.flatnonzero(~bad))
        segs = self._drop_duplicates(segs, last=whole_file)
        self._check_clock(segs)
        return segs

    def _drop_duplicates(self, segs: Segments, last: bool = False) -> Segments:
        """Drop (and count) same-capture copies of a packet: see the module's docstring. The
        last :data:`DUPLICATE_WINDOW_NS` of a stream's segments are kept to compare the next
        chunk's with (``last``: there is none)."""
        if not len(segs):
            return segs
        recent, recent_key = self._recent
        r = len(recent)
        key = _copy_key(segs)

        def column(name: str) -> npt.NDArray[Any]:
            now = getattr(segs, name)
            return np.concatenate([getattr(recent, name), now]) if r else now

        dup = _copies(np.concatenate([recent_key, key]) if r else key, column, DUPLICATE_WINDOW_NS)[r:]
        if dup.any():
            k = int(np.count_nonzero(dup))
            self.stats.duplicate += k
            self.stats.segments -= k
            segs, key = segs.take(np.flatnonzero(~dup)), key[~dup]
        if len(segs) and not last:  # what the next chunk's copies may be copies of
            floor = int(segs.ts.max()) - DUPLICATE_WINDOW_NS
            old, new = np.flatnonzero(recent.ts >= floor), np.flatnonzero(segs.ts >= floor)
            self._recent = (Segments.concat([recent.take(old, heads=False), segs.take(new, heads=False)]),
                            np.concatenate([recent_key[old], key[new]]))
        return segs

    def _check_clock(self, segs: Segments) -> None:
        """Count stamps going back, per interface: dumpcap with several ``-i`` writes each
        interface's buffer in turn, so a pcapng's interfaces interleave out of time order by up to
        a buffer's worth (milliseconds), which is no clock step (36-75 % of a two-interface
        capture's packets were counted)."""
        if not len(segs):
            return
        ifaces = np.unique(segs.iface) if segs.iface.any() else np.zeros(1, dtype=np.uint16)
        for k in ifaces.tolist():
            ts = segs.ts if len(ifaces) == 1 else segs.ts[segs.iface == k]
            last = self._last_ts.get(k, -(1 << 62))
            prev = np.empty_like(ts)
            prev[0] = last
            np.maximum.accumulate(ts[:-1], out=prev[1:])
            prev[1:] = np.maximum(prev[1:], last)
            back = int(np.count_nonzero(ts < prev - BACKWARDS_TOLERANCE_NS))
            if back:
                self.stats.rejected["clock_backwards"] += back
            self._last_ts[k] = max(last, int(ts.max()))

    def close(self) -> None:
        if (self._buf or self._skip or self._trailer is not None) and not self._dead:
            self.stats.rejected["truncated"] += 1
        self._buf = b""


_COPY_FIELDS = ("src", "dst", "sport", "dport", "seq", "ack", "flags", "win", "plen", "ipid")


def _copy_key(s: Segments) -> U64:
    """A cheap key per packet, equal for copies of one packet (its rows with equal keys are
    then compared field by field: a collision costs nothing but that comparison)."""
    with np.errstate(over="ignore"):
        a = (s.seq.astype(np.uint64) << np.uint64(32)) | s.ack.astype(np.uint64)
        b = ((s.sport.astype(np.uint64) << np.uint64(48)) | (s.dport.astype(np.uint64) << np.uint64(32))
             | (s.ipid.astype(np.uint64) << np.uint64(16)) | s.win.astype(np.uint64))
        c = (s.flags.astype(np.uint64) << np.uint64(32)) | s.plen.astype(np.uint64)
        return a ^ (b * np.uint64(0x9E3779B97F4A7C15)) ^ (c * np.uint64(0xC2B2AE3D27D4EB4F))


def _copies(keys: U64, column: Callable[[str], npt.NDArray[Any]], window: int) -> npt.NDArray[np.bool_]:
    """Per row (capture order): a copy, i.e. the previous row with its key has the same fields
    (``column(name)``: a field's values for every row), IP identification included, and a stamp
    at most ``window`` away. Keys are only sorted (no duplicate key: done, the usual case); rows
    whose key repeats are then ordered by all their fields and capture order and compared to
    their previous (a key shared by other packets, interleaved, does not hide a copy)."""
    n = len(keys)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    k = np.sort(keys)
    eq = k[1:] == k[:-1]
    if not eq.any():
        return out
    rows = np.flatnonzero(np.isin(keys, k[1:][eq]))  # capture order
    cols = [column(name)[rows] for name in _COPY_FIELDS]
    order = np.lexsort([rows, *cols[::-1]])  # by every field, capture order within equal fields
    rows, cols = rows[order], [c[order] for c in cols]
    a, b = rows[:-1], rows[1:]
    same = np.ones(len(a), dtype=bool)
    for c in cols:
        same &= c[1:] == c[:-1]
    ts = column("ts")
    out[b[same & (np.abs(ts[b] - ts[a]) <= window)]] = True
    return out


def check_magic(magic: bytes) -> None:
    """Raise :class:`CaptureError` unless ``magic`` (a file's first 4 bytes) starts a pcap or pcapng."""
    if magic != _PCAPNG_MAGIC and magic not in _PCAP_MAGICS:
        looks = ": gzip-compressed, decompress it first (gunzip)" if magic[:2] == _GZIP_MAGIC else ""
        raise CaptureError(f"magic {magic.hex()}{looks}")


def outliers(ts: I64, gap: int = OUTLIER_GAP_NS) -> npt.NDArray[np.bool_] | None:
    """Mask of the timestamps cut off from the capture's median by a gap of more than ``gap``
    (no packet in between) in a group of at most :data:`OUTLIER_MAX` of the packets (3, or
    0.1 %), or None when there is none. A capture spanning days keeps every packet, one with a
    quiet weekend in it too (each side is more than a few packets); one packet stamped in 2097
    (or 1970) is an outlier."""
    if not len(ts) or int(ts.max()) - int(ts.min()) <= gap:
        return None
    s = np.sort(ts)
    mid = len(s) // 2
    breaks = np.flatnonzero(np.diff(s) > gap)  # a break at i: a gap between s[i] and s[i + 1]
    before = breaks[breaks < mid]
    after = breaks[breaks >= mid]
    small = max(3, len(s) // 1000)
    # only a few packets beyond a gap are damage; drop groups from the outside in while they are
    lo_i = next((int(b) + 1 for b in before[::-1] if int(b) + 1 <= small), 0)
    hi_i = next((int(b) for b in after if len(s) - int(b) - 1 <= small), len(s) - 1)
    bad: npt.NDArray[np.bool_] = (ts < int(s[lo_i])) | (ts > int(s[hi_i]))
    return bad if bad.any() else None


def _first_bytes(buf: Buffer, starts: list[int], width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes from each start (zero-padded past the end of ``buf``), as an (n, width)
    matrix. Bytes past a short record belong to the next one: callers mask by captured length."""
    return _as_matrix([buf[o:o + width] for o in starts], width)


def _as_matrix(parts: list[bytes], width: int) -> npt.NDArray[np.uint8]:
    k = len(parts) - 1
    while k >= 0 and len(parts[k]) < width:
        parts[k] = parts[k].ljust(width, b"\0")
        k -= 1
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(parts), width)


def _gather32(u8: npt.NDArray[np.uint8], idx: npt.NDArray[np.int64], big: bool) -> npt.NDArray[np.uint32]:
    b = [u8[idx + k].astype(np.uint32) for k in range(4)]
    if not big:
        b.reverse()
    return ((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]).astype(np.uint32)


def _gather_be(u8: npt.NDArray[np.uint8], idx: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint32]:
    """Big-endian unsigned integers of ``width`` bytes at ``idx`` (indices already clipped)."""
    out: npt.NDArray[np.uint32] = u8[idx].astype(np.uint32)
    for k in range(1, width):
        out = (out << np.uint32(8)) | u8[idx + k].astype(np.uint32)
    return out


class _Heads(Mapping[int, bytes]):
    """Segment index -> the first payload bytes of an HTTP message start, cut from the capture
    buffer when first asked for (matching alone never needs them)."""

    def __init__(self, buf: Buffer, idx: npt.NDArray[np.intp], start: I64, end: I64):
        self._args: tuple[Buffer, npt.NDArray[np.intp], I64, I64] | None = (buf, idx, start, end)
        self._d: dict[int, bytes] = {}

    def _dict(self) -> dict[int, bytes]:
        if self._args is not None:
            buf, idx, start, end = self._args
            self._d = {int(i): buf[a:b] for i, a, b in zip(idx.tolist(), start.tolist(), end.tolist())}
            self._args = None
        return self._d

    def __getitem__(self, key: int) -> bytes:
        return self._dict()[key]

    def get(self, key: int, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        return self._dict().get(key, default)

    def __iter__(self) -> Iterator[int]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._args[1]) if self._args is not None else len(self._d)


class _Data:
    """The bytes of each packet's data, addressed relative to its start: from the compact matrix
    of every packet's first bytes (built while framing: sequential, cache-friendly) when it
    holds them, else from the capture buffer (rare: long IP/TCP options)."""

    def __init__(self, u8: npt.NDArray[np.uint8], off: I64, mat: npt.NDArray[np.uint8] | None, prefix: int):
        self.u8, self.off, self.mat, self.prefix = u8, off, mat, prefix
        self.width = (mat.shape[1] - prefix) if mat is not None else 0
        self.last = len(u8) - 1

    def be(self, pos: int | I64, width: int, rows: npt.NDArray[np.intp] | None = None) -> npt.NDArray[np.uint32]:
        """Big-endian unsigned ``width``-byte integers at ``pos`` (per row, or one for all)."""
        n = len(self.off) if rows is None else len(rows)
        if isinstance(pos, int):
            if self.mat is not None and pos + width <= self.width:
                col = self.prefix + pos
                block = self.mat[:, col:col + width] if rows is None else self.mat[rows, col:col + width]
                return _combine(block)
            pos = np.full(n, pos, dtype=np.int64)
        out = np.zeros(n, dtype=np.uint32)
        inside = (pos + width <= self.width) if self.mat is not None else np.zeros(n, dtype=bool)
        if inside.any():
            r = np.flatnonzero(inside)
            mrows = r if rows is None else rows[r]
            p = pos[r] + self.prefix
            p0 = int(p[0])
            if (p == p0).all():
                out[r] = _combine(self.mat[mrows, p0:p0 + width])  # type: ignore[index]
            else:
                out[r] = _combine(self.mat[mrows[:, None], p[:, None] + np.arange(width)])  # type: ignore[index]
        if not inside.all():
            r = np.flatnonzero(~inside)
            base = self.off[r if rows is None else rows[r]] + pos[r]
            out[r] = _gather_be(self.u8, np.minimum(base, self.last - width + 1), width)
        return out


_BE: dict[int, np.dtype[np.unsignedinteger[Any]]] = {1: np.dtype("u1"), 2: np.dtype(">u2"), 4: np.dtype(">u4")}


def _combine(block: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """Rows of 1, 2 or 4 bytes as big-endian integers (one copy and a view)."""
    width = block.shape[1]
    return np.ascontiguousarray(block).view(_BE[width])[:, 0].astype(np.uint32)


def _untag(be: Callable[..., npt.NDArray[np.uint32]], l3: int | I64, etype: npt.NDArray[np.uint32],
           tagged_link: npt.NDArray[np.bool_] | None) -> tuple[I64, npt.NDArray[np.uint32]]:
    """Skip up to :data:`MAX_VLAN_TAGS` VLAN tags (802.1Q 0x8100, 802.1ad 0x88a8, 0x9100) after a
    link header: each is the tag's 16-bit TPID (``etype``), 16-bit TCI, then the next type.
    ``l3``: where the link header ends (and the tag would start); ``tagged_link``: the packets
    whose link can carry tags (None: all). Linux cooked captures have their ``-i any`` tag in
    the protocol field: a cooked header whose protocol is 0x8100 is followed by TCI and type."""
    l3_a = np.full(len(etype), l3, dtype=np.int64) if isinstance(l3, int) else l3
    for _ in range(MAX_VLAN_TAGS):
        tag = (etype == 0x8100) | (etype == 0x88A8) | (etype == 0x9100)
        if tagged_link is not None:
            tag &= tagged_link
        if not tag.any():
            break
        inner = be(l3 + 2, 2) if isinstance(l3, int) and tag.all() else be(l3_a + 2, 2)
        etype = np.where(tag, inner, etype)
        l3_a = np.where(tag, l3_a + 4, l3_a)
        l3 = l3_a
    return l3_a, etype


def decode(buf: Buffer, fr: _Frames, stats: ReadStats) -> Segments:
    """Vectorised decode of the framed records of ``buf`` into TCP segments; counts rejections.
    Positions below are relative to each packet's data; ``cap`` is its captured length."""
    n = len(fr)
    stats.packets += n
    u8 = np.frombuffer(buf, dtype=np.uint8)
    off, cap, ts, link = fr.arrays()
    ifc = fr.interfaces(n)
    data = _Data(u8, off, fr.mat, fr.prefix)
    be = data.be

    bad = ~np.isin(link, _SUPPORTED_LINKS)
    # Link layer: where the IP header starts and what the link says it carries.
    eth = link == LINK_ETHERNET
    if eth.all():
        l3, etype = _untag(be, 14, be(12, 2), None)
    else:
        l3 = np.zeros(n, dtype=np.int64)
        etype = np.full(n, 0x0800, dtype=np.uint32)
        if eth.any():
            l3 = np.where(eth, 14, l3)
            etype = np.where(eth, be(12, 2), etype)
        sll = link == LINK_SLL
        if sll.any():
            l3 = np.where(sll, 16, l3)
            etype = np.where(sll, be(14, 2), etype)
        sll2 = link == LINK_SLL2
        if sll2.any():
            l3 = np.where(sll2, 20, l3)
            etype = np.where(sll2, be(0, 2), etype)
        l3, etype = _untag(be, l3, etype, eth | sll | sll2)
        loop = (link == LINK_NULL) | (link == LINK_LOOP)
        if loop.any():  # the address family, 2 in either byte order: IPv4; IPv6's 24/28/30 (BSDs, macOS)
            fam = be(0, 4)
            l3 = np.where(loop, 4, l3)
            v6 = np.isin(fam, _AF_INET6) | np.isin(fam, _AF_INET6 << 24)
            etype = np.where(loop, np.where((fam == AF_INET) | (fam == AF_INET << 24), 0x0800,
                                            np.where(v6, ETHERTYPE_IPV6, 0)), etype)
    short_l2 = ~bad & (cap < l3 + 1)
    v0 = be(l3, 1)
    # IPv6 (Swift rings may be IPv6) is not decoded: counted apart, so the report can say so
    ipv6 = ~bad & ~short_l2 & (((etype == ETHERTYPE_IPV6) & ((v0 >> 4) == 6))
                               | (np.isin(link, (LINK_RAW, LINK_RAW_ALT, LINK_RAW_OPENBSD)) & ((v0 >> 4) == 6)))
    non_ip = ~bad & ~short_l2 & ~ipv6 & ((etype != 0x0800) | ((v0 >> 4) != 4))
    non_ip |= ipv6  # (for the masks below; counted as ipv6)
    ihl = (v0 & 0x0F).astype(np.int64) * 4
    bad_ip = ~bad & ~short_l2 & ~non_ip & (ihl < 20)
    short_ip = ~bad & ~short_l2 & ~non_ip & ~bad_ip & (l3 + ihl > cap)
    ok = ~(bad | short_l2 | non_ip | bad_ip | short_ip)
    ipw = be(l3 + 2, 4)  # total length, identification
    total = (ipw >> 16).astype(np.int64)
    ipid = (ipw & 0xFFFF).astype(np.uint16)
    ipf = be(l3 + 6, 4)  # flags + fragment offset, TTL, protocol
    frag = ((ipf >> 16) & 0x3FFF) != 0
    proto = ipf & 0xFF
    non_tcp = ok & (proto != 6)
    fragment = ok & ~non_tcp & frag
    ok &= ~(non_tcp | fragment)
    t = l3 + ihl
    short_tcp = ok & (t + 20 > cap)
    ok &= ~short_tcp
    dflags = be(t + 12, 4)  # data offset, flags, window
    doff = (dflags >> 28).astype(np.int64) * 4
    # A TSO/GSO super-packet over 64 KiB carries IP total length 0 ("BIG TCP"): then the
    # payload runs to the end of the packet, whose length is the record's original length (the
    # snap length may have cut the record: the captured length would give about a snap length).
    big = total == 0
    if big.any():
        total = np.where(big, fr.originals(cap) - l3, total)
    plen = total - ihl - doff
    # The original length is the file's word: Linux's BIG TCP goes to 512 KiB (gso_max_size);
    # a claim above MAX_BIG_TCP is damage, not a segment a gigabyte long.
    bad_tcp = ok & ((doff < 20) | (plen < 0) | (big & (total > MAX_BIG_TCP)))
    ok &= ~bad_tcp
    # Options cut by the snap length (a SYN's 20 bytes at -s 68): kept, as a segment with nothing
    # of its payload captured; its ports, numbers, flags and window are in the fixed header.

    rej = stats.rejected
    for reason, mask in (("linktype", bad), ("snaplen_headers", short_l2 | short_ip | short_tcp),
                         ("non_ip", non_ip & ~ipv6), ("ipv6", ipv6), ("bad_header", bad_ip | bad_tcp),
                         ("non_tcp", non_tcp), ("ip_fragment", fragment)):
        c = int(np.count_nonzero(mask))
        if c:
            rej[reason] += c
    keep = np.flatnonzero(ok)
    everything = len(keep) == n
    rows = None if everything else keep
    if not everything:
        l3, t, doff, plen, cap, ts = l3[keep], t[keep], doff[keep], plen[keep], cap[keep], ts[keep]
        dflags, ipid, ifc = dflags[keep], ipid[keep], ifc[keep]
    pay = t + doff
    captured = np.clip(cap - pay, 0, None)
    stats.snapped += int(np.count_nonzero(captured < plen))
    has4 = (captured >= 4) & (plen >= 4)
    first4 = np.where(has4, be(pay, 4, rows), 0)
    tok = np.zeros(len(keep), dtype=np.uint8)
    tok[np.isin(first4, _REQ_TOKENS) & has4] = TOK_REQUEST
    resp = has4 & (first4 == _RESP_TOKEN)
    if resp.any():
        # "HTTP/1.1 1xx" is an interim response (100 Continue): byte 9 of the status line.
        r = np.flatnonzero(resp)
        ninth = be(pay[r] + 9, 1, keep[r])
        tok[r] = np.where((captured[r] >= 10) & (ninth == ord("1")), TOK_INTERIM, TOK_RESPONSE)
    ports = be(t, 4, rows)
    segs = Segments(
        ts=ts,
        src=be(l3 + 12, 4, rows), dst=be(l3 + 16, 4, rows),
        sport=(ports >> 16).astype(np.uint16), dport=(ports & 0xFFFF).astype(np.uint16),
        seq=be(t + 4, 4, rows), ack=be(t + 8, 4, rows),
        flags=((dflags >> 16) & 0xFF).astype(np.uint8), win=(dflags & 0xFFFF).astype(np.uint16),
        plen=plen.astype(np.uint32), tok=tok, ipid=ipid, iface=ifc,
    )
    starts = np.flatnonzero(tok)
    if len(starts):
        p0 = off[keep[starts]] + pay[starts]
        p1 = np.minimum(p0 + np.minimum(captured[starts], HEAD_BYTES), len(buf))
        segs.heads = _Heads(buf, starts, p0, p1)
    stats.segments += len(keep)
    return segs


def read_capture(path: str | Path) -> tuple[Segments, ReadStats]:
    """All TCP segments of a pcap/pcapng file. Raises :class:`CaptureError` (not a capture) or
    OSError; a damaged capture gives what could be read and counts the rest."""
    parser = StreamParser()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(4)
        if not size or not head:
            parser.stats.rejected["truncated"] += 1
            return Segments.empty(), parser.stats
        if len(head) == 4:
            try:
                check_magic(head)  # before reading a big file that is not a capture
            except CaptureError as e:
                raise CaptureError(e.reason, path) from None
        # Read, not mapped: a mapped file cut short while it is read (tcpdump -C/-W reusing the
        # name, a restarted tcpdump -w) kills the process with SIGBUS. At most the size seen at
        # open is read (a file still growing is read up to there); a file cut meanwhile gives
        # fewer bytes, its last record counted as truncated.
        f.seek(0)
        data = f.read(size)  # one allocation of ``size`` bytes
    segs = parser.feed(data, whole_file=True)
    parser.close()
    return segs, parser.stats


def ip_str(addr: int) -> str:
    return ".".join(str((int(addr) >> s) & 0xFF) for s in (24, 16, 8, 0))


def ip_int(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d
