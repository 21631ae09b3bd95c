"""`promreflex stack up/status/down` as a user runs them, against the real binaries."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
import yaml

from promreflex.config import load_config, ports_model
from promreflex.proc import free_port, pid_alive, wait_until
from promreflex.stack import Stack, StackError
from tests import throwaway_capability

pytestmark = pytest.mark.integration

PORTS = tuple(ports_model().model_fields)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "promreflex", *args], capture_output=True, text=True, timeout=timeout)


def test_up_status_second_up_and_down(tmp_path):
    cfg = tmp_path / "promreflex.yml"
    ports = {p: free_port() for p in PORTS}
    cfg.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state"), "ports": ports}}))
    up = cli("stack", "up", "--config.file", str(cfg), "--detach")
    pids = {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "The stack is up" in up.stdout and "/classic/alerts" in up.stdout
        pids = {n: i["pid"] for n, i in json.loads((tmp_path / "state" / "pids.json").read_text())["components"].items()}
        assert sorted(pids) == sorted(["prometheus", "alertmanager", "node_exporter", "nginx", "nginx_exporter", "accesslog_exporter", "controller"])
        assert all(pid_alive(p) for p in pids.values())

        again = cli("stack", "up", "--config.file", str(cfg), "--detach")
        assert again.returncode == 1
        assert "already running" in again.stderr and "promreflex stack down" in again.stderr
        assert all(pid_alive(p) for p in pids.values()), "a refused second `up` must not disturb the first"

        status = cli("stack", "status", "--config.file", str(cfg))
        assert status.returncode == 0 and status.stdout.count(" up ") == 7

        # A component that died is shown (exit 1), named by a refused `up`, and `restart` brings it back.
        os.kill(pids["accesslog_exporter"], signal.SIGKILL)
        wait_until(lambda: not pid_alive(pids["accesslog_exporter"]), timeout=30, what="the exporter to die")
        status = cli("stack", "status", "--config.file", str(cfg))
        assert status.returncode == 1 and "accesslog_exporter" in status.stdout and "NOT RUNNING" in status.stdout
        assert "stack restart" in status.stderr
        again = cli("stack", "up", "--config.file", str(cfg), "--detach")
        assert again.returncode == 1 and "promreflex stack restart accesslog_exporter" in again.stderr
        assert f"--config.file {cfg}" in again.stderr  # the hint names the file the stack runs with
        # `--state.dir` alone: the stack's recorded file, not the embedded defaults (which would
        # start the exporter on the default port and log, beside the running stack)
        restarted = cli("stack", "restart", "--state.dir", str(tmp_path / "state"))
        assert restarted.returncode == 0 and "restarted accesslog_exporter" in restarted.stdout, restarted.stderr
        new = json.loads((tmp_path / "state" / "pids.json").read_text())["components"]["accesslog_exporter"]
        with open(f"/proc/{new['pid']}/cmdline", "rb") as f:
            assert f":{ports['accesslog_exporter']}".encode() in f.read()
        status = cli("stack", "status", "--config.file", str(cfg))
        assert status.returncode == 0 and status.stdout.count(" up ") == 7

        # A reload while the controller is dead applies nothing to it: it says so, exit 1.
        controller = json.loads((tmp_path / "state" / "pids.json").read_text())["components"]["controller"]["pid"]
        os.kill(controller, signal.SIGKILL)
        wait_until(lambda: not pid_alive(controller), timeout=30, what="the controller to die")
        reload = cli("stack", "reload", "--config.file", str(cfg))
        assert reload.returncode == 1 and "not reloaded: controller" in reload.stderr, reload.stdout + reload.stderr
        assert cli("stack", "restart", "--config.file", str(cfg)).returncode == 0

        # `reload` restarts a component whose command line the new file changes (here the log's site).
        cfg.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state"), "ports": ports},
                                       "accesslog": {"site": "other-shop"}}))
        reload = cli("stack", "reload", "--config.file", str(cfg))
        assert reload.returncode == 0 and "accesslog_exporter: its command line changed" in reload.stdout, reload.stderr
        pids = {n: i["pid"] for n, i in json.loads((tmp_path / "state" / "pids.json").read_text())["components"].items()}
        with open(f"/proc/{pids['accesslog_exporter']}/cmdline", "rb") as f:
            assert b"--log=other-shop=" in f.read()
    finally:
        down = cli("stack", "down", "--config.file", str(cfg))
    assert down.returncode == 0 and "stopped 7 component(s)" in down.stdout
    assert not any(pid_alive(p) for p in pids.values())
    assert not (tmp_path / "state" / "pids.json").exists()
    assert cli("stack", "status", "--config.file", str(cfg)).returncode == 1


def test_a_busy_port_is_named_before_anything_starts(tmp_path):
    ports = {p: free_port() for p in PORTS}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports["alertmanager"]))
        holder.listen()
        stack = Stack(load_config(None, {"stack.state_dir": str(tmp_path), "stack.ports": ports}))
        with pytest.raises(StackError, match=rf"{ports['alertmanager']} \(alertmanager\)"):
            stack.up(progress=lambda *_: None)
    assert not (tmp_path / "pids.json").exists()


def test_rendered_configs_pass_the_tools_own_checks(tmp_path):
    stack = Stack(load_config(None, {"stack.state_dir": str(tmp_path)}))
    stack.render()
    prom = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")],
                          capture_output=True, text=True)
    assert prom.returncode == 0, prom.stdout + prom.stderr
    assert "SUCCESS" in prom.stdout and "rules found" in prom.stdout
    am = subprocess.run(["amtool", "check-config", str(tmp_path / "alertmanager" / "alertmanager.yml")],
                        capture_output=True, text=True)
    assert am.returncode == 0, am.stdout + am.stderr
    ngx = subprocess.run(["/usr/sbin/nginx", "-t", "-c", str(tmp_path / "nginx" / "nginx.conf"), "-p", str(tmp_path / "nginx")],
                         capture_output=True, text=True)
    assert ngx.returncode == 0, ngx.stderr
    assert (tmp_path / "webhook-token").stat().st_mode & 0o777 == 0o600


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return json.load(resp)


def test_a_throwaway_capability_runs_in_the_real_stack(tmp_path):
    """A capability defined only in tests/: its process starts (after nginx, before the
    controller), Prometheus scrapes its job, Alertmanager loads its route and inhibit rule."""
    demo = throwaway_capability.make(tmp_path / "demo.rules.yml")
    cfg = load_config(None, {
        "stack.state_dir": str(tmp_path / "state"),
        "stack.ports": {p: free_port() for p in ports_model([demo]).model_fields},
        "demo.greeting": "bonjour",
    }, capabilities=[demo])
    stack = Stack(cfg, capabilities=[demo])
    pids: dict[str, int] = {}
    try:
        pids = stack.up(progress=lambda *_: None)
        assert list(pids) == ["prometheus", "alertmanager", "node_exporter", "nginx", "nginx_exporter",
                              "demo_server", "controller"]
        query = stack.url("prometheus") + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": 'demo_greeting_info{job="demo", greeting="bonjour"} == 1'})
        wait_until(lambda: _get(query)["data"]["result"], timeout=60, what="the demo job scraped")
        rules = _get(stack.url("prometheus") + "/api/v1/rules")["data"]["groups"]
        assert "demo.alerts" in {g["name"] for g in rules}
        am = yaml.safe_load(_get(stack.url("alertmanager") + "/api/v2/status")["config"]["original"])
        assert {"source_matchers": ['alertname="DemoDown"'], "target_matchers": ['alertname="DemoAlert"'],
                "equal": ["instance"]} in am["inhibit_rules"]
        assert any(r.get("matchers") == ['alertname="DemoAlert"'] for r in am["route"]["routes"])
    finally:
        stack.down(quiet=True)
    assert pids and not any(pid_alive(p) for p in pids.values())
