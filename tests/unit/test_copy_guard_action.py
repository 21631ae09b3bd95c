"""The copy-guard action against a fake registry: which copies it pauses, when it resumes, and
that nothing stays stopped (max pause, shutdown, crash recovery)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.actions.base import ActionContext
from controllers.copy_guard import action as action_mod
from controllers.copy_guard.action import STATE_NAME, CopyGuardAction, CopyGuardParams
from controllers.copy_guard.registry import Entry, Registry, process_start
from controllers.audit import AuditLog
from controllers.engine import Engine, bind_routes
from controllers.metrics import ControllerMetrics
from controllers.models import Alert
from promreflex.config import ConfigError, ControllerConfig
from promreflex.errors import UserError
from tests.payloads import FakeAlertmanager, alert

ME = os.getpid()


class FakeCopies:
    """Records control calls to copiers and freezer calls to adopted processes."""

    def __init__(self, monkeypatch):
        self.state: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()
        self.shares: dict[str, float] = {}

        async def control(client, held, command, **query):
            client.url(held.control_url, command)  # the route's host check still applies
            if held.id in self.fail:
                raise ConnectionRefusedError("copier gone")
            self.calls.append((held.id, command))
            self.state[held.id] = {"pause": "paused", "throttle": "throttled", "resume": "running"}[command]
            self.shares[held.id] = {"pause": 0.0, "resume": 1.0}.get(command) or float(query.get("share", -1))
            return {}

        def pause(name, pid=None, pgid=None, methods=None):
            name = name.rsplit("-", 1)[0]  # the copy's id (the cgroup name adds its registry's digest)
            self.calls.append((name, "freeze"))
            self.state[name] = "paused"
            return {"method": "signal", "pids": [pid], "name": name}

        def resume(record):
            self.calls.append((record["name"], "thaw"))
            self.state[record["name"]] = "running"

        monkeypatch.setattr(action_mod.ControlClient, "__call__", control)
        monkeypatch.setattr(action_mod.freeze, "pause", pause)
        monkeypatch.setattr(action_mod.freeze, "resume", resume)
        monkeypatch.setattr(action_mod.freeze, "is_frozen", lambda r: self.state.get(r["name"]) == "paused")
        monkeypatch.setattr(action_mod.freeze, "intact", lambda r: self.state.get(r["name"]) is not None)
        monkeypatch.setattr(action_mod.freeze, "set_frozen", lambda r, frozen: None)

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


@pytest.fixture(autouse=True)
def confirm_at_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests tick faster than the real pace of confirmation reads (CONFIRM_EVERY, 1 s): every
    tick reads, except in the test of that pace."""
    monkeypatch.setattr(action_mod, "CONFIRM_EVERY", 0.0)


async def started(**services) -> CopyGuardAction:
    a = CopyGuardAction()
    a.services = {"registry": CollectorRegistry(), **services}
    a.metrics = action_mod.GuardMetrics(a.services["registry"])
    return a  # no supervisor task: tests call tick() themselves


def judged(am, reg) -> dict:
    """``am`` with the engine's judgement of which alerts are still active (what a controller
    offers its actions beside its Alertmanager client: ``services["alertmanager_presence"]``)."""
    cfg = ControllerConfig(state_file=reg.dir.parent / "controller.db", audit_log=reg.dir.parent / "audit.jsonl",
                           alertmanager_url=None)
    engine = Engine(cfg, ControllerMetrics(CollectorRegistry(), []), AuditLog(cfg.audit_log),
                    services={"alertmanager": am})
    return engine.services


def metric(a, name, **labels):
    return a.services["registry"].get_sample_value(name, labels)


def params(reg, **kw) -> CopyGuardParams:
    kw.setdefault("mode", "pause")
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
    for h in a.episodes["shop"].held.values():  # max_pause counts from the copies' first pause
        h.since -= 61
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
    for h in a.episodes["shop"].held.values():
        h.since -= 31
    await a.tick()
    assert copies.paused() == set() and "shop" not in a.episodes


async def test_min_pause_counts_from_each_copys_own_pause(copies, reg):
    """Issue 16: a copy that joined an open episode was held 10.8 s instead of 20 s, because
    min_pause counted from the episode's start. Each copy now gets its full min_pause."""
    a = await started()
    p = params(reg, min_pause=20)
    reg.remove("c2")
    await a.fire(ctx(p))
    assert copies.paused() == {"c1"}
    ep = a.episodes["shop"]
    ep.since -= 9.2
    ep.held["c1"].since -= 9.2  # c1 was paused 9.2 s ago, when the episode began
    reg.add(Entry(id="late", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                  control_url="http://127.0.0.1:1/late"))
    await a.tick()  # the late copy joins the open episode: paused now
    assert copies.paused() == {"c1", "late"}
    ep.since -= 11
    ep.held["c1"].since -= 11  # 20.2 s after c1's pause, 11 s after the late copy's
    ep.held["late"].since -= 11
    assert "min_pause" in await a.resolve(ctx(p, status="resolved"))
    await a.tick()
    assert copies.paused() == {"late"}  # c1 served its 20 s; the late copy has 9 s to go
    assert copies.calls[-1] == ("c1", "resume")
    ep.held["late"].since -= 8.5
    await a.tick()
    assert copies.paused() == {"late"}  # 19.5 s: still held
    ep.held["late"].since -= 0.6
    await a.tick()
    assert copies.paused() == set() and "shop" not in a.episodes
    assert metric(a, "promreflex_copy_guard_resumes_total", site="shop", reason="resolved") == 2


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
    fresh = await started(**judged(am, reg))
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
    fresh = await started(**judged(am, reg))
    await fresh.recover([p])
    await fresh.tick()
    assert copies.paused() == set()  # unconfirmed: not paused on a guess
    am.fail = False
    await fresh.tick()
    assert copies.paused() == set() and fresh.episodes == {}  # not active: dropped


