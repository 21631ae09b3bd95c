"""The copy-guard bench's scenarios (bench/copy_guard/scenario.py): proportions declared before
measuring, as schedules of the open-loop load."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.copy_guard.arms import ARMS
from bench.copy_guard.run import Bench, parse_args
from bench.copy_guard.scenario import CLIENT_TIMEOUT_S, CROWD, MODERATE, NORMAL, SCENARIOS, crowd_window, max_outstanding
from controllers.copy_guard.calibrate import locust_argv


def test_the_declared_proportions_come_from_the_paper_and_the_use_case():
    assert pytest.approx(100 / 22.4) == CROWD  # the paper's offered rate over its shop's best
    assert 0 < NORMAL == MODERATE < 1 < CROWD  # moderate: the normal demand without the crowd
    assert max_outstanding(22.4) == 100  # the paper's 100 Locust users at its shop's capacity
    assert max_outstanding(29.0) == 129
    # a healthy shop's longest queue under the crowd (outstanding / capacity) is well inside the timeout
    assert max_outstanding(29.0) / 29.0 < CLIENT_TIMEOUT_S / 2


def test_the_flash_crowd_covers_the_middle_third_of_the_copy():
    assert crowd_window(5.0, 15.0) == (10.0, 15.0)
    sched = SCENARIOS["flash"].schedule(30.0, 5.0, 15.0)
    assert sched == [(0.0, 15.0), (10.0, pytest.approx(30.0 * CROWD)), (15.0, 15.0)]
    with pytest.raises(ValueError):
        crowd_window(5.0, 0.0)


def test_overload_moderate_and_closed_schedules():
    assert SCENARIOS["overload"].schedule(20.0, 5.0, 15.0) == [(0.0, pytest.approx(20.0 * CROWD))]
    assert SCENARIOS["moderate"].schedule(20.0, 5.0, 15.0) == [(0.0, 10.0)]
    assert SCENARIOS["closed"].schedule(20.0, 5.0, 15.0) is None
    assert "open loop" in SCENARIOS["flash"].describe(20.0, 5.0, 15.0)


def test_every_scenario_arm_is_a_loaded_arm_and_arms_overrides_only_flash_and_closed():
    for sc in SCENARIOS.values():
        assert all(ARMS[a].load for a in sc.arms), sc.name
    b = Bench(parse_args(["--shop", "builtin", "--arms", "load-only,no-guard"]))
    assert b.arms_of("flash") == ["load-only", "no-guard"]
    assert b.arms_of("overload") == list(SCENARIOS["overload"].arms)
    assert b.arms_of("moderate") == ["throttle"]
    with pytest.raises(SystemExit):
        parse_args(["--scenarios", "flash,nonsense"])


def test_an_open_loop_load_is_one_user_with_the_schedule():
    argv = locust_argv("http://127.0.0.1:1/", 5.0, 8, 30, Path("/tmp/t.json"), schedule=[(0.0, 14.0), (10.0, 126.0)],
                       max_outstanding=64)
    assert argv[argv.index("-u") + 1] == "1" and argv[argv.index("--shop-rate") + 1] == "0.0"
    assert argv[argv.index("--shop-schedule") + 1] == "0:14,10:126"
    assert argv[argv.index("--max-outstanding") + 1] == "64"
    for bad in ([(1.0, 5.0)], [(0.0, -1.0)]):
        with pytest.raises(ValueError):
            locust_argv("http://127.0.0.1:1/", 0, 1, 30, Path("/tmp/t.json"), schedule=bad)
