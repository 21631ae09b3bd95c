"""The copy-guard benchmark's counting window (bench/copy_guard): every loaded run of a round is
counted over the same window, and a guard that pushes its copy past the window scores nothing."""

from __future__ import annotations

import pytest

from bench.copy_guard import analysis
from bench.copy_guard.analysis import RunResult
from bench.copy_guard.run import Bench, parse_args

BIN = 0.1


def bins(*segments: tuple[float, float, int]) -> dict[int, list[int]]:
    """Completions: ``(start, end, per_second)`` segments, back to back (one completion every
    1/per_second s, at most one per 100 ms bin)."""
    out: dict[int, list[int]] = {}
    for start, end, per_second in segments:
        step = round(1 / (per_second * BIN))
        out.update({b: [1, 0] for b in range(round(start / BIN), round(end / BIN), step)})
    return out


def test_served_between_counts_whole_bins_inside_the_window() -> None:
    b = {b: [1, 2] for b in range(100, 200)}  # 10.0 s .. 20.0 s
    assert analysis.served_between(b, BIN, 10.0, 20.0) == 100
    assert analysis.served_between(b, BIN, 12.0, 13.0) == 10
    assert analysis.served_between(b, BIN, 12.05, 13.0) == 9  # the bin at 12.0 is not wholly inside
    assert analysis.served_between(b, BIN, 12.0, 13.0, column=1) == 20


def run(name: str, load_s: float, copy_end_s: float | None = None) -> RunResult:
    r = RunResult(name, 0, True, copy_end_s is not None, "none" if "guard" not in name else "reactive")
    r.load_start, r.load_end = 1000.0, 1000.0 + load_s
    r.copy_end = None if copy_end_s is None else 1000.0 + copy_end_s
    return r


def test_common_window_is_the_shortest_load_and_flags_copies_that_outlive_it() -> None:
    w = analysis.common_window([run("load-only", 150), run("load+copy", 149.5, 40), run("load+copy+guard", 150, 120)])
    assert w.seconds == pytest.approx(149.5)
    assert w.contains_every_copy and w.latest_copy_end_s == pytest.approx(120)
    late = analysis.common_window([run("load-only", 75), run("load+copy", 75, 40), run("load+copy+guard", 75, 110)])
    assert not late.contains_every_copy and late.late == ["load+copy+guard"]
    killed = run("load+copy+guard", 75, None)  # a copy that never ended (killed) is never contained
    killed.copy = True
    assert not analysis.common_window([run("load-only", 75), killed]).contains_every_copy


def counted(load_only_s: float, guard_copy_end_s: float,
            guard: dict[int, list[int]]) -> tuple[Bench, RunResult, RunResult, RunResult]:
    """A round at 10 req/s, 5 while a copy runs: load-only for ``load_only_s``, the unguarded copy
    10-40 s into a 75 s load, the guarded run (75 s of load) with the timeline ``guard``; counted."""
    lo, cp, g = run("load-only", load_only_s), run("load+copy", 75, 40), run("load+copy+guard", 75, guard_copy_end_s)
    b = Bench(parse_args(["--warmup", "0"]))
    b.threshold = 8.0
    b.results = [lo, cp, g]
    b.timelines = {(0, "load-only"): (bins((1000, 1000 + load_only_s, 10)), BIN),
                   (0, "load+copy"): (bins((1000, 1010, 10), (1010, 1040, 5), (1040, 1075, 10)), BIN),
                   (0, "load+copy+guard"): (guard, BIN)}
    b.count_in_windows()
    return b, lo, cp, g


def test_a_guard_that_holds_its_copy_past_the_window_scores_nothing() -> None:
    # The guard holds its copy paused through the whole 75 s load: over the load it served as
    # much as load-only (the old count said 100 % saved), but its copy ends at 110 s, after the window.
    b, _, cp, g = counted(75, 110, bins((1000, 1075, 10)))
    assert b.windows[0].late == ["load+copy+guard"]
    assert g.saved_share is None and "after the window" in g.note
    assert g.served_window == 750 and cp.served_window == 600
    assert g.saved_responses == 150  # shown, but not as a share


def test_the_share_is_counted_over_the_common_window() -> None:
    # the guarded copy ends at 60 s, inside the 75 s window, after slowing the site for 40 s (the
    # unguarded one: 30 s): this guard lost more than it saved. load-only ran longer (80 s) but
    # only the common 75 s count.
    b, lo, cp, g = counted(80, 60, bins((1000, 1020, 10), (1020, 1060, 5), (1060, 1075, 10)))
    assert b.windows[0].seconds == pytest.approx(75) and b.windows[0].contains_every_copy
    assert lo.served_window == 750 and cp.served_window == 600 and g.served_window == 550
    assert g.lost_responses == 150 and g.saved_responses == -50
    assert g.saved_share == pytest.approx(-1 / 3)
