"""Pooling rounds of the copy-guard bench (bench/copy_guard/pool.py): sum saved / sum lost over
the rounds an arm was counted in, the target judged on the pooled figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.copy_guard.pool import load, main, pool

TARGET = {"saved_share": 0.8, "slowdown": 0.4, "quiet_pauses": 0}


def _row(arm: str, lost: int | None, saved: int | None, slower: float | None, scenario: str = "flash") -> dict:
    share = None if lost is None or saved is None or lost <= 0 else saved / lost  # (as the bench: nothing lost, no share)
    return {"scenario": scenario, "arm": arm, "label": arm, "lost_responses": lost, "saved_responses": saved,
            "saved_share": share, "copy_slower": slower}


def _round(tmp: Path, name: str, rows: list[dict]) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"shop": "builtin", "when": name, "target": TARGET, "rows": rows}))
    return d


def test_rounds_pool_as_sum_saved_over_sum_lost_and_the_verdict_uses_the_pool(tmp_path, capsys):
    r1 = _round(tmp_path, "r1", [_row("no-guard", 30, 0, 0.0), _row("throttle-crowd", 30, 32, 0.05),
                                 _row("paper", 30, 20, 0.0)])
    r2 = _round(tmp_path, "r2", [_row("throttle-crowd", 40, 22, 0.07), _row("paper", 40, 30, 0.9),
                                 _row("oracle", 40, 40, 0.1), _row("throttle", None, None, None, "moderate")])
    sums, target = load([r1, r2], "flash")
    rows = {p.arm: p for p in pool(sums, "flash")}
    tc = rows["throttle-crowd"]
    assert tc.shares == pytest.approx([32 / 30, 22 / 40])
    assert (tc.saved, tc.lost) == (54, 70) and tc.share == pytest.approx(54 / 70)  # not the mean of shares (0.81)
    assert tc.mean_slower == pytest.approx(0.06)
    assert rows["oracle"].shares == [None, 1.0]  # ran in round 2 only
    assert "throttle" not in rows  # another scenario
    out_file = tmp_path / "pooled" / "new-dir" / "summary.md"  # --out into a directory not made yet
    assert main([str(r1), str(r2), "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert out_file.read_text() == out
    (tmp_path / "a-file").write_text("")
    assert main([str(r1), str(r2), "--out", str(tmp_path / "a-file" / "summary.md")]) == 2  # an error, no traceback
    assert "cannot write" in capsys.readouterr().err
    # 77% pooled: below 80% although round 1 read 107%; the paper's rule: 71% but +45% on average;
    # the oracle is a yardstick, never a guard that meets the target
    assert "NOT met by any arm" in out and "| throttle-crowd | 107% | 55% | 54 of 70 (**77%**) | 55% .. 107% | +6% |" in out
    # two rounds resampled: both round 1 (107%), both round 2 (55%) or one of each (77%)
    assert tc.interval() == pytest.approx((22 / 40, 64 / 60))
    assert "- throttle-crowd: not met (pooled 77%, under 80%)" in out
    assert "- paper: not met (the copy +45% on mean, over +40%)" in out


def test_an_uncounted_round_does_not_count_and_bad_input_is_a_clear_error(tmp_path):
    r1 = _round(tmp_path, "r1", [_row("throttle-crowd", 30, 27, 0.05)])
    r2 = _round(tmp_path, "r2", [_row("throttle-crowd", 40, None, None)])  # its copy outlived the window
    sums, _ = load([r1, r2], "flash")
    (tc,) = pool(sums, "flash")
    assert (tc.saved, tc.lost, tc.shares) == (27, 30, [0.9, None])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        load([tmp_path / "bad"], "flash")
    with pytest.raises(SystemExit, match="no 'overload' runs"):
        load([r1], "overload")
    other = _round(tmp_path, "r3", [_row("paper", 10, 5, 0.1)])
    data = json.loads((other / "summary.json").read_text())
    data["target"] = {"saved_share": 0.6, "slowdown": 0.4}
    (other / "summary.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="another target"):
        load([r1, other], "flash")


def test_a_summary_of_several_rounds_gives_each_round_its_column(tmp_path, capsys):
    """A run with --rounds N writes one summary holding N rounds: each is a round of its own
    (the table had one column for the file and N cells under it; 'pooled over 1 rounds')."""
    many = [{**_row("throttle", lost, saved, 0.1), "round": rnd} for rnd, lost, saved in ((1, 40, 36), (2, 40, 20))]
    r1 = _round(tmp_path, "r1", many + [{**_row("no-guard", 40, 0, 0.0), "round": 1}])
    r2 = _round(tmp_path, "r2", [_row("throttle", 20, 18, 0.2)])  # no round field: one round
    sums, _ = load([r1, r2], "flash")
    (th, _ng) = pool(sums, "flash")
    assert th.shares == pytest.approx([0.9, 0.5, 0.9]) and (th.saved, th.lost) == (74, 100)
    assert main([str(r1), str(r2)]) == 0
    out = capsys.readouterr().out
    assert f"rounds 1-2 = `{r1}`" in out and f"round 3 = `{r2}`" in out
    lo, hi = th.interval()
    assert lo <= th.share <= hi and (lo, hi) != (th.share, th.share)
    assert (f"| throttle | 90% | 50% | 90% | 74 of 100 (**74%**) | {lo:.0%} .. {hi:.0%} | +13% |" in out
            and "pooled over 3 rounds" in out)


def test_the_interval_needs_two_counted_rounds_and_is_the_same_each_time(tmp_path, capsys):
    one = _round(tmp_path, "one", [_row("throttle", 40, 36, 0.1)])
    sums, _ = load([one], "flash")
    (th,) = pool(sums, "flash")
    assert th.interval() is None
    assert main([str(one)]) == 0
    assert "| throttle | 90% | 36 of 40 (**90%**) | - | +10% |" in capsys.readouterr().out
    # rounds that agree: a narrow interval, far above the target: decided
    same = [_round(tmp_path, f"r{k}", [_row("throttle", 40, 36 + k % 2, 0.1)]) for k in range(6)]
    sums, _ = load(same, "flash")
    (th,) = pool(sums, "flash")
    assert th.interval() == th.interval() and 0.89 <= th.interval()[0] <= th.interval()[1] <= 0.93
    assert main([str(d) for d in same]) == 0
    assert "undecided" not in capsys.readouterr().out


def test_a_round_whose_copy_outlived_the_window_counts_in_the_delay_and_fails_the_target(tmp_path, capsys):
    """A round the copy outlived has no share; it said 'met' on the other round alone (87% at +38%)
    while that round's copy took +78%."""
    r = _round(tmp_path, "r", [{**_row("throttle", 98, 85, 0.38), "round": 1},
                               {**_row("throttle", 141, None, 0.78), "round": 2}])
    sums, _ = load([r], "flash")
    (th,) = pool(sums, "flash")
    assert (th.saved, th.lost, th.uncounted) == (85, 98, 1) and th.mean_slower == pytest.approx(0.58)
    assert main([str(r)]) == 0
    out = capsys.readouterr().out
    assert "NOT met by any arm" in out and "- throttle: not met (1 round(s) whose copy outlived the window)" in out


