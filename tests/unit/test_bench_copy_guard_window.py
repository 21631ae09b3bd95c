"""The copy-guard benchmark's counting window (bench/copy_guard): every loaded run of a round is
counted over the same window, and a guard that pushes its copy past the window scores nothing."""

from __future__ import annotations

import pytest

from bench.copy_guard import analysis
from bench.copy_guard.analysis import RunResult
from bench.copy_guard.run import Bench, parse_args
from bench.copy_guard.scenario import SCENARIOS

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
    r = RunResult(name, 0, True, copy_end_s is not None, "none" if name in ("load-only", "no-guard") else name)
    r.load_start, r.load_end = 1000.0, 1000.0 + load_s
    r.copy_end = None if copy_end_s is None else 1000.0 + copy_end_s
    return r


def test_common_window_is_the_shortest_load_and_flags_copies_that_outlive_it() -> None:
    w = analysis.common_window([run("load-only", 150), run("no-guard", 149.5, 40), run("min-pause-20s", 150, 120)])
    assert w.seconds == pytest.approx(149.5)
    assert w.contains_every_copy and w.latest_copy_end_s == pytest.approx(120)
    late = analysis.common_window([run("load-only", 75), run("no-guard", 75, 40), run("min-pause-20s", 75, 110)])
    assert not late.contains_every_copy and late.late == ["min-pause-20s"]
    killed = run("min-pause-20s", 75, None)  # a copy that never ended (killed) is never contained
    killed.copy = True
    assert not analysis.common_window([run("load-only", 75), killed]).contains_every_copy


def counted(load_only_s: float, guard_copy_end_s: float,
            guard: dict[int, list[int]]) -> tuple[Bench, RunResult, RunResult, RunResult]:
    """A round at 10 req/s, 5 while a copy runs: load-only for ``load_only_s``, the unguarded copy
    10-40 s into a 75 s load, the guarded run (75 s of load) with the timeline ``guard``; counted."""
    lo, cp, g = run("load-only", load_only_s), run("no-guard", 75, 40), run("min-pause-20s", 75, guard_copy_end_s)
    b = Bench(parse_args(["--warmup", "0"]))
    b.threshold = 8.0
    b.results = [lo, cp, g]
    b.timelines = {("closed", 0, "load-only"): (bins((1000, 1000 + load_only_s, 10)), BIN),
                   ("closed", 0, "no-guard"): (bins((1000, 1010, 10), (1010, 1040, 5), (1040, 1075, 10)), BIN),
                   ("closed", 0, "min-pause-20s"): (guard, BIN)}
    b.count_in_windows()
    return b, lo, cp, g


def test_a_guard_that_holds_its_copy_past_the_window_scores_nothing() -> None:
    # The guard holds its copy paused through the whole 75 s load: over the load it served as
    # much as load-only (the old count said 100 % saved), but its copy ends at 110 s, after the window.
    b, _, cp, g = counted(75, 110, bins((1000, 1075, 10)))
    assert b.windows[("closed", 0)].late == ["min-pause-20s"]
    assert g.saved_share is None and "ended after the 75s window" in g.note
    assert g.served_window == 750 and cp.served_window == 600
    assert g.saved_responses == 150  # shown, but not as a share


def test_the_share_is_counted_over_the_common_window() -> None:
    # the guarded copy ends at 60 s, inside the 75 s window, after slowing the site for 40 s (the
    # unguarded one: 30 s): this guard lost more than it saved. load-only ran longer (80 s) but
    # only the common 75 s count.
    b, lo, cp, g = counted(80, 60, bins((1000, 1020, 10), (1020, 1060, 5), (1060, 1075, 10)))
    assert b.windows[("closed", 0)].seconds == pytest.approx(75) and b.windows[("closed", 0)].contains_every_copy
    assert lo.served_window == 750 and cp.served_window == 600 and g.served_window == 550
    assert g.lost_responses == 150 and g.saved_responses == -50
    assert g.saved_share == pytest.approx(-1 / 3)