async def test_recovery_gives_each_episode_the_route_that_opened_it(copies, reg):
    """Two copy-guard routes on one registry (a pause route beside the adaptive one): recovery
    rebuilt every episode with the first route's params, so a pause came back as a throttle at
    share 1 while its alert still fired (a stranger's review)."""
    adaptive_route = params(reg, mode="adaptive")
    pause_route = params(reg, mode="pause")
    crashed = await started()
    await crashed.fire(ctx(pause_route))
    assert copies.paused() == {"c1", "c2"}  # ... and the controller is SIGKILLed here
    am = FakeAlertmanager()
    am.active = [alert("CopyGuardSiteOverloaded", site="shop")]
    fresh = await started(**judged(am, reg))
    await fresh.recover([adaptive_route, pause_route])
    assert fresh.episodes["shop"].params.mode == "pause" and fresh.episodes["shop"].throttle is None
    await fresh.tick()
    assert copies.paused() == {"c1", "c2"}  # paused again, not throttled at share 1
    await fresh.resolve(ctx(pause_route, status="resolved"))
    assert copies.paused() == set()


def test_params_are_checked_with_the_route(tmp_path):
    cfg = ControllerConfig(routes=[{"name": "cg", "matchers": ['alertname="CopyGuardSiteOverloaded"'],
                                    "action": "copy-guard", "params": {"mode": "sleep", "max_pause": "-1s", "lease": "1h"}}])
    with pytest.raises(ConfigError) as e:
        bind_routes(cfg)
    text = "\n".join(e.value.problems)
    assert "params.mode" in text and "params.max_pause" in text and "params.lease" in text




