"""The copy-guard action against a fake registry: which copies it pauses, when it resumes, and
that nothing stays stopped (max pause, shutdown, crash recovery)."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import CollectorRegistry

from controllers.actions.base import ActionContext
from controllers.copy_guard import action as action_mod
from controllers.copy_guard.action import STATE_NAME, CopyGuardAction, CopyGuardParams
from controllers.copy_guard.registry import Entry, Registry, process_start
from controllers.engine import bind_routes
from controllers.models import Alert
from promreflex.config import ConfigError, ControllerConfig
from tests.payloads import FakeAlertmanager, alert

ME = os.getpid()


class FakeCopies:
    """Records control calls to copiers and freezer calls to adopted processes."""

    def __init__(self, monkeypatch):
        self.state: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()

        def control(held, command, **query):
            if held.id in self.fail:
                raise ConnectionRefusedError("copier gone")
            self.calls.append((held.id, command))
            self.state[held.id] = {"pause": "paused", "throttle": "throttled", "resume": "running"}[command]
            return {}

        def pause(name, pid=None, pgid=None, methods=None):
            self.calls.append((name, "freeze"))
            self.state[name] = "paused"
            return {"method": "signal", "pids": [pid], "name": name}

        def resume(record):
            self.calls.append((record["name"], "thaw"))
            self.state[record["name"]] = "running"

        monkeypatch.setattr(action_mod, "_control", control)
        monkeypatch.setattr(action_mod.freeze, "pause", pause)
        monkeypatch.setattr(action_mod.freeze, "resume", resume)
        monkeypatch.setattr(action_mod.freeze, "is_frozen", lambda r: self.state.get(r["name"]) == "paused")

    def paused(self) -> set[str]:
        return {i for i, s in self.state.items() if s in ("paused", "throttled")}


@pytest.fixture
def copies(monkeypatch):
    return FakeCopies(monkeypatch)


@pytest.fixture
def reg(tmp_path):
    r = Registry(tmp_path / "copies")
    for i, site in (("c1", "shop"), ("c2", "shop"), ("c3", "blog")):
        r.add(Entry(id=i, kind="copier", pid=ME, pid_start=process_start(ME), site=site,
                    control_url=f"http://127.0.0.1:1/{i}"))
    return r


def ctx(params, name="CopyGuardSiteOverloaded", status="firing", **labels):
    labels.setdefault("site", "shop")
    return ActionContext(route="copy-guard", alert=Alert.model_validate(alert(name, status=status, **labels)),
                         params=params)


async def started(**services) -> CopyGuardAction:
    a = CopyGuardAction()
    a.services = {"registry": CollectorRegistry(), **services}
    a.metrics = action_mod.GuardMetrics(a.services["registry"])
    return a  # no supervisor task: tests call tick() themselves


def metric(a, name, **labels):
    return a.services["registry"].get_sample_value(name, labels)


def params(reg, **kw) -> CopyGuardParams:
    return CopyGuardParams(registry_dir=reg.dir, watchdog=False, **kw)


async def test_fire_pauses_the_sites_copies_only_and_resolve_resumes(copies, reg):
    a = await started()
    p = params(reg)
    assert await a.fire(ctx(p)) == "site shop: 2 copies paused"
    assert copies.paused() == {"c1", "c2"}
    await a.tick()
    assert metric(a, "promreflex_copy_guard_paused_copies", site="shop") == 2
    assert metric(a, "promreflex_copy_guard_registered_copies", site="blog") == 1
    assert metric(a, "promreflex_copy_guard_pauses_total", site="shop") == 2
    assert await a.resolve(ctx(p, status="resolved")) == "site shop: 2 copies resumed"
    assert copies.paused() == set()
    assert metric(a, "promreflex_copy_guard_resumes_total", site="shop", reason="resolved") == 2
    assert (reg.dir / STATE_NAME).exists() and '"episodes": []' in (reg.dir / STATE_NAME).read_text()


async def test_label_values_are_data(copies, reg):
    a = await started()
    p = params(reg)
    assert await a.fire(ctx(p, site="../../etc")) == "site ../../etc: 0 copies paused"
    assert await a.fire(ctx(p, site="")) == "no site label: nothing to pause"
    assert await a.fire(ctx(params(reg, sites=["blog"]))) == "site 'shop' is not guarded by this route"
    assert copies.calls == []


async def test_the_prediction_resolving_does_not_resume_while_the_overload_holds(copies, reg):
    a = await started()
    p = params(reg)
    await a.fire(ctx(p, "CopyGuardSiteOverloadPredicted"))
    await a.fire(ctx(p, "CopyGuardSiteOverloaded"))
    assert await a.resolve(ctx(p, "CopyGuardSiteOverloadPredicted", status="resolved")) == \
        "site shop: still held by CopyGuardSiteOverloaded"
    assert copies.paused() == {"c1", "c2"}
    await a.resolve(ctx(p, "CopyGuardSiteOverloaded", status="resolved"))
    assert copies.paused() == set()
    assert metric(a, "promreflex_copy_guard_episodes_total", site="shop") == 1


async def test_copies_registered_during_an_episode_are_paused_and_ended_ones_forgotten(copies, reg):
    a = await started()
    p = params(reg)
    await a.fire(ctx(p))
    reg.add(Entry(id="late", kind="copier", pid=ME, pid_start=process_start(ME), site="shop", control_url="http://127.0.0.1:1"))
    reg.remove("c1")
    await a.tick()
    assert set(a.episodes["shop"].held) == {"c2", "late"}
    assert metric(a, "promreflex_copy_guard_resumes_total", site="shop", reason="ended") == 1


async def test_leases_are_renewed_each_third_of_the_lease(copies, reg, monkeypatch):
    a = await started()
    p = params(reg, lease=3)
    await a.fire(ctx(p))
    await a.tick()
    assert copies.calls.count(("c1", "pause")) == 1  # not due yet
    for h in a.episodes["shop"].held.values():
        h.renewed -= 1.01
    await a.tick()
    assert copies.calls.count(("c1", "pause")) == 2
    assert metric(a, "promreflex_copy_guard_pauses_total", site="shop") == 2  # renewals are not pauses


async def test_max_pause_resumes_counts_and_does_not_pause_again_in_the_episode(copies, reg):
    a = await started()
    p = params(reg, max_pause=60)
    await a.fire(ctx(p))
    a.episodes["shop"].since -= 61
    await a.tick()
    assert copies.paused() == set()
    assert metric(a, "promreflex_copy_guard_forced_resumes_total", site="shop") == 1
    await a.tick()
    assert await a.fire(ctx(p, "CopyGuardSiteOverloadPredicted")) == \
        "site shop: resumed at max_pause earlier in this episode; not pausing again until it ends"
    assert copies.paused() == set()
    await a.resolve(ctx(p, status="resolved"))
    await a.resolve(ctx(p, "CopyGuardSiteOverloadPredicted", status="resolved"))
    assert "shop" not in a.episodes
    await a.fire(ctx(p))  # a new episode pauses again
    assert copies.paused() == {"c1", "c2"}


async def test_min_pause_defers_the_resume_and_a_new_fire_cancels_it(copies, reg):
    a = await started()
    p = params(reg, min_pause=30)
    await a.fire(ctx(p))
    assert (await a.resolve(ctx(p, status="resolved"))).startswith("site shop: resume in ")
    assert copies.paused() == {"c1", "c2"}
    await a.fire(ctx(p, "CopyGuardSiteOverloadPredicted"))
    assert a.episodes["shop"].resume_at is None
    await a.resolve(ctx(p, "CopyGuardSiteOverloadPredicted", status="resolved"))
    a.episodes["shop"].resume_at = time.time() - 1
    await a.tick()
    assert copies.paused() == set() and "shop" not in a.episodes


async def test_leases_are_renewed_while_waiting_out_min_pause(copies, reg):
    """A min_pause longer than the lease must not end early by the copier's own lease expiry."""
    a = await started()
    p = params(reg, min_pause=30, lease=3)
    await a.fire(ctx(p))
    await a.resolve(ctx(p, status="resolved"))
    for held in a.episodes["shop"].held.values():
        held.renewed -= p.lease  # a lease third has long passed
    copies.calls.clear()
    await a.tick()
    assert sorted(copies.calls) == [("c1", "pause"), ("c2", "pause")]  # renewed (a pause with a new lease)
    assert copies.paused() == {"c1", "c2"}
    reg.add(Entry(id="late", kind="copier", pid=ME, pid_start=process_start(ME), pgid=None, site="shop",
                  control_url="http://127.0.0.1:9/"))
    await a.tick()
    assert "late" not in copies.paused()  # nothing new is paused once the alert resolved


