"""The four arms, each a set of real processes on loopback: nginx in front of everything.

    none         clients -> nginx -> app
    nginx-limit  clients -> nginx (limit_conn + limit_req, 503 above them) -> app
    page         clients -> nginx -> admission proxy (page scheduler only) -> app
    full         clients -> nginx -> admission proxy (page + session scheduler) -> app

Every arm goes through the same nginx (1 worker, keep-alive to its upstream, timeouts far above
the client timeout so nginx never answers for the app), so the arms differ only in what sits
between nginx and the app. A client that gives up closes its connection; nginx then closes its
upstream connection, which is how the proxy learns that a queued request's client has gone.

nginx's limits are set from the app's measured capacity (what a careful operator would do):
``limit_req`` at the capacity in requests/s with a burst of one second's worth (queued, not
``nodelay``) and ``limit_conn`` at ``conn_per_core`` x cores requests in progress; beyond
either, 503 at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.admission.contention import CacheModel
from bench.admission.pages import PAGES, PAPER_TIMEOUT_S, STATIC_PATH
from promreflex.foundation import nginx_temp_paths
from promreflex.proc import Child, free_port, http_ok, wait_until

ARMS = ("none", "nginx-limit", "page", "full")
ARM_LABELS = {"none": "no control", "nginx-limit": "nginx limit_conn/limit_req",
              "page": "page scheduler only", "full": "page + session scheduler"}
NGINX = "/usr/sbin/nginx"

NGINX_CONF = """worker_processes 1;
pid logs/nginx.pid;
error_log logs/error.log error;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
    access_log off;
""" + nginx_temp_paths("tmp") + """
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream backend {{ server 127.0.0.1:{upstream}; keepalive 256; }}
{zones}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
{limits}
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_connect_timeout 10s;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
        }}
    }}
}}
"""


@dataclass(frozen=True)
class NginxLimits:
    rate_per_s: int
    burst: int
    conn: int

    def zones(self) -> str:
        return ("    limit_conn_zone $server_name zone=site_conn:1m;\n"
                f"    limit_req_zone $server_name zone=site_req:1m rate={self.rate_per_s}r/s;")

    def directives(self) -> str:
        return (f"            limit_conn site_conn {self.conn};\n"
                f"            limit_req zone=site_req burst={self.burst};\n"
                "            limit_conn_status 503;\n            limit_req_status 503;")


def nginx_conf(port: int, upstream: int, limits: NginxLimits | None) -> str:
    return NGINX_CONF.format(port=port, upstream=upstream, zones=limits.zones() if limits else "",
                             limits=limits.directives() if limits else "")


def proxy_config(listen: int, upstream: int, control: int, scale: float, session_scheduler: bool,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``admission:`` section for the bench's app: one page class per servlet (browse x3
    share one), static assets exempt, control windows, idle timeout and the clients' patience
    scaled with the run; everything else is the proxy's shipped default, except the page
    scheduler's own waits and timeout, set far above the client timeout so that only the
    clients give up (as in the paper)."""
    pages: list[dict[str, Any]] = []
    for p in PAGES:
        if p.name not in {q["name"] for q in pages}:
            pattern = "^" + (p.path.rsplit("/", 1)[0] + "/" if p.name == "browse" else p.path + "$")
            pages.append({"name": p.name, "pattern": pattern, **({"logout": True} if p.logout else {})})
    section: dict[str, Any] = {
        "listen_address": f"127.0.0.1:{listen}",
        "upstream": f"http://127.0.0.1:{upstream}",
        "exempt": ["^" + STATIC_PATH.rsplit("/", 1)[0] + "/"],
        "pages": pages,
        "page_scheduler": {"window": round(10.0 * scale, 3), "timeout": 600.0, "max_queue_wait": 600.0},
        # The visitors' patience, scaled like every other duration (the paper's 60 s browser, the
        # same for every condition: an operator states it once); the proxy's session queue wait
        # and page-wait target default to shares of it (``controllers/admission/config.py``).
        "session": {"idle_timeout": round(120.0 * scale, 3), "client_timeout": round(PAPER_TIMEOUT_S * scale, 3)},
        "session_scheduler": {"enabled": session_scheduler},
        "control": {"listen_address": f"127.0.0.1:{control}"},
    }
    for dotted, value in (overrides or {}).items():
        node = section
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return {"admission": section}


