"""Follow a growing log file the way ``tail -F`` should: across rotations, truncations and restarts.

Every log-reading exporter (access logs, Envoy logs, ...) needs the same hard part: read only
*complete* new lines, never lose the lines written just before a rotation, never count a line
twice after a ``copytruncate`` or a restart, and keep memory bounded when a writer emits a
runaway line. :class:`LogFollower` does that with plain ``os`` calls and no threads, so a caller
decides when to poll (:func:`follow` is a small asyncio loop for the common case).

A file is recognised by its *content*, not its name or inode: the fingerprint of what was read
(a short BLAKE2b hash of the offset and of the first and last KiB before it). After each poll
the follower remembers the fingerprint at the end of the last complete line it returned.

How each situation is recognised, on every :meth:`LogFollower.poll`:

* **growth**: read from our byte position to EOF (at most ``max_poll_bytes`` per poll, so a
  huge backlog cannot blow up one poll's memory); the bytes after the last newline stay
  buffered until their newline arrives.
* **rename rotation** (logrotate ``create``, ``mv`` + reopen, with or without an immediate
  ``gzip``): ``stat(path)`` names another inode than the one we hold open. The old handle (still
  readable through our descriptor, even when gzip already unlinked it) is read to its end first,
  then kept *draining* until it has been quiet for a poll and ``drain_grace`` seconds (5 minutes;
  1 minute once it is deleted; at most :data:`MAX_DRAINING` files), because nginx keeps writing
  to the old inode until it gets ``USR1``, and an old worker of a ``reload`` until its last
  request ends. The new file is read from 0 meanwhile.
* **two rotations between polls** (a writer that rotates faster than we poll, or a reader that
  was stopped, e.g. by ``SIGSTOP`` or a starved CPU): the path names a file two rotations newer
  than the one held, and the file between was rotated away, maybe gzipped, without a line read
  from it. The held file is located among the rotated siblings (by inode, else by content) and
  every sibling rotated after it is read from 0 before the new file. A sibling is read that way
  only if it is ordered after the held file and was written after the held file's last write
  (a file compressed later with a fresh timestamp is not taken for a new one).
* **copytruncate**: the held file is now shorter than our position, or the bytes before our
  position changed (truncated and refilled before we polled, even with the same first bytes).
  The lines written between our last read and the truncation are in the copy: the newest
  rotated sibling (plain or ``.gz``) whose content matches our fingerprint is read from our
  offset to its end, then the truncated file from 0. No copy found: a warning, counted in
  ``stats.unrecovered``.
* **missing file**: polled until it appears; a file that appears later is read from 0,
  whatever ``from_start`` says (all of it is new).
* **restart**: with ``state_file``, after each poll the (inode, offset, fingerprint) of every
  file still being read is written atomically (temp file + ``os.replace``). The offset is the
  end of the last *complete* line returned, so a partial line is re-read, not lost. On start,
  each saved file is looked for where rotation may have put it: the path itself (same inode,
  same content), else any rotated sibling, plain or gzip, whose content matches (a rename, a
  rename + gzip, a copytruncate, an inode reused by the new file). It is read from the saved
  offset, then every sibling rotated after it (two rotations while down) from 0, then the
  current file from 0.
* **first start without state**: ``from_start=False`` starts at the end of an existing file
  and counts what it skipped in ``stats.skipped_bytes``, and :meth:`resume_info` says so.

Rotated siblings are the files beside the log named ``<name>.N``, ``<name>-20240101`` (digits
and ``._-`` after the name, optionally ``.gz``), or those a ``rotated`` glob names; they are
ordered oldest first by their number (``.2`` before ``.1``), else by modification time.
:func:`read_lines` reads one such file (plain or gzip) for a one-shot backfill, and
:func:`check_text` refuses what is not a text log (other compressions, binary data).
"""

from __future__ import annotations

import asyncio
import collections
import glob
import gzip
import hashlib
import json
import logging
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import BinaryIO

from promreflex.errors import UserError

log = logging.getLogger(__name__)

STATE_VERSION = 1
_FINGERPRINT_WINDOW = 1024  # bytes hashed at the start of the file and just before the offset
_READ_CHUNK = 256 * 1024
_SNIFF_BYTES = 64 * 1024
_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"PK\x03\x04", "zip"),
)
_COMPRESSED_EXT = r"\.(?:gz|bz2|xz|zst|lz4|zip)"
_ROTATED_SUFFIX = re.compile(rf"[._-][0-9][0-9._-]*?(?:{_COMPRESSED_EXT})?")
# A rotation number: at most 5 digits (``.20261125`` is logrotate's ``dateformat .%Y%m%d``, a
# date: ordered by time like ``-20261125``, never by number, which would invert it).
_NUMBERED_SUFFIX = re.compile(r"\.([0-9]{1,5})(?:\.[a-z0-9]+)?")
_COMPRESSED_SUFFIX = re.compile(_COMPRESSED_EXT + "$")


class NotTextError(UserError):
    """A file given as a text log is compressed (other than gzip where gzip is read) or binary."""


#: A rotated file that is deleted is closed after this long quiet (``drain_grace`` otherwise).
DELETED_GRACE_S = 60.0
#: At most this many rotated files are kept open draining (the oldest quiet ones are closed).
MAX_DRAINING = 16


