"""Trial plan interleaving and Locust result folding (controllers.nginx_tuner.trial), no load run."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from controllers.nginx_tuner.trial import LoadError, locust_argv, percentile_ms, summarise, trial_plan, williams_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nginx"
GRID = list(range(5, 105, 5))  # the paper's 20 values


@pytest.mark.parametrize("n", [4, 5])
def test_rounds_are_permutations_and_positions_form_a_latin_square(n: int) -> None:
    values = GRID[:n]
    plan = trial_plan(values, repeats=n, seed=7)
    assert len(plan) == n * n and [t.index for t in plan] == list(range(n * n))
    for r in range(n):
        assert sorted(t.value for t in plan if t.round == r) == values
    for pos in range(n):
        assert sorted(t.value for t in plan if t.position == pos) == values  # each value once per position


def test_williams_design_balances_first_order_carryover() -> None:
    for n in (4, 5, 6):
        pairs = Counter((row[i], row[i + 1]) for row in williams_rows(n) for i in range(n - 1))
        expected = 1 if n % 2 == 0 else 2  # odd n uses mirrored rows: every ordered pair twice
        assert set(pairs.values()) == {expected} and len(pairs) == n * (n - 1)


def test_plan_is_reproducible_and_seed_dependent() -> None:
    a = [t.value for t in trial_plan(GRID, 3, seed=1)]
    assert a == [t.value for t in trial_plan(GRID, 3, seed=1)]
    assert a != [t.value for t in trial_plan(GRID, 3, seed=2)]
    assert a[:20] != a[20:40]  # consecutive rounds run in different orders
    assert Counter(a) == Counter({v: 3 for v in GRID})


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        trial_plan([5, 5, 10], 2)
    with pytest.raises(ValueError):
        trial_plan([5, 10], 0)


def test_summarise_real_locust_json() -> None:
    stats = json.loads((FIXTURES / "locust_stats.json").read_text())
    res = summarise(stats)
    assert (res.requests, res.failures) == (80, 0)
    assert res.mean_ms == pytest.approx(187.4707 / 80, rel=1e-6)
    assert res.p95_ms == 7.0  # 76 of 80 requests at or below 7 ms


def test_summarise_folds_entries_and_counts_failures() -> None:
    stats = [
        {"num_requests": 10, "num_failures": 2, "total_response_time": 100.0, "response_times": {"10": 10}},
        {"num_requests": 10, "num_failures": 0, "total_response_time": 300.0, "response_times": {"30": 10}},
    ]
    res = summarise(stats)
    assert (res.requests, res.failures, res.mean_ms, res.p95_ms) == (20, 2, 20.0, 30.0)
    with pytest.raises(LoadError, match="no requests"):
        summarise([])


def test_percentile_of_histogram() -> None:
    hist = {float(ms): 1 for ms in range(1, 101)}
    assert percentile_ms(hist, 0.95) == 95.0
    assert percentile_ms(hist, 0.5) == 50.0


def test_locust_argv_is_bounded_and_uses_json() -> None:
    argv = locust_argv("http://127.0.0.1:8080/shop/", 200, 20, 2.5, 1, 4)
    assert argv[:3] == [sys.executable, "-m", "locust"]
    for flag, value in (("--host", "http://127.0.0.1:8080"), ("--target-path", "/shop/"), ("-t", "3s"), ("-u", "200")):
        assert argv[argv.index(flag) + 1] == value
    assert "--json" in argv and "--headless" in argv and "--csv" not in argv
    with pytest.raises(ValueError):
        locust_argv("ftp://x/", 1, 1, 1, 1, 1)
