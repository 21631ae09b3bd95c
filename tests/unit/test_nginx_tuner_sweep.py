"""The sweep engine (controllers.nginx_tuner.sweep) with a fake nginx and a fake measurer."""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.cli import parse_candidates
from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.nginx_ctl import ApplyResult
from controllers.nginx_tuner.sweep import (
    Measurement,
    Sweep,
    SweepSettings,
    parse_stub_status,
    replay,
    stub_figures,
    summary_table,
    write_results,
)
from controllers.nginx_tuner.trial import LoadError

STUB = "Active connections: 291 \nserver accepts handled requests\n 16630948 16630948 31070465 \nReading: 6 Writing: 179 Waiting: 106 \n"


class FakeNginx:
    """Records applied values; values in ``broken`` fail like nginx -t would (rolled back)."""

    def __init__(self, current: int, broken: tuple[int, ...] = ()):
        self.value = current
        self.broken = broken
        self.applied: list[int] = []

    def apply(self, value: int) -> ApplyResult:
        assert isinstance(value, int)
        self.applied.append(value)
        if value in self.broken:
            return ApplyResult(False, str(value), "test", "nginx -t rejected it", rolled_back=True)
        self.value = value
        return ApplyResult(True, str(value), "done", f"keepalive_timeout -> {value}")


def tradeoff_measure(nginx: FakeNginx, noise: float = 0.0, errors_at: tuple[int, ...] = (), seed: int = 3):
    """Response time falls and memory rises with the timeout (saturating at 20 s)."""
    rng = random.Random(seed)

    async def measure(value: float) -> Measurement:
        assert nginx.value == value, "measured a value that is not applied"
        held = min(value, 20) / 20
        rt = 0.020 - 0.010 * held + rng.gauss(0, noise * 0.001)
        mem = 2_000_000 + 400_000 * held + rng.gauss(0, noise * 10_000)
        fails = 50 if value in errors_at else 0
        return Measurement(rt, rt * 3, mem, "uss", 1000, fails, idle_connections=200 * held, accepts_per_request=0.5 * (1 - held))

    return measure


