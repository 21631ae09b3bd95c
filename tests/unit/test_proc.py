"""Port plumbing: callers picking many ports before binding any get distinct ones; process liveness."""

from __future__ import annotations

import os
import subprocess

import psutil

from promreflex.proc import free_port, pid_alive, port_in_use, wait_until


def test_free_port_never_hands_out_the_same_port_twice_in_a_row() -> None:
    # 400 picks from the ~28 000 ephemeral ports: without the guard the kernel repeats one
    # with probability ~94 % (birthday bound), the way a 33-process mesh once collided.
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
    assert not any(port_in_use("127.0.0.1", p) for p in ports[:20])


def test_pid_alive_is_false_for_a_zombie_and_a_reaped_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert pid_alive(child.pid)
        child.kill()
        # Killed but not yet reaped: a zombie serves nothing.
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, timeout=10, what="the zombie")
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert not pid_alive(child.pid)
    assert pid_alive(os.getpid())
    assert not pid_alive(0) and not pid_alive(-1)
