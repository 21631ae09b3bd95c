"""The admission bench's counting: sessions completed and failed by page inside one window."""

from __future__ import annotations

import json

import pytest

from bench.admission.counting import Window, count, parse_events, per_second, percentile, window_after_start
from bench.admission.load import parse_stages
from bench.admission.run import Settings, plan, targets

T0 = 1000.0


def req(u: int, s: int, n: int, t0: float, t1: float, r: str = "ok", st: int = 200) -> str:
    return json.dumps({"k": "req", "u": u, "s": s, "n": n, "t0": t0, "t1": t1, "st": st, "r": r})


def ses(u: int, s: int, t0: float, t1: float, r: str, n: int, why: str | None = None) -> str:
    rec = {"k": "ses", "u": u, "s": s, "t0": t0, "t1": t1, "r": r, "n": n}
    if why:
        rec["why"] = why
    return json.dumps(rec)


def completed_session(u: int, s: int, start: float, step: float = 0.5) -> list[str]:
    lines = [req(u, s, n, start + (n - 1) * step, start + (n - 1) * step + 0.1) for n in range(1, 8)]
    return lines + [ses(u, s, start, start + 6 * step + 0.1, "completed", 7)]


def log(*groups: list[str]) -> list[str]:
    lines = [json.dumps({"k": "stage", "t": T0, "users": 3})]
    for g in groups:
        lines += g
    return lines


def test_completed_sessions_count_when_their_logout_answers_inside_the_window() -> None:
    ev = parse_events(log(
        completed_session(1, 1, T0 + 1.0),   # ends at T0+4.1: before the window
        completed_session(1, 2, T0 + 8.0),   # ends T0+11.1: inside
        completed_session(2, 3, T0 + 9.0),   # starts before the window opens... ends T0+12.1: inside
        completed_session(3, 4, T0 + 18.0),  # ends T0+21.1: after the window
    ))
    c = count(ev, window_after_start(ev, warmup=10.0, seconds=10.0))
    assert c["completed"] == 2
    assert c["completed_per_s"] == pytest.approx(0.2)
    assert c["failed"] == 0 and c["abandoned"] == 0


def test_failures_are_attributed_to_their_page_and_split_start_from_mid_session() -> None:
    ev = parse_events(log(
        [req(1, 1, 1, T0 + 11, T0 + 17, "timeout", 0), ses(1, 1, T0 + 11, T0 + 17, "failed", 1, "timeout")],
        [req(2, 2, 1, T0 + 11, T0 + 11.1), req(2, 2, 2, T0 + 11.5, T0 + 11.6),
         req(2, 2, 3, T0 + 12, T0 + 12.1, "refused", 503), ses(2, 2, T0 + 11, T0 + 12.1, "failed", 3, "refused")],
        [req(3, 3, 1, T0 + 12, T0 + 12.1), req(3, 3, 5, T0 + 13, T0 + 19, "timeout", 0),
         ses(3, 3, T0 + 12, T0 + 19, "failed", 5, "timeout")],
        [ses(3, 9, T0 + 2, T0 + 3, "failed", 5, "timeout")],  # before the window: not counted
    ))
    c = count(ev, Window(T0 + 10, T0 + 20))
    assert c["failed"] == 3
    assert c["failed_by_page"] == {"1": 1, "2": 0, "3": 1, "4": 0, "5": 1, "6": 0, "7": 0}
    assert c["failed_by_group"] == {"1": 1, "2-4": 1, "5": 1, "6-7": 0}
    assert c["abandoned"] == 2  # pages 3 and 5: gave up mid-session
    assert c["failed_by_reason"] == {"timeout": 2, "refused": 1, "http": 0, "conn": 0}
    # the three pages answered 200 for sessions that then failed were wasted work
    assert c["wasted_ok"] == 3
    assert c["completed"] == 0


def test_response_times_cover_answers_in_the_window_only() -> None:
    ev = parse_events(log([req(1, 1, 1, T0 + 9.0, T0 + 9.5)],  # answered before the window
                          [req(1, 1, 2, T0 + 10.0, T0 + 10.2), req(1, 1, 3, T0 + 11.0, T0 + 11.4)]))
    c = count(ev, Window(T0 + 10, T0 + 20))
    assert c["requests"] == 2
    assert c["rt_ok_p50_s"] == pytest.approx(0.2)
    assert c["rt_ok_p99_s"] == pytest.approx(0.4)
    assert c["rt_by_page"]["1"]["n"] == 0 and c["rt_by_page"]["3"]["n"] == 1


