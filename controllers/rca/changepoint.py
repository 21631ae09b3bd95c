"""Where the anomaly starts, when nobody said: the earliest significant change over all series.

BARO (Pham et al., FSE 2024) finds the start with multivariate Bayesian online change-point
detection. BOCPD needs a hazard rate and prior hyperparameters, and reports a run-length
distribution from which one change point must still be chosen. The question asked here is
narrower, when did the recording stop looking like its beginning, and a parameter-free
segmentation answers it:

- each series is split at every candidate time; its log-likelihood ratio of "two levels" over
  "one level" (Gaussian, unknown variance) is ``n/2 * log(SS_total / SS_within)``, with the
  within-segment spread floored at 1 % of the series' level so a flat series cannot make an
  infinite ratio (the maximum-likelihood single change point, as in CUSUM/AMOC);
- the ratios of all series are added (independent evidence adds up in log-likelihood) and
  the time with the largest sum is the best split;
- a split is significant when the sum beats a BIC-style penalty of ``log(n)`` per series (one
  more level parameter per series); binary segmentation then looks again *before* it, and
  the earliest significant split is the start. The earliest, not the strongest: a fault that
  came and went, or a second anomaly it caused later (a memory rise after a slowdown), must
  not move the baseline past the fault's own start (an online detector such as BOCPD alarms
  at the earliest change too).

Both segments must hold at least ``min_segment`` samples so the baseline can be scored
robustly (median and IQR of fewer than a handful of samples mean little).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from controllers.rca.models import TimeSeries

_REL_FLOOR = 0.01  # within-segment spread floored at 1 % of the series' level (and > 0)


@dataclass(frozen=True)
class ChangePoint:
    start: float  # time of the first sample after the change
    baseline_end: float  # time of the last sample before it
    llr: float  # summed log-likelihood ratio at the chosen split
    series: int  # how many series took part


def _llr_by_time(series: TimeSeries, min_segment: int, before: float) -> dict[float, float]:
    """Candidate start time -> this series' log-likelihood ratio of a level shift there, over
    the samples earlier than ``before``."""
    pts = [(t, v) for t, v in series.points if t < before]
    ts = [t for t, _ in pts]
    xs = [v for _, v in pts]
    n = len(xs)
    if n < 2 * min_segment:
        return {}
    total = sum(xs)
    mean = total / n
    ss_total = sum((x - mean) ** 2 for x in xs)
    level = sum(abs(x) for x in xs) / n
    floor = n * max((_REL_FLOOR * level) ** 2, 1e-18)
    out: dict[float, float] = {}
    s1 = q1 = 0.0
    for k in range(1, n):  # split between k-1 and k
        x = xs[k - 1]
        s1 += x
        q1 += x * x
        if k < min_segment or n - k < min_segment:
            continue
        s2 = total - s1
        ss_within = ss_total - (s1 * s1 / k + s2 * s2 / (n - k) - total * total / n)
        ratio = (ss_total + floor) / (max(ss_within, 0.0) + floor)
        out[ts[k]] = n / 2 * math.log(ratio)
    return out


def _best(series: list[TimeSeries], min_segment: int, before: float) -> ChangePoint | None:
    curves = [c for s in series if (c := _llr_by_time(s, min_segment, before))]
    if not curves:
        return None
    keyed = [(sorted(c), c) for c in curves]
    times = sorted({t for c in curves for t in c})
    best_t, best = times[0], -math.inf
    for t in times:
        acc = 0.0
        for keys, c in keyed:
            # series need not share timestamps: each contributes its split at or before t
            i = bisect.bisect_right(keys, t) - 1
            if i >= 0:
                acc += c[keys[i]]
        if acc > best:
            best_t, best = t, acc
    # baseline_end: just before the first sample of the new segment (the split keeps t <= it)
    return ChangePoint(start=best_t, baseline_end=math.nextafter(best_t, -math.inf), llr=best, series=len(curves))


def _penalty(series: list[TimeSeries], before: float) -> float:
    lengths = [n for s in series if (n := sum(1 for t, _ in s.points if t < before)) > 1]
    return sum(math.log(n) for n in lengths)


def detect(series: Iterable[TimeSeries], min_segment: int = 5) -> ChangePoint | None:
    """The earliest significant change time over ``series``; None when there is none (or no
    series is long enough to tell)."""
    pool = list(series)
    found: ChangePoint | None = None
    before = math.inf
    while (cp := _best(pool, min_segment, before)) is not None and cp.llr > _penalty(pool, before):
        found, before = cp, cp.start
    return found
