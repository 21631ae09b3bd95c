"""Reading the nginx process tree from /proc.

nginx's master forks its workers (and cache manager/loader); a reload replaces all of them.
Children are found by scanning ``/proc/*/stat`` for the parent PID rather than reading
``/proc/PID/task/TID/children``, which the kernel documents as unreliable unless the tasks
are frozen and which needs CONFIG_PROC_CHILDREN. ``proc_root`` is a parameter so tests can
point the readers at fixture trees.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int, proc_root: Path = PROC) -> list[str]:
    """Fields of /proc/PID/stat after the ``(comm)`` field (which may contain spaces)."""
    text = (proc_root / str(pid) / "stat").read_text()
    return text.rsplit(")", 1)[1].split()


def ppid(pid: int, proc_root: Path = PROC) -> int | None:
    """Parent PID, or None when the process is gone (or a zombie: it serves nothing)."""
    try:
        fields = _stat_fields(pid, proc_root)
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1])


def children(pid: int, proc_root: Path = PROC) -> list[int]:
    """Live (non-zombie) children of ``pid``, sorted."""
    out = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit() and ppid(int(entry.name), proc_root) == pid:
            out.append(int(entry.name))
    return sorted(out)


def cmdline(pid: int, proc_root: Path = PROC) -> str:
    """The process title (nginx rewrites argv to ``nginx: worker process`` etc.), or ''."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()
