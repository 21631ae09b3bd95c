"""HTTP exchanges seen by each node, the proxy's joins, node processing and request phases.

**Exchanges.** On each captured connection (HTTP/1.1, keep-alive, no pipelining: what Swift
and python-swiftclient do), a request starts with a segment whose payload begins with a method,
the connection's first or one after the previous request's final response began (a body segment
may begin with ``COPY`` or ``GET /``: an object's content), and a final response with ``HTTP/``
and a status other than 1xx (``100 Continue`` is interim). Pipelined requests (several sent
before the first answer) are read as one exchange.
Times come from the capture of the node itself: ``req_start`` (first request segment),
``req_end`` (last request segment before the final response: the body after a 100 Continue
included), ``resp_start``, ``resp_end`` (last response segment before the next request).
A capture cut by a snap length below ~70 bytes (no payload) cannot be split into exchanges; the
segment matching and transit figures still work.

**Joins.** The proxy terminates TCP: a segment to a storage server is on another connection
than the client's request it serves. A proxy-side exchange (``side="client"``: the proxy calls a
storage server) is joined to the client request the proxy was serving at that moment: the
server-side exchange on the same node whose ``[req_start, resp_start]`` contains the call's
``[req_start, resp_end]``. Swift's transaction id (``X-Trans-Id`` in the headers, when the snap
length keeps them) settles the join when several client requests are open (``trans_id``);
otherwise one candidate is ``timing``; several are ``ambiguous``: the call is joined to none of
them, and none of them gets a processing figure (each could be the one that waited for it:
guessing once charged 213 of 282 calls of a 6-client run to the wrong request, its proxy
processing p99 182 ms for 82); none is ``orphan`` (a background call: replication, an updater).
Only a server that can make the call is a candidate (Swift's request path: the proxy calls every
storage service, an object server its container's, a container server its account's, an account
server no one): the object, container and account servers of a node share a transaction id.
A call's own transaction id is looked for first, among the requests open when it started: so a
call answered after the request it served was (the caller gave up on a hung server: Swift's
``node_timeout``) is joined, counted ``late``, its wait up to the request's answer fan-out wait,
not the caller's processing; and a call whose id is none of theirs (an updater replaying an old
update) is an orphan. A call never answered (its connection closed by the caller) is an exchange
ending at the close (``answered`` False). Without ids, only a call within a request's span is
joined (by timing).

**Node processing** (the node's own time with a request), per server-side exchange of a
node: the span ``[req_start, resp_start]`` minus what the node waits for.
- *Receive wait*: the request arriving. The node's time starts when the last request byte is in
  (``req_end``), except for what it did with the request's head before that: the head in ->
  its first action (an interim ``100 Continue`` out, or its first call out) counts. So with
  ``Expect: 100-continue`` (Swift's proxy -> object server PUTs): headers in -> ``100 Continue``
  out, then last body byte in -> final response out. The time between (the proxy waiting for
  every replica's 100 Continue before it sends any body, a slow link delivering the body) is the
  caller's or the network's, not the node's: ``receive_wait``.
- *Fan-out wait*: the union of the node's calls (each from its ``out_start`` to its
  ``resp_end``), clipped to the span: concurrent calls (the proxy's replica PUTs) count once,
  up to the slowest one's answer: ``fanout_wait``.
``processing + receive_wait + fanout_wait = resp_start - req_start``. A leaf server without a
100 Continue gets ``resp_start - req_end``.

**Phases**: ``auth`` is a ``/auth`` request at the proxy (tempauth), one sample per request;
``account`` / ``container`` / ``object`` the proxy's calls to those servers, one sample per
client request and phase: the proxy's first call of that phase out -> the last answer in (a PUT
to three replicas is one object phase, as long as its slowest replica); a call joined to no
client request (``orphan``) is its own sample (``out_start`` -> ``resp_end`` seen at the proxy).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporters.swift.match import Directed, flow_hash
from exporters.swift.pcap import ACK, FIN, RST, SYN, TOK_INTERIM, TOK_REQUEST, TOK_RESPONSE
from exporters.swift.roles import RoleMap

I64 = npt.NDArray[np.int64]

_TXID = re.compile(rb"\r\nx-trans-id: *([!-~]{1,80})", re.IGNORECASE)
CUT = "\u2026"  # marks a request target the snap length cut (a prefix of the real one)
_METHODS = ("GET", "PUT", "POST", "HEAD", "DELETE", "COPY", "OPTIONS", "PATCH")


@dataclass
class Exchange:
    node: int
    side: str  # "server": the node answers it; "client": the node asked it
    client: tuple[int, int]  # (ip, port)
    server: tuple[int, int]
    server_role: str
    client_role: str
    req_start: int
    req_end: int
    resp_start: int
    resp_end: int
    method: str = "other"
    path_kind: str = "other"  # auth | account | container | object | info | other
    status: int = 0
    trans_id: str | None = None
    target: str = ""  # the request line's target (path), for joining with Swift's access logs
    connect_start: int | None = None  # the SYN of its connection, for the first exchange on it
    parent: int | None = None  # index of the server-side exchange it serves (joins)
    join: str | None = None  # trans_id | timing | ambiguous | orphan
    late: bool = False  # joined by its id and start: answered after the request it served was
    answered: bool = True  # False: no final response when its connection closed (resp_* = the close)
    still_open: bool = False  # not answered, connection open at the capture's end (resp_* = that end)
    until: int | None = None  # a late call: when the request it served was answered (phases end there)
    uncertain: bool = False  # server side: an ambiguous call may be its: no processing figure
    children: list[int] = field(default_factory=list)
    processing: int | None = None  # ns, for side == "server": the node's own time (module doc)
    receive_wait: int | None = None  # ns, side == "server": waiting for the request's body
    fanout_wait: int | None = None  # ns, side == "server": waiting for its calls (union)
    interim: int | None = None  # a 1xx (100 Continue) seen before the final response, this capture
    body_start: int | None = None  # the first request segment after that interim (the body's)

    @property
    def out_start(self) -> int:
        """When the calling node started this call: its connection's SYN when the call opened
        the connection (the handshake is the network's time, not the node's), else its request."""
        return self.connect_start if self.connect_start is not None else self.req_start

    @property
    def duration(self) -> int:
        return self.resp_end - self.req_start


def _path_kind(path: str) -> str:
    if path.startswith("/auth"):
        return "auth"
    if path.startswith("/info"):
        return "info"
    parts = [p for p in path.split("?")[0].split("/") if p]
    # proxy paths: /v1/AUTH_x[/c[/o]]; storage server paths: /dev/part/AUTH_x[/c[/o]]
    if parts and parts[0].startswith("v1"):
        parts = parts[1:]
    elif len(parts) >= 2 and parts[1].isdigit():
        parts = parts[2:]
    return {0: "other", 1: "account", 2: "container"}.get(len(parts), "object")


def _parse_request(head: bytes | None) -> tuple[str, str, str | None, str]:
    if not head:
        return "other", "other", None, ""
    line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    bits = line.split(" ")
    method = bits[0] if bits and bits[0] in _METHODS else "other"
    kind = _path_kind(bits[1]) if len(bits) > 1 else "other"
    m = _TXID.search(head)
    target = bits[1][:512] if len(bits) > 1 else ""
    # the snap length cut the request line, or the target is longer than kept: a prefix
    if b"\r\n" not in head or len(bits) > 1 and len(bits[1]) > 512:
        target += CUT
    return method, kind, m.group(1).decode("ascii") if m else None, target


def _parse_response(head: bytes | None) -> tuple[int, str | None]:
    if not head:
        return 0, None
    line = head.split(b"\r\n", 1)[0]
    try:
        status = int(line.split(b" ")[1][:3])
    except (IndexError, ValueError):
        status = 0
    m = _TXID.search(head)
    return status, m.group(1).decode("ascii") if m else None


def exchanges_of(d: Directed, roles: RoleMap, start_index: int = 0) -> list[Exchange]:
    """The HTTP exchanges of one node's capture (data segments, retransmissions left out). A
    request this node sent that had no final response when its connection closed (FIN or RST
    seen after it: the caller gave up on a hung server, Swift's ``node_timeout``, or the server
    dropped it) is an exchange too, ``answered`` False, ending at the close: the caller waited
    for it until then; one still unanswered on an open connection at the capture's end (live
    mode: what is buffered so far) ends there, ``still_open``: joined by its id only, it makes a
    request answered meanwhile wait for it (a late call) rather than process."""
    s = d.segs
    data = np.flatnonzero((s.plen > 0) & ~d.retrans & (d.egress | d.ingress))
    if not len(data):
        return []
    ports = roles.service_ports()
    src, dst, sport, dport = s.src[data], s.dst[data], s.sport[data], s.dport[data]
    # The server end of each segment's connection: the known service port, else the side
    # that answers with HTTP/ (response token), else the lower port.
    sp_known = np.isin(sport, list(ports)) if ports else np.zeros(len(data), bool)
    dp_known = np.isin(dport, list(ports)) if ports else np.zeros(len(data), bool)
    tok = s.tok[data]
    from_server = np.where(sp_known != dp_known, sp_known,
                           np.where(tok == TOK_RESPONSE, True, np.where(tok == TOK_REQUEST, False, sport < dport)))
    c_ip = np.where(from_server, dst, src)
    c_port = np.where(from_server, dport, sport)
    s_ip = np.where(from_server, src, dst)
    s_port = np.where(from_server, sport, dport)
    conn = flow_hash(c_ip, s_ip, c_port, s_port)
    ts = s.ts[data]
    order = np.lexsort((ts, conn))
    data, conn, ts, tok, from_server = data[order], conn[order], ts[order], tok[order], from_server[order]
    c_ip, c_port, s_ip, s_port = c_ip[order], c_port[order], s_ip[order], s_port[order]
    n = len(data)
    idx = np.arange(n)
    new_conn = np.ones(n, dtype=bool)
    new_conn[1:] = conn[1:] != conn[:-1]
    conn_id = np.cumsum(new_conn) - 1
    conn_end = np.append(np.flatnonzero(new_conn)[1:], n)[conn_id]  # index past the connection's last
    resp = np.flatnonzero(from_server & (tok == TOK_RESPONSE))
    req = np.flatnonzero(~from_server & (tok == TOK_REQUEST))
    if len(req) > 1:
        # HTTP/1.1 without pipelining: the next request on a connection comes after the previous
        # one's final response began. A segment that starts with a method before that is the
        # request's body: Swift's proxy writes an object's body after the 100 Continue in 64 KiB
        # writes, so a body that starts (or has at a 64 KiB boundary) "COPYRIGHT", "GET /page",
        # "DELETE FROM" starts a segment; read as a request, it hid the PUT and charged the object
        # server's time to the proxy.
        last_resp = np.maximum.accumulate(np.where(from_server & (tok == TOK_RESPONSE), idx, -1))
        answered_since = last_resp[req[1:]] > req[:-1]
        req = req[np.append(True, (conn_id[req[1:]] != conn_id[req[:-1]]) | answered_since)]
    if not len(req):
        return []
    last_to = np.maximum.accumulate(np.where(~from_server, idx, -1))
    last_from = np.maximum.accumulate(np.where(from_server, idx, -1))
    # next request on the same connection (or the connection's end)
    nxt = np.append(req[1:], n)
    nxt = np.where((nxt < n) & (conn_id[np.minimum(nxt, n - 1)] == conn_id[req]), nxt, conn_end[req])
    rp = np.searchsorted(resp, req)
    rpos = resp[np.minimum(rp, max(len(resp) - 1, 0))] if len(resp) else np.full(len(req), n)
    has_resp = (rp < len(resp)) & (rpos < nxt) if len(resp) else np.zeros(len(req), bool)
    # The SYN of each connection seen here: a call on a new connection goes "out" with its SYN.
    # (The SYN goes client -> server: its flow hash is the connection's hash.)
    syn = np.flatnonzero(((s.flags & SYN) != 0) & ((s.flags & ACK) == 0) & (d.egress | d.ingress))
    conn_syn = np.full(n, -1, dtype=np.int64)
    if len(syn):
        sh = d.fh[syn]
        order = np.lexsort((s.ts[syn], sh))
        sh, st = sh[order], s.ts[syn][order]
        pos = np.minimum(np.searchsorted(sh, conn), len(sh) - 1)  # the first (earliest) SYN of the hash
        hit = sh[pos] == conn
        conn_syn[hit] = st[pos[hit]]
    out: list[Exchange] = []
    node = d.node
    role_cache: dict[tuple[int, int], str] = {}

    def role(ip: int, port: int) -> str:
        r = role_cache.get((ip, port))
        if r is None:
            r = role_cache[(ip, port)] = roles.endpoint_role(ip, port)
        return r

    first_on_conn = (idx == 0) | (conn_id[np.maximum(idx - 1, 0)] != conn_id)
    if not has_resp.all():
        end = int(s.ts.max())  # (what was captured so far: live mode's buffer)
        for i, closed_at in _unanswered(d, req[~has_resp], nxt[~has_resp], conn_end, conn, ts, data):
            method, kind, tx, target = _parse_request(s.heads.get(int(data[i])))
            syn_t = int(conn_syn[i]) if first_on_conn[i] else -1
            cip, cport, sip, sport_ = int(c_ip[i]), int(c_port[i]), int(s_ip[i]), int(s_port[i])
            stop = end if closed_at is None else closed_at
            out.append(Exchange(
                node=node, side="client", client=(cip, cport), server=(sip, sport_), server_role=role(sip, sport_),
                client_role=role(cip, cport), req_start=int(ts[i]), req_end=int(ts[i]), resp_start=stop,
                resp_end=stop, method=method, path_kind=kind, trans_id=tx, target=target,
                connect_start=syn_t if syn_t >= 0 else None, answered=False, still_open=closed_at is None))
    keep = np.flatnonzero(has_resp)
    if not len(keep):
        return out
    # Everything the loop reads, per exchange, as Python lists (numpy scalars are slow one by one).
    r0s, p0s = req[keep], rpos[keep]
    # The first interim response (100 Continue) between a request and its final response, and
    # the first request segment after it (the body); indices are grouped by connection.
    interim = np.flatnonzero(from_server & (tok == TOK_INTERIM))
    to_srv = np.flatnonzero(~from_server)
    it_at = np.full(len(keep), -1, dtype=np.int64)
    body_at = np.full(len(keep), -1, dtype=np.int64)
    if len(interim):
        ip = interim[np.minimum(np.searchsorted(interim, r0s), len(interim) - 1)]
        has_it = (ip > r0s) & (ip < p0s)
        it_at[has_it] = ts[ip[has_it]]
        bp = np.searchsorted(to_srv, ip)
        bi = to_srv[np.minimum(bp, len(to_srv) - 1)]
        has_body = has_it & (bp < len(to_srv)) & (bi > ip) & (bi < p0s)
        body_at[has_body] = ts[bi[has_body]]
    r1s, p1s = last_to[p0s - 1], last_from[nxt[keep] - 1]
    first = (r0s == 0) | (conn_id[np.maximum(r0s - 1, 0)] != conn_id[r0s])
    syn_at = np.where(first, conn_syn[r0s], -1)
    cols = zip(d.egress[data[r0s]].tolist(), data[r0s].tolist(), data[p0s].tolist(), c_ip[r0s].tolist(),
               c_port[r0s].tolist(), s_ip[r0s].tolist(), s_port[r0s].tolist(), ts[r0s].tolist(), ts[r1s].tolist(),
               ts[p0s].tolist(), ts[p1s].tolist(), syn_at.tolist(), it_at.tolist(), body_at.tolist())
    heads = s.heads
    for egress, hreq, hresp, cip, cport, sip, sport_, t0, t1, t2, t3, syn_t, it_t, body_t in cols:
        method, kind, tx_req, target = _parse_request(heads.get(hreq))
        status, tx_resp = _parse_response(heads.get(hresp))
        out.append(Exchange(
            node=node, side="client" if egress else "server", client=(cip, cport), server=(sip, sport_),
            server_role=role(sip, sport_), client_role=role(cip, cport),
            req_start=t0, req_end=t1, resp_start=t2, resp_end=t3,
            method=method, path_kind=kind, status=status, trans_id=tx_req or tx_resp, target=target,
            connect_start=syn_t if syn_t >= 0 else None,
            interim=it_t if it_t >= 0 else None, body_start=body_t if body_t >= 0 else None,
        ))
    return out


def _unanswered(d: Directed, lost: npt.NDArray[np.intp], nxt: npt.NDArray[np.intp], conn_end: npt.NDArray[np.intp],
                conn: npt.NDArray[np.uint64], ts: I64, data: npt.NDArray[np.intp]) -> list[tuple[int, int | None]]:
    """(index, first FIN or RST after it, None while its connection is open) of each request
    sent by this node (``lost``: no final response)."""
    s = d.segs
    lost = lost[(nxt == conn_end[lost]) & d.egress[data[lost]]]  # the connection's last request, sent here
    if not len(lost):
        return []
    fin = np.flatnonzero((s.flags & (FIN | RST)) != 0)
    closes: dict[int, list[int]] = {}  # connection hash -> its FIN/RST times
    for h in (flow_hash(s.src[fin], s.dst[fin], s.sport[fin], s.dport[fin]),
              flow_hash(s.dst[fin], s.src[fin], s.dport[fin], s.sport[fin])):
        for k, t in zip(h.tolist(), s.ts[fin].tolist()):
            closes.setdefault(k, []).append(t)
    out: list[tuple[int, int | None]] = []
    for i in lost.tolist():
        t = int(ts[i])
        after = [c for c in closes.get(int(conn[i]), ()) if c > t]
        out.append((i, min(after) if after else None))
    return out


@dataclass
class JoinCounts:
    trans_id: int = 0
    timing: int = 0
    ambiguous: int = 0
    orphan: int = 0
    late: int = 0  # of the joined: answered after their request was (also counted by how)
    uncertain: int = 0  # server-side exchanges left without a processing figure (ambiguous calls)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))

    @property
    def ambiguous_ratio(self) -> float:
        total = self.trans_id + self.timing + self.ambiguous
        return self.ambiguous / total if total else 0.0


#: Who may call a storage service while serving a request (see the module doc).
CALLERS = {"account": {"proxy", "container"}, "container": {"proxy", "object"}, "object": {"proxy"}}
_SWIFT_ROLES = {"proxy", "account", "container", "object"}


def _may_call(caller: str, callee: str) -> bool:
    """Can a server of role ``caller`` make a call to ``callee`` while serving a request? Roles
    the map does not know (``storage``, ``other``, node names) are not filtered."""
    allowed = CALLERS.get(callee)
    return allowed is None or caller not in _SWIFT_ROLES or caller in allowed


def join(exchanges: list[Exchange], tolerance_ns: int = 0) -> JoinCounts:
    """Attach each outgoing call to the request its node was serving (see the module doc)."""
    counts = JoinCounts()
    by_node: dict[int, tuple[list[int], list[int]]] = {}
    for i, x in enumerate(exchanges):
        servers, clients = by_node.setdefault(x.node, ([], []))
        (servers if x.side == "server" else clients).append(i)
    for servers, clients in by_node.values():
        if not clients:
            continue
        if not servers:  # a client machine: nothing to join its requests to
            continue
        servers.sort(key=lambda i: exchanges[i].req_start)
        starts = [exchanges[i].req_start for i in servers]
        ends = [exchanges[i].resp_start for i in servers]
        maxdur = max(e - b for b, e in zip(starts, ends))
        by_tx: dict[str, list[int]] = {}
        for j, i in enumerate(servers):
            tx = exchanges[i].trans_id
            if tx:
                by_tx.setdefault(tx, []).append(j)
        for c in clients:
            x = exchanges[c]
            lo = bisect.bisect_left(starts, x.req_start - maxdur - tolerance_ns)
            hi = bisect.bisect_right(starts, x.req_start + tolerance_ns)
            near = [j for j in range(lo, hi) if _may_call(exchanges[servers[j]].server_role, x.server_role)]
            strict = [j for j in near if ends[j] >= x.resp_end - tolerance_ns]  # [call] within [request]
            if x.trans_id:
                # The call's own id first, among the requests open when it started: a late
                # answer's request (the caller gave up on a hung server) is found by it too.
                same = [j for j in by_tx.get(x.trans_id, ()) if lo <= j < hi and ends[j] >= x.req_start - tolerance_ns
                        and _may_call(exchanges[servers[j]].server_role, x.server_role)]
                pool = [j for j in same if j in strict] or same
                if len(pool) == 1:
                    pick = pool[0]
                    late = pick not in strict
                    if x.answered:  # (one never answered is counted apart: calls_unanswered)
                        counts.trans_id += 1
                        counts.late += late
                    x.join, x.late, x.parent = "trans_id", late, servers[pick]
                    x.until = ends[pick] if late else None
                    exchanges[servers[pick]].children.append(c)
                    continue
                # several requests with its id (replicas on one node's devices): among them, not
                # guessed; an id that is none of theirs: not a call of a request whose id is known
                strict = pool or [j for j in strict if not exchanges[servers[j]].trans_id]
            if len(strict) == 1:
                x.join, x.parent = "timing", servers[strict[0]]
                exchanges[servers[strict[0]]].children.append(c)
            elif strict:
                x.join = "ambiguous"
                for j in strict:
                    exchanges[servers[j]].uncertain = True
            else:
                x.join = "orphan"
            if x.answered:  # (a call never answered is counted apart: calls_unanswered)
                setattr(counts, x.join, getattr(counts, x.join) + 1)
    for x in exchanges:
        if x.side == "server":
            if x.uncertain:
                counts.uncertain += 1
                x.processing = x.receive_wait = x.fanout_wait = None
            else:
                x.processing, x.receive_wait, x.fanout_wait = own_time(x, exchanges)
    return counts


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _overlap(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans)


def _calls_and_own(x: Exchange, exchanges: list[Exchange]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The union of a server-side exchange's calls, and the spans it counts as its own before
    taking the calls out (see the module doc), all clipped to ``[req_start, resp_start]``."""
    lo, hi = x.req_start, max(x.resp_start, x.req_start)
    calls = _union([(max(exchanges[c].out_start, lo), min(exchanges[c].resp_end, hi)) for c in x.children])
    req_end = min(max(x.req_end, lo), hi)
    # The node's first action on the request's head before the request is all in; none (a leaf
    # server without a 100 Continue, a proxy that reads the whole body before its first call):
    # the body arriving is receive wait, not the node's time.
    before = [t for t in (x.interim, calls[0][0] if calls else None) if t is not None and t < req_end]
    first = max(min(before), lo) if before else lo
    return calls, [(lo, first), (req_end, hi)]


