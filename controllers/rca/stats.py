"""Robust scores: how far the recent peak of a series stands above its normal level.

Why not the paper's "gap between maximum and average" alone: a max/mean ratio has no idea of a
series' normal spread (a bursty but healthy service always looks anomalous), it explodes when
the mean is near zero, and the mean itself is pulled up by the very anomaly it should expose.
The score here is BARO's RobustScorer (Pham et al., FSE 2024; scikit-learn's RobustScaler
fitted on the data before the anomaly), expressed in standard deviations so one threshold
reads the same on every series:

    z = (max(recent) - median(baseline)) / (IQR(baseline) / 1.349)

Only rises count: a fault shows as more latency, more CPU, memory, I/O or errors at its
service, while drops are what its victims show (less traffic reaches them). The baseline must
come before the anomaly (a given split, a normal/anomalous pair, or the change point found by
:mod:`controllers.rca.changepoint`); scored against a window that contains it, a fault that
covers half the window scores near 0. When no split can be made at all (too few samples), the
window is its own baseline and the spread is the MAD (Iglewicz and Hoaglin's modified z). The paper's ratio is still computed and reported as
evidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from controllers.rca.models import TimeSeries

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD of a normal distribution times this is its sigma
IQR_TO_SIGMA = 1.349  # 2 * Phi^-1(3/4): the IQR of a normal distribution divided by this is its sigma
#: A sparse series' baseline excursion scores this (below the 3.5 anomaly line): see robust_score.
SPARSE_TAIL_Z = 3.0
#: A recent window's level (its median) is judged from this many samples on.
LEVEL_MIN_SAMPLES = 5
_TINY = 1e-12  # keeps z finite (and JSON-serialisable) even with every floor set to 0


@dataclass(frozen=True)
class RobustScore:
    max: float
    mean: float
    baseline_median: float
    scale: float
    z: float
    whole_window: bool  # True when the series was scored against itself

    @property
    def peak_to_mean(self) -> float | None:
        return self.max / self.mean if self.mean > 0 else None

    @property
    def ratio_to_typical(self) -> float | None:
        return self.max / self.baseline_median if self.baseline_median > 0 else None


def split(series: TimeSeries, baseline_end: float | None, min_baseline_points: int) -> tuple[list[float], list[float], bool]:
    """(baseline values, recent values, whole_window). Falls back to the whole series as both
    when there is no split time or either side would be too thin to trust."""
    values = series.values
    if baseline_end is not None:
        base = [v for t, v in series.points if t <= baseline_end]
        recent = [v for t, v in series.points if t > baseline_end]
        if len(base) >= min_baseline_points and recent:
            return base, recent, False
    return values, values, True


def stopped_before(series: TimeSeries, baseline_end: float | None) -> bool:
    """True when ``series`` has samples, all of them at or before the anomaly's start: it stopped
    reporting (a container crashed or OOM-killed at the fault, a target no longer scraped). It
    has nothing to score: scored against itself, its baseline would read as the fault's peak."""
    return baseline_end is not None and bool(series.points) and series.points[-1][0] <= baseline_end


def robust_score(
    series: TimeSeries,
    baseline_end: float | None = None,
    *,
    min_baseline_points: int = 3,
    floor_abs: float = 0.0,
    floor_ratio: float = 0.0,
    flat_floor_ratio: float = 0.0,
) -> RobustScore | None:
    """Score the recent peak of ``series``; ``None`` for an empty series, for one with no sample
    after ``baseline_end`` (:func:`stopped_before`), and for one whose statistics are not
    finite (values so large that their sums overflow): such a series is not usable, and is
    left out as a series without data is.

    The spread is floored at ``floor_abs`` (in the series' unit) and at ``floor_ratio`` times
    the baseline median, so a flat baseline does not turn noise into an infinite score; a
    baseline whose spread is 0 (most of it one value) tells nothing of the spread: floored at
    ``flat_floor_ratio`` times its level, its peak judged against its own excursions and its
    recent level against the floors (see the comments below).
    """
    if not series.points or stopped_before(series, baseline_end):
        return None
    base, recent, whole = split(series, baseline_end, min_baseline_points)
    try:
        median = statistics.median(base)
        # A window scored against itself holds the anomaly: the MAD tolerates it up to half the
        # samples, the IQR only up to a quarter. A clean baseline gets BARO's IQR.
        spread = MAD_TO_SIGMA * statistics.median(abs(v - median) for v in base) if whole else iqr(base) / IQR_TO_SIGMA
        scale = max(spread, floor_ratio * abs(median), floor_abs, _TINY)
        peak = max(recent)
        z = (peak - median) / scale
        if spread == 0.0 and not whole:
            # No spread to measure by: most of the baseline holds one value. Held samples (a
            # sampler repeating its last reading, RCD's before an early change point) or a
            # quantized series: floored at ``flat_floor_ratio`` of the level, whether or not a
            # sample or two differ (one 4 KiB sample used to remove the floor and flip a ranking).
            scale = max(scale, flat_floor_ratio * abs(median))
            # A sparse series (0 in most of its baseline: sporadic errors, a GC pause in a flat
            # latency): a recent PEAK counts against the baseline's own excursions (no higher than
            # they were: z below SPARSE_TAIL_Z; two errors in a second scored 200 against the
            # errors floor although the baseline had such seconds, and named a flaky client's
            # gateway in 21 of 25 cases), and a recent LEVEL (the median after the start) against
            # the floors alone: a fault that lasts is not hidden by one excursion in the baseline
            # (one GC pause hid a 21x latency rise; a rollout's burst a sustained 6 % error ratio).
            tail = max(max(base) - median, median - min(base)) / SPARSE_TAIL_Z
            peak_scale = max(scale, tail)
            peak_z = (peak - median) / peak_scale
            # (a level needs a few samples, and a floor to be judged by: with 1-2 recent samples
            # the "level" is the peak, and with every floor at 0 a tiny steady level was z 1e9)
            level_z = ((statistics.median(recent) - median) / scale
                       if len(recent) >= LEVEL_MIN_SAMPLES and scale > _TINY else -math.inf)
            z, scale = (peak_z, peak_scale) if peak_z >= level_z else (level_z, scale)
        mean = statistics.fmean(series.values)
    except OverflowError:  # values near the float limit (±1.7e308): their sums overflow
        return None
    if not all(math.isfinite(x) for x in (median, scale, z, mean)):
        return None
    return RobustScore(
        max=peak,
        mean=mean,
        baseline_median=median,
        scale=scale,
        z=z,
        whole_window=whole,
    )


def iqr(values: list[float]) -> float:
    """Interquartile range (inclusive method, as numpy's default percentile)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def p99(values: list[float]) -> float:
    """The 99th percentile of samples (inclusive method: stays within the observed range)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]