# ---------------------------------------------------------------- the registry is a trust boundary
class RecordingSession:
    """Stands in for the controller's aiohttp session: records every request, answers 200."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []

    def post(self, url, params=None, headers=None, **kw):
        self.requests.append((url, dict(headers or {})))

        class Resp:
            status = 200

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return False

            async def json(self, content_type=None):
                return {"state": "paused"}

            async def text(self):
                return ""

        return Resp()


def _secret(path, text="s3cret", mode=0o600):
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


async def test_a_registry_entry_cannot_choose_the_token_or_a_remote_host(tmp_path):
    """An entry naming a token file (as older versions wrote) and a remote control URL: the
    controller neither reads that file nor sends anything to that host."""
    reg = Registry(tmp_path / "copies")
    victim_secret = _secret(tmp_path / "victim-secret", "root-only-secret")
    reg.add(Entry(id="local", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                  control_url="http://127.0.0.1:1"))
    reg.add(Entry(id="remote", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                  control_url="http://203.0.113.7:8080"))
    for name in ("local", "remote"):  # what an attacker's (or an old) entry may say
        path = reg.path(name)
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "token_file": str(victim_secret)}))
    session = RecordingSession()
    a = await started(session=session)
    p = params(reg, control_token_file=_secret(tmp_path / "route-token", "route-token"))
    assert await a.fire(ctx(p)) == "site shop: 1 copy paused"
    assert [(url.split("?")[0], h.get("Authorization")) for url, h in session.requests] == \
        [("http://127.0.0.1:1/pause", "Bearer route-token")]
    assert metric(a, "promreflex_copy_guard_errors_total", site="shop", operation="pause") == 1  # the remote one


@pytest.mark.parametrize("url, kw, sent", [
    ("http://127.0.0.1:1", {}, [("http://127.0.0.1:1/pause", None)]),  # no token without the route's file
    ("http://backup-1.example:8080", {"control_hosts": ["Backup-1.example"]},
     [("http://backup-1.example:8080/pause", None)]),  # an allow-listed host
    ("http://backup-1.example:8080", {}, []),  # the same host, not listed
])
async def test_where_control_requests_go(tmp_path, url, kw, sent):
    reg = Registry(tmp_path / "copies")
    reg.add(Entry(id="c", kind="copier", pid=ME, pid_start=process_start(ME), site="shop", control_url=url))
    session = RecordingSession()
    a = await started(session=session)
    await a.fire(ctx(params(reg, **kw)))
    assert [(u.split("?")[0], h.get("Authorization")) for u, h in session.requests] == sent


@pytest.mark.parametrize("url", ["https://127.0.0.1:1", "http://user:pw@127.0.0.1:1", "file:///etc/passwd", "",
                                 "http://10.0.0.1:80", "http://127.0.0.1.example:80"])
def test_control_urls_are_plain_http_to_loopback_or_listed_hosts(url):
    with pytest.raises(ValueError, match="refusing control URL"):
        action_mod.ControlClient(None, hosts=["backup-1"]).url(url, "pause")  # type: ignore[arg-type]


def test_control_hosts_are_host_names_only():
    with pytest.raises(ValueError, match="control_hosts"):
        CopyGuardParams(control_hosts=["http://x:80/"])
    assert CopyGuardParams(control_hosts=["Backup-1", "10.0.0.2", "[::1]"]).control_hosts == ["backup-1", "10.0.0.2",
                                                                                             "::1"]


@pytest.mark.parametrize("problem", ["group-writable", "world-writable", "foreign-owner", "token-readable",
                                     "token-missing"])
async def test_start_refuses_a_registry_others_can_write_and_a_readable_token(tmp_path, problem):
    reg_dir = tmp_path / "copies"
    reg_dir.mkdir(mode=0o700)
    token = _secret(tmp_path / "token")
    if problem == "group-writable":
        reg_dir.chmod(0o770)
    elif problem == "world-writable":
        reg_dir.chmod(0o1777)
    elif problem == "foreign-owner":
        if os.geteuid() != 0:
            pytest.fail("needs root to chown (this suite runs as root)")
        os.chown(reg_dir, 12345, 12345)
    elif problem == "token-readable":
        token.chmod(0o644)
    else:
        token.unlink()
    a = CopyGuardAction()
    p = CopyGuardParams(registry_dir=reg_dir, watchdog=False, control_token_file=token)
    a.route_params = [p]
    with pytest.raises(UserError) as e:
        a.preflight(p)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError):
        await a.start({"registry": CollectorRegistry()})


async def test_start_creates_a_missing_registry_private(tmp_path):
    a = CopyGuardAction()
    p = CopyGuardParams(registry_dir=tmp_path / "new" / "copies", watchdog=False)
    a.route_params = [p]
    await a.start({"registry": CollectorRegistry()})
    try:
        assert (tmp_path / "new" / "copies").stat().st_mode & 0o077 == 0
    finally:
        await a.shutdown()


async def test_a_copy_registered_where_no_guard_looks_is_said(tmp_path, capsys, monkeypatch):
    """A newcomer's review: `promreflex copy --registry.dir OTHER` (or another user's default,
    an environment variable set in one shell) copied unguarded, exit 0, no hint. The action
    notes the registry it watches at its start; copy and adopt warn when none does."""
    import subprocess
    import sys

    from controllers.copy_guard import cli as cg_cli
    from controllers.copy_guard.registry import WATCH_NAME, unwatched

    reg_dir = tmp_path / "copies"
    assert "no copy guard has started" in (unwatched(reg_dir) or "")
    a = CopyGuardAction()
    a.route_params = [CopyGuardParams(registry_dir=reg_dir, watchdog=False)]
    await a.start({"registry": CollectorRegistry()})
    try:
        assert (reg_dir / WATCH_NAME).is_file() and unwatched(reg_dir) is None
    finally:
        await a.shutdown()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (me,) = json.loads((reg_dir / WATCH_NAME).read_text())["watchers"].values()
    dead = {**me, "pid": int(gone.stdout), "pid_start": 1.0}
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {"dead": dead}}))
    assert "is not running" in (unwatched(reg_dir) or "")
    # two controllers on one registry: one gone, the other (this process) still guards it
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {"dead": dead, "me": me}}))
    assert unwatched(reg_dir) is None
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {"other": {**dead, "host": "another-host"}}}))
    assert unwatched(reg_dir) is None  # (another host's guard cannot be checked from here)
    # a reload that adds a route on another registry: noted at the supervisor's next note
    later = tmp_path / "later"
    later.mkdir(mode=0o700)
    a.route_params = [*a.route_params, CopyGuardParams(registry_dir=later, watchdog=False)]
    a._note_watches()
    assert unwatched(later) is None and unwatched(reg_dir) is None
    # a user who cannot read the registry gets no traceback from the check (registering fails on its own)
    if os.geteuid() != 0:
        pytest.fail("needs root to drop to another user (this suite runs as root)")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setuid(65534)
            os.write(w, repr(unwatched(reg_dir)).encode())
        except BaseException as e:  # noqa: BLE001
            os.write(w, type(e).__name__.encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    assert os.read(r, 1000) == b"None"
    os.close(r)
    other = tmp_path / "other"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        parser = __import__("argparse").ArgumentParser()
        cg_cli.register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["copy-guard", "adopt", "--pid", str(child.pid), "--registry.dir", str(other)])
        assert args.func(args) == 0
        assert "nothing guards it" in capsys.readouterr().err
    finally:
        child.kill()
        child.wait()


async def test_the_action_uses_the_controllers_session(tmp_path):
    """A real copier-like endpoint on loopback, reached through the aiohttp session in
    services (no threads, no urllib)."""
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    seen = []

    async def pause(request):
        seen.append((request.path, dict(request.query), request.headers.get("Authorization")))
        return web.json_response({"state": "paused"})

    app = web.Application()
    app.router.add_post("/{command}", pause)
    async with TestServer(app, host="127.0.0.1") as srv, ClientSession() as session:
        reg = Registry(tmp_path / "copies")
        reg.add(Entry(id="c", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                      control_url=f"http://127.0.0.1:{srv.port}"))
        a = await started(session=session)
        p = params(reg, lease=7, control_token_file=_secret(tmp_path / "token", "tok"))
        assert await a.fire(ctx(p)) == "site shop: 1 copy paused"
        assert await a.resolve(ctx(p, status="resolved")) == "site shop: 1 copy resumed"
    assert seen == [("/pause", {"lease": "7.0"}, "Bearer tok"), ("/resume", {}, "Bearer tok")]


# ---------------------------------------------------------------------- adaptive mode
class FakePrometheus:
    """Answers the action's signal query with the series the rules record, per site."""

    def __init__(self) -> None:
        self.sites: dict[str, dict[str, float]] = {}
        self.queries: list[str] = []
        self.fail = False

    def set(self, site: str, served: float, at: float, threshold: float = 90.0, demand: float = 100.0,
            floor: float = 20.0, window: float = 1.0) -> None:
        self.sites[site] = {"served": served, "at": at, "threshold": threshold, "demand": demand, "floor": floor,
                            "window": window}

    async def query(self, expr: str) -> list[dict]:
        self.queries.append(expr)
        if self.fail:
            raise ConnectionError("prometheus unreachable")
        return [{"metric": {"site": site, "promreflex_q": q}, "value": [0, str(v)]}
                for site, values in self.sites.items() for q, v in values.items()]


