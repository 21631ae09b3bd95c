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
user and is not writable by group or others, nor is any directory or symbolic link on the way
to it (sticky ``/tmp`` aside); entries carry no secrets and no token paths (an
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
    or replace. Walked one component at a time from ``/`` (as the kernel resolves it, symbolic
    links followed in place, at most 40): the registry must be a directory owned by root or by
    this process's user and writable by nobody else; every directory on the way must be owned
    by root or the user and not writable by others (whoever can write a parent can rename the
    registry away and put their own in its place), unless it is sticky (``/tmp``: nobody can
    rename or remove what another user owns); every symbolic link on the way must be owned by
    root or the user (in a sticky directory its owner can repoint it). Group write is fine for
    the user's private group (Debian's and Ubuntu's one group per user, umask 002), as OpenSSH
    on Debian allows it. ``create`` makes the missing directories (mode 0700, each checked); a
    missing registry is otherwise fine (the first copy creates it that way)."""
    path = Path(directory).absolute()
    missing = _walk(path, path)
    if missing is not None and create:
        at, rest = missing
        for part in rest:  # one by one, 0700 whatever the umask, each checked by the walk below
            at = at / part
            try:
                os.mkdir(at, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                raise UserError(f"copy registry {path}: cannot create {at}: {e.strerror}") from None
        _walk(path, path)


_MAX_LINKS = 40  # as the kernel's path walk (ELOOP beyond)


def _private_group(gid: int) -> bool:
    """The user's own group with nobody else in it (Debian's user private groups)."""
    import grp
    import pwd

    if gid == 0 or gid != os.getegid():  # (root's group is no user's private group)
        return False
    try:
        members = grp.getgrgid(gid).gr_mem
        me = pwd.getpwuid(os.geteuid()).pw_name
        others = [u.pw_name for u in pwd.getpwall() if u.pw_gid == gid and u.pw_uid != os.geteuid()]
    except KeyError:
        return False
    return not others and set(members) <= {me}


def _writable_by_others(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o002) or bool(st.st_mode & 0o020) and not _private_group(st.st_gid)


def _walk(path: Path, shown: Path) -> tuple[Path, list[str]] | None:
    """Check every component of ``path`` (see :func:`check_dir`); None when the registry
    exists, else (the last existing directory, the names still missing below it)."""
    uid = os.geteuid()
    todo = list(path.parts[1:])
    at = Path("/")
    links = 0

    def check_parent(d: Path, st: os.stat_result) -> None:
        if st.st_uid not in (0, uid):
            raise UserError(f"copy registry {shown}: {d} above it is owned by uid {st.st_uid}, who could replace the "
                            f"registry: put it under directories owned by root or the controller's user (uid {uid})")
        if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
            raise UserError(f"copy registry {shown}: {d} above it is writable by group or others (mode "
                            f"{stat.filemode(st.st_mode)}), who could replace the registry: run chmod go-w {d} "
                            f"or put the registry elsewhere")

    def lstat(p: Path) -> os.stat_result | None:
        try:
            return os.lstat(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise UserError(f"copy registry {shown}: {p}: {e.strerror}") from None

    st = lstat(at)
    assert st is not None
    while todo:
        check_parent(at, st)  # the directory holding the next name
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            at = at.parent
            st = lstat(at)
            assert st is not None
            continue
        nxt = at / part
        nst = lstat(nxt)
        if nst is None:
            return at, [part, *todo]
        if stat.S_ISLNK(nst.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise UserError(f"copy registry {shown}: too many levels of symbolic links (a loop?)")
            if nst.st_uid not in (0, uid):
                raise UserError(f"copy registry {shown}: the symbolic link {nxt} on the way is owned by uid "
                                f"{nst.st_uid}, who could point it elsewhere")
            target = Path(os.readlink(nxt))
            if target.is_absolute():
                at = Path("/")
                st = lstat(at)
                assert st is not None
            todo = [*target.parts[1 if target.is_absolute() else 0:], *todo]
            continue
        if not stat.S_ISDIR(nst.st_mode):
            raise UserError(f"copy registry {shown}: {nxt} is not a directory")
        at, st = nxt, nst
    if st.st_uid not in (0, uid):
        raise UserError(f"copy registry {shown} is owned by uid {st.st_uid}: it must be owned by root or by the "
                        f"controller's user (uid {uid}), since its entries decide which processes the guard stops")
    if _writable_by_others(st):
        raise UserError(f"copy registry {shown} is writable by group or others (mode {stat.filemode(st.st_mode)}): "
                        f"run chmod go-w {at}")
    return None


#: Written by each copy-guard action on the registries it watches: which controllers do.
WATCH_NAME = "copy-guard.watch"
WATCH_NOTE_EVERY = 60.0  # seconds between a running guard's notes (it refreshes its entry)
WATCH_STALE = 600.0  # an entry of another host not refreshed for this long is dropped


def _watchers(directory: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((directory / WATCH_NAME).read_text())
    except (OSError, ValueError):
        return {}
    watchers = data.get("watchers") if isinstance(data, dict) else None
    return {k: v for k, v in watchers.items() if isinstance(v, dict)} if isinstance(watchers, dict) else {}


def note_watched(directory: str | Path) -> list[str]:
    """Say in ``directory`` that this process's copy guard watches it: one entry per controller
    (host and pid), so controllers sharing a registry (an agent and a central controller, a
    pair) do not erase each other; entries of this host's controllers that are gone are dropped.
    Returns the other controllers noted there (``host:pid``): two guards on one registry share
    its state file, and each takes up the other's episodes after a restart."""
    import socket

    d, host, me, now = Path(directory), socket.gethostname(), os.getpid(), time.time()

    def fresh(v: dict[str, Any], within: float) -> bool:
        since = v.get("since")
        return isinstance(since, (int, float)) and now - since <= within

    # Another host's controller cannot be checked from here: it counts while it notes itself (every
    # WATCH_NOTE_EVERY); one silent for WATCH_STALE is gone (a pod's hostname changes at each
    # restart: the old entries named dead controllers, and grew with every restart).
    keep = {k: v for k, v in _watchers(d).items()
            if (v.get("host") != host and fresh(v, WATCH_STALE))
            or (v.get("host") == host and isinstance(v.get("pid"), int) and v["pid"] != me
                and same_process(v["pid"], v.get("pid_start")))}
    others = sorted(k for k, v in keep.items() if v.get("host") == host or fresh(v, 3 * WATCH_NOTE_EVERY))
    keep[f"{host}:{me}"] = {"host": host, "pid": me, "pid_start": process_start(me), "since": time.time()}
    atomic_write_json(d / WATCH_NAME, {"watchers": keep})
    return others