def test_a_run_of_several_rounds_is_judged_on_its_rounds_pooled():
    """The bench's own verdict listed each round that met the target: "met by throttle (round 2:
    saved 521%), throttle (round 4: saved 110%)" for a run whose 4 rounds pooled saved 71%."""
    from bench.copy_guard.run import verdict_lines

    rows = [{**_row("throttle", lost, saved, slower), "round": rnd, "held_seconds": 8.0}
            for rnd, lost, saved, slower in ((1, 55, 24, 0.05), (2, 19, 99, 0.14), (3, 241, 93, -0.04), (4, 19, 21, 0.04))]
    rows.append({**_row("no-guard", None, None, None), "round": 1})
    (line,) = verdict_lines(rows)
    assert line.startswith("flash: target (saved >= 80% with the copy at most +40%) NOT met by any arm: "
                           "throttle (4 rounds: saved 237 of 334 lost, 71%, approx. 90% interval over rounds ")
    assert line.endswith(", copy +5%; pooled 71%, under 80%)")
    (line,) = verdict_lines([r for r in rows if r["round"] == 2])  # one round: never "met"
    assert line == ("flash: target (saved >= 80% with the copy at most +40%) NOT met by any arm: undecided: throttle "
                    "(1 round: saved 99 of 19 lost, 521%, copy +14%; 1 counted round(s), 5 needed to decide)")
    # a guard whose only round outlived the window still gets its line (it had none)
    late = [{**_row("throttle", 40, None, 0.9), "round": 1, "copy_outlived_window": True}]
    (line,) = verdict_lines(late)
    assert "NOT met by any arm: throttle (1 round: saved 0 of 0 lost, copy +90%; 1 round(s) whose copy outlived" in line


def test_met_needs_enough_rounds_and_an_interval_above_the_target(tmp_path, capsys):
    """Two agreeing rounds made a "90% interval" of 85% .. 85%: a 2-round bootstrap is the rounds'
    range, far narrower than 90%; five or more rounds whose interval clears 80% meet the target."""
    two = [_round(tmp_path, f"two{k}", [_row("throttle", 40, 34, 0.1)]) for k in range(2)]
    sums, target = load(two, "flash")
    (th,) = pool(sums, "flash")
    assert th.judge(target) == ("undecided", "2 counted round(s), 5 needed to decide")
    assert main([str(d) for d in two]) == 0
    out = capsys.readouterr().out
    assert "NOT met by any arm" in out and "- throttle: undecided (2 counted round(s), 5 needed to decide)" in out
    five = [_round(tmp_path, f"five{k}", [_row("throttle", 40, 34 + k % 3, 0.1)]) for k in range(5)]
    sums, target = load(five, "flash")
    (th,) = pool(sums, "flash")
    verdict, why = th.judge(target)
    assert verdict == "met" and why.startswith("5 rounds, 90% interval 8")
    assert main([str(d) for d in five]) == 0
    assert "met by: throttle (87% at +10%; 5 rounds, 90% interval 86% .. 88%)" in capsys.readouterr().out
    spread = [_round(tmp_path, f"spread{k}", [_row("throttle", 40, s, 0.1)]) for k, s in enumerate((20, 40, 38, 36, 40))]
    sums, target = load(spread, "flash")
    (th,) = pool(sums, "flash")
    assert th.share > 0.8 and th.judge(target)[0] == "undecided" and "reaches down to" in th.judge(target)[1]


def test_a_round_in_which_the_copy_cost_nothing_is_not_a_copy_that_outlived_the_window(tmp_path, capsys):
    rows = [{**_row("throttle", 40, 36, 0.1), "round": 1},
            {**_row("throttle", -3, 2, 0.1), "round": 2, "copy_outlived_window": False},  # lost <= 0: no share
            {**_row("throttle", 0, 0, 0.1), "round": 3}]  # an older summary: no such field
    r = _round(tmp_path, "r", rows)
    sums, _ = load([r], "flash")
    (th,) = pool(sums, "flash")
    assert (th.uncounted, th.no_loss, th.saved, th.lost) == (0, 2, 36, 40)
    assert main([str(r)]) == 0
    out = capsys.readouterr().out
    assert "outlived" not in out and "- throttle: 2 round(s) in which the copy cost nothing (not pooled)" in out
