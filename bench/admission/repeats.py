"""Repeated points: the order they run in, and their means and spread.

One run per point leaves the 4x verdict inside the noise (the full scheme's 4x point measured
85 % of its peak once and 94 % on a repeat). With ``--repeat N`` every point runs N times and
the report and the targets use the mean of the N runs, with their spread beside it.

Order (:func:`schedule`): repetition after repetition of the whole plan, so a drift of the
machine (another tenant, a warming host) falls on every point and arm alike rather than on the
last ones measured: repetition 0 runs the plan as given, every odd repetition runs it backwards;
and the arms of a point run in the order given or reversed, alternating from point to point and,
for the same point, from one repetition to the next.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

#: (condition, multiple, repetition, arms reversed)
Step = tuple[str, float, int, bool]


def schedule(points: list[tuple[str, float]], repeat: int, first_only: Iterable[str] = ("overhead",)) -> list[Step]:
    """``points`` (condition, multiple) ``repeat`` times, interleaved (see the module's text).
    Steps whose condition is in ``first_only`` (the overhead) run in the first repetition only."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    once = set(first_only)
    index: dict[tuple[str, float], int] = {}  # a point's place among the repeated ones: its arms' order
    for p in points:
        if p[0] not in once:
            index.setdefault(p, len(index))
    steps: list[Step] = []
    for rep in range(repeat):
        todo = points if rep == 0 else [p for p in points if p[0] not in once]
        if rep % 2:
            todo = todo[::-1]
        steps += [(c, m, rep, (index.get((c, m), 0) + rep) % 2 == 1) for c, m in todo]
    return steps


def rep_of(row: dict[str, Any]) -> int:
    """The repetition a raw row belongs to (rows written before repeats existed: 0)."""
    return int(row.get("rep", 0))


def spread(values: list[float]) -> dict[str, Any]:
    """n, mean, sample standard deviation (0 for one value), min and max."""
    if not values:
        raise ValueError("no values")
    return {"n": len(values), "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def _mean_map(maps: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for m in maps for k in m}, key=lambda k: (len(k), k))
    return {k: statistics.fmean(m.get(k, 0) for m in maps) for k in keys}


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (arm, clients) from the runs of that point: ``completed_per_s`` is the mean
    of the runs, ``completed`` its spread (n, mean, sd, min, max) and ``runs`` the values in
    repetition order; failures by page and group, mid-session failures (``abandoned``) and the
    response-time percentiles are means too; ``abandoned_max`` is the worst run; the timeline of
    responses is the first run's (a figure, not a figure of merit). Rows keep the order of
    their first run."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["clients"]), []).append(r)
    out = []
    for (arm, clients), rs in groups.items():
        rs = sorted(rs, key=rep_of)
        per_s = [float(r["completed_per_s"]) for r in rs]
        row: dict[str, Any] = {"arm": arm, "clients": clients, "multiple": rs[0]["multiple"],
                               "completed_per_s": statistics.fmean(per_s), "completed": spread(per_s),
                               "runs": per_s, "reps": [rep_of(r) for r in rs],
                               "failed_by_page": _mean_map([r["failed_by_page"] for r in rs]),
                               "abandoned": statistics.fmean(r["abandoned"] for r in rs),
                               "abandoned_max": max(r["abandoned"] for r in rs)}
        if all("failed_by_group" in r for r in rs):
            row["failed_by_group"] = _mean_map([r["failed_by_group"] for r in rs])
        for k in ("rt_ok_p50_s", "rt_ok_p99_s", "wasted_share"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = statistics.fmean(vals) if vals else None
        for k in ("condition", "rt_timeline"):
            if k in rs[0]:
                row[k] = rs[0][k]
        out.append(row)
    return out
