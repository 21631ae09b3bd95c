"""A whole small sweep on a real nginx, with injected failures, while a client counts failed requests.

Reuses the ``live`` nginx fixture of test_nginx_tuner_nginx.py (2 workers, keepalive_timeout 65).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.nginx_ctl import NginxControl, NginxError
from controllers.nginx_tuner.procfs import children
from controllers.nginx_tuner.sweep import LoadMeasurer, Measurement, Sweep, SweepSettings, write_results
from promreflex.proc import free_port, http_ok, pid_alive, wait_until
from tests.integration.test_nginx_tuner_nginx import NGINX, BackgroundGets, Live, live, port_conflict  # noqa: F401 - live: the fixture

pytestmark = pytest.mark.integration


async def test_small_sweep_with_injected_failures_never_fails_a_request(live: Live, tmp_path: Path) -> None:  # noqa: F811
    reg = CollectorRegistry()
    ctl = live.control()
    ctl.metrics = TunerMetrics([1, 2, 3, 65], registry=reg)
    original = live.conf.read_text()

    def apply(value: int):  # noqa: ANN202
        if value != 2:
            return ctl.apply(value)
        with port_conflict(live):  # injected: nginx -t passes, the reload fails
            return ctl.apply(value)

    # 2 s measured after the ramp: with 1 s a CI run on a busy machine once had a trial whose Locust
    # (its start-up counts in its run time) failed to load ("load_failed").
    real = LoadMeasurer(ctl, live.url, users=10, spawn_rate=20, duration_s=2.0, think_min=0.1, think_max=0.3, sample_interval=0.2)

    async def measure(value: float) -> Measurement:
        if value == 3:  # injected: errors rising during this trial (no need to load nginx for that)
            return Measurement(0.001, 0.002, 1e6, "pss", 100, 40)
        return await real(value)

    with BackgroundGets(live.url) as gets:
        settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
        result = await Sweep(settings, apply, measure, 65.0, metrics=ctl.metrics, progress=lambda _: None).run()
        gets.more()

    by_value = {r.value: r for r in result.records}
    assert set(by_value) == {1.0, 2.0, 3.0, 65.0}
    assert by_value[2.0].result == "apply_failed" and by_value[2.0].message.startswith("reload:")
    assert by_value[3.0].result == "errors" and "restored 65" in by_value[3.0].message
    assert by_value[1.0].result == by_value[65.0].result == "ok", (by_value[1.0].message, by_value[65.0].message)
    assert by_value[1.0].requests > 0 and by_value[1.0].failures == 0 and by_value[1.0].mean_s > 0 and by_value[1.0].p95_s > 0
    assert by_value[1.0].memory_bytes > 0 and by_value[1.0].memory_method == "pss"
    # One repeat: unbounded intervals, so the current value is kept, and the file is as it was.
    assert result.choice is not None and result.choice.kept_current and result.final_ok
    assert live.conf.read_text() == original and ctl.current_value() == ("65",)
    assert gets.counts["failed"] == 0 and gets.counts["ok"] > 20, gets.counts
    assert http_ok(live.url)
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "ok"}) == 2
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "apply_failed"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "errors"}) == 1
    assert reg.get_sample_value("promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 65
    paths = write_results(result, tmp_path)
    assert paths["csv"].read_text().count("\n") == 5


async def test_a_sweep_that_fails_any_way_puts_the_pre_sweep_file_back(live: Live) -> None:  # noqa: F811
    """Whatever ends a sweep early (here a measurement raising what no one caught: Prometheus
    unreachable, a disk error), the file goes back as it was before the first trial, not as
    the previous trial left it, and nginx serves it (issue: the trial value stayed live, and
    the retry took it for the original)."""
    ctl = live.control()
    original = live.conf.read_text()
    calls: list[float] = []

    async def measure(value: float) -> Measurement:
        calls.append(value)
        if len(calls) == 2:
            raise ConnectionRefusedError("Prometheus is not answering")
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
    with pytest.raises(ConnectionRefusedError):
        await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert len(calls) == 2
    assert live.conf.read_text() == original and not ctl.journal_path.exists()
    assert http_ok(live.url)


async def test_a_sweep_killed_mid_way_is_undone_before_the_next_reads_the_current_value(live: Live) -> None:  # noqa: F811
    """SIGKILL between two trials leaves a trial value live and the journal on disk: the next
    start (``recover``) puts the pre-sweep text back, `1m`-style spelling included, and makes
    it live; the current value read after that is the original, not the trial's."""
    ctl = live.control()
    live.conf.write_text(live.conf.read_text().replace("keepalive_timeout 65;", "keepalive_timeout 1m5s;"))
    assert ctl.reload().ok  # (the same value respelled; a file nginx has not loaded is a pending deployment: refused)
    original = live.conf.read_text()
    ctl.begin_sweep()
    assert ctl.apply(7).ok and ctl.current_value() == ("7",)  # a trial, then the controller dies
    ctl._sweep_unlock()  # (its sweep lock goes with the process)
    again = NginxControl(live.conf, live.prefix, NGINX, reload_timeout=20.0, health_url=live.url)  # restarted
    said = again.recover()
    assert "put back" in said and said.endswith("and live") and ".at-recovery" in said, said
    assert live.conf.read_text() == original and again.current_value() == ("1m5s",)
    assert not again.journal_path.exists() and again.recover() == ""
    assert http_ok(live.url)