@dataclass
class FollowStats:
    """Counters a caller can export (deltas between polls are what changed in that poll)."""

    lines: int = 0  # complete lines returned
    bytes: int = 0  # bytes consumed from files (including dropped oversized lines)
    rotations: int = 0  # rotated files read (while running or across a restart)
    truncations: int = 0  # copytruncate-style truncations noticed
    oversized_lines: int = 0  # lines longer than max_line_bytes, dropped
    open_errors: int = 0  # failed attempts to open an existing path (permissions, not a file)
    skipped_bytes: int = 0  # bytes already in the file at a first start at its end (from_start=False)
    unrecovered: int = 0  # truncations or restarts where what was written after our offset was not found
    state_write_errors: int = 0  # polls whose state could not be saved (a full or read-only state directory)

    def snapshot(self) -> FollowStats:
        """A copy to diff against later (``follower.stats`` itself keeps changing)."""
        return replace(self)

    def since(self, earlier: FollowStats) -> FollowStats:
        """What was counted after ``earlier`` was taken: how a caller exports per-poll deltas."""
        return FollowStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})


@dataclass
class _Handle:
    """One open file being read (a descriptor, or a gzip stream read once from start to end).

    ``line_start`` is where the current incomplete line begins; (``fp_offset``, ``fp``) is what
    identifies the file's content: the fingerprint of its first ``fp_offset`` bytes.
    """

    fd: int
    ino: int
    dev: int
    name: str  # path it was opened by (for messages only)
    stream: BinaryIO | None = None  # gzip-compressed rotated file, read sequentially
    pos: int = 0  # next byte to read
    line_start: int = 0  # file offset of buf[0]; what we persist
    buf: bytearray = field(default_factory=bytearray)
    discarding: bool = False  # inside an oversized line: drop bytes until the next newline
    fp_offset: int = 0
    fp: str = ""
    quiet_polls: int = 0  # for draining handles: polls in a row that read nothing
    last_data: float = field(default_factory=time.monotonic)
    eof: bool = False  # a gzip stream read to its end (or unreadable)
    read_error_logged: bool = False


def _hash(offset: int, head: bytes, tail: bytes) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(offset.to_bytes(8, "little"))
    h.update(head)
    h.update(tail)
    return h.hexdigest()


def fingerprint(fd: int, offset: int) -> str:
    """Hash of the first and last KiB before ``offset``: identifies "the same file, read so far".

    Hashing all bytes before the offset would make a restart on a multi-GiB log slow; two
    windows catch both a replaced file (different start) and a rewritten one (different end).
    """
    head = os.pread(fd, min(offset, _FINGERPRINT_WINDOW), 0)
    tail_start = max(0, offset - _FINGERPRINT_WINDOW)
    tail = os.pread(fd, offset - tail_start, tail_start)
    return _hash(offset, head, tail)


def _stream_fingerprint(stream: BinaryIO, offset: int) -> str | None:
    """:func:`fingerprint` of a stream's first ``offset`` bytes (None if it is shorter)."""
    head = b""
    tail = bytearray()
    n = 0
    while n < offset:
        chunk = stream.read(min(_READ_CHUNK, offset - n))
        if not chunk:
            return None
        if len(head) < _FINGERPRINT_WINDOW:
            head += chunk[: _FINGERPRINT_WINDOW - len(head)]
        tail += chunk
        if len(tail) > _FINGERPRINT_WINDOW:
            del tail[: len(tail) - _FINGERPRINT_WINDOW]
        n += len(chunk)
    return _hash(offset, head, bytes(tail))


