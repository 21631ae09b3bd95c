"""A simulated fleet of shops on one machine: ``promreflex fleet up N | status | down``.

Each shop host is a network namespace (``prxf-<k>``) on a private bridge (``prxf-br``,
10.201.0.0/24, addresses that exist only in our namespaces), running what a real shop host runs:
nginx (its access log and stub_status), the nginx exporter, the access-log exporter, a backup
copy (``promreflex copy``, rate-limited so it lasts) and the host **agent**: a controller whose
``owner`` is ``site=shop<k>``, so it acts on that shop's alerts only. The control plane runs on the
host, as users run it: a Prometheus HA pair (``replica`` label dropped by
``alert_relabel_configs``) evaluating the copy-guard rules, a 3-peer Alertmanager cluster routing
each shop's alerts to that shop's agent (a route per shop, matching ``site``, with the bearer
token), node_exporter serving each shop's threshold.

An overload on one shop (``fleet load K``: more demand than its threshold says it can serve)
pauses only that shop's copy (tests/e2e/test_fleet.py).

Choices: the agents run the copy guard in ``pause`` mode (the adaptive throttle reads Prometheus,
which listens on the host's loopback only); thresholds are set, not calibrated (``--threshold``):
a fleet demo cannot calibrate N shops on two cores. Prometheus and Alertmanager listen on the
bridge address 10.201.0.1 so the namespaces reach them; the agents require the bearer token, as
anything listening beyond loopback must.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from controllers.copy_guard.threshold import write_threshold
from promreflex.errors import UserError
from promreflex.foundation import NGINX_LOG_FORMAT, nginx_temp_paths
from promreflex.fsutil import atomic_write_text
from promreflex.proc import Child, free_port, http_ok, pid_alive, terminate, wait_until

BRIDGE = "prxf-br"
PREFIX = "prxf"
HOST_ADDR = "10.201.0.1"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
NGINX = "/usr/sbin/nginx"
NGINX_EXPORTER = "/usr/bin/prometheus-nginx-exporter"
RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
RULE_FILES = ("copy-guard.rules.yml", "controller.rules.yml")
#: In-namespace ports (every shop has its own network stack, so they repeat).
PORTS = {"shop": 8080, "stub_status": 8081, "nginx_exporter": 9113, "accesslog": 9181, "agent": 9095}


@dataclass(frozen=True)
class Shop:
    index: int

    @property
    def name(self) -> str:
        return f"shop{self.index}"

    @property
    def ns(self) -> str:
        return f"{PREFIX}-{self.index}"

    @property
    def addr(self) -> str:
        return f"10.201.0.{10 + self.index}"

    def url(self, port: str, path: str = "") -> str:
        return f"http://{self.addr}:{PORTS[port]}{path}"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:  # what `ip` said, not a CalledProcessError's traceback
        raise UserError(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip() or f'exit {proc.returncode}'}")
    return proc


def foreign_namespaces(state: dict[str, Any]) -> list[str]:
    """The fleet's namespaces (``prxf-N``) that exist and ``state`` does not name."""
    listed = run("ip", "netns", "list", check=False).stdout.split("\n")
    names = {line.split()[0] for line in listed if line.strip()}
    return sorted(n for n in names if n.startswith(f"{PREFIX}-") and n not in state.get("namespaces", []))


def _nginx_conf(shop: Shop, d: Path) -> str:
    return f"""daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
    log_format timed '{NGINX_LOG_FORMAT}';
    access_log {d}/access.log timed;
{nginx_temp_paths(f"{d}/tmp")}
    server {{
        listen {shop.addr}:{PORTS['shop']};
        # The page is inline: nginx's workers (user nobody) need no access to the state directory.
        location / {{ default_type text/html; return 200 '<html><body><h1>{shop.name}</h1><p>{"catalogue " * 200}</p></body></html>'; }}
    }}
    server {{
        listen {shop.addr}:{PORTS['stub_status']};
        access_log off;
        location /stub_status {{ stub_status; allow 10.201.0.0/24; deny all; }}
    }}
}}
"""


