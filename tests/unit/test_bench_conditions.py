"""bench/conditions.py: the conditions the benches print beside their figures (psutil)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.conditions import HostSampler, describe, run_child


# A child with no children of its own: pytest's process has children (the session's live
# stack), and a group counts a process's whole tree. It burns CPU time (process time, not wall
# time: the machine may be busy) each time it reads a line, and says when it is done.
BURNER = """
import sys, time
for line in sys.stdin:
    end = time.process_time() + float(line)
    while time.process_time() < end:
        pass
    print("done", flush=True)
"""


def test_group_cpu_counts_only_what_was_used_while_sampling() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None

    def burn(seconds: float) -> None:
        child.stdin.write(f"{seconds}\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        assert child.stdout.readline().strip() == "done"  # type: ignore[union-attr]

    try:
        burn(0.4)  # before the sampler starts: must not be counted
        s = HostSampler(interval=0.05, groups={"burner": lambda: [child.pid]}).start()
        burn(0.3)
        summary = s.stop()
    finally:
        child.kill()
        child.wait()
    group = summary["groups"]["burner"]
    assert 0.25 <= group["cpu_seconds"] < 0.4 + 0.25
    assert group["processes"] == 1
    assert summary["cores"] == os.cpu_count()
    assert summary["cpu_busy_pct"] is not None and 0 <= summary["cpu_busy_pct"] <= 100
    assert summary["load1_max"] >= summary["load1_start"] >= 0


def test_a_pid_source_that_fails_samples_nothing() -> None:
    def gone() -> list[int]:
        raise RuntimeError("stack is down")

    s = HostSampler(interval=0.05, groups={"gone": gone, "none": lambda: [2**22 + 12345]}).start()
    summary = s.stop()
    assert summary["groups"]["gone"]["cpu_seconds"] == 0 and summary["groups"]["none"]["processes"] == 0
    text = describe(summary)
    assert text.startswith(f"{os.cpu_count()} cores, CPU busy ") and "CPU used by gone 0.00 cores" in text


def test_chunked_lock_holds_over_runs_and_lets_others_in_between_chunks(tmp_path, monkeypatch):
    """A run that fits keeps the lock; one that would make the chunk longer than max_s releases
    it first (another heavy job may take it then) and takes it again."""
    import fcntl

    from bench import conditions
    from bench.conditions import ChunkedLock

    path = tmp_path / "heavy.lock"
    now = [1000.0]
    monkeypatch.setattr(conditions.time, "monotonic", lambda: now[0])

    def free() -> bool:
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    logs: list[str] = []
    with ChunkedLock(path, max_s=100, log=logs.append) as lock:
        lock.need(40)
        assert not free() and lock.chunks == 1
        now[0] += 40
        lock.need(50)  # 40 + 50 <= 100: same chunk
        assert lock.chunks == 1 and not free()
        now[0] += 50
        lock.need(30)  # 90 + 30 > 100: released, then taken again
        assert lock.chunks == 2 and lock.held_s == 90 and not free()
    assert free() and any("released" in m for m in logs)
    ChunkedLock(None).need(10)  # no path: no lock, nothing to do


def test_run_child_reports_the_childs_own_cost_and_output(tmp_path: Path) -> None:
    burn = "import sys; x = bytearray(256 << 20); sum(range(3_000_000)); print('out'); print('err', file=sys.stderr); sys.exit(3)"
    with open(tmp_path / "err", "wb") as err:
        child = run_child([sys.executable, "-c", burn], stderr=err)
    assert child.returncode == 3
    assert child.stdout == b"out\n"
    assert (tmp_path / "err").read_bytes() == b"err\n"
    assert child.maxrss_mib >= 256 and child.cpu_s > 0 and child.wall_s > 0
    # Its own peak, not the parent's: ru_maxrss starts from the parent's RSS at the fork (pytest's
    # process may be larger than 256 MiB by now), so two children are compared from a small parent.
    probe = ("import sys; from bench.conditions import run_child; "
             "a = run_child([sys.executable, '-c', 'pass']); b = run_child([sys.executable, '-c', 'x = bytearray(256 << 20)']); "
             "print(a.maxrss_mib, b.maxrss_mib)")
    parent = run_child([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2])
    small, big = map(float, parent.stdout.split())
    assert big - small >= 200

    with open(tmp_path / "out", "wb") as out:
        assert run_child([sys.executable, "-c", "print('to a file')"], stdout=out, cwd=tmp_path).stdout == b""
    assert (tmp_path / "out").read_bytes() == b"to a file\n"


def test_run_child_kills_its_child_when_interrupted(tmp_path: Path, monkeypatch) -> None:
    import pytest

    import bench.conditions as cond

    started: list[int] = []
    real_wait4 = os.wait4

    def interrupted(pid: int, options: int):  # a Ctrl-C while it waits
        started.append(pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(cond.os, "wait4", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    monkeypatch.setattr(cond.os, "wait4", real_wait4)
    assert started
    with pytest.raises(ChildProcessError):  # reaped already: no child left, running or zombie
        os.waitpid(started[0], os.WNOHANG)


def test_a_bench_says_it_waits_for_the_heavy_lock_before_waiting(tmp_path: Path) -> None:
    """A newcomer's `make demo-admission` printed nothing for 8 minutes while another heavy job
    held the lock (the 'waited' line came only after): it looked hung."""
    import fcntl
    import threading

    from bench.conditions import ChunkedLock

    path = tmp_path / "heavy.lock"
    logs: list[str] = []
    holder = open(path, "a")  # noqa: SIM115
    fcntl.flock(holder, fcntl.LOCK_EX)
    lock = ChunkedLock(path, log=logs.append)
    t = threading.Thread(target=lock.need, args=(10,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not logs and time.monotonic() < deadline:
            time.sleep(0.02)
        assert logs and "waiting for" in logs[0] and lock.chunks == 0  # said while still waiting
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        t.join(30)
    assert lock.chunks == 1
    lock.release()