def test_window_boundaries_are_half_open_and_the_same_length_for_every_arm() -> None:
    w = Window(10.0, 20.0)
    assert 10.0 in w and 19.999 in w and 20.0 not in w and 9.999 not in w
    assert w.seconds == 10.0
    with pytest.raises(ValueError):
        Window(5.0, 5.0)
    a = parse_events(log())
    b = parse_events([json.dumps({"k": "stage", "t": T0 + 3.0, "users": 3})])
    wa, wb = window_after_start(a, 8.0, 30.0), window_after_start(b, 8.0, 30.0)
    assert wa.seconds == wb.seconds == 30.0
    assert wb.start - wa.start == pytest.approx(3.0)


def test_the_first_stage_starts_the_clock_and_a_log_without_one_is_an_error() -> None:
    ev = parse_events([json.dumps({"k": "stage", "t": T0 + 5, "users": 9}), json.dumps({"k": "stage", "t": T0, "users": 3})])
    assert ev.started == T0
    with pytest.raises(ValueError, match="never started"):
        window_after_start(parse_events([]), 1.0, 1.0)


def test_cut_or_foreign_lines_are_counted_as_bad_not_fatal() -> None:
    ev = parse_events(log(completed_session(1, 1, T0 + 1), ['{"k": "req", "u": 1, "s"', "not json", "[]", "", '{"x": 1}']))
    assert ev.bad_lines == 4
    assert len(ev.sessions) == 1


def test_per_second_timeline_splits_start_and_mid_session_failures() -> None:
    ev = parse_events(log(completed_session(1, 1, T0), [ses(2, 2, T0, T0 + 0.5, "failed", 1, "refused"),
                                                         ses(3, 3, T0, T0 + 2.5, "failed", 4, "timeout")]))
    rows = per_second(ev, T0, T0 + 4, 1.0)
    assert [r["completed"] for r in rows] == [0, 0, 0, 1]
    assert [r["failed_start"] for r in rows] == [1, 0, 0, 0]
    assert [r["failed_mid"] for r in rows] == [0, 0, 1, 0]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0


def test_stages_parse_and_reject_bad_input() -> None:
    assert parse_stages("15:200,0:50") == [(0.0, 50), (15.0, 200)]
    for bad in ("", "5:10", "0:-1", "x"):
        with pytest.raises(ValueError):
            parse_stages(bad)


def _row(arm: str, clients: int, multiple: float, per_s: float, start: int = 0, mid: int = 0) -> dict:
    fp = {str(n): 0 for n in range(1, 8)}
    fp["1"], fp["5"] = start, mid
    return {"arm": arm, "clients": clients, "multiple": multiple, "completed_per_s": per_s,
            "failed_by_page": fp, "abandoned": mid}


def test_targets_compare_the_largest_count_to_the_peak_and_check_where_sessions_failed() -> None:
    rows = [_row("none", 50, 1, 20.0), _row("none", 200, 4, 2.0, start=5, mid=300),
            _row("full", 50, 1, 19.0), _row("full", 100, 2, 20.0), _row("full", 200, 4, 18.5, start=40)]
    t = targets(rows)
    assert t["full"]["of_own_peak"] == pytest.approx(0.925)
    assert t["full"]["of_best_peak"] == pytest.approx(0.925)
    assert t["none"]["of_own_peak"] == pytest.approx(0.1)
    assert t["verdict"] == {"keeps_90pct_of_own_peak": True, "keeps_90pct_of_best_peak": True,
                            "failures_only_at_start": True}
    rows[-1] = _row("full", 200, 4, 17.0, start=40, mid=1)
    v = targets(rows)["verdict"]
    assert v == {"keeps_90pct_of_own_peak": False, "keeps_90pct_of_best_peak": False, "failures_only_at_start": False}


def test_plan_puts_the_telling_points_first_and_every_point_once() -> None:
    st = Settings(multiples=(1, 4, 2, 0.5, 3), var_multiples=(4, 1))
    steps = plan(st, with_overhead=True)
    assert steps[:6] == [("base", 1), ("base", 4), ("base", 2), ("timeout30", 4), ("think1", 4), ("overhead", 0.0)]
    assert sorted(steps[6:]) == sorted([("base", 0.5), ("base", 3), ("timeout30", 1), ("think1", 1)])
    assert ("overhead", 0.0) not in plan(st, with_overhead=False)
    only_base = Settings(conditions=("base",), multiples=(1, 4))
    assert plan(only_base, with_overhead=False) == [("base", 1), ("base", 4)]