async def test_a_health_blip_after_a_trial_ends_on_the_pre_sweep_file(live: Live) -> None:  # noqa: F811
    """The health check fails for a while after the second trial: its rollback could only
    return to the FIRST trial's file (the per-edit backup); the sweep stops and puts back the
    file from before the sweep once nginx is healthy again."""
    healthy = {"on": True, "blip": False}
    ctl = live.control(health_check=lambda: healthy["on"])
    ctl.health_timeout = 0.5
    original = live.conf.read_text()
    applied: list[int] = []

    real_reload = ctl.reload

    def reload(timeout: float | None = None):  # noqa: ANN202
        out = real_reload(timeout)
        if healthy["blip"]:
            healthy["on"] = False  # down from this trial's reload through its rollback
        return out

    ctl.reload = reload  # type: ignore[method-assign]

    def apply(value: int):  # noqa: ANN202
        applied.append(value)
        healthy["blip"] = len(applied) == 2
        try:
            return ctl.apply(value)
        finally:
            healthy["on"], healthy["blip"] = True, False

    async def measure(value: float) -> Measurement:
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0, 3.0), repeats=1, seed=3)
    result = await Sweep(settings, apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert not result.final_ok and "did not return to health" in result.final, result.final
    assert "restored" in result.final and live.conf.read_text() == original
    assert ctl.current_value() == ("65",) and not ctl.journal_path.exists()


async def test_a_kept_value_is_not_a_good_end_when_nginx_stopped_during_the_sweep(live: Live) -> None:  # noqa: F811
    """The sweep keeps the current value (every trial measured alike) but nginx was stopped
    before its end: the pre-sweep file is back on disk, and the sweep must not report that it
    ended well (it said 'kept 65: restored: ...; nginx is not running' with final_ok True)."""
    ctl = live.control()
    original = live.conf.read_text()
    calls: list[float] = []

    async def measure(value: float) -> Measurement:
        calls.append(value)
        if len(calls) == 3:  # the last trial: nginx is stopped (an operator, a crash)
            live.child.stop()
            wait_until(lambda: not http_ok(live.url), timeout=20, what="nginx to stop")
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(1.0, 2.0), repeats=1, seed=3)
    result = await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert len(calls) == 3 and result.choice is not None and result.choice.kept_current
    assert not result.final_ok and result.final.endswith("nginx is not running"), result.final
    assert live.conf.read_text() == original and not ctl.journal_path.exists()


def _control(live: Live, **kw: str) -> NginxControl:  # noqa: F811
    """A control of the live nginx without metrics (several in one test: a restarted controller)."""
    kw.setdefault("health_url", live.url)
    return NginxControl(live.conf, live.prefix, NGINX, reload_timeout=20.0, health_timeout=5.0, **kw)  # type: ignore[arg-type]


