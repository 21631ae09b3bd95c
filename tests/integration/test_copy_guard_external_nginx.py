"""Guard a shop you already run (issue 16), against the real binaries: an nginx started first,
with its own configuration, port and log directory (README "Guard a shop you already run", step
1); the stack with ``stack.nginx.external`` starts no nginx and follows that nginx; ``copy-guard
doctor`` names the missing link (no threshold), then passes once the threshold is published, and
fails again when the log is not the one nginx writes; ``Stack.reload`` applies a changed route
to the running controller (same PID, audited)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from controllers.audit import read_audit
from controllers.copy_guard import calibrate
from controllers.copy_guard.doctor import FAIL, OK, add_doctor_parser
from controllers.copy_guard.threshold import write_threshold
from promreflex.config import load_config, ports_model
from promreflex.foundation import NGINX_LOG_FORMAT
from promreflex.proc import Child, free_port, http_ok, pid_alive, wait_until
from promreflex.stack import Stack
from tests.metrics_server import MetricsServer

pytestmark = pytest.mark.integration


def _users_nginx(root: Path, port: int) -> str:
    """A shop's nginx as its owner wrote it, plus the two additions of the README's step 1."""
    return f"""worker_processes 1;
pid {root}/run/nginx.pid;
error_log {root}/log/error.log warn;
events {{ worker_connections 128; }}
http {{
    default_type text/html;
    client_body_temp_path {root}/run/body;
    proxy_temp_path {root}/run/proxy;
    fastcgi_temp_path {root}/run/fastcgi;
    uwsgi_temp_path {root}/run/uwsgi;
    scgi_temp_path {root}/run/scgi;
    log_format promreflex '{NGINX_LOG_FORMAT}';
    server {{
        listen 127.0.0.1:{port};
        access_log {root}/log/access.log;
        access_log {root}/log/promreflex-shop.log promreflex;
        location = /nginx_status {{ stub_status; access_log off; allow 127.0.0.1; deny all; }}
        # (their pages; nginx's workers run as nobody and may not read pytest's 0700 tmp dir)
        location / {{ return 200 "their shop\n"; }}
    }}
}}
"""


def _doctor(cfg: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:
    parser = argparse.ArgumentParser()
    add_doctor_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor", "--config.file", str(cfg), *extra])
    code = args.func(args)
    out = capsys.readouterr().out
    lines: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] in (OK, "WARN", FAIL) and len(parts) == 2:
            link = parts[1].split("  ", 1)[0].strip()
            lines.setdefault(link, parts[0])
            if "CopyGuardSiteCrowded" in parts[1]:  # the shipped route's third alert: its own entry
                lines["crowd route"] = parts[0]
    return code, lines


def _query(prom: str, expr: str) -> list:
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
        return json.load(r)["data"]["result"]


def test_guard_an_nginx_that_already_runs(tmp_path, capsys):
    root = tmp_path / "their-shop"
    for d in ("html", "log", "run"):
        (root / d).mkdir(parents=True)
    (root / "html" / "index.html").write_text("<h1>their shop</h1>")
    port = free_port()
    (root / "nginx.conf").write_text(_users_nginx(root, port))
    nginx = Child("their-nginx", ["/usr/sbin/nginx", "-c", str(root / "nginx.conf"), "-p", str(root), "-g", "daemon off;"],
                  tmp_path / "their-nginx.out").start()
    stack = None
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/"), timeout=30, what="their nginx")
        cfg_file = tmp_path / "promreflex.yml"
        cfg_file.write_text(yaml.safe_dump({"stack": {
            "state_dir": str(tmp_path / "state"), "ports": {p: free_port() for p in ports_model().model_fields},
            "nginx": {"external": True, "url": f"http://127.0.0.1:{port}/",
                      "stub_status_url": f"http://127.0.0.1:{port}/nginx_status",
                      "access_log": str(root / "log" / "promreflex-shop.log")}}}))
        stack = Stack(load_config(cfg_file))
        stack.up(progress=lambda *_: None)
        assert "nginx" not in stack.running()  # theirs runs; the stack started none
        prom = stack.url("prometheus")
        for _ in range(5):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()  # noqa: S310 - loopback
        wait_until(lambda: _query(prom, 'promreflex_http_requests_total{site="shop"}'), timeout=60,
                   what="their access log counted by the stack's exporter")
        wait_until(lambda: _query(prom, "nginx_http_requests_total"), timeout=60, what="their stub_status scraped")

        code, links = _doctor(cfg_file, capsys=capsys)
        assert code == 1 and links["threshold"] == FAIL, links
        for link in ("nginx", "stub_status", "access log", "log format", "prometheus", "nginx exporter",
                     "accesslog exporter", "rules", "route", "crowd route", "token", "controller", "controller token",
                     "controller route"):
            assert links[link] == OK, (link, links)
        assert "own traffic" not in links  # stub_status is not logged
        visited = time.time()  # the doctor's own requests: the shop's page twice and stub_status once

        write_threshold(stack.textfile_dir, "shop", 40.0, demand_floor_rps=20.0, response_s=0.05)
        wait_until(lambda: _query(prom, 'site:promreflex_copy_guard_threshold:rps{site="shop"}'), timeout=60,
                   what="the threshold in Prometheus")
        wait_until(lambda: _query(prom, 'site:promreflex_copy_guard_demand:rps{site="shop"}'), timeout=60,
                   what="the demand recorded")
        # Idle: their exporter's own stub_status requests (5/s at the stack's 200 ms scrape) are not
        # demand. Read over 5 s that begin 4.5 s after the last request anyone made (the doctor's:
        # the 3 s window then holds none), every evaluation: the median must be 0; a single
        # evaluation may show a third of a visitor per scrape that timed out after nginx counted
        # its request (one sample fewer than requests), never the exporter's 5 req/s. (Two CI runs
        # read the doctor's 3 requests, 0.99 at one instant and 1.09 at the peak, when this read
        # came less than 3 s after it.)
        time.sleep(max(0.0, visited + 9.5 - time.time()))
        wait_until(lambda: _query(prom, 'site:nginx_http_requests:rate3s{site="shop"}'), timeout=60,
                   what="the visitors' arrivals recorded")
        median = float(_query(prom, 'quantile_over_time(0.5, site:nginx_http_requests:rate3s{site="shop"}[5s])')[0]["value"][1])
        peak = float(_query(prom, 'max_over_time(site:nginx_http_requests:rate3s{site="shop"}[5s])')[0]["value"][1])
        # the scrapes that failed within the read's reach (the 5 s and the 3 s window before it):
        # each may add its third of a visitor for 3 s, more than half the read, to the median
        failed = float(_query(prom, 'count_over_time(up{job="nginx"}[9s]) - sum_over_time(up{job="nginx"}[9s])')
                       [0]["value"][1])
        assert failed <= 2, f"{failed:.0f} of the nginx exporter's scrapes failed in 9 s"  # (else no bound holds)
        assert median < 0.1 + failed / 3 and peak < 1.0 + failed / 3, (median, peak, failed)
        registry = tmp_path / "copies"
        registry.mkdir(mode=0o700)
        code, links = _doctor(cfg_file, "--registry.dir", str(registry), capsys=capsys)
        assert code == 0 and links["threshold"] == OK and links["demand"] == OK and links["copies"] == "WARN", links

        code, links = _doctor(cfg_file, "--nginx.access-log", str(root / "log" / "access.log"), capsys=capsys)
        assert code == 1 and links["log format"] == FAIL, links  # their combined log: not our format

        # a changed route reaches the running controller without a restart
        controller_pid = stack.running()["controller"]
        data = yaml.safe_load(cfg_file.read_text())
        data["controller"] = {"routes": [{"name": "copy-guard", "action": "copy-guard",
                                          "matchers": ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"'],
                                          "params": {"registry_dir": str(registry), "max_pause": "1m"}}]}
        cfg_file.write_text(yaml.safe_dump(data))
        stack = Stack(load_config(cfg_file))
        assert set(stack.reload(progress=lambda *_: None)) == {"prometheus", "alertmanager", "controller"}
        wait_until(lambda: any(r["event"] == "reload" and r.get("result") == "ok"
                               for r in read_audit(stack.audit_log)), timeout=30, what="the controller reloaded")
        reload = next(r for r in read_audit(stack.audit_log) if r["event"] == "reload")
        assert reload["routes"] == ["copy-guard"] and "selftest-log" in reload["removed"], reload
        assert stack.running()["controller"] == controller_pid and pid_alive(controller_pid)

        # The exporter made to follow a file their nginx does not write: `reload` restarts it with
        # the new command line, and the doctor sees that it no longer reads their shop's log.
        data["stack"]["nginx"]["access_log"] = str(root / "log" / "elsewhere.log")
        cfg_file.write_text(yaml.safe_dump(data))
        stack = Stack(load_config(cfg_file))
        assert "accesslog_exporter" in stack.reload(progress=lambda *_: None)
        code, links = _doctor(cfg_file, "--registry.dir", str(registry), "--nginx.access-log",
                              str(root / "log" / "promreflex-shop.log"), capsys=capsys)
        assert code == 1 and links["accesslog exporter"] == FAIL and links["log format"] == OK, links
    finally:
        if stack is not None:
            stack.down(quiet=True, progress=lambda *_: None)
        nginx.stop()


def test_calibrate_child_dies_with_its_parent_on_sigterm_and_sigkill(tmp_path):
    """``calibrate`` cleans up its Locust child: SIGTERM (handler kills the group) and SIGKILL of
    the parent (PR_SET_PDEATHSIG) both leave no Locust behind."""
    import psutil

    # A shop that answers calibrate's HEAD check (so the load starts) and never answers the load's
    # requests: they just wait, and Locust is busy when the signal comes.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = hole.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                head = conn.recv(4096)
            except OSError:
                head = b""
            if head.startswith(b"HEAD"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    dead = f"http://127.0.0.1:{hole.getsockname()[1]}/"
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        tf = tmp_path / f"tf-{sig}"
        tf.mkdir()
        scratch = tmp_path / f"tmp-{sig}"  # calibrate's temporary files (TMPDIR)
        scratch.mkdir()
        cache = tmp_path / f"cache-{sig}"  # calibrate's record of its last load (XDG_CACHE_HOME)
        marker = cache / "promreflex" / "calibrate-last-load"
        proc = subprocess.Popen([sys.executable, "-m", "promreflex", "calibrate", "--target", dead, "--users", "1",  # noqa: S603
                                 "--duration", "60s", "--runs", "1", "--textfile.dir", str(tf)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(cache)})
        parent = psutil.Process(proc.pid)

        def locust_children() -> list[psutil.Process]:
            return [c for c in parent.children(recursive=True) if "locust" in " ".join(c.cmdline())]

        children = wait_until(locust_children, timeout=60, what="calibrate's locust child")
        # while it loads: marked (a heartbeat), and a second calibration of that shop is refused
        try:
            wait_until(lambda: marker.exists() and marker.read_text().startswith(f"running {proc.pid} "), timeout=30,
                       what="the load marked as running")
            assert f"another calibration (pid {proc.pid}) is loading {dead} now" in (
                calibrate.running_calibration(dead, marker) or "")
        except BaseException:
            proc.kill()  # (its Locust dies with it)
            proc.wait(timeout=30)
            raise
        proc.send_signal(sig)
        proc.wait(timeout=30)
        wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
                   timeout=30, what=f"locust gone after {signal.Signals(sig).name} to calibrate")
        last = calibrate.read_last_load(marker)
        assert last is not None and last.ended is not None, (sig, marker.read_text())
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr.read() if proc.stderr else "")
            assert not list(scratch.iterdir()), list(scratch.iterdir())  # its load's files removed too
            assert last.how == "ended"
        else:  # no end written: its last heartbeat tells the next calibration when its load stopped (L3)
            assert last.how == "killed" and last.pid == proc.pid, last
        assert calibrate.running_calibration(dead, marker) is None
        assert not (tf / "promreflex_copy_guard_threshold.prom").exists()
    hole.close()
    for conn in held:
        conn.close()


def test_doctor_fails_exporters_your_prometheus_no_longer_scrapes(tmp_path):
    """Your own Prometheus (README "With your own Prometheus and Alertmanager too"), the nginx and
    accesslog jobs removed from its scrape_configs and reloaded (/tmp/review-guard M1): their last
    samples stay in its instant queries (Prometheus 2.42 writes no staleness marker for a target
    a reload removed: for 5 minutes), and the doctor said "scraped". It must name the jobs."""
    from controllers.copy_guard import doctor

    nginx_srv = MetricsServer("nginx_up 1\nnginx_http_requests_total 42\n")
    log_srv = MetricsServer('promreflex_http_requests_total{site="shop",status_class="2xx"} 7\n')
    nginx_addr, log_addr = nginx_srv.addr, log_srv.addr
    port = free_port()
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    config = prom_dir / "prometheus.yml"

    def write(jobs: dict[str, str]) -> None:
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
            "scrape_configs": [{"job_name": j, "static_configs": [{"targets": [a]}]} for j, a in jobs.items()]}))

    write({"nginx": nginx_addr, "accesslog": log_addr, "prometheus": f"127.0.0.1:{port}"})
    prom = Child("their-prometheus", ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={prom_dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
                 tmp_path / "prometheus.out").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), timeout=60, what="their Prometheus")
        wait_until(lambda: _query(url, "nginx_http_requests_total") and _query(url, "promreflex_http_requests_total"),
                   timeout=90, what="both exporters scraped")
        t = doctor.Target(site="shop", site_url="http://127.0.0.1:9/", stub_status_url="http://127.0.0.1:9/nginx_status",
                          access_log=tmp_path / "a.log", prometheus_url=url, alertmanager_url="", controller_url="",
                          token_file=None, registry_dir=None, min_floor=2.0)
        checks = {c.link: c for c in doctor.check_prometheus(t, settle_s=0)}
        assert checks["nginx exporter"].status == OK and checks["accesslog exporter"].status == OK, checks

        write({"prometheus": f"127.0.0.1:{port}"})  # the two exporters' jobs removed
        urllib.request.urlopen(urllib.request.Request(f"{url}/-/reload", method="POST"), timeout=30).read()  # noqa: S310

        def jobs() -> set[str]:
            with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as r:  # noqa: S310
                return {tg["labels"]["job"] for tg in json.load(r)["data"]["activeTargets"]}

        wait_until(lambda: jobs() == {"prometheus"}, timeout=60, what="the reload applied")
        stale = bool(_query(url, "nginx_http_requests_total"))  # its last sample, still answered
        checks = {c.link: c for c in doctor.check_prometheus(t, settle_s=0)}
        for link, job in (("nginx exporter", "nginx"), ("accesslog exporter", "accesslog")):
            assert checks[link].status == FAIL, (stale, checks[link])
            assert f"job {job}" in checks[link].detail, checks[link]
            if stale:  # (within the 5 min the last samples stay: the case the doctor missed)
                assert "not among its active targets" in checks[link].detail, checks[link]
    finally:
        prom.stop()
        nginx_srv.shutdown()
        log_srv.shutdown()
