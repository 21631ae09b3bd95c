"""Where a level's time goes, per node and per node-to-node hop, from the capture exporter's
analysis (``exporters.swift.analyze``, SWIFTX's library API).

- Node processing: the exporter's own per-node processing (``Breakdown.processing_by("node")``:
  the node's own time, request in -> response out minus its receive wait (the body after a
  100 Continue, a slow link) and its fan-out wait (its calls, concurrent ones once)).
- Hop time of a call: each call is seen twice, as a client-side exchange at the calling node
  and a server-side exchange at the called node (same connection, same order on it). Its hop
  time is the request's transit (last request byte sent by the caller -> received by the callee)
  plus the response's transit (last response byte sent -> received). The lab's namespaces share
  one clock, so the difference needs no offset (the exporter's clock model reports offset 0).
  Grouped by ``caller->callee`` node names and by the callee's role (``proxy->s1/object``).

The bench compares these per-node and per-hop means between a baseline run and an injected one.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from exporters.swift.analyze import Breakdown, analyze
from exporters.swift.match import HOW_AMBIGUOUS
from exporters.swift.roles import load_roles


def _mean_ms(values: list[int] | list[float]) -> float | None:
    return round(sum(values) / len(values) / 1e6, 4) if values else None


def _pairs(b: Breakdown) -> list[tuple[str, Any, Any]]:
    """(``caller->callee/role``, caller's client-side exchange, callee's server-side exchange)
    for every call seen at both ends (same connection, paired in order on it)."""
    by_conn: dict[tuple[str, Any, Any], list[Any]] = defaultdict(list)
    for x in b.exchanges:
        by_conn[(x.side, x.client, x.server)].append(x)
    out: list[tuple[str, Any, Any]] = []
    for (side, client, server), calls in by_conn.items():
        if side != "client":
            continue
        served = by_conn.get(("server", client, server))
        if not served:
            continue
        calls.sort(key=lambda x: x.req_start)
        served.sort(key=lambda x: x.req_start)
        for c, s in zip(calls, served, strict=False):
            if s.req_end < c.req_end or c.resp_end < s.resp_end:  # mis-paired (lost on one side)
                continue
            out.append((f"{b.nodes[c.node]}->{b.nodes[s.node]}/{s.server_role}", c, s))
    return out


def hop_times(b: Breakdown) -> dict[str, list[int]]:
    """``caller->callee/role`` -> per-call hop time (ns): the request's last byte's transit plus
    the response's last byte's transit."""
    out: dict[str, list[int]] = defaultdict(list)
    for key, c, s in _pairs(b):
        out[key].append((s.req_end - c.req_end) + (c.resp_end - s.resp_end))
    return dict(out)


def transfer_times(b: Breakdown) -> dict[str, list[int]]:
    """``caller->callee/role`` -> per-call request transfer (ns): the caller's first request byte
    sent (with ``Expect: 100-continue``: its first body byte, after the callee's 100 Continue: the
    wait for that handshake, e.g. for the other replicas' 100s, is not the link's) -> the callee's
    last request byte received. On a slow link it grows by about the bytes
    over the link's rate (the sender is paced by the link), where per-segment transit only shows
    the queue (about a congestion window over the rate)."""
    out: dict[str, list[int]] = defaultdict(list)
    for key, c, s in _pairs(b):
        out[key].append(s.req_end - (c.body_start if c.body_start is not None else c.req_start))
    return dict(out)


def segment_transit(b: Breakdown) -> dict[str, dict[str, float]]:
    """``sender->receiver`` node pair -> mean and p99 one-way transit (ms) of matched segments
    (the exporter's per-segment, clock-corrected transit; ambiguous matches left out)."""
    m = b.matches
    ok = (m.how != HOW_AMBIGUOUS) & (b.transit >= 0)
    out: dict[str, dict[str, float]] = {}
    if not ok.any():
        return out
    pair = m.snode[ok] * 1000 + m.rnode[ok]
    tr = b.transit[ok]
    for p in np.unique(pair).tolist():
        v = tr[pair == p]
        out[f"{b.nodes[p // 1000]}->{b.nodes[p % 1000]}"] = {
            "mean": round(float(v.mean()) / 1e6, 4), "p99": round(float(np.percentile(v, 99)) / 1e6, 4),
            "count": int(len(v))}
    return out


def node_view(b: Breakdown) -> dict[str, Any]:
    """The per-node and per-hop means (ms) of one analysis, plus the exporter's own summary
    figures the bench reports (phases, matching, joins, TCP trouble)."""
    proc = b.processing_by("node")
    proc_role: dict[str, list[int]] = defaultdict(list)
    for x in b.exchanges:
        if x.side == "server" and x.processing is not None:
            proc_role[f"{b.nodes[x.node]}/{x.server_role}"].append(x.processing)
    waits: dict[str, list[int]] = defaultdict(list)
    for x in b.exchanges:
        if x.side == "server" and x.processing is not None:
            waits[f"{b.nodes[x.node]}/{x.server_role}/receive"].append(x.receive_wait or 0)
            waits[f"{b.nodes[x.node]}/{x.server_role}/fanout"].append(x.fanout_wait or 0)
    hops = hop_times(b)
    transfers = transfer_times(b)
    s = b.summary()
    return {
        "processing_ms": {k: _mean_ms(v) for k, v in sorted(proc.items())},
        "processing_count": {k: len(v) for k, v in sorted(proc.items())},
        "processing_by_service_ms": {k: _mean_ms(v) for k, v in sorted(proc_role.items())},
        # what each service waited for (mean ms): receive (its request's body), fanout (its calls)
        "wait_ms": {k: _mean_ms(v) for k, v in sorted(waits.items())},
        "hop_ms": {k: _mean_ms(v) for k, v in sorted(hops.items())},
        "hop_count": {k: len(v) for k, v in sorted(hops.items())},
        "transfer_ms": {k: _mean_ms(v) for k, v in sorted(transfers.items())},
        "segment_transit_ms": segment_transit(b),
        "processing_sum_ms": {k: round(sum(v) / 1e6, 3) for k, v in sorted(proc.items())},
        "phases_ms": {k: round(v["mean"] * 1e3, 4) for k, v in s["phases"].items() if v.get("count")},
        "matching": s["matching"],
        "joins": s["joins"],
        "retransmissions": s["retransmissions"],
        "resets": s["resets"],
        "connection_failures": s["connection_failures"],
        "segments": {n: r["segments"] for n, r in s["read"].items()},
    }


def analyze_dir(capture_dir: Path, roles_file: Path, nodes: list[str]) -> tuple[Breakdown, dict[str, Any]]:
    """Analyse ``capture_dir/<node>.pcap`` for every node with the lab's roles.json."""
    b = analyze({n: capture_dir / f"{n}.pcap" for n in nodes}, load_roles(mapping=roles_file))
    return b, node_view(b)