def _constant(pids: list[int]) -> Callable[[], Iterable[int]]:
    return lambda: pids


@dataclass
class ArmStack:
    """App, optional proxy and nginx for one arm; ``start()``, then ``url``; ``stop()`` ends all."""

    arm: str
    scale: float
    workers: int
    iters_per_ms: float
    limits: NginxLimits | None = None
    proxy_overrides: dict[str, Any] = field(default_factory=dict)
    with_nginx: bool = True
    app_scale: float | None = None  # the app's page work, when not ``scale`` (0: no work, for the overhead)
    cache: CacheModel = field(default_factory=CacheModel)  # the app's contention model
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="admbench-")))
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r}: one of {', '.join(ARMS)}")
        self.app_port, self.proxy_port, self.control_port, self.nginx_port = (free_port() for _ in range(4))

    @property
    def url(self) -> str:
        port = self.nginx_port if self.with_nginx else (self.proxy_port if self.has_proxy else self.app_port)
        return f"http://127.0.0.1:{port}"

    @property
    def app_url(self) -> str:
        return f"http://127.0.0.1:{self.app_port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def has_proxy(self) -> bool:
        return self.arm in ("page", "full")

    def pids(self) -> dict[str, list[int]]:
        return {c.name: [c.pid] for c in self.children if c.popen is not None}

    def pid_sources(self) -> dict[str, Callable[[], Iterable[int]]]:
        """For :class:`bench.conditions.HostSampler`: each process (and its children) by name."""
        return {name: _constant(pids) for name, pids in self.pids().items()}

    def _start(self, name: str, argv: list[str], ready_url: str) -> Child:
        child = Child(name, argv, self.workdir / f"{name}.log", cwd=Path(__file__).resolve().parents[2]).start()
        self.children.append(child)
        try:
            wait_until(lambda: http_ok(ready_url, timeout=0.5) or not child.alive(), timeout=30, what=f"{name} ready")
        except Exception:
            raise RuntimeError(f"{name} did not start: {child.tail()}") from None
        if not child.alive():
            raise RuntimeError(f"{name} exited at start: {child.tail()}")
        return child

    def app_argv(self, port: int) -> list[str]:
        return [sys.executable, "-m", "bench.admission.app", "--port", str(port), "--workers", str(self.workers),
                "--scale", str(self.scale if self.app_scale is None else self.app_scale),
                "--iters-per-ms", f"{self.iters_per_ms:.3f}", *self.cache.argv()]

    def start(self) -> ArmStack:
        try:
            self._start("app", self.app_argv(self.app_port), f"{self.app_url}/stats")
            upstream = self.app_port
            if self.has_proxy:
                cfg = proxy_config(self.proxy_port, self.app_port, self.control_port, self.scale,
                                   session_scheduler=self.arm == "full", overrides=self.proxy_overrides)
                path = self.workdir / "admission.yml"
                path.write_text(yaml.safe_dump(cfg, sort_keys=False))
                self._start("proxy", [sys.executable, "-m", "controllers.admission", "proxy", "--config.file", str(path)],
                            f"{self.control_url}/-/ready")
                upstream = self.proxy_port
            if self.with_nginx:
                prefix = self.workdir / "nginx"
                for d in ("logs", "tmp"):
                    (prefix / d).mkdir(parents=True, exist_ok=True)
                conf = prefix / "nginx.conf"
                conf.write_text(nginx_conf(self.nginx_port, upstream, self.limits if self.arm == "nginx-limit" else None))
                self._start("nginx", [NGINX, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                            f"{self.url}{STATIC_PATH}")
        except BaseException:
            self.stop()
            raise
        return self

    def add_proxy(self, name: str, overrides: dict[str, Any]) -> tuple[int, int]:
        """One more full-scheme proxy in front of the same app (no nginx), with ``overrides`` on
        top of the stack's; returns its (listen, control) ports. Stopped with the stack."""
        listen, control = free_port(), free_port()
        cfg = proxy_config(listen, self.app_port, control, self.scale, session_scheduler=True,
                           overrides={**self.proxy_overrides, **overrides})
        path = self.workdir / f"{name}.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self._start(name, [sys.executable, "-m", "controllers.admission", "proxy", "--config.file", str(path)],
                    f"http://127.0.0.1:{control}/-/ready")
        return listen, control

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(grace=5)
            try:  # the app's worker processes, nginx's worker: the child's whole session
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.children.clear()

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
