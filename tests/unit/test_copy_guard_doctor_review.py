"""``promreflex copy-guard doctor``: what a review of it found (/tmp/review-copy, M5 and the low
items): a redirecting site, an access log that is not a file, a URL without a scheme, the
Prometheus and Alertmanager fixes, the stack directory the defaults come from. Loopback servers
from test_copy_guard_doctor."""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controllers.copy_guard import doctor
from tests.unit.test_copy_guard_doctor import TIMED, Quiet, serving, target


@contextmanager
def redirecting(log: Path | None, location: str) -> Iterator[tuple[str, list[str]]]:
    """A loopback nginx whose every path but ``location``'s answers 301 -> ``location`` (and logs
    the request, as nginx does); yields its URL and the paths it was asked for."""
    asked: list[str] = []

    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802
            asked.append(self.path)
            if log is not None:
                with log.open("a") as f:
                    f.write(TIMED)
            if location == self.path:  # the redirect's target (same origin): the shop
                self.reply(b"shop")
                return
            self.send_response(301)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as address:
        yield f"http://{address}", asked


def test_a_site_that_redirects_answers_and_is_not_followed(tmp_path):
    """M5: http -> https; urllib followed the redirect to a host that does not answer here and
    the doctor said "does not answer ... is nginx running?" while the log grew."""
    log = tmp_path / "redir.log"
    log.write_text(TIMED)
    with redirecting(log, "https://127.0.0.1:9/") as (url, asked):
        t = target(url, log)
        site = doctor.check_site(t)
        assert site.status == doctor.WARN, site
        assert "answers 301 -> https://127.0.0.1:9/" in site.detail and "does not answer" not in site.detail
        assert "--nginx.url" in site.detail  # the fix: the server block that serves the shop
        checks = {c.link: c for c in doctor.check_access_log(t, wait_s=5)}
        assert checks["access log"].status == doctor.OK
        stub = doctor.check_stub_status(target(url, log, stub_status_url=url + "/nginx_status"))
        assert stub.status == doctor.FAIL and "answers 301 -> https://127.0.0.1:9/" in stub.detail
        assert "does not answer" not in stub.detail
    with redirecting(None, "/shop/") as (url, asked):  # to a page of the same site: fine, not followed
        same = doctor.check_site(target(url, tmp_path / "a.log"))
        assert same.status == doctor.OK and "answers 301 -> /shop/" in same.detail
        assert asked == ["/"]


def test_an_access_log_that_is_not_a_file_fails_without_opening_it(tmp_path):
    """L1: a directory gave an IsADirectoryError traceback, a FIFO hung the doctor (its open
    blocks until a writer comes)."""
    t = target("http://127.0.0.1:9", tmp_path)
    checks = doctor.check_access_log(t, wait_s=0.2)
    assert [c.status for c in checks] == [doctor.FAIL] and "is a directory" in checks[0].detail
    assert "--nginx.access-log" in checks[0].detail
    device = doctor.check_access_log(target("http://127.0.0.1:9", Path("/dev/null")), wait_s=0.2)
    assert [c.status for c in device] == [doctor.FAIL] and "is a device" in device[0].detail


def test_an_access_log_that_is_a_fifo_fails_and_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    result: list[list[doctor.Check]] = []
    th = threading.Thread(target=lambda: result.append(doctor.check_access_log(target("http://127.0.0.1:9", fifo),
                                                                               wait_s=0.2)), daemon=True)
    th.start()
    th.join(timeout=10)
    if th.is_alive():  # blocked in open(): let it go (a writer that closes at once), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        th.join(timeout=10)
        raise AssertionError("the doctor opened the FIFO and hung")
    assert [c.status for c in result[0]] == [doctor.FAIL] and "is a FIFO" in result[0][0].detail


def test_a_url_without_a_scheme_is_named_as_such(tmp_path):
    """L2: `--nginx.stub-status-url 127.0.0.1:18580/nginx_status` made the doctor suggest
    `location = 127.0.0.1:18580/nginx_status`, and blame the server block for a log that did not grow."""
    t = target("http://127.0.0.1:9", tmp_path / "a.log", site_url="127.0.0.1:18580/",
               stub_status_url="127.0.0.1:18580/nginx_status")
    stub = doctor.check_stub_status(t)
    assert stub.status == doctor.FAIL and "needs http://" in stub.detail
    assert "http://127.0.0.1:18580/nginx_status" in stub.detail and "location = " not in stub.detail
    site = doctor.check_site(t)
    assert site.status == doctor.FAIL and "needs http://" in site.detail and "is nginx running" not in site.detail
    log = tmp_path / "a.log"
    log.write_text(TIMED)
    checks = {c.link: c for c in doctor.check_access_log(t, wait_s=0.2)}
    assert checks["access log"].status == doctor.FAIL
    assert "needs http://" in checks["access log"].detail and "logs elsewhere" not in checks["access log"].detail
    named = doctor.check_site(target("http://127.0.0.1:9", log, site_url="localhost:18580/"))  # parses as scheme "localhost"
    assert named.status == doctor.FAIL and "needs http://" in named.detail


def test_prometheus_and_alertmanager_fixes_are_sentences(tmp_path):
    """L2: their FAIL lines ended in a bare `--prometheus.url` / `--alertmanager.url`."""
    t = target("http://127.0.0.1:9", tmp_path / "a.log", extra={"flags": " --config.file /etc/p.yml"})
    prom = doctor.check_prometheus(t)[0]
    assert prom.status == doctor.FAIL
    assert "--prometheus.url http://127.0.0.1:9090" in prom.detail
    assert "promreflex stack up --config.file /etc/p.yml" in prom.detail
    am = doctor.check_alertmanager(t)[0]
    assert am.status == doctor.FAIL
    assert "--alertmanager.url http://127.0.0.1:9093" in am.detail and "promreflex stack up" in am.detail
    dead = doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log", stack_dir=tmp_path,
                                          stack_dead=["prometheus"], extra={"flags": ""}))[0]
    assert "promreflex stack restart prometheus" in dead.detail


def test_the_output_names_the_stack_directory_it_looked_in(tmp_path, monkeypatch):
    """L2: without --config.file the doctor looks for the stack under the current directory, and
    did not say so."""
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    doctor.add_doctor_parser(parser.add_subparsers())
    t = doctor.target_from(parser.parse_args(["doctor"]))
    head = doctor.header(t)
    assert f"stack directory {tmp_path.resolve() / '.promreflex' / 'stack'}: no stack runs there" in head
    assert "current directory" in head
    other = doctor.header(doctor.target_from(parser.parse_args(["doctor", "--state.dir", str(tmp_path / "s")])))
    assert f"stack directory {tmp_path.resolve() / 's'}" in other and "current directory" not in other