def compression_of(head: bytes) -> str | None:
    """The compression format whose magic bytes start ``head``, or None."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


_NUL_RUN = re.compile(rb"\0{16,}")


def _binary_problem(sample: bytes) -> str | None:
    """Why ``sample`` is not the start of a text log, or None. Logs are text: (nginx and Apache
    escape them) almost no control characters. Runs of NUL bytes are left out of the judgement:
    a machine that crashed while the log was written leaves a block of zeros where the last
    writes were (the lines around it are the log's, the damaged line is counted when read);
    a binary file has other control bytes too. Only runs (16 and more): a UTF-16 file's
    every other NUL is not text for this reader."""
    sample = _NUL_RUN.sub(b"", sample)
    if not sample:
        return None
    controls = sum(sample.count(bytes([c])) for c in (*range(0, 9), *range(14, 32), 127))
    if controls > len(sample) // 100:
        return f"not text ({controls} control bytes in its first {len(sample)} bytes)"
    return None


def check_text(path: str | os.PathLike, *, allow_gzip: bool) -> str | None:
    """None when ``path`` is a text log this module can read; else what it is instead.

    ``allow_gzip``: a gzip file is accepted (and its decompressed start checked), as for the
    rotated files of a backfill; a followed log must be the plain one.
    """
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    kind = compression_of(head)
    if kind == "gzip" and allow_gzip:
        try:
            with gzip.open(path, "rb") as g:
                head = g.read(_SNIFF_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            return f"a damaged gzip file ({e})"
        problem = _binary_problem(head)
        return f"gzip-compressed, and {problem}" if problem else None
    if kind is not None:
        how = ("follow the plain log (nginx writes this one so with `access_log ... gzip`: drop `gzip` "
               "from that line); read rotated .gz files with the one-shot backfill") if kind == "gzip" else (
            f"decompress it first ({kind} is not read)"
        )
        return f"a {kind}-compressed file, not a text log: {how}"
    return _binary_problem(head)


def rotated_siblings(path: str | os.PathLike, pattern: str | None = None) -> list[Path]:
    """The rotated copies of ``path``, oldest first (see the module docstring for the names).

    ``X`` and ``X.gz`` both present means gzip is still writing ``X.gz``: only ``X`` is listed.
    A ``path`` that is a symbolic link is rotated where its file is (logrotate rotates the
    target's path: it refuses a link): both folders are looked in.
    """
    path = Path(path)
    found: list[tuple[Path, str]] = []  # (a rotated copy, the name it was rotated from)
    if pattern:
        found = [(Path(p), path.name) for p in glob.glob(pattern)]
    else:
        bases = [path]
        try:
            target = path.resolve() if path.is_symlink() else path
        except (OSError, RuntimeError):  # a link loop
            target = path
        if target != path:
            bases.append(target)
        for live in bases:
            try:
                with os.scandir(live.parent) as it:
                    for e in it:
                        rest = e.name[len(live.name):]
                        if e.name.startswith(live.name) and rest and _ROTATED_SUFFIX.fullmatch(rest):
                            found.append((Path(e.path), live.name))
            except OSError:
                continue
    names = {p.name for p, _ in found}
    out: list[tuple[tuple[int, int, str], Path, str]] = []
    seen: set[tuple[int, int]] = set()
    for p, base in found:
        if p.absolute() == path.absolute() or (p.suffix == ".gz" and p.name[:-3] in names):
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        try:
            if p.samefile(path):  # the live file itself, reached through the link's folder
                continue
        except OSError:
            pass
        seen.add((st.st_dev, st.st_ino))
        out.append(((0, st.st_mtime_ns, p.name), p, base))
    numbers = [_NUMBERED_SUFFIX.fullmatch(p.name[len(base):]) for _, p, base in out]
    if out and all(numbers):  # access.log.3.gz, access.log.2, access.log.1: by number
        nums = [int(m.group(1)) for m in numbers if m is not None]
        return [p for _, (_, p, _) in sorted(zip(nums, out, strict=True), key=lambda t: -t[0])]
    return [p for _, p, _ in sorted(out)]


#: A file modified this recently (seconds) whose last line has no newline is being written: a
#: first start at its end begins at that line. Older, the fragment is dead (a writer killed, a
#: full disk): the start is after it, or the next line would be glued to it and lost.
LINE_BEING_WRITTEN = 2.0


def _line_start(fd: int, size: int, window: int) -> int:
    """Where the line that ``size`` falls in begins: ``size`` after a newline; else the start of
    the line being written (a first start at the end while a writer is mid-line: its rest, read
    alone, was a rejected line). A line longer than ``window`` is skipped whole (``size``)."""
    if size == 0:
        return 0
    start = max(0, size - window)
    try:
        tail = os.pread(fd, size - start, start)
    except OSError:
        return size
    if tail.endswith(b"\n"):
        return size
    cut = tail.rfind(b"\n")
    if cut >= 0:
        return start + cut + 1
    return 0 if start == 0 else size


def _open_source(path: Path) -> tuple[int, BinaryIO | None, os.stat_result]:
    """A descriptor for a plain file, or a gzip stream (fd -1) for a gzip one."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if compression_of(os.pread(fd, 8, 0)) != "gzip":
            return fd, None, st
        stream: BinaryIO = gzip.GzipFile(fileobj=os.fdopen(os.dup(fd), "rb"), mode="rb")  # type: ignore[assignment]
    except BaseException:
        _close_fd(fd)
        raise
    _close_fd(fd)
    return -1, stream, st


def _split(h: _Handle, chunk: bytes, out: list[str], limit: int, stats: FollowStats) -> None:
    """Cut buffered bytes + ``chunk`` into lines; keep the incomplete tail, bounded.

    Decodes once per chunk (not per line): the chunk is cut at its last newline, so no UTF-8
    sequence is split. Lines longer than ``limit`` characters are dropped and counted.
    """
    last_nl = chunk.rfind(b"\n")
    if last_nl < 0:
        _buffer_tail(h, chunk, limit)
        return
    head = chunk[:last_nl]
    tail = chunk[last_nl + 1 :]
    if h.discarding:  # the first line ends the oversized line we were skipping
        stats.oversized_lines += 1
        h.discarding = False
        first_nl = head.find(b"\n")
        head = head[first_nl + 1 :] if first_nl >= 0 else b""
        skip_all = first_nl < 0
    else:
        skip_all = False
        if h.buf:
            head = bytes(h.buf) + head
    h.buf.clear()
    h.line_start = h.pos - len(tail)
    if not skip_all:
        text = head.decode("utf-8", "replace")
        lines = text.split("\n")
        if "\r" in text:
            lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        if len(text) > limit and max(map(len, lines)) > limit:
            kept = [ln for ln in lines if len(ln) <= limit]
            stats.oversized_lines += len(lines) - len(kept)
            lines = kept
        out.extend(lines)
    _buffer_tail(h, tail, limit)


def _buffer_tail(h: _Handle, data: bytes, limit: int) -> None:
    if h.discarding or not data:
        return
    if len(h.buf) + len(data) > limit:
        h.buf.clear()
        h.discarding = True
    else:
        h.buf += data


def _read_chunk(h: _Handle, n: int) -> bytes:
    if h.stream is not None:
        return h.stream.read(n)
    return os.pread(h.fd, n, h.pos)


def read_lines(
    path: str | os.PathLike, *, max_line_bytes: int = 64 * 1024, stats: FollowStats | None = None
) -> Iterator[list[str]]:
    """The lines of one whole file, plain or gzip, in batches; a final unterminated line counts.

    Refuses (:class:`NotTextError`) what :func:`check_text` rejects, before yielding anything.
    """
    p = Path(path)
    problem = check_text(p, allow_gzip=True)
    if problem:
        raise NotTextError(f"{p}: {problem}")
    stats = stats if stats is not None else FollowStats()
    fd, stream, st = _open_source(p)
    h = _Handle(fd=fd, ino=st.st_ino, dev=st.st_dev, name=str(p), stream=stream)
    try:
        while True:
            try:
                chunk = _read_chunk(h, _READ_CHUNK)
            except (OSError, EOFError, zlib.error) as e:
                raise NotTextError(f"{p}: unreadable after {h.pos} bytes ({e})") from e
            if not chunk:
                break
            h.pos += len(chunk)
            stats.bytes += len(chunk)
            out: list[str] = []
            _split(h, chunk, out, max_line_bytes, stats)
            stats.lines += len(out)
            yield out
        if h.buf and not h.discarding:
            stats.lines += 1
            yield [bytes(h.buf).decode("utf-8", "replace")]
        elif h.discarding:
            stats.oversized_lines += 1
    finally:
        _close(h)


@dataclass
class _Saved:
    """One file of the state file: read up to ``offset``; its first ``fp_offset`` bytes hash to ``fp``."""

    inode: int
    offset: int
    fp_offset: int
    fp: str


class LogFollower:
    """Return the complete new lines of one log path on each :meth:`poll`.

    ``from_start`` decides where reading begins when there is no usable saved state and the
    file already exists at start-up: True reads the backlog, False starts at its end (like
    ``tail -F``; the skipped bytes are counted). ``max_line_bytes`` bounds one line: longer lines
    are dropped and counted in ``stats.oversized_lines`` (never returned, never held in memory
    beyond the bound). ``rotated`` is a glob naming the rotated copies when they are not
    beside the log with the usual names. ``drain_grace``: seconds a rotated-away file must stay
    quiet before it is closed: nginx writes to it until its workers reopen their logs (``USR1``),
    and after a ``reload`` in a ``postrotate`` (a common recipe) an old worker writes each request
    it was serving when it ends, seconds or minutes later (1 s lost those: a stranger's review).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        state_file: Path | None = None,
        from_start: bool = True,
        max_line_bytes: int = 64 * 1024,
        max_poll_bytes: int = 8 * 1024 * 1024,
        rotated: str | None = None,
        drain_grace: float = 300.0,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.path = Path(path)
        self.state_file = Path(state_file) if state_file is not None else None
        self.max_line_bytes = max_line_bytes
        self.max_poll_bytes = max(max_poll_bytes, 1)
        self.rotated = rotated
        self.drain_grace = drain_grace
        self.stats = FollowStats()
        self.behind = False  # True when the last poll stopped at max_poll_bytes
        self._cur: _Handle | None = None
        self._draining: list[_Handle] = []
        self._last_state: str | None = None
        self._open_error_logged = False
        self._state_error = ""  # the last failure to write the state file ('' when the last write worked)
        # (n, hash of the first n bytes) of files this process held as current: a rotated file
        # whose head is one of these was read already (an older file compressed later).
        self._heads: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)
        self._resume_info = self._start(from_start)

    # ------------------------------------------------------------------ public API

    def poll(self) -> list[str]:
        """Read what was appended since the last poll; return the complete lines, decoded."""
        out: list[str] = []
        budget = self.max_poll_bytes
        if self._cur is not None:
            self._check_truncation(self._cur)
        now = time.monotonic()
        for h in list(self._draining):
            if budget <= 0:
                break
            n = self._read(h, out, budget)
            budget -= n
            if n:
                h.quiet_polls, h.last_data = 0, now
            else:
                h.quiet_polls += 1
            if h.eof or (h.quiet_polls >= 1 and now - h.last_data >= self._grace(h)):
                self._finish_draining(h, out)
        # Many rotations in a row (size-triggered, `rotate 0`): the oldest quiet ones go first,
        # so the files held open (and the disk of deleted ones) stay bounded.
        quiet = [h for h in self._draining if h.quiet_polls >= 1]
        for h in quiet[: max(0, len(self._draining) - MAX_DRAINING)]:
            self._finish_draining(h, out)
        if self._cur is None:
            self._cur = self._open(from_start=True)
        if self._cur is not None and budget > 0:
            budget -= self._read(self._cur, out, budget)
            if budget > 0:
                budget -= self._check_rotation(out, budget)
        self.behind = budget <= 0
        self.stats.lines += len(out)
        self._refresh_fingerprints()
        self._save_state()
        return out

    def resume_info(self) -> str:
        """One sentence on where reading (re)started and, when it started fresh, why."""
        return self._resume_info

    def close(self) -> None:
        """Persist the state and close every file descriptor. Safe to call twice."""
        self._save_state()
        for h in [*self._draining, self._cur]:
            if h is not None:
                _close(h)
        self._draining.clear()
        self._cur = None

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ start-up and state

    def _start(self, from_start: bool) -> str:
        """Open the file (or not yet), resuming from the state file wherever rotation put it."""
        saved, why_fresh = self._load_state()
        cur = self._cur = self._open(from_start=from_start)
        if cur is not None:
            self._set_identity(cur)
        if saved is None:
            reason = why_fresh or "no saved state"
            if cur is None:
                return f"{self.path}: {reason}; file does not exist yet, will read it from the start when it appears"
            if from_start or cur.pos == 0:
                return f"{self.path}: {reason}; reading inode {cur.ino} from the start"
            self.stats.skipped_bytes += cur.pos
            return (f"{self.path}: {reason}; starting at its end (offset {cur.pos}): skipped the {cur.pos} bytes "
                    "already in it, so counts start at 0")

        siblings = self._siblings()
        cur_idx = len(siblings)
        matched: dict[int, _Handle] = {}
        notes: list[str] = []
        for entry in reversed(saved):  # the current file first, then older draining ones
            if cur is not None and cur_idx not in matched and entry.inode == cur.ino and self._fits(cur, entry):
                self._seek(cur, entry.offset)
                self._set_identity(cur)
                matched[cur_idx] = cur
                notes.append(f"resumed inode {entry.inode} at offset {entry.offset}")
                continue
            if cur is not None and entry.inode == cur.ino:
                self.stats.truncations += 1
                notes.append(f"inode {entry.inode} is shorter or has other bytes before offset {entry.offset} "
                             "than saved (truncated, or a replaced file reusing the inode)")
            found = self._find_content(entry, siblings, exclude=set(matched))
            if found is None:
                self.stats.unrecovered += 1
                notes.append(f"saved inode {entry.inode} (offset {entry.offset}) is gone or no longer matches "
                             "any rotated file: what was written to it after that offset is not counted")
                continue
            idx, h = found
            matched[idx] = h
            self.stats.rotations += 1
            notes.append(f"draining rotated {h.name} (was inode {entry.inode}) from offset {entry.offset}")
        rotated = [i for i in matched if i != cur_idx]
        if rotated:  # siblings rotated after the newest saved file were written entirely while down
            for idx in range(max(rotated) + 1, cur_idx):
                whole = self._open_whole(siblings[idx])
                if whole is not None:
                    matched[idx] = whole
                    self.stats.rotations += 1
                    notes.append(f"reading {whole.name}, rotated while down, from offset 0")
        self._draining = [matched[i] for i in sorted(matched) if i != cur_idx]
        if cur is None:
            notes.append("file does not exist yet, will read it from the start when it appears")
        elif cur_idx not in matched:
            self._seek(cur, 0)
            self._set_identity(cur)
            notes.append(f"inode {cur.ino} is new since the state was saved; reading it from offset 0")
        return f"{self.path}: " + "; ".join(notes)

    def _load_state(self) -> tuple[list[_Saved] | None, str]:
        """Saved file entries (oldest first), or None and why they cannot be used."""
        if self.state_file is None:
            return None, ""
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None, f"no state file {self.state_file}"
        except (OSError, ValueError) as e:
            return None, f"state file {self.state_file} unreadable ({e})"
        try:
            if raw.get("version") != STATE_VERSION:
                return None, f"state file {self.state_file} has version {raw.get('version')!r}"
            if raw.get("path") != str(self.path.absolute()):
                return None, f"state file {self.state_file} belongs to {raw.get('path')!r}"
            files = [
                _Saved(int(f["inode"]), int(f["offset"]), int(f.get("fp_offset", f["offset"])), str(f["fingerprint"]))
                for f in raw["files"]
            ]
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            return None, f"state file {self.state_file} malformed ({e!r})"
        if not files:
            return None, f"state file {self.state_file} lists no file"
        return files, ""

    def _save_state(self) -> None:
        """Write where each open file's last complete line ends; skip when nothing changed."""
        if self.state_file is None:
            return
        files = [
            {"inode": h.ino, "offset": h.line_start, "fp_offset": h.fp_offset, "fingerprint": h.fp, "name": h.name}
            for h in [*self._draining, self._cur]
            if h is not None and h.fp
        ]
        if not files:
            return
        text = json.dumps({"version": STATE_VERSION, "path": str(self.path.absolute()), "files": files})
        if text == self._last_state:
            return
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, self.state_file)
            self._last_state = text
            if self._state_error:
                log.info("follow state %s written again", self.state_file)
                self._state_error = ""
        except OSError as e:
            self.stats.state_write_errors += 1
            # Said once per kind of failure, not at every poll (a full disk: 4 lines a second per
            # log, into a journal on the same full disk: a stranger's review).
            if str(e) != self._state_error:
                log.warning("cannot write follow state %s: %s (said again when it changes or recovers)", self.state_file, e)
                self._state_error = str(e)

    def _refresh_fingerprints(self) -> None:
        """Identify each plain file by the content up to its last complete line (cheap: two
        small preads and a hash, only when the position moved). Gzip streams keep the
        identity they were matched by."""
        for h in [*self._draining, self._cur]:
            if h is not None and h.stream is None and h.fp_offset != h.line_start:
                try:
                    self._set_identity(h)
                except OSError:
                    pass

    @staticmethod
    def _set_identity(h: _Handle) -> None:
        h.fp_offset = h.line_start
        h.fp = fingerprint(h.fd, h.line_start)

    @staticmethod
    def _fits(h: _Handle, entry: _Saved) -> bool:
        """True when the open plain file is the saved one, read up to ``entry.offset``."""
        try:
            size = os.fstat(h.fd).st_size
            return size >= max(entry.offset, entry.fp_offset) and fingerprint(h.fd, entry.fp_offset) == entry.fp
        except OSError:
            return False

    def _siblings(self) -> list[Path]:
        """Rotated siblings this follower can read (plain or gzip), oldest first."""
        out = []
        for p in rotated_siblings(self.path, self.rotated):
            try:
                with open(p, "rb") as f:
                    kind = compression_of(f.read(8))
            except OSError:
                continue
            if kind in (None, "gzip"):
                out.append(p)
        return out

    def _find_content(self, entry: _Saved, siblings: list[Path], exclude: set[int]) -> tuple[int, _Handle] | None:
        """The newest rotated sibling holding the saved content, opened at ``entry.offset``.

        A saved offset of 0 identifies nothing (every file starts with zero bytes): then only the
        same inode (a plain rename) counts.
        """
        for idx in range(len(siblings) - 1, -1, -1):
            if idx in exclude:
                continue
            h = self._open_matching(siblings[idx], entry)
            if h is not None:
                return idx, h
        return None

    def _open_matching(self, path: Path, entry: _Saved) -> _Handle | None:
        try:
            fd, stream, st = _open_source(path)
        except (OSError, EOFError, zlib.error):
            return None
        h = _Handle(fd=fd, ino=st.st_ino, dev=st.st_dev, name=str(path), stream=stream)
        try:
            if entry.fp_offset == 0:
                ok = stream is None and st.st_ino == entry.inode
            elif stream is None:
                ok = self._fits(h, entry)
            else:
                ok = _stream_fingerprint(stream, entry.fp_offset) == entry.fp
                if ok and stream.seek(entry.offset) != entry.offset:  # GzipFile seeks by reading
                    ok = False
        except (OSError, EOFError, zlib.error):
            ok = False
        if not ok:
            _close(h)
            return None
        h.pos = h.line_start = entry.offset
        h.fp_offset, h.fp = entry.fp_offset, entry.fp
        return h

    def _open_whole(self, path: Path) -> _Handle | None:
        """A rotated file to read from 0. A gzip stream is identified by its first lines at once
        (it cannot be fingerprinted as it goes), so a restart half-way through finds it again."""
        try:
            fd, stream, st = _open_source(path)
            h = _Handle(fd=fd, ino=st.st_ino, dev=st.st_dev, name=str(path), stream=stream)
            h.fp = _hash(0, b"", b"")
            if stream is not None:
                head = stream.read(4 * _FINGERPRINT_WINDOW)
                h.fp_offset = len(head)
                h.fp = _hash(h.fp_offset, head[:_FINGERPRINT_WINDOW], head[-_FINGERPRINT_WINDOW:])
                stream.seek(0)
        except (OSError, EOFError, zlib.error):
            return None
        return h

    # ------------------------------------------------------------------ reading

    def _open(self, *, from_start: bool) -> _Handle | None:
        try:
            # O_NONBLOCK: opening a FIFO put in the log's place must not hang the poll loop
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._open_failed(str(e))
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _close_fd(fd)
            self._open_failed("not a regular file")
            return None
        self._open_error_logged = False
        h = _Handle(fd=fd, ino=st.st_ino, dev=st.st_dev, name=str(self.path))
        writing = time.time() - st.st_mtime < LINE_BEING_WRITTEN
        self._seek(h, 0 if from_start else _line_start(fd, st.st_size, self.max_line_bytes) if writing else st.st_size)
        return h

    def _open_failed(self, why: str) -> None:
        self.stats.open_errors += 1
        if not self._open_error_logged:  # once per failure streak, not at every poll
            log.warning("cannot read %s (will keep trying): %s", self.path, why)
            self._open_error_logged = True

    @staticmethod
    def _seek(h: _Handle, offset: int) -> None:
        h.pos = h.line_start = offset
        h.buf.clear()
        h.discarding = False

    def _read(self, h: _Handle, out: list[str], budget: int) -> int:
        """Append the complete lines readable from ``h`` to ``out``; return bytes read."""
        total = 0
        limit = self.max_line_bytes
        while total < budget:
            try:
                chunk = _read_chunk(h, min(_READ_CHUNK, budget - total))
            except (OSError, EOFError, zlib.error) as e:
                if not h.read_error_logged:
                    log.warning("read error on %s: %s", h.name, e)
                    h.read_error_logged = True
                h.eof = h.stream is not None
                break
            if not chunk:
                h.eof = h.stream is not None
                break
            h.pos += len(chunk)
            total += len(chunk)
            _split(h, chunk, out, limit, self.stats)
        self.stats.bytes += total
        return total

    # ------------------------------------------------------------------ rotation / truncation

    def _check_truncation(self, h: _Handle) -> None:
        """Notice a truncation (shorter than our position, or other bytes before it); read the
        rest of what we had not read from the copy, then the file from 0."""
        try:
            size = os.fstat(h.fd).st_size
            same = size >= h.pos and (h.fp_offset == 0 or fingerprint(h.fd, h.fp_offset) == h.fp)
        except OSError:
            return
        if same:
            return
        self.stats.truncations += 1
        entry = _Saved(h.ino, h.line_start, h.fp_offset, h.fp)
        copy, found = None, None
        if h.line_start:
            siblings = [p for p in self._siblings() if _inode(p) != h.ino]
            found = self._find_content(entry, siblings, exclude=set())
            copy = found[1] if found else None
        if copy is not None:
            log.info("%s truncated (copytruncate); reading the rest from its copy %s from offset %d, then it from 0",
                     h.name, copy.name, h.line_start)
            self._draining.append(copy)
            # Truncated twice between two polls (a stopped or starved reader): the copies made
            # after the one holding our offset hold what was written between the truncations.
            assert found is not None
            held = {d.ino for d in self._draining} | {h.ino}
            for whole in self._later_unseen(found[0], siblings, held):
                self.stats.truncations += 1
                log.info("%s: %s was copied and truncated too before this poll saw it; reading it from offset 0",
                         h.name, whole.name)
                self._draining.append(whole)
        elif h.line_start:
            self.stats.unrecovered += 1
            log.warning("%s truncated, and no rotated copy holds what it had at offset %d: lines written "
                        "after our last read and before the truncation are not counted", h.name, h.line_start)
        self._seek(h, 0)
        self._set_identity(h)

    def _check_rotation(self, out: list[str], budget: int) -> int:
        """When the path names another file now, drain the old one and switch; return bytes read."""
        cur = self._cur
        assert cur is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return 0  # renamed away, new one not created yet: keep reading the old inode
        if (st.st_ino, st.st_dev) == (cur.ino, cur.dev):
            return 0
        new = self._open(from_start=True)
        if new is None or (new.ino, new.dev) == (cur.ino, cur.dev):
            if new is not None:
                _close(new)
            return 0
        self.stats.rotations += 1
        log.info("%s rotated: inode %d -> %d", self.path, cur.ino, new.ino)
        cur.quiet_polls, cur.last_data = 0, time.monotonic()
        self._draining.append(cur)
        for whole in self._rotated_unseen(cur, new):
            self.stats.rotations += 1
            log.info("%s: %s was rotated too before this poll saw it; reading it from offset 0", self.path, whole.name)
            self._draining.append(whole)
        self._cur = new
        self._set_identity(new)
        return self._read(new, out, budget)

    def _rotated_unseen(self, cur: _Handle, new: _Handle) -> list[_Handle]:
        """The siblings rotated after ``cur`` that no poll saw as the current file (two
        rotations between polls), opened at 0, oldest first.

        This runs at every rotation, so a false positive would count a file twice: a sibling
        counts only if it was written after ``cur``'s last write, its name says it was rotated
        after ``cur`` (``_named_later``) and its first bytes are not those of a file this
        process held (an older file compressed later, with a fresh timestamp). When ``cur``
        itself cannot be located (deleted, or empty when last polled), siblings written after
        it are a possible loss: warned about and counted in ``stats.unrecovered``, not read."""
        self._remember_head(cur)
        siblings = self._siblings()
        held = {h.ino for h in self._draining} | {cur.ino, new.ino}
        idx = next((i for i in range(len(siblings) - 1, -1, -1) if _inode(siblings[i]) == cur.ino), None)
        if idx is None and cur.fp_offset:  # renamed and gzipped: find it by what we read of it
            found = self._find_content(_Saved(cur.ino, cur.fp_offset, cur.fp_offset, cur.fp), siblings, set())
            if found is not None:
                idx = found[0]
                _close(found[1])
        try:
            cur_written = os.fstat(cur.fd).st_mtime_ns
        except OSError:
            return []
        written_after = []
        for i, p in enumerate(siblings):
            try:
                st = p.stat()
            except OSError:
                continue
            if i != idx and st.st_ino not in held and st.st_mtime_ns >= cur_written and not self._head_known(p):
                written_after.append((i, p))
        if idx is None:
            if written_after:
                self.stats.unrecovered += 1
                log.warning("%s rotated while the file we held (inode %d) was rotated away unseen; %s written after "
                            "it cannot be placed, so lines of a file between may not be counted", self.path, cur.ino,
                            ", ".join(p.name for _, p in written_after))
            return []
        return self._later_unseen(idx, siblings, held, cur_written)

    def _later_unseen(self, anchor: int, siblings: list[Path], held: set[int], written_ns: int = 0) -> list[_Handle]:
        """The siblings whose names say they were rotated after ``siblings[anchor]``, written at
        or after ``written_ns``, that no handle holds and that do not start like a file this
        process held as current: opened at 0, oldest first."""
        out = []
        for i, p in enumerate(siblings):
            try:
                st = p.stat()
            except OSError:
                continue
            if (i != anchor and st.st_ino not in held and st.st_mtime_ns >= written_ns and not self._head_known(p)
                    and self._named_later(p, siblings[anchor])):
                whole = self._open_whole(p)
                if whole is not None:
                    self._remember_head(whole)
                    out.append(whole)
        return out

    def _remember_head(self, h: _Handle) -> None:
        """Remember the first KiB of a file that was current (see ``_head_known``)."""
        try:
            head = os.pread(h.fd, _FINGERPRINT_WINDOW, 0) if h.stream is None else b""
        except OSError:
            return
        if head:
            self._heads.append((len(head), hashlib.blake2b(head, digest_size=8).hexdigest()))

    def _head_known(self, p: Path) -> bool:
        """True when ``p`` starts with the first bytes of a file this process held as current."""
        if not self._heads:
            return False
        try:
            fd, stream, _ = _open_source(p)
            try:
                head = stream.read(_FINGERPRINT_WINDOW) if stream is not None else os.pread(fd, _FINGERPRINT_WINDOW, 0)
            finally:
                if stream is not None:
                    stream.close()
                else:
                    _close_fd(fd)
        except (OSError, EOFError, zlib.error):
            return False
        return any(len(head) >= n and hashlib.blake2b(head[:n], digest_size=8).hexdigest() == hx
                   for n, hx in self._heads)

    def _named_later(self, p: Path, than: Path) -> bool:
        """``p``'s name says it was rotated after ``than``: a lower number (``.1`` after
        ``.2``), else a later name once a compression suffix is dropped (``-20261125`` after
        ``-20261124``; date formats that do not sort as text, such as ``-%d%m%Y``, can be
        wrong at a month's end: the head check above is what keeps an older file out then)."""
        def rest(q: Path) -> str:
            return q.name[len(self.path.name):] if q.name.startswith(self.path.name) else ""

        mp, mt = _NUMBERED_SUFFIX.fullmatch(rest(p)), _NUMBERED_SUFFIX.fullmatch(rest(than))
        if mp and mt:
            return int(mp.group(1)) < int(mt.group(1))
        return _COMPRESSED_SUFFIX.sub("", p.name) > _COMPRESSED_SUFFIX.sub("", than.name)

    def _grace(self, h: _Handle) -> float:
        """How long ``h`` may stay quiet before it is closed: ``drain_grace``, or at most
        :data:`DELETED_GRACE_S` once the file is deleted (``rotate 0``, a rotated file gzipped:
        holding it keeps its disk from being freed, and a writer that has not reopened by then
        is rare)."""
        try:
            deleted = os.fstat(h.fd).st_nlink == 0 if h.stream is None else False
        except OSError:
            deleted = True
        return min(self.drain_grace, DELETED_GRACE_S) if deleted else self.drain_grace

    def _finish_draining(self, h: _Handle, out: list[str]) -> None:
        """Close a rotated file that stayed quiet; a final unterminated line is still a line."""
        if h.buf and not h.discarding:
            out.append(bytes(h.buf).decode("utf-8", "replace"))
        elif h.discarding:
            self.stats.oversized_lines += 1
        _close(h)
        self._draining.remove(h)


def _inode(p: Path) -> int:
    try:
        return p.stat().st_ino
    except OSError:
        return -1


def _close(h: _Handle) -> None:
    if h.stream is not None:
        try:
            h.stream.close()
        except OSError:
            pass
    if h.fd >= 0:
        _close_fd(h.fd)


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


async def follow(
    followers: Sequence[LogFollower],
    on_lines: Callable[[LogFollower, list[str]], object],
    interval: float = 0.25,
    stop: asyncio.Event | None = None,
    wake: asyncio.Event | None = None,
) -> None:
    """Poll every follower until ``stop`` is set, handing each poll's lines to ``on_lines``.

    ``on_lines`` is called after every poll, also with an empty list, so a caller can export
    ``follower.stats`` deltas (oversized lines, rotations) even when no line arrived. Polls
    run in a worker thread so a large backlog does not stall the event loop; while a follower
    is ``behind`` (its poll hit ``max_poll_bytes``) the next round starts without sleeping.
    Setting ``wake`` starts the next round at once (SIGHUP from a logrotate postrotate script).
    """
    stop = stop or asyncio.Event()
    wake = wake or asyncio.Event()
    while not stop.is_set():
        behind = False
        for f in followers:
            lines = await asyncio.to_thread(f.poll)
            on_lines(f, lines)
            behind = behind or f.behind
        if behind:
            await asyncio.sleep(0)
            continue
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        wake.clear()


__all__ = [
    "FollowStats",
    "LogFollower",
    "NotTextError",
    "check_text",
    "compression_of",
    "fingerprint",
    "follow",
    "read_lines",
    "rotated_siblings",
]
