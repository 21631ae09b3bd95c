"""Counting sessions and requests from the clients' event log, inside one window.

The window. Every arm of a point offers the same clients for the same time, and every arm is
counted over the same window: from ``warmup`` seconds after the first stage began to
``warmup + seconds`` (the clients run a little longer, so nothing at the window's end is cut by
their stop). An event counts when it ENDS inside the window:
- a completed session when its logout answer arrives in the window (wherever it started: a
  session that waited long in a queue before the window still counts when it completes);
- a failed session when its failing request ends in the window (timeout, 503, other status,
  connection error), attributed to the page number (1..7) it failed at; a failure at page 1
  is a failure at session start, one at pages 2..7 is an abandoned session (mid-session);
- a request's response time when its answer (or its failure) arrives in the window.
Sessions still running at the window's end are not counted either way.

Wasted requests: requests answered 200 in the window that belong to a session that then
failed: the server's work for them was thrown away.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.admission.pages import PAGE_GROUPS, PAGES

N_PAGES = len(PAGES)
REASONS = ("timeout", "refused", "http", "conn")


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"empty window {self.start}..{self.end}")

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def __contains__(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class Events:
    requests: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0

    @property
    def started(self) -> float | None:
        return min((s["t"] for s in self.stages), default=None)


def parse_events(lines: Iterable[str]) -> Events:
    """The client's JSON lines; a line cut short (a killed client) is counted as bad, not fatal."""
    ev = Events()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
            kind = rec["k"]
        except (ValueError, KeyError, TypeError):
            ev.bad_lines += 1
            continue
        {"req": ev.requests, "ses": ev.sessions, "stage": ev.stages}.get(kind, []).append(rec)
    return ev


def read_events(path: Path) -> Events:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_events(f)


def window_after_start(ev: Events, warmup: float, seconds: float) -> Window:
    if ev.started is None:
        raise ValueError("the client log has no stage record: the clients never started")
    return Window(ev.started + warmup, ev.started + warmup + seconds)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def count(ev: Events, window: Window) -> dict[str, Any]:
    """Completed and failed sessions (by page, by reason), response times, wasted requests."""
    completed = [s for s in ev.sessions if s["r"] == "completed" and s["t1"] in window]
    failed = [s for s in ev.sessions if s["r"] == "failed" and s["t1"] in window]
    by_page = {n: 0 for n in range(1, N_PAGES + 1)}
    by_reason = {r: 0 for r in REASONS}
    for s in failed:
        by_page[int(s["n"])] = by_page.get(int(s["n"]), 0) + 1
        by_reason[s.get("why", "conn")] = by_reason.get(s.get("why", "conn"), 0) + 1
    failed_sessions = {(s["u"], s["s"]) for s in ev.sessions if s["r"] == "failed"}
    reqs = [r for r in ev.requests if r["t1"] in window]
    ok = [r for r in reqs if r["r"] == "ok"]
    wasted = sum(1 for r in ok if (r["u"], r["s"]) in failed_sessions)
    rt_ok = [r["t1"] - r["t0"] for r in ok]
    rt_all = [r["t1"] - r["t0"] for r in reqs]
    per_page_rt = {}
    for p in PAGES:
        vals = [r["t1"] - r["t0"] for r in ok if r["n"] == p.number]
        per_page_rt[p.number] = {"n": len(vals), "p50_s": percentile(vals, 50), "p99_s": percentile(vals, 99)}
    durations = [s["t1"] - s["t0"] for s in completed]
    w = window.seconds
    return {
        "window_s": round(w, 3),
        "completed": len(completed),
        "completed_per_s": len(completed) / w,
        "failed": len(failed),
        "failed_per_s": len(failed) / w,
        "failed_by_page": {str(n): c for n, c in by_page.items()},
        "failed_by_group": {g: sum(by_page.get(n, 0) for n in ns) for g, ns in PAGE_GROUPS},
        "failed_by_reason": by_reason,
        "abandoned": sum(c for n, c in by_page.items() if n > 1),  # gave up mid-session
        "requests": len(reqs),
        "ok_per_s": len(ok) / w,
        "wasted_ok": wasted,
        "wasted_share": wasted / len(ok) if ok else 0.0,
        "rt_ok_p50_s": percentile(rt_ok, 50),
        "rt_ok_p90_s": percentile(rt_ok, 90),
        "rt_ok_p99_s": percentile(rt_ok, 99),
        "rt_all_p50_s": percentile(rt_all, 50),
        "rt_all_p99_s": percentile(rt_all, 99),
        "rt_by_page": {str(k): v for k, v in per_page_rt.items()},
        "session_p50_s": percentile(durations, 50),
    }


def per_second(ev: Events, since: float, until: float, step: float = 1.0) -> list[dict[str, float]]:
    """Completed and failed sessions per ``step`` seconds from ``since`` (the demo's timeline)."""
    n = max(1, math.ceil((until - since) / step))
    rows = [{"t": round(i * step, 3), "completed": 0.0, "failed_start": 0.0, "failed_mid": 0.0} for i in range(n)]
    for s in ev.sessions:
        i = math.floor((s["t1"] - since) / step)
        if 0 <= i < n:
            key = "completed" if s["r"] == "completed" else ("failed_start" if int(s["n"]) == 1 else "failed_mid")
            rows[i][key] += 1.0 / step
    return rows


def rt_timeline(ev: Events, since: float, until: float, step: float = 1.0) -> list[dict[str, Any]]:
    """Per ``step`` seconds from ``since`` (by the time an answer or failure arrived): requests,
    the median response time of the answered ones, and client timeouts (the paper's response
    time over elapsed time)."""
    n = max(1, math.ceil((until - since) / step))
    bins: list[list[float]] = [[] for _ in range(n)]
    timeouts = [0] * n
    for r in ev.requests:
        i = math.floor((r["t1"] - since) / step)
        if not 0 <= i < n:
            continue
        if r["r"] == "ok":
            bins[i].append(r["t1"] - r["t0"])
        elif r["r"] == "timeout":
            timeouts[i] += 1
    out = []
    for i, b in enumerate(bins):
        p50 = percentile(b, 50)
        out.append({"t": round(i * step, 3), "ok": len(b), "p50_s": None if p50 is None else round(p50, 4),
                    "timeouts": timeouts[i]})
    return out
