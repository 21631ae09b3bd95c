"""The end-to-end tests' shared stack. Package scope (with tests/e2e/__init__.py): it stops
after the last end-to-end test, not at the session's end, so the ~2,000 integration and unit
tests that follow do not run beside a Prometheus evaluating ~100 rules every 200 ms."""

from __future__ import annotations

import json

import pytest

from promreflex.proc import pid_alive, wait_until
from promreflex.stack import Stack
from tests.conftest import LiveStack, stack_config


@pytest.fixture(scope="package")
def live_stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("stack")
    stack = Stack(stack_config(state))
    stack.up(progress=lambda *_: None)
    live = LiveStack(stack)
    try:
        wait_until(lambda: live.query('up{job="selftest"} == 1'), timeout=60, what="first selftest scrape")
        yield live
    finally:
        pids = list(json.loads(stack.pids_file.read_text())["components"].values()) if stack.pids_file.exists() else []
        stack.down(quiet=True)
        for info in pids:
            assert not pid_alive(info["pid"]), f"pid {info['pid']} survived stack down"
