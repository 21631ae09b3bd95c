"""Foreign copies: a real ``cp`` adopted through the CLI, frozen and thawed by the copy-guard
action with every method this host offers (cgroup v2 freezer, v1 freezer, SIGSTOP/SIGCONT);
the watchdog resuming it when the pause lease is not renewed; and a real ``promreflex copy``
resuming itself when the controller that paused it stops renewing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controllers.actions.base import ActionContext
from controllers.copy_guard import freeze
from controllers.copy_guard.action import CopyGuardAction, CopyGuardParams
from controllers.copy_guard.registry import Registry
from controllers.models import Alert
from promreflex.proc import Timeout, pid_alive, terminate, wait_until
from tests.payloads import alert

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "promreflex"]


class FifoCopy:
    """``cp FIFO DST``: cp copies whatever the test writes into the FIFO, so it progresses exactly
    when the test says and no faster (a bounded, slow, real copy)."""

    def __init__(self, tmp: Path):
        self.fifo, self.dst = tmp / "in.fifo", tmp / "out.bin"
        os.mkfifo(self.fifo)
        self.proc = subprocess.Popen(["cp", str(self.fifo), str(self.dst)], start_new_session=True)
        self.w = os.open(self.fifo, os.O_WRONLY)  # blocks until cp opens the FIFO
        self.sent = b""

    def send(self, data: bytes) -> None:
        os.write(self.w, data)
        self.sent += data

    def size(self) -> int:
        return self.dst.stat().st_size if self.dst.exists() else 0

    def progresses(self, timeout: float) -> bool:
        try:
            wait_until(lambda: self.size() == len(self.sent), timeout=timeout, what="cp to catch up")
            return True
        except Timeout:
            return False

    def finish(self) -> int:
        os.close(self.w)
        return self.proc.wait(timeout=20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            freeze.resume({"method": "signal", "pgid": self.proc.pid})
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def cp(tmp_path):
    c = FifoCopy(tmp_path)
    yield c
    c.kill()


def adopt(reg: Path, pgid: int) -> str:
    out = subprocess.run([*CLI, "copy-guard", "adopt", f"--pgid={pgid}", "--site=shop", f"--registry.dir={reg}",
                          "--id=cp1"], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


def ctx(params, status="firing"):
    return ActionContext(route="copy-guard", params=params,
                         alert=Alert.model_validate(alert("CopyGuardSiteOverloaded", status=status, site="shop")))


@pytest.mark.parametrize("method", freeze.detect())
async def test_an_adopted_cp_is_paused_and_resumed_by_the_action(tmp_path, cp, method):
    reg = tmp_path / "copies"
    assert "adopted process group" in adopt(reg, cp.proc.pid)
    cp.send(os.urandom(100_000))
    assert cp.progresses(timeout=10)

    action = CopyGuardAction()
    params = CopyGuardParams(registry_dir=reg, adopt_methods=[method], watchdog=False, lease=60)
    assert await action.fire(ctx(params)) == "site shop: 1 copy paused"
    record = Registry(reg).get("cp1").pause
    assert record["method"] == method and freeze.is_frozen(record)
    if method == "signal":
        assert freeze.stopped(cp.proc.pid)
    cp.send(os.urandom(30_000))  # fits in the pipe buffer; a frozen cp does not take it
    assert not cp.progresses(timeout=0.5)

    assert await action.resolve(ctx(params, status="resolved")) == "site shop: 1 copy resumed"
    assert Registry(reg).get("cp1").pause is None
    assert cp.progresses(timeout=10)
    assert cp.finish() == 0
    assert cp.dst.read_bytes() == cp.sent
    assert not list(Path(record.get("root", "/nonexistent")).glob("promreflex-copy-*"))  # cgroup removed
    assert Registry(reg).entries() == []  # cp ended: its entry is stale and cleaned


async def test_the_watchdog_resumes_an_adopted_copy_when_the_lease_runs_out(tmp_path, cp):
    reg = tmp_path / "copies"
    adopt(reg, cp.proc.pid)
    action = CopyGuardAction()
    params = CopyGuardParams(registry_dir=reg, lease=1, watchdog=True)
    await action.fire(ctx(params))
    watchdog = action._watchdogs[reg]
    try:
        cp.send(os.urandom(20_000))
        assert not cp.progresses(timeout=0.3)
        # The controller "dies": nobody renews the lease. The watchdog must resume cp.
        assert cp.progresses(timeout=15)
        # The process runs again a moment before the watchdog records it in the registry.
        wait_until(lambda: Registry(reg).get("cp1").pause is None, timeout=15, what="the watchdog to clear the pause")
        # ... and logs it after that.
        wait_until(lambda: "lease of cp1" in (reg / "watchdog.log").read_text(), timeout=15, what="the watchdog's log line")
    finally:
        terminate(watchdog.pid, grace=5)
        watchdog.wait(timeout=5)
    assert not pid_alive(watchdog.pid)
    assert cp.finish() == 0


async def test_a_real_copier_resumes_itself_when_the_controller_stops_renewing(tmp_path):
    src, dst, reg = tmp_path / "src.bin", tmp_path / "dst.bin", tmp_path / "copies"
    src.write_bytes(os.urandom(1 << 20))
    proc = subprocess.Popen([*CLI, "copy", str(src), str(dst), f"--registry.dir={reg}", "--rate-limit=2M",
                             "--chunk-size=64K", "--id=c1"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: Registry(reg).get("c1"), timeout=20, what="the copy to register")
        action = CopyGuardAction()
        params = CopyGuardParams(registry_dir=reg, lease=1, watchdog=False)
        assert await action.fire(ctx(params)) == "site shop: 1 copy paused"
        # No tick, no resolve: as if the controller had been SIGKILLed after pausing.
        assert proc.wait(timeout=30) == 0
        assert "paused lease expired" in proc.stderr.read()
        assert dst.read_bytes() == src.read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
