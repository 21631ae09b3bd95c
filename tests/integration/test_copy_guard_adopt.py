"""Foreign copies: a real ``cp`` adopted through the CLI, frozen and thawed by the copy-guard
action with every method this host offers (cgroup v2 freezer, v1 freezer, SIGSTOP/SIGCONT);
the watchdog resuming it when the pause lease is not renewed; a real ``dd`` duty-cycled by the
adaptive throttle through the real watchdog, and let go when the controller stops renewing; a
real ``promreflex copy`` throttled to a share, paused in an emergency and let go by the adaptive
action, and resuming itself when the controller that paused it stops renewing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controllers.actions.base import ActionContext
from controllers.copy_guard import freeze
from controllers.copy_guard.action import CopyGuardAction, CopyGuardParams
from controllers.copy_guard.registry import Registry
from controllers.models import Alert
from promreflex.proc import Timeout, pid_alive, terminate, wait_until
from tests.payloads import alert
from tests.unit.test_copy_guard_action import FakePrometheus

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


@pytest.mark.parametrize("method", [m for m in freeze.detect() if m != "signal"])
async def test_two_registries_copies_of_one_name_are_two_cgroups(tmp_path, method):
    """Two guards on one host (two registries) each adopt a copy named cp1: pausing one leaves
    the other running (they shared the cgroup promreflex-copy-cp1, and one guard's duty cycle
    froze the other's copy)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = FifoCopy(tmp_path / "a"), FifoCopy(tmp_path / "b")
    try:
        adopt(tmp_path / "a" / "copies", a.proc.pid)
        adopt(tmp_path / "b" / "copies", b.proc.pid)
        guards = {}
        for name in ("a", "b"):
            params = CopyGuardParams(registry_dir=tmp_path / name / "copies", mode="pause", adopt_methods=[method],
                                     watchdog=False, lease=60)
            guards[name] = (CopyGuardAction(), params)
            assert await guards[name][0].fire(ctx(params)) == "site shop: 1 copy paused"
        records = {n: Registry(tmp_path / n / "copies").get("cp1").pause for n in guards}
        assert records["a"]["cgroup"] != records["b"]["cgroup"]
        a.send(os.urandom(30_000))
        b.send(os.urandom(30_000))
        assert not a.progresses(timeout=0.5) and not b.progresses(timeout=0.5)
        # a's guard lets its copy go; b's copy stays paused, as b's guard holds it
        action, params = guards["a"]
        assert await action.resolve(ctx(params, status="resolved")) == "site shop: 1 copy resumed"
        assert a.progresses(timeout=10)
        assert not b.progresses(timeout=1.0) and freeze.is_frozen(records["b"])
        action, params = guards["b"]
        assert await action.resolve(ctx(params, status="resolved")) == "site shop: 1 copy resumed"
        assert b.progresses(timeout=10)
        assert a.finish() == 0 and b.finish() == 0
    finally:
        for name in ("a", "b"):  # a failed assertion must not leave a copy frozen in its cgroup
            entry = Registry(tmp_path / name / "copies").get("cp1")
            if entry is not None and entry.pause:
                freeze.resume(entry.pause)
        a.kill()
        b.kill()


@pytest.mark.parametrize("method", freeze.detect())
async def test_an_adopted_cp_is_paused_and_resumed_by_the_action(tmp_path, cp, method):
    reg = tmp_path / "copies"
    assert "adopted process group" in adopt(reg, cp.proc.pid)
    cp.send(os.urandom(100_000))
    assert cp.progresses(timeout=10)

    action = CopyGuardAction()
    params = CopyGuardParams(registry_dir=reg, mode="pause", adopt_methods=[method], watchdog=False, lease=60)
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
    if "cgroup" in record:  # this copy's cgroup is removed (not any promreflex-copy-*: another user's may exist)
        assert not Path(record["cgroup"]).exists()
    assert Registry(reg).entries() == []  # cp ended: its entry is stale and cleaned


async def test_the_watchdog_resumes_an_adopted_copy_when_the_lease_runs_out(tmp_path, cp):
    reg = tmp_path / "copies"
    adopt(reg, cp.proc.pid)
    action = CopyGuardAction()
    # a lease of 3 s: "not progressing" is checked well inside it (with 1 s, 0.65 s before it ran out)
    params = CopyGuardParams(registry_dir=reg, mode="pause", lease=3, watchdog=True)
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


def start_copier(tmp: Path, size: int, rate: str) -> tuple[Path, Path, Path, subprocess.Popen]:
    """A real ``promreflex copy`` of ``size`` random bytes at ``rate``, registered as c1."""
    src, dst, reg = tmp / "src.bin", tmp / "dst.bin", tmp / "copies"
    src.write_bytes(os.urandom(size))
    proc = subprocess.Popen([*CLI, "copy", str(src), str(dst), f"--registry.dir={reg}", f"--rate-limit={rate}",
                             "--chunk-size=64K", "--id=c1"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    return src, dst, reg, proc


async def test_a_real_copier_resumes_itself_when_the_controller_stops_renewing(tmp_path):
    src, dst, reg, proc = start_copier(tmp_path, 8 << 20, "2M")  # 4 s: still copying when fire() pauses it
    try:
        wait_until(lambda: Registry(reg).get("c1"), timeout=20, what="the copy to register")
        action = CopyGuardAction()
        params = CopyGuardParams(registry_dir=reg, mode="pause", lease=1, watchdog=False)
        assert await action.fire(ctx(params)) == "site shop: 1 copy paused"
        # No tick, no resolve: as if the controller had been SIGKILLed after pausing.
        assert proc.wait(timeout=30) == 0
        assert "paused lease expired" in proc.stderr.read()
        assert dst.read_bytes() == src.read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def read_bytes_of(pid: int) -> int:
    """Bytes the process has read so far (/proc/PID/io rchar)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def cycling(record: dict, changes: int = 2, timeout: float = 30.0) -> None:
    """Wait until a watchdog has changed the record's frozen state ``changes`` times (it runs the
    duty cycle: a watchdog just started is still importing, and meanwhile its processes stay in
    the phase the last one left them in)."""
    deadline = time.monotonic() + timeout
    last, seen = freeze.is_frozen(record), 0
    while seen < changes:
        assert time.monotonic() < deadline, "no watchdog cycles the record's processes"
        time.sleep(0.01)
        now = freeze.is_frozen(record)
        seen, last = seen + (now != last), now


def frozen_share(record: dict, samples: int = 150, every: float = 0.02) -> float:
    """The fraction of samples in which the record's processes are frozen (the kernel's view)."""
    frozen = 0
    for _ in range(samples):
        frozen += freeze.is_frozen(record)
        time.sleep(every)
    return frozen / samples


@pytest.mark.parametrize("method", freeze.detect())
async def test_an_adopted_dd_is_duty_cycled_at_its_share_and_let_go_at_the_lease(tmp_path, method):
    """The adaptive throttle on a process that cannot pace itself: `dd` reading /dev/zero as
    fast as it can. At share 0.5 with a 0.5 s duty period the real watchdog freezes it half of
    each period; when the controller stops renewing (as if SIGKILLed), the lease ends it."""
    reg = tmp_path / "copies"
    dd = subprocess.Popen(["dd", "if=/dev/zero", "of=/dev/null", "bs=4k"], start_new_session=True,
                          stderr=subprocess.DEVNULL)
    watchdog = None
    try:
        adopt(reg, dd.pid)
        prom = FakePrometheus()
        prom.set("shop", 80.0, time.time())  # below its threshold of 90: share 1 -> 0.5
        action = CopyGuardAction()
        action.services = {"prometheus": prom}
        params = CopyGuardParams(registry_dir=reg, adopt_methods=[method], lease=4, duty_period=0.5)
        assert await action.fire(ctx(params)) == "site shop: 1 copy at share 0.5 now"
        watchdog = action._watchdogs[reg]
        record = Registry(reg).get("cp1").pause
        assert (record["method"], record["duty"], record["period"]) == (method, 0.5, 0.5)
        cycling(record)
        before = read_bytes_of(dd.pid)
        share = frozen_share(record)
        assert 0.25 <= share <= 0.75, f"frozen {share:.0%} of the time at duty 0.5"
        assert read_bytes_of(dd.pid) > before  # it runs in between
        # The watchdog is SIGKILLed (perhaps in a frozen phase): the controller's next renewal
        # starts a new one, which picks the cycle up where the record says it is.
        watchdog.kill()
        watchdog.wait(timeout=5)
        for held in action.episodes["shop"].held.values():
            held.renewed -= params.lease
        prom.set("shop", 93.0, time.time())  # within the band: the share stays at 0.5
        await action.tick(await action.signals())
        assert action.episodes["shop"].throttle.share == 0.5
        watchdog = action._watchdogs[reg]
        assert watchdog.poll() is None
        cycling(record)
        share = frozen_share(record, samples=100)
        assert 0.25 <= share <= 0.75, f"frozen {share:.0%} of the time after the watchdog's restart"
        # Nobody renews: within the lease (4 s) plus a sweep the watchdog lets it go for good.
        wait_until(lambda: Registry(reg).get("cp1").pause is None, timeout=20, what="the lease to end")
        assert frozen_share(record, samples=25) == 0.0
        if method != "signal":
            assert not Path(record["cgroup"]).exists()  # the cgroup is removed, dd is back where it was
    finally:
        if watchdog is not None:
            terminate(watchdog.pid, grace=5)
            watchdog.wait(timeout=5)
        freeze.resume({"method": "signal", "pgid": dd.pid})
        dd.kill()
        dd.wait(timeout=10)


async def test_the_adaptive_action_throttles_a_real_copier_and_lets_it_go(tmp_path):
    src, dst, reg, proc = start_copier(tmp_path, 4 << 20, "512K")
    try:
        entry = wait_until(lambda: Registry(reg).get("c1"), timeout=20, what="the copy to register")

        def status() -> dict:
            import json
            import urllib.request

            with urllib.request.urlopen(f"{entry.control_url}/status", timeout=5) as r:  # noqa: S310 - loopback
                return json.load(r)

        prom = FakePrometheus()
        prom.set("shop", 80.0, time.time())
        action = CopyGuardAction()
        action.services = {"prometheus": prom}
        params = CopyGuardParams(registry_dir=reg, watchdog=False, lease=30)
        assert await action.fire(ctx(params)) == "site shop: 1 copy at share 0.5 now"
        assert (status()["state"], status()["share"]) == ("throttled", 0.5)
        wait_until(lambda: status()["work_seconds"] >= 1.0, timeout=30, what="a second of throttled copying")
        st = status()
        assert st["share_wait_seconds"] / (st["share_wait_seconds"] + st["work_seconds"]) == pytest.approx(0.5, abs=0.15)

        async def step(served: float) -> None:
            prom.set("shop", served, time.time() + 1.1)
            action.episodes["shop"].throttle.changed_at -= 1.1
            await action.tick(await action.signals())

        await step(30.0)  # a severe deficit: the emergency pause
        assert status()["state"] == "paused"
        await action.resolve(ctx(params, status="resolved"))
        for _ in range(10):  # above the line: min_share, then a tenth per decision, up to free
            await step(99.0)
        assert "shop" not in action.episodes
        assert status()["state"] == "running" and status()["share"] == 1.0
        assert proc.wait(timeout=60) == 0
        assert dst.read_bytes() == src.read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


CONTROLLER_LIKE = """
import asyncio, sys
from pathlib import Path
from controllers.copy_guard.action import CopyGuardAction, CopyGuardParams
from tests.integration.test_copy_guard_adopt import ctx

async def main():
    action = CopyGuardAction()
    reg = Path(sys.argv[1])
    await action.fire(ctx(CopyGuardParams(registry_dir=reg, mode="pause", lease=3, watchdog=True)))
    print(action._watchdogs[reg].pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_kill_of_the_controllers_whole_cgroup_spares_the_watchdog_which_resumes_the_copy(tmp_path, cp):
    """``systemctl kill`` (or an OOM kill of the unit, a pod's eviction) kills every process of the
    controller's cgroup: the watchdog, its child, died with it and two adopted backups stayed
    frozen until the controller was started again (a stranger's review, R4). The watchdog now
    moves into a cgroup of its own, so the lease still ends."""
    root = freeze.v2_root()
    if root is None or not (root / "cgroup.procs").is_file() or os.geteuid() != 0:
        pytest.fail("this test needs root and a cgroup v2 hierarchy (make test runs as root)")
    unit = root / f"promreflex-test-unit-{os.getpid()}"
    unit.mkdir()
    reg = tmp_path / "copies"
    adopt(reg, cp.proc.pid)
    watchdog_pid = None
    controller = subprocess.Popen(  # noqa: S603 - our own script
        [sys.executable, "-c", CONTROLLER_LIKE, str(reg)], cwd=REPO, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: (unit / "cgroup.procs").write_text(str(os.getpid())))  # noqa: PLW1509 - before exec
    try:
        assert controller.stdout is not None
        watchdog_pid = int(controller.stdout.readline())
        wait_until(lambda: Path(f"/proc/{watchdog_pid}/cgroup").read_text().strip().endswith(
            f"::/{freeze.WATCHDOG_CGROUP}"), timeout=15, what="the watchdog in its own cgroup")
        cp.send(os.urandom(20_000))
        assert not cp.progresses(timeout=0.3)  # held
        (unit / "cgroup.kill").write_text("1")  # the whole unit, as systemctl kill does
        controller.wait(timeout=15)
        assert pid_alive(watchdog_pid)
        assert cp.progresses(timeout=20)  # the lease (3 s) ended: the watchdog resumed it
        wait_until(lambda: Registry(reg).get("cp1").pause is None, timeout=15, what="the pause cleared")
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=10)
        if watchdog_pid is not None and pid_alive(watchdog_pid):
            terminate(watchdog_pid, grace=5)
        wait_until(lambda: not (unit / "cgroup.procs").read_text().split(), timeout=10, what="the unit empty")
        unit.rmdir()
    assert cp.finish() == 0
