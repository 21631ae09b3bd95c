"""Pareto front, intervals and the choice rule (controllers.nginx_tuner.pareto) on hand-made data."""

from __future__ import annotations

import math

import pytest

from controllers.nginx_tuner.pareto import (
    Interval,
    Point,
    choose,
    ci_dominated,
    normalise,
    pareto_front,
    prune,
    t_quantile,
)


def pt(value: float, rt: float, mem: float, half_rt: float = 0.0, half_mem: float = 0.0) -> Point:
    """A point with given means and interval half-widths (n=5)."""
    return Point(value, Interval(rt, rt - half_rt, rt + half_rt, 5), Interval(mem, mem - half_mem, mem + half_mem, 5))


@pytest.mark.parametrize(
    ("confidence", "df", "expected"),
    [(0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 4, 2.7764), (0.95, 9, 2.2622), (0.95, 30, 2.0423), (0.99, 5, 4.0321), (0.90, 7, 1.8946)],
)
def test_t_quantile_matches_tables(confidence: float, df: int, expected: float) -> None:
    assert t_quantile(confidence, df) == pytest.approx(expected, abs=1e-4)


def test_t_interval_of_samples() -> None:
    iv = Interval.of([10.0, 12.0, 11.0, 13.0, 9.0])  # mean 11, sd sqrt(2.5)
    half = 2.7764 * math.sqrt(2.5) / math.sqrt(5)
    assert (iv.mean, iv.n) == (11.0, 5)
    assert iv.low == pytest.approx(11 - half, abs=1e-3) and iv.high == pytest.approx(11 + half, abs=1e-3)
    single = Interval.of([4.0])
    assert (single.low, single.high) == (-math.inf, math.inf)
    with pytest.raises(ValueError):
        Interval.of([])


def test_front_drops_dominated_and_keeps_ties() -> None:
    pts = [
        pt(5, rt=0.010, mem=100),  # fastest
        pt(10, rt=0.012, mem=90),
        pt(15, rt=0.012, mem=90),  # identical to 10: neither dominates
        pt(20, rt=0.013, mem=95),  # dominated by 10 and 15
        pt(25, rt=0.020, mem=80),  # smallest memory
        pt(30, rt=0.020, mem=85),  # dominated by 25 (equal rt, more memory)
    ]
    assert [p.value for p in pareto_front(pts)] == [5, 10, 15, 25]


def test_normalise_min_max_and_flat_objective() -> None:
    norm = normalise([pt(5, 0.010, 100), pt(10, 0.015, 100), pt(15, 0.020, 100)])
    assert norm == {5: (0.0, 0.0), 10: (pytest.approx(0.5), 0.0), 15: (1.0, 0.0)}


def test_sum_and_utopia_rules_differ() -> None:
    # Normalised A (0, 1), B (0.45, 0.45), C (1, 0): both rules pick the balanced B.
    pts = [pt(5, 0.0, 1.0), pt(10, 0.45, 0.45), pt(15, 1.0, 0.0)]
    assert choose(pts, rule="sum").best == 10
    assert choose(pts, rule="utopia").best == 10
    # A (0, 0.9) sum 0.9 dist 0.9; B (0.46, 0.46) sum 0.92 dist 0.65; D (1, 1) spans the ranges.
    pts = [pt(5, 0.0, 0.9), pt(10, 0.46, 0.46), pt(15, 1.0, 0.0), pt(20, 1.0, 1.0)]
    assert choose(pts, rule="sum").best == 5
    assert choose(pts, rule="utopia").best == 10


def test_score_ties_prefer_current_then_smaller_value() -> None:
    pts = [pt(5, 0.0, 1.0), pt(10, 1.0, 0.0), pt(15, 0.5, 0.5)]  # all sums == 1
    assert choose(pts).best == 5
    assert choose(pts, current=15).best == 15
    assert choose(pts, current=15).kept_current


def test_keeps_current_when_intervals_overlap_on_both() -> None:
    pts = [pt(60, 0.0110, 5435e3, 0.0010, 40e3), pt(70, 0.0106, 5408e3, 0.0010, 40e3), pt(90, 0.0120, 5500e3, 0.0010, 40e3)]
    c = choose(pts, current=60)
    assert c.best == 70  # the paper's pick: lower means on both...
    assert c.value == 60 and c.kept_current  # ...but within noise on both
    assert "keeping 60" in c.reason and "not significantly better" in c.reason


def test_switches_when_significantly_better_on_one_objective() -> None:
    pts = [pt(60, 0.0110, 5435e3, 0.0002, 40e3), pt(70, 0.0100, 5420e3, 0.0002, 40e3)]
    c = choose(pts, current=60)
    assert (c.value, c.kept_current) == (70, False)
    assert "response time" in c.reason and "memory" not in c.reason


def test_keeps_current_when_pick_is_significantly_worse_on_the_other() -> None:
    # 70 is on the front and wins the sum, but its memory is significantly *worse* and
    # its response time gain is inside the noise: no reason to change.
    pts = [
        pt(60, 0.0110, 100.0, 0.002, 1.0),
        pt(70, 0.0090, 104.0, 0.002, 1.0),
        pt(90, 0.0200, 100.5, 0.002, 1.0),
        pt(100, 0.0150, 140.0, 0.002, 1.0),  # dominated; stretches the memory range
    ]
    c = choose(pts, current=60)
    assert c.scores[70] < c.scores[60]
    assert c.best == 70 and c.value == 60 and c.kept_current


def test_current_not_measured_or_absent() -> None:
    pts = [pt(5, 0.01, 100, 0.001, 1), pt(10, 0.02, 90, 0.001, 1)]
    assert "not measured" in choose(pts, current=65).reason
    assert not choose(pts, current=65).kept_current
    assert "no current value" in choose(pts).reason
    with pytest.raises(ValueError):
        choose([pt(5, 1, 1), pt(5, 2, 2)])


def test_ci_domination_and_prune() -> None:
    good = pt(10, 0.010, 100, 0.001, 2)
    bad = pt(20, 0.015, 110, 0.001, 2)  # both intervals entirely above good's
    close = pt(30, 0.0115, 110, 0.001, 2)  # rt intervals overlap good's
    assert ci_dominated(bad, good) and not ci_dominated(good, bad)
    assert not ci_dominated(close, good)
    assert prune([good, bad, close]) == {20: 10}
    one_run = Point(40, Interval.of([0.5]), Interval.of([500.0]))
    assert 40 not in prune([good, one_run])  # one run: unbounded interval, never dropped