def unwatched(directory: str | Path) -> str | None:
    """Why no copy guard may watch ``directory`` (None: one noted it and, when it runs on this
    host, still runs). A copy registered where no controller looks runs unguarded, silently:
    another ``--registry.dir``, another user's default, ``PROMREFLEX_COPY_REGISTRY`` set in one
    shell only. On another host or in another PID namespace (a container) a watcher cannot be
    checked and is taken as running."""
    import socket

    d = Path(directory)
    try:
        present = (d / WATCH_NAME).exists()
    except OSError:  # (a registry this user cannot read: registering there fails on its own)
        return None
    if not present:
        return f"no copy guard has started on {d} (no {WATCH_NAME} there)"
    watchers = _watchers(d)
    if not watchers:
        return None  # unreadable: not ours to judge
    host = socket.gethostname()
    for v in watchers.values():
        if v.get("host") != host:
            since = v.get("since")
            if isinstance(since, (int, float)) and time.time() - since <= WATCH_STALE:
                return None  # (another host's guard that noted itself lately: taken as running)
            continue
        pid, start = v.get("pid"), v.get("pid_start")
        if isinstance(pid, int) and same_process(pid, start if isinstance(start, (int, float)) else None):
            return None
    pids = ", ".join(str(v.get("pid")) for v in watchers.values())
    return f"the copy guard that watched {d} (controller pid {pids}) is not running"


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
