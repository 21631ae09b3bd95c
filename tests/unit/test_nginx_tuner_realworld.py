"""Real-world nginx layouts from an outside review (controllers.nginx_tuner): the value in
force, overrides that would hide an edit, configs that must not give a traceback, the
Keep-Alive header timeout, one-line configs, nginx's own quoting rules and shared snippets."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner import cli, config_edit
from controllers.nginx_tuner.action import RetuneNginx, RetuneParams
from controllers.nginx_tuner.config_edit import ConfigEditError, EditResult, Location, get_directive, set_directive
from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.nginx_ctl import ApplyResult, NginxControl, NginxError
from controllers.nginx_tuner.procfs import children, cmdline
from controllers.nginx_tuner.sweep import Measurement, Sweep, SweepSettings
from promreflex.proc import wait_until

HDR = "worker_processes 1;\npid logs/nginx.pid;\nerror_log logs/error.log;\nevents { worker_connections 64; }\n"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

INHERIT = HDR + """http {
    keepalive_timeout 20;
    server {
        listen 127.0.0.1:18101;
        server_name shop;
        location / { return 200 ok; }
    }
}
"""
SHADOW_SERVER = HDR + """http {
    keepalive_timeout 65;
    server {
        listen 127.0.0.1:18082;
        server_name shop;
        keepalive_timeout 10;
        location / { return 200 ok; }
    }
}
"""
LOCATION = HDR + """http {
    server {
        listen 127.0.0.1:18096;
        server_name shop;
        keepalive_timeout 65;
        location / {
            keepalive_timeout 15;
            return 200 ok;
        }
    }
}
"""
OTHER_VHOST = HDR + """http {
    server { listen 127.0.0.1:18097; server_name shop; keepalive_timeout 30; location / { return 200 ok; } }
    server { listen 127.0.0.1:18098; server_name blog; keepalive_timeout 5; }
}
"""
CERTBOT = """server {
    server_name shop.example.com;
    listen 127.0.0.1:18443;
    keepalive_timeout 20;
    location / { return 200 ok; }
}
server {
    if ($host = shop.example.com) { return 301 https://$host$request_uri; } # managed by Certbot
    listen 127.0.0.1:18084;
    server_name shop.example.com;
    return 404;
}
"""
UPSTREAM = HDR + """http {
    keepalive_timeout 65;
    upstream app { server 127.0.0.1:18999; keepalive 16; keepalive_timeout 60s; }
    server { listen 127.0.0.1:18095; server_name shop; location / { proxy_pass http://app; } }
}
"""


def write(tmp_path: Path, text: str, others: dict[str, str] | None = None) -> Path:
    """``nginx.conf`` with ``text`` (and other files by relative path) in ``tmp_path``."""
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    for name, body in (others or {}).items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(body)
    (tmp_path / "logs").mkdir(exist_ok=True)
    return conf


def nginx_t(conf: Path) -> subprocess.CompletedProcess[str]:
    assert NGINX is not None
    return subprocess.run([NGINX, "-t", "-q", "-c", str(conf), "-p", f"{conf.parent}/"], capture_output=True, text=True, check=False)


#: A stand-in for nginx's master, as far as the control sees one: its title, one worker, and a
#: reload (SIGHUP) that starts a new worker, then ends the old one; nginx reads its
#: configuration when a worker generation starts (NginxControl.loaded_at).
FAKE_MASTER = """
import os, signal, time
def worker():
    pid = os.fork()
    if pid == 0:
        os.execvp("bash", ["bash", "-c", 'exec -a "nginx: worker process" sleep 120'])
    return pid
current = [worker()]
def reload(*_):
    old, current[0] = current[0], worker()
    os.kill(old, signal.SIGKILL)
    os.waitpid(old, 0)
signal.signal(signal.SIGHUP, reload)
signal.signal(signal.SIGTERM, lambda *_: (os.kill(current[0], signal.SIGKILL), os._exit(0)))
end = time.monotonic() + 120
while time.monotonic() < end:
    time.sleep(1)
os.kill(current[0], signal.SIGKILL)
"""


@pytest.fixture
def fake_master(tmp_path: Path) -> Iterator[Path]:
    """A pid file naming a process that looks like an nginx master (see FAKE_MASTER)."""
    proc = subprocess.Popen(["bash", "-c", f'exec -a "nginx: master process" {sys.executable} -c "$0"', FAKE_MASTER])
    try:
        # startswith, not "in": bash's own command line (before its exec) holds the words too, and
        # a pid read mid-exec had an empty cmdline (a clean-clone CI run: "not a running nginx master").
        wait_until(lambda: cmdline(proc.pid).startswith("nginx: master process") and len(children(proc.pid)) == 1,
                   timeout=10, what="the fake master")
        pid_file = tmp_path / "fake.pid"
        pid_file.write_text(f"{proc.pid}\n")
        yield pid_file
    finally:
        proc.terminate()
        proc.wait()


def control(conf: Path, pid_file: Path, **kw: object) -> NginxControl:
    """A control whose ``nginx -t`` always passes (/bin/true) and whose health is fine, of a
    master that has just read ``conf`` as it is now (reloaded once: nginx reads its files when it
    starts, and a file changed after that is an edit a reload would make live)."""
    ctl = NginxControl(conf, conf.parent, "/bin/true", pid_path=pid_file, health_check=lambda: True,
                       reload_timeout=5.0, emerg_grace=0.1, health_timeout=0.5, **kw)  # type: ignore[arg-type]
    assert ctl.reload().ok
    return ctl


# ------------------------------------------------------------------ H2: the value in force


def test_current_value_is_inherited_from_http_for_a_named_server(tmp_path: Path) -> None:
    conf = write(tmp_path, INHERIT)
    ctl = NginxControl(conf, tmp_path, server_name="shop")
    assert cli._current(ctl) == 20.0  # not nginx's 75: the server inherits http's 20
    assert config_edit.effective_directive(conf, "keepalive_timeout", "shop") == Location(conf, 6, ("20",))
    assert get_directive(conf, "keepalive_timeout", "shop") is None  # (nothing set in the server itself)


def test_current_value_is_nginx_default_only_when_nothing_sets_it(tmp_path: Path) -> None:
    conf = write(tmp_path, HDR + "http {\n    server { listen 127.0.0.1:18099; server_name shop; }\n}\n")
    assert cli._current(NginxControl(conf, tmp_path, server_name="shop")) == 75.0
    conf.write_text(SHADOW_SERVER)
    assert cli._current(NginxControl(conf, tmp_path, server_name="shop")) == 10.0  # the server's own wins


async def test_the_inherited_value_is_published_at_start(tmp_path: Path) -> None:
    conf = write(tmp_path, INHERIT)
    reg = CollectorRegistry()
    action = RetuneNginx()
    action.route_params = [RetuneParams.model_validate({"nginx_config": str(conf), "server_name": "shop"})]
    await action.start({"registry": reg})
    assert reg.get_sample_value("promreflex_nginx_tuner_applied_keepalive_timeout_seconds") == 20


# ------------------------------------------------------------------ H1: overrides hide the edit


def test_http_level_apply_is_refused_when_a_server_sets_its_own(tmp_path: Path, fake_master: Path) -> None:
    conf = write(tmp_path, SHADOW_SERVER)
    before = conf.read_bytes()
    res = control(conf, fake_master).apply(30)
    assert (res.ok, res.stage, res.edit) == (False, "precheck", None)
    assert f"{conf}:10" in res.message and "--nginx.server-name" in res.message and "remove the override" in res.message
    assert conf.read_bytes() == before


def test_named_server_apply_is_refused_when_its_location_sets_its_own(tmp_path: Path, fake_master: Path) -> None:
    conf = write(tmp_path, LOCATION)
    before = conf.read_bytes()
    res = control(conf, fake_master, server_name="shop").apply(30)
    assert (res.ok, res.stage, res.edit) == (False, "precheck", None)
    assert f"{conf}:11" in res.message and "remove the override" in res.message
    assert conf.read_bytes() == before


def test_another_vhosts_own_value_does_not_block_a_named_server(tmp_path: Path) -> None:
    conf = write(tmp_path, OTHER_VHOST)
    config_edit.check_tunable(conf, "keepalive_timeout", "shop")  # blog's 5 is blog's business
    res = set_directive(conf, "keepalive_timeout", "12", server_name="shop", refuse_shadowed=True)
    assert res.changed and res.shadowed_by == ()
    with pytest.raises(config_edit.ShadowedError, match=rf"{conf}:7 .*--nginx.server-name"):
        config_edit.check_tunable(conf, "keepalive_timeout")  # http level: both servers override it


def test_tune_nginx_refuses_a_shadowed_http_edit_before_any_trial(tmp_path: Path) -> None:
    conf = write(tmp_path, SHADOW_SERVER)
    before = conf.read_bytes()
    said: list[str] = []
    p = argparse.ArgumentParser()
    cli.add_tune_arguments(p)
    args = p.parse_args(["--nginx.config", str(conf), "--nginx.pid-file", str(tmp_path / "none.pid"), "--mode", "active",
                         "--load.url", "http://127.0.0.1:9/", "--candidates", "5,10", "--repeats", "1",
                         "--results.dir", str(tmp_path / "results")])
    import asyncio

    assert asyncio.run(cli.run_tune(args, progress=said.append)) == 1
    assert len(said) == 1 and f"{conf}:10" in said[0] and "--nginx.server-name" in said[0]
    assert conf.read_bytes() == before and not (tmp_path / "results").exists()


async def test_sweep_does_not_measure_a_shadowed_edit() -> None:
    applied: list[int] = []

    def apply(value: int) -> ApplyResult:
        applied.append(value)
        edit = EditResult(Path("/x.conf"), 6, "keepalive_timeout", ("65",), (str(value),), False, True, None,
                          (Location(Path("/x.conf"), 10, ("10",)),), f"keepalive_timeout 65 -> {value}")
        return ApplyResult(True, str(value), "done", edit.message, edit=edit)

    async def measure(value: float) -> Measurement:
        raise AssertionError("a shadowed edit must not be measured")

    sweep = Sweep(SweepSettings(candidates=(5.0, 10.0), repeats=1), apply, measure, 65.0, progress=lambda _: None)
    res = await sweep.run()
    assert res.records and all(r.result == "apply_failed" and "/x.conf:10" in r.message for r in res.records)
    assert res.choice is None and not res.final_ok


async def test_retune_action_refuses_a_shadowed_config_without_a_trial(tmp_path: Path) -> None:
    from controllers.actions.base import ActionContext
    from controllers.models import Alert

    conf = write(tmp_path, SHADOW_SERVER)
    before = conf.read_bytes()
    reg = CollectorRegistry()
    action = RetuneNginx()
    await action.start({"registry": reg})
    p = RetuneParams.model_validate({"nginx_config": str(conf), "pid_file": str(tmp_path / "none.pid")})
    alert = Alert.model_validate({
        "status": "firing", "labels": {"alertname": "NginxResponseTimeHigh"}, "annotations": {},
        "startsAt": "2026-01-02T03:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "abc",
    })
    said = await action.fire(ActionContext("retune", alert, p, {}))
    assert said.startswith("tuning refused") and f"{conf}:10" in said
    assert reg.get_sample_value("promreflex_nginx_tuner_retunes_total", {"result": "failed"}) == 1
    assert not reg.get_sample_value("promreflex_nginx_tuner_trials_total", {"result": "apply_failed"})
    assert conf.read_bytes() == before


def test_upstream_keepalive_timeout_is_not_a_redefinition(tmp_path: Path) -> None:
    conf = write(tmp_path, UPSTREAM)
    res = set_directive(conf, "keepalive_timeout", "30")
    assert res.shadowed_by == () and "redefined" not in res.message


# ------------------------------------------------------------------ H3: no traceback


def test_ambiguous_server_name_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 65;\n    include sites-enabled/*;\n}\n", {"sites-enabled/shop": CERTBOT})
    p = argparse.ArgumentParser()
    cli.add_tune_arguments(p)
    args = p.parse_args(["--nginx.config", str(conf), "--nginx.prefix", str(tmp_path), "--nginx.server-name", "shop.example.com",
                         "--mode", "active", "--load.url", "http://127.0.0.1:9/", "--candidates", "5,10", "--repeats", "1",
                         "--results.dir", str(tmp_path / "results")])
    assert cli.cmd_tune(args) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "found 2" in text and "shop.example.com" in text and "Traceback" not in text


@pytest.mark.skipif(NGINX is None, reason="needs an nginx binary for nginx -t")
def test_apply_on_a_config_crossplane_cannot_read_is_a_precheck_failure(tmp_path: Path) -> None:
    conf = write(tmp_path, HDR.replace("pid logs/nginx.pid;\n", "") + "http {\n    include missing.conf;\n    keepalive_timeout 65;\n}\n")
    before = conf.read_bytes()
    ctl = NginxControl(conf, tmp_path, NGINX)  # the pid file's path has to come from the config
    res = ctl.apply(2)  # must not raise
    assert (res.ok, res.stage, res.edit) == (False, "precheck", None)
    assert "not touching the config" in res.message and "missing.conf" in res.message
    assert conf.read_bytes() == before


async def test_an_apply_that_raises_a_config_error_does_not_abort_the_sweep() -> None:
    def apply(value: int) -> ApplyResult:
        raise ConfigEditError("cannot parse /x.conf: No such file or directory: /missing.conf")

    async def measure(value: float) -> Measurement:
        raise AssertionError("nothing was applied")

    res = await Sweep(SweepSettings(candidates=(5.0, 10.0), repeats=1), apply, measure, None, progress=lambda _: None).run()
    assert res.records and all(r.result == "apply_failed" and "missing.conf" in r.message for r in res.records)
    assert res.choice is None


# ------------------------------------------------------------------ M4: the Keep-Alive header timeout


def test_header_timeout_is_lowered_with_the_timeout(tmp_path: Path, fake_master: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 65 60;\n    server { listen 127.0.0.1:18110; }\n}\n")

    def live(self: NginxControl, edit: EditResult, res: ApplyResult) -> None:  # nginx -t/reload/health: not the point here
        res.ok, res.stage, res.message = True, "done", edit.message

    monkeypatch.setattr(NginxControl, "_make_live", live)
    reg = CollectorRegistry()
    res = control(conf, fake_master, metrics=TunerMetrics([5, 10], registry=reg)).apply(5)
    assert res.ok and get_directive(conf, "keepalive_timeout").args == ("5", "5")
    assert "keepalive_timeout 5 5;" in conf.read_text()
    assert "Keep-Alive header timeout 60 was lowered to 5" in res.message
    res = control(conf, fake_master).apply(30)  # above the header value: it stays
    assert res.ok and get_directive(conf, "keepalive_timeout").args == ("30", "5")


def test_header_clamp_compares_times_not_strings(tmp_path: Path) -> None:
    conf = write(tmp_path, HDR + 'http {\n    keepalive_timeout 1m "65s";\n}\n')
    res = set_directive(conf, "keepalive_timeout", "30", clamp_header=True)
    assert res.new_args == ("30", "30") and "lowered" in res.message
    assert "keepalive_timeout 30 30;" in conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "2m", clamp_header=True)  # 30 s < 2 min: kept
    assert res.new_args == ("2m", "30") and "lowered" not in res.message


# ------------------------------------------------------------------ M1: http { on a line with another block


@pytest.mark.parametrize("text", [
    HDR.replace("events { worker_connections 64; }\n", "events { worker_connections 64; } http {\n")
    + "    server { listen 127.0.0.1:18092; }\n}\n",
    "worker_processes 1; pid logs/nginx.pid; error_log logs/error.log; events { worker_connections 64; } http { server "
    "{ listen 127.0.0.1:18091; location / { return 200 ok; } } }",
], ids=["sameline", "minified"])
def test_insert_lands_in_http_when_it_shares_a_line_with_events(tmp_path: Path, text: str) -> None:
    conf = write(tmp_path, text)
    res = set_directive(conf, "keepalive_timeout", "30")
    assert res.inserted and get_directive(conf, "keepalive_timeout").args == ("30",)
    assert "events { worker_connections 64; }" in conf.read_text()
    if NGINX is not None:
        assert nginx_t(conf).returncode == 0, nginx_t(conf).stderr


def test_verify_checks_the_parent_block_of_an_insert(tmp_path: Path) -> None:
    old = tmp_path / "old.conf"
    new = tmp_path / "new.conf"
    old.write_text("events { worker_connections 64; } http { gzip on; }\n")
    new.write_text("events { keepalive_timeout 30; worker_connections 64; } http { gzip on; }\n")
    with pytest.raises(ConfigEditError, match="did not give exactly the intended change"):
        config_edit._verify(old, new, "keepalive_timeout", None, ("30",), parent=2)  # http is entry 2
    new.write_text("events { worker_connections 64; } http { keepalive_timeout 30; gzip on; }\n")
    config_edit._verify(old, new, "keepalive_timeout", None, ("30",), parent=2)


# ------------------------------------------------------------------ M2: nginx's quoting rules


@pytest.mark.parametrize(("extra", "line"), [
    ("        location / { add_header X-Note don't; return 200 ok; }\n", "don't"),
    ("        location /lua {\n            content_by_lua_block {\n                -- don't touch: braces { in comments\n"
     "                local t = { a = \"}\" }\n                ngx.say(#t, 'ok')\n            }\n        }\n", "content_by_lua_block"),
], ids=["quote-in-word", "lua-comment"])
def test_configs_nginx_accepts_are_not_refused_by_the_tokenizer(tmp_path: Path, extra: str, line: str) -> None:
    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 65;\n    server {\n        listen 127.0.0.1:18089;\n" + extra + "    }\n}\n")
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "30")
    assert res.changed and conf.read_text() == before.replace("keepalive_timeout 65;", "keepalive_timeout 30;")
    assert line in conf.read_text()


def test_tokenizer_follows_nginx_quote_rules_and_skips_lua_bodies() -> None:
    toks = config_edit.tokenize("add_header X don't;\ncontent_by_lua_block {\n -- it's { here\n}\nreturn 200;")
    assert [t.text for t in toks if t.kind != "lua"] == ["add_header", "X", "don't", ";", "content_by_lua_block", ";", "return", "200", ";"]
    assert toks[-3].line == 5


@pytest.mark.parametrize(("value", "old", "new"), [
    ('"65"', ("65",), ("30",)),
    ('1m "65s"', ("1m", "65s"), ("30", "65s")),
], ids=["quoted", "units"])
def test_quoted_values_are_compared_unquoted(tmp_path: Path, value: str, old: tuple[str, ...], new: tuple[str, ...]) -> None:
    conf = write(tmp_path, HDR + f"http {{\n    keepalive_timeout {value};\n    server {{ listen 127.0.0.1:18087; }}\n}}\n")
    res = set_directive(conf, "keepalive_timeout", "30")
    assert (res.old_args, res.new_args) == (old, new)
    assert get_directive(conf, "keepalive_timeout").args == new


# ------------------------------------------------------------------ M3: shared snippets


def test_named_server_edit_of_a_shared_snippet_is_refused(tmp_path: Path) -> None:
    conf = write(tmp_path, HDR + "http {\n"
                 "    server { listen 127.0.0.1:18085; server_name a; include snippets/tuning.conf; }\n"
                 "    server { listen 127.0.0.1:18086; server_name b; include snippets/tuning.conf; }\n}\n",
                 {"snippets/tuning.conf": "keepalive_timeout 65;\nsend_timeout 30;\n"})
    snippet = tmp_path / "snippets" / "tuning.conf"
    before = snippet.read_bytes()
    with pytest.raises(ConfigEditError, match=rf"included 2 times \({conf}:6, {conf}:7\)"):
        set_directive(conf, "keepalive_timeout", "30", server_name="a")
    assert snippet.read_bytes() == before


@pytest.mark.parametrize("other", ["./snippets/tuning.conf", "linked/tuning.conf"])
def test_a_shared_snippet_spelled_two_ways_is_still_shared(tmp_path: Path, other: str) -> None:
    """crossplane reads a file once per spelling of its path: with ``./`` (or through a linked
    folder) in one site, the snippet passed as included once, and tuning server a rewrote
    server b's value at every trial (a review)."""
    (tmp_path / "snippets").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "snippets")
    conf = write(tmp_path, HDR + "http {\n"
                 "    server { listen 127.0.0.1:18085; server_name a; include snippets/tuning.conf; }\n"
                 f"    server {{ listen 127.0.0.1:18086; server_name b; include {other}; }}\n}}\n",
                 {"snippets/tuning.conf": "keepalive_timeout 65;\nsend_timeout 30;\n"})
    snippet = tmp_path / "snippets" / "tuning.conf"
    before = snippet.read_bytes()
    with pytest.raises(ConfigEditError, match="included 2 times"):
        set_directive(conf, "keepalive_timeout", "30", server_name="a")
    assert snippet.read_bytes() == before


# ------------------------------------------------------------------ L2: a pid file that is not there


def test_missing_pid_file_names_the_path_and_the_prefix(tmp_path: Path) -> None:
    conf = write(tmp_path, INHERIT)
    res = NginxControl(conf, tmp_path / "wrong-prefix").apply(30)
    assert res.stage == "precheck" and str(tmp_path / "wrong-prefix" / "logs" / "nginx.pid") in res.message
    assert "--nginx.prefix" in res.message


# ------------------------------------------------------------------ M5 (part): a Lua long string with braces


def test_a_definition_misread_into_a_bogus_block_is_refused_not_inserted_twice(tmp_path: Path) -> None:
    """crossplane's Lua lexer counts braces inside Lua long strings (``[[ } { ]]``): what follows
    lands in a block that does not exist. The tuner refuses rather than report the value absent
    and insert a second one."""
    conf = write(tmp_path, HDR + """http {
    init_by_lua_block {
        local s = [[
          multi-line } long string {
        ]]
        local n = #s -- length { of s
    }
    server {
        listen 127.0.0.1:18111;
        location / { content_by_lua_block { ngx.say("}") } }
    }
    keepalive_timeout 65;
}
""")
    before = conf.read_bytes()
    with pytest.raises(ConfigEditError, match=rf"{conf}:16 \(inside 'long'\).*misread"):
        set_directive(conf, "keepalive_timeout", "30")
    with pytest.raises(ConfigEditError, match="misread"):
        cli._current(NginxControl(conf, tmp_path))
    assert conf.read_bytes() == before


# ------------------------------------------------------------------ H2 (second review): the header ratchet

HEADER_CONF = HDR + "http {\n    keepalive_timeout 65 60;\n    server { listen 127.0.0.1:18111; }\n}\n"


def _line(conf: Path) -> str:
    return next(ln.strip() for ln in conf.read_text().splitlines() if "keepalive_timeout" in ln)


def test_a_lowered_header_comes_back_with_a_later_higher_value(tmp_path: Path, fake_master: Path) -> None:
    """65 60 -> 30 -> 75 ends 75 60 (it ended 75 30: the admin's 60 was lost for good), and
    going back to 65 writes the original line again."""
    conf = write(tmp_path, HEADER_CONF)
    original = conf.read_text()
    ctl = control(conf, fake_master)
    res = ctl.apply(30)
    assert res.ok and _line(conf) == "keepalive_timeout 30 30;" and "60 was lowered to 30" in res.message
    res = ctl.apply(75)
    assert res.ok and _line(conf) == "keepalive_timeout 75 60;", res.message
    assert "set back to 60" in res.message
    res = ctl.apply(45)  # from 75 60: lowered against the admin's 60, not a trial's
    assert res.ok and _line(conf) == "keepalive_timeout 45 45;"
    res = ctl.apply(65)
    assert res.ok and conf.read_text() == original


def test_set_directive_writes_the_original_header_clamped(tmp_path: Path) -> None:
    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 30 30;\n}\n")
    res = set_directive(conf, "keepalive_timeout", "75", clamp_header=True, original_rest=("60",))
    assert res.new_args == ("75", "60") and _line(conf) == "keepalive_timeout 75 60;"
    res = set_directive(conf, "keepalive_timeout", "30", clamp_header=True, original_rest=("60",))
    assert res.new_args == ("30", "30") and _line(conf) == "keepalive_timeout 30 30;"
    res = set_directive(conf, "keepalive_timeout", "65", clamp_header=True, original_rest=())  # no header configured
    assert res.new_args == ("65",) and _line(conf) == "keepalive_timeout 65;"


def _steady(values: dict[float, tuple[float, float]], seen: dict[float, list[str]], conf: Path, bad: float | None = None):  # noqa: ANN202
    """A measure recording the line each value ran with; ``values``: value -> (seconds, bytes)."""
    n = {"i": 0}

    async def measure(value: float) -> Measurement:
        seen.setdefault(value, []).append(_line(conf))
        n["i"] += 1
        rt, mem = values[value]
        jitter = 1 + 0.001 * (n["i"] % 3)
        return Measurement(rt * jitter, rt * 2, mem * jitter, "pss", 100, 50 if value == bad else 0)

    return measure


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
async def test_sweep_without_journal_measures_each_value_with_its_own_header_and_restores_65_60(
    tmp_path: Path, fake_master: Path, seed: int
) -> None:
    """Whatever the trial order, 75 runs with 75 60 (not 75 30 after a trial at 30), and the
    restore after 30's errors (no journal: the last good value applied again) writes 65 60."""
    conf = write(tmp_path, HEADER_CONF)
    original = conf.read_text()
    seen: dict[float, list[str]] = {}
    measure = _steady({30.0: (0.001, 1e6), 65.0: (0.002, 2e6), 75.0: (0.003, 3e6)}, seen, conf, bad=30.0)
    settings = SweepSettings(candidates=(30.0, 75.0), repeats=3, seed=seed)
    result = await Sweep(settings, control(conf, fake_master).apply, measure, 65.0, progress=lambda _: None).run()
    assert seen[30.0] == ["keepalive_timeout 30 30;"]
    assert set(seen[75.0]) == {"keepalive_timeout 75 60;"}
    assert set(seen[65.0]) == {"keepalive_timeout 65 60;"}
    assert result.final_ok and result.choice is not None and result.choice.value == 65.0, result.final
    assert conf.read_text() == original


@pytest.mark.parametrize("seed", [0, 1])
async def test_sweep_with_journal_applies_its_choice_with_the_original_header(
    tmp_path: Path, fake_master: Path, seed: int
) -> None:
    conf = write(tmp_path, HEADER_CONF)
    seen: dict[float, list[str]] = {}
    measure = _steady({30.0: (0.003, 3e6), 65.0: (0.002, 2e6), 75.0: (0.001, 1e6)}, seen, conf)
    ctl = control(conf, fake_master)
    settings = SweepSettings(candidates=(30.0, 75.0), repeats=3, seed=seed)
    result = await Sweep(settings, ctl.apply, measure, 65.0, progress=lambda _: None, journal=ctl).run()
    assert set(seen[30.0]) == {"keepalive_timeout 30 30;"} and set(seen[75.0]) == {"keepalive_timeout 75 60;"}
    assert set(seen[65.0]) == {"keepalive_timeout 65 60;"}
    assert result.final_ok and result.choice is not None and result.choice.value == 75.0, result.final
    assert _line(conf) == "keepalive_timeout 75 60;" and not ctl.journal_path.exists()


def test_a_control_restarted_mid_sweep_takes_the_header_from_the_journal(tmp_path: Path, fake_master: Path) -> None:
    """Killed after a trial at 30 (the file holds 30 30): the restarted controller's next value
    gets the admin's 60 from the journal, not the trial's 30, and the restore is the original text."""
    import json

    conf = write(tmp_path, HEADER_CONF)
    original = conf.read_text()
    first = control(conf, fake_master)
    first.begin_sweep()
    assert json.loads(first.journal_path.read_text())["rest"] == ["60"]
    assert first.apply(30).ok and _line(conf) == "keepalive_timeout 30 30;"
    first._sweep_unlock()  # killed: the kernel releases its sweep lock with the process
    again = control(conf, fake_master)  # restarted: nothing in memory
    res = again.apply(75)
    assert res.ok and _line(conf) == "keepalive_timeout 75 60;", res.message
    said = again.restore_original()
    assert said.endswith("and live") and conf.read_text() == original
    assert not again.journal_path.exists()


def test_tune_nginx_names_every_bad_flag_before_touching_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's review: a typo'd --nginx.binary started the sweep, wrote its journal and
    ended in a traceback; --confidence 2, --load.users 0, --nginx.reload-timeout 0 or an ftp://
    URL started sweeps on the live nginx. All are named at once, exit 2, nothing touched."""
    import asyncio
    import socket

    conf = write(tmp_path, SHADOW_SERVER)
    before = conf.read_bytes()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    p = argparse.ArgumentParser()
    cli.add_tune_arguments(p)
    args = p.parse_args(["--nginx.config", str(conf), "--nginx.pid-file", str(tmp_path / "none.pid"), "--mode", "active",
                         "--load.url", "ftp://127.0.0.1/", "--nginx.binary", "/nonexistent/nginx", "--confidence", "2",
                         "--load.users", "0", "--nginx.reload-timeout", "0s", "--load.think-min", "10s", "--load.think-max", "8s",
                         "--web.listen-address", f"127.0.0.1:{taken.getsockname()[1]}", "--results.dir", str(tmp_path / "results")])
    try:
        assert asyncio.run(cli.run_tune(args)) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    for flag in ("--nginx.binary", "--confidence", "--load.users", "--nginx.reload-timeout", "--load.url ftp://",
                 "--load.think-min", "--web.listen-address"):
        assert flag in err, (flag, err)
    assert conf.read_bytes() == before and not (tmp_path / ".promreflex-backup").exists()
    assert not (tmp_path / "results").exists()
    from controllers.nginx_tuner.nginx_ctl import NginxControl

    ok, msg = NginxControl(conf, tmp_path, "/nonexistent/nginx").test()  # never a traceback
    assert not ok and "cannot run /nonexistent/nginx" in msg


def test_a_second_run_while_a_sweep_runs_is_refused_and_recovers_nothing(tmp_path: Path, fake_master: Path) -> None:
    """Two tune-nginx runs on one nginx: the second took the first's live journal for an
    interrupted sweep's, put the original back mid-trial, and the two sweeps then measured each
    other's values (a review). It is refused, naming the first; once the first is gone (its lock
    goes with its process), a journal it left is recovered as before."""
    conf = write(tmp_path, HEADER_CONF)
    first = control(conf, fake_master)
    first.begin_sweep()
    assert first.apply(30).ok and _line(conf) == "keepalive_timeout 30 30;"
    second = control(conf, fake_master)
    with pytest.raises(NginxError, match=r"a sweep of this configuration runs \(pid \d+"):
        second.recover()
    with pytest.raises(NginxError, match="a sweep of this configuration runs"):
        second.begin_sweep()
    assert _line(conf) == "keepalive_timeout 30 30;"  # the first's trial untouched
    first._sweep_unlock()  # the first process dies
    assert "put back" in second.recover()


def test_a_server_that_inherits_the_header_gets_it_lowered_with_its_value(tmp_path: Path, fake_master: Path) -> None:
    """http sets ``keepalive_timeout 65 60``; server shop sets none. Its trial line had one
    argument, so nginx kept the inherited Keep-Alive header: clients were told timeout=60 while
    the connection closed at 20 s (a review). The header comes with the value, lowered to it."""
    from controllers.nginx_tuner.config_edit import get_directive

    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 65 60;\n"
                 "    server { listen 127.0.0.1:18112; server_name shop; }\n}\n")
    ctl = control(conf, fake_master, server_name="shop")
    assert ctl.apply(20).ok
    assert get_directive(conf, "keepalive_timeout", "shop").args == ("20", "20")
    assert ctl.apply(75).ok
    assert get_directive(conf, "keepalive_timeout", "shop").args == ("75", "60")
    assert get_directive(conf, "keepalive_timeout", None).args == ("65", "60")  # http untouched


def test_a_master_running_another_configuration_is_not_reloaded(tmp_path: Path) -> None:
    """A copy of a configuration (a checkout, a staging copy) whose pid path is the live one's:
    the tuner reloaded the live nginx, measured nothing of its own, and made the live nginx's
    pending edits live (a review). The master's title names its -c: another file is refused."""
    conf = write(tmp_path, INHERIT)
    before = conf.read_bytes()
    live = tmp_path / "live" / "nginx.conf"
    live.parent.mkdir()
    live.write_text(INHERIT)
    title = f"nginx: master process /usr/sbin/nginx -c {live}"
    proc = subprocess.Popen(["bash", "-c", f'exec -a "{title}" {sys.executable} -c "$0"', FAKE_MASTER])
    try:
        wait_until(lambda: cmdline(proc.pid).startswith(title) and len(children(proc.pid)) == 1,
                   timeout=10, what="the fake master")
        pid_file = tmp_path / "fake.pid"
        pid_file.write_text(f"{proc.pid}\n")
        ctl = NginxControl(conf, conf.parent, "/bin/true", pid_path=pid_file, health_check=lambda: True,
                           reload_timeout=5.0, emerg_grace=0.1, health_timeout=0.5)
        res = ctl.apply(30)
        assert not res.ok and res.stage == "precheck", res
        assert f"runs {live}, not {conf}" in res.message
        assert conf.read_bytes() == before
    finally:
        proc.terminate()
        proc.wait()


