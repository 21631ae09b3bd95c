"""``promreflex copy SRC DST``: a resumable copier that a controller can pause, resume and
throttle at any chunk, and that continues where it stopped after being stopped or killed.

How it stays correct across kills:
- The plan (every file, directory and symlink with sizes and mtimes) is taken once and written
  once, atomically, beside the destination (``.<dst name>.promreflex-copy.json``). Where the copy
  is (the next file, how many of its bytes are safely in its part file) is a separate small file
  (``.<dst name>.promreflex-copy.progress.json``, a few dozen bytes, fsync'd and renamed): at
  each data checkpoint (every ``checkpoint_bytes``, after fdatasync) and, between files, every
  ``checkpoint_files`` files or ``checkpoint_seconds``, not after each file. So the journal
  costs O(1) per file whatever the size of the tree. A resume after a kill starts from the last
  checkpoint: the files completed since are only checked (size and mtime), not copied again.
- A file is written to a hidden part file (``.<hash of its name>.promreflex-part``, fixed length
  so a 255-byte name has one too) in its destination folder, fsync'd, its size checked against
  the source, given the source's mode and mtime, and only then renamed to its name: a
  destination file under its real name is always complete. A source file whose name has that
  form (a leftover of an interrupted copy) is not copied (listed in ``plan.skipped``).
- On restart the part file is cut back to the journaled offset and the copy continues there; a
  file whose destination already has the source's size and mtime is done (also covers a kill
  between the rename and the journal update). A source file that changed since the plan is
  copied again from the start (counted).

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
- Not kept, unlike ``cp -a``: owner and group, xattrs and ACLs, hard links (each name is a
  separate copy), holes (a sparse file is written dense), symlink mtimes; a file already in DST
  with the source's size and mtime is not touched (its mode is not updated either).

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
JOURNAL_VERSION = 2
_SKIP_LISTS = ("unreadable", "vanished", "kept_changing")  # Progress lists kept in the progress file
MAX_ATTEMPTS = 3  # copies of a file that keeps changing under the copy before it is kept as is
PART_SUFFIX = ".promreflex-part"
_PART_RE = re.compile(r"^\.[0-9a-f]{32}\.promreflex-part$")

log = logging.getLogger("promreflex.copy")


class CopyError(Exception):
    """The copy cannot go on (bad source, no space, ...); the message says why."""


class JournalError(CopyError):
    """The journal beside the destination cannot be read or written."""


class Stopped(Exception):
    """The copy was asked to stop; it is resumable from the journal."""


class _Vanished(Exception):
    """The source file is gone: skip it."""


class _Unreadable(Exception):
    """The source file cannot be opened (permissions): skip it, report it."""


def journal_path(dst: Path) -> Path:
    """The plan, written once when the copy starts."""
    return dst.parent / f".{dst.name}.promreflex-copy.json"


def progress_path(journal: Path) -> Path:
    """Where the copy is (next file, bytes of it in its part file): a few dozen bytes."""
    return journal.with_name(journal.name.removesuffix(".json") + ".progress.json")


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
    mode: int


@dataclass
class Plan:
    src: str
    dst: str
    single: bool
    files: list[FileItem]
    dirs: list[tuple[str, int, int]]  # rel, mode, mtime_ns
    links: list[tuple[str, str]]  # rel, target
    skipped: list[str] = field(default_factory=list)  # special files (sockets, fifos, devices), part files
    unreadable: list[str] = field(default_factory=list)  # "rel: why": folders not listed, entries not read

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "single": self.single,
                "files": [[f.rel, f.size, f.mtime_ns, f.mode] for f in self.files],
                "dirs": [list(d) for d in self.dirs], "links": [list(x) for x in self.links],
                "skipped": self.skipped, "unreadable": self.unreadable}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(data["src"], data["dst"], bool(data["single"]),
                   [FileItem(str(r), int(s), int(m), int(md)) for r, s, m, md in data["files"]],
                   [(str(r), int(md), int(m)) for r, md, m in data["dirs"]],
                   [(str(r), str(t)) for r, t in data["links"]], list(data.get("skipped", [])),
                   list(data.get("unreadable", [])))


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
    files, dirs, links, skipped, unreadable = [], [("", stat.S_IMODE(st.st_mode), st.st_mtime_ns)], [], [], []

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
                    links.append((rel, os.readlink(path)))
                except OSError as e:
                    unreadable.append(f"{rel}: {e.strerror}")
            elif stat.S_ISDIR(s.st_mode):
                dirs.append((rel, stat.S_IMODE(s.st_mode), s.st_mtime_ns))
            elif stat.S_ISREG(s.st_mode) and is_part_name(name):
                skipped.append(rel)  # a part file of an interrupted copy: its name is the copier's
            elif stat.S_ISREG(s.st_mode):
                files.append(FileItem(rel, s.st_size, s.st_mtime_ns, stat.S_IMODE(s.st_mode)))
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
        self.next_index = self.offset = 0
        self.plan, self.next_index, self.offset = self._load_or_plan(fresh)
        self.progress.total_bytes = self.plan.total_bytes
        self.progress.total_files = len(self.plan.files)
        self.progress.unreadable = list(self.plan.unreadable)
        # Files skipped before a stop or kill, kept in the progress file (a resumed run does not
        # pass them again: it must still report them, and exit 23 or 24).
        for k, v in self._skipped_before.items():
            getattr(self.progress, k).extend(x for x in v if x not in getattr(self.progress, k))
        self._done_before = sum(f.size for f in self.plan.files[: self.next_index])
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
        elif isinstance(data, dict) and data.get("version") == 1:
            _drop_v1_part(data)
        plan = make_plan(self.src, self.dst)
        self._journal_id = secrets.token_hex(8)
        self.progress_file.unlink(missing_ok=True)
        _write_json(self.journal, {"version": JOURNAL_VERSION, "id": self._journal_id, "plan": plan.to_json(),
                                   "created": time.time()})
        self.checkpoint()
        return plan, 0, 0

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
            self._run()
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
            for rel, _, _ in self.plan.dirs:  # (parents first)
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
                self._done_before += item.size
                self.next_index += 1
                self.offset = 0
                self._tick()
                self._maybe_checkpoint()
            self.control.hold()
        except Stopped:
            self.checkpoint()
            raise
        if not self.plan.single:
            for rel, target in self.plan.links:
                link = self.dst / rel
                if link.is_symlink() and os.readlink(link) == target:
                    continue
                if link.is_symlink() or link.exists():
                    link.unlink()
                os.symlink(target, link)
            for rel, mode, mtime_ns in reversed(self.plan.dirs):  # deepest last-listed first
                d = self.dst / rel
                os.chmod(d, mode)
                os.utime(d, ns=(mtime_ns, mtime_ns))
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
        try:
            f = final.lstat()  # (a symlink in DST at this name is not the copy: os.replace swaps it)
            if (stat.S_ISREG(f.st_mode) and not part.exists()
                    and (f.st_size, f.st_mtime_ns) == (item.size, item.mtime_ns)):
                return  # done before (a kill between the rename and the journal, or a re-run)
        except FileNotFoundError:
            pass
        if self.offset and (not part.exists() or part.stat().st_size < self.offset):
            self.offset = 0  # the part file is shorter than the journal says: start this file again
        self._tick()
        attempt = 1
        while True:
            self._copy_data(item, src, part, final)
            os.chmod(part, item.mode)
            os.utime(part, ns=(item.mtime_ns, item.mtime_ns))
            size = part.stat().st_size
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

    def _open(self, src: Path, part: Path) -> tuple[int, int]:
        flags_in, flags_out = os.O_RDONLY, os.O_WRONLY | os.O_CREAT
        if self.io_effective == "direct":
            try:
                sfd = _open_source(src, flags_in | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.io_effective = "fadvise"
            else:
                try:
                    return sfd, os.open(part, flags_out | os.O_DIRECT, 0o600)
                except OSError as e:
                    os.close(sfd)
                    if e.errno != errno.EINVAL:
                        raise
                    self.io_effective = "fadvise"
        sfd = _open_source(src, flags_in)
        try:
            return sfd, os.open(part, flags_out, 0o600)
        except BaseException:
            os.close(sfd)
            raise

    def _buffer(self) -> mmap.mmap:
        if self._buf is None:
            self._buf = mmap.mmap(-1, self.chunk_size)  # page-aligned, as O_DIRECT needs
        return self._buf

    def _copy_data(self, item: FileItem, src: Path, part: Path, final: Path) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        try:  # a part file already given a read-only source's mode (a second attempt, a resume)
            os.chmod(part, 0o600)
        except FileNotFoundError:
            pass
        sfd, dfd = self._open(src, part)
        direct = self.io_effective == "direct"
        fadvise = self.io_effective in ("fadvise", "direct")
        buf = self._buffer()
        view = memoryview(buf)
        reading = False
        try:
            os.ftruncate(dfd, self.offset)
            if fadvise:
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            last_checkpoint = self.offset
            while self.offset < item.size:
                self.control.wait_turn(min(self.chunk_size, item.size - self.offset))
                reading = True
                n = os.preadv(sfd, [buf], self.offset)
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
            if fadvise:
                os.posix_fadvise(dfd, 0, 0, os.POSIX_FADV_DONTNEED)
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
            os.close(dfd)


def _open_source(src: Path, flags: int) -> int:
    try:
        return os.open(src, flags)
    except FileNotFoundError as e:
        raise _Vanished(e.strerror) from e
    except PermissionError as e:
        raise _Unreadable(e.strerror) from e


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
    fd = os.open(path, os.O_RDONLY)
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
