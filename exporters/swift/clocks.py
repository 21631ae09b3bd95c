"""Clock offsets between the nodes' captures, estimated from the captures themselves.

Network namespaces on one machine share the kernel's clock: nodes given the same ``host`` in
the role mapping get offset 0, exactly. Across machines each pair's offset is estimated the way
NTP does it, from segments (data and their ACKs) seen at both ends. For a pair (A, B) and the
segments matched in a time window:

    d_ab = recv_B - send_A = delay_ab + theta      (theta = clock_B - clock_A)
    d_ba = recv_A - send_B = delay_ba - theta

With the minimum of each direction (the segments least delayed by queues):

    theta ~ (min d_ab - min d_ba) / 2,   |error| <= (min d_ab + min d_ba) / 2

The bound holds whatever the delays are, as long as they are >= 0; it is tight when the
fastest segment each way is about as fast (symmetric paths). Estimates are made per window
(1 s by default) so a clock that steps (an NTP correction, a VM migration) is followed: a
window whose offset differs from the previous one by more than both errors plus
``jump_tolerance`` is a **clock jump**, counted. A window that saw traffic one way only takes
the estimate of the nearest window that saw both.

Windows are kept on ``a``'s capture timeline: ``a -> b`` segments by their departure, ``b -> a``
segments by their arrival, both stamped by ``a``'s clock (never ``b``'s stamps moved by a global
offset: a step of seconds in either clock would put a segment in the wrong window, and seconds of
"transit" would be published). The timeline is ``a``'s clock with its steps back undone
(:func:`~exporters.swift.match.capture_timeline`): after a clock steps back, its stamps repeat
times already seen, and windows by the raw stamps would mix segments from both sides of the
step. A segment's offset is looked up the same way, at its time on ``a``'s timeline.

Offsets of every node against a reference node (the first with estimates) chain pairs along the
tightest errors (errors add up along the chain).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporters.swift.match import HOW_EXACT, Matches

I64 = npt.NDArray[np.int64]


@dataclass
class PairClock:
    """Offset of node ``b``'s clock against node ``a``'s (``clock_b - clock_a``), in ns."""

    a: int
    b: int
    shared: bool  # same host: offset 0 by definition
    window_start: I64  # window starts (a's capture timeline: a's clock, steps back undone; ns)
    offset: I64
    error: I64
    jumps: int = 0

    @property
    def median_offset(self) -> int:
        return 0 if self.shared else self.estimated_offset

    @property
    def estimated_offset(self) -> int:
        """What the captures say, even for a shared clock (then a check: ~0 within the error)."""
        return int(np.median(self.offset)) if len(self.offset) else 0

    @property
    def median_error(self) -> int:
        return 0 if self.shared else self.estimated_error

    @property
    def estimated_error(self) -> int:
        return int(np.median(self.error)) if len(self.error) else 0

    def at(self, t: I64) -> I64:
        """Offset (b - a) at times ``t`` (a's capture timeline): the estimate of each time's window."""
        if self.shared or not len(self.offset):
            return np.zeros(len(t), dtype=np.int64)
        i = np.clip(np.searchsorted(self.window_start, t, side="right") - 1, 0, len(self.offset) - 1)
        return self.offset[i]


@dataclass
class ClockModel:
    pairs: dict[tuple[int, int], PairClock] = field(default_factory=dict)
    reference: int | None = None
    node_offset: dict[int, int] = field(default_factory=dict)  # clock_node - clock_reference (ns)
    node_error: dict[int, int] = field(default_factory=dict)
    unknown: set[int] = field(default_factory=set)  # nodes no estimate reaches

    def offset(self, m: Matches) -> I64:
        """Offset of the receiver's clock against the sender's, per matched segment, looked up at
        the segment's time on the timeline of the pair's ``a``: its departure (``a -> b``) or its
        arrival (``b -> a``)."""
        out = np.zeros(len(m), dtype=np.int64)
        for (a, b), pc in self.pairs.items():
            fwd = (m.snode == a) & (m.rnode == b)
            if fwd.any():
                out[fwd] = pc.at(m.mono_send[fwd])
            rev = (m.snode == b) & (m.rnode == a)
            if rev.any():
                out[rev] = -pc.at(m.mono_recv[rev])
        return out

    def jumps(self) -> int:
        return sum(p.jumps for p in self.pairs.values())


def _window_min(t: I64, d: I64, width: int) -> tuple[I64, I64]:
    w = t // width
    order = np.lexsort((d, w))
    w, d = w[order], d[order]
    start = np.ones(len(w), dtype=bool)
    start[1:] = w[1:] != w[:-1]
    return w[start], d[start]


def estimate(m: Matches, shared: set[tuple[int, int]], window_ns: int = 1_000_000_000,
             jump_tolerance_ns: int = 1_000_000) -> ClockModel:
    """Estimate every captured pair's offset from matched segments (exact matches only)."""
    model = ClockModel()
    good = m.how == HOW_EXACT
    sn, rn, d = m.snode[good], m.rnode[good], m.delay[good]
    ms, mr = m.mono_send[good], m.mono_recv[good]  # on the sender's / the receiver's timeline
    pairs = {(int(min(a, b)), int(max(a, b))) for a, b in zip(*np.unique(np.stack([sn, rn]), axis=1))} \
        if len(sn) else set()
    for a, b in sorted(pairs):
        is_shared = (a, b) in shared or (b, a) in shared
        ab = (sn == a) & (rn == b)
        ba = (sn == b) & (rn == a)
        if not ab.any() or not ba.any():
            if is_shared:
                model.pairs[(a, b)] = PairClock(a, b, True, np.zeros(1, np.int64), np.zeros(1, np.int64),
                                                np.zeros(1, np.int64))
            continue
        ta, da = ms[ab], d[ab]  # a -> b by departure, b -> a by arrival: both on a's timeline
        tb, db = mr[ba], d[ba]
        starts, off, err = _windows(ta, da, tb, db, window_ns)
        if not len(starts):  # never both ways in one window: one estimate over everything
            starts = np.array([int(ta.min())], dtype=np.int64)
            off = np.array([(int(da.min()) - int(db.min())) // 2], dtype=np.int64)
            err = np.array([max(0, (int(da.min()) + int(db.min())) // 2)], dtype=np.int64)
        else:
            starts, off, err = _refine(starts, off, err, ta, da, tb, db, window_ns, jump_tolerance_ns)
            starts, off, err = _place_steps(starts, off, err, ta, da, tb, db, jump_tolerance_ns)
        jumps = _count_jumps(off, err, jump_tolerance_ns)
        # A shared clock keeps its estimates (a check of the method: they should be ~0 within
        # the error) but corrects nothing (PairClock.at answers 0).
        model.pairs[(a, b)] = PairClock(a, b, is_shared, starts.astype(np.int64), off.astype(np.int64),
                                        err.astype(np.int64), jumps)
    _chain(model)
    return model


def _windows(ta: I64, da: I64, tb: I64, db: I64, width: int) -> tuple[I64, I64, I64]:
    """Per window of ``width`` that saw both directions: start, offset, error bound."""
    wa, mab = _window_min(ta, da, width)
    wb, mba = _window_min(tb, db, width)
    both, ia, ib = np.intersect1d(wa, wb, return_indices=True)
    off = (mab[ia] - mba[ib]) // 2
    err = np.maximum((mab[ia] + mba[ib]) // 2, 0)
    return (both * width).astype(np.int64), off.astype(np.int64), err.astype(np.int64)


def _refine(starts: I64, off: I64, err: I64, ta: I64, da: I64, tb: I64, db: I64, width: int,
            tolerance: int) -> tuple[I64, I64, I64]:
    """Windows next to a change of offset are estimated again in 16 sub-windows, so a step is
    placed within width/16 instead of spoiling a whole window."""
    if len(off) < 2 or width < 16_000:
        return starts, off, err
    changed = np.abs(np.diff(off)) > err[1:] + err[:-1] + tolerance
    near = np.zeros(len(off), dtype=bool)
    near[:-1] |= changed
    near[1:] |= changed
    if not near.any():
        return starts, off, err
    parts_s, parts_o, parts_e = [], [], []
    for i in range(len(off)):
        if near[i]:
            lo, hi = starts[i], starts[i] + width
            sa, sb = (ta >= lo) & (ta < hi), (tb >= lo) & (tb < hi)
            s2, o2, e2 = _windows(ta[sa], da[sa], tb[sb], db[sb], width // 16)
            if len(s2):
                parts_s.append(s2)
                parts_o.append(o2)
                parts_e.append(e2)
                continue
        parts_s.append(starts[i:i + 1])
        parts_o.append(off[i:i + 1])
        parts_e.append(err[i:i + 1])
    return np.concatenate(parts_s), np.concatenate(parts_o), np.concatenate(parts_e)


def _place_steps(starts: I64, off: I64, err: I64, ta: I64, da: I64, tb: I64, db: I64,
                 tolerance: int) -> tuple[I64, I64, I64]:
    """A window that holds a step (old -> mixed -> new: its offset between its neighbours',
    both changes significant) mixes one direction's minimum from before the step with the
    other's from after: half the step, applied to every segment in it (a review: a step during a
    20 MB transfer gave ~150 transits of half the step, and a hop p99 of half the step). Each
    segment of it is closer to the old offset or to the new one; the step is placed where that
    changes (the split that disagrees with the fewest segments), and the window becomes the old
    offset up to there and the new one after."""
    if len(off) < 3:
        return starts, off, err
    diff = np.diff(off)
    changed = np.abs(diff) > err[1:] + err[:-1] + tolerance
    # flat before and after: a step. A clock that slews fast (chrony up to 83 ms/s) changes in
    # every window: no window of it is a step's (taken for steps, its transits doubled).
    flat_before = np.concatenate([[True], ~changed[:-2]])
    flat_after = np.concatenate([~changed[2:], [True]])
    mixed = np.flatnonzero(changed[:-1] & changed[1:] & (np.sign(diff[:-1]) == np.sign(diff[1:]))
                           & flat_before & flat_after) + 1
    if not len(mixed):
        return starts, off, err
    s_out, o_out, e_out = list(starts), list(off), list(err)
    for i in sorted(mixed.tolist(), reverse=True):  # (from the end: inserting keeps earlier indices)
        lo = int(starts[i])
        hi = int(starts[i + 1])
        old, new = int(off[i - 1]), int(off[i + 1])
        sa, sb = (ta >= lo) & (ta < hi), (tb >= lo) & (tb < hi)
        # a -> b: d_ab = delay + offset; b -> a: d_ba = delay - offset
        t = np.concatenate([ta[sa], tb[sb]])
        is_new = np.concatenate([np.abs(da[sa] - new) < np.abs(da[sa] - old),
                                 np.abs(db[sb] + new) < np.abs(db[sb] + old)])
        if not len(t):
            continue
        order = np.argsort(t, kind="stable")
        t, is_new = t[order], is_new[order]
        # disagreements when the step falls before segment k: new ones before it, old ones from it
        wrong = np.concatenate([[0], np.cumsum(is_new)]) + np.concatenate([np.cumsum((~is_new)[::-1])[::-1], [0]])
        k = int(np.argmin(wrong))
        step_at = int(t[k]) if k < len(t) else hi
        s_out[i:i + 1] = [lo, step_at] if step_at > lo else [lo]
        o_out[i:i + 1] = [old, new] if step_at > lo else [new]
        e_out[i:i + 1] = [int(err[i - 1]), int(err[i + 1])] if step_at > lo else [int(err[i + 1])]
    return (np.array(s_out, dtype=np.int64), np.array(o_out, dtype=np.int64), np.array(e_out, dtype=np.int64))


def _count_jumps(off: I64, err: I64, tolerance: int) -> int:
    """Level changes between consecutive windows; a step that falls inside a window shows as
    two changes of the same sign in a row (old -> mixed -> new): one jump."""
    diff = np.diff(off)
    changed = np.abs(diff) > err[1:] + err[:-1] + tolerance
    sign = np.sign(diff)
    cont = np.zeros(len(diff), dtype=bool)
    cont[1:] = changed[:-1] & (sign[1:] == sign[:-1])
    return int(np.count_nonzero(changed & ~cont))


def _chain(model: ClockModel) -> None:
    """Offsets of every node against a reference, along the pairs with the smallest errors (BFS
    by error order: good enough for the handful of nodes a capture set has)."""
    nodes = sorted({n for p in model.pairs for n in p})
    if not nodes:
        return
    ref = nodes[0]
    model.reference = ref
    model.node_offset = {ref: 0}
    model.node_error = {ref: 0}
    edges = sorted(model.pairs.values(), key=lambda p: p.median_error)
    queue = deque([ref])
    while queue:
        cur = queue.popleft()
        for p in edges:
            if cur not in (p.a, p.b):
                continue
            other = p.b if cur == p.a else p.a
            if other in model.node_offset:
                continue
            sign = 1 if cur == p.a else -1
            model.node_offset[other] = model.node_offset[cur] + sign * p.median_offset
            model.node_error[other] = model.node_error[cur] + p.median_error
            queue.append(other)
    model.unknown = set(nodes) - set(model.node_offset)
