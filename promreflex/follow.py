"""Follow a growing log file the way ``tail -F`` should: across rotations, truncations and restarts.

Every log-reading exporter (access logs, Envoy logs, ...) needs the same hard part: read only
*complete* new lines, never lose the lines written just before a rotation, never count a line
twice after a ``copytruncate`` or a restart, and keep memory bounded when a writer emits a
runaway line. :class:`LogFollower` does that with plain ``os`` calls and no threads, so a caller
decides when to poll (:func:`follow` is a small asyncio loop for the common case).

How each situation is recognised, on every :meth:`LogFollower.poll`:

* **growth**: read from our byte position to EOF (at most ``max_poll_bytes`` per poll, so a
  huge backlog cannot blow up one poll's memory); the bytes after the last newline stay
  buffered until their newline arrives.
* **rename rotation** (logrotate ``create``, ``mv`` + reopen): ``stat(path)`` names another
  inode than the one we hold open. The old handle is read to its end first, then kept
  *draining* until it stays quiet for one poll, because nginx keeps writing to the old inode
  until it gets ``USR1``. Then the new file is read from offset 0.
* **copytruncate**: the held file is now shorter than our position, or its first bytes
  changed (it was truncated and already refilled past our position). Reading restarts at 0
  of the same inode; a buffered partial line is dropped (its start was in the old content).
* **missing file**: polled until it appears; a file that appears later is read from 0,
  whatever ``from_start`` says (all of it is new).
* **restart**: with ``state_file``, after each poll the (inode, offset, fingerprint) of every
  file still being read is written atomically (temp file + ``os.replace``). The offset is the
  end of the last *complete* line returned, so a partial line is re-read, not lost. The
  fingerprint is a short BLAKE2b hash of the first and last KiB before the offset: it tells a
  resumed file from a different file that happens to reuse the inode number. If the path now
  holds another inode, the saved inode is looked for among rotated siblings in the same
  directory (``access.log.1``, ``access.log-20240101``; not compressed ones) and drained from
  the saved offset first, so a rotation while the exporter was down loses nothing either.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

log = logging.getLogger(__name__)

STATE_VERSION = 1
_FINGERPRINT_WINDOW = 1024  # bytes hashed at the start of the file and just before the offset
_HEAD_CHECK_BYTES = 256  # first bytes re-read each poll to notice truncate-then-refill
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")
_READ_CHUNK = 256 * 1024


@dataclass
class FollowStats:
    """Counters a caller can export (deltas between polls are what changed in that poll)."""

    lines: int = 0  # complete lines returned
    bytes: int = 0  # bytes consumed from files (including dropped oversized lines)
    rotations: int = 0  # rename rotations noticed (while running or across a restart)
    truncations: int = 0  # copytruncate-style truncations noticed
    oversized_lines: int = 0  # lines longer than max_line_bytes, dropped
    open_errors: int = 0  # failed attempts to open an existing path (permissions, not a file)

    def snapshot(self) -> FollowStats:
        """A copy to diff against later (``follower.stats`` itself keeps changing)."""
        return replace(self)

    def since(self, earlier: FollowStats) -> FollowStats:
        """What was counted after ``earlier`` was taken: how a caller exports per-poll deltas."""
        return FollowStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})


@dataclass
class _Handle:
    """One open file being read. ``line_start`` is where the current incomplete line begins."""

    fd: int
    ino: int
    dev: int
    name: str  # path it was opened by (for messages only)
    pos: int = 0  # next byte to read
    line_start: int = 0  # file offset of buf[0]; what we persist
    buf: bytearray = field(default_factory=bytearray)
    discarding: bool = False  # inside an oversized line: drop bytes until the next newline
    head: bytes = b""  # first bytes of the file as we read them (truncate-and-refill check)
    quiet_polls: int = 0  # for draining handles: polls in a row that read nothing
    read_error_logged: bool = False


def fingerprint(fd: int, offset: int) -> str:
    """Hash of the first and last KiB before ``offset``: identifies "the same file, read so far".

    Hashing all bytes before the offset would make a restart on a multi-GiB log slow; two
    windows catch both a replaced file (different start) and a rewritten one (different end).
    """
    head = os.pread(fd, min(offset, _FINGERPRINT_WINDOW), 0)
    tail_start = max(0, offset - _FINGERPRINT_WINDOW)
    tail = os.pread(fd, offset - tail_start, tail_start)
    h = hashlib.blake2b(digest_size=8)
    h.update(offset.to_bytes(8, "little"))
    h.update(head)
    h.update(tail)
    return h.hexdigest()


class LogFollower:
    """Return the complete new lines of one log path on each :meth:`poll`.

    ``from_start`` decides where reading begins when there is no usable saved state and the
    file already exists at start-up: True reads the backlog, False starts at its end (like
    ``tail -F``). ``max_line_bytes`` bounds one line: longer lines are dropped and counted in
    ``stats.oversized_lines`` (never returned, never held in memory beyond the bound).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        state_file: Path | None = None,
        from_start: bool = True,
        max_line_bytes: int = 64 * 1024,
        max_poll_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.path = Path(path)
        self.state_file = Path(state_file) if state_file is not None else None
        self.max_line_bytes = max_line_bytes
        self.max_poll_bytes = max(max_poll_bytes, 1)
        self.stats = FollowStats()
        self.behind = False  # True when the last poll stopped at max_poll_bytes
        self._cur: _Handle | None = None
        self._draining: list[_Handle] = []
        self._last_state: str | None = None
        self._open_error_logged = False
        self._resume_info = self._start(from_start)

    # ------------------------------------------------------------------ public API

    def poll(self) -> list[str]:
        """Read what was appended since the last poll; return the complete lines, decoded."""
        out: list[str] = []
        budget = self.max_poll_bytes
        for h in list(self._draining):
            if budget <= 0:
                break
            n = self._read(h, out, budget)
            budget -= n
            h.quiet_polls = 0 if n else h.quiet_polls + 1
            if h.quiet_polls >= 1:
                self._finish_draining(h, out)
        if self._cur is None:
            self._cur = self._open(from_start=True)
        if self._cur is not None and budget > 0:
            self._check_truncation(self._cur)
            budget -= self._read(self._cur, out, budget)
            if budget > 0:
                budget -= self._check_rotation(out, budget)
        self.behind = budget <= 0
        self.stats.lines += len(out)
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
                _close_fd(h.fd)
        self._draining.clear()
        self._cur = None

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ start-up and state

    def _start(self, from_start: bool) -> str:
        """Open the file (or not yet), resuming from the state file when it still fits."""
        saved, why_fresh = self._load_state()
        cur = self._cur = self._open(from_start=from_start)
        if saved is None:
            reason = why_fresh or "no saved state"
            if cur is None:
                return f"{self.path}: {reason}; file does not exist yet, will read it from the start when it appears"
            how = "from the start" if from_start else f"from its end (offset {cur.pos})"
            return f"{self.path}: {reason}; reading inode {cur.ino} {how}"

        notes: list[str] = []
        for entry in saved:
            ino, offset, fp = entry["inode"], entry["offset"], entry["fingerprint"]
            if cur is not None and ino == cur.ino:
                problem = self._misfit(cur.fd, offset, fp)
                if problem is None:
                    self._seek(cur, offset)
                    notes.append(f"resumed inode {ino} at offset {offset}")
                else:
                    self.stats.truncations += 1
                    self._seek(cur, 0)
                    notes.append(f"inode {ino} {problem}; reading it from offset 0")
                continue
            old = self._find_rotated(ino, offset, fp)
            if old is None:
                notes.append(f"saved inode {ino} (offset {offset}) is gone or no longer matches")
                continue
            self._draining.append(old)
            self.stats.rotations += 1
            notes.append(f"draining rotated {old.name} (inode {ino}) from offset {offset}")
        if cur is None:
            notes.append("file does not exist yet, will read it from the start when it appears")
        elif cur.ino not in {e["inode"] for e in saved}:
            self._seek(cur, 0)
            notes.append(f"inode {cur.ino} is new since the state was saved; reading it from offset 0")
        return f"{self.path}: " + "; ".join(notes)

    def _load_state(self) -> tuple[list[dict] | None, str]:
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
                {"inode": int(f["inode"]), "offset": int(f["offset"]), "fingerprint": str(f["fingerprint"])}
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
        files = []
        for h in [*self._draining, self._cur]:
            if h is None:
                continue
            try:
                fp = fingerprint(h.fd, h.line_start)
            except OSError:
                continue
            files.append({"inode": h.ino, "offset": h.line_start, "fingerprint": fp})
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
        except OSError as e:
            log.warning("cannot write follow state %s: %s", self.state_file, e)

    @staticmethod
    def _misfit(fd: int, offset: int, fp: str) -> str | None:
        """None when this open file is the saved one read up to ``offset``; else why not."""
        size = os.fstat(fd).st_size
        if size < offset:
            return f"is shorter ({size} bytes) than the saved offset {offset} (truncated or replaced)"
        if fingerprint(fd, offset) != fp:
            return f"has other bytes before offset {offset} than saved (replaced file reusing the inode)"
        return None

    def _find_rotated(self, ino: int, offset: int, fp: str) -> _Handle | None:
        """Open the rotated sibling of our path that is the saved inode, positioned at offset."""
        directory = self.path.parent
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return None
        for e in entries:
            if not e.name.startswith(self.path.name) or e.name == self.path.name:
                continue
            if e.name.endswith(_COMPRESSED_SUFFIXES):
                continue
            try:
                if e.inode() != ino or not e.is_file():
                    continue
                fd = os.open(e.path, os.O_RDONLY)
            except OSError:
                continue
            if self._misfit(fd, offset, fp) is not None:
                _close_fd(fd)
                continue
            st = os.fstat(fd)
            h = _Handle(fd=fd, ino=st.st_ino, dev=st.st_dev, name=e.path)
            self._seek(h, offset)
            return h
        return None

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
        self._seek(h, 0 if from_start else st.st_size)
        return h

    def _open_failed(self, why: str) -> None:
        self.stats.open_errors += 1
        if not self._open_error_logged:  # once per failure streak, not at every poll
            log.warning("cannot read %s (will keep trying): %s", self.path, why)
            self._open_error_logged = True

    def _seek(self, h: _Handle, offset: int) -> None:
        h.pos = h.line_start = offset
        h.buf.clear()
        h.discarding = False
        h.head = os.pread(h.fd, _HEAD_CHECK_BYTES, 0) if offset else b""

    def _read(self, h: _Handle, out: list[str], budget: int) -> int:
        """Append the complete lines readable from ``h`` to ``out``; return bytes read."""
        total = 0
        while total < budget:
            try:
                chunk = os.pread(h.fd, min(_READ_CHUNK, budget - total), h.pos)
            except OSError as e:
                if not h.read_error_logged:
                    log.warning("read error on %s: %s", h.name, e)
                    h.read_error_logged = True
                break
            if not chunk:
                break
            if h.pos < _HEAD_CHECK_BYTES and len(h.head) < _HEAD_CHECK_BYTES:
                h.head = (h.head + chunk)[:_HEAD_CHECK_BYTES] if h.pos == len(h.head) else h.head
            h.pos += len(chunk)
            total += len(chunk)
            self._split(h, chunk, out)
        self.stats.bytes += total
        return total

    def _split(self, h: _Handle, chunk: bytes, out: list[str]) -> None:
        """Cut buffered bytes + ``chunk`` into lines; keep the incomplete tail, bounded."""
        last_nl = chunk.rfind(b"\n")
        if last_nl < 0:
            self._buffer_tail(h, chunk)
            return
        head, tail = chunk[: last_nl + 1], chunk[last_nl + 1 :]
        parts = head.split(b"\n")
        parts.pop()  # empty string after the final newline
        first = parts[0]
        if h.discarding:
            # the first part ends the oversized line we were skipping
            self.stats.oversized_lines += 1
            h.discarding = False
            parts = parts[1:]
        elif h.buf:
            h.buf += first
            parts[0] = bytes(h.buf)
        h.buf.clear()
        limit = self.max_line_bytes
        for p in parts:
            if len(p) > limit:
                self.stats.oversized_lines += 1
                continue
            if p[-1:] == b"\r":
                p = p[:-1]
            out.append(p.decode("utf-8", "replace"))
        h.line_start = h.pos - len(tail)
        self._buffer_tail(h, tail)

    def _buffer_tail(self, h: _Handle, data: bytes) -> None:
        if h.discarding or not data:
            return
        if len(h.buf) + len(data) > self.max_line_bytes:
            h.buf.clear()
            h.discarding = True
        else:
            h.buf += data

    # ------------------------------------------------------------------ rotation / truncation

    def _check_truncation(self, h: _Handle) -> None:
        """Restart at 0 when the held file shrank below our position or its start changed."""
        try:
            size = os.fstat(h.fd).st_size
            head_now = os.pread(h.fd, len(h.head), 0) if h.head else b""
        except OSError:
            return
        if size >= h.pos and head_now == h.head:
            return
        self.stats.truncations += 1
        log.info("%s truncated (size %d < position %d or start rewritten); reading from 0", h.name, size, h.pos)
        self._seek(h, 0)

    def _check_rotation(self, out: list[str], budget: int) -> int:
        """When the path names another file now, drain the old one and switch; return bytes read."""
        cur = self._cur
        assert cur is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return 0  # renamed away, new one not created yet: keep reading the old inode
        except OSError:
            return 0
        if (st.st_ino, st.st_dev) == (cur.ino, cur.dev):
            return 0
        new = self._open(from_start=True)
        if new is None or (new.ino, new.dev) == (cur.ino, cur.dev):
            if new is not None:
                _close_fd(new.fd)
            return 0
        self.stats.rotations += 1
        log.info("%s rotated: inode %d -> %d", self.path, cur.ino, new.ino)
        cur.quiet_polls = 0
        self._draining.append(cur)
        self._cur = new
        return self._read(new, out, budget)

    def _finish_draining(self, h: _Handle, out: list[str]) -> None:
        """Close a rotated file that stayed quiet; a final unterminated line is still a line."""
        if h.buf and not h.discarding:
            out.append(bytes(h.buf).decode("utf-8", "replace"))
        elif h.discarding:
            self.stats.oversized_lines += 1
        _close_fd(h.fd)
        self._draining.remove(h)


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
) -> None:
    """Poll every follower until ``stop`` is set, handing each poll's lines to ``on_lines``.

    ``on_lines`` is called after every poll, also with an empty list, so a caller can export
    ``follower.stats`` deltas (oversized lines, rotations) even when no line arrived. Polls
    run in a worker thread so a large backlog does not stall the event loop; while a follower
    is ``behind`` (its poll hit ``max_poll_bytes``) the next round starts without sleeping.
    """
    stop = stop or asyncio.Event()
    while not stop.is_set():
        behind = False
        for f in followers:
            lines = await asyncio.to_thread(f.poll)
            on_lines(f, lines)
            behind = behind or f.behind
        if behind:
            await asyncio.sleep(0)
            continue
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except TimeoutError:
            pass


__all__ = ["FollowStats", "LogFollower", "fingerprint", "follow"]