def _staged(live: Live) -> tuple[Path, str]:  # noqa: F811
    """Another team's change, written to disk and not reloaded (waiting for its window): a
    server on a port of its own, so whether nginx runs it shows from outside."""
    import time

    from controllers.nginx_tuner.nginx_ctl import PENDING_SLACK_S

    loaded = _control(live).loaded_at()  # (a change within the slack after nginx read its files counts as read)
    wait_until(lambda: time.time() > loaded + PENDING_SLACK_S + 0.05, timeout=10, what="the slack to pass")
    port = free_port()
    staged = live.prefix / "conf.d" / "staged.conf"
    staged.write_text(f"server {{ listen 127.0.0.1:{port}; return 200 staged; }}\n")
    return staged, f"http://127.0.0.1:{port}/"


async def test_a_pending_deployment_is_never_made_live_by_a_trial(live: Live) -> None:  # noqa: F811
    """A stranger's review: every reload of a sweep made live whatever else waited on disk (an
    edit not reloaded yet), "kept 75" and all. Now a file changed after nginx last read its
    configuration stops the apply and the sweep before anything is written; once the operator
    reloads, tuning goes on."""
    ctl = _control(live)
    original = live.conf.read_text()
    staged, staged_url = _staged(live)
    workers = ctl.workers()
    res = ctl.apply(30)
    assert (res.ok, res.stage) == (False, "precheck") and str(staged) in res.message and "reload" in res.message, res
    settings = SweepSettings(candidates=(30.0, 40.0), repeats=1, seed=3)

    async def measure(value: float) -> Measurement:
        raise AssertionError("nothing may be measured")

    with pytest.raises(NginxError, match="not starting the sweep, nothing changed: .*staged.conf"):
        await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert live.conf.read_text() == original and not ctl.journal_path.exists()
    assert ctl.workers() == workers and not http_ok(staged_url)  # no reload: the staged server is not live
    assert ctl.reload().ok and http_ok(staged_url)  # the operator deploys it
    assert ctl.apply(30).ok and ctl.current_value() == ("30",)


async def test_a_sweep_that_cannot_start_writes_no_journal_and_reloads_nothing(live: Live) -> None:  # noqa: F811
    """A stranger's review: with the health URL already failing (a typo in --load.url), the
    sweep planned its trials, wrote its journal, reloaded nginx, said "could NOT restore the
    pre-sweep config" and left a journal that stopped every later run."""
    ctl = _control(live, health_url=f"http://127.0.0.1:{free_port()}/")
    ctl.health_timeout = 0.5
    workers = ctl.workers()
    lines: list[str] = []

    async def measure(value: float) -> Measurement:
        raise AssertionError("nothing may be measured")

    settings = SweepSettings(candidates=(1.0, 2.0), repeats=1, seed=3)
    with pytest.raises(NginxError, match="not starting the sweep, nothing changed: the health check already fails"):
        await Sweep(settings, ctl.apply, measure, 65.0, progress=lines.append, journal=ctl).run()
    assert not ctl.journal_path.exists() and ctl.workers() == workers and lines == []
    assert _control(live).recover() == ""  # the next run starts clean


async def test_recovery_leaves_a_newer_deployment_as_it_is(live: Live) -> None:  # noqa: F811
    """A stranger's review: a journal left behind, then the operator deploys a new nginx.conf;
    the next start put the pre-sweep text back over it and reloaded (the deployment reverted
    live), and its own restore overwrote the one copy it had kept. A file that differs from
    the pre-sweep one by more than the tuned line is someone's deployment: left as it is."""
    ctl = _control(live)
    original = live.conf.read_text()
    ctl.begin_sweep()
    assert ctl.apply(7).ok  # a trial, then the controller dies
    ctl._sweep_unlock()  # (its sweep lock goes with the process)
    deployed = live.conf.read_text().replace("server_name tuner.test;", 'server_name tuner.test;\n        add_header X-Deployed "v2" always;')
    live.conf.write_text(deployed)
    assert ctl.reload().ok  # the operator's deployment, live
    again = NginxControl(live.conf, live.prefix, NGINX, reload_timeout=20.0, health_url=live.url)  # restarted
    workers = again.workers()
    said = again.recover()
    assert "left as it is, not reloaded" in said, said
    assert live.conf.read_text() == deployed and again.workers() == workers and not again.journal_path.exists()
    kept = list(again.backup_dir.glob("*.pre-sweep-*"))
    assert len(kept) == 1 and kept[0].read_text() == original and str(kept[0]) in said
    assert again.recover() == ""