async def test_throttle_mode_throttles_copiers_and_pauses_adopted_processes(copies, reg):
    reg.add(Entry(id="rsync", kind="adopted", pid=ME, pid_start=process_start(ME), pgid=None, site="shop"))
    a = await started()
    await a.fire(ctx(params(reg, mode="throttle")))
    assert copies.state == {"c1": "throttled", "c2": "throttled", "rsync": "paused"}
    assert reg.get("rsync").pause["until"] > time.time()  # the lease the watchdog enforces
    await a.resolve(ctx(params(reg, mode="throttle"), status="resolved"))
    assert copies.paused() == set() and reg.get("rsync").pause is None


async def test_a_failed_pause_is_counted_and_retried(copies, reg):
    a = await started()
    copies.fail.add("c1")
    p = params(reg)
    assert await a.fire(ctx(p)) == "site shop: 1 copy paused"
    assert metric(a, "promreflex_copy_guard_errors_total", site="shop", operation="pause") == 1
    copies.fail.clear()
    await a.tick()
    assert copies.paused() == {"c1", "c2"}


async def test_shutdown_resumes_everything(copies, reg):
    a = await started()
    await a.fire(ctx(params(reg)))
    await a.shutdown()
    assert copies.paused() == set()
    assert metric(a, "promreflex_copy_guard_resumes_total", site="shop", reason="shutdown") == 2


