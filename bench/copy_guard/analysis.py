"""The benchmark's arithmetic, kept free of I/O so unit tests can pin it down.

Timelines are Locust completions in fixed bins (``bin_s`` seconds, keyed by
``int(unix time / bin_s)``, see ``controllers/copy_guard/locustfile.py``). The served rate the guard reacts to is the
rules' ``site:promreflex_http_requests_served:rate1s``: completions over the last second. Here
it is evaluated at every bin boundary, so "time below the threshold" has the bin's resolution
(100 ms), not a whole second's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def saved_share(served_loadonly: float, served_copy: float, served_guard: float) -> float | None:
    """Share of the responses the copy cost that the guard won back:
    ``(guard - copy) / (loadonly - copy)``. None when the copy cost nothing (nothing to save).
    Can exceed 1 (the guarded run beat the baseline: drift) or be negative (the guard hurt)."""
    lost = served_loadonly - served_copy
    if lost <= 0:
        return None
    return (served_guard - served_copy) / lost


def slowdown(duration: float | None, baseline: float | None) -> float | None:
    """Relative slowdown of the copy (0.40 = 40 % longer), None when either is unknown."""
    if duration is None or baseline is None or baseline <= 0:
        return None
    return duration / baseline - 1.0


def rolling_rate(bins: Mapping[int, Sequence[int]], bin_s: float, start: float, end: float,
                 window_s: float = 1.0) -> list[tuple[float, float]]:
    """(t, served per second over (t - window, t]) at every bin boundary t in [start + window, end]."""
    per = max(1, round(window_s / bin_s))
    b0, b1 = math.ceil(start / bin_s - 1e-9), math.floor(end / bin_s + 1e-9)
    counts = [bins.get(b, (0, 0))[0] for b in range(b0, b1)]
    out, acc = [], 0
    for i, c in enumerate(counts):
        acc += c
        if i >= per:
            acc -= counts[i - per]
        if i + 1 >= per:
            out.append(((b0 + i + 1) * bin_s, acc / (per * bin_s)))
    return out


def served_between(bins: Mapping[int, Sequence[int]], bin_s: float, start: float, end: float, column: int = 0) -> int:
    """Completions (column 0: served, 1: failed) in the bins that lie wholly within [start, end)."""
    b0, b1 = math.ceil(start / bin_s - 1e-9), math.floor(end / bin_s + 1e-9)
    return sum(int(v[column]) for b, v in bins.items() if b0 <= b < b1)


@dataclass
class Window:
    """The counting window shared by every loaded run of a round: ``seconds`` from each run's
    own load start. ``contains_every_copy`` says whether every copy of the round ended inside it
    (otherwise the round's comparison would reward a guard for pushing its copy past the window)."""

    seconds: float
    latest_copy_end_s: float | None
    contains_every_copy: bool
    late: list[str]


def common_window(runs: Sequence[RunResult]) -> Window:
    """The longest window every loaded run of a round has load data for (the shortest load), and
    whether each copy of the round ended inside it, measured from that run's load start."""
    loaded = [r for r in runs if r.load]
    if not loaded:
        raise ValueError("no loaded run")
    seconds = min(r.load_end - r.load_start for r in loaded)
    ends = {r.name: (r.copy_end - r.load_start) if r.copy_end is not None else math.inf
            for r in loaded if r.copy}
    late = [name for name, end in ends.items() if end > seconds + 1e-9]
    latest = max(ends.values()) if ends else None
    return Window(seconds, latest, not late, late)


def per_second(bins: Mapping[int, Sequence[int]], bin_s: float, column: int = 0) -> dict[int, int]:
    out: dict[int, int] = {}
    for b, v in bins.items():
        s = math.floor(b * bin_s + 1e-9)
        out[s] = out.get(s, 0) + int(v[column])
    return out


def intervals(samples: Sequence[tuple[float, bool]]) -> list[tuple[float, float]]:
    """Merge (time, flag) samples into [start, end) intervals where the flag held; an interval
    still open at the last sample ends there."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for t, flag in samples:
        if flag and start is None:
            start = t
        elif not flag and start is not None:
            out.append((start, t))
            start = None
    if start is not None and samples:
        out.append((start, samples[-1][0]))
    return out


def seconds_below(rate: Sequence[tuple[float, float]], threshold: float, step_s: float,
                  start: float = -math.inf, end: float = math.inf) -> float:
    """Time (s) during which the rolling rate was below ``threshold`` within [start, end] (the
    sample at t stands for the step (t - step_s, t])."""
    return sum(step_s for t, r in rate if start <= t - step_s + 1e-9 and t <= end + 1e-9 and r < threshold)


def reaction_times(rate: Sequence[tuple[float, float]], threshold: float, pause_starts: Sequence[float],
                   step_s: float) -> list[float]:
    """For each pause start p: how long the rate had been below the threshold when the pause took
    hold, i.e. p minus the start of the below-threshold episode running at p (0 when the rate
    was not below: the pause came first, as a predictive alert should make it)."""
    out = []
    times = [t for t, _ in rate]
    for p in pause_starts:
        # the last sample at or before p (its value describes (t - window, t])
        k = _last_at_or_before(times, p)
        if k is None or rate[k][1] >= threshold:
            out.append(0.0)
            continue
        j = k
        while j > 0 and rate[j - 1][1] < threshold:
            j -= 1
        episode_start = rate[j][0] - step_s  # below since the previous boundary
        out.append(max(0.0, p - episode_start))
    return out


def _last_at_or_before(times: Sequence[float], t: float) -> int | None:
    lo, hi = 0, len(times)
    while lo < hi:
        mid = (lo + hi) // 2
        if times[mid] <= t + 1e-9:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1 if lo > 0 else None


@dataclass
class RunResult:
    """What the benchmark prints and writes for one run."""

    name: str
    round: int
    load: bool
    copy: bool
    guard: str  # "none" or the arm's name
    scenario: str = "closed"  # bench/copy_guard/scenario.py; runs are compared within (scenario, round)
    served: int = 0
    failed: int = 0
    copy_seconds: float | None = None
    copy_done_under_load_bytes: int = 0
    seconds_below: float = 0.0
    reaction_s: list[float] | None = None
    pauses: int = 0
    paused_seconds: float = 0.0
    saved_share: float | None = None
    load_start: float = 0.0
    load_end: float = 0.0
    copy_start: float | None = None
    copy_end: float | None = None
    pause_intervals: list[tuple[float, float]] | None = None
    per_second: dict[int, int] | None = None
    failed_per_second: dict[int, int] | None = None
    served_window: int | None = None  # served within the round's common window (the compared figure)
    failed_window: int | None = None
    window_s: float | None = None
    saved_responses: int | None = None  # served_window(guard) - served_window(load+copy)
    lost_responses: int | None = None  # served_window(load-only) - served_window(load+copy)
    host: dict[str, Any] | None = None  # bench.conditions summary during the run
    note: str = ""
    copy_slower: float | None = None  # copy_seconds / the round's unguarded copy_seconds - 1
    held_intervals: list[tuple[float, float]] | None = None  # the controller's share of the copy below 1
    held_seconds: float = 0.0
    mean_share: float | None = None  # mean share of its own speed while the copy ran (1 = free)
    share_timeline: list[tuple[float, float]] | None = None
    guard_counters: dict[str, float] | None = None  # the controller's copy-guard counters, deltas over the run

    def reaction_summary(self) -> str:
        r = self.reaction_s or []
        if not r:
            return "-"
        r = sorted(r)
        return f"{r[len(r) // 2]:.1f} / {r[-1]:.1f}"
