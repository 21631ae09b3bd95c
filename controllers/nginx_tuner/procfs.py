"""The nginx process tree, read with psutil.

nginx's master forks its workers (and cache manager/loader); a reload replaces all of them.
psutil finds children by each process's parent PID (it scans ``/proc/*/stat``), not from
``/proc/PID/task/TID/children``, which the kernel documents as unreliable unless the tasks are
frozen. Zombies are left out everywhere: they serve nothing.
"""

from __future__ import annotations

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
