"""A real ``promreflex copy`` process: paused and resumed through its control endpoint, its
lease expiring, stopped by SIGTERM and SIGKILL and run again to an identical result, and its
/metrics accepted by promtool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controllers.copy_guard.copier import journal_path
from controllers.copy_guard.registry import Registry
from promreflex.proc import Child, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# 4 s at the 4M the control tests copy at, 2 s at the kill test's 8M: the test acts long before
# the copy's end even when the machine holds it for a second (4 MiB left ~0.35 s of margin).
SIZE = 16 << 20


def copy_cmd(src, dst, reg, *extra) -> list[str]:
    return [sys.executable, "-m", "promreflex", "copy", str(src), str(dst),
            f"--registry.dir={reg}", "--chunk-size=64K", "--checkpoint-size=256K", *extra]


class Copy:
    def __init__(self, tmp: Path, *extra: str, name: str = "copy", size: int = SIZE):
        self.tmp = tmp
        self.src, self.dst, self.reg = tmp / "src.bin", tmp / "dst.bin", tmp / "copies"
        if not self.src.exists():
            self.src.write_bytes(os.urandom(size))
        self.child = Child(name, copy_cmd(self.src, self.dst, self.reg, "--id=c1", *extra), tmp / f"{name}.log",
                           cwd=REPO).start()
        entry = wait_until(lambda: Registry(self.reg).get("c1"), timeout=20, what="the copy to register")
        self.url = entry.control_url

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/status", timeout=5) as r:  # noqa: S310 - loopback
            return json.load(r)

    def post(self, command: str, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(f"{self.url}/{command}", data=b"", method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def wait_exit(self, timeout: float = 60) -> int:
        return self.child.popen.wait(timeout=timeout)


@pytest.fixture
def copies():
    started: list[Copy] = []
    yield started
    for c in started:
        c.child.stop(grace=5)


def test_paused_and_resumed_through_the_control_endpoint(tmp_path, copies):
    c = Copy(tmp_path, "--rate-limit=4M")
    copies.append(c)
    wait_until(lambda: c.status()["done_bytes"] > 0, timeout=20, what="progress")
    assert c.post("pause?lease=30") == 200
    wait_until(lambda: c.status()["paused_seconds"] >= 0.3, timeout=10, what="paused for 0.3 s")
    held = c.status()["done_bytes"]
    wait_until(lambda: c.status()["paused_seconds"] >= 1.0, timeout=10, what="paused for 1 s")
    st = c.status()
    assert (st["state"], st["done_bytes"]) == ("paused", held)  # no progress while paused
    assert held < SIZE

    # /metrics while paused: the state and promtool's lint.
    body = urllib.request.urlopen(f"{c.url}/metrics", timeout=5).read()  # noqa: S310
    assert b'promreflex_copy_state{site="shop",state="paused"} 1.0' in body
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    assert c.post("resume") == 200
    assert c.wait_exit() == 0
    assert c.dst.read_bytes() == c.src.read_bytes()
    assert Registry(c.reg).entries() == []  # unregistered at the end


def test_a_pause_whose_lease_is_not_renewed_ends_by_itself(tmp_path, copies):
    c = Copy(tmp_path, "--rate-limit=4M")
    copies.append(c)
    assert c.post("pause?lease=0.5") == 200
    assert c.status()["state"] == "paused"
    wait_until(lambda: c.status()["lease_expiries"] == 1, timeout=10, what="the lease to expire")
    assert c.status()["state"] == "running"
    assert c.wait_exit() == 0
    assert c.dst.read_bytes() == c.src.read_bytes()


def test_control_needs_the_token_when_one_is_set(tmp_path, copies):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)  # a token file others can read is refused
    c = Copy(tmp_path, "--rate-limit=4M", f"--web.token-file={token}")
    copies.append(c)
    assert c.post("pause?lease=5") == 401
    assert c.post("pause?lease=5", token="wrong") == 401
    assert c.post("pause?lease=5", token="s3cret") == 200
    assert c.post("throttle?bytes_per_second=0", token="s3cret") == 400
    assert c.post("teleport", token="s3cret") == 404
    assert c.post("resume", token="s3cret") == 200
    assert c.wait_exit() == 0


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 3), (signal.SIGKILL, -9)])
def test_stopped_or_killed_then_run_again_gives_an_identical_file(tmp_path, copies, sig, code):
    c = Copy(tmp_path, "--rate-limit=8M")
    copies.append(c)
    wait_until(lambda: c.status()["done_bytes"] >= SIZE // 4, timeout=20, what="a quarter copied")
    os.kill(c.child.pid, sig)
    assert c.wait_exit() == code
    assert not c.dst.exists() and journal_path(c.dst).exists()
    again = subprocess.run(copy_cmd(c.src, c.dst, c.reg), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    done_before = int(again.stderr.split(" already done")[0].rsplit("(", 1)[1])
    assert 0 < done_before < SIZE  # it continued, it did not start over
    assert c.dst.read_bytes() == c.src.read_bytes()
    assert not journal_path(c.dst).exists()
    assert Registry(c.reg).entries() == []


def test_a_share_through_the_control_endpoint_and_its_lease(tmp_path, copies):
    c = Copy(tmp_path, "--rate-limit=1M", size=4 << 20)  # 4 s at 1M, a quarter of it for the share's lease
    copies.append(c)
    for bad in ("throttle?share=0&lease=5", "throttle?share=1.5&lease=5", "throttle?share=nan&lease=5",
                "throttle?share=0.5&bytes_per_second=10&lease=5", "throttle?lease=5"):
        assert c.post(bad) == 400, bad
    assert c.status()["state"] == "running"
    assert c.post("throttle?share=0.25&lease=4") == 200
    st = c.status()
    assert (st["state"], st["share"]) == ("throttled", 0.25)
    wait_until(lambda: c.status()["work_seconds"] >= 0.5, timeout=30, what="throttled copying")
    st = c.status()
    # The copy waited 3/4 of the time (the rate cap's own wait counts as the copy's work).
    assert st["share_wait_seconds"] / (st["share_wait_seconds"] + st["work_seconds"]) == pytest.approx(0.75, abs=0.1)
    body = urllib.request.urlopen(f"{c.url}/metrics", timeout=5).read()  # noqa: S310
    assert b'promreflex_copy_throttle_share{site="shop"} 0.25' in body
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    wait_until(lambda: c.status()["lease_expiries"] == 1, timeout=20, what="the throttle's lease to end")
    assert c.status()["share"] == 1.0
    assert c.wait_exit() == 0
    assert c.dst.read_bytes() == c.src.read_bytes()
