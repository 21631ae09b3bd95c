"""The copy registry: one JSON file per running copy in a directory, so the copy-guard action
finds every copy it may pause. The default directory is absolute, the same for every command
wherever it runs (:func:`default_dir`): ``$PROMREFLEX_COPY_REGISTRY`` if set, else
``/var/lib/promreflex/copies`` for root, else ``$XDG_STATE_HOME/promreflex/copies``
(``~/.local/state/promreflex/copies``). A relative ``registry_dir`` in a route is resolved
against the configuration file's directory when the loader says which (see ``action.py``).

A copy registers itself (``promreflex copy``) or is adopted (``promreflex copy-guard adopt``):

    {"id": "...", "kind": "copier" | "adopted", "pid": 1234, "pid_start": 1.7e9,
     "pgid": 1234 | null, "site": "shop", "src": "...", "dst": "...",
     "control_url": "http://127.0.0.1:PORT" | null, "created": 1.7e9,
     "pause": null | {"method": "cgroup2" | "cgroup1" | "signal", "until": 1.7e9, ...}}

``pid_start`` (the process's start time, Unix seconds, from psutil) guards against PID reuse:
an entry whose process is gone, or whose PID now belongs to another process, is stale;
:meth:`Registry.entries` ignores and removes it. Entries are written atomically; the ``pause``
record of adopted copies is the lease the watchdog enforces (see ``watchdog.py``).

The directory is a trust boundary: whoever can write an entry can have the guard stop a
process group and make the controller send control requests. So the controller refuses to
start (:func:`check_dir`) unless the directory is owned by root or by the controller's own
user and is not writable by group or others, nor is any directory above it (sticky ``/tmp``
aside), as written or through symbolic links; entries carry no secrets and no token paths (an
entry's ``token_file`` from older versions is ignored); where control requests may go and
with which token is the route's decision (``control_hosts``, ``control_token_file``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from promreflex.errors import UserError
from promreflex.fsutil import atomic_write_json

ENV_DIR = "PROMREFLEX_COPY_REGISTRY"
SYSTEM_DIR = Path("/var/lib/promreflex/copies")


def default_dir() -> Path:
    """Where copies register when nobody says (absolute; read at each call, so the environment
    of the command counts): ``$PROMREFLEX_COPY_REGISTRY``, else ``/var/lib/promreflex/copies``
    for root, else ``$XDG_STATE_HOME/promreflex/copies`` (default ``~/.local/state``)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return SYSTEM_DIR
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local" / "state"
    return base.absolute() / "promreflex" / "copies"
ID_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


START_TOLERANCE = 0.05  # seconds: psutil's start time has clock-tick (10 ms) resolution


def process_start(pid: int) -> float | None:
    """Start time of ``pid`` (Unix seconds; None when it does not exist)."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def same_process(pid: int, pid_start: float | None) -> bool:
    """True when ``pid`` is alive (not a zombie) and is still the process that was registered."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return pid_start is None or abs(proc.create_time() - float(pid_start)) < START_TOLERANCE
    except (psutil.Error, ValueError):
        return False


def check_dir(directory: str | Path, *, create: bool = False) -> None:
    """Refuse (:class:`UserError`, one line) a registry directory that someone else could write
    or replace: it must be a directory owned by root or by this process's user, not writable by
    group or others, and so must every directory above it, both as the path is written and as
    it resolves through symbolic links (whoever can write a parent can rename the registry away
    and put their own in its place, or point a link elsewhere); a parent writable by others is
    fine with the sticky bit (``/tmp``: nobody can rename or remove what another user owns).
    ``create`` makes a missing one (mode 0700); otherwise a missing one is fine (the first copy
    creates it that way)."""
    path = Path(directory).absolute()
    uid = os.geteuid()
    for parent in dict.fromkeys([*path.parents, *path.resolve().parents]):
        try:
            pst = parent.stat()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UserError(f"copy registry {path}: {parent}: {e.strerror}") from None
        if pst.st_uid not in (0, uid):
            raise UserError(f"copy registry {path}: {parent} above it is owned by uid {pst.st_uid}, who could replace "
                            f"the registry: put it under directories owned by root or the controller's user (uid {uid})")
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            raise UserError(f"copy registry {path}: {parent} above it is writable by group or others (mode "
                            f"{stat.filemode(pst.st_mode)}), who could replace the registry: run chmod go-w {parent} "
                            f"or put the registry elsewhere")
    if create:  # (only under directories that passed)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"copy registry {path}: {e.strerror}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"copy registry {path} is not a directory")
        if st.st_uid not in (0, uid):
            raise UserError(f"copy registry {path} is owned by uid {st.st_uid}: it must be owned by root or by the "
                            f"controller's user (uid {uid}), since its entries decide which processes the guard stops")
        if st.st_mode & 0o022:
            raise UserError(f"copy registry {path} is writable by group or others (mode {stat.filemode(st.st_mode)}): "
                            f"run chmod go-w {path}")