async def test_full_sweep_interleaves_chooses_and_applies(tmp_path: Path) -> None:
    nginx = FakeNginx(65)
    reg = CollectorRegistry()
    metrics = TunerMetrics([2, 5, 10, 20, 65], registry=reg)
    lines: list[str] = []
    s = SweepSettings(candidates=(2.0, 5.0, 10.0, 20.0, 65.0), repeats=3, seed=1)
    res = await Sweep(s, nginx.apply, tradeoff_measure(nginx), 65.0, metrics=metrics, progress=lines.append).run()
    assert res.runs_used == res.runs_planned == 15 and len(res.records) == 15
    assert [r.value for r in res.records[:5]] != [r.value for r in res.records[5:10]]  # rounds differ in order
    assert {p.value: p.rt.n for p in res.points} == {2: 3, 5: 3, 10: 3, 20: 3, 65: 3}
    # no noise: 20 and 65 tie on both means; 65 (current) wins the tie on the front
    assert res.choice is not None and set(res.choice.front) == {2.0, 5.0, 10.0, 20.0, 65.0}
    assert nginx.applied[-1] == int(res.choice.value) and res.final_ok
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "ok"}) == 15
    assert reg.get_sample_value("promreflex_nginx_tuner_state", {"state": "idle"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_trial_memory_bytes", {"value": "20"}) == pytest.approx(2_400_000)
    assert any("[ 15/15]" in ln for ln in lines)
    paths = write_results(res, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["runs_used"] == 15 and data["choice"]["value"] == res.choice.value
    assert {p["value"]: p["idle_connections"] for p in data["points"]}[2.0] == pytest.approx(20)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 15 and rows[0]["result"] == "ok"
    assert paths["png"].stat().st_size > 10_000
    table = summary_table(res)
    assert "front:" in table and "decision:" in table and "<- chosen" in table


async def test_keeps_current_when_not_significantly_better() -> None:
    nginx = FakeNginx(65)
    # Heavy noise: every interval overlaps, so the rule's pick must not replace the current value.
    s = SweepSettings(candidates=(15.0, 20.0, 65.0), repeats=3, seed=2)

    async def flat(value: float) -> Measurement:
        rng = random.Random(int(value) * 7 + len(nginx.applied))
        return Measurement(0.01 + rng.uniform(0, 0.005), 0.03, 2e6 + rng.uniform(0, 2e5), "uss", 500, 0)

    res = await Sweep(s, nginx.apply, flat, 65.0, progress=lambda _: None).run()
    assert res.choice is not None and res.choice.kept_current and res.choice.value == 65.0
    assert "keeping 65" in res.choice.reason or "already" in res.choice.reason
    assert nginx.applied[-1] == 65 and res.final.startswith("kept 65")


async def test_changes_when_significantly_better() -> None:
    nginx = FakeNginx(65)
    s = SweepSettings(candidates=(2.0, 65.0), repeats=4, seed=2)

    async def measure(value: float) -> Measurement:
        # 2 s: much less memory, same response time -> significantly better on memory.
        rng = random.Random(len(nginx.applied))
        mem = (1e6 if value == 2 else 3e6) + rng.uniform(0, 1e4)
        return Measurement(0.010 + rng.uniform(0, 1e-4), 0.02, mem, "uss", 500, 0)

    res = await Sweep(s, nginx.apply, measure, 65.0, progress=lambda _: None).run()
    assert res.choice is not None and not res.choice.kept_current and res.choice.value == 2.0
    assert "significantly better than 65 on memory" in res.choice.reason
    assert nginx.value == 2


async def test_current_value_is_added_to_the_grid() -> None:
    nginx = FakeNginx(33)
    res = await Sweep(SweepSettings(candidates=(5.0, 10.0), repeats=1), nginx.apply, tradeoff_measure(nginx), 33.0,
                      progress=lambda _: None).run()
    assert 33.0 in res.settings.candidates and {r.value for r in res.records} == {5.0, 10.0, 33.0}


async def test_errors_during_a_trial_restore_the_last_good_value_and_drop_the_candidate() -> None:
    nginx = FakeNginx(65)
    reg = CollectorRegistry()
    s = SweepSettings(candidates=(5.0, 10.0, 65.0), repeats=2, seed=4)
    res = await Sweep(s, nginx.apply, tradeoff_measure(nginx, errors_at=(10,)), 65.0,
                      metrics=TunerMetrics([5, 10, 65], registry=reg), progress=lambda _: None).run()
    bad = [r for r in res.records if r.value == 10.0]
    assert len(bad) == 1 and bad[0].result == "errors" and "restored 65" in bad[0].message
    i = nginx.applied.index(10)
    assert nginx.applied[i + 1] == 65  # restored right after the bad trial
    assert 10.0 in res.dropped and 10.0 not in {p.value for p in res.points}
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "errors"}) == 1


async def test_failed_apply_and_failed_load_are_recorded_not_raised() -> None:
    nginx = FakeNginx(65, broken=(5,))
    inner = tradeoff_measure(nginx)

    async def measure(value: float) -> Measurement:
        if value == 10:
            raise LoadError("locust exited 1")
        return await inner(value)

    res = await Sweep(SweepSettings(candidates=(5.0, 10.0, 20.0, 65.0), repeats=2), nginx.apply, measure, 65.0,
                      progress=lambda _: None).run()
    results = {r.value: r.result for r in res.records}
    assert results[5.0] == "apply_failed" and results[10.0] == "load_failed"
    assert set(res.dropped) == {5.0, 10.0} and res.choice is not None and res.choice.value in (20.0, 65.0)


async def test_early_stopping_uses_fewer_runs_and_replay_matches() -> None:
    nginx = FakeNginx(65)
    s = SweepSettings(candidates=(2.0, 5.0, 10.0, 20.0, 65.0), repeats=6, seed=5, min_repeats=2, patience=2)
    full = await Sweep(s, nginx.apply, tradeoff_measure(nginx, noise=0.3), 65.0, progress=lambda _: None).run()
    nginx2 = FakeNginx(65)
    es = SweepSettings(**{**s.__dict__, "early_stop": True})
    early = await Sweep(es, nginx2.apply, tradeoff_measure(nginx2, noise=0.3), 65.0, progress=lambda _: None).run()
    assert early.runs_used < full.runs_used == 30
    assert early.stopped_after_round is not None
    assert early.choice is not None and full.choice is not None
    assert (early.choice.value, early.choice.kept_current) == (full.choice.value, full.choice.kept_current)
    # The same rule replayed over the full grid's records reaches the same decision with as many runs.
    sweep = Sweep(s, nginx.apply, tradeoff_measure(nginx), 65.0, progress=lambda _: None)
    choice, runs, _ = replay(full.records, sweep.plan, 65.0, sweep.settings)
    assert runs == early.runs_used and choice is not None and choice.value == early.choice.value


def test_settings_reject_bad_grids() -> None:
    for bad in ((5.0,), (5.0, 5.0), (0.0, 5.0), (2.5, 5.0)):
        with pytest.raises(ValueError):
            SweepSettings(candidates=bad)
    with pytest.raises(ValueError):
        SweepSettings(candidates=(5.0, 10.0), min_repeats=1)


def test_stub_status_parsing_and_figures() -> None:
    assert parse_stub_status(STUB) == {"active": 291, "accepts": 16630948, "handled": 16630948, "requests": 31070465,
                                       "reading": 6, "writing": 179, "waiting": 106}
    with pytest.raises(ValueError):
        parse_stub_status("<html>not it</html>")
    a = {"waiting": 100, "accepts": 1000, "requests": 5000}
    b = {"waiting": 120, "accepts": 1051, "requests": 5101}  # 1 read in between: 50 accepts / 100 requests
    idle, apr = stub_figures([a, b])
    assert idle == 110 and apr == pytest.approx(0.5)
    assert stub_figures([]) == (None, None)


def test_parse_candidates() -> None:
    assert parse_candidates("5..100:5") == tuple(float(v) for v in range(5, 101, 5))
    assert parse_candidates("2, 5,65") == (2.0, 5.0, 65.0)
    for bad in ("", "a,b", "10..5", "5..10:0", "1.5,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_candidates(bad)


def test_measurement_error_ratio() -> None:
    assert Measurement(0.01, 0.02, 1.0, "pss", 200, 3).error_ratio == 0.015
    assert Measurement(0.01, 0.02, 1.0, "pss", 0, 0).error_ratio == 0.0
    assert math.isfinite(Measurement(0.01, 0.02, 1.0, "pss", 1, 1).error_ratio)


async def test_failed_current_value_keeps_it_and_reports_failure() -> None:
    nginx = FakeNginx(65)
    inner = tradeoff_measure(nginx)

    async def measure(value: float) -> Measurement:
        if value == 65:
            raise LoadError("locust exited 1")
        return await inner(value)

    res = await Sweep(SweepSettings(candidates=(5.0, 10.0), repeats=2), nginx.apply, measure, 65.0, progress=lambda _: None).run()
    assert res.choice is None and not res.final_ok and "current value's own trial failed" in res.final
    assert nginx.value == 65


async def test_cancelled_sweep_restores_the_last_good_value() -> None:
    import asyncio

    nginx = FakeNginx(65)
    started = asyncio.Event()

    async def slow(value: float) -> Measurement:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    task = asyncio.create_task(Sweep(SweepSettings(candidates=(5.0, 10.0), repeats=1, seed=0), nginx.apply, slow, 65.0,
                                     progress=lambda _: None).run())
    await asyncio.wait_for(started.wait(), 5)
    assert nginx.applied == [5]  # seed 0 runs 5 first: a candidate is live when the cancel comes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert nginx.value == 65 and nginx.applied[-1] == 65


def test_cli_registers_both_subcommands_and_rejects_missing_load_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from controllers.nginx_tuner import cli
    from promreflex.cli import main as promreflex_main

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune-nginx", "--nginx.config", str(tmp_path / "nginx.conf"), "--candidates", "5,10",
                              "--load.duration", "2s", "--early-stop"])
    assert (args.candidates, args.duration, args.early_stop, args.mode, args.func) == ((5.0, 10.0), 2.0, True, "active", cli.cmd_tune)
    assert parser.parse_args(["exporter-nginx-memory", "--nginx.pid-file", "/run/nginx.pid"]).func is cli.cmd_exporter
    assert promreflex_main(["tune-nginx", "--nginx.config", str(tmp_path / "nginx.conf")]) == 2
    assert "--load.url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["tune-nginx", "--nginx.config", "x", "--candidates", "abc"])


async def test_no_decision_when_no_other_value_could_be_applied() -> None:
    """A stranger's review: with the config immutable (chattr +i) every candidate failed to
    apply, only the current value was measured, and the run ended "the current value 65 is
    already the rule's pick", exit 0: a tuning that measured nothing to compare."""
    nginx = FakeNginx(65, broken=(5, 10))
    s = SweepSettings(candidates=(5.0, 10.0), repeats=2, seed=1)
    res = await Sweep(s, nginx.apply, tradeoff_measure(nginx), 65.0, progress=lambda _: None).run()
    assert res.choice is None and not res.final_ok, res.final
    assert res.final.startswith("no value but the current one could be measured, no decision"), res.final
    # one value measured beside the current one is a sweep: it decides
    nginx = FakeNginx(65, broken=(5,))
    res = await Sweep(s, nginx.apply, tradeoff_measure(nginx), 65.0, progress=lambda _: None).run()
    assert res.choice is not None and res.final_ok, res.final
