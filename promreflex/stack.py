"""The local stack: Prometheus, Alertmanager, node_exporter, nginx with a demo site, the nginx
exporter and the promreflex controller, all on loopback, supervised from a state directory.

Everything the stack needs is rendered into ``state_dir`` (configs, the webhook token, TSDB,
logs, ``pids.json``), so ``stack down`` stops exactly what ``stack up`` started, by PID, and
nothing outside that directory is touched. Intervals are the fast ones measured in
STACK-NOTES.md: controllers answer within about a second of a metric crossing a threshold.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from promreflex.config import Config, format_duration
from promreflex.fsutil import atomic_write_json, atomic_write_text, read_json
from promreflex.proc import Child, Timeout, http_ok, pid_alive, port_in_use, terminate, wait_until

BINARIES = {
    "prometheus": "/usr/bin/prometheus",
    "alertmanager": "/usr/bin/prometheus-alertmanager",
    "node_exporter": "/usr/bin/prometheus-node-exporter",
    "nginx": "/usr/sbin/nginx",
    "nginx_exporter": "/usr/bin/prometheus-nginx-exporter",
}

# The access-log format the stack's nginx writes: nginx "combined" plus request and upstream
# times, which the access-log exporter turns into a latency histogram.
NGINX_LOG_FORMAT = (
    '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent" rt=$request_time urt="$upstream_response_time"'
)


class StackError(Exception):
    """The stack cannot start or stop as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Component:
    name: str
    port: int
    ready_url: str
    argv: list[str]