def test_tune_nginx_says_when_the_load_may_reach_another_server(tmp_path: Path) -> None:
    """Name-based servers on one port: a load URL by address reaches the port's default server;
    the tuned server got no request and the sweep still decided (a review). Said at the start."""
    import asyncio

    conf = write(tmp_path, HDR + "http {\n    keepalive_timeout 65;\n"
                 "    server { listen 127.0.0.1:9 default_server; server_name blog; }\n"
                 "    server { listen 127.0.0.1:9; server_name shop; }\n}\n")
    said: list[str] = []
    p = argparse.ArgumentParser()
    cli.add_tune_arguments(p)
    args = p.parse_args(["--nginx.config", str(conf), "--nginx.pid-file", str(tmp_path / "none.pid"), "--mode", "active",
                         "--nginx.server-name", "shop", "--load.url", "http://127.0.0.1:9/", "--candidates", "5,10",
                         "--repeats", "1", "--results.dir", str(tmp_path / "results")])
    with pytest.raises(NginxError, match="not starting the sweep"):  # (no nginx runs here)
        asyncio.run(cli.run_tune(args, progress=said.append))
    assert any("the load URL's host 127.0.0.1 is not shop" in line for line in said), said


def test_a_sweep_that_cannot_start_leaves_no_lock(tmp_path: Path, fake_master: Path, monkeypatch) -> None:
    """A journal that cannot be written (a full disk): the sweep lock stayed held by a control no
    one used, and the engine's retries were refused as "a sweep runs (pid <own pid>)" (a review)."""
    import controllers.nginx_tuner.nginx_ctl as nginx_ctl

    conf = write(tmp_path, HEADER_CONF)
    first = control(conf, fake_master)
    real = nginx_ctl.atomic_write_text

    def full(path, *a, **kw):
        if Path(path).name == "sweep.json":
            raise OSError(28, "No space left on device")
        return real(path, *a, **kw)

    monkeypatch.setattr(nginx_ctl, "atomic_write_text", full)
    with pytest.raises(OSError, match="No space"):
        first.begin_sweep()
    monkeypatch.setattr(nginx_ctl, "atomic_write_text", real)
    again = control(conf, fake_master)
    again.begin_sweep()  # not refused
    again.end_sweep()