def test_every_guarded_arm_is_the_shipped_route_with_its_own_params() -> None:
    from bench.copy_guard.arms import ARMS, CROWD_MATCHER, OVERLOAD_MATCHER, route_for, shipped_route

    shipped = shipped_route()
    assert route_for(ARMS["no-guard"], "/r") == [] and route_for(ARMS["load-only"], "/r") == []
    for name, arm in ARMS.items():
        if not arm.guarded:
            continue
        (route,) = route_for(arm, "/r")
        # the shipped arms run the shipped matchers; the others the overload alerts, plus the
        # crowd alert for the crowd arms, whatever the shipped route matches today
        want = shipped["matchers"] if arm.shipped else [CROWD_MATCHER if arm.crowd else OVERLOAD_MATCHER]
        assert route["matchers"] == want and route["action"] == "copy-guard", name
        assert route["params"]["registry_dir"] == "/r"
    assert OVERLOAD_MATCHER[:-1] + '|CopyGuardSiteCrowded"' == CROWD_MATCHER
    # shipped since the fifth bench: the crowd alert routed, crowd: pause (= the throttle-crowd arm)
    assert shipped["matchers"] == [CROWD_MATCHER] and shipped["params"]["crowd"] == "pause"
    assert route_for(ARMS["throttle-overload"], "/r")[0]["matchers"] == [OVERLOAD_MATCHER]
    assert "crowd" not in route_for(ARMS["throttle-overload"], "/r")[0]["params"]
    assert route_for(ARMS["throttle-crowd"], "/r")[0]["params"]["crowd"] == "pause"
    assert route_for(ARMS["paper-crowd"], "/r")[0]["params"]["mode"] == "pause"
    assert route_for(ARMS["paper"], "/r")[0]["params"]["mode"] == "pause"
    assert route_for(ARMS["paper"], "/r")[0]["params"]["min_pause"] == "0s"
    assert route_for(ARMS["min-pause-20s"], "/r")[0]["params"]["min_pause"] == "20s"
    # the shipped-defaults throttle and the quiet arm run the route exactly as shipped
    quiet = route_for(ARMS["quiet"], "/r")[0]["params"]
    assert quiet == {**shipped["params"], "registry_dir": "/r"}


def test_rounds_alternate_direction_and_the_quiet_arm_runs_once_at_the_end() -> None:
    from bench.copy_guard.arms import plan

    assert plan(["a", "b", "c"], 2) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (0, "quiet")]
    assert plan(["a", "b"], 1, reverse_first=True, quiet=False) == [(0, "b"), (0, "a")]


def test_guard_metrics_are_read_for_the_site_only_and_summed_over_other_labels() -> None:
    from bench.copy_guard.copies import parse_guard_metrics

    text = "\n".join([
        "# HELP promreflex_copy_guard_share x",
        'promreflex_copy_guard_share{site="shop"} 0.25',
        'promreflex_copy_guard_share{site="other"} 0.0',
        'promreflex_copy_guard_emergency_pauses_total{reason="severe",site="shop"} 2.0',
        'promreflex_copy_guard_emergency_pauses_total{reason="floor",site="shop"} 1.0',
        'promreflex_copy_guard_pauses_created{site="shop"} 1.7e9',
    ])
    got = parse_guard_metrics(text, "shop")
    assert got["promreflex_copy_guard_share"] == 0.25
    assert got["promreflex_copy_guard_emergency_pauses_total"] == 3.0


def test_the_slowdown_is_against_the_unguarded_copy_of_the_same_round() -> None:
    b, lo, cp, g = counted(80, 60, bins((1000, 1020, 10), (1020, 1060, 5), (1060, 1075, 10)))
    cp.copy_seconds, g.copy_seconds = 30.0, 42.0
    b.count_in_windows()
    assert g.copy_slower == pytest.approx(0.4)
    assert cp.copy_slower is None and lo.copy_slower is None


def test_the_pareto_front_keeps_only_points_nothing_beats() -> None:
    from bench.copy_guard.plot import _front

    assert _front([(10, 50), (5, 60), (20, 90), (30, 80)]) == [(5, 60), (20, 90)]


def test_an_arm_whose_copy_outlived_the_window_does_not_void_the_others() -> None:
    lo, cp = run("load-only", 75), run("no-guard", 75, 40)
    late, fine = run("min-pause-20s", 75, 110), run("throttle", 75, 50)
    b = Bench(parse_args(["--warmup", "0"]))
    b.threshold = 8.0
    b.results = [lo, cp, late, fine]
    b.timelines = {("closed", 0, "load-only"): (bins((1000, 1075, 10)), BIN),
                   ("closed", 0, "no-guard"): (bins((1000, 1010, 10), (1010, 1040, 5), (1040, 1075, 10)), BIN),
                   ("closed", 0, "min-pause-20s"): (bins((1000, 1075, 10)), BIN),
                   ("closed", 0, "throttle"): (bins((1000, 1010, 10), (1010, 1030, 5), (1030, 1075, 10)), BIN)}
    b.count_in_windows()
    assert late.saved_share is None
    assert fine.saved_share == pytest.approx((650 - 600) / 150)