async def test_after_a_crash_start_resumes_everything_and_repauses_only_if_still_active(copies, reg):
    p = params(reg)
    crashed = await started()
    overload = ctx(p)
    await crashed.fire(overload)
    await crashed.fire(ctx(p, "CopyGuardSiteOverloaded", site="blog"))
    assert copies.paused() == {"c1", "c2", "c3"}  # ... and the controller is SIGKILLed here

    am = FakeAlertmanager()
    am.active = [alert("CopyGuardSiteOverloaded", site="shop")]  # blog resolved meanwhile
    fresh = await started(alertmanager=am)
    assert await fresh.recover([p]) == 3
    assert copies.paused() == set()
    assert metric(fresh, "promreflex_copy_guard_resumes_total", site="shop", reason="recovery") == 2
    await fresh.tick()
    assert copies.paused() == {"c1", "c2"}
    assert set(fresh.episodes) == {"shop"}
    # The engine will deliver the resolve of the applied alert later; it ends the episode.
    await fresh.resolve(ctx(p, status="resolved"))
    assert copies.paused() == set()


async def test_recovery_waits_for_alertmanager(copies, reg):
    p = params(reg)
    crashed = await started()
    await crashed.fire(ctx(p))
    am = FakeAlertmanager()
    am.fail = True
    fresh = await started(alertmanager=am)
    await fresh.recover([p])
    await fresh.tick()
    assert copies.paused() == set()  # unconfirmed: not paused on a guess
    am.fail = False
    await fresh.tick()
    assert copies.paused() == set() and fresh.episodes == {}  # not active: dropped


def test_params_are_checked_with_the_route(tmp_path):
    cfg = ControllerConfig(routes=[{"name": "cg", "matchers": ['alertname="CopyGuardSiteOverloaded"'],
                                    "action": "copy-guard", "params": {"mode": "sleep", "max_pause": "-1s", "lease": "1h"}}])
    with pytest.raises(ConfigError) as e:
        bind_routes(cfg)
    text = "\n".join(e.value.problems)
    assert "params.mode" in text and "params.max_pause" in text and "params.lease" in text


