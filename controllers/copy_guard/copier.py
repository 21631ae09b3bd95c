"""``promreflex copy SRC DST``: a resumable copier that a controller can pause, resume and
throttle at any chunk, and that continues where it stopped after being stopped or killed.

How it stays correct across kills:
- The plan (every file, directory and symlink with sizes and mtimes) is taken once and kept in a
  journal beside the destination (``.<dst name>.promreflex-copy.json``, written atomically).
  Files are copied in plan order; the journal says which file is next and how many of its bytes
  are safely in its part file.
- A file is written to a hidden part file (``.<name>.promreflex-part``) in its destination
  folder, fsync'd, its size checked against the source, given the source's mode and mtime, and
  only then renamed to its name: a destination file under its real name is always complete.
- On restart the part file is cut back to the journaled offset and the copy continues there; a
  file whose destination already has the source's size and mtime is done (also covers a kill
  between the rename and the journal update). A source file that changed since the plan is
  copied again from the start (counted).

Pausing and throttling: before every chunk (default 1 MiB) the copier asks its
:class:`Control`. A pause holds until resumed or until its *lease* runs out (the controller
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
import logging
import math
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from promreflex.fsutil import atomic_write_json, read_json

IO_MODES = ("fadvise", "direct", "buffered")
STATES = ("running", "paused", "throttled", "done", "failed")
COMMANDS = ("pause", "resume", "throttle")
ALIGN = 4096
JOURNAL_VERSION = 1

log = logging.getLogger("promreflex.copy")


class CopyError(Exception):
    """The copy cannot go on (bad source, no space, ...); the message says why."""


class Stopped(Exception):
    """The copy was asked to stop; it is resumable from the journal."""


def journal_path(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.promreflex-copy.json"


def part_path(final: Path) -> Path:
    return final.parent / f".{final.name}.promreflex-part"


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
    skipped: list[str] = field(default_factory=list)  # special files (sockets, fifos, devices)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "single": self.single,
                "files": [[f.rel, f.size, f.mtime_ns, f.mode] for f in self.files],
                "dirs": [list(d) for d in self.dirs], "links": [list(x) for x in self.links],
                "skipped": self.skipped}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(data["src"], data["dst"], bool(data["single"]),
                   [FileItem(str(r), int(s), int(m), int(md)) for r, s, m, md in data["files"]],
                   [(str(r), int(md), int(m)) for r, md, m in data["dirs"]],
                   [(str(r), str(t)) for r, t in data["links"]], list(data.get("skipped", [])))


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
    files, dirs, links, skipped = [], [("", stat.S_IMODE(st.st_mode), st.st_mtime_ns)], [], []
    for root, dirnames, filenames in os.walk(src, followlinks=False):
        dirnames.sort()
        base = Path(root).relative_to(src)
        for name in sorted(dirnames) + sorted(filenames):
            path = Path(root) / name
            rel = str(base / name) if str(base) != "." else name
            try:
                s = path.lstat()
            except OSError:
                skipped.append(rel)
                continue
            if stat.S_ISLNK(s.st_mode):
                links.append((rel, os.readlink(path)))
            elif stat.S_ISDIR(s.st_mode):
                dirs.append((rel, stat.S_IMODE(s.st_mode), s.st_mtime_ns))
            elif stat.S_ISREG(s.st_mode):
                files.append(FileItem(rel, s.st_size, s.st_mtime_ns, stat.S_IMODE(s.st_mode)))
            else:
                skipped.append(rel)
    # os.walk lists a symlink to a directory among dirnames without descending: handled above.
    return Plan(str(src), str(dst), False, files, dirs, links, skipped)


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


class Copier:
    def __init__(self, src: str | Path, dst: str | Path, *, control: Control | None = None,
                 chunk_size: int = 1 << 20, io: str = "fadvise", checkpoint_bytes: int = 16 << 20,
                 journal: str | Path | None = None, fresh: bool = False,
                 on_chunk: Callable[[Copier], None] | None = None):
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
        self.journal = Path(journal) if journal else journal_path(self.dst)
        self.on_chunk = on_chunk
        self.progress = Progress()
        self._buf: mmap.mmap | None = None
        self.plan, self.next_index, self.offset = self._load_or_plan(fresh)
        self.progress.total_bytes = self.plan.total_bytes
        self.progress.total_files = len(self.plan.files)
        self._done_before = sum(f.size for f in self.plan.files[: self.next_index])
        self._tick()
        self.progress.resumed_from = self.progress.done_bytes

    def _tick(self) -> None:
        self.progress.done_bytes = self._done_before + self.offset
        self.progress.done_files = self.next_index

    # --- journal
    def _load_or_plan(self, fresh: bool) -> tuple[Plan, int, int]:
        data = None if fresh else read_json(self.journal, default=None)
        if isinstance(data, dict) and data.get("version") == JOURNAL_VERSION:
            try:
                plan = Plan.from_json(data["plan"])
                if plan.src == str(self.src) and plan.dst == str(self.dst):
                    return plan, int(data["next"]), int(data["offset"])
            except (KeyError, TypeError, ValueError):
                pass  # an unreadable journal: plan again (done files are skipped by size+mtime)
        plan = make_plan(self.src, self.dst)
        self._save(plan, 0, 0)
        return plan, 0, 0

    def _save(self, plan: Plan, next_index: int, offset: int) -> None:
        atomic_write_json(self.journal, {"version": JOURNAL_VERSION, "plan": plan.to_json(),
                                         "next": next_index, "offset": offset, "updated": time.time()})

    def checkpoint(self) -> None:
        self._save(self.plan, self.next_index, self.offset)

    # --- paths
    def final_path(self, item: FileItem) -> Path:
        return self.dst if self.plan.single else self.dst / item.rel

    # --- run
    def run(self) -> Progress:
        """Copy until done; raises Stopped (resumable) or CopyError (state failed)."""
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
                self._buf.close()
                self._buf = None
        self.progress.state = "done"
        return self.progress

    def _run(self) -> None:
        if not self.plan.single:
            for rel, _, _ in self.plan.dirs:
                (self.dst / rel).mkdir(parents=True, exist_ok=True)
        else:
            self.dst.parent.mkdir(parents=True, exist_ok=True)
        while self.next_index < len(self.plan.files):
            item = self.plan.files[self.next_index]
            self._copy_file(item)
            self._done_before += item.size
            self.next_index += 1
            self.offset = 0
            self._tick()
            self.checkpoint()
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
        self.journal.unlink(missing_ok=True)

    def _source_changed(self, item: FileItem, src: Path) -> bool:
        try:
            s = src.stat()
        except OSError as e:
            raise CopyError(f"source file {src} vanished: {e.strerror}") from e
        if (s.st_size, s.st_mtime_ns) != (item.size, item.mtime_ns):
            item.size, item.mtime_ns, item.mode = s.st_size, s.st_mtime_ns, stat.S_IMODE(s.st_mode)
            self.progress.source_changes += 1
            self.progress.total_bytes = self.plan.total_bytes
            return True
        return False

    def _copy_file(self, item: FileItem) -> None:
        src = self.src if self.plan.single else self.src / item.rel
        final = self.final_path(item)
        part = part_path(final)
        if self._source_changed(item, src):
            self.offset = 0
        try:
            f = final.stat()
            if not part.exists() and (f.st_size, f.st_mtime_ns) == (item.size, item.mtime_ns):
                return  # done before (a kill between the rename and the journal, or a re-run)
        except FileNotFoundError:
            pass
        if self.offset and (not part.exists() or part.stat().st_size < self.offset):
            self.offset = 0  # the part file is shorter than the journal says: start this file again
        self._tick()
        while True:
            self._copy_data(item, src, part)
            os.chmod(part, item.mode)
            os.utime(part, ns=(item.mtime_ns, item.mtime_ns))
            size = part.stat().st_size
            if self._source_changed(item, src):
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
                sfd = os.open(src, flags_in | os.O_DIRECT)
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
        return os.open(src, flags_in), os.open(part, flags_out, 0o600)

    def _buffer(self) -> mmap.mmap:
        if self._buf is None:
            self._buf = mmap.mmap(-1, self.chunk_size)  # page-aligned, as O_DIRECT needs
        return self._buf

    def _copy_data(self, item: FileItem, src: Path, part: Path) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        sfd, dfd = self._open(src, part)
        direct = self.io_effective == "direct"
        fadvise = self.io_effective in ("fadvise", "direct")
        buf = self._buffer()
        view = memoryview(buf)
        try:
            os.ftruncate(dfd, self.offset)
            if fadvise:
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            last_checkpoint = self.offset
            while self.offset < item.size:
                self.control.wait_turn(min(self.chunk_size, item.size - self.offset))
                n = os.preadv(sfd, [buf], self.offset)
                if n == 0:
                    break  # the source shrank: caught by the size check
                if direct and n % ALIGN:
                    padded = (n + ALIGN - 1) // ALIGN * ALIGN
                    buf[n:padded] = bytes(padded - n)
                    _write_all(dfd, view[:padded], self.offset)
                    os.ftruncate(dfd, self.offset + n)
                else:
                    _write_all(dfd, view[:n], self.offset)
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
        finally:
            view.release()
            os.close(sfd)
            os.close(dfd)


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


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
