"""Repeated points of the admission bench: their order, their means and spread, and the verdict
made on the means."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.admission import run
from bench.admission.repeats import aggregate, schedule, spread
from bench.admission.run import ChunkedLock, Settings, fits, parse_deadline, point_cell, targets


def _row(arm: str, clients: int, multiple: float, per_s: float, start: int = 0, mid: int = 0, rep: int = 0,
         p99: float = 1.0) -> dict[str, Any]:
    fp = {str(n): 0 for n in range(1, 8)}
    fp["1"], fp["5"] = start, mid
    return {"arm": arm, "clients": clients, "multiple": multiple, "completed_per_s": per_s, "rep": rep,
            "failed_by_page": fp, "failed_by_group": {"1": start, "2-4": 0, "5": mid, "6-7": 0},
            "abandoned": mid, "rt_ok_p50_s": p99 / 2, "rt_ok_p99_s": p99, "wasted_share": 0.0,
            "rt_timeline": [{"t": 0.0, "rep": rep}]}


POINTS = [("base", 1.0), ("base", 4.0), ("base", 2.0), ("overhead", 0.0), ("base", 3.0)]


def test_schedule_runs_every_point_n_times_and_the_overhead_once() -> None:
    steps = schedule(POINTS, 3)
    assert Counter((c, m) for c, m, _, _ in steps) == Counter(
        {("base", 1.0): 3, ("base", 4.0): 3, ("base", 2.0): 3, ("base", 3.0): 3, ("overhead", 0.0): 1})
    assert sorted(r for c, _, r, _ in steps if c == "base") == [0] * 4 + [1] * 4 + [2] * 4
    assert [(c, m) for c, m, r, _ in steps if r == 0] == POINTS  # the first repetition is the plan as given
    with pytest.raises(ValueError):
        schedule(POINTS, 0)


def test_schedule_interleaves_repetitions_and_alternates_the_order() -> None:
    steps = schedule(POINTS, 3)
    reps = [r for _, _, r, _ in steps]
    assert reps == sorted(reps)  # repetition after repetition, never one point three times in a row
    rep1 = [(c, m) for c, m, r, _ in steps if r == 1]
    assert rep1 == [p for p in POINTS if p[0] != "overhead"][::-1]  # odd repetitions run backwards
    # the arms' order alternates from point to point, and for one point from a repetition to the next
    for r in range(3):
        flips = [f for c, _, rep, f in steps if rep == r and c != "overhead"]  # (the overhead has no arms)
        assert len(flips) == 4 and all(a != b for a, b in zip(flips, flips[1:], strict=False))
    for point in [p for p in POINTS if p[0] != "overhead"]:
        flips = [f for c, m, _, f in steps if (c, m) == point]
        assert all(a != b for a, b in zip(flips, flips[1:], strict=False)), point
    assert [f for c, _, _, f in schedule(POINTS, 1) if c != "overhead"] == [False, True, False, True]


def test_spread_of_the_runs() -> None:
    s = spread([20.0, 22.0, 24.0])
    assert s == {"n": 3, "mean": pytest.approx(22.0), "sd": pytest.approx(2.0), "min": 20.0, "max": 24.0}
    assert spread([5.0])["sd"] == 0.0
    with pytest.raises(ValueError):
        spread([])


def test_aggregate_means_the_runs_of_each_point_and_keeps_the_worst_mid_session_failure() -> None:
    rows = [_row("full", 200, 4.0, 24.0, start=10, rep=2, p99=3.0), _row("full", 200, 4.0, 18.0, start=30, mid=2, rep=0),
            _row("full", 200, 4.0, 21.0, start=20, rep=1, p99=2.0), _row("page", 200, 4.0, 15.0, start=1, mid=9)]
    by_arm = {r["arm"]: r for r in aggregate(rows)}
    full = by_arm["full"]
    assert full["completed_per_s"] == pytest.approx(21.0)
    assert full["runs"] == [18.0, 21.0, 24.0] and full["reps"] == [0, 1, 2]  # in repetition order
    assert full["completed"]["sd"] == pytest.approx(3.0)
    assert (full["completed"]["min"], full["completed"]["max"]) == (18.0, 24.0)
    assert full["failed_by_page"]["1"] == pytest.approx(20.0)
    assert full["failed_by_group"]["5"] == pytest.approx(2 / 3)
    assert full["abandoned"] == pytest.approx(2 / 3) and full["abandoned_max"] == 2
    assert full["rt_ok_p99_s"] == pytest.approx(2.0)
    assert full["rt_timeline"] == [{"t": 0.0, "rep": 0}]  # the first run's
    page = by_arm["page"]
    assert page["completed"]["n"] == 1 and page["completed_per_s"] == 15.0 and page["abandoned_max"] == 9


def test_targets_judge_the_means_not_one_lucky_or_unlucky_run() -> None:
    rows = [_row("full", 50, 1.0, 19.0, rep=0), _row("full", 50, 1.0, 21.0, rep=1),
            _row("full", 100, 2.0, 20.0, rep=0), _row("full", 100, 2.0, 20.0, rep=1),
            _row("full", 200, 4.0, 17.0, start=40, rep=0), _row("full", 200, 4.0, 20.0, start=20, rep=1)]
    t = targets(rows)["full"]
    # one run alone: 17 / 21 = 81 % (a miss); the means: 18.5 / 20 = 92.5 %
    assert t["completed_per_s"] == 18.5 and t["peak_per_s"] == 20.0
    assert t["of_own_peak"] == pytest.approx(0.925)
    assert t["of_own_peak_runs"] == [0.85, 1.0]
    assert (t["runs"], t["min_per_s"], t["max_per_s"]) == (2, 17.0, 20.0)
    assert t["failed_start"] == 30.0
    assert targets(rows)["verdict"] == {"keeps_90pct_of_own_peak": True, "keeps_90pct_of_best_peak": True,
                                        "failures_only_at_start": True}
    rows[-1] = _row("full", 200, 4.0, 20.0, start=20, mid=1, rep=1)  # one mid-session failure in one run
    assert targets(rows)["verdict"]["failures_only_at_start"] is False
    rows[-1] = _row("full", 200, 4.0, 15.0, rep=1)
    assert targets(rows)["verdict"]["keeps_90pct_of_own_peak"] is False  # 16 / 20


def test_point_cell_shows_the_spread_only_for_repeated_points() -> None:
    one = aggregate([_row("full", 200, 4.0, 21.6, start=152)])[0]
    assert point_cell(one) == "**21.60** (152/0; 1.0s)"
    three = aggregate([_row("full", 200, 4.0, v, start=s, rep=i) for i, (v, s) in enumerate([(20.0, 10), (22.0, 20), (24.0, 30)])])[0]
    assert point_cell(three) == "**22.00** ±2.00 (20.00-24.00, 3 runs; 20/0; 1.0s)"


def test_deadline_is_the_next_such_utc_time_or_unix_seconds() -> None:
    noon = 1795694400.0  # 2026-11-26 12:00:00 UTC
    assert parse_deadline("15:40", now=noon) == noon + 3 * 3600 + 40 * 60
    assert parse_deadline("11:30", now=noon) == noon - 30 * 60  # just passed: today's (nothing fits)
    assert parse_deadline("00:10", now=noon + 11 * 3600) == noon + 12 * 3600 + 10 * 60  # after midnight
    assert parse_deadline("1795700000", now=noon) == 1795700000.0
    for bad in ("25:00", "12:61", "noon:00"):
        with pytest.raises(Exception, match="time of day"):
            parse_deadline(bad, now=noon)
    st = Settings(deadline=noon + 100)
    assert fits(st, 100, now=noon) and not fits(st, 101, now=noon)
    assert fits(Settings(), 1e9)


def _sweep_settings(tmp_path: Path, **kw: Any) -> Settings:
    (tmp_path / "raw").mkdir(parents=True, exist_ok=True)
    return Settings(out=tmp_path, conditions=("base",), arms=("page", "full"), multiples=(2.0, 4.0), **kw)


def test_sweep_runs_each_repetition_once_and_resumes_where_it_stopped(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, int]] = []

    def fake_point(st: Settings, cal: dict[str, Any], condition: str, arm: str, clients: int, multiple: float,
                   rep: int = 0) -> dict[str, Any]:
        calls.append((arm, clients, rep))
        return {**_row(arm, clients, multiple, 10.0 + rep, rep=rep), "condition": condition, "host": {}}

    monkeypatch.setattr(run, "run_point", fake_point)
    st = _sweep_settings(tmp_path, repeat=2)
    cal = {"n_sat": 10}
    steps = schedule(run.plan(st, with_overhead=False), st.repeat)
    assert run.sweep(st, cal, ChunkedLock(None), steps[:3]) == []
    assert calls == [("page", 20, 0), ("full", 20, 0), ("full", 40, 0), ("page", 40, 0), ("page", 40, 1),
                     ("full", 40, 1)]
    calls.clear()
    assert run.sweep(st, cal, ChunkedLock(None), steps) == []  # the done runs are not run again
    assert calls == [("full", 20, 1), ("page", 20, 1)]
    rows = json.loads((tmp_path / "raw" / "base.json").read_text())
    assert sorted((r["arm"], r["clients"], r["rep"]) for r in rows) == sorted(
        (a, n, r) for a in ("page", "full") for n in (20, 40) for r in (0, 1))


def test_sweep_starts_nothing_that_would_end_after_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_point(*a: Any, **kw: Any) -> dict[str, Any]:
        raise AssertionError("a point ran past the deadline")

    monkeypatch.setattr(run, "run_point", no_point)
    monkeypatch.setattr(run, "overhead", no_point)
    st = _sweep_settings(tmp_path, repeat=2, deadline=1.0)  # long past
    steps = schedule(run.plan(st, with_overhead=True), st.repeat)
    assert run.sweep(st, {"n_sat": 10}, ChunkedLock(None), steps) == [
        "base 2x run 1", "base 4x run 1", "overhead", "base 4x run 2", "base 2x run 2"]


def test_report_only_takes_the_window_the_points_were_measured_with(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "command.json").write_text(json.dumps(
        {"command": "uv run ... --warmup 60 --window 100", "warmup_paper_s": 60.0, "window_paper_s": 100.0,
         "skipped": ["base 4x run 3"]}))
    assert run.main(["--report-only", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["window"]["warmup_s"] == pytest.approx(6.0) and s["window"]["seconds"] == pytest.approx(10.0)
    assert s["command"] == "uv run ... --warmup 60 --window 100" and s["skipped"] == ["base 4x run 3"]
    assert "Not run (they would have ended after `--deadline`): base 4x run 3." in (tmp_path / "summary.md").read_text()
    assert run.main(["--report-only", "--out", str(tmp_path), "--window", "200"]) == 0  # a flag given still wins
    assert json.loads((tmp_path / "summary.json").read_text())["window"]["seconds"] == pytest.approx(20.0)


def _overhead_run(added_p99: float, started: str) -> dict[str, Any]:
    side = {"p50_ms": 1.0, "p99_ms": 2.0}
    return {"rate": 1000.0, "block_s": 5.0, "rounds": 3, "paths": {"static": "/s", "page_inline": "/p?inline=1"},
            "started_utc": started, "ended_utc": started, "event_loop": "uvloop",
            "runs": {f"{n}/{v}": side for n in ("static", "page_inline") for v in ("direct", "proxy")},
            "added": {"static": {"p50_ms": 0.2, "p99_ms": added_p99}, "page_inline": {"p50_ms": -0.01, "p99_ms": 0.5}},
            "ceiling": {"static": {"per_core": 6000}, "page_inline": {"per_core": 4000}},
            "page_queue_waits": {}, "host": {}}


def test_overhead_only_with_repeat_runs_the_step_n_times_and_reports_every_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = iter([_overhead_run(0.7, "18:33:00"), _overhead_run(0.9, "18:36:00"), _overhead_run(1.1, "18:39:00")])
    monkeypatch.setattr(run, "overhead", lambda st: next(runs))
    monkeypatch.setattr(run, "describe", lambda host: "2 cores")
    st = _sweep_settings(tmp_path, repeat=3)
    (tmp_path / "raw").mkdir(parents=True, exist_ok=True)
    (tmp_path / "raw" / "overhead-r5.json").write_text("{}")  # an older series': not reported
    steps = schedule([("overhead", 0.0)], 3, first_only=())
    assert [(c, r) for c, _, r, _ in steps] == [("overhead", 0), ("overhead", 1), ("overhead", 2)]
    assert run.sweep(st, None, ChunkedLock(None), steps) == []
    assert sorted(p.name for p in (tmp_path / "raw").glob("overhead*.json")) == [
        "overhead-r1.json", "overhead-r2.json", "overhead.json"]
    md = "\n".join(run.overhead_runs_md([json.loads((tmp_path / "raw" / n).read_text())
                                         for n in ("overhead.json", "overhead-r1.json", "overhead-r2.json")]))
    assert "| static | +0.200 / +0.700 | +0.200 / +0.900 | +0.200 / +1.100 | 6000, 6000, 6000 |" in md
    assert "| page_inline | -0.010 / +0.500 |" in md
    monkeypatch.setattr(run.plot, "write", lambda out, summary: [])
    s = run.report(st, "uv run --frozen python -m bench.admission --overhead only --repeat 3")
    assert [r["started_utc"] for r in [s["overhead"], *s["overhead_runs"]]] == ["18:33:00", "18:36:00", "18:39:00"]
    text = (tmp_path / "summary.md").read_text()
    assert "; 3 runs)" in text and "### Run 3 (18:39:00-18:39:00 UTC)" in text and "event loop: uvloop" in text