def adaptive(reg, **kw) -> CopyGuardParams:
    return CopyGuardParams(registry_dir=reg.dir, watchdog=False, **kw)


async def step(a, prom, site="shop", served=80.0, dt=1.1, **kw):
    """A new served sample `dt` seconds after the last change, then one supervisor pass."""
    at = time.time() + dt
    prom.set(site, served, at, **kw)
    ep = a.episodes.get(site)
    if ep is not None and ep.throttle is not None:
        ep.throttle.changed_at -= dt  # as if dt seconds had passed since the last change
    await a.tick(await a.signals())


async def test_a_crowd_alert_joining_an_episode_says_when_its_pause_comes(copies, reg):
    """The copy's own log said "paused" while the controller's record said "at share 0.5" (a
    stranger's review): the record now says the crowd pauses at the throttle's next decision."""
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    p = adaptive(reg, crowd="pause")
    assert await a.fire(ctx(p)) == "site shop: 2 copies at share 0.5 now"
    crowd = await a.fire(ctx(p, name="CopyGuardSiteCrowded"))
    assert crowd == "site shop: 2 copies at share 0.5 now; a crowd pauses them at the throttle's next decision"
    await a.shutdown()


async def test_adaptive_halves_the_share_below_the_line_and_climbs_back_before_letting_go(copies, reg):
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    p = adaptive(reg)
    assert await a.fire(ctx(p)) == "site shop: 2 copies at share 0.5 now"
    assert copies.shares == {"c1": 0.5, "c2": 0.5} and copies.state["c1"] == "throttled"
    await step(a, prom, served=80.0)
    assert copies.shares == {"c1": 0.25, "c2": 0.25}
    assert metric(a, "promreflex_copy_guard_share", site="shop") == 0.25
    assert metric(a, "promreflex_copy_guard_copy_share", site="shop", id="c1") == 0.25
    assert metric(a, "promreflex_copy_guard_throttled_copies", site="shop") == 2
    assert metric(a, "promreflex_copy_guard_paused_copies", site="shop") == 0  # throttled is not paused
    assert metric(a, "promreflex_copy_guard_throttle_decreases_total", site="shop") == 2
    # The alert resolves: the copies are not let go at once (that is what made them flap).
    assert "climbing back" in await a.resolve(ctx(p, status="resolved"))
    assert copies.shares["c1"] == 0.25
    await step(a, prom, served=93.0)  # within the band: hold
    assert copies.shares["c1"] == 0.25
    for want in (0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95):
        await step(a, prom, served=99.0)
        assert copies.shares["c1"] == pytest.approx(want)
    assert "shop" in a.episodes
    await step(a, prom, served=99.0)
    assert "shop" not in a.episodes and copies.state == {"c1": "running", "c2": "running"}
    assert metric(a, "promreflex_copy_guard_throttle_increases_total", site="shop") == 8
    assert metric(a, "promreflex_copy_guard_copy_share", site="shop", id="c1") is None  # removed with the hold
    assert metric(a, "promreflex_copy_guard_share", site="shop") == 1
    assert metric(a, "promreflex_copy_guard_throttle_decisions_total", site="shop", verdict="hold") == 1