def own_time(x: Exchange, exchanges: list[Exchange]) -> tuple[int, int, int]:
    """(processing, receive_wait, fanout_wait) of a server-side exchange, ns (see the module doc)."""
    calls, own = _calls_and_own(x, exchanges)
    lo, hi = own[0][0], own[1][1]
    fanout = _overlap(calls, lo, hi)
    processing = sum(b - a for a, b in own) - sum(_overlap(calls, a, b) for a, b in own)
    return processing, hi - lo - processing - fanout, fanout


def own_spans(x: Exchange, exchanges: list[Exchange]) -> list[tuple[int, int]]:
    """The spans (ns, this node's clock) a server-side exchange's processing is made of."""
    calls, own = _calls_and_own(x, exchanges)
    out: list[tuple[int, int]] = []
    for a, b in own:
        for c0, c1 in calls:
            if c0 > a:
                out.append((a, min(b, c0)))
            a = max(a, c1)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return [(a, b) for a, b in out if b > a]


def phase_samples(exchanges: list[Exchange]) -> list[tuple[str, Exchange, int]]:
    """(phase, the exchange it is measured on, ns) for every phase sample (see the module doc):
    auth per request; account/container/object once per client request and phase (the span of
    the proxy's calls of that phase), or per call for a call joined to no client request."""
    out: list[tuple[str, Exchange, int]] = []
    spans: dict[tuple[int, str], tuple[Exchange, int, int]] = {}
    for x in exchanges:
        ph = phase_of(x)
        if ph is None:
            continue
        if x.join == "ambiguous" or (not x.answered and x.parent is None):
            continue  # which request's phase it belongs to is not known (or it never ended): not guessed
        if ph == "auth" or x.parent is None:
            out.append((ph, x, x.resp_end - x.out_start))
            continue
        key = (x.parent, ph)
        # a late answer (after the request's own) counts up to the request's answer
        end = min(x.resp_end, x.until) if x.until is not None else x.resp_end
        prev = spans.get(key)
        spans[key] = (x, x.out_start, end) if prev is None else (
            prev[0], min(prev[1], x.out_start), max(prev[2], end))
    out.extend((ph, x, end - start) for (_, ph), (x, start, end) in spans.items())
    return out


def phase_of(x: Exchange) -> str | None:
    """The request phase an exchange measures, seen from the proxy (None: not a phase)."""
    if x.side == "server" and x.server_role == "proxy" and x.path_kind == "auth":
        return "auth"
    if x.side == "client" and x.client_role == "proxy" and x.server_role in ("account", "container", "object"):
        return x.server_role
    return None
