"""The copy-guard bench's scenarios (bench/copy_guard/scenario.py): proportions declared before
measuring, as schedules of the open-loop load."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.copy_guard.arms import ARMS
from bench.copy_guard.run import Bench, parse_args
from bench.copy_guard.arms import route_for
from bench.copy_guard.scenario import (
    CLIENT_TIMEOUT_S,
    CROWD,
    MODERATE,
    NORMAL,
    SCENARIOS,
    crowd_window,
    drain_seconds,
    max_outstanding,
    oracle_hold,
)
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


def test_a_shorter_crowd_starts_a_third_into_the_copy_and_the_share_is_bounded():
    assert crowd_window(5.0, 60.0, 0.1) == (25.0, 31.0)
    sched = SCENARIOS["flash"].schedule(30.0, 5.0, 60.0, 0.1)
    assert sched is not None and [t for t, _ in sched] == [0.0, 25.0, 31.0]
    for bad in (0.0, 0.5):
        with pytest.raises(ValueError):
            crowd_window(5.0, 60.0, bad)
    assert parse_args(["--shop", "wordpress", "--crowd-share", "0.1"]).crowd_share == 0.1
    assert parse_args(["--shop", "wordpress"]).crowd_share == pytest.approx(1 / 3)


def test_the_oracle_holds_the_crowd_and_its_drain():
    # the backlog is capped at 4.46 s of capacity and drains with the half the normal demand leaves
    assert drain_seconds(22.4) == pytest.approx(100 / 11.2)
    assert drain_seconds(77.5) == pytest.approx(max_outstanding(77.5) / 38.75)
    start, end = oracle_hold(5.0, 8.1, 77.5)
    assert start == crowd_window(5.0, 8.1)[0]
    assert end == pytest.approx(crowd_window(5.0, 8.1)[1] + drain_seconds(77.5), abs=0.1)
    # an 8 s copy held through a third of itself and the drain: the bound the third bench met
    assert (end - start) / 8.1 > 1.0
    # a 60 s copy and a crowd of a tenth of it: under the paper's +40%
    start, end = oracle_hold(5.0, 60.0, 77.5, 0.1)
    assert (end - start) / 60.0 < 0.4
    oracle = ARMS["oracle"]
    assert oracle.load and oracle.copy and oracle.oracle and not oracle.guarded
    assert route_for(oracle, "/tmp/r") == []  # no controller acts: the bench stops the copy itself


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


def test_the_oracle_stops_and_continues_the_copy_process_group(tmp_path):
    import sys
    import time

    from bench.copy_guard.copies import _Copy

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def poll(cond, what: str) -> None:
        deadline = time.monotonic() + 20
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    class Sleeper(_Copy):
        def start(self) -> Sleeper:
            self._spawn([sys.executable, "-c", "import time\nfor _ in range(6000): time.sleep(0.01)"])
            return self

        def done_bytes(self) -> int | None:
            return None

    c = Sleeper(tmp_path / "s", tmp_path / "d", tmp_path, "shop", tmp_path / "log", None).start()
    try:
        assert c.proc is not None
        assert c.hold(True)
        poll(lambda: state(c.proc.pid) == "T", "the copy to stop")
        assert c.hold(False)
        poll(lambda: state(c.proc.pid) != "T", "the copy to continue")
    finally:
        c.kill()
    assert not c.hold(True)  # gone: nothing to hold
