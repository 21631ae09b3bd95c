"""nginx memory (controllers.nginx_tuner.memory) and its process tree (procfs), read with psutil
from real processes: a fake master (its title rewritten the way nginx does, with ``exec -a``)
with two "workers", one zombie child that is never reaped, and an unrelated process."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from controllers.nginx_tuner.memory import group_memory, nginx_memory, process_memory
from controllers.nginx_tuner.procfs import children, cmdline, ppid
from promreflex.proc import wait_until

# bash starts the workers and a child that exits shortly, then becomes the "master" in place
# (same PID): the exited child stays a zombie, since sleep never reaps. (1 s: a bash held
# longer than the child's life before its exec reaps the child itself, and no zombie appears.)
MASTER = 'sleep 60 & sleep 60 & (sleep 1) & exec -a "nginx: master process /usr/sbin/nginx -c x" sleep 60'


@dataclass
class Tree:
    master: int
    workers: list[int]
    zombie: int
    stranger: int


@pytest.fixture
def tree() -> Iterator[Tree]:
    master = subprocess.Popen(["bash", "-c", MASTER], start_new_session=True)  # a group: its workers go with it
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        proc = psutil.Process(master.pid)

        def settled() -> list[psutil.Process] | None:
            kids = proc.children()
            zombies = [k for k in kids if k.status() == psutil.STATUS_ZOMBIE]
            return kids if len(kids) == 3 and len(zombies) == 1 and "master process" in " ".join(proc.cmdline()) else None

        kids = wait_until(settled, timeout=10, what="the fake nginx tree")
        zombie = next(k.pid for k in kids if k.status() == psutil.STATUS_ZOMBIE)
        yield Tree(master.pid, sorted(k.pid for k in kids if k.pid != zombie), zombie, stranger.pid)
    finally:
        os.killpg(master.pid, signal.SIGKILL)  # the master and its "workers" (they outlived it)
        for p in (master, stranger):
            p.kill()
            p.wait()


def gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_children_skip_zombies_and_strangers(tree: Tree) -> None:
    assert children(tree.master) == tree.workers
    assert tree.stranger not in children(tree.master)
    assert ppid(tree.workers[0]) == tree.master
    assert ppid(tree.zombie) is None
    gone = gone_pid()
    assert ppid(gone) is None and children(gone) == [] and cmdline(gone) == ""
    assert cmdline(tree.master).startswith("nginx: master process /usr/sbin/nginx -c x")


def test_pss_summed_over_master_and_workers(tree: Tree) -> None:
    r = nginx_memory(tree.master)
    assert r.method == "pss" and r.vanished == ()
    assert set(r.per_process) == {tree.master, *tree.workers}
    assert all(v > 0 for v in r.per_process.values())
    assert r.total_bytes == sum(r.per_process.values())


def test_uss_on_request_counts_private_pages_only(tree: Tree) -> None:
    r = nginx_memory(tree.master, method="uss")
    assert r.method == "uss" and set(r.per_process) == {tree.master, *tree.workers}
    # PSS adds a share of every shared page (libc, the sleep binary) to the private ones.
    for pid, uss in r.per_process.items():
        assert 0 < uss < process_memory(pid, "pss")


def test_process_exiting_mid_read_is_reported_not_counted(tree: Tree) -> None:
    gone = gone_pid()
    r = group_memory([tree.master, gone])
    assert r.vanished == (gone,) and set(r.per_process) == {tree.master}
    with pytest.raises(ProcessLookupError):
        group_memory([gone])
    with pytest.raises(ProcessLookupError):
        group_memory([tree.zombie])
    with pytest.raises(ValueError, match="no processes"):
        group_memory([])
