"""Timing diagram of one request or a time window, like the paper's Figures 15 and 16.

A lane per node (left to right in capture order), time running down, one line per matched
segment from its send time on the sender's lane to its arrival on the receiver's lane (data:
coloured by the hop's destination role; pure ACKs: thin grey). Each request is labelled where it
leaves its sender, and each server's own processing is a bar on its
lane (``exchanges.own_spans``: e.g. headers in -> ``100 Continue`` out, then last body byte in ->
response out; its wait for the body and for its calls is left blank). Times are brought onto the reference node's clock with the estimated offsets.

PNG or SVG by the output file's extension (matplotlib, Agg backend: no display needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exporters.swift.analyze import Breakdown
from exporters.swift.exchanges import own_spans
from exporters.swift.match import flow_hash
from promreflex.errors import UserError

_COLORS = {"proxy": "tab:blue", "account": "tab:green", "container": "tab:orange", "object": "tab:red",
           "client": "tab:purple", "storage": "tab:brown", "other": "tab:gray"}


def _tree(b: Breakdown, root: int) -> list[int]:
    """The request, its calls, and the same calls seen at the other end (same connection)."""
    picked = [root, *b.exchanges[root].children]
    for p in list(picked):
        px = b.exchanges[p]
        best: dict[int, tuple[int, int]] = {}  # node -> (distance, index)
        for j, x in enumerate(b.exchanges):
            if x.node != px.node and (x.client, x.server) == (px.client, px.server):
                dist = abs(x.req_start - px.req_start)
                if dist < 1_000_000_000 and dist < best.get(x.node, (1 << 62, -1))[0]:
                    best[x.node] = (dist, j)
        picked += [j for _, j in best.values() if j not in picked]
    return picked


def select_request(b: Breakdown, trans_id: str | None = None, index: int | None = None) -> int:
    """Index (in ``b.exchanges``) of the client request named by transaction id or by its rank
    (0 = the first request the proxy answered)."""
    served = sorted((i for i, x in enumerate(b.exchanges) if x.side == "server" and x.server_role == "proxy"),
                    key=lambda i: b.exchanges[i].req_start)
    if trans_id is not None:
        for i in served:
            if b.exchanges[i].trans_id == trans_id:
                return i
        hits = [i for i, x in enumerate(b.exchanges) if x.trans_id == trans_id]
        if hits:
            return hits[0]
        raise UserError(f"no request with transaction id {trans_id!r} in the captures "
                        f"(ids are read from X-Trans-Id headers: is the snap length large enough?)")
    if not served:
        raise UserError("no request answered by the proxy in the captures")
    k = index or 0
    if not 0 <= k < len(served):
        raise UserError(f"--request-index {k}: the captures hold {len(served)} proxy requests (0..{len(served) - 1})")
    return served[k]


def draw(b: Breakdown, out: str | Path, *, trans_id: str | None = None, index: int | None = None,
         window: tuple[float, float] | None = None, max_segments: int = 5000, acks: bool = True) -> dict[str, int]:
    """Draw one request (``trans_id`` or ``index``) or a window (epoch seconds, reference clock).
    Returns what was drawn: segments, exchanges."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = b.matches
    off = {n: b.clocks.node_offset.get(n, 0) for n in range(len(b.nodes))}
    offs = np.array([off[n] for n in range(len(b.nodes))], dtype=np.int64)
    ts = m.t_send - offs[m.snode] if len(m) else m.t_send
    tr = m.t_recv - offs[m.rnode] if len(m) else m.t_recv
    if window is not None:
        lo, hi = int(window[0] * 1e9), int(window[1] * 1e9)
        sel = (ts >= lo) & (ts < hi)
        xs = [i for i, x in enumerate(b.exchanges) if lo <= x.req_start - off[x.node] < hi]
        title = f"window {window[0]:.3f} - {window[1]:.3f}"
    else:
        root = select_request(b, trans_id, index)
        xs = _tree(b, root)
        rx = b.exchanges[root]
        lo = min(b.exchanges[i].out_start - off[b.exchanges[i].node] for i in xs) - 200_000
        hi = max(b.exchanges[i].resp_end - off[b.exchanges[i].node] for i in xs) + 200_000
        conn_keys = set()
        for i in xs:
            x = b.exchanges[i]
            for (a_ip, a_port), (z_ip, z_port) in ((x.client, x.server), (x.server, x.client)):
                h = flow_hash(np.array([a_ip], np.uint32), np.array([z_ip], np.uint32),
                              np.array([a_port], np.uint16), np.array([z_port], np.uint16))
                conn_keys.add(int(h[0]))
        fh = flow_hash(m.src, m.dst, m.sport, m.dport)
        sel = np.isin(fh, np.fromiter(conn_keys, dtype=np.uint64)) & (ts >= lo) & (tr < hi)
        title = f"{rx.method} {rx.path_kind} {rx.trans_id or ''} ({(rx.resp_end - rx.req_start) / 1e6:.2f} ms at the proxy)"
    if not acks:
        sel &= m.plen > 0
    idx = np.flatnonzero(sel)[:max_segments]
    if not len(idx) and not xs:
        raise UserError("nothing to draw: no matched segment in that request or window")
    t0 = lo
    fig_h = 8 if len(idx) < 400 else 12
    fig, ax = plt.subplots(figsize=(2.2 * len(b.nodes) + 3, fig_h))
    for lane in range(len(b.nodes)):
        ax.axvline(lane, color="black", lw=0.8)
    for i in idx.tolist():
        data = int(m.plen[i]) > 0
        role = b.role_names[int(b.hop_dst[i])]
        ax.plot([int(m.snode[i]), int(m.rnode[i])], [(ts[i] - t0) / 1e6, (tr[i] - t0) / 1e6],
                color=_COLORS.get(role, "tab:gray") if data else "0.7", lw=1.2 if data else 0.5, alpha=0.9)
    for i in xs:
        x = b.exchanges[i]
        o = off[x.node]
        if x.side == "server":
            for a, z in own_spans(x, b.exchanges):
                ax.plot([x.node, x.node], [(a - o - t0) / 1e6, (z - o - t0) / 1e6],
                        color="black", lw=5, alpha=0.35, solid_capstyle="butt")
        else:
            ax.annotate(f"{x.method} {x.server_role} {x.status or ''}", ((x.node), (x.req_start - o - t0) / 1e6),
                        xytext=(4, 0), textcoords="offset points", fontsize=7, va="center")
    ax.set_xticks(range(len(b.nodes)))
    ax.set_xticklabels(b.nodes)
    ax.set_xlim(-0.5, len(b.nodes) - 0.5)
    ax.invert_yaxis()
    ax.set_ylabel("time (ms, reference clock)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    handles = [plt.Line2D([], [], color=c, label=f"to {r}") for r, c in _COLORS.items()
               if r in {b.role_names[int(b.hop_dst[i])] for i in idx.tolist()}]
    handles.append(plt.Line2D([], [], color="0.7", lw=0.5, label="pure ACK"))
    handles.append(plt.Line2D([], [], color="black", lw=5, alpha=0.35, label="server processing"))
    ax.legend(handles=handles, loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return {"segments": int(len(idx)), "exchanges": len(xs)}
