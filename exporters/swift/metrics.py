"""Prometheus metrics of the packet-timing analysis: one Collector fed with each Breakdown.

Histograms are accumulated with numpy (``np.searchsorted`` + ``np.bincount`` per label set):
an analysis of 200,000 matched segments would cost a second of ``Histogram.observe`` calls.
``collect()`` yields fresh metric families from the accumulated counts (the client_python
pattern for a source that is not a simple event stream).

Label values are bounded: roles (``exporters.swift.roles.ROLES`` plus the mapping's own),
node names (the configured captures), phases, reasons, ``how``/``result`` enums.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from exporters.swift.analyze import Breakdown
from exporters.swift.exchanges import phase_samples
from exporters.swift.match import HOW_NAMES
from exporters.swift.pcap import REASONS, ReadStats

PREFIX = "promreflex_swift"
TRANSIT_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0)
PROCESSING_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0)
PHASES = ("auth", "account", "container", "object")
DEFAULT_NODE_THRESHOLD = 0.25  # s: a Swift server holding a request longer at p99 is slow
DEFAULT_HOP_THRESHOLD = 0.005  # s: one-way transit on a LAN/veth is microseconds; 5 ms is queueing
#: Hops created at 0 from the start (rates and alerts work from the first event).
STANDARD_HOPS = (("client", "proxy"), ("proxy", "client"), ("proxy", "account"), ("account", "proxy"),
                 ("proxy", "container"), ("container", "proxy"), ("proxy", "object"), ("object", "proxy"))
JOIN_RESULTS = ("trans_id", "timing", "ambiguous", "orphan")


class _Hist:
    """Cumulative histogram state per label tuple."""

    def __init__(self, buckets: Sequence[float]):
        self.edges = np.asarray(buckets, dtype=np.float64)
        self.counts: dict[tuple[str, ...], npt.NDArray[np.int64]] = {}
        self.sums: dict[tuple[str, ...], float] = defaultdict(float)

    def touch(self, labels: tuple[str, ...]) -> None:
        if labels not in self.counts:
            self.counts[labels] = np.zeros(len(self.edges) + 1, dtype=np.int64)

    def add(self, labels: tuple[str, ...], seconds: npt.ArrayLike) -> None:
        v = np.asarray(seconds, dtype=np.float64)
        self.touch(labels)
        if not len(v):
            return
        # Prometheus buckets are "le": a value equal to an edge belongs to that bucket.
        idx = np.searchsorted(self.edges, v, side="left")
        self.counts[labels] += np.bincount(idx, minlength=len(self.edges) + 1)
        self.sums[labels] += float(v.sum())

    def family(self, name: str, doc: str, label_names: Sequence[str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=label_names)
        for labels, counts in sorted(self.counts.items()):
            cum = np.cumsum(counts)
            buckets = [(_fmt(e), float(c)) for e, c in zip(self.edges, cum[:-1])] + [("+Inf", float(cum[-1]))]
            fam.add_metric(list(labels), buckets, self.sums[labels])
        return fam


def _fmt(x: float) -> str:
    return repr(float(x))


class SwiftTimingCollector(Collector):
    """All ``promreflex_swift_*`` series. ``add(breakdown)`` accumulates one analysis (a
    capture set, or one window of a live capture)."""

    def __init__(self, nodes: Iterable[str] = (), registry: CollectorRegistry | None = None, *,
                 node_threshold_s: float = DEFAULT_NODE_THRESHOLD, hop_threshold_s: float = DEFAULT_HOP_THRESHOLD):
        self._lock = threading.Lock()
        # Named thresholds for the rules (rules/swift.rules.yml compares the p99s with these).
        self.thresholds = {"node_processing": node_threshold_s, "hop_transit": hop_threshold_s}
        self.transit = _Hist(TRANSIT_BUCKETS)
        self.processing = _Hist(PROCESSING_BUCKETS)
        self.phase = _Hist(PROCESSING_BUCKETS)
        self.wait = _Hist(PROCESSING_BUCKETS)
        self.counters: dict[str, dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
        self.gauges: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self.analyses = 0
        self.last_duration = 0.0
        self._last_end = 0.0
        for hop in STANDARD_HOPS:
            self.transit.touch(hop)
            self.counters["retransmissions"][hop] += 0
            self.counters["resets"][hop] += 0
        for ph in PHASES:
            self.phase.touch((ph,))
        for r in ("proxy", "account", "container", "object"):
            self.counters["connections"][(r,)] += 0
            self.counters["connection_failures"][(r,)] += 0
        for how in HOW_NAMES:
            self.counters["matched"][(how,)] += 0
        for side in ("egress", "ingress"):
            self.counters["unmatched"][(side,)] += 0
        for res in JOIN_RESULTS:
            self.counters["joins"][(res,)] += 0
        self.counters["joins_late"][()] += 0
        self.counters["unmeasured"][()] += 0
        for node in nodes:
            self._touch_node(node)
        if registry is not None:
            registry.register(self)

    def _touch_node(self, node: str) -> None:
        self.counters["packets"][(node,)] += 0
        self.counters["snapped"][(node,)] += 0
        self.counters["duplicate"][(node,)] += 0
        for reason in REASONS:
            self.counters["rejected"][(node, reason)] += 0

    def add(self, b: Breakdown, seconds: float | None = None) -> None:
        with self._lock:
            self._add(b)
            self.analyses += 1
            if seconds is not None:
                self.last_duration = seconds
            self._last_end = time.time()

    def add_read(self, read: Mapping[str, ReadStats]) -> None:
        """Packets read per node (live mode publishes them at every tick, windows or not)."""
        with self._lock:
            self._add_read(read)

    def _add_read(self, read: Mapping[str, ReadStats]) -> None:
        c = self.counters
        for node, st in read.items():
            self._touch_node(node)
            c["packets"][(node,)] += st.packets
            c["snapped"][(node,)] += st.snapped
            c["duplicate"][(node,)] += st.duplicate
            for reason, n in st.rejected.items():
                c["rejected"][(node, reason)] += n

    def _add(self, b: Breakdown) -> None:
        c = self.counters
        self._add_read(b.read)
        for hop, values in b.hops().items():
            self.transit.add(hop, values / 1e9)
        for x in b.exchanges:
            if x.side == "server":
                if x.processing is not None:
                    key = (b.nodes[x.node], x.server_role)
                    self.processing.add(key, [x.processing / 1e9])
                    self.wait.add((*key, "receive"), [(x.receive_wait or 0) / 1e9])
                    self.wait.add((*key, "fanout"), [(x.fanout_wait or 0) / 1e9])
                c["requests"][(b.nodes[x.node], x.server_role, x.method, _code_class(x.status))] += 1
        for ph, _, ns in phase_samples(b.exchanges):
            self.phase.add((ph,), [ns / 1e9])
        how = b.matches.how
        for i, name in enumerate(HOW_NAMES):
            c["matched"][(name,)] += int(np.count_nonzero(how == i))
        c["unmatched"][("egress",)] += b.matches.counts.get("unmatched_egress", 0)
        c["unmatched"][("ingress",)] += b.matches.counts.get("unmatched_ingress", 0)
        joins = b.joins.as_dict()
        for res in JOIN_RESULTS:
            c["joins"][(res,)] += joins[res]
        c["joins_late"][()] += joins["late"]
        for key, n in b.unanswered.items():
            c["unanswered"][key] += n
        c["unmeasured"][()] += joins["uncertain"]
        for hop, n in b.retransmissions.items():
            c["retransmissions"][hop] += n
        for hop, n in b.resets.items():
            c["resets"][hop] += n
        for role, n in b.connections.items():
            c["connections"][(role,)] += n
        for role, n in b.connection_failures.items():
            c["connection_failures"][(role,)] += n
        model = b.clocks
        if model.reference is not None:
            ref = b.nodes[model.reference]
            for ni, off in model.node_offset.items():
                self.gauges["offset"][(b.nodes[ni], ref)] = off / 1e9
                self.gauges["offset_error"][(b.nodes[ni], ref)] = model.node_error.get(ni, 0) / 1e9
        for (a, bb), pc in model.pairs.items():
            c["clock_jumps"][(b.nodes[a], b.nodes[bb])] += pc.jumps

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        with self._lock:
            yield self.transit.family(f"{PREFIX}_hop_transit_seconds",
                                      "One-way transit of matched TCP segments, clock-corrected, by hop.",
                                      ["src_role", "dst_role"])
            yield self.processing.family(f"{PREFIX}_node_processing_seconds",
                                         "A node's own time with a request: request in -> response out, minus "
                                         "its waits (see promreflex_swift_node_wait_seconds).",
                                         ["node", "role"])
            yield self.wait.family(f"{PREFIX}_node_wait_seconds",
                                   "What a node waited for while holding a request: receive (the request's "
                                   "body after 100 Continue, a slow sender or link), fanout (its calls to other "
                                   "nodes, concurrent ones once: the proxy's wait for its slowest replica).",
                                   ["node", "role", "wait"])
            yield self.phase.family(f"{PREFIX}_phase_seconds",
                                    "Request phases seen at the proxy: auth, account, container, object.",
                                    ["phase"])
            specs: tuple[tuple[str, str, str, list[str]], ...] = (
                ("requests", "requests", "HTTP requests answered, by node, server role, method and status class.",
                 ["node", "role", "method", "code"]),
                ("retransmissions", "retransmissions", "Retransmitted TCP segments, by hop.", ["src_role", "dst_role"]),
                ("resets", "resets", "TCP resets, by hop (each counted once over all captures).",
                 ["src_role", "dst_role"]),
                ("connections", "connections", "TCP connection attempts, by the role connected to.", ["role"]),
                ("connection_failures", "connection_failures",
                 "TCP connection attempts never answered by a SYN-ACK, by the role connected to.", ["role"]),
                ("matched", "segments_matched", "Segments matched across captures, by how.", ["how"]),
                ("unmatched", "segments_unmatched",
                 "Segments seen at one end only (egress: not seen arriving; ingress: no sender capture).", ["side"]),
                ("joins", "joins", "Proxy calls joined to the client request they serve, by result.", ["result"]),
                ("joins_late", "joins_late",
                 "Joined calls answered after the request they served was (the caller gave up: a hung server).", []),
                ("unanswered", "calls_unanswered",
                 "Calls with no answer when their connection closed (the caller gave up: a hung server), "
                 "by the node and role called.", ["node", "role"]),
                ("unmeasured", "processing_unmeasured",
                 "Requests given no processing figure: an ambiguous call may be theirs (not guessed).", []),
                ("packets", "packets", "Packets read from the captures.", ["node"]),
                ("snapped", "packets_snapped",
                 "Packets whose payload the snap length cut (headers whole: still used).", ["node"]),
                ("duplicate", "packets_duplicate",
                 "Same-capture copies of a packet (tcpdump -i any across a bridge, VLAN or bond), dropped.",
                 ["node"]),
                ("rejected", "packets_rejected", "Packets (or records) not used, by reason.", ["node", "reason"]),
                ("clock_jumps", "clock_jumps", "Steps in a pair's estimated clock offset.", ["node", "peer"]),
            )
            for key, name, doc, labels in specs:
                fam = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
                for lv, v in sorted(self.counters[key].items()):
                    fam.add_metric(list(lv), v)
                yield fam
            for key, name, doc in (
                ("offset", "clock_offset_seconds", "Estimated clock offset of a node against the reference node."),
                ("offset_error", "clock_offset_error_seconds", "Bound of the clock offset estimate's error."),
            ):
                g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["node", "reference"])
                for lv, v in sorted(self.gauges[key].items()):
                    g.add_metric(list(lv), v)
                yield g
            for key, doc in (("node_processing", "Node processing p99 above which SwiftNodeSlow fires."),
                             ("hop_transit", "Hop transit p99 above which SwiftHopSlow fires.")):
                g = GaugeMetricFamily(f"{PREFIX}_{key}_threshold_seconds", doc)
                g.add_metric([], self.thresholds[key])
                yield g
            a = CounterMetricFamily(f"{PREFIX}_analyses", "Analyses run (capture sets, or live windows).")
            a.add_metric([], self.analyses)
            yield a
            d = GaugeMetricFamily(f"{PREFIX}_last_analysis_seconds", "Wall time of the last analysis.")
            d.add_metric([], self.last_duration)
            yield d
            t = GaugeMetricFamily(f"{PREFIX}_last_analysis_timestamp_seconds", "When the last analysis ended.")
            t.add_metric([], self._last_end)
            yield t



def _code_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "none"
