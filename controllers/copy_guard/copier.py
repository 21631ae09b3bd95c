"""``promreflex copy SRC DST``: a resumable copier that a controller can pause, resume and
throttle at any chunk, and that continues where it stopped after being stopped or killed.

How it stays correct across kills:
- The plan (every file, directory and symlink with sizes, mtimes and modes, the owners of
  folders and symlinks, which files are hard links of which) is taken once and written once,
  atomically, beside the destination (``.<dst name>.promreflex-copy.json``). Where the copy is
  (the next file, how many of its bytes are safely in its part file) is a separate small file
  (``.<dst name>.promreflex-copy.progress.json``, a few dozen bytes, fsync'd and renamed): at
  each data checkpoint (every ``checkpoint_bytes``, after fdatasync) and, between files, every
  ``checkpoint_files`` files or ``checkpoint_seconds``, not after each file. So the journal
  costs O(1) per file whatever the size of the tree. A resume after a kill starts from the last
  checkpoint: the files completed since are only checked (size and mtime), not copied again.
- A file is written to a hidden part file (``.<hash of its name>.promreflex-part``, fixed length
  so a 255-byte name has one too) in its destination folder, fsync'd, its size checked against
  the source, given the source's owner, extended attributes, mode and mtime (in that order:
  chown clears setuid bits and file capabilities), and only then renamed to its name: a
  destination file under its real name is always complete (a symlink or a hard link is made
  under a part name too, then renamed). A source file whose name has that form (a leftover of an
  interrupted copy) is not copied (listed in ``plan.skipped``).
- On restart the part file is cut back to the journaled offset and the copy continues there; a
  file whose destination already has the source's size and mtime is done (also covers a kill
  between the rename and the journal update) and only given the source's owner, extended
  attributes and mode. A source file that changed since the plan is copied again from the
  start (counted). A journal of the version before (2) is planned again; the file it was in
  goes on from its offset.

- One copier per destination: the lock file beside the journal (``flock``, released by the
  kernel when a copier dies) refuses a second copier into the same DST while one runs
  (:class:`CopyBusy`, naming the first one's pid; ``promreflex copy`` exits 1).

What a live source does (as rsync, the copy goes on and says so):
- A file that changes while it is copied is copied again from the start, at most
  ``MAX_ATTEMPTS`` (3) times, with a warning each time; after the last, the bytes it had when
  that attempt started are kept (not a consistent snapshot: a warning names it, and its mtime
  is the one of that moment, so the next run copies it again).
- A file that vanished is skipped with a warning (``progress.vanished``); the journal moves on.
- A folder that cannot be listed, an entry that cannot be read at planning, a file that cannot
  be opened (permissions) are skipped and named (``progress.unreadable``); the copy goes on.
  ``promreflex copy`` exits 23 if anything could not be read, else 24 if something vanished.
- Special files (sockets, FIFOs, devices) are not copied: warned and listed (``plan.skipped``).
- A write error (ENOSPC, EIO, EDQUOT) fails the copy with a message naming the destination file
  and the error (resumable once fixed); a journal that cannot be read or written raises
  :class:`JournalError`. A torn journal is ignored: the copy plans again.
- Kept, as ``cp -a``: contents, modes, mtimes (of files, folders and symlinks), owner and
  group, extended attributes (ACLs are ``system.posix_acl_*``; as root ``security.*`` too:
  file capabilities, SELinux labels), hard links within SRC (a name after the first is linked
  to the first one's copy: across a stop or a kill too; a name whose file changed or split off
  since the plan is copied apart), holes (found with SEEK_DATA/SEEK_HOLE, in 4 KiB blocks; a
  sparse VM image or database file takes its blocks, not its size). In DST a user attribute or
  ACL the source has not (inherited from a default ACL, stale) is taken away. Owners: as root,
  every file, folder and symlink gets the source's (a refusal, NFS root squash, is warned once);
  as another user, as ``cp -a``: what chown allows (its own owner, the source's group if it is
  in it), silently, and a file whose owner and group are not both kept loses its setuid, setgid
  and sticky bits (a folder its setuid and setgid bits). An attribute DST refuses
  (``security.*`` as a user, a filesystem without user attributes) is warned once per name, the
  copy goes on.
- Not kept: access times (set to the mtime), change and birth times (no call sets them), hard
  links to files outside SRC (copied), ``chattr`` flags (immutable, append-only; cp -a neither),
  ``security.evm`` and XFS internals (as cp's xattr.conf), special files (sockets, FIFOs,
  devices: skipped, above).
- A DST that others may write in: owner, mode, times and attributes are set through a descriptor
  opened without following (a name swapped for a symlink never has them set on its target), but
  the folders above a file are still reached by name, so a user who can replace ``DST/sub`` with a
  symlink during a root copy can have files created where it points (as with cp and rsync without
  ``--safe-links``-style care): give DST to the copy's user alone.

Pausing and throttling: before every chunk (default 1 MiB) the copier asks its
:class:`Control` (and between files, :meth:`Control.hold`: a pause or a stop holds empty files too). A pause holds until resumed or until its *lease* runs out (the controller
renews it; if the controller dies, the copy resumes by itself). A throttle, with a lease too,
either caps the rate (``bytes_per_second``, token bucket) or gives the copy a *share* of its own
speed (``share`` in (0, 1]: after each chunk it waits ``chunk time * (1 - share) / share``, so
it runs ``share`` of the time whatever its I/O mode, disk or competition; the adaptive throttle
of the copy-guard action sends shares). ``rate_limit`` is the copy's own cap when nobody
throttles it.

Page cache: ``io="fadvise"`` (default) drops the pages it read and, at each checkpoint, the
pages it wrote (after fdatasync), so a backup does not evict the shop's cache; ``"direct"``
uses O_DIRECT (falls back to fadvise where the filesystem refuses it, e.g. tmpfs);
``"buffered"`` is a plain copy (what cp does: useful to create contention in a benchmark).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import mmap
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from promreflex import fsutil

IO_MODES = ("fadvise", "direct", "buffered")
STATES = ("running", "paused", "throttled", "done", "failed")
COMMANDS = ("pause", "resume", "throttle")
ALIGN = 4096
JOURNAL_VERSION = 3  # 3: owners, symlink mtimes, hard links in the plan (a version 2 journal is planned again)
_SKIP_LISTS = ("unreadable", "vanished", "kept_changing")  # Progress lists kept in the progress file
MAX_ATTEMPTS = 3  # copies of a file that keeps changing under the copy before it is kept as is
PART_SUFFIX = ".promreflex-part"
_PART_RE = re.compile(r"^\.[0-9a-f]{32}\.promreflex-part$")
# Extended attributes not copied, as cp's /etc/xattr.conf: written by the kernel only, XFS internals.
_XATTR_SKIP = ("security.evm", "trusted.SGI_", "xfsroot.")
# Attributes removed from a DST entry when the source has none of that name (an ACL inherited from
# a DST folder's default ACL, a stale user attribute). Others (security.selinux set by the policy) stay.
_XATTR_MIRRORED = ("user.", "system.posix_acl_")
# What a filesystem (or a non-root user) answers for an attribute it will not hold: warned, not fatal.
_XATTR_REFUSED = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.EINVAL, errno.E2BIG,
                            errno.ERANGE, errno.ENOSPC, errno.EDQUOT})
# Kept only with the owner (as cp -a: a setuid file copied by a user who cannot give it its owner
# loses the bit; a folder keeps its sticky bit).
_OWNER_BITS_FILE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_OWNER_BITS_DIR = stat.S_ISUID | stat.S_ISGID

log = logging.getLogger("promreflex.copy")


class CopyError(Exception):
    """The copy cannot go on (bad source, no space, ...); the message says why."""


class JournalError(CopyError):
    """The journal beside the destination cannot be read or written."""


class CopyBusy(JournalError):
    """Another copier is copying into the same destination (it holds the lock beside it)."""


class Stopped(Exception):
    """The copy was asked to stop; it is resumable from the journal."""


class _Vanished(Exception):
    """The source file is gone: skip it."""


class _Unreadable(Exception):
    """The source file cannot be opened (permissions): skip it, report it."""


class _Changed(Exception):
    """A DST name is no longer what was checked (a symlink, a FIFO or another file swapped in by
    someone who can write in that DST folder): its metadata is not set through it."""


# A DST file or folder whose owner, mode, times and attributes are set: opened without following
# a symlink (ELOOP), without blocking on a FIFO swapped in, never as a controlling terminal.
_META_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _Meta:
    """Where the copy sets owner, mode, times and extended attributes: a descriptor of the DST
    file or folder (opened without following, checked with fstat), so a name swapped for a symlink
    after the check never has them set on the symlink's target; or, for a symlink itself, its
    name with ``follow_symlinks=False``. A file or folder its owner may not read (mode 0o200, 0o300)
    is opened with O_PATH and changed through ``/proc/self/fd/N``, which names that very inode."""

    __slots__ = ("ref", "st", "fd", "_nofollow")

    def __init__(self, ref: int | str | Path, st: os.stat_result, fd: int = -1, nofollow: bool = False):
        self.ref, self.st, self.fd, self._nofollow = ref, st, fd, nofollow

    @classmethod
    def open(cls, path: Path, folder: bool) -> _Meta:
        """``path`` (a regular file, or a folder if ``folder``), never followed; raises
        :class:`_Changed` if it is something else now. The caller closes it."""
        flags = _META_FLAGS | (os.O_DIRECTORY if folder else 0)
        ref: int | str
        try:
            fd = ref = os.open(path, flags)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.ENODEV, errno.EISDIR):
                raise _Changed(f"{path} is no longer a {'folder' if folder else 'regular file'}") from None
            if e.errno not in (errno.EACCES, errno.EPERM):
                raise
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)  # (its owner may not read it)
            ref = f"/proc/self/fd/{fd}"
        try:
            st = os.fstat(fd)
            if not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
                raise _Changed(f"{path} is no longer a {'folder' if folder else 'regular file'}")
        except BaseException:
            os.close(fd)
            raise
        return cls(ref, st, fd)

    @classmethod
    def link(cls, path: Path, st: os.stat_result) -> _Meta:
        """A symlink: its own name, never followed."""
        return cls(path, st, nofollow=True)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def chown(self, uid: int, gid: int) -> None:
        if self._nofollow:
            os.chown(self.ref, uid, gid, follow_symlinks=False)
        else:
            os.chown(self.ref, uid, gid)

    def chmod(self, mode: int) -> None:
        os.chmod(self.ref, mode)  # (never a symlink's: the copy does not set those)

    def utime(self, ns: int) -> None:
        if self._nofollow:
            os.utime(self.ref, ns=(ns, ns), follow_symlinks=False)
        else:
            os.utime(self.ref, ns=(ns, ns))

    def listxattr(self) -> list[str]:
        return os.listxattr(self.ref, follow_symlinks=False) if self._nofollow else os.listxattr(self.ref)

    def getxattr(self, name: str) -> bytes:
        return os.getxattr(self.ref, name, follow_symlinks=False) if self._nofollow else os.getxattr(self.ref, name)

    def setxattr(self, name: str, value: bytes) -> None:
        if self._nofollow:
            os.setxattr(self.ref, name, value, follow_symlinks=False)
        else:
            os.setxattr(self.ref, name, value)

    def removexattr(self, name: str) -> None:
        if self._nofollow:
            os.removexattr(self.ref, name, follow_symlinks=False)
        else:
            os.removexattr(self.ref, name)


def journal_path(dst: Path) -> Path:
    """The plan, written once when the copy starts."""
    return dst.parent / f".{dst.name}.promreflex-copy.json"


def progress_path(journal: Path) -> Path:
    """Where the copy is (next file, bytes of it in its part file): a few dozen bytes."""
    return journal.with_name(journal.name.removesuffix(".json") + ".progress.json")


def lock_path(journal: Path) -> Path:
    """Held (flock) by the one copier copying into this DST: a second gets :class:`CopyBusy`."""
    return journal.with_name(journal.name.removesuffix(".json") + ".lock")


class _DstLock:
    """An exclusive ``flock`` on the lock file beside the journal, so two copies into one DST
    (a second ``promreflex copy`` of the same command, a cron job started again while the first
    still runs) never write the same part files and journal. The file is removed when the copy is
    done (under the lock); a copier that opened it just before checks after locking that the
    path still names the file it locked, else opens the new one."""

    def __init__(self, path: Path, dst: Path):
        self.path, self.dst = path, dst
        self.fd: int | None = None

    def acquire(self) -> None:
        if self.fd is not None:
            return
        while True:
            try:
                fd = fsutil.lock_exclusive(self.path)
            except fsutil.LockHeld as e:
                raise CopyBusy(f"another promreflex copy (pid {e.holder}) is copying into {self.dst}: wait for it "
                               f"to end, or stop it (it resumes where it stopped when run again)") from None
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return
            os.close(fd)  # removed by a copy that ended meanwhile: lock the new one

    def release(self, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        fd, self.fd = self.fd, None
        os.close(fd)


def part_path(final: Path) -> Path:
    """The hidden part file of ``final``: a fixed-length name (so a 255-byte name still has one)
    that no real file of the copy can have (source entries of that form are skipped)."""
    digest = hashlib.blake2b(os.fsencode(final.name), digest_size=16).hexdigest()
    return final.parent / f".{digest}{PART_SUFFIX}"


def is_part_name(name: str) -> bool:
    return bool(_PART_RE.match(name))


# ---------------------------------------------------------------------- control
class Control:
    """What the copier may do right now: run, wait (paused), or run at a capped rate.

    Thread-safe: the HTTP control endpoint calls pause/resume/throttle, the copying thread calls
    :meth:`wait_turn` before each chunk. Time spent paused or throttled is accumulated."""

    def __init__(self, rate_limit: float = 0.0, max_lease: float = 600.0, default_lease: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.base_rate = float(rate_limit)
        self.max_lease = max_lease
        self.default_lease = default_lease
        self.clock = clock
        self.cond = threading.Condition()
        self.mode = "running"  # running | paused | throttled
        self.hold_rate = 0.0  # throttled by a byte rate (0: not)
        self.hold_share = 1.0  # throttled by a share of the copy's own speed (1: not)
        self.until = 0.0
        self.stopping = False
        self.paused_seconds = 0.0
        self.throttled_seconds = 0.0
        self.pauses = 0
        self.lease_expiries = 0
        self._mode_since = clock()
        self._next_send = 0.0
        self._chunk_end = 0.0  # when the copying thread last left wait_turn (0: not yet)
        self._chunk_work = 0.0  # how long the chunk before took (its I/O and its rate-cap wait)
        self.share_wait_seconds = 0.0  # waited because of a share (the duty the share imposes)
        self.work_seconds = 0.0  # spent copying (and rate-capped) while a share applied

    # --- commands (any thread)
    def _lease(self, lease: float | None) -> float:
        lease = self.default_lease if lease is None else float(lease)
        if not (0 < lease <= self.max_lease):
            raise ValueError(f"lease must be in (0, {self.max_lease:g}] seconds")
        return lease

    def _set_mode(self, mode: str) -> None:
        now = self.clock()
        self._account(now)
        if mode == "paused" and self.mode != "paused":
            self.pauses += 1
        if mode != self.mode and mode != "throttled":  # (throttle() says by how much)
            log.info("%s (was %s)", mode, self.mode)
        self.mode = mode
        self.cond.notify_all()

    def _account(self, now: float) -> None:
        spent = now - self._mode_since
        if self.mode == "paused":
            self.paused_seconds += spent
        elif self.mode == "throttled":
            self.throttled_seconds += spent
        self._mode_since = now

    def pause(self, lease: float | None = None) -> None:
        with self.cond:
            self.until = self.clock() + self._lease(lease)
            self._set_mode("paused")

    def throttle(self, bytes_per_second: float | None = None, lease: float | None = None,
                 share: float | None = None) -> None:
        """Cap the rate (``bytes_per_second``) or run at ``share`` of the copy's own speed
        (exactly one of the two), until resumed or the lease runs out. A share of 1 runs free
        (under the lease); a renewal with a new value replaces the old one."""
        if (bytes_per_second is None) == (share is None):
            raise ValueError("give either bytes_per_second or share")
        if bytes_per_second is not None and not (bytes_per_second > 0 and math.isfinite(bytes_per_second)):
            raise ValueError("bytes_per_second must be above 0")
        if share is not None and not (0 < share <= 1):
            raise ValueError("share must be in (0, 1]")
        with self.cond:
            self.until = self.clock() + self._lease(lease)
            before = (self.mode, self.hold_share, self.hold_rate)
            self.hold_rate = float(bytes_per_second or 0.0)
            self.hold_share = float(share) if share is not None else 1.0
            self._set_mode("throttled")
            if before != ("throttled", self.hold_share, self.hold_rate):  # a renewal says nothing
                log.info("throttled to %s", f"{self.hold_rate / 1e6:.1f} MB/s" if self.hold_rate
                         else f"{self.hold_share:.0%} of its speed")

    def resume(self) -> None:
        with self.cond:
            self._set_mode("running")

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # --- reading
    def _expire(self, now: float) -> None:
        if self.mode != "running" and now >= self.until:
            self.lease_expiries += 1
            log.warning("%s lease expired (not renewed): running again", self.mode)
            self._set_mode("running")

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            now = self.clock()
            self._expire(now)
            self._account(now)
            return {
                "mode": self.mode, "lease_left": max(0.0, self.until - now) if self.mode != "running" else 0.0,
                "rate": self.rate(), "share": self.share(), "paused_seconds": self.paused_seconds,
                "throttled_seconds": self.throttled_seconds, "pauses": self.pauses,
                "lease_expiries": self.lease_expiries, "share_wait_seconds": self.share_wait_seconds,
                "work_seconds": self.work_seconds,
            }

    def rate(self) -> float:
        if self.mode == "throttled" and self.hold_rate > 0:
            return min(self.hold_rate, self.base_rate) if self.base_rate > 0 else self.hold_rate
        return self.base_rate

    def share(self) -> float:
        """The share of its own speed the copy may use now (0 paused, 1 free)."""
        if self.mode == "paused":
            return 0.0
        return self.hold_share if self.mode == "throttled" else 1.0

    # --- the copying thread
    def wait_turn(self, nbytes: int) -> None:
        """Block while paused; hold the share; pace ``nbytes`` at the current rate. Raises Stopped."""
        with self.cond:
            entered = self.clock()
            # The chunk before this call took `work`: its I/O (since we last returned) plus the
            # rate cap's wait. A share s waits work * (1 - s) / s before this chunk, re-read at
            # each wake-up so a new share (or a resume) takes effect at once.
            work = self._chunk_work + (entered - self._chunk_end if self._chunk_end else 0.0)
            counted = False
            rate_wait_from: float | None = None
            while True:
                if self.stopping:
                    raise Stopped()
                now = self.clock()
                self._expire(now)
                if self.mode == "paused":
                    self.cond.wait(timeout=min(0.25, max(0.001, self.until - now)))
                    continue
                share = self.share()
                if share < 1.0 and rate_wait_from is None:
                    if not counted:
                        self.work_seconds += work
                        counted = True
                    due = entered + work * (1.0 - share) / share
                    if now < due:
                        self.cond.wait(timeout=min(0.25, due - now))
                        waited = min(self.clock(), due) - now
                        self.share_wait_seconds += waited
                        self._next_send += waited  # a share's wait is not credit for the rate cap
                        continue
                rate = self.rate()
                if rate <= 0:
                    self._next_send = now
                    break
                if self._next_send < now - 0.1:  # no credit saved beyond 100 ms of idling
                    self._next_send = now - 0.1
                if self._next_send <= now:
                    self._next_send += nbytes / rate
                    break
                if rate_wait_from is None:
                    rate_wait_from = now
                self.cond.wait(timeout=min(0.25, self._next_send - now))
            end = self.clock()
            self._chunk_work = end - rate_wait_from if rate_wait_from is not None else 0.0
            self._chunk_end = end

    def hold(self) -> None:
        """Between files (and before the links and folders): block while paused. Raises Stopped."""
        with self.cond:
            while True:
                if self.stopping:
                    raise Stopped()
                now = self.clock()
                self._expire(now)
                if self.mode != "paused":
                    return
                self.cond.wait(timeout=min(0.25, max(0.001, self.until - now)))


# ---------------------------------------------------------------------- plan
@dataclass
class FileItem:
    rel: str  # "" for a single-file copy
    size: int
    mtime_ns: int
    mode: int  # (as planned; owner and mode are given as the file has them when it is copied)
    # A hard link: the index in ``Plan.files`` of the name before it of the same source inode (the
    # destination links to that name's copy instead of copying the data again); -1 otherwise.
    link: int = -1
    apart: bool = field(default=False, compare=False)  # a hard link copied apart (not linkable): not journaled

    @property
    def data_bytes(self) -> int:
        """Bytes this name has to write (none for a second name of a hard-linked file)."""
        return self.size if self.link < 0 or self.apart else 0


@dataclass
class Plan:
    src: str
    dst: str
    single: bool
    files: list[FileItem]
    dirs: list[tuple[str, int, int, int, int]]  # rel, mode, mtime_ns, uid, gid
    links: list[tuple[str, str, int, int, int]]  # rel, target, mtime_ns, uid, gid (symlinks)
    skipped: list[str] = field(default_factory=list)  # special files (sockets, fifos, devices), part files
    unreadable: list[str] = field(default_factory=list)  # "rel: why": folders not listed, entries not read

    @property
    def total_bytes(self) -> int:
        return sum(f.data_bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "single": self.single,
                "files": [[f.rel, f.size, f.mtime_ns, f.mode, f.link] for f in self.files],
                "dirs": [list(d) for d in self.dirs], "links": [list(x) for x in self.links],
                "skipped": self.skipped, "unreadable": self.unreadable}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        files = [FileItem(str(r), int(s), int(m), int(md), int(ln)) for r, s, m, md, ln in data["files"]]
        if any(not (-1 <= f.link < i) for i, f in enumerate(files)):
            raise ValueError("a hard link to a later file")  # (a foreign plan: planned again)
        return cls(data["src"], data["dst"], bool(data["single"]), files,
                   [(str(r), int(md), int(m), int(u), int(g)) for r, md, m, u, g in data["dirs"]],
                   [(str(r), str(t), int(m), int(u), int(g)) for r, t, m, u, g in data["links"]],
                   list(data.get("skipped", [])), list(data.get("unreadable", [])))


def resolve_dst(src: Path, dst: Path) -> Path:
    """``cp`` semantics: copying into an existing directory puts the source inside it."""
    if dst.is_dir() and not src.is_dir():
        return dst / src.name
    if dst.is_dir() and src.is_dir() and dst.resolve() == src.resolve():
        raise CopyError("source and destination are the same directory")
    return dst


def make_plan(src: Path, dst: Path) -> Plan:
    try:
        st = src.lstat()
    except OSError as e:
        raise CopyError(f"cannot read source {src}: {e.strerror}") from e
    if stat.S_ISREG(st.st_mode):
        return Plan(str(src), str(dst), True, [FileItem("", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))], [], [])
    if not stat.S_ISDIR(st.st_mode):
        raise CopyError(f"source {src} is neither a file nor a directory")
    if dst.resolve().is_relative_to(src.resolve()):
        raise CopyError(f"destination {dst} is inside the source {src}")
    files: list[FileItem] = []
    dirs = [("", stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_uid, st.st_gid)]
    links: list[tuple[str, str, int, int, int]] = []
    skipped: list[str] = []
    unreadable: list[str] = []
    inodes: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of a file with several names -> its last name

    def not_listed(e: OSError) -> None:  # os.walk drops folders it cannot list unless told
        where = Path(e.filename) if e.filename else src
        rel = str(where.relative_to(src)) if where.is_relative_to(src) else str(where)
        unreadable.append(f"{rel}/: {e.strerror}")

    for root, dirnames, filenames in os.walk(src, onerror=not_listed, followlinks=False):
        dirnames.sort()
        base = Path(root).relative_to(src)
        for name in sorted(dirnames) + sorted(filenames):
            path = Path(root) / name
            rel = str(base / name) if str(base) != "." else name
            try:
                s = path.lstat()
            except OSError as e:
                unreadable.append(f"{rel}: {e.strerror}")
                continue
            if stat.S_ISLNK(s.st_mode):
                try:
                    links.append((rel, os.readlink(path), s.st_mtime_ns, s.st_uid, s.st_gid))
                except OSError as e:
                    unreadable.append(f"{rel}: {e.strerror}")
            elif stat.S_ISDIR(s.st_mode):
                dirs.append((rel, stat.S_IMODE(s.st_mode), s.st_mtime_ns, s.st_uid, s.st_gid))
            elif stat.S_ISREG(s.st_mode) and is_part_name(name):
                skipped.append(rel)  # a part file of an interrupted copy: its name is the copier's
            elif stat.S_ISREG(s.st_mode):
                link = -1
                if s.st_nlink > 1:  # hard links: each name after the first links to the one before
                    link = inodes.get((s.st_dev, s.st_ino), -1)
                    inodes[(s.st_dev, s.st_ino)] = len(files)
                files.append(FileItem(rel, s.st_size, s.st_mtime_ns, stat.S_IMODE(s.st_mode), link))
            else:
                skipped.append(rel)
    # os.walk lists a symlink to a directory among dirnames without descending: handled above.
    return Plan(str(src), str(dst), False, files, dirs, links, skipped, unreadable)


# ---------------------------------------------------------------------- the copier
@dataclass
class Progress:
    total_bytes: int = 0
    done_bytes: int = 0  # of the whole copy, previous runs included
    copied_bytes: int = 0  # written by this process
    total_files: int = 0
    done_files: int = 0
    state: str = "running"
    source_changes: int = 0
    resumed_from: int = 0  # bytes already done when this process started
    error: str = ""
    vanished: list[str] = field(default_factory=list)  # source files gone before they were copied
    kept_changing: list[str] = field(default_factory=list)  # copied as they were after MAX_ATTEMPTS
    unreadable: list[str] = field(default_factory=list)  # "rel: why", planning and copying


class Copier:
    """Copies SRC to DST (see the module docstring). The journal is two files: the plan, written
    once, and the progress (next file, offset), rewritten at each data checkpoint and, between
    files, at most every ``checkpoint_seconds`` or ``checkpoint_files`` files: a resume after a
    kill re-checks (stat) the files done since, it does not copy them again."""

    _src_stat: os.stat_result  # the file being copied, as the last check saw it

    def __init__(self, src: str | Path, dst: str | Path, *, control: Control | None = None,
                 chunk_size: int = 1 << 20, io: str = "fadvise", checkpoint_bytes: int = 16 << 20,
                 journal: str | Path | None = None, fresh: bool = False,
                 on_chunk: Callable[[Copier], None] | None = None,
                 checkpoint_seconds: float = 2.0, checkpoint_files: int = 1000,
                 clock: Callable[[], float] = time.monotonic):
        if io not in IO_MODES:
            raise ValueError(f"io must be one of {', '.join(IO_MODES)}")
        if chunk_size < ALIGN or chunk_size % ALIGN:
            raise ValueError(f"chunk size must be a positive multiple of {ALIGN}")
        self.src = Path(src).absolute()
        self.dst = resolve_dst(self.src, Path(dst).absolute())
        self.control = control or Control()
        self.chunk_size = chunk_size
        self.io = io
        self.io_effective = io
        self.checkpoint_bytes = max(chunk_size, checkpoint_bytes)
        self.checkpoint_seconds = checkpoint_seconds
        self.checkpoint_files = max(1, checkpoint_files)
        self.clock = clock
        self.journal = Path(journal) if journal else journal_path(self.dst)
        self.progress_file = progress_path(self.journal)
        self.on_chunk = on_chunk
        self.progress = Progress()
        self._buf: mmap.mmap | None = None
        self._journal_id = ""
        self._saved: tuple[int, ...] = (-1, -1)  # (next, offset, lengths of the skip lists) last written
        self._skipped_before: dict[str, list[str]] = {}
        self._saved_at = clock()
        self._privileged = os.geteuid() == 0  # may give files any owner (else: what cp -a keeps)
        self._warned: set[str] = set()  # what was warned about once (an attribute name, the owners)
        # A copy journaled by the version before (2) is planned again; the file it was in the middle
        # of goes on from its offset: (rel, size, mtime_ns, offset).
        self._old_resume: tuple[str, int, int, int] | None = None
        self._part_created = False
        self._src_xattrs: list[str] | None = None  # the file's attribute names, listed once its data is copied
        self._acl_folder: tuple[str, bool] | None = None  # a DST folder (rel), and if it has a default ACL
        self.next_index = self.offset = 0
        self._lock = _DstLock(lock_path(self.journal), self.dst)
        try:
            self._lock.acquire()
        except OSError as e:
            raise JournalError(f"cannot use the journal lock {self._lock.path}: {e.strerror}") from e
        try:  # (planning writes the journal; run() takes the lock again for the whole copy)
            self.plan, self.next_index, self.offset = self._load_or_plan(fresh)
        finally:
            self._lock.release()
        self.progress.total_bytes = self.plan.total_bytes
        self.progress.total_files = len(self.plan.files)
        self.progress.unreadable = list(self.plan.unreadable)
        # Files skipped before a stop or kill, kept in the progress file (a resumed run does not
        # pass them again: it must still report them, and exit 23 or 24).
        for k, v in self._skipped_before.items():
            getattr(self.progress, k).extend(x for x in v if x not in getattr(self.progress, k))
        self._done_before = sum(f.data_bytes for f in self.plan.files[: self.next_index])
        self._tick()
        self.progress.resumed_from = self.progress.done_bytes

    def _tick(self) -> None:
        self.progress.done_bytes = self._done_before + self.offset
        self.progress.done_files = self.next_index

    # --- journal
    def _load_or_plan(self, fresh: bool) -> tuple[Plan, int, int]:
        try:
            return self._load_or_plan_io(fresh)
        except OSError as e:
            raise JournalError(f"cannot use the journal {self.journal}: {e.strerror}") from e

    def _load_or_plan_io(self, fresh: bool) -> tuple[Plan, int, int]:
        data = None if fresh else _read_json(self.journal)
        if isinstance(data, dict) and data.get("version") == JOURNAL_VERSION:
            try:
                plan = Plan.from_json(data["plan"])
                if plan.src == str(self.src) and plan.dst == str(self.dst):
                    self._journal_id = str(data["id"])
                    where = _read_json(self.progress_file)
                    if isinstance(where, dict) and where.get("id") == self._journal_id:
                        next_index, offset = int(where["next"]), int(where["offset"])
                        if 0 <= next_index <= len(plan.files) and offset >= 0:
                            # What was skipped before the stop or kill (not in the plan).
                            self._skipped_before = {k: [str(x) for x in where.get(k) or []] for k in _SKIP_LISTS}
                            self._saved = (next_index, offset, *(len(v) for v in self._skipped_before.values()))
                            return plan, next_index, offset
                    # No usable progress: from the first file (done ones are skipped by size+mtime).
                    return plan, 0, 0
            except (KeyError, TypeError, ValueError):
                pass  # an unreadable journal: plan again (done files are skipped by size+mtime)
        elif isinstance(data, dict) and data.get("version") == 2:
            self._old_resume = self._v2_resume_point(data)
        elif isinstance(data, dict) and data.get("version") == 1:
            _drop_v1_part(data)
        plan = make_plan(self.src, self.dst)
        self._journal_id = secrets.token_hex(8)
        self.progress_file.unlink(missing_ok=True)
        _write_json(self.journal, {"version": JOURNAL_VERSION, "id": self._journal_id, "plan": plan.to_json(),
                                   "created": time.time()})
        self.checkpoint()
        return plan, 0, 0

    def _v2_resume_point(self, data: dict[str, Any]) -> tuple[str, int, int, int] | None:
        """Where a copy journaled by promreflex's version before (plans without owners or hard
        links) was: the new plan copies the file it was in from its journaled offset (the part
        file has the same name), if that file has not changed since (files done are skipped by
        size and mtime, and given their owner, attributes and mode)."""
        where = _read_json(self.progress_file)
        try:
            plan = data["plan"]
            if (not isinstance(where, dict) or where.get("id") != data["id"] or plan["src"] != str(self.src)
                    or plan["dst"] != str(self.dst)):
                return None
            rel, size, mtime_ns = plan["files"][int(where["next"])][:3]
            offset = int(where["offset"])
            return (str(rel), int(size), int(mtime_ns), offset) if offset > 0 else None
        except (KeyError, TypeError, ValueError, IndexError):
            return None

    def checkpoint(self) -> None:
        """Journal where the copy is: a small file, whatever the size of the plan."""
        lists = {k: getattr(self.progress, k) for k in _SKIP_LISTS}
        where = (self.next_index, self.offset, *(len(v) for v in lists.values()))
        if where != self._saved:
            try:
                _write_json(self.progress_file, {"id": self._journal_id, "next": where[0], "offset": where[1],
                                                 **{k: v for k, v in lists.items() if v}})
            except OSError as e:  # (a write or fsync error names no file)
                raise JournalError(f"cannot write the journal {self.progress_file}: {e.strerror}") from None
            self._saved = where
        self._saved_at = self.clock()

    def _maybe_checkpoint(self) -> None:
        """Between files: every ``checkpoint_files`` files or ``checkpoint_seconds``, not after each."""
        skipped = sum(len(getattr(self.progress, k)) for k in _SKIP_LISTS)
        if (self.next_index - self._saved[0] >= self.checkpoint_files
                or self.clock() - self._saved_at >= self.checkpoint_seconds
                or skipped != sum(self._saved[2:])):  # a file skipped: written before the copy moves on
            self.checkpoint()

    # --- paths
    def final_path(self, item: FileItem) -> Path:
        return self.dst if self.plan.single else self.dst / item.rel

    def _src_path(self, item: FileItem) -> Path:
        return self.src if self.plan.single else self.src / item.rel

    # --- run
    def run(self) -> Progress:
        """Copy until done; raises Stopped (resumable) or CopyError (state failed). Files that
        vanished, kept changing or could not be read are in ``progress`` (the copy goes on)."""
        try:
            self._lock.acquire()
        except OSError as e:
            raise JournalError(f"cannot use the journal lock {self._lock.path}: {e.strerror}") from e
        done = False
        try:
            self._run()
            done = True
        except Stopped:
            self.progress.state = "running"
            raise
        except CopyError as e:
            self.progress.state, self.progress.error = "failed", str(e)
            raise
        except OSError as e:
            self.progress.state, self.progress.error = "failed", f"{e.filename or ''}: {e.strerror}"
            raise CopyError(self.progress.error) from e
        finally:
            self._lock.release(remove=done)  # (done: the journal is gone, so is the lock file)
            if self._buf is not None:
                buf, self._buf = self._buf, None
                try:
                    buf.close()
                except BufferError:  # a view still referenced by a traceback: let it go with it
                    pass
        self.progress.state = "done"
        return self.progress

    def _run(self) -> None:
        if not self.plan.single:
            for rel, *_ in self.plan.dirs:  # (parents first)
                d = self.dst / rel
                if rel not in ("", ".") and (d.is_symlink() or (d.exists() and not d.is_dir())):
                    # Where the source has a folder, the destination's symlink (yesterday's
                    # `cache -> /elsewhere`) or file is replaced, as rsync does: followed, it
                    # had the copy write, chmod and utime outside DST.
                    log.warning("replacing the %s %s in the destination with the source's folder",
                                "symlink" if d.is_symlink() else "file", d)
                    d.unlink()
                d.mkdir(parents=True, exist_ok=True)
        else:
            self.dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            while self.next_index < len(self.plan.files):
                self.control.hold()  # a pause or a stop also holds between files (empty ones too)
                item = self.plan.files[self.next_index]
                self._copy_file(item)
                self._done_before += item.data_bytes
                self.next_index += 1
                self.offset = 0
                self._tick()
                self._maybe_checkpoint()
            self.control.hold()
        except Stopped:
            self.checkpoint()
            raise
        if not self.plan.single:
            for rel, target, mtime_ns, uid, gid in self.plan.links:
                self._symlink(self.src / rel, self.dst / rel, target, mtime_ns, uid, gid)
            for rel, mode, mtime_ns, uid, gid in reversed(self.plan.dirs):  # deepest last-listed first
                d = self.dst / rel
                try:  # (through a descriptor: a symlink swapped in for the folder is never followed)
                    m = _Meta.open(d, folder=True)
                except _Changed:
                    log.warning("%s is no longer a folder (replaced during the copy): its owner, mode, "
                                "times and attributes not set", d)
                    continue
                try:
                    st = m.st
                    kept = (st.st_uid, st.st_gid) == (uid, gid) or self._chown(m, uid, gid, self.src / rel)
                    self._sync_xattrs(self.src / rel, m)
                    m.chmod(mode if kept else mode & ~_OWNER_BITS_DIR)
                    m.utime(mtime_ns)
                finally:
                    m.close()
        for rel in self.plan.skipped:
            log.warning("not copied (not a regular file, folder or symlink): %s", rel)
        for what in self.plan.unreadable:
            log.error("could not be read, not copied: %s", what)
        self.journal.unlink(missing_ok=True)
        self.progress_file.unlink(missing_ok=True)

    def _source_changed(self, item: FileItem, src: Path) -> bool:
        try:
            s = src.stat()
        except FileNotFoundError as e:
            raise _Vanished(e.strerror) from e
        except PermissionError as e:
            raise _Unreadable(e.strerror) from e
        self._src_stat = s  # (its owner and mode are given as they are now)
        if (s.st_size, s.st_mtime_ns) != (item.size, item.mtime_ns):
            item.size, item.mtime_ns, item.mode = s.st_size, s.st_mtime_ns, stat.S_IMODE(s.st_mode)
            self.progress.source_changes += 1
            self.progress.total_bytes = self.plan.total_bytes
            return True
        return False

    def _copy_file(self, item: FileItem) -> None:
        src = self._src_path(item)
        final = self.final_path(item)
        part = part_path(final)
        try:
            self._copy_file_or_vanish(item, src, final, part)
        except _Vanished as e:
            part.unlink(missing_ok=True)
            self.offset = 0
            self.progress.vanished.append(item.rel or str(src))
            log.warning("source file %s vanished (%s): skipped", src, e)
        except _Unreadable as e:
            part.unlink(missing_ok=True)
            self.offset = 0
            self.progress.unreadable.append(f"{item.rel or src}: {e}")
            log.error("source file %s cannot be read (%s): skipped", src, e)

    def _copy_file_or_vanish(self, item: FileItem, src: Path, final: Path, part: Path) -> None:
        if self._source_changed(item, src):
            self.offset = 0
        if item.link >= 0:
            if self._hard_link(item, src, final, part):
                return
            item.apart = True  # not linkable (changed, vanished, refused): this name is copied
            self.progress.total_bytes = self.plan.total_bytes
        try:
            f = final.lstat()  # (a symlink in DST at this name is not the copy: os.replace swaps it)
            # Done before (a kill between the rename and the journal, or a re-run): its owner,
            # attributes and mode are brought in line with the source's (if it is still the file
            # checked: else it is copied again).
            if (stat.S_ISREG(f.st_mode) and not part.exists()
                    and (f.st_size, f.st_mtime_ns) == (item.size, item.mtime_ns)
                    and self._align(final, f, src, xattrs=True)):
                return
        except FileNotFoundError:
            pass
        old = self._old_resume
        if old is not None and old[:3] == (item.rel, item.size, item.mtime_ns):
            self._old_resume = None
            self.offset = self.offset or old[3]  # the old version's part file, journaled this far
        if self.offset and (not part.exists() or part.stat().st_size < self.offset):
            self.offset = 0  # the part file is shorter than the journal says: start this file again
        self._tick()
        attempt = 1
        while True:
            dfd = self._copy_data(item, src, part, final)
            try:
                # Owner first (chown clears setuid and setgid bits and file capabilities), then the
                # extended attributes (ACLs, security.capability), the mode, the mtime; all on the
                # part file, before it gets its name, and through the descriptor its data was
                # written to (its name, swapped for a symlink, is never followed).
                m = _Meta(dfd, os.fstat(dfd))
                st = m.st
                s = self._src_stat
                mode = stat.S_IMODE(s.st_mode)
                kept = (st.st_uid, st.st_gid) == (s.st_uid, s.st_gid) or self._chown(m, s.st_uid, s.st_gid, src)
                self._sync_xattrs(src, m, fresh=self._part_created and not self._inherits_acl(item),
                                  names=self._src_xattrs)
                m.chmod(mode if kept else mode & ~_OWNER_BITS_FILE)
                m.utime(item.mtime_ns)
            finally:
                os.close(dfd)
            size = st.st_size
            if attempt >= MAX_ATTEMPTS:
                try:
                    changed = self._source_changed(item, src)
                except _Vanished:
                    changed = True  # gone now: keep what it was while it was copied
                if changed:
                    # Keep what was read, with the times seen when this attempt started: the
                    # next run sees a different mtime on the source and copies it again.
                    item.size = size  # (what was kept, for the progress figures)
                    self.progress.total_bytes = self.plan.total_bytes
                    self.progress.kept_changing.append(item.rel or str(src))
                    log.warning("source file %s still changed during copy %d of %d: kept the %d bytes read "
                                "(not a consistent snapshot; the next run copies it again)",
                                src, attempt, MAX_ATTEMPTS, size)
                    break
            elif self._source_changed(item, src):
                log.warning("source file %s changed during the copy (copy %d of %d): copying it again",
                            src, attempt, MAX_ATTEMPTS)
                attempt += 1
                self.offset = 0
                self._tick()
                continue
            if size != item.size:
                raise CopyError(f"{final}: wrote {size} bytes, the source has {item.size}")
            break
        os.replace(part, final)
        _fsync_dir(final.parent)

    # --- metadata
    def _chown(self, target: _Meta, uid: int, gid: int, src: Path) -> bool:
        """Give ``target`` (a descriptor, or a symlink never followed) the source's owner and
        group; True if both were kept. As cp -a: a user who may not give the owner keeps the group
        if it may (a group it is in), silently; a privileged copy that cannot (NFS root squash,
        unmapped ids) warns once."""
        try:
            target.chown(uid, gid)
            return True
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EINVAL):
                raise
            if self._privileged and "owner" not in self._warned:
                self._warned.add("owner")
                log.warning("cannot give the copy of %s its owner and group (%d:%d): %s; owners are not kept "
                            "where refused (setuid and setgid bits cleared there; said once)", src, uid, gid,
                            e.strerror)
        try:
            target.chown(-1, gid)
        except OSError:
            pass
        return False

    def _xattr_refused(self, name: str, src: Path, e: OSError) -> None:
        if e.errno not in _XATTR_REFUSED:
            raise e
        if name not in self._warned:
            self._warned.add(name)
            log.warning("extended attribute %s of %s not kept (%s); not kept wherever refused (said once)",
                        name, src, e.strerror)

    def _sync_xattrs(self, src: Path, dst: _Meta, fresh: bool = False, names: list[str] | None = None) -> bool:
        """Give ``dst`` the source's extended attributes (ACLs are ``system.posix_acl_*``), and
        take from it the user attributes and ACLs the source has not (an ACL inherited from a
        DST folder's default ACL). ``dst`` is a descriptor, or a symlink not followed. Where refused: warned once
        per name. True if ``dst`` was changed. ``fresh``: a file just created where nothing is
        inherited (none to take away); ``names``: the source's, listed already (through the
        descriptor the data was read from): then no call at all when the source has none."""
        if names is None:
            try:
                names = os.listxattr(src, follow_symlinks=False)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTSUP, errno.EOPNOTSUPP):  # (gone: the change check says)
                    self._xattr_refused("(listing)", src, e)
                names = []
        have: list[str] = []
        if not fresh:
            try:
                have = dst.listxattr()
            except OSError as e:
                if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
        changed = False
        for name in have:
            if name not in names and name.startswith(_XATTR_MIRRORED):
                try:
                    dst.removexattr(name)
                    changed = True
                except OSError as e:
                    self._xattr_refused(name, src, e)
        for name in names:
            if name.startswith(_XATTR_SKIP):
                continue
            try:
                value = os.getxattr(src, name, follow_symlinks=False)
            except OSError as e:
                if e.errno not in (errno.ENODATA, errno.ENOENT):  # (removed since listed)
                    self._xattr_refused(name, src, e)
                continue
            try:
                if name in have and dst.getxattr(name) == value:
                    continue  # (a file done before: not written again)
                dst.setxattr(name, value)
                changed = True
            except OSError as e:
                self._xattr_refused(name, src, e)
        return changed

    def _inherits_acl(self, item: FileItem) -> bool:
        """Whether a file made in the DST folder of ``item`` inherits an ACL (the folder has a
        default ACL). Looked up once per folder (files come folder by folder; DST folders get the
        source's attributes only at the end)."""
        folder = item.rel.rpartition("/")[0]
        if self._acl_folder is None or self._acl_folder[0] != folder:
            try:
                os.getxattr(self.final_path(item).parent, "system.posix_acl_default")
                inherits = True
            except OSError as e:
                inherits = e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
            self._acl_folder = (folder, inherits)
        return self._acl_folder[1]

    def _align(self, path: Path, st: os.stat_result, src: Path, xattrs: bool) -> bool:
        """A file already complete in DST (``st``, as checked): give it the source's owner,
        attributes and mode (its mtime is the source's already), through a descriptor of that very
        file. False (warned) if the name is no longer that file (a symlink or another file swapped
        in since the check): nothing is set, the caller copies or links it again."""
        try:
            m = _Meta.open(path, folder=False)
        except _Changed:
            log.warning("%s changed in the destination while it was checked: made again", path)
            return False
        if (m.st.st_dev, m.st.st_ino) != (st.st_dev, st.st_ino):
            m.close()
            log.warning("%s changed in the destination while it was checked: made again", path)
            return False
        try:
            st = m.st
            s = self._src_stat
            kept = (st.st_uid, st.st_gid) == (s.st_uid, s.st_gid)
            chowned = not kept and self._chown(m, s.st_uid, s.st_gid, src)
            changed = xattrs and self._sync_xattrs(src, m)  # (an ACL written sets the mode's bits too)
            mode = stat.S_IMODE(s.st_mode) if kept or chowned else stat.S_IMODE(s.st_mode) & ~_OWNER_BITS_FILE
            if chowned or changed or stat.S_IMODE(st.st_mode) != mode:
                m.chmod(mode)
        finally:
            m.close()
        return True

    def _hard_link(self, item: FileItem, src: Path, final: Path, part: Path) -> bool:
        """A second name of a hard-linked source file: link it to the copy of a name before it
        (through the part file, renamed: never a half-made name), the nearest that still is the
        same source file and whose copy is of its current version (size and mtime). False if
        none is (changed, vanished, not copied) or the link is refused: this name is copied."""
        s = self._src_stat
        j = item.link
        while j >= 0:
            before = self.plan.files[j]
            j = before.link
            first = self.final_path(before)
            try:
                if not os.path.samestat(self._src_path(before).lstat(), s):
                    continue  # no longer the same file in the source
                d = first.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(d.st_mode) and (d.st_size, d.st_mtime_ns) == (s.st_size, s.st_mtime_ns):
                break  # (else its copy is not complete, or is of another version of the file)
        else:
            return False
        try:
            if os.path.samestat(final.lstat(), d):
                part.unlink(missing_ok=True)
                if self._align(final, d, src, xattrs=False):
                    return True  # linked before (a kill after the link, or a re-run)
        except FileNotFoundError:
            pass
        part.unlink(missing_ok=True)
        try:
            os.link(first, part, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EMLINK, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            if "hard links" not in self._warned:
                self._warned.add("hard links")
                log.warning("cannot link %s to %s (%s): hard-linked names are copied apart where refused",
                            final, first, e.strerror)
            return False
        os.replace(part, final)
        _fsync_dir(final.parent)
        return self._align(final, d, src, xattrs=False)  # (False: replaced since: copied apart)

    def _symlink(self, src: Path, link: Path, target: str, mtime_ns: int, uid: int, gid: int) -> None:
        """The symlink ``link`` -> ``target`` with the source's owner, attributes and mtime (made
        under the part name and renamed: a name in DST is never half made, never followed)."""
        try:
            st: os.stat_result | None = link.lstat()
        except FileNotFoundError:
            st = None
        path = link
        if st is None or not stat.S_ISLNK(st.st_mode) or os.readlink(link) != target:
            if st is not None and stat.S_ISDIR(st.st_mode):
                link.unlink()  # (refused: a folder in DST where the source has a symlink fails the copy)
            path = part_path(link)
            path.unlink(missing_ok=True)
            os.symlink(target, path)
            st = path.lstat()
        try:
            m = _Meta.link(path, st)  # (the symlink itself: never followed)
            if (st.st_uid, st.st_gid) != (uid, gid):
                self._chown(m, uid, gid, src)
            self._sync_xattrs(src, m)
            if st.st_mtime_ns != mtime_ns:
                m.utime(mtime_ns)
            if path != link:
                os.replace(path, link)
        except BaseException:
            if path != link:
                path.unlink(missing_ok=True)
            raise

    # --- data
    def _open_part(self, part: Path, flags: int) -> int:
        """The part file, for writing: made by this call (``_part_created``) or the one a stop, a
        kill or an earlier attempt left, never through a symlink nor into a file with other
        names (a symlink or a hard link made under the part name before a kill, when the name
        was one: not this file's data, removed; the copy of the file starts again)."""
        flags |= os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(part, flags | os.O_CREAT | os.O_EXCL, 0o600)
            self._part_created = True  # (no attributes but inherited ones)
            return fd
        except FileExistsError:
            pass
        except PermissionError:
            if not os.path.lexists(part):
                raise  # (a folder it may not write in; else a read-only part file, below)
        # One there already: opened without following it nor blocking (a FIFO), checked and made
        # 0o600 through the descriptor (a name swapped after a check is never followed).
        fd = -1
        try:
            try:
                fd = os.open(part, flags | os.O_CREAT | os.O_NONBLOCK, 0o600)
            except PermissionError:
                # Read-only (given the source's mode already: a second attempt, a resume, as a user).
                m = _Meta.open(part, folder=False)
                try:
                    if m.st.st_nlink > 1:
                        raise _Changed(f"{part} has other names")
                    m.chmod(0o600)
                finally:
                    m.close()
                fd = os.open(part, flags | os.O_NONBLOCK)
            ps = os.fstat(fd)
        except (_Changed, OSError) as e:
            if fd >= 0:
                os.close(fd)
            if isinstance(e, OSError) and e.errno not in (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.ETXTBSY):
                raise
            ps = None
        if ps is None or not stat.S_ISREG(ps.st_mode) or ps.st_nlink > 1:
            if ps is not None:
                os.close(fd)
            part.unlink()
            self.offset = 0
            self._tick()
            return self._open_part(part, flags)
        try:
            if stat.S_IMODE(ps.st_mode) != 0o600:
                os.fchmod(fd, 0o600)  # given the source's mode already (a second attempt, a resume)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        self._part_created = False
        return fd

    def _open(self, src: Path, part: Path) -> tuple[int, int]:
        flags_in = os.O_RDONLY
        if self.io_effective == "direct":
            try:
                sfd = _open_source(src, flags_in | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.io_effective = "fadvise"
            else:
                try:
                    return sfd, self._open_part(part, os.O_DIRECT)
                except OSError as e:
                    os.close(sfd)
                    if e.errno != errno.EINVAL:
                        raise
                    self.io_effective = "fadvise"
        sfd = _open_source(src, flags_in)
        try:
            return sfd, self._open_part(part, 0)
        except BaseException:
            os.close(sfd)
            raise

    def _buffer(self) -> mmap.mmap:
        if self._buf is None:
            self._buf = mmap.mmap(-1, self.chunk_size)  # page-aligned, as O_DIRECT needs
        return self._buf

    def _copy_data(self, item: FileItem, src: Path, part: Path, final: Path) -> int:
        """Copy the data to the part file; returns its descriptor, open (the caller sets its
        metadata through it and closes it)."""
        part.parent.mkdir(parents=True, exist_ok=True)
        self._src_xattrs = None
        sfd, dfd = self._open(src, part)
        direct = self.io_effective == "direct"
        fadvise = self.io_effective in ("fadvise", "direct")
        buf = self._buffer()
        view = memoryview(buf)
        reading = False
        ok = False
        # Fewer blocks than bytes: holes (or a filesystem that packs small files): the data is
        # found with SEEK_DATA/SEEK_HOLE and only it is written; a hole in the source is a hole
        # in the part file (its size set past it by ftruncate, so a resume finds it that long).
        sparse = self._src_stat.st_blocks * 512 < item.size
        try:
            os.ftruncate(dfd, self.offset)
            if fadvise:
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            last_checkpoint = self.offset
            while self.offset < item.size:
                length = self.chunk_size
                if sparse:
                    reading = True
                    data, hole = _next_data(sfd, self.offset, item.size)
                    reading = False
                    if data is None:
                        sparse = False  # (SEEK_DATA refused: copied dense)
                    elif data > self.offset:
                        os.ftruncate(dfd, data)  # the hole: skipped, not written
                        self.offset = data
                        self._tick()
                        continue
                    else:  # data from here to `hole`: read that much (whole blocks, for O_DIRECT)
                        length = min(length, -(-(hole - self.offset) // ALIGN) * ALIGN)
                self.control.wait_turn(min(length, item.size - self.offset))
                reading = True
                if length == self.chunk_size:
                    n = os.preadv(sfd, [buf], self.offset)
                else:
                    with view[:length] as some:
                        n = os.preadv(sfd, [some], self.offset)
                reading = False
                if n == 0:
                    break  # the source shrank: caught by the size check
                # Never past the size this attempt copies (a growing file: see _copy_file).
                n = min(n, item.size - self.offset)
                if direct and n % ALIGN:
                    padded = (n + ALIGN - 1) // ALIGN * ALIGN
                    buf[n:padded] = bytes(padded - n)
                    _write_all(dfd, view, padded, self.offset)
                    os.ftruncate(dfd, self.offset + n)
                else:
                    _write_all(dfd, view, n, self.offset)
                if fadvise:
                    os.posix_fadvise(sfd, self.offset, n, os.POSIX_FADV_DONTNEED)
                self.offset += n
                self.progress.copied_bytes += n
                self._tick()
                if self.offset - last_checkpoint >= self.checkpoint_bytes:
                    if self.io_effective != "buffered":
                        os.fdatasync(dfd)
                        if fadvise:
                            os.posix_fadvise(dfd, 0, self.offset, os.POSIX_FADV_DONTNEED)
                    self.checkpoint()
                    last_checkpoint = self.offset
                if self.on_chunk is not None:
                    self.on_chunk(self)
            os.fsync(dfd)
            try:  # (through the descriptor: no path to resolve again, the file the data came from)
                self._src_xattrs = os.listxattr(sfd)
            except OSError:
                pass  # (listed by its name after)
            if fadvise:
                os.posix_fadvise(dfd, 0, 0, os.POSIX_FADV_DONTNEED)
            ok = True
            return dfd
        except Stopped:
            os.fsync(dfd)
            self.checkpoint()
            raise
        except OSError as e:
            if e.filename is not None:
                raise
            # os.pwrite/fsync/preadv name no file: say which one, and why (ENOSPC, EIO, ...).
            what = f"cannot read {src}" if reading else f"cannot write {final}"
            raise CopyError(f"{what}: {e.strerror}") from None
        finally:
            view.release()
            os.close(sfd)
            if not ok:
                os.close(dfd)


def _open_source(src: Path, flags: int) -> int:
    try:
        return os.open(src, flags)
    except FileNotFoundError as e:
        raise _Vanished(e.strerror) from e
    except PermissionError as e:
        raise _Unreadable(e.strerror) from e


def _next_data(fd: int, offset: int, size: int) -> tuple[int | None, int]:
    """The data at or after ``offset`` (a multiple of ALIGN): ``(start, end)``, start rounded
    down to ALIGN (never below ``offset``); ``(size, size)`` if only a hole is left; ``(None, size)``
    if the filesystem cannot tell."""
    try:
        data = os.lseek(fd, offset, os.SEEK_DATA)
        hole = os.lseek(fd, data, os.SEEK_HOLE)
    except OSError as e:
        if e.errno == errno.ENXIO:  # no data after offset (or the file shrank: the checks say)
            return size, size
        if e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None, size
        raise
    data = min(size, max(offset, data // ALIGN * ALIGN))
    return data, max(data + 1, min(size, hole))


def _write_all(fd: int, view: memoryview, length: int, offset: int) -> None:
    """Write ``view[:length]`` at ``offset``. Every slice is released, even on an error, so a
    traceback never pins the copy buffer (closing it would raise BufferError)."""
    done = 0
    while done < length:
        with view[done:length] as data:
            n = os.pwrite(fd, data, offset + done)
        done += n


def _drop_v1_part(data: dict[str, Any]) -> None:
    """A journal of an older promreflex: remove the part file (``.<name>.promreflex-part``) it
    was writing, so it is not left in DST (the new plan copies that file again)."""
    try:
        plan, i = data["plan"], int(data["next"])
        dst = Path(plan["dst"])
        final = dst if plan["single"] else dst / plan["files"][i][0]
        (final.parent / f".{final.name}.promreflex-part").unlink(missing_ok=True)
    except (KeyError, TypeError, ValueError, IndexError, OSError):
        pass


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return None  # a torn or foreign file: as if there were none


def _write_json(path: Path, data: Any) -> None:
    fsutil.atomic_write_text(path, json.dumps(data, separators=(",", ":")) + "\n")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- metrics
class CopyCollector(Collector):
    """The copy's progress and control state as fresh metric families at every scrape."""

    def __init__(self, copier_ref: Callable[[], Copier | None], control: Control, site: str, copy_id: str,
                 control_requests: dict[tuple[str, str], int]):
        self.copier_ref = copier_ref
        self.control = control
        self.site = site
        self.copy_id = copy_id
        self.control_requests = control_requests
        self.started = time.time()

    def collect(self) -> Iterator[Any]:
        copier = self.copier_ref()
        ctl = self.control.snapshot()
        p = copier.progress if copier else Progress(state="failed")
        state = p.state if p.state in ("done", "failed") else ctl["mode"]
        s = [self.site]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["site"])
            g.add_metric(s, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["site"])
            c.add_metric(s, value)
            return c

        yield gauge("promreflex_copy_done_bytes", "Bytes of the copy done, earlier runs of a resumed copy included.", p.done_bytes)
        yield gauge("promreflex_copy_size_bytes", "Bytes the whole copy has to write.", p.total_bytes)
        yield gauge("promreflex_copy_done_files", "Files of the copy done.", p.done_files)
        yield gauge("promreflex_copy_planned_files", "Files the copy has to write.", p.total_files)
        st = GaugeMetricFamily("promreflex_copy_state", "1 for the copy's current state.", labels=["site", "state"])
        for name in STATES:
            st.add_metric([self.site, name], 1.0 if name == state else 0.0)
        yield st
        yield counter("promreflex_copy_copied_bytes", "Bytes written by this copier process.", p.copied_bytes)
        yield counter("promreflex_copy_paused_seconds", "Seconds this copier process spent paused.", ctl["paused_seconds"])
        yield counter("promreflex_copy_throttled_seconds", "Seconds this copier process spent throttled.", ctl["throttled_seconds"])
        yield counter("promreflex_copy_pauses", "Pauses this copier process received.", ctl["pauses"])
        yield counter("promreflex_copy_lease_expiries", "Pauses or throttles that ended because their lease was not renewed.",
                      ctl["lease_expiries"])
        yield counter("promreflex_copy_source_changes", "Source files that changed during the copy and were copied again.",
                      p.source_changes)
        yield gauge("promreflex_copy_rate_limit_bytes_per_second", "The rate cap in force (0: none).", ctl["rate"])
        yield gauge("promreflex_copy_throttle_share", "The share of its own speed the copy may use now (1 free, 0 paused).",
                    ctl["share"])
        yield counter("promreflex_copy_throttle_wait_seconds",
                      "Seconds this copier process waited to keep to a share of its speed.", ctl["share_wait_seconds"])
        yield gauge("promreflex_copy_start_time_seconds", "Unix time this copier process started.", self.started)
        req = CounterMetricFamily("promreflex_copy_control_requests", "Control requests by command and result.",
                                  labels=["site", "command", "result"])
        for (command, result), n in sorted(self.control_requests.items()):
            req.add_metric([self.site, command, result], n)
        yield req
        info = GaugeMetricFamily("promreflex_copy_info", "The copy's id and I/O mode.", labels=["site", "id", "io"])
        info.add_metric([self.site, self.copy_id, copier.io_effective if copier else ""], 1)
        yield info
