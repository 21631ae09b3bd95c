"""Pick a keepalive_timeout from repeated trials: Pareto front, confidence intervals, a choice rule.

Objectives, both minimised: mean response time (seconds) and nginx memory (bytes). The
paper took one run per value and picked the smallest *raw* sum of milliseconds and KiB, so
the memory term (thousands) decided alone, and its correlations (~0) say the differences it
acted on were noise. Here:

- every candidate is run several times (``trial.trial_plan`` interleaves them), and each
  objective gets a Student-t interval of the mean, ``mean +/- t(1-(1-c)/2, n-1) * s/sqrt(n)``.
  With one repeat the interval is unbounded: a single run never justifies a change.
- the front is the set of candidates no other candidate dominates on the *means* (<= on both,
  < on one); equal points do not dominate each other, so ties both stay on the front.
- objectives are min-max normalised over all measured candidates (0 = best seen, 1 = worst);
  an objective on which all candidates are equal normalises to 0 and does not vote.
- choice rule (documented default ``"sum"``): smallest normalised sum, i.e. equal weight to
  "fraction of the observed response-time range" and "fraction of the observed memory
  range". ``"utopia"`` picks the smallest Euclidean distance to (0, 0) instead, which
  prefers balanced points over extreme ones. Ties: the current value, then the smaller
  value (fewer idle connections held, less memory at risk).
- keep-current rule: the chosen value replaces the current one only if its interval lies
  entirely below the current value's interval on at least one objective. This contains the
  brief's rule (intervals overlap on both objectives -> keep) and also keeps the current
  value when the "better" pick is merely not-worse on one objective and significantly worse
  on the other. With 20 candidates x 2 objectives some non-overlaps happen by chance: treat
  a change as a hypothesis to confirm with a second sweep, not as proof.
- early stopping (:func:`ci_dominated`, :func:`prune`): a candidate can be dropped from the
  remaining repeats once some other candidate's interval is entirely below its interval on
  *both* objectives; a conservative criterion (non-overlap at the chosen level).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Rule = Literal["sum", "utopia"]


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3/26.7.4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        return 2.0 / math.pi * (theta + s * total)
    total = term = 1.0
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return s * total


@lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """Two-sided critical value: ``t`` with P(|T| < t) = confidence (e.g. 0.95, df 4 -> 2.776)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < confidence:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _t_two_sided(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Interval:
    """Mean of repeated measurements with its t confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float], confidence: float = 0.95) -> Interval:
        if not samples:
            raise ValueError("no samples")
        mean = statistics.fmean(samples)
        if len(samples) < 2:
            return cls(mean, -math.inf, math.inf, len(samples))
        half = t_quantile(confidence, len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))
        return cls(mean, mean - half, mean + half, len(samples))

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def below(self, other: Interval) -> bool:
        """Entirely below ``other``: significantly smaller at the intervals' level."""
        return self.high < other.low


@dataclass(frozen=True)
class Point:
    """One candidate value with its two objectives."""

    value: float
    rt: Interval  # mean response time, seconds
    mem: Interval  # nginx memory, bytes

    @classmethod
    def from_samples(cls, value: float, rt_s: Sequence[float], mem_bytes: Sequence[float], confidence: float = 0.95) -> Point:
        return cls(value, Interval.of(rt_s, confidence), Interval.of(mem_bytes, confidence))


def dominates(a: Point, b: Point) -> bool:
    """``a`` is at least as good as ``b`` on both means and strictly better on one."""
    return a.rt.mean <= b.rt.mean and a.mem.mean <= b.mem.mean and (a.rt.mean < b.rt.mean or a.mem.mean < b.mem.mean)


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """Non-dominated points, sorted by response time then memory."""
    pts = list(points)
    front = [p for p in pts if not any(dominates(q, p) for q in pts if q is not p)]
    return sorted(front, key=lambda p: (p.rt.mean, p.mem.mean, p.value))


def normalise(points: Sequence[Point]) -> dict[float, tuple[float, float]]:
    """Min-max normalised (rt, mem) per value over all given points; a flat objective is 0."""

    def scale(xs: list[float]) -> list[float]:
        lo, hi = min(xs), max(xs)
        return [0.0 if hi == lo else (x - lo) / (hi - lo) for x in xs]

    rt = scale([p.rt.mean for p in points])
    mem = scale([p.mem.mean for p in points])
    return {p.value: (r, m) for p, r, m in zip(points, rt, mem, strict=True)}


def score(norm: tuple[float, float], rule: Rule) -> float:
    if rule == "sum":
        return norm[0] + norm[1]
    if rule == "utopia":
        return math.hypot(norm[0], norm[1])
    raise ValueError(f"unknown rule {rule!r}")


@dataclass(frozen=True)
class Choice:
    value: float  # what to apply (== current when kept)
    best: float  # the rule's pick on the front
    front: tuple[float, ...]
    scores: Mapping[float, float]  # every measured value's score (lower is better)
    kept_current: bool
    reason: str


def choose(points: Sequence[Point], current: float | None = None, rule: Rule = "sum") -> Choice:
    """Apply the choice rule on the front, then the keep-current significance check."""
    if not points:
        raise ValueError("no measured points")
    values = [p.value for p in points]
    if len(set(values)) != len(values):
        raise ValueError("duplicate candidate values")
    norm = normalise(points)
    scores = {v: score(n, rule) for v, n in norm.items()}
    front = pareto_front(points)
    best = min(front, key=lambda p: (round(scores[p.value], 12), p.value != current, p.value))
    front_values = tuple(p.value for p in front)
    by_value = {p.value: p for p in points}
    if current is None or current not in by_value:
        why = "no current value given" if current is None else f"current value {current:g} was not measured"
        return Choice(best.value, best.value, front_values, scores, False, f"{why}; applying the rule's pick {best.value:g} without a significance check")
    if best.value == current:
        return Choice(current, best.value, front_values, scores, True, f"the current value {current:g} is already the rule's pick")
    cur = by_value[current]
    better = [name for name, b, c in (("response time", best.rt, cur.rt), ("memory", best.mem, cur.mem)) if b.below(c)]
    if not better:
        return Choice(
            current, best.value, front_values, scores, True,
            f"keeping {current:g}: the rule's pick {best.value:g} is not significantly better on any objective "
            f"(intervals overlap or it is worse)",
        )
    return Choice(best.value, best.value, front_values, scores, False, f"{best.value:g} is significantly better than {current:g} on {' and '.join(better)}")


def ci_dominated(a: Point, b: Point) -> bool:
    """``b``'s intervals lie entirely below ``a``'s on both objectives: ``a`` can stop early."""
    return b.rt.below(a.rt) and b.mem.below(a.mem)


def prune(points: Sequence[Point]) -> dict[float, float]:
    """Candidates that can be dropped from further repeats -> a value that CI-dominates each."""
    out: dict[float, float] = {}
    for a in points:
        for b in points:
            if b is not a and ci_dominated(a, b):
                out[a.value] = b.value
                break
    return out