async def test_two_recoveries_keep_two_copies(live: Live) -> None:  # noqa: F811
    """What a recovery keeps aside gets a name of its own: a second one never overwrites it."""
    for value in (7, 9):
        ctl = _control(live)
        ctl.begin_sweep()
        assert ctl.apply(value).ok
        ctl._sweep_unlock()  # the controller dies: its sweep lock goes with the process
        assert "put back" in _control(live).recover()
    kept = sorted(p.read_text() for p in _control(live).backup_dir.glob("*.at-recovery-*"))
    assert len(kept) == 2 and any("keepalive_timeout 7;" in k for k in kept) and any("keepalive_timeout 9;" in k for k in kept)


def test_a_killed_tuner_leaves_no_load_running(live: Live, tmp_path: Path) -> None:  # noqa: F811
    """A stranger's review: SIGKILL of tune-nginx (or the controller) left its Locust child
    loading the site for the rest of its run. The child now dies with the thread that waits for
    it (as in a sweep: run_load in a worker thread)."""
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from controllers.nginx_tuner.trial import run_load
        async def main():
            await asyncio.to_thread(run_load, {live.url!r}, 2, 10, 60, 0.5, 1.0)
        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=Path(__file__).resolve().parents[2])
    try:
        wait_until(lambda: bool(children(proc.pid)), timeout=30, what="the load generator to start")
        load = children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: not any(pid_alive(p) for p in load), timeout=20, what="the load generator to end with its parent")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_mid_sweep_puts_the_pre_sweep_file_back_live(live: Live, tmp_path: Path) -> None:  # noqa: F811
    """A stranger's review: SIGTERM (systemctl stop, timeout, kill) ended tune-nginx at once, the
    trial's value left in the file and in the running nginx; only Ctrl-C restored."""
    original = live.conf.read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "promreflex", "tune-nginx", "--nginx.config", str(live.conf), "--nginx.prefix", str(live.prefix),
         "--mode", "active", "--load.url", live.url, "--candidates", "3,4", "--repeats", "1", "--load.users", "2",
         "--load.duration", "60s", "--results.dir", str(tmp_path / "results")],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ctl = _control(live)
        wait_until(lambda: live.conf.read_text() != original and bool(children(proc.pid)), timeout=60,
                   what="a trial's value written and its load running")
        load = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert live.conf.read_text() == original and not ctl.journal_path.exists(), out
    assert "restored" in out and ctl.effective_seconds() == 65.0
    assert not ctl.pending_files()  # and live: reloaded after it was put back
    wait_until(lambda: not any(pid_alive(p) for p in load), timeout=20, what="the load to end")


