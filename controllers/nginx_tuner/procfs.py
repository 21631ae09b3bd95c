"""The nginx process tree, read with psutil.

nginx's master forks its workers (and cache manager/loader); a reload replaces all of them.
psutil finds children by each process's parent PID (it scans ``/proc/*/stat``), not from
``/proc/PID/task/TID/children``, which the kernel documents as unreliable unless the tasks are
frozen. Zombies are left out everywhere: they serve nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil


def _live(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except (psutil.NoSuchProcess, ValueError):
        return None


def ppid(pid: int) -> int | None:
    """Parent PID, or None when the process is gone or a zombie."""
    proc = _live(pid)
    try:
        return proc.ppid() if proc is not None else None
    except psutil.NoSuchProcess:
        return None


def children(pid: int) -> list[int]:
    """Live (non-zombie) children of ``pid``, sorted; [] when ``pid`` is gone."""
    proc = _live(pid)
    if proc is None:
        return []
    out = []
    try:
        kids = proc.children()
    except psutil.NoSuchProcess:
        return []
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                out.append(kid.pid)
        except psutil.NoSuchProcess:
            pass
    return sorted(out)


def cmdline(pid: int) -> str:
    """The process title (nginx rewrites argv to ``nginx: worker process`` etc.), or ''."""
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except (psutil.Error, ValueError):
        return ""


def start_time(pid: int) -> float | None:
    """When ``pid`` started (Unix time, to the kernel's clock tick), or None when it is gone.
    From ``/proc/PID/stat``'s start time (ticks since boot, the boot-time clock) and the boot
    moment read from the clocks themselves: psutil adds /proc/stat's ``btime``, whole seconds,
    which puts a start up to a second early."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        ticks = int(data[data.rindex(b")") + 2 :].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")