async def test_adaptive_waits_for_a_sample_taken_after_the_change(copies, reg):
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    await a.fire(ctx(adaptive(reg)))
    prom.set("shop", 60.0, time.time() + 0.3)  # the rate still spans 0.7 s from before the change
    await a.tick(await a.signals())
    assert copies.shares["c1"] == 0.5
    await step(a, prom, served=60.0)
    assert copies.shares["c1"] == 0.25


async def test_adaptive_emergency_pause_and_adopted_copies_get_a_duty_cycle(copies, reg):
    reg.add(Entry(id="rsync", kind="adopted", pid=ME, pid_start=process_start(ME), pgid=None, site="shop"))
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    p = adaptive(reg, duty_period=2)
    await a.fire(ctx(p))
    record = reg.get("rsync").pause
    assert (record["duty"], record["period"]) == (0.5, 2.0) and record["until"] > time.time()
    await step(a, prom, served=30.0)  # a severe deficit: the pause is kept for that
    assert copies.state["c1"] == "paused" and reg.get("rsync").pause["duty"] == 0.0
    assert metric(a, "promreflex_copy_guard_emergency_pauses_total", site="shop", reason="severe") == 1
    await step(a, prom, served=99.0)
    assert copies.shares["c1"] == p.min_share and reg.get("rsync").pause["duty"] == p.min_share


async def test_adaptive_falls_back_to_the_alert_without_prometheus(copies, reg):
    prom = FakePrometheus()
    prom.fail = True
    a = await started(prometheus=prom)
    p = adaptive(reg)
    await a.fire(ctx(p))
    assert copies.shares["c1"] == 0.5
    assert metric(a, "promreflex_copy_guard_signal_errors_total", site="shop") == 1
    a.episodes["shop"].throttle.changed_at -= 2.1
    await a.tick(await a.signals(sites=("shop",)))
    assert copies.shares["c1"] == 0.25  # the alert still fires: below
    assert metric(a, "promreflex_copy_guard_signal_errors_total", site="shop") == 2
    prom.fail = False  # Prometheus answers, but has no served rate for the site: still blind
    await a.signals(sites=("shop",))
    assert metric(a, "promreflex_copy_guard_signal_errors_total", site="shop") == 3
    prom.set("shop", 99.0, time.time())
    await a.signals(sites=("shop",))
    assert metric(a, "promreflex_copy_guard_signal_errors_total", site="shop") == 3


async def test_the_signal_fails_over_from_a_prometheus_replica_that_hangs(reg, monkeypatch):
    """controller.prometheus_url with both replicas of a pair, the first one hanging (a wedged
    Prometheus, SYNs dropped): the signal's own deadline cancelled the read before the client
    gave up on the first replica, so the second was never asked and every read failed. Each
    replica now gets the signal's timeout: the second answers, and is asked first from then on."""
    import asyncio

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from promreflex.clients import PrometheusClient

    monkeypatch.setattr(action_mod, "SIGNAL_TIMEOUT", 0.5)
    release = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"site": "shop", "promreflex_q": "served"}, "value": [time.time(), "30"]}]}})

    hung, good = web.Application(), web.Application()
    hung.router.add_get("/api/v1/query", hang)
    good.router.add_get("/api/v1/query", ok)
    async with TestServer(hung) as a_srv, TestServer(good) as b_srv, aiohttp.ClientSession() as session:
        urls = [str(a_srv.make_url("")).rstrip("/"), str(b_srv.make_url("")).rstrip("/")]
        prom = PrometheusClient(urls, session)
        a = await started(prometheus=prom)
        try:
            signals = await a.signals(sites=("shop",))
            assert signals is not None and signals["shop"].served == 30.0
            assert prom.base_urls == urls[::-1]  # the replica that answered is asked first now
        finally:
            release.set()


async def test_the_site_label_is_never_put_into_the_query(copies, reg):
    prom = FakePrometheus()
    a = await started(prometheus=prom)
    evil = 'shop"} or vector(1) #'
    await a.fire(ctx(adaptive(reg), site=evil))
    assert prom.queries and all(q == action_mod.SIGNAL_QUERY for q in prom.queries)
    assert evil not in prom.queries[0]


async def test_adaptive_state_survives_a_crash_at_its_share(copies, reg):
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    p = adaptive(reg)
    crashed = await started(prometheus=prom)
    await crashed.fire(ctx(p))
    await step(crashed, prom, served=80.0)
    assert copies.shares["c1"] == 0.25  # ... SIGKILL here
    saved = json.loads((reg.dir / STATE_NAME).read_text())["episodes"][0]
    assert saved["throttle"]["share"] == 0.25 and saved["held"]["c1"]["since"] > 0
    am = FakeAlertmanager()
    am.active = [alert("CopyGuardSiteOverloaded", site="shop")]
    fresh = await started(**judged(am, reg), prometheus=prom)
    await fresh.recover([p])
    assert copies.state["c1"] == "running"  # resumed first
    await fresh.tick()
    assert copies.shares["c1"] == 0.25  # held again, at the saved share, once Alertmanager confirms


