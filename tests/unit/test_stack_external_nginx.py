"""``stack.nginx.external``: the local stack guards an nginx that already runs (issue 16): it
starts no nginx, scrapes the given stub_status and follows the given access log; the keys are
validated with the rest of the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from promreflex.config import ConfigError, load_config
from promreflex.stack import Stack


def _cfg(tmp_path: Path, nginx: dict, **stack: object):
    f = tmp_path / "promreflex.yml"
    f.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state"), "nginx": nginx, **stack}}))
    return load_config(f)


def test_external_nginx_is_not_started_and_its_sources_are_used(tmp_path):
    cfg = _cfg(tmp_path, {"external": True, "stub_status_url": "http://127.0.0.1:18480/nginx_status",
                          "access_log": "/var/log/nginx/promreflex-shop.log"})
    stack = Stack(cfg)
    names = [p.name for p in stack.processes]
    assert "nginx" not in names and "nginx_exporter" in names and "accesslog_exporter" in names
    argv = {c.name: c.argv for c in stack.components()}
    assert "-nginx.scrape-uri=http://127.0.0.1:18480/nginx_status" in argv["nginx_exporter"]
    assert any(a == "--log=shop=/var/log/nginx/promreflex-shop.log:nginx_timed" for a in argv["accesslog_exporter"])
    assert "nginx/nginx.conf" not in stack.files()  # nothing rendered for an nginx we do not run
    assert stack.site_url == "http://127.0.0.1:18480/" and stack.urls["nginx"] == stack.site_url
    assert stack.nginx_access_log == Path("/var/log/nginx/promreflex-shop.log")
    # an exporter that fails at start names the URL and the key it came from
    assert "http://127.0.0.1:18480/nginx_status (stack.nginx.stub_status_url)" in stack._start_hint("nginx_exporter")
    # the preflight port check covers only what the stack starts: the own nginx's ports are not ours
    ports = {name for p in stack.processes for name in p.ports}
    assert "nginx" not in ports and "nginx_stub_status" not in ports


def test_external_nginx_url_overrides_the_stub_status_origin(tmp_path):
    cfg = _cfg(tmp_path, {"external": True, "url": "https://shop.example/store/",
                          "stub_status_url": "http://127.0.0.1:81/status", "access_log": "/x/a.log"})
    assert Stack(cfg).site_url == "https://shop.example/store/"


def test_own_nginx_by_default(tmp_path):
    stack = Stack(_cfg(tmp_path, {}))
    assert "nginx" in [p.name for p in stack.processes]
    assert stack.site_url == stack.url("nginx") + "/"
    assert stack.nginx_access_log == stack.dir / "nginx" / "access.log"
    assert any("stub_status" in a for c in stack.components() if c.name == "nginx_exporter" for a in c.argv)


@pytest.mark.parametrize(("nginx", "extra", "problem"), [
    ({"external": True}, {}, "stack.nginx: external: true needs stub_status_url and access_log"),
    ({"external": True, "stub_status_url": "http://127.0.0.1:1/s", "access_log": "rel.log"}, {}, "must be an absolute path"),
    ({"external": True, "stub_status_url": "ftp://x/s", "access_log": "/a.log"}, {}, "stack.nginx.stub_status_url"),
    ({"access_log": "/a.log"}, {}, "only apply with external: true"),
    ({"external": True, "stub_status_url": "http://127.0.0.1:1/s", "access_log": "/a.log"}, {"upstream": "127.0.0.1:9"},
     "upstream configures the stack's own nginx"),
    ({"externel": True}, {}, "stack.nginx.externel"),
])
def test_bad_external_configuration_names_the_key(tmp_path, nginx, extra, problem):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, nginx, **extra)
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_stack_status_shows_the_ports_the_stack_started_on(tmp_path, capsys, monkeypatch):
    """`stack status` without the config file the stack was started with (other ports) must
    show where the components really answer: the URLs recorded at start, not the defaults."""
    import os
    import sys
    from types import SimpleNamespace

    from promreflex.cli import cmd_stack_status
    from promreflex.fsutil import atomic_write_json

    cfg = _cfg(tmp_path, {})
    stack = Stack(cfg)
    stack.dir.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "argv0": sys.executable, "port": 19090, "log": "", "url": "http://127.0.0.1:19090"}
    atomic_write_json(stack.pids_file, {"components": {"prometheus": me}})
    assert stack.urls["prometheus"] != me["url"]  # the config (defaults) says another port
    args = SimpleNamespace(config_file=None, state_dir=None, capabilities=None)
    monkeypatch.setattr("promreflex.cli._load", lambda _args: cfg)
    assert cmd_stack_status(args) == 0
    assert "http://127.0.0.1:19090" in capsys.readouterr().out


def test_stack_reload_says_which_routes_the_controller_added_changed_and_removed(tmp_path):
    """A route list that replaces the defaults drops the routes it does not name: `stack reload`
    reads the controller's own `reload` audit record (written after the offset it noted before
    the SIGHUP) and says so, or says why the controller kept its old routes."""
    import json

    stack = Stack(_cfg(tmp_path, {}))
    stack.audit_log.parent.mkdir(parents=True, exist_ok=True)
    old = json.dumps({"event": "reload", "result": "ok", "added": ["stale"], "changed": [], "removed": [], "routes": []})
    stack.audit_log.write_text(old + "\n")
    offset = stack.audit_log.stat().st_size
    with stack.audit_log.open("a") as f:
        f.write("not json\n")
        f.write(json.dumps({"event": "alert", "route": "x"}) + "\n")
        f.write(json.dumps({"event": "reload", "result": "ok", "added": [], "changed": ["copy-guard"],
                            "removed": ["mesh-rca", "selftest-log"], "routes": ["copy-guard"]}) + "\n")
    out = stack._reload_outcome(offset, timeout=1)
    assert "changed copy-guard" in out and "removed mesh-rca, selftest-log" in out and "stale" not in out
    assert "(now 1)" in out
    offset = stack.audit_log.stat().st_size
    with stack.audit_log.open("a") as f:
        f.write(json.dumps({"event": "reload", "result": "error", "error": "controller.routes[0]: bad"}) + "\n")
    assert "kept its routes: controller.routes[0]: bad" in stack._reload_outcome(offset, timeout=1)
    assert "did not report" in stack._reload_outcome(stack.audit_log.stat().st_size, timeout=0.3)


def test_a_log_in_another_format_is_named_at_stack_up(tmp_path):
    from exporters.accesslog.preflight import foreign_last_line

    combined = '127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "curl/7.88"\n'
    timed = combined.rstrip("\n") + ' rt=0.001 urt="-"\n'
    log = tmp_path / "access.log"
    log.write_text(combined * 3)
    assert foreign_last_line(log) == combined.strip()
    log.write_text(combined * 3 + timed)  # ours among others: the exporter counts those
    assert foreign_last_line(log) is None
    log.write_text("")
    assert foreign_last_line(log) is None
    assert foreign_last_line(tmp_path / "missing.log") is None

    log.write_text(combined)
    shown: list[str] = []
    stack = Stack(load_config(None, {"stack.state_dir": str(tmp_path / "state"), "stack.nginx.external": True,
                                     "stack.nginx.url": "http://127.0.0.1:9/",
                                     "stack.nginx.stub_status_url": "http://127.0.0.1:9/nginx_status",
                                     "stack.nginx.access_log": str(log)}))
    for cap in stack.capabilities:
        for check in cap.preflight:
            shown += check(stack.context())
    assert len(shown) == 1 and "promreflex format" in shown[0] and str(log) in shown[0]


def test_each_component_needs_its_own_port_but_an_unused_nginx_port_is_free(tmp_path):
    with pytest.raises(ConfigError, match=r"shared: 9090 \(prometheus, controller\)"):
        load_config(None, {"stack.ports.controller": 9090})
    ext = {"stack.nginx.external": True, "stack.nginx.url": "http://127.0.0.1:9/",
           "stack.nginx.stub_status_url": "http://127.0.0.1:9/nginx_status",
           "stack.nginx.access_log": str(tmp_path / "a.log")}
    # with an external nginx the stack's own nginx ports are not listened on: 8080 may be reused
    assert load_config(None, {**ext, "stack.ports.accesslog_exporter": 8080}).stack.ports.accesslog_exporter == 8080
    with pytest.raises(ConfigError, match="shared"):
        load_config(None, {"stack.ports.accesslog_exporter": 8080})



def test_a_recorded_name_that_is_no_component_any_more_is_not_dead(tmp_path):
    """A record left by another configuration (the stack's own nginx, now external) kept a
    component NOT RUNNING for ever, and `stack restart` raised StopIteration on it."""
    import json

    stack = Stack(load_config(None, {"stack.state_dir": str(tmp_path)}))
    gone = {"pid": 999999999, "argv0": "/bin/false", "port": 1}
    (tmp_path / "pids.json").write_text(json.dumps({"components": {"ghost": gone, "prometheus": gone}}))
    assert stack.dead() == ["prometheus"]


def test_stack_reload_refuses_a_route_the_controller_would_refuse_before_touching_anything(tmp_path, capsys,
                                                                                          monkeypatch):
    """A newcomer's review: `stack reload` of a file with `min_pause: 5 seconds` SIGHUPed
    Prometheus and Alertmanager, said "reloaded", exited 0 (the controller kept its routes).
    Now it checks the routes as check-config does, first: exit 1 naming the param, nothing signalled."""
    from promreflex.cli import main

    f = tmp_path / "promreflex.yml"
    f.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state")}, "controller": {"routes": [
        {"name": "copy-guard", "matchers": ['alertname="CopyGuardSiteOverloaded"'], "action": "copy-guard",
         "params": {"mode": "pause", "min_pause": "5 seconds"}}]}}))
    signalled: list[object] = []
    monkeypatch.setattr(Stack, "running", lambda self: {"prometheus": 1, "alertmanager": 2, "controller": 3})
    monkeypatch.setattr(Stack, "render", lambda self: signalled.append("render"))
    monkeypatch.setattr("os.kill", lambda pid, sig: signalled.append((pid, sig)))
    assert main(["stack", "reload", "--config.file", str(f)]) == 1
    err = capsys.readouterr().err
    assert "nothing reloaded" in err and "min_pause" in err and signalled == []


def test_stack_reload_does_not_check_the_webhook_token_file_the_stack_replaces(tmp_path, capsys, monkeypatch):
    """The stack runs its controller with a token file of its own: the user's controller.token_file
    (missing here) must not refuse every reload (a stranger's review of the check above)."""
    from promreflex.cli import main

    f = tmp_path / "promreflex.yml"
    f.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state")},
                                 "controller": {"token_file": str(tmp_path / "missing-token")}}))
    signalled: list[object] = []
    monkeypatch.setattr(Stack, "running", lambda self: {"prometheus": 1, "alertmanager": 2, "controller": 3})
    monkeypatch.setattr(Stack, "render", lambda self: signalled.append("render"))
    monkeypatch.setattr(Stack, "_reload_outcome", lambda self, offset, timeout=10.0: "  controller routes: -")
    monkeypatch.setattr("os.kill", lambda pid, sig: signalled.append((pid, sig)))
    assert main(["stack", "reload", "--config.file", str(f)]) == 0, capsys.readouterr().err
    assert signalled[0] == "render" and len(signalled) == 4
