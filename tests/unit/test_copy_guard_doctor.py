"""``promreflex copy-guard doctor`` (controllers/copy_guard/doctor.py): the checks that need no
running stack, on fixtures and a loopback HTTP server written here. The whole chain against
the real binaries: tests/integration/test_copy_guard_external_nginx.py."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from controllers.copy_guard import doctor
from controllers.copy_guard.registry import Entry, Registry

TIMED = ('127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "Mozilla/5.0" '
         'rt=0.001 urt="-"\n')
COMBINED = '127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "Mozilla/5.0"\n'
OLD_STUB = ('127.0.0.1 - - [23/Nov/2026:10:00:00 +0000] "GET /stub_status HTTP/1.1" 200 97 "-" '
            '"NGINX-Prometheus-Exporter/v0.11.0" rt=0.000 urt="-"\n')


def stub() -> str:
    """A scrape logged just now (the doctor counts those of the last 2 minutes): made when the
    test runs, not when the module is imported (a CI run reaches this file minutes later)."""
    return OLD_STUB.replace("23/Nov/2026:10:00:00 +0000", time.strftime("%d/%b/%Y:%H:%M:%S %z"))


@contextmanager
def site(log: Path | None, line: str = TIMED) -> Iterator[str]:
    """A loopback server that, like nginx, appends ``line`` to ``log`` for every request."""

    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802
            if self.path in ("/missing", "/denied"):
                self.send_error(404 if self.path == "/missing" else 403)
                return
            if self.path == "/stub_status":
                body = b"Active connections: 1 \nserver accepts handled requests\n 7 7 42 \nReading: 0 Writing: 1 Waiting: 0 \n"
            else:
                body = b"shop"
                if log is not None:
                    with log.open("a") as f:
                        f.write(line)
            self.reply(body)

    with serving(Handler) as address:
        yield f"http://{address}"


class Quiet(http.server.BaseHTTPRequestHandler):
    def reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a loopback port while the block runs; yields HOST:PORT."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def target(url: str, log: Path, **kw: object) -> doctor.Target:
    base = {"site": "shop", "site_url": url + "/", "stub_status_url": url + "/stub_status", "access_log": log,
            "prometheus_url": "http://127.0.0.1:9", "alertmanager_url": "http://127.0.0.1:9",
            "controller_url": "http://127.0.0.1:9", "token_file": None, "registry_dir": None, "min_floor": 2.0}
    return doctor.Target(**{**base, **kw})  # type: ignore[arg-type]


def test_stub_status_page_parses_and_garbage_does_not():
    s = doctor.parse_stub_status("Active connections: 3 \nserver accepts handled requests\n 10 10 99 \n"
                                 "Reading: 0 Writing: 2 Waiting: 1 \n")
    assert s == {"active": 3, "accepts": 10, "handled": 10, "requests": 99, "reading": 0, "writing": 2, "waiting": 1}
    with pytest.raises(ValueError):
        doctor.parse_stub_status("<html>nginx</html>")


def test_site_and_stub_status_links(tmp_path):
    with site(None) as url:
        t = target(url, tmp_path / "a.log")
        assert doctor.check_site(t).status == doctor.OK
        stub = doctor.check_stub_status(t)
        assert stub.status == doctor.OK and "42 requests" in stub.detail
        bad = doctor.check_stub_status(target(url, tmp_path / "a.log", stub_status_url=url + "/"))
        assert bad.status == doctor.FAIL and "not an nginx stub_status page" in bad.detail
    down = doctor.check_site(target("http://127.0.0.1:9", tmp_path / "a.log"))
    assert down.status == doctor.FAIL and "does not answer" in down.detail


def test_access_log_growing_in_our_format_is_ok(tmp_path):
    log = tmp_path / "shop.log"
    log.write_text(TIMED)
    with site(log) as url:
        checks = {c.link: c for c in doctor.check_access_log(target(url, log), wait_s=5)}
    assert checks["access log"].status == doctor.OK and checks["log format"].status == doctor.OK
    assert "own traffic" not in checks


def test_access_log_problems_are_named(tmp_path):
    missing = doctor.check_access_log(target("http://127.0.0.1:9", tmp_path / "none.log"), wait_s=0.2)
    assert missing[0].status == doctor.FAIL and "does not exist" in missing[0].detail
    still = tmp_path / "still.log"
    still.write_text(TIMED)
    with site(None) as url:  # nginx logs elsewhere: the file does not grow
        checks = {c.link: c for c in doctor.check_access_log(target(url, still), wait_s=0.5)}
    assert checks["access log"].status == doctor.FAIL and "did not grow" in checks["access log"].detail
    combined = tmp_path / "combined.log"
    combined.write_text(COMBINED)
    with site(combined, COMBINED) as url:
        checks = {c.link: c for c in doctor.check_access_log(target(url, combined), wait_s=5)}
    assert checks["log format"].status == doctor.FAIL and "promreflex format" in checks["log format"].detail
    scraped = tmp_path / "scraped.log"
    scraped.write_text(stub() * 3)
    with site(scraped) as url:
        checks = {c.link: c for c in doctor.check_access_log(target(url, scraped), wait_s=5)}
    assert checks["own traffic"].status == doctor.FAIL and "access_log off" in checks["own traffic"].detail
    # fixed since: the old scrapes still among the last lines of a quiet shop's log are not a FAIL
    # (the doctor kept failing a fix already in place: a stranger's review)
    fixed = tmp_path / "fixed.log"
    fixed.write_text(OLD_STUB * 3 + TIMED)
    with site(fixed) as url:
        checks = {c.link: c for c in doctor.check_access_log(target(url, fixed), wait_s=5)}
    assert checks["own traffic"].status == doctor.OK and "fixed since" in checks["own traffic"].detail


def test_unreachable_prometheus_alertmanager_controller_fail_with_what_to_do(tmp_path):
    t = target("http://127.0.0.1:9", tmp_path / "a.log")
    assert doctor.check_prometheus(t)[0].status == doctor.FAIL
    assert doctor.check_rules(t).status == doctor.FAIL
    assert doctor.check_threshold(t)[0].status == doctor.FAIL
    am = doctor.check_alertmanager(t)[0]
    assert am.status == doctor.FAIL and "--alertmanager.url" in am.detail
    ctl = doctor.check_controller(t)[0]
    assert ctl.status == doctor.FAIL and "promreflex controller" in ctl.detail


def test_registry_link(tmp_path):
    t = target("http://127.0.0.1:9", tmp_path / "a.log", registry_dir=tmp_path / "copies")
    assert doctor.check_registry(t)[0].status == doctor.WARN  # not created yet
    (tmp_path / "copies").mkdir(mode=0o700)
    ok, copies = doctor.check_registry(t)
    assert ok.status == doctor.OK and copies.status == doctor.WARN
    Registry(tmp_path / "copies").add(Entry(id="c1", kind="adopted", pid=1, pid_start=None, site="shop"))
    assert doctor.check_registry(t)[1].status == doctor.OK
    (tmp_path / "copies").chmod(0o777)
    bad = doctor.check_registry(t)[0]
    assert bad.status == doctor.FAIL and "writable by group or others" in bad.detail


def test_receiver_token_is_compared_with_the_controllers(tmp_path):
    mine = tmp_path / "token"
    mine.write_text("s3cret\n")
    mine.chmod(0o600)
    theirs = tmp_path / "am-token"
    theirs.write_text("s3cret\n")
    hook = "http://127.0.0.1:9095/webhook"
    receivers = {"promreflex": {"webhook_configs": [{"url": hook, "http_config": {"authorization": {
        "type": "Bearer", "credentials_file": str(theirs)}}}]}}
    assert doctor._receiver_token(receivers, ["promreflex"], hook, mine).status == doctor.OK
    theirs.write_text("other\n")
    assert doctor._receiver_token(receivers, ["promreflex"], hook, mine).status == doctor.FAIL
    bare = {"promreflex": {"webhook_configs": [{"url": hook}]}}
    assert doctor._receiver_token(bare, ["promreflex"], hook, mine).status == doctor.FAIL


def test_render_aligns_one_line_per_link():
    out = doctor.render([doctor.Check(doctor.OK, "nginx", "up"), doctor.Check(doctor.FAIL, "access log", "missing")])
    assert out.splitlines() == ["OK   nginx       up", "FAIL access log  missing"]


def test_threshold_check_warns_without_a_calibrated_response_time(monkeypatch):
    """An older calibration (no response time) leaves the guard blind to closed-loop overload."""
    from controllers.copy_guard import doctor

    values = {"timestamp(": time.time() - 20, "threshold": 40.0, "demand_floor": 40.0, "response_time": None,
              "calibration_timestamp": None, "served": 10.0, "demand": 5.0}

    def one(_prom: str, query: str) -> float | None:
        return next((v for k, v in values.items() if k in query), None)

    monkeypatch.setattr(doctor, "_one", one)
    monkeypatch.setattr(doctor, "prom_query", lambda *_a, **_k: [])
    t = doctor.Target(site="shop", site_url="", stub_status_url="", access_log=Path("x.log"), prometheus_url="http://p",
                      alertmanager_url="", controller_url="", token_file=None, registry_dir=None, min_floor=2.0)
    checks = doctor.check_threshold(t)
    assert checks[0].status == doctor.WARN and "no healthy response time" in checks[0].detail
    values["response_time"] = 0.12
    checks = doctor.check_threshold(t)
    assert checks[0].status == doctor.OK and "healthy response time 120 ms" in checks[0].detail
    values["calibration_timestamp"] = time.time() - 90
    assert "calibrated 90 s ago" in doctor.check_threshold(t)[0].detail  # (was "0.0 days ago")
    # Prometheus restarted after the textfile was removed: the old process's sample, 5 min old
    values["timestamp("] = time.time() - 290
    checks = doctor.check_threshold(t)
    assert checks[0].status == doctor.FAIL and "no longer serves it" in checks[0].detail


def test_stub_status_answers_name_their_own_fix(tmp_path):
    with site(None) as url:
        missing = doctor.check_stub_status(target(url, tmp_path / "a.log", stub_status_url=url + "/missing"))
        assert missing.status == doctor.FAIL and "no such location" in missing.detail
        assert "location = /missing {" in missing.detail and "allow the" not in missing.detail
        denied = doctor.check_stub_status(target(url, tmp_path / "a.log", stub_status_url=url + "/denied"))
        assert denied.status == doctor.FAIL and "denies" in denied.detail
    refused = doctor.check_stub_status(target("http://127.0.0.1:9", tmp_path / "a.log",
                                              stub_status_url="http://127.0.0.1:9/nginx_status"))
    assert "location = /nginx_status {" in refused.detail  # the configured path, not /stub_status


def test_own_traffic_counts_only_stub_status_lines_that_are_served(tmp_path):
    refused = tmp_path / "refused.log"  # the location was missing: 404s are not counted as served
    refused.write_text(stub().replace('" 200 97', '" 404 153') * 3)
    with site(refused) as url:
        checks = {c.link: c for c in doctor.check_access_log(target(url, refused), wait_s=5)}
    assert "own traffic" not in checks
    other = tmp_path / "other.log"  # the configured path, whatever it is
    other.write_text(stub().replace("/stub_status", "/nginx_status").replace("NGINX-Prometheus-Exporter", "curl") * 3)
    with site(other) as url:
        checks = {c.link: c for c in doctor.check_access_log(
            target(url, other, stub_status_url=url + "/nginx_status"), wait_s=5)}
    assert checks["own traffic"].status == doctor.FAIL
    root = tmp_path / "root.log"  # stub_status at the root of a port of its own: visitors' GET / are theirs
    root.write_text(stub().replace("/stub_status", "/").replace("NGINX-Prometheus-Exporter", "Mozilla/5.0") * 3)
    with site(root) as url:
        checks = {c.link: c for c in doctor.check_access_log(
            target(url, root, stub_status_url="http://127.0.0.1:8081/"), wait_s=5)}
    assert "own traffic" not in checks


def _stack_target(tmp_path: Path, **kw: object) -> doctor.Target:
    return target("http://127.0.0.1:9", tmp_path / "a.log", prometheus_url="http://p", stack_dir=tmp_path,
                  **kw)


def test_a_missing_series_of_the_stacks_own_exporter_names_the_stacks_fix(tmp_path, monkeypatch):
    """README step 2 (`stack up` then `doctor`) told the user to install and scrape exporters the
    stack already runs; a dead one got the same advice."""
    monkeypatch.setattr(doctor, "prom_query", lambda prom, expr: [({}, 1.0)] if expr == "vector(1)" else [])
    dead = doctor.check_prometheus(_stack_target(tmp_path, stack_dead=["accesslog_exporter"],
                                                 stack_alive={"nginx_exporter": 11},
                                                 extra={"flags": " --config.file /etc/p.yml"}), settle_s=0)
    by = {c.link: c for c in dead}
    assert "promreflex stack restart accesslog_exporter --config.file /etc/p.yml" in by["accesslog exporter"].detail
    assert "runs (pid 11) but is not scraped" in by["nginx exporter"].detail
    assert "scrape_configs" not in by["accesslog exporter"].detail + by["nginx exporter"].detail

    # a stack started a moment ago: its series appear after the first scrapes, the doctor waits
    calls = {"n": 0}

    def slowly(prom: str, expr: str) -> list[tuple[dict[str, str], float]]:
        if expr == "vector(1)":
            return [({}, 1.0)]
        if expr.startswith("group by"):
            calls["n"] += 1
            return [({"job": "x", "instance": "127.0.0.1:9"}, 1.0)] if calls["n"] > 2 else []
        return [({}, 1.0)] if expr.startswith("nginx_up") else []

    monkeypatch.setattr(doctor, "prom_query", slowly)
    fresh = doctor.check_prometheus(_stack_target(tmp_path, stack_alive={"nginx_exporter": 11, "accesslog_exporter": 12},
                                                  stack_started=time.time() - 2), settle_s=10)
    assert [c.status for c in fresh] == [doctor.OK, doctor.OK, doctor.OK], fresh

    # the exporter is up but cannot read stub_status (a 404 or 403 there): it serves nginx_up 0
    # and drops its nginx_* series, so "no series" must not read as "not scraped"
    monkeypatch.setattr(doctor, "prom_query", lambda prom, expr: (
        [({}, 0.0)] if expr == 'nginx_up{job="nginx"}' else [({}, 1.0)] if expr == "vector(1)" else []))
    blind = {c.link: c for c in doctor.check_prometheus(_stack_target(tmp_path), settle_s=0)}
    assert blind["nginx exporter"].status == doctor.FAIL and "nginx_up 0" in blind["nginx exporter"].detail


@contextmanager
def exporter_metrics(body: str) -> Iterator[str]:
    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802
            self.reply(body.encode())

    with serving(Handler) as address:
        yield address


def test_the_accesslog_exporter_must_read_the_doctors_own_request(tmp_path):
    """An exporter that follows another file (its log moved, the configuration changed without a
    restart) has its series and counts nothing: the doctor said OK."""
    now = time.time()
    t = target("http://127.0.0.1:9", tmp_path / "a.log", probe_at=now)

    def page(last: float, lines: int, errors: int) -> str:
        return (f'promreflex_accesslog_last_line_timestamp_seconds{{site="shop"}} {last}\n'
                f'promreflex_accesslog_lines_total{{site="shop"}} {lines}\n'
                f'promreflex_accesslog_parse_errors_total{{site="shop",reason="no_match"}} {errors}\n')

    with exporter_metrics(page(now - 600, 82, 82)) as inst:
        stale = doctor.check_exporter_reads(t, [{"instance": inst}], "accesslog/x", wait_s=0.5)
    assert stale.status == doctor.FAIL and "did not read the doctor's request" in stale.detail
    with exporter_metrics("# nothing for this site yet\n") as inst:  # restarted on another file: no line read
        none = doctor.check_exporter_reads(t, [{"instance": inst}], "accesslog/x", wait_s=0.5)
    assert none.status == doctor.FAIL and "has read no line" in none.detail
    with exporter_metrics(page(now + 0.5, 82, 82)) as inst:
        rejecting = doctor.check_exporter_reads(t, [{"instance": inst}], "accesslog/x", wait_s=0.5)
    assert rejecting.status == doctor.FAIL and "rejected every one" in rejecting.detail
    with exporter_metrics(page(now + 0.5, 82, 3)) as inst:
        good = doctor.check_exporter_reads(t, [{"instance": inst}], "accesslog/x", wait_s=0.5)
    assert good.status == doctor.OK and "read the doctor's request" in good.detail
    # nothing listens at a loopback exporter: it is not running, although Prometheus' last scrape
    # (up to an interval old) still said up (a stranger's review, R9: "every link works")
    refused = doctor.check_exporter_reads(t, [{"instance": "127.0.0.1:9"}], "accesslog/x", wait_s=0.5)
    assert refused.status == doctor.FAIL and "nothing listens at 127.0.0.1:9" in refused.detail
    # a log its exporter's user may not read (a rotation with create 0640): said as a cause (R8)
    (tmp_path / "a.log").write_text("")
    (tmp_path / "a.log").chmod(0o640)
    with exporter_metrics(page(now - 600, 82, 3)) as inst:
        private = doctor.check_exporter_reads(t, [{"instance": inst}], "accesslog/x", wait_s=0.5)
    assert private.status == doctor.FAIL and "Permission denied" in private.detail
