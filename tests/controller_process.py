"""The real controller process (``python -m promreflex controller``) on a free loopback port,
for tests and benchmarks that kill, restart or load it."""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from promreflex.proc import Child, free_port, http_ok, wait_until

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ControllerProcess:
    dir: Path
    routes: list[dict[str, Any]]
    alertmanager_url: str | list[str] | None = None  # a list: a cluster's peers
    settings: dict[str, Any] = field(default_factory=dict)  # more controller.* keys
    port: int = field(default_factory=free_port)
    child: Child | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.db"

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.jsonl"

    @property
    def log_path(self) -> Path:
        return self.dir / "controller.log"

    def config_file(self) -> Path:
        path = self.dir / "promreflex.yml"
        controller = {
            "listen_address": f"127.0.0.1:{self.port}", "alertmanager_url": self.alertmanager_url,
            "prometheus_url": None, "state_file": str(self.state_file), "audit_log": str(self.audit_log),
            "routes": self.routes, **self.settings,
        }
        path.write_text(yaml.safe_dump({"controller": controller}))
        return path

    def start(self, timeout: float = 60.0) -> ControllerProcess:
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "promreflex", "controller", "--config.file", str(self.config_file())]
        self.child = Child("controller", argv, self.log_path, cwd=REPO).start()
        self.starts += 1
        wait_until(lambda: self.alive() and http_ok(f"{self.url}/-/ready"), timeout=timeout,
                   what=f"controller ready on {self.url} (log: {self.log_path})")
        return self

    def alive(self) -> bool:
        if self.child is None or not self.child.alive():
            raise RuntimeError(f"the controller exited; log: {self.log_path.read_text()[-2000:]}")
        return True

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.child is not None and self.child.popen is not None and self.child.popen.poll() is None:
            self.child.popen.send_signal(signal.SIGKILL)
            self.child.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
