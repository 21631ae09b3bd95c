"""Shared fixtures. ``live_stack`` starts the real local stack (Prometheus, Alertmanager,
node_exporter, nginx, nginx exporter, controller) on free loopback ports, once per session,
and stops every process it started."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from promreflex.config import load_config, ports_model
from promreflex.proc import free_port
from promreflex.stack import Stack

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _copy_registry(tmp_path_factory: pytest.TempPathFactory):
    """The copy guard's default registry is absolute (/var/lib/promreflex/copies as root): tests
    that start the shipped routes must not create it on the machine, nor see a user's copies."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PROMREFLEX_COPY_REGISTRY", str(tmp_path_factory.mktemp("copy-registry")))
    yield
    mp.undo()


@pytest.fixture(scope="session", autouse=True)
def _calibrate_records(tmp_path_factory: pytest.TempPathFactory):
    """calibrate's records of its loads (and its per-site and per-shop locks) live in the
    user's cache: a test in this process must not see a real calibration's (one running on the
    machine made a unit test's calibrate refuse, "another calibration of site 'shop'"), nor
    leave its own there. Subprocesses keep the user's cache (XDG_CACHE_HOME also moves uv's)."""
    from controllers.copy_guard import calibrate

    mp = pytest.MonkeyPatch()
    mp.setattr(calibrate, "LAST_LOAD", tmp_path_factory.mktemp("calibrate-cache") / "calibrate-last-load")
    yield
    mp.undo()


def stack_config(state_dir: Path, **controller: Any):
    ports = {name: free_port() for name in ports_model().model_fields}
    overrides = {
        "stack.state_dir": str(state_dir),
        "stack.ports": ports,
        "controller.reconcile_interval": "1s",
        "controller.routes": [
            {"name": "selftest-log", "matchers": ['alertname="PromreflexSelftest"'], "action": "log"},
            {"name": "nginx-down-log", "matchers": ['alertname="NginxDown"'], "action": "log"},
        ],
    }
    overrides.update({f"controller.{k}": v for k, v in controller.items()})
    return load_config(None, overrides)


class LiveStack:
    def __init__(self, stack: Stack):
        self.stack = stack

    def __getattr__(self, name):
        return getattr(self.stack, name)

    @property
    def prometheus_url(self) -> str:
        return self.stack.url("prometheus")

    @property
    def alertmanager_url(self) -> str:
        return self.stack.url("alertmanager")

    @property
    def controller_url(self) -> str:
        return self.stack.url("controller")

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def am_alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.alertmanager_url}/api/v2/alerts?active=true", timeout=5) as resp:  # noqa: S310
            return json.load(resp)

    def pids(self) -> dict[str, int]:
        return {n: i["pid"] for n, i in json.loads(self.stack.pids_file.read_text())["components"].items()}


@pytest.fixture
def corpus_dir() -> Path:
    """The real-world corpus root (tests/corpus.py): skipped when missing, a failure under CI=true."""
    from tests.corpus import require_corpus

    return require_corpus()