def test_the_deadline_is_a_time_of_day_in_utc_or_unix_seconds() -> None:
    from bench.copy_guard.run import parse_deadline

    now = 1_795_000_000.0 - 1_795_000_000.0 % 86400 + 11 * 3600  # 11:00 UTC
    assert parse_deadline("12:10", now) == now + 70 * 60
    assert parse_deadline("10:30", now) == now - 30 * 60  # earlier today: already past (nothing fits)
    assert parse_deadline("1795000000") == 1_795_000_000.0
    with pytest.raises(Exception, match="time of day"):
        parse_deadline("25:00", now)


def test_the_deadline_skips_whole_scenarios_and_keeps_the_quiet_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    b = Bench(parse_args(["--shop", "builtin", "--load-seconds", "60", "--quiet-seconds", "30"]))
    runs = [("flash", 0, "load-only"), ("flash", 0, "no-guard"), ("moderate", 0, "throttle"),
            ("overload", 0, "load-only"), ("overload", 0, "no-guard"), ("quiet", 0, "quiet")]
    assert b.fit_deadline(runs) == runs  # no deadline: everything
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    # 75 s per loaded run, 45 s for the quiet one: 271 s hold flash (150 s), moderate (75 s) and quiet
    b.a.deadline = 1000.0 + 271
    assert b.fit_deadline(runs) == runs[:3] + runs[5:]
    assert b.skipped and b.skipped[0].startswith("scenario overload")
    b.skipped.clear()
    b.a.deadline = 1000.0 + 100  # not even the first scenario: only the quiet arm
    assert b.fit_deadline(runs) == [("quiet", 0, "quiet")]
    assert [s.split()[1] for s in b.skipped] == ["flash", "moderate", "overload"]


def test_a_copy_left_by_an_interrupted_bench_is_removed_before_the_next_run(tmp_path) -> None:
    """2026-11-26: an interrupted run's copy finished after the clean-up; the next unguarded copy
    found the finished destination and "ended" in 2 s, voiding its round."""
    from bench.copy_guard.copies import remove_destination

    dst = tmp_path / "source.bin"
    left = [dst, tmp_path / ".source.bin.promreflex-copy.json", tmp_path / ".source.bin.promreflex-part"]
    for p in left:
        p.write_bytes(b"x")
    (tmp_path / "other").write_bytes(b"y")
    remove_destination(dst)
    assert not any(p.exists() for p in left) and (tmp_path / "other").exists()


def test_a_measured_solo_copy_times_the_crowd_and_the_command_asks_to_measure_it_again() -> None:
    b = Bench(parse_args(["--shop", "wordpress", "--copy-solo-seconds", "0"]))
    assert b.a.copy_solo_seconds == 0 and b.solo_measured is None
    assert "--copy-solo-seconds 0" in b.command()
    # what measure_copy_solo leaves behind: the measured length times the crowd ...
    b.a.copy_solo_seconds = b.solo_measured = 11.3
    assert SCENARIOS["flash"].schedule(50.0, b.a.copy_delay, b.a.copy_solo_seconds)[1][0] == pytest.approx(5 + 11.3 / 3, abs=0.1)
    # ... and the command still measures it (a rerun times its crowd on its own copy)
    assert "--copy-solo-seconds 0.0" in b.command() and "11.3" not in b.command()


def test_the_moderate_scenario_can_measure_other_arms() -> None:
    assert Bench(parse_args(["--shop", "builtin"])).arms_of("moderate") == ["throttle"]
    b = Bench(parse_args(["--shop", "builtin", "--moderate-arms", "throttle,throttle-crowd", "--arms", "paper"]))
    assert b.arms_of("moderate") == ["throttle", "throttle-crowd"] and b.arms_of("flash") == ["paper"]
    with pytest.raises(SystemExit):
        parse_args(["--shop", "builtin", "--moderate-arms", "nonsense"])
