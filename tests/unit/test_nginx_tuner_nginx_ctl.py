"""NginxControl without a running nginx (controllers.nginx_tuner.nginx_ctl): refusals and parsing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.nginx_ctl import NginxControl, NginxError, nginx_seconds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nginx"


@pytest.mark.parametrize(("text", "seconds"), [("75", 75), ("75s", 75), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600)])
def test_nginx_seconds(text: str, seconds: float) -> None:
    assert nginx_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "-1"])
def test_nginx_seconds_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        nginx_seconds(text)


def test_apply_without_a_running_master_touches_nothing(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "simple", tmp_path / "simple")
    conf = tmp_path / "simple" / "nginx.conf"
    before = conf.read_bytes()
    reg = CollectorRegistry()
    ctl = NginxControl(conf, tmp_path, pid_path=tmp_path / "missing.pid", metrics=TunerMetrics([5, 10], registry=reg))
    res = ctl.apply(10)
    assert (res.ok, res.stage, res.rolled_back, res.edit) == (False, "precheck", False, None)
    assert "not touching the config" in res.message and "missing.pid" in res.message
    assert conf.read_bytes() == before
    assert reg.get_sample_value("promreflex_nginx_tuner_state", {"state": "idle"}) == 1
    with pytest.raises(NginxError):
        ctl.master_pid()


def test_stale_pid_file_is_not_taken_for_a_master(tmp_path: Path) -> None:
    pid_file = tmp_path / "nginx.pid"
    pid_file.write_text("1\n")  # pid 1 exists but is no nginx master
    ctl = NginxControl(FIXTURES / "simple" / "nginx.conf", tmp_path, pid_path=pid_file)
    with pytest.raises(NginxError, match="not a running nginx master"):
        ctl.master_pid()


def test_pid_and_error_log_paths_come_from_the_config(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text("pid run/n.pid;\nerror_log stderr;\nerror_log logs/e.log warn;\nevents {}\nhttp {}\n")
    ctl = NginxControl(conf, tmp_path / "prefix")
    assert ctl.pid_path == tmp_path / "prefix" / "run" / "n.pid"
    assert ctl.error_log == tmp_path / "prefix" / "logs" / "e.log"


@pytest.mark.parametrize("plant", ["names another file", "mode 0644", "a link"])
def test_a_sweep_journal_someone_else_could_have_written_is_not_trusted(tmp_path: Path, plant: str) -> None:
    """Recovery writes the journal's text, as the controller's user (root), to the file it
    names: a journal planted in a config directory a deploy user can write (naming
    /root/.ssh/authorized_keys, say) must not be followed."""
    import json
    import os

    shutil.copytree(FIXTURES / "simple", tmp_path / "simple")
    conf = tmp_path / "simple" / "nginx.conf"
    ctl = NginxControl(conf, tmp_path / "simple", pid_path=tmp_path / "none.pid")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    ctl.backup_dir.mkdir(mode=0o700)
    record = {"file": str(victim if plant == "names another file" else conf), "content": "owned\n", "started": 0}
    if plant == "a link":
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps(record))
        os.chmod(elsewhere, 0o600)
        ctl.journal_path.symlink_to(elsewhere)
    else:
        ctl.journal_path.write_text(json.dumps(record))
        os.chmod(ctl.journal_path, 0o644 if plant == "mode 0644" else 0o600)
    before = conf.read_text()
    with pytest.raises(NginxError, match="sweep journal"):
        ctl.recover()
    assert victim.read_text() == "precious\n" and conf.read_text() == before


def test_recovery_leaves_a_value_the_sweep_did_not_write(tmp_path: Path) -> None:
    """A controller killed mid-sweep, then the operator sets the value they want on the tuned
    line and reloads, before it restarts: recovery leaves it (the journal holds the hashes of the
    texts the sweep wrote; a stranger's review: the operator's value was put back and reloaded),
    and keeps the pre-sweep text aside; a text the sweep did write is put back."""
    shutil.copytree(FIXTURES / "simple", tmp_path / "simple")
    conf = tmp_path / "simple" / "nginx.conf"
    ctl = NginxControl(conf, tmp_path / "simple", pid_path=tmp_path / "none.pid")
    ctl._precheck = lambda: ""  # type: ignore[method-assign]  # (no nginx here: the journal is what is tested)
    original = conf.read_text()
    ctl.begin_sweep()
    trial = original.replace("keepalive_timeout 65 60;", "keepalive_timeout 33 33;")
    ctl._note_written(conf, trial)  # what apply() does before it writes a trial's text
    conf.write_text(trial)
    said = ctl.recover()
    assert "put back" in said and "nginx is not running" in said and conf.read_text() == original
    kept = next(ctl.backup_dir.glob("*.at-recovery-*"))
    assert kept.read_text() == trial and str(kept) in said
    ctl.begin_sweep()
    deliberate = original.replace("keepalive_timeout 65 60;", "keepalive_timeout 30 30;")
    conf.write_text(deliberate)  # the operator's, never written by the sweep
    said = ctl.recover()
    assert "left as it is" in said and conf.read_text() == deliberate and not ctl.journal_path.exists()


@pytest.mark.parametrize(("after", "trial"), [
    ("http {\n    keepalive_timeout 7;\n}\n", True),  # a trial's value
    ("http {\n    keepalive_timeout 7 7;  # kept\n}\n", True),
    ("http {\n    keepalive_timeout 65;\n    keepalive_timeout 7;  # inserted\n}\n", True),
    ("http { keepalive_timeout 7; }\n", False),  # more than the line (two lines joined)
    ("http {\n    keepalive_timeout 7;\n    gzip on;\n}\n", False),  # and a deployment
    ("http {\n    keepalive_timeout 65;\n    gzip on;\n}\n", False),  # a deployment alone
    ("http {\n    send_timeout 7;\n}\n", False),  # another directive's line
    ("http {\n    keepalive_timeout_x 7;\n}\n", False),
])
def test_what_a_trial_leaves_is_told_from_a_deployment(after: str, trial: bool) -> None:
    from controllers.nginx_tuner.nginx_ctl import edit_only_differs

    assert edit_only_differs("http {\n    keepalive_timeout 65;\n}\n", after, "keepalive_timeout") is trial


def test_the_health_probe_says_why_and_takes_a_self_signed_certificate(tmp_path: Path) -> None:
    """A stranger's review: an https:// health URL with a self-signed certificate (or a real one
    reached as https://127.0.0.1) made every trial "the health check already fails", the reason
    (certificate verify failed) never shown, while the load generator, which does not verify,
    would have worked."""
    import http.server
    import ssl
    import subprocess
    import threading

    from controllers.nginx_tuner.nginx_ctl import probe
    from promreflex.proc import free_port

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=shop.example"], check=True, capture_output=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        assert probe(url + "/") == ""
        assert probe(url + "/missing") == f"{url}/missing answered HTTP 404"
        refused = f"http://127.0.0.1:{free_port()}/"
        assert probe(refused).startswith(refused) and "refused" in probe(refused).lower()
    finally:
        server.shutdown()
        server.server_close()


def test_another_scopes_unfinished_sweep_is_named_as_such(tmp_path: Path) -> None:
    """A stranger's review: a journal left by a sweep of one server made a run for another scope
    of the same configuration say the journal was "not trusted" and to remove it (which throws
    that server's recovery away). It is that scope's to put back, and said so."""
    import json
    import os

    (tmp_path / "conf.d").mkdir()
    shop = tmp_path / "conf.d" / "shop.conf"
    shop.write_text("server {\n    listen 8080;\n    server_name shop;\n    keepalive_timeout 7;\n}\n")
    conf = tmp_path / "nginx.conf"
    conf.write_text("events {}\nhttp {\n    keepalive_timeout 65;\n    include conf.d/*.conf;\n}\n")
    ctl = NginxControl(conf, tmp_path, pid_path=tmp_path / "none.pid")
    ctl.backup_dir.mkdir(mode=0o700)
    original = shop.read_text().replace("keepalive_timeout 7;", "keepalive_timeout 30;")  # 7: a trial's
    ctl.journal_path.write_text(json.dumps({"file": str(shop), "content": original, "started": 0}))
    os.chmod(ctl.journal_path, 0o600)
    with pytest.raises(NginxError, match=r"a sweep of .*shop.conf \(another scope of this configuration\) did not end"):
        ctl.recover()
    assert ctl.journal_path.exists() and "keepalive_timeout 7;" in shop.read_text()
    said = NginxControl(conf, tmp_path, pid_path=tmp_path / "none.pid", server_name="shop").recover()
    assert "put back" in said and shop.read_text() == original


def test_putting_the_pre_sweep_file_back_in_a_globbed_folder_reloads_it(tmp_path: Path, monkeypatch) -> None:
    """conf.d/*.conf (nginx.org's packages, the official image): the restore's own atomic write
    bumped conf.d's time, the pending-edit check then refused the restore's reload, and nginx kept
    serving the last trial's value while the file said the original (a review: a sweep that
    keeps the current value, the usual outcome, ended so on every such layout)."""
    import json
    import os
    import time

    from controllers.nginx_tuner.nginx_ctl import ReloadResult

    (tmp_path / "conf.d").mkdir()
    shop = tmp_path / "conf.d" / "shop.conf"
    original = "server {\n    listen 8080;\n    server_name shop;\n    keepalive_timeout 65;\n}\n"
    shop.write_text(original.replace("65;", "30;"))  # the last trial's value, loaded
    conf = tmp_path / "nginx.conf"
    conf.write_text("events {}\nhttp {\n    include conf.d/*.conf;\n}\n")
    ctl = NginxControl(conf, tmp_path, pid_path=tmp_path / "none.pid", server_name="shop")
    ctl.backup_dir.mkdir(mode=0o700)
    ctl.journal_path.write_text(json.dumps({"file": str(shop), "content": original, "started": 0}))
    os.chmod(ctl.journal_path, 0o600)
    past = time.time() - 100
    for p in (conf, shop, tmp_path / "conf.d"):
        os.utime(p, (past, past))  # all of it loaded by nginx at the last trial
    reloads = []
    monkeypatch.setattr(NginxControl, "master_pid", lambda self: 1)
    monkeypatch.setattr(NginxControl, "loaded_at", lambda self: past + 50)
    monkeypatch.setattr(NginxControl, "test", lambda self: (True, ""))
    monkeypatch.setattr(NginxControl, "reload", lambda self: reloads.append(1) or ReloadResult(True, "reloaded", (), (), True))
    monkeypatch.setattr(NginxControl, "_healthy_within", lambda self: True)
    said = ctl.recover()
    assert "live" in said and reloads == [1] and shop.read_text() == original
    # someone else's change in conf.d since the last load still holds the reload back
    shop.write_text(original.replace("65;", "30;"))
    ctl.journal_path.write_text(json.dumps({"file": str(shop), "content": original, "started": 0}))
    os.chmod(ctl.journal_path, 0o600)
    (tmp_path / "conf.d" / "blog.conf").write_text("server { listen 8081; }\n")
    with pytest.raises(NginxError, match="conf.d changed on disk"):
        ctl.recover()


def test_copies_kept_aside_are_the_newest_ten_of_each_kind(tmp_path: Path) -> None:
    """Every sweep that kept the current value left one more .at-recovery- copy, for good (a
    review): the newest ten of each kind stay, the others go."""
    from controllers.nginx_tuner.nginx_ctl import ASIDE_KEPT

    conf = tmp_path / "nginx.conf"
    conf.write_text("events {}\nhttp {\n    keepalive_timeout 65;\n}\n")
    ctl = NginxControl(conf, tmp_path, pid_path=tmp_path / "none.pid")
    ctl.backup_dir.mkdir(mode=0o700)
    made = [ctl._aside(conf, "at-recovery", f"text {i}\n") for i in range(ASIDE_KEPT + 5)]
    other = ctl._aside(conf, "pre-sweep", "theirs\n")
    left = sorted(ctl.backup_dir.glob("*.at-recovery-*"))
    assert left == sorted(made[-ASIDE_KEPT:]) and other.exists()
    assert [p.read_text() for p in left] == [f"text {i}\n" for i in range(5, ASIDE_KEPT + 5)]
