"""Writing files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None,
                      like: str | os.PathLike | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync'd, then
    renamed over the target: the file is either the old one or the new one, never a mix.
    Keeps the permission bits and owner of ``like`` (default: the file being replaced) on the
    temporary file before the rename, so there is no instant with the wrong owner; ``mode``
    overrides the permission bits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        ref = os.stat(like if like is not None else path)
    except FileNotFoundError:
        ref = None
    if mode is None:
        mode = ref.st_mode & 0o7777 if ref else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # UTF-8 whatever the locale (a C locale without UTF-8 mode could not write a config
        # with a "Café" comment that was read as UTF-8); bytes read with surrogateescape
        # round-trip; no newline translation (a CRLF file stays CRLF).
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if ref is not None and (ref.st_uid, ref.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(tmp, ref.st_uid, ref.st_gid)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str | os.PathLike, data: Any, sort_keys: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys) + "\n")


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


class LockHeld(Exception):
    """The lock file is held by another process (``holder``: the pid it wrote, or "?")."""

    def __init__(self, holder: str):
        super().__init__(f"held by pid {holder}")
        self.holder = holder


def lock_exclusive(path: str | os.PathLike) -> int:
    """An exclusive ``flock`` on ``path`` (created 0600, never through a symlink), taken without
    waiting; the descriptor that holds it, with this process' pid written in the file for the
    message of one refused. The kernel releases it when the process dies (kill -9 too); closing
    the descriptor releases it. :class:`LockHeld` when another process holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise LockHeld(holder) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # (at offset 0: just opened)
    return fd