class Fleet:
    """The fleet's state lives in ``dir`` (``state.json``: namespaces, PIDs, ports), so ``down``
    removes exactly what ``up`` made, also after a crash of ``up`` itself."""

    def __init__(self, directory: Path, python: str = sys.executable):
        self.dir = directory.resolve()
        self.python = python
        self.state_file = self.dir / "state.json"

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        if not self.state_file.exists():
            return {}
        return json.loads(self.state_file.read_text())

    def _save(self, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.state_file, json.dumps(state, indent=1))

    def _record(self, state: dict[str, Any], child: Child) -> None:
        state["pids"].append({"name": child.name, "pid": child.pid, "log": str(child.log_path)})
        self._save(state)

    # ------------------------------------------------------------------ up
    def up(self, n: int, interval: str = "1s", threshold: float = 50.0, floor: float = 5.0,
           copy_mib: int = 512, copy_rate: str = "4M", progress=print) -> dict[str, Any]:  # noqa: ANN001
        if os.geteuid() != 0:
            raise UserError("fleet up needs root (it creates network namespaces)")
        if not 1 <= n <= 20:
            raise UserError(f"fleet size {n}: give 1 to 20 shops")
        for binary in (PROMETHEUS, ALERTMANAGER, NODE_EXPORTER, NGINX, NGINX_EXPORTER):
            if not Path(binary).exists():
                raise UserError(f"{binary} is missing: run `make system` (scripts/install-system.sh base)")
        if self.state().get("pids"):
            raise UserError(f"a fleet is already up (state in {self.state_file}); `promreflex fleet down` first")
        if others := foreign_namespaces(self.state()):
            raise UserError(self._foreign_note(others))
        shops = [Shop(k) for k in range(1, n + 1)]
        state: dict[str, Any] = {"shops": [s.name for s in shops], "namespaces": [], "links": [], "pids": [],
                                 "interval": interval}
        self._save(state)
        try:
            self._network(shops, state, progress)
            token = self.dir / "webhook-token"
            if not token.exists():
                atomic_write_text(token, secrets.token_hex(32))
            token.chmod(0o600)
            textfile = self.dir / "textfile"
            textfile.mkdir(parents=True, exist_ok=True)
            for s in shops:
                write_threshold(textfile, s.name, threshold, demand_floor_rps=floor)
            state["am_ports"] = [free_port(HOST_ADDR) for _ in range(3)]
            state["alertmanager"] = [f"http://{HOST_ADDR}:{p}" for p in state["am_ports"]]
            self._save(state)
            for s in shops:
                self._shop(s, state, token, copy_mib, copy_rate)
                progress(f"  {s.name}: nginx {s.url('shop')}, agent {s.url('agent')} (namespace {s.ns})")
            self._control_plane(shops, state, token, textfile, interval)
            for s in shops:
                wait_until(partial(http_ok, s.url("agent", "/-/ready")), timeout=60, what=f"{s.name} agent ready")
            progress(f"  control plane: Prometheus {', '.join(state['prometheus'])}; "
                     f"Alertmanager {', '.join(state['alertmanager'])}")
        except BaseException:
            progress("  fleet up failed: removing what was made")
            self.down(progress=lambda _: None)
            raise
        return state

    def _network(self, shops: list[Shop], state: dict[str, Any], progress) -> None:  # noqa: ANN001
        if run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            run("ip", "link", "add", BRIDGE, "type", "bridge")
            state["links"].append(BRIDGE)
            self._save(state)
        run("ip", "addr", "replace", f"{HOST_ADDR}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for s in shops:
            host_end, ns_end = f"{s.ns}-h", f"{s.ns}-n"
            run("ip", "netns", "add", s.ns)
            state["namespaces"].append(s.ns)
            run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            state["links"].append(host_end)
            self._save(state)
            run("ip", "link", "set", host_end, "master", BRIDGE)
            run("ip", "link", "set", host_end, "up")
            run("ip", "link", "set", ns_end, "netns", s.ns)
            for cmd in (("ip", "link", "set", "lo", "up"), ("ip", "link", "set", ns_end, "name", "eth0"),
                        ("ip", "addr", "add", f"{s.addr}/24", "dev", "eth0"), ("ip", "link", "set", "eth0", "up")):
                run("ip", "netns", "exec", s.ns, *cmd)
        progress(f"  network: bridge {BRIDGE} {HOST_ADDR}/24, {len(shops)} namespace(s)")

    def _start(self, state: dict[str, Any], name: str, argv: list[str], ns: str | None = None,
               env: dict[str, str] | None = None) -> Child:
        full = ["ip", "netns", "exec", ns, *argv] if ns else argv
        child = Child(name, full, self.dir / "logs" / f"{name}.log", env=env, cwd=self.dir).start()
        self._record(state, child)
        return child

    def _shop(self, s: Shop, state: dict[str, Any], token: Path, copy_mib: int, copy_rate: str) -> None:
        d = self.dir / s.name
        # A fresh fleet every time: only the copy's source file (slow to write) is kept.
        if d.exists():
            for old in d.iterdir():
                if old.name != "data.bin":
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
        for sub in ("tmp", "copies", "backup"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "nginx.conf").write_text(_nginx_conf(s, d))
        self._start(state, f"{s.name}-nginx", [NGINX, "-c", str(d / "nginx.conf")], s.ns)
        wait_until(lambda: http_ok(s.url("shop")), timeout=30, what=f"{s.name} nginx")
        self._start(state, f"{s.name}-nginx-exporter", [
            NGINX_EXPORTER, f"-nginx.scrape-uri={s.url('stub_status', '/stub_status')}",
            f"-web.listen-address={s.addr}:{PORTS['nginx_exporter']}", "-nginx.retries=10", "-nginx.retry-interval=1s"], s.ns)
        py = [self.python, "-m", "promreflex"]
        self._start(state, f"{s.name}-accesslog", [
            *py, "exporter-accesslog", "--log", f"{s.name}={d / 'access.log'}:nginx_timed",
            "--web.listen-address", f"{s.addr}:{PORTS['accesslog']}", "--state.dir", str(d / "accesslog-state")], s.ns)
        agent = {"controller": {
            "listen_address": f"{s.addr}:{PORTS['agent']}", "token_file": str(token),
            "alertmanager_url": state["alertmanager"],
            "prometheus_url": None, "reconcile_interval": "5s",
            "state_file": str(d / "agent-state.db"), "audit_log": str(d / "agent-audit.jsonl"),
            "owner": {"label": "site", "value": s.name},
            "alertmanager_receiver": f"agent-{s.name}",  # (the receiver the fleet's Alertmanager routes it)
            "routes": [{"name": "copy-guard", "matchers": ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted"'],
                        "action": "copy-guard", "params": {"mode": "pause", "registry_dir": str(d / "copies"), "max_pause": "2m"}}],
        }}
        (d / "agent.yml").write_text(yaml.safe_dump(agent, sort_keys=False))
        self._start(state, f"{s.name}-agent", [*py, "controller", "--config.file", str(d / "agent.yml")], s.ns)
        source = d / "data.bin"
        st = source.stat() if source.exists() else None
        # Data, not a hole: promreflex copy keeps holes, so a sparse source would be copied in an
        # instant whatever --rate-limit says (a file of the right size with holes is written again).
        if st is None or st.st_size != copy_mib << 20 or st.st_blocks * 512 < st.st_size:
            block = b"\xa5" * (1 << 20)
            with source.open("wb") as f:
                for _ in range(copy_mib):
                    f.write(block)
        self._start(state, f"{s.name}-copy", [
            *py, "copy", str(source), str(d / "backup" / "data.bin"), "--site", s.name,
            "--registry.dir", str(d / "copies"), "--rate-limit", copy_rate, "--id", f"{s.name}-backup", "--linger", "3600"], s.ns)

    def _control_plane(self, shops: list[Shop], state: dict[str, Any], token: Path, textfile: Path, interval: str) -> None:
        for old in [*self.dir.glob("am-*"), *self.dir.glob("prom-*")]:
            shutil.rmtree(old)
        ne_port = free_port()
        self._start(state, "node-exporter", [
            NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{ne_port}", "--no-collector.systemd",
            f"--collector.textfile.directory={textfile}"])
        am_ports = state["am_ports"]
        cluster_ports = [free_port() for _ in range(3)]
        routes = [{"receiver": f"agent-{s.name}", "matchers": [f'site="{s.name}"']} for s in shops]
        receivers = [{"name": "central", "webhook_configs": []}] + [
            {"name": f"agent-{s.name}", "webhook_configs": [{
                "url": s.url("agent", "/webhook"), "send_resolved": True, "max_alerts": 0,
                "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token)}}}]} for s in shops]
        am = {"route": {"receiver": "central", "group_by": ["..."], "group_wait": "0s", "group_interval": "1s",
                        "repeat_interval": "1h", "routes": routes}, "receivers": receivers}
        (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))
        for i, port in enumerate(am_ports):
            peers = [f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i]
            self._start(state, f"alertmanager-{i}", [
                ALERTMANAGER, f"--config.file={self.dir / 'alertmanager.yml'}", f"--storage.path={self.dir / f'am-{i}'}",
                f"--web.listen-address={HOST_ADDR}:{port}", f"--cluster.listen-address=127.0.0.1:{cluster_ports[i]}",
                f"--cluster.advertise-address=127.0.0.1:{cluster_ports[i]}", *peers])
        scrape = [
            {"job_name": "nginx", "static_configs": [{"targets": [f"{s.addr}:{PORTS['nginx_exporter']}"], "labels": {"site": s.name}} for s in shops]},
            {"job_name": "accesslog", "static_configs": [{"targets": [f"{s.addr}:{PORTS['accesslog']}"]} for s in shops]},
            {"job_name": "promreflex-agent", "static_configs": [{"targets": [f"{s.addr}:{PORTS['agent']}"], "labels": {"site": s.name}} for s in shops]},
            {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{ne_port}"]}]},
        ]
        prom_ports = [free_port(HOST_ADDR) for _ in range(2)]
        for name, port in zip("ab", prom_ports):
            cfg = {"global": {"scrape_interval": interval, "evaluation_interval": interval, "external_labels": {"replica": name}},
                   "rule_files": [str(RULES_DIR / f) for f in RULE_FILES], "scrape_configs": scrape,
                   "alerting": {"alert_relabel_configs": [{"action": "labeldrop", "regex": "replica"}],
                                "alertmanagers": [{"static_configs": [{"targets": [f"{HOST_ADDR}:{p}" for p in am_ports]}]}]}}
            (self.dir / f"prometheus-{name}.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            self._start(state, f"prometheus-{name}", [
                PROMETHEUS, f"--config.file={self.dir / f'prometheus-{name}.yml'}", f"--storage.tsdb.path={self.dir / f'prom-{name}'}",
                f"--web.listen-address={HOST_ADDR}:{port}", "--rules.alert.resend-delay=1s"])
        state["prometheus"] = [f"http://{HOST_ADDR}:{p}" for p in prom_ports]
        self._save(state)
        for url in [*state["prometheus"], *state["alertmanager"]]:
            wait_until(partial(http_ok, f"{url}/-/ready"), timeout=60, what=f"{url} ready")

    # ------------------------------------------------------------------ status / down
    def _foreign_note(self, names: list[str]) -> str:
        return (f"network namespaces {', '.join(names)} exist but no fleet state in {self.dir} names them: a fleet "
                "started with another --dir (the default, .promreflex/fleet, is relative to the directory it was "
                "started from) is up; run `promreflex fleet --dir DIR down` with its directory")

    def status(self) -> list[str]:
        st = self.state()
        if not st.get("pids"):
            others = foreign_namespaces(st)
            return ["no fleet is up" + (f" in {self.dir}; but {self._foreign_note(others)}" if others else "")]
        lines = [f"{e['name']:<24} pid {e['pid']:<8} {'running' if pid_alive(e['pid']) else 'EXITED (see ' + e['log'] + ')'}"
                 for e in st["pids"]]
        return lines + [f"Prometheus: {' '.join(st.get('prometheus', []))}", f"Alertmanager: {' '.join(st.get('alertmanager', []))}"]

    def down(self, progress=print) -> None:  # noqa: ANN001
        st = self.state()
        if not st and (others := foreign_namespaces(st)):
            progress(f"fleet down: nothing to do in {self.dir}; {self._foreign_note(others)}")
            return
        for entry in reversed(st.get("pids", [])):
            terminate(entry["pid"], grace=10)
        stray = 0
        for ns in st.get("namespaces", []):
            # What still runs inside (a process restarted by hand after a drill, the workers of
            # a SIGKILLed nginx master): deleting the name would leave it running, unlisted.
            for _ in range(3):
                pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
                if not pids:
                    break
                for pid in pids:
                    stray += terminate(pid, grace=5)
            run("ip", "netns", "del", ns, check=False)
        for link in reversed(st.get("links", [])):
            run("ip", "link", "del", link, check=False)
        if self.state_file.exists():
            self.state_file.unlink()
        progress(f"fleet down: {len(st.get('pids', []))} process(es), {len(st.get('namespaces', []))} namespace(s) removed"
                 + (f" ({stray} more process(es) found running inside them, stopped)" if stray else "")
                 + (f"; the copies' data stays in {self.dir} (delete it to free the disk)" if self.dir.exists() else ""))

    def load(self, index: int, seconds: float, rate: float) -> int:
        """Offer ``rate`` requests per second to shop ``index`` for ``seconds`` (from the host);
        returns how many were answered."""
        if not rate > 0 or not seconds > 0:
            raise UserError(f"--rate and --seconds must be above 0 (got {rate:g} and {seconds:g})")
        shops = self.state().get("shops", [])
        if Shop(index).name not in shops:
            raise UserError(f"no shop{index} in the fleet up in {self.dir}" + (f" (its shops: {', '.join(shops)})" if shops else " (none is up)"))
        url = Shop(index).url("shop")
        answered, sent, start = 0, 0, time.monotonic()
        while time.monotonic() - start < seconds:
            sent += 1
            answered += http_ok(url, timeout=2)
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        return answered
