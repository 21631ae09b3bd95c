"""The admission proxy on real processes: a small app (``python -m http.server``), the proxy
(``python -m controllers.admission proxy``, its key file from ``keygen``, a control token), and
the local stack (nginx -> the proxy, Prometheus scraping the proxy as job ``admission``,
Alertmanager, the controller with an ``admission`` route).

An alert posted to Alertmanager reaches the controller, whose ``admission`` action puts the proxy
in waiting-room mode: a new visitor gets the 503 waiting-room page through nginx while a visitor
already admitted keeps being served. The alert resolves: new visitors are admitted again. The
alert fires again and the controller is killed: the proxy drops the hold by itself when its lease
runs out.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from controllers.audit import read_audit
from dashboards.queries import panels_without_data
from promreflex.config import ScrapeJob
from promreflex.proc import Child, free_port, http_ok, pid_alive, wait_until
from promreflex.stack import Stack
from tests.conftest import REPO, LiveStack, stack_config

pytestmark = pytest.mark.integration

TOKEN = "admission-test-token-0123456789"


class Visitor:
    """A browser: keeps its cookies, follows no redirects."""

    def __init__(self, base: str):
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, dict[str, str], str]:
        try:
            with self.opener.open(self.base + path, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()


def api(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    return json.loads(text) if text else None


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admission")
    site = tmp / "site"
    site.mkdir()
    for page in ("login", "browse", "buy", "logout"):
        (site / page).write_text(f"the {page} page\n")
    app_port, proxy_port, control_port = free_port(), free_port(), free_port()
    children: list[Child] = []
    app = Child("app", [sys.executable, "-m", "http.server", str(app_port), "--bind", "127.0.0.1",
                        "--directory", str(site)], tmp / "app.log", cwd=REPO).start()
    children.append(app)
    keys = tmp / "keys"
    subprocess.run([sys.executable, "-m", "controllers.admission", "keygen", "--key-file", str(keys)], cwd=REPO,
                   check=True, capture_output=True)
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    cfg_file = tmp / "admission.yml"
    cfg_file.write_text(yaml.safe_dump({"admission": {
        "listen_address": f"127.0.0.1:{proxy_port}", "upstream": f"http://127.0.0.1:{app_port}",
        "pages": [{"name": "login", "pattern": "^/login"}, {"name": "logout", "pattern": "^/logout", "logout": True}],
        "session": {"key_file": str(keys)},
        "control": {"listen_address": f"127.0.0.1:{control_port}", "token_file": str(token)},
    }}))
    proxy = Child("proxy", [sys.executable, "-m", "controllers.admission", "proxy", "--config.file", str(cfg_file)],
                  tmp / "proxy.log", cwd=REPO).start()
    children.append(proxy)
    control = f"http://127.0.0.1:{control_port}"
    wait_until(lambda: http_ok(f"{control}/-/ready"), timeout=30, what="the proxy")

    state = tmp / "stack"
    cfg = stack_config(state, routes=[{
        "name": "flash-sale", "matchers": ['alertname="FlashSaleStarted"'], "action": "admission",
        "params": {"control_url": control, "mode": "waiting_room", "lease": "4s", "token_file": str(token),
                   "state_dir": str(tmp / "action")},
    }])
    cfg = cfg.model_copy(update={"stack": cfg.stack.model_copy(update={
        "upstream": f"127.0.0.1:{proxy_port}",
        "extra_scrape": [ScrapeJob(job="admission", targets=[f"127.0.0.1:{control_port}"])]})})
    stack = Stack(cfg)
    try:
        stack.up(progress=lambda *_: None)
        live = LiveStack(stack)
        yield live, control, tmp
    finally:
        if stack.pids_file.exists():
            stack.down(quiet=True)
        for child in reversed(children):
            child.stop()
            assert not pid_alive(child.pid)


def post_alert(am: str, starts: datetime, ends: datetime) -> None:
    api(f"{am}/api/v2/alerts", "POST", [{"labels": {"alertname": "FlashSaleStarted", "severity": "info"},
                                        "startsAt": iso(starts), "endsAt": iso(ends)}])


def test_alert_tightens_admission_and_resolve_undoes_it(loop):
    live, control, tmp = loop
    nginx = live.url("nginx")
    ann = Visitor(nginx)
    status, headers, body = ann.get("/login")
    assert status == 200 and body == "the login page\n"
    assert any(c.name == "promreflex_session" for c in ann.jar)
    # Prometheus scrapes the proxy (job admission) and sees the session.
    wait_until(lambda: live.query('promreflex_admission_sessions_admitted_total{job="admission"} >= 1'),
               timeout=60, what="Prometheus to scrape the proxy")

    now = datetime.now(UTC)
    post_alert(live.alertmanager_url, now - timedelta(seconds=5), now + timedelta(hours=1))
    wait_until(lambda: api(f"{control}/api/v1/state", token=TOKEN)["waiting_room"], timeout=60,
               what="the controller to put the proxy in waiting-room mode")
    status, headers, body = Visitor(nginx).get("/login")
    assert status == 503 and "Retry-After" in headers and "lets no new visitors in" in body and "X-Queue-Position" not in headers
    # Admitted before: still served, and its session completes at logout.
    assert ann.get("/browse")[0] == 200
    wait_until(lambda: live.query('promreflex_admission_waiting_room_mode{job="admission"} == 1'), timeout=60,
               what="Prometheus to see waiting-room mode")
    # rules/admission.rules.yml is loaded and reads the proxy's real series (it fires after 1 m).
    wait_until(lambda: live.query('ALERTS{alertname="AdmissionWaitingRoomActive", instance=~".+"}'), timeout=60,
               what="AdmissionWaitingRoomActive pending")

    # Resolved: the hold is dropped, new visitors are admitted.
    post_alert(live.alertmanager_url, now - timedelta(seconds=5), datetime.now(UTC) - timedelta(seconds=1))
    wait_until(lambda: not api(f"{control}/api/v1/state", token=TOKEN)["holds"], timeout=60,
               what="the resolve to drop the hold")
    assert Visitor(nginx).get("/login")[0] == 200
    assert ann.get("/logout")[0] == 200
    state = api(f"{control}/api/v1/state", token=TOKEN)
    assert state["waiting_room"] is False
    decisions = [(r["transition"], r["result"]) for r in read_audit(live.stack.audit_log)
                 if r["event"] == "decision" and r.get("route") == "flash-sale"]
    assert decisions == [("fire", "ok"), ("resolve", "ok")]
    # The admission dashboard's panels all have data with the proxy in front of a real app.
    empty = panels_without_data(REPO / "dashboards" / "admission.json", live.query, timeout=15)
    assert not empty, "admission panels with no data:\n" + "\n".join(empty)


def test_a_dead_controller_leaves_no_hold_behind(loop):
    live, control, tmp = loop
    now = datetime.now(UTC)
    post_alert(live.alertmanager_url, now, now + timedelta(hours=1))
    wait_until(lambda: api(f"{control}/api/v1/state", token=TOKEN)["waiting_room"], timeout=60,
               what="waiting-room mode")

    def expired() -> float:
        metrics = urllib.request.urlopen(f"{control}/metrics", timeout=5).read().decode()  # noqa: S310
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines()
                   if ln.startswith("promreflex_admission_holds_expired_total "))

    before = expired()  # (a controller stalled past a lease earlier in the module counted one there)
    pid = live.pids()["controller"]
    os.kill(pid, 9)
    wait_until(lambda: not pid_alive(pid), timeout=10, what="the controller to die")
    # Nobody renews the 4 s lease: the proxy relaxes by itself.
    wait_until(lambda: not api(f"{control}/api/v1/state", token=TOKEN)["holds"], timeout=30,
               what="the hold to expire")
    assert Visitor(live.url("nginx")).get("/login")[0] == 200
    assert expired() == before + 1
    # The controller kept the hold in its state file: a new one would re-assert it at start.
    assert "flash-sale" in (tmp / "action" / "admission-holds.json").read_text()


def test_sighup_without_a_key_file_keeps_the_proxy_serving(tmp_path):
    """A stranger's review: without session.key_file (the ephemeral-key mode) SIGHUP kept its
    default action: the proxy died (129), every queued and in-flight request cut. SIGHUP is what
    `systemctl reload` and logrotate's postrotate send."""
    import signal

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("shop\n")
    app_port, proxy_port, control_port = free_port(), free_port(), free_port()
    app = Child("app", [sys.executable, "-m", "http.server", str(app_port), "--bind", "127.0.0.1",
                        "--directory", str(site)], tmp_path / "app.log", cwd=REPO).start()
    proxy = Child("proxy", [sys.executable, "-m", "controllers.admission", "proxy", "--upstream", f"http://127.0.0.1:{app_port}",
                            "--web.listen-address", f"127.0.0.1:{proxy_port}",
                            "--control.listen-address", f"127.0.0.1:{control_port}"], tmp_path / "proxy.log", cwd=REPO).start()
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{control_port}/-/ready"), timeout=30, what="the proxy")
        assert http_ok(f"http://127.0.0.1:{proxy_port}/index.html")
        os.kill(proxy.pid, signal.SIGHUP)
        wait_until(lambda: "no session.key_file to reload" in proxy.tail(50) or not pid_alive(proxy.pid), timeout=20,
                   what="the proxy to take the SIGHUP")
        assert pid_alive(proxy.pid), proxy.tail(20)
        assert http_ok(f"http://127.0.0.1:{proxy_port}/index.html")
    finally:
        proxy.stop()
        app.stop()