class Stack:
    def __init__(self, cfg: Config, python: str = sys.executable, extra_components: list[Component] | None = None):
        """``extra_components`` (a benchmark's backend, a capability's exporter) start first,
        before Prometheus, and are stopped last, like the built-in ones."""
        self.cfg = cfg
        self.extra_components = list(extra_components or [])
        self.s = cfg.stack
        self.dir = self.s.state_dir.resolve()
        self.python = python
        self.host = self.s.host

    # ------------------------------------------------------------------ addresses
    def url(self, component: str) -> str:
        port = getattr(self.s.ports, component)
        return f"http://{self.host}:{port}"

    @property
    def urls(self) -> dict[str, str]:
        return {
            "prometheus": self.url("prometheus"),
            "alertmanager": self.url("alertmanager"),
            "node_exporter": self.url("node_exporter") + "/metrics",
            "nginx": self.url("nginx") + "/",
            "nginx_exporter": self.url("nginx_exporter") + "/metrics",
            "accesslog_exporter": self.url("accesslog_exporter") + "/metrics",
            "controller": self.url("controller") + "/metrics",
            **{c.name: c.ready_url for c in self.extra_components},
        }

    @property
    def pids_file(self) -> Path:
        return self.dir / "pids.json"

    @property
    def token_file(self) -> Path:
        return self.dir / "webhook-token"

    @property
    def textfile_dir(self) -> Path:
        return self.dir / "textfile"

    @property
    def audit_log(self) -> Path:
        return self.dir / "controller" / "audit.jsonl"

    @property
    def nginx_access_log(self) -> Path:
        return self.dir / "nginx" / "access.log"

    # ------------------------------------------------------------------ rendering
    def prometheus_config(self) -> dict[str, Any]:
        fast, slow = format_duration(self.s.fast_interval), format_duration(self.s.slow_interval)
        h, p = self.host, self.s.ports

        def job(name: str, port: int, interval: str, **extra: Any) -> dict[str, Any]:
            return {"job_name": name, "scrape_interval": interval, "scrape_timeout": interval,
                    "static_configs": [{"targets": [f"{h}:{port}"]}], **extra}

        return {
            "global": {"scrape_interval": slow, "scrape_timeout": slow, "evaluation_interval": fast,
                       "external_labels": {"stack": "promreflex-local"}},
            "rule_files": [str(self.s.rules_dir.resolve() / "*.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{h}:{p.alertmanager}"]}]}]},
            "scrape_configs": [
                job("prometheus", p.prometheus, slow),
                job("alertmanager", p.alertmanager, slow),
                job("node", p.node_exporter, slow),
                job("selftest", p.node_exporter, fast, params={"collect[]": ["textfile"]}),
                job("nginx", p.nginx_exporter, "1s"),
                job("accesslog", p.accesslog_exporter, fast),
                job("promreflex-controller", p.controller, fast),
                *[{"job_name": j.job, "metrics_path": j.metrics_path,
                   "scrape_interval": format_duration(j.interval or self.s.fast_interval),
                   "scrape_timeout": format_duration(j.interval or self.s.fast_interval),
                   "static_configs": [{"targets": j.targets}]} for j in self.s.extra_scrape],
            ],
        }

    def alertmanager_config(self) -> dict[str, Any]:
        gi = format_duration(self.s.group_interval)
        return {
            "route": {
                "receiver": "promreflex",
                "group_by": ["..."],
                "group_wait": "0s",
                "group_interval": gi,
                "repeat_interval": "1h",
                # Watchdog every minute: the controller's last-notification time doubles as a
                # heartbeat of the whole alerting path.
                "routes": [{"matchers": ['alertname="Watchdog"'], "receiver": "promreflex", "repeat_interval": "1m"}],
            },
            "receivers": [{
                "name": "promreflex",
                "webhook_configs": [{
                    "url": f"{self.url('controller')}/webhook",
                    "send_resolved": True,
                    "max_alerts": 0,
                    "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(self.token_file)}},
                }],
            }],
            "inhibit_rules": [{
                "source_matchers": ['alertname="PromreflexTargetDown"'],
                "target_matchers": ['severity=~"warning|info"'],
                "equal": ["job"],
            }, {
                # The rca action posts MeshRootCauseSymptom{service=<dependant>} for each service
                # a root cause explains: mute that service's own response-time alert.
                "source_matchers": ['alertname="MeshRootCauseSymptom"'],
                "target_matchers": ['alertname="ServiceResponseTimeHigh"'],
                "equal": ["service"],
            }],
        }

    def nginx_config(self) -> str:
        d, p, h = self.dir / "nginx", self.s.ports, self.host
        if self.s.upstream:
            location = (f"location / {{ proxy_pass http://{self.s.upstream}; proxy_http_version 1.1; "
                        'proxy_set_header Connection ""; proxy_set_header Host $host; }')
        else:
            location = "location / { index index.html; }"
        return f"""# Rendered by promreflex stack; edits are overwritten at the next `stack up`.
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    types {{ text/html html; text/css css; application/javascript js; image/svg+xml svg; }}
    default_type application/octet-stream;
    log_format promreflex '{NGINX_LOG_FORMAT}';
    access_log {d}/access.log promreflex;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    keepalive_timeout 65;
    server {{
        listen {h}:{p.nginx};
        root {self.s.site_dir.resolve()};
        {location}
    }}
    server {{
        listen {h}:{p.nginx_stub_status};
        access_log off;
        location = /stub_status {{ stub_status; }}
    }}
}}
"""

    def controller_config(self) -> dict[str, Any]:
        c = self.cfg.controller.model_dump(mode="json")
        c.update({
            "listen_address": f"{self.host}:{self.s.ports.controller}",
            "alertmanager_url": self.url("alertmanager"),
            "prometheus_url": self.url("prometheus"),
            "token_file": str(self.token_file),
            "audit_log": str(self.audit_log),
            "state_file": str(self.dir / "controller" / "state.json"),
        })
        return {"controller": c}

    def render(self) -> None:
        for sub in ("prometheus/data", "alertmanager/data", "nginx/tmp", "controller", "logs", "textfile"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not self.token_file.exists():
            atomic_write_text(self.token_file, secrets.token_urlsafe(32) + "\n", mode=0o600)
        dump = lambda d: yaml.safe_dump(d, sort_keys=False)  # noqa: E731
        atomic_write_text(self.dir / "prometheus" / "prometheus.yml", dump(self.prometheus_config()))
        atomic_write_text(self.dir / "alertmanager" / "alertmanager.yml", dump(self.alertmanager_config()))
        atomic_write_text(self.dir / "nginx" / "nginx.conf", self.nginx_config())
        atomic_write_text(self.dir / "controller" / "promreflex.yml", dump(self.controller_config()))
        switch = self.textfile_dir / "promreflex_selftest.prom"
        if not switch.exists():
            write_selftest_switch(self.textfile_dir, False)

    def components(self) -> list[Component]:
        d, h, p = self.dir, self.host, self.s.ports
        return [
            *self.extra_components,
            Component("prometheus", p.prometheus, self.url("prometheus") + "/-/ready", [
                BINARIES["prometheus"], f"--config.file={d}/prometheus/prometheus.yml",
                f"--storage.tsdb.path={d}/prometheus/data", f"--web.listen-address={h}:{p.prometheus}",
                f"--rules.alert.resend-delay={format_duration(self.s.resend_delay)}",
                "--storage.tsdb.retention.time=2d", "--web.enable-lifecycle",
            ]),
            Component("alertmanager", p.alertmanager, self.url("alertmanager") + "/-/ready", [
                BINARIES["alertmanager"], f"--config.file={d}/alertmanager/alertmanager.yml",
                f"--storage.path={d}/alertmanager/data", f"--web.listen-address={h}:{p.alertmanager}",
                "--cluster.listen-address=",
            ]),
            Component("node_exporter", p.node_exporter, self.url("node_exporter") + "/metrics", [
                BINARIES["node_exporter"], f"--web.listen-address={h}:{p.node_exporter}",
                "--no-collector.systemd", f"--collector.textfile.directory={self.textfile_dir}",
            ]),
            Component("nginx", p.nginx, f"http://{h}:{p.nginx_stub_status}/stub_status", [
                BINARIES["nginx"], "-c", f"{d}/nginx/nginx.conf", "-p", f"{d}/nginx", "-g", "daemon off;",
            ]),
            Component("nginx_exporter", p.nginx_exporter, self.url("nginx_exporter") + "/metrics", [
                BINARIES["nginx_exporter"], f"-nginx.scrape-uri=http://{h}:{p.nginx_stub_status}/stub_status",
                f"-web.listen-address={h}:{p.nginx_exporter}", "-nginx.retries=10", "-nginx.retry-interval=1s",
            ]),
            Component("accesslog_exporter", p.accesslog_exporter, self.url("accesslog_exporter") + "/metrics", [
                self.python, "-m", "promreflex", "exporter-accesslog",
                f"--log={self.s.site}={self.nginx_access_log}:nginx_timed",
                f"--web.listen-address={h}:{p.accesslog_exporter}", f"--state.dir={d}/accesslog",
            ]),
            Component("controller", p.controller, self.url("controller") + "/-/ready", [
                self.python, "-m", "promreflex", "controller", f"--config.file={d}/controller/promreflex.yml",
            ]),
        ]

    # ------------------------------------------------------------------ lifecycle
    def running(self) -> dict[str, int]:
        """Components of a stack started from this state dir that are still alive."""
        alive = {}
        for name, info in self._recorded().items():
            pid = info["pid"]
            if pid_alive(pid) and _cmdline_starts_with(pid, info["argv0"]):
                alive[name] = pid
        return alive

    def preflight(self) -> None:
        alive = self.running()
        if alive:
            listing = ", ".join(f"{n} pid {pid}" for n, pid in alive.items())
            raise StackError(
                f"a stack is already running from {self.dir} ({listing}).\n"
                f"Prometheus: {self.url('prometheus')}  -- stop it with: promreflex stack down"
            )
        missing = [b for b in BINARIES.values() if not os.access(b, os.X_OK)]
        if missing:
            raise StackError(f"missing binaries: {', '.join(missing)}; run `make deps` (scripts/install-system.sh)")
        busy = [(name, port) for name, port in self.s.ports.model_dump().items() if port_in_use(self.host, port)]
        if busy:
            listing = ", ".join(f"{port} ({name})" for name, port in busy)
            raise StackError(
                f"port(s) already in use on {self.host}: {listing}. Another program (or a stack from another "
                "state dir) holds them; set stack.ports.<name> in the config file to use others."
            )

    def up(self, timeout: float = 60.0, progress=print) -> dict[str, int]:
        """Start every component, in order, each ready before the next; returns PIDs."""
        self.preflight()
        self.render()
        try:
            for comp in self.components():
                self.start_component(comp.name, timeout=timeout, progress=progress)
        except BaseException:
            self.down(quiet=True)
            raise
        return {name: info["pid"] for name, info in self._recorded().items()}

    def _recorded(self) -> dict[str, dict[str, Any]]:
        return (read_json(self.pids_file, default={}) or {}).get("components", {})

    def start_component(self, name: str, timeout: float = 60.0, progress=print) -> int:
        """Start one component (again) and record its PID; waits until it is ready."""
        comp = next(c for c in self.components() if c.name == name)
        child = Child(comp.name, comp.argv, self.dir / "logs" / f"{comp.name}.log").start()
        recorded = self._recorded()
        recorded[comp.name] = {"pid": child.pid, "argv0": comp.argv[0], "port": comp.port, "log": str(child.log_path)}
        started = (read_json(self.pids_file, default={}) or {}).get("started", time.time())
        # Insertion order is start order: `down` stops in reverse.
        atomic_write_json(self.pids_file, {"started": started, "components": recorded}, sort_keys=False)
        t0 = time.monotonic()
        try:
            wait_until(lambda: _ready_or_dead(comp, child), timeout=timeout, what=f"{comp.name} ready")
        except Timeout as e:
            raise StackError(f"{comp.name} did not become ready: {e}\n--- {child.log_path}:\n{child.tail()}") from e
        if not child.alive():
            raise StackError(f"{comp.name} exited at start (code {child.popen.returncode}).\n"
                             f"--- {child.log_path}:\n{child.tail()}")
        progress(f"  {comp.name:<19} ready in {time.monotonic() - t0:4.1f}s  pid {child.pid:<7} {self.urls[comp.name]}")
        return child.pid

    def stop_component(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one recorded component (SIGKILL to simulate a crash); it stays recorded, so
        ``start_component`` can bring it back and ``down`` still knows about it."""
        info = self._recorded()[name]
        if pid_alive(info["pid"]) and _cmdline_starts_with(info["pid"], info["argv0"]):
            terminate(info["pid"], grace=15, sig=sig)

    def down(self, quiet: bool = False, progress=print) -> list[str]:
        """Stop what ``up`` started (reverse order), by PID. pids.json is removed only when
        nothing it names is left running, so a failed stop can be retried."""
        recorded = read_json(self.pids_file, default={}) or {}
        components = recorded.get("components", {})
        stopped, left = [], {}
        for name, info in reversed(list(components.items())):
            pid = info["pid"]
            if not (pid_alive(pid) and _cmdline_starts_with(pid, info["argv0"])):
                continue
            if terminate(pid, grace=15):
                stopped.append(name)
                if not quiet:
                    progress(f"  stopped {name} (pid {pid})")
            else:
                left[name] = info
                progress(f"  could not stop {name} (pid {pid})")
        if left:
            atomic_write_json(self.pids_file, {**recorded, "components": left}, sort_keys=False)
        else:
            self.pids_file.unlink(missing_ok=True)
        return stopped

    def check_children(self) -> list[str]:
        """Names of recorded components that died."""
        return [n for n, i in self._recorded().items() if not pid_alive(i["pid"])]

    def wipe(self) -> None:
        """Remove the state directory (tests use a temporary one)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _ready_or_dead(comp: Component, child: Child) -> bool:
    return (not child.alive()) or http_ok(comp.ready_url)


def _cmdline_starts_with(pid: int, argv0: str) -> bool:
    """Guards against PID reuse: only signal a process that still runs the recorded program.
    nginx rewrites its title (``nginx: master process /usr/sbin/nginx -c ...``), so the program
    may stand anywhere in the command line."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    first = cmd.split(" ", 1)[0]
    return argv0 in cmd or Path(first.rstrip(":")).name == Path(argv0).name


def write_selftest_switch(textfile_dir: Path, on: bool) -> Path:
    """The self-test gauge node_exporter's textfile collector serves: flips PromreflexSelftest."""
    path = textfile_dir / "promreflex_selftest.prom"
    atomic_write_text(path, (
        "# HELP promreflex_selftest_switch 1 while the self-test alert should fire (promreflex selftest fire).\n"
        "# TYPE promreflex_selftest_switch gauge\n"
        f"promreflex_selftest_switch {1 if on else 0}\n"
    ))
    return path


def describe(stack: Stack) -> str:
    return json.dumps(stack.urls, indent=2)