def test_a_site_enabled_or_disabled_by_a_link_is_a_pending_change(live: Live, tmp_path: Path) -> None:  # noqa: F811
    """A stranger's review of this stop's diff: a site enabled the Debian way (a link into the
    included folder to a file written days ago) was not seen (the file's time is old), nor one
    disabled (`rm` of the link: no file left to look at); the tuner's reload made either live."""
    import time

    from controllers.nginx_tuner.nginx_ctl import PENDING_SLACK_S

    ctl = _control(live)
    loaded = ctl.loaded_at()
    wait_until(lambda: time.time() > loaded + PENDING_SLACK_S + 0.05, timeout=10, what="the slack to pass")
    site = tmp_path / "sites-available-newshop.conf"
    site.write_text(f"server {{ listen 127.0.0.1:{free_port()}; return 200 new; }}\n")
    days_ago = time.time() - 3 * 86400
    os.utime(site, (days_ago, days_ago))
    link = live.prefix / "conf.d" / "newshop.conf"
    link.symlink_to(site)
    res = ctl.apply(30)
    assert (res.ok, res.stage) == (False, "precheck") and "newshop.conf" in res.message, res
    assert ctl.reload().ok and ctl.apply(30).ok  # enabled on purpose: tuning goes on
    loaded = ctl.loaded_at()
    wait_until(lambda: time.time() > loaded + PENDING_SLACK_S + 0.05, timeout=10, what="the slack to pass")
    link.unlink()  # disabled, for the next maintenance window
    res = ctl.apply(40)
    assert (res.ok, res.stage) == (False, "precheck") and "conf.d" in res.message, res
    assert ctl.current_value() == ("30",)


def test_a_worker_respawned_after_a_crash_is_not_a_reload(live: Live) -> None:  # noqa: F811
    """A stranger's review of this stop's diff: the master forks a new worker in place of one
    that died (a segfault, an OOM kill); its start time was taken for nginx reading its files,
    so a staged edit stopped counting as pending and went live with the tuner's reload."""
    import signal
    import time

    from controllers.nginx_tuner.nginx_ctl import PENDING_SLACK_S

    ctl = _control(live)
    loaded = ctl.loaded_at()
    wait_until(lambda: time.time() > loaded + PENDING_SLACK_S + 0.05, timeout=10, what="the slack to pass")
    staged, staged_url = _staged(live)
    assert str(staged) in ctl.apply(30).message
    workers = ctl.workers()
    os.kill(workers[0], signal.SIGKILL)
    wait_until(lambda: len(ctl.workers()) == len(workers) and workers[0] not in ctl.workers(), timeout=20,
               what="the master to fork a worker in place of the dead one")
    res = ctl.apply(30)
    assert (res.ok, res.stage) == (False, "precheck") and str(staged) in res.message, res
    assert not http_ok(staged_url)


async def test_a_trial_with_errors_does_not_end_the_sweeps_protection(live: Live) -> None:  # noqa: F811
    """A stranger's review of this stop's diff: a trial whose errors rose put the pre-sweep file
    back and removed the journal; the next trials ran unprotected and the sweep ended on a
    trial's value, live, every line saying "restored"."""
    ctl = _control(live)
    original = live.conf.read_text()
    outage = {"on": True}

    async def measure(value: float) -> Measurement:
        if outage["on"]:  # an app outage while the sweep runs: as many 5xx as requests
            return Measurement(0.001, 0.002, 1e6, "pss", 100, 100)
        return Measurement(0.001, 0.002, 1e6, "pss", 100, 0)

    settings = SweepSettings(candidates=(10.0, 20.0), repeats=1, seed=3)
    result = await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert [r.result for r in result.records] == ["errors"] * 3
    assert not result.final_ok and live.conf.read_text() == original, result.final
    assert ctl.current_value() == ("65",) and not ctl.pending_files() and not ctl.journal_path.exists()
    assert http_ok(live.url)


async def test_recovery_leaves_an_operators_value_on_the_tuned_line(live: Live) -> None:  # noqa: F811
    """A stranger's review of this stop's diff: after a crashed sweep the operator set the value
    they wanted on the tuned line and reloaded; the next start took it for a trial's, put the
    pre-sweep value back and reloaded it."""
    ctl = _control(live)
    ctl.begin_sweep()
    assert ctl.apply(90).ok  # a trial, then the controller dies
    ctl._sweep_unlock()  # (its sweep lock goes with the process)
    chosen = live.conf.read_text().replace("keepalive_timeout 90;", "keepalive_timeout 30;")
    live.conf.write_text(chosen)
    assert ctl.reload().ok  # the operator's decision, live
    again = _control(live)  # restarted
    workers = again.workers()
    said = again.recover()
    assert "left as it is, not reloaded" in said, said
    assert live.conf.read_text() == chosen and again.workers() == workers and again.current_value() == ("30",)