def new_id(prefix: str = "copy") -> str:
    return f"{prefix}-{int(time.time())}-{secrets.token_hex(3)}"


@dataclass
class Entry:
    id: str
    kind: str  # "copier" or "adopted"
    pid: int
    site: str
    src: str = ""
    dst: str = ""
    pid_start: float | None = None
    pgid: int | None = None  # adopted by process group
    control_url: str | None = None
    created: float = field(default_factory=time.time)
    pause: dict[str, Any] | None = None

    def alive(self) -> bool:
        return same_process(self.pid, self.pid_start)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        entry = cls(**known)
        if (not isinstance(entry.id, str) or not ID_RE.match(entry.id) or entry.kind not in ("copier", "adopted")
                or not isinstance(entry.pid, int) or isinstance(entry.pid, bool) or entry.pid <= 0
                or not (entry.pid_start is None or isinstance(entry.pid_start, (int, float)))
                or not (entry.control_url is None or isinstance(entry.control_url, str))
                or not isinstance(entry.site, str)):
            raise ValueError(f"bad registry entry {str(data)[:200]}")
        return entry


class Registry:
    def __init__(self, directory: str | Path | None = None):
        self.dir = Path(directory) if directory is not None else default_dir()

    def path(self, copy_id: str) -> Path:
        if not ID_RE.match(copy_id):
            raise ValueError(f"bad copy id {copy_id!r}")
        return self.dir / f"{copy_id}.json"

    def add(self, entry: Entry) -> Path:
        # 0700: whoever can write an entry can have the guard stop a process group; a directory
        # others can write is refused here too (UserError), as the controller refuses it.
        check_dir(self.dir, create=True)
        path = self.path(entry.id)
        atomic_write_json(path, asdict(entry))
        return path

    update = add

    def remove(self, copy_id: str) -> None:
        try:
            self.path(copy_id).unlink()
        except FileNotFoundError:
            pass
        self.lock_path(copy_id).unlink(missing_ok=True)

    def lock_path(self, copy_id: str) -> Path:
        return self.path(copy_id).with_suffix(".lock")

    @contextlib.contextmanager
    def locked(self, copy_id: str) -> Iterator[None]:
        """Hold the entry's lock (``flock`` on ``<id>.lock``): whoever changes whether an
        adopted copy is frozen (the controller, the watchdog's duty cycle and lease, ``resume-all``)
        re-reads the entry and acts under it, so a resume and a freeze can never interleave
        (a SIGSTOP sent after the resume's SIGCONT). The kernel drops it if its holder dies."""
        check_dir(self.dir, create=True)
        fd = os.open(self.lock_path(copy_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def get(self, copy_id: str) -> Entry | None:
        try:
            return Entry.from_dict(json.loads(self.path(copy_id).read_text()))
        except (FileNotFoundError, ValueError, TypeError, json.JSONDecodeError):
            return None

    def entries(self, *, clean: bool = True, include_dead: bool = False) -> list[Entry]:
        """Live entries, oldest first. Stale ones (process gone or PID reused) are removed when
        ``clean``; unreadable files are skipped (and left for a person to look at)."""
        out = []
        try:
            paths = sorted(self.dir.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            try:
                entry = Entry.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError, json.JSONDecodeError):
                continue
            if not entry.alive():
                if clean:
                    # A paused process that died may leave its (now empty) freezer cgroup.
                    if entry.pause:
                        from controllers.copy_guard.freeze import forget

                        forget(entry.pause)
                    path.unlink(missing_ok=True)
                    path.with_suffix(".lock").unlink(missing_ok=True)
                if not include_dead:
                    continue
            out.append(entry)
        return sorted(out, key=lambda e: (e.created, e.id))

    def for_site(self, site: str) -> list[Entry]:
        return [e for e in self.entries() if e.site == site]

    def sites(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.entries():
            counts[e.site] = counts.get(e.site, 0) + 1
        return counts