def test_adaptive_is_the_default_and_its_params_are_checked():
    p = CopyGuardParams(period="auto")
    assert (p.mode, p.period, p.decrease, p.increase, p.min_share) == ("adaptive", None, 0.5, 0.1, 0.1)
    assert p.registry_dir.is_absolute()
    for bad in ({"decrease": 1}, {"decrease": 0}, {"increase": 0}, {"min_share": 1}, {"severe": 1},
                {"duty_period": "10ms"}, {"period": "0s"}, {"emergency_after": "-1s"}):
        with pytest.raises(ValueError):
            CopyGuardParams(**bad)


def test_a_relative_registry_dir_is_resolved_against_the_config_file(tmp_path, monkeypatch):
    conf = tmp_path / "etc"
    p = CopyGuardParams.model_validate({"registry_dir": "copies"}, context={"config_dir": str(conf)})
    assert p.registry_dir == conf / "copies"
    monkeypatch.chdir(tmp_path)
    # Without the configuration file's directory a relative path would mean a different directory
    # to every command (issue 16): refused, naming the key and why.
    with pytest.raises(ValueError, match=r"registry_dir[\s\S]*must be an absolute path, not 'rel'"):
        CopyGuardParams(registry_dir="rel")
    assert CopyGuardParams(registry_dir=str(tmp_path / "abs")).registry_dir == tmp_path / "abs"


def test_a_route_with_a_relative_registry_dir_is_a_config_error_naming_the_key():
    from promreflex.config import load_config

    cfg = load_config(None, {"controller.routes": [{"name": "cg", "matchers": ['alertname="CopyGuardSiteOverloaded"'],
                                                     "action": "copy-guard", "params": {"registry_dir": "copies"}}]})
    with pytest.raises(ConfigError) as e:
        bind_routes(cfg.controller)
    assert "controller.routes[0].params.registry_dir" in str(e.value) and "absolute" in str(e.value)


def test_doctor_reads_a_routes_relative_registry_dir_against_the_config_file(tmp_path, monkeypatch):
    from controllers.copy_guard.doctor import route_registry_dir

    monkeypatch.chdir(tmp_path)
    assert route_registry_dir("copies", "/etc/promreflex/config.yml") == Path("/etc/promreflex/copies")
    assert route_registry_dir("/var/lib/c", "/etc/promreflex/config.yml") == Path("/var/lib/c")
    assert route_registry_dir(None, "x.yml") is None


async def test_the_guards_metrics_pass_promtools_lint(copies, reg):
    import shutil
    import subprocess

    from prometheus_client import generate_latest

    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    await a.fire(ctx(adaptive(reg)))
    await a.tick(await a.signals())
    body = generate_latest(a.services["registry"])
    assert b'promreflex_copy_guard_share{site="shop"} 0.5' in body
    assert b'promreflex_copy_guard_emergency_pauses_total{reason="floor",site="shop"} 0.0' in body
    assert b'promreflex_copy_guard_signal_errors_total{site="shop"} 0.0' in body
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_signals_carry_what_visitors_ask_and_the_route_chooses_which_demand_the_throttle_reads():
    sigs = action_mod.parse_signals([
        {"metric": {"site": "shop", "promreflex_q": q}, "value": [0, str(v)]}
        for q, v in (("served", 40), ("threshold", 71.5), ("demand", 76), ("asked", 40), ("floor", 71.5))])
    assert sigs["shop"].asked == 40 and sigs["shop"].demand == 76
    assert "site:promreflex_copy_guard_asked:rps" in action_mod.SIGNAL_QUERY
    assert action_mod.CopyGuardParams(demand_signal="asked").settings().demand_signal == "asked"
    assert action_mod.CopyGuardParams().settings().demand_signal == "demand"
    with pytest.raises(ValueError):
        action_mod.CopyGuardParams(demand_signal="latency")


def test_signals_carry_the_crowd_flag_and_the_route_chooses_what_a_crowd_does():
    sigs = action_mod.parse_signals([
        {"metric": {"site": "shop", "promreflex_q": q}, "value": [0, str(v)]}
        for q, v in (("served", 28), ("threshold", 26), ("crowd", 1))])
    assert sigs["shop"].crowd == 1
    assert action_mod.parse_signals([{"metric": {"site": "shop", "promreflex_q": "served"}, "value": [0, "28"]}])[
        "shop"].crowd is None
    assert "site:promreflex_copy_guard_crowd:bool" in action_mod.SIGNAL_QUERY
    assert action_mod.CopyGuardParams(crowd="pause").settings().crowd == "pause"
    assert action_mod.CopyGuardParams().settings().crowd == "ignore"
    with pytest.raises(ValueError):
        action_mod.CopyGuardParams(crowd="always")


def test_the_shipped_route_routes_the_crowd_alert_and_pauses_for_a_crowd():
    """Since issue 16's fifth bench: CopyGuardSiteCrowded with the two overload alerts, and
    `crowd: pause`; the route as shipped validates and the throttle gets those settings."""
    from controllers.copy_guard.manifest import CAPABILITY

    (route,) = [r for r in CAPABILITY.routes if r["action"] == "copy-guard"]
    assert route["matchers"] == [
        'alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"']
    s = CopyGuardParams(**route["params"]).settings()
    assert (s.crowd, s.max_pause) == ("pause", 120.0)


async def test_a_pause_taken_up_after_a_crash_does_not_count_the_downtime(copies, reg):
    """A stranger's review: the controller SIGKILLed mid-pause, restarted minutes later (its
    copies had run again from their leases' end): the downtime counted toward max_pause, a
    forced resume was recorded at once and CopyGuardForcedResume warned of a quiet shop."""
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    p = adaptive(reg, max_pause=120)
    crashed = await started(prometheus=prom)
    await crashed.fire(ctx(p))
    await step(crashed, prom, served=30.0)  # a severe deficit: paused
    assert copies.state["c1"] == "paused"
    ep = crashed.episodes["shop"]
    assert ep.throttle is not None and ep.throttle.paused
    ep.throttle.paused_since -= 600  # ... then SIGKILLed, and restarted ten minutes later
    crashed._save()
    am = FakeAlertmanager()
    am.active = [alert("CopyGuardSiteOverloaded", site="shop")]
    fresh = await started(prometheus=prom, **judged(am, reg))
    await fresh.recover([p])
    assert copies.paused() == set()
    await step(fresh, prom, served=99.0)
    await step(fresh, prom, served=99.0)
    assert metric(fresh, "promreflex_copy_guard_forced_resumes_total", site="shop") in (None, 0)
    await fresh.shutdown()


async def test_a_second_live_controller_on_the_same_registry_is_said(tmp_path, caplog):
    """Two controllers whose routes use one registry share its copy-guard.state: after a restart
    one took up the other's episode and held its copy at 10 % with no end (a review). The watch
    file already names both: the guard says so, once per other controller."""
    import subprocess
    import sys

    from controllers.copy_guard.registry import WATCH_NAME, note_watched, process_start

    reg_dir = tmp_path / "copies"
    reg_dir.mkdir(mode=0o700)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        host = socket.gethostname()
        (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {f"{host}:{other.pid}": {
            "host": host, "pid": other.pid, "pid_start": process_start(other.pid), "since": 0}}}))
        assert note_watched(reg_dir) == [f"{host}:{other.pid}"]
        a = CopyGuardAction()
        a.route_params = [CopyGuardParams(registry_dir=reg_dir, watchdog=False)]
        with caplog.at_level("WARNING"):
            a._note_watches()
            a._note_watches()
        said = [r for r in caplog.records if "is also watched by the controller" in r.getMessage()]
        assert len(said) == 1 and str(other.pid) in said[0].getMessage()
    finally:
        other.kill()
        other.wait()
    assert note_watched(reg_dir) == []  # a controller that is gone is dropped, not reported
    # Another host's controller (a pod: a new hostname at each restart) counts while it notes
    # itself; one silent for 10 minutes is dropped, not named (they named dead pods, and grew).
    watchers = json.loads((reg_dir / WATCH_NAME).read_text())["watchers"]
    now = time.time()
    watchers["pod-a:7"] = {"host": "pod-a", "pid": 7, "pid_start": 1.0, "since": now - 30}
    watchers["pod-b:7"] = {"host": "pod-b", "pid": 7, "pid_start": 1.0, "since": now - 400}
    watchers["pod-c:7"] = {"host": "pod-c", "pid": 7, "pid_start": 1.0, "since": now - 4000}
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": watchers}))
    assert note_watched(reg_dir) == ["pod-a:7"]
    assert set(json.loads((reg_dir / WATCH_NAME).read_text())["watchers"]) == {"pod-a:7", "pod-b:7", f"{host}:{os.getpid()}"}


def test_another_hosts_guard_silent_for_long_is_not_taken_as_running(tmp_path):
    """promreflex copy warns when no guard watches its registry: another host's entry silent for
    hours still counted as a running guard (a review)."""
    from controllers.copy_guard.registry import WATCH_NAME, unwatched

    reg_dir = tmp_path / "copies"
    reg_dir.mkdir(mode=0o700)
    old = {"host": "pod-a", "pid": 7, "pid_start": 1.0, "since": time.time() - 6 * 3600}
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {"pod-a:7": old}}))
    assert "is not running" in (unwatched(reg_dir) or "")
    (reg_dir / WATCH_NAME).write_text(json.dumps({"watchers": {"pod-a:7": {**old, "since": time.time() - 30}}}))
    assert unwatched(reg_dir) is None


def test_the_copiers_control_takes_a_rotated_token_as_the_guard_does(tmp_path):
    """The guard reads its control_token_file again when it changes; the copier's control read
    its token once, so a token rotated in the file both name got every call a 401 (a review)."""
    from controllers.copy_guard.service import CopyService
    from promreflex.httpd import LiveToken

    token = tmp_path / "token"
    token.write_text("first\n")
    token.chmod(0o600)
    service = CopyService(None, None, "shop", "c1", LiveToken(token))  # type: ignore[arg-type]
    assert service.authorized("Bearer first") and not service.authorized("Bearer second")
    token.write_text("second-token\n")
    assert service.authorized("Bearer second-token") and not service.authorized("Bearer first")


@pytest.mark.parametrize("mode", ["pause", "adaptive"])
async def test_an_episode_holding_no_copy_reaches_max_pause_without_a_forced_resume(copies, tmp_path, mode):
    """A stranger's review: calibrate's own load is a crowd; with no copy registered, the
    episode's emergency pause reached max_pause and CopyGuardForcedResume warned for 10 minutes
    that the copies "were resumed while the site was still overloaded"."""
    empty = Registry(tmp_path / "none")
    prom = FakePrometheus()
    prom.set("shop", 80.0, time.time())
    a = await started(prometheus=prom)
    p = CopyGuardParams(registry_dir=empty.dir, watchdog=False, mode=mode, max_pause=60)
    await a.fire(ctx(p))
    if mode == "pause":
        a.episodes["shop"].since -= 61
        await a.tick()
    else:
        await step(a, prom, served=30.0)  # a severe deficit: the emergency pause
        ep = a.episodes["shop"]
        assert ep.throttle is not None and ep.throttle.paused
        ep.throttle.paused_since -= 61
        await step(a, prom, served=30.0)
    assert metric(a, "promreflex_copy_guard_forced_resumes_total", site="shop") in (None, 0)


async def test_a_copy_that_comes_after_an_empty_max_pause_is_still_paused(copies, tmp_path):
    """Review G, G4: an overload before any copy reached max_pause holding nothing; the episode
    was marked forced, and a backup registered then ran through the overload unguarded."""
    reg = Registry(tmp_path / "copies")
    a = await started()
    p = params(reg, max_pause=120)
    await a.fire(ctx(p))
    a.episodes["shop"].since -= 121
    await a.tick()
    reg.add(Entry(id="backup", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                  control_url="http://127.0.0.1:1/backup"))
    await a.tick()
    assert copies.paused() == {"backup"}
    assert metric(a, "promreflex_copy_guard_forced_resumes_total", site="shop") in (None, 0)


async def test_max_pause_counts_from_the_first_pause_of_a_copy_held(copies, tmp_path):
    """Review P: after an empty max_pause the clock restarted at that boundary, and a backup
    registered just before the next one was force-resumed 3 s after its pause."""
    reg = Registry(tmp_path / "copies")
    a = await started()
    p = params(reg, max_pause=120)
    await a.fire(ctx(p))
    a.episodes["shop"].since -= 237  # an overload of 4 minutes so far, nothing held
    await a.tick()
    reg.add(Entry(id="backup", kind="copier", pid=ME, pid_start=process_start(ME), site="shop",
                  control_url="http://127.0.0.1:1/backup"))
    await a.tick()
    a.episodes["shop"].held["backup"].since -= 3
    a.episodes["shop"].since -= 3
    await a.tick()
    assert copies.paused() == {"backup"}
    a.episodes["shop"].held["backup"].since -= 118
    await a.tick()
    assert copies.paused() == set()
    assert metric(a, "promreflex_copy_guard_forced_resumes_total", site="shop") == 1


@pytest.mark.parametrize(("evaluation", "expected"), [("200ms", 0.2), ("30s", 30.0), ("1m", 60.0)])
def test_the_signal_carries_the_rules_evaluation_interval_and_a_sample_that_old_is_fresh(
        tmp_path: Path, evaluation: str, expected: float) -> None:
    """A stranger ran the rules in their own Prometheus (evaluation_interval 30 s) beside the
    snippets' 200 ms jobs: a served sample was "stale" 10 s after it was taken, and for the other
    20 s of each evaluation the throttle followed the alert's bit, cutting the copies of a shop
    that had gone quiet to 10 % (review R6). The query's evaluation term, on the shipped rules."""
    import re as re_mod
    import shutil
    import subprocess

    import yaml

    term = re_mod.search(r'label_replace\((120 / .*?), "promreflex_q", "evaluation"', action_mod.SIGNAL_QUERY)
    assert term is not None
    test = {"rule_files": [str(Path(action_mod.__file__).resolve().parents[2] / "rules" / "copy-guard.rules.yml")],
            "evaluation_interval": evaluation,
            "tests": [{"interval": "15s", "input_series": [
                {"series": 'promreflex_http_requests_total{job="accesslog", instance="a:1", site="shop", '
                           'status_class="2xx"}', "values": "0+150x15"},
                {"series": 'promreflex_copy_guard_rps_threshold{job="node", instance="n:1", site="shop"}',
                 "values": "10x15"}],
                "promql_expr_test": [{"expr": term.group(1), "eval_time": "3m",
                                      "exp_samples": [{"labels": '{site="shop"}', "value": expected}]}]}]}
    path = tmp_path / "evaluation.test.yml"
    path.write_text(yaml.safe_dump(test))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    sig = action_mod.parse_signals([{"metric": {"site": "shop", "promreflex_q": q}, "value": [0, str(v)]}
                                    for q, v in (("served", 0), ("threshold", 26), ("at", 1000.0),
                                                 ("evaluation", expected))])["shop"]
    assert sig.evaluation == expected
    assert sig.fresh(1000.0 + expected * 1.5) and not sig.fresh(1000.0 + max(10.0, 2 * expected) + 1)
