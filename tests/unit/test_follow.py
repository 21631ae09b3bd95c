"""LogFollower on real temporary files: growth, partial lines, rotations, truncation, restarts."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from promreflex.follow import LogFollower, follow


def append(path: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, "ab") as f:
        f.write(data)

def fake_clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The follower's monotonic clock, moved by hand (``clock["t"] += s``)."""
    import promreflex.follow as follow_mod

    clock = {"t": 1000.0}
    monkeypatch.setattr(follow_mod.time, "monotonic", lambda: clock["t"])
    return clock



def test_append_returns_only_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "a\nb\n")
    f = LogFollower(log)
    assert f.poll() == ["a", "b"]
    assert f.poll() == []
    append(log, "c\n")
    assert f.poll() == ["c"]
    assert f.stats.lines == 3
    assert f.stats.bytes == 6
    f.close()


def test_from_start_false_skips_backlog(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "old\n")
    f = LogFollower(log, from_start=False)
    assert f.poll() == []
    append(log, "new\n")
    assert f.poll() == ["new"]
    assert "at its end (offset 4)" in f.resume_info() and "skipped the 4 bytes" in f.resume_info()
    assert f.stats.skipped_bytes == 4
    f.close()


def test_partial_line_is_buffered_until_newline(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "one\ntw")
    f = LogFollower(log)
    assert f.poll() == ["one"]
    append(log, "o")
    assert f.poll() == []
    append(log, "\r\nthree\n")
    assert f.poll() == ["two", "three"]
    f.close()


def test_invalid_utf8_is_replaced_not_raised(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, b"caf\xe9\n")
    f = LogFollower(log)
    assert f.poll() == ["caf\ufffd"]
    f.close()


def test_rename_rotation_drains_old_file_first(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "1\n")
    f = LogFollower(log)
    assert f.poll() == ["1"]
    append(log, "2\n3\n")  # written right before the rotation, not yet read
    os.rename(log, tmp_path / "access.log.1")
    append(tmp_path / "access.log.1", "4\n")  # nginx still writes to the old inode until USR1
    append(log, "5\n")  # logrotate `create` + reopened writer
    assert f.poll() == ["2", "3", "4", "5"]
    append(tmp_path / "access.log.1", "6\n")  # late write, before the writer reopened
    append(log, "7\n")
    assert f.poll() == ["6", "7"]
    assert f.poll() == []  # old file quiet for a poll: closed
    assert f.stats.rotations == 1
    assert f.stats.lines == 7
    f.close()


def test_rotation_with_path_missing_for_a_while(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "1\n")
    f = LogFollower(log)
    assert f.poll() == ["1"]
    os.rename(log, tmp_path / "access.log.1")
    append(tmp_path / "access.log.1", "2\n")
    assert f.poll() == ["2"]  # still reading the held inode
    append(log, "3\n")
    assert f.poll() == ["3"]
    f.close()


def test_copytruncate_restarts_at_zero_without_double_count(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "1\n2\n")
    f = LogFollower(log)
    assert f.poll() == ["1", "2"]
    with open(log, "r+b") as fh:
        fh.truncate(0)
    append(log, "3\n")
    assert f.poll() == ["3"]
    assert f.stats.truncations == 1
    f.close()


def test_truncate_then_refill_past_position_is_noticed(tmp_path: Path) -> None:
    """The file grew back beyond our position before we polled: its start changed."""
    log = tmp_path / "access.log"
    append(log, "aa\n")
    f = LogFollower(log)
    assert f.poll() == ["aa"]
    with open(log, "r+b") as fh:
        fh.truncate(0)
    append(log, "bbbb\ncc\n")
    assert f.poll() == ["bbbb", "cc"]
    assert f.stats.truncations == 1
    f.close()


def test_restart_resumes_from_state(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "state" / "access.json"
    append(log, "1\n2\npart")
    f = LogFollower(log, state_file=state)
    assert f.poll() == ["1", "2"]
    f.close()
    saved = json.loads(state.read_text())
    assert saved["files"][0]["offset"] == 4  # end of the last complete line, not of "part"
    append(log, "ial\n3\n")
    g = LogFollower(log, state_file=state)
    assert "resumed inode" in g.resume_info() and "offset 4" in g.resume_info()
    assert g.poll() == ["partial", "3"]
    g.close()


def test_restart_after_rotation_while_down_drains_rotated_sibling(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "access.state"
    append(log, "1\n")
    f = LogFollower(log, state_file=state)
    assert f.poll() == ["1"]
    f.close()
    append(log, "2\n")  # written while the exporter was down, then rotated away
    os.rename(log, tmp_path / "access.log.1")
    append(log, "3\n")
    g = LogFollower(log, state_file=state)
    info = g.resume_info()
    assert "draining rotated" in info and "access.log.1" in info
    assert sorted(g.poll()) == ["2", "3"]
    assert g.stats.rotations == 1
    g.close()


def test_replaced_file_with_same_size_starts_fresh(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "access.state"
    append(log, "aaaa\n")
    f = LogFollower(log, state_file=state)
    assert f.poll() == ["aaaa"]
    f.close()
    # rewrite in place: same inode, same length, other bytes
    log.write_bytes(b"bbbb\ncc\n")
    g = LogFollower(log, state_file=state)
    assert "replaced file" in g.resume_info()
    assert g.poll() == ["bbbb", "cc"]
    g.close()


def test_replaced_file_new_inode_starts_fresh(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "access.state"
    append(log, "aaaa\n")
    f = LogFollower(log, state_file=state)
    f.poll()
    f.close()
    os.rename(log, tmp_path / "kept-elsewhere")  # keeps the old inode alive: no reuse
    append(log, "new\n")
    g = LogFollower(log, state_file=state)
    info = g.resume_info()
    assert "is gone or no longer matches" in info and "reading it from offset 0" in info
    assert g.poll() == ["new"]
    g.close()


def test_truncated_while_down_starts_fresh(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "access.state"
    append(log, "aaaa\nbbbb\n")
    f = LogFollower(log, state_file=state)
    f.poll()
    f.close()
    with open(log, "r+b") as fh:
        fh.truncate(0)
    append(log, "c\n")
    g = LogFollower(log, state_file=state)
    assert "truncated" in g.resume_info()
    assert g.poll() == ["c"]
    g.close()


def test_corrupt_state_file_is_reported_not_raised(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "access.state"
    append(log, "x\n")
    state.write_text("{not json")
    g = LogFollower(log, state_file=state)
    assert "unreadable" in g.resume_info()
    assert g.poll() == ["x"]
    g.close()
    assert json.loads(state.read_text())["files"][0]["offset"] == 2


def test_oversized_line_is_dropped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "ok\n" + "x" * 100 + "\nfine\n")
    f = LogFollower(log, max_line_bytes=10)
    assert f.poll() == ["ok", "fine"]
    assert f.stats.oversized_lines == 1
    # an oversized line arriving in pieces never sits whole in memory
    append(log, "y" * 8)
    assert f.poll() == []
    append(log, "y" * 8)
    assert f.poll() == []
    cur = f._cur  # noqa: SLF001 - the bound is the point
    assert cur is not None and len(cur.buf) == 0 and cur.discarding
    append(log, "yy\nafter\n")
    assert f.poll() == ["after"]
    assert f.stats.oversized_lines == 2
    f.close()


def test_missing_file_appearing_later(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    f = LogFollower(log, from_start=False)
    assert "does not exist yet" in f.resume_info()
    assert f.poll() == []
    append(log, "first\n")
    assert f.poll() == ["first"]  # a file that appears later is read from its start
    f.close()


def test_max_poll_bytes_splits_backlog(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "".join(f"{i:03d}\n" for i in range(100)))
    f = LogFollower(log, max_poll_bytes=40)
    got: list[str] = []
    for _ in range(20):
        got += f.poll()
    assert got == [f"{i:03d}" for i in range(100)]
    assert not f.behind
    f.close()


async def test_follow_loop_delivers_lines_and_stops(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "a\nb\n")
    f = LogFollower(log)
    got: list[str] = []
    stop = asyncio.Event()

    def on_lines(follower: LogFollower, lines: list[str]) -> None:
        assert follower is f
        got.extend(lines)
        if len(got) >= 3:
            stop.set()
        elif lines:
            append(log, "c\n")

    await asyncio.wait_for(follow([f], on_lines, interval=0.01, stop=stop), timeout=10)
    assert got == ["a", "b", "c"]
    f.close()


@pytest.mark.parametrize("n_rotations", [1, 3])
def test_many_rotations_lose_nothing(tmp_path: Path, n_rotations: int) -> None:
    log = tmp_path / "access.log"
    f = LogFollower(log)
    written, got = 0, []
    for r in range(n_rotations):
        for _ in range(5):
            append(log, f"{written}\n")
            written += 1
        got += f.poll()
        append(log, f"{written}\n")
        written += 1
        os.replace(log, tmp_path / f"access.log.{r}")
    append(log, f"{written}\n")
    written += 1
    got += f.poll() + f.poll()
    assert sorted(map(int, got)) == list(range(written))
    f.close()


def test_fifo_or_directory_at_path_neither_hangs_nor_raises(tmp_path: Path) -> None:
    fifo, directory = tmp_path / "fifo.log", tmp_path / "dir.log"
    os.mkfifo(fifo)
    directory.mkdir()
    for path in (fifo, directory):
        f = LogFollower(path)
        assert f.poll() == [] and f.poll() == []
        assert f.stats.open_errors == 3  # at start and at each poll, logged once
        f.close()


def test_stats_since_gives_per_poll_deltas(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "a\n" + "x" * 50 + "\n")
    f = LogFollower(log, max_line_bytes=10)
    before = f.stats.snapshot()
    f.poll()
    d = f.stats.since(before)
    assert (d.lines, d.oversized_lines, d.bytes) == (1, 1, 53)
    assert before.lines == 0  # the snapshot did not move
    f.close()


# ---------------------------------------------------------------- copytruncate, rotations while down, history


def gzip_file(src: Path, dst: Path) -> None:
    """``gzip`` as logrotate's compress does it: a new file (new inode), the plain one removed."""
    import gzip

    with open(src, "rb") as fi, gzip.open(dst, "wb") as fo:
        fo.write(fi.read())
    src.unlink()


def copytruncate(log: Path, copy: Path) -> None:
    import shutil

    shutil.copyfile(log, copy)
    with open(log, "r+b") as fh:
        fh.truncate(0)


@pytest.mark.parametrize("compress", [False, True])
def test_copytruncate_reads_unread_lines_from_the_copy(tmp_path: Path, compress: bool) -> None:
    log = tmp_path / "access.log"
    append(log, "1\n2\n")
    f = LogFollower(log)
    assert f.poll() == ["1", "2"]
    append(log, "3\n4\n")  # written after our last read, then copied and truncated
    copytruncate(log, tmp_path / "access.log.1")
    if compress:  # logrotate compress without delaycompress: the copy is gzipped at once
        gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    append(log, "5\n")
    assert f.poll() == ["3", "4", "5"]
    assert f.poll() + f.poll() == []
    assert (f.stats.truncations, f.stats.unrecovered) == (1, 0)
    f.close()


def test_copytruncate_picks_the_copy_by_content_not_by_name(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(tmp_path / "access.log.1", "older rotation\n")  # an older copy: must not be read
    append(log, "a\n")
    f = LogFollower(log)
    assert f.poll() == ["a"]
    append(log, "b\n")
    os.rename(tmp_path / "access.log.1", tmp_path / "access.log.2")
    copytruncate(log, tmp_path / "access.log.1")
    assert f.poll() == ["b"]
    f.close()


def test_truncate_and_refill_with_the_same_first_bytes_is_noticed(tmp_path: Path) -> None:
    """Refilled past our position before the next poll, starting with the same 300 bytes: only
    the bytes just before our offset tell."""
    log = tmp_path / "access.log"
    first = "h" * 300
    append(log, f"{first}\nold-1\n")
    f = LogFollower(log)
    assert f.poll() == [first, "old-1"]
    append(log, "old-2\n")
    copytruncate(log, tmp_path / "access.log.1")
    append(log, f"{first}\nnew-1-longer\nnew-2\n")
    assert f.poll() == ["old-2", first, "new-1-longer", "new-2"]
    assert f.stats.truncations == 1
    f.close()


def test_truncation_without_copy_is_counted_as_unrecovered(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, "a\n")
    f = LogFollower(log)
    f.poll()
    append(log, "lost\n")
    with open(log, "r+b") as fh:
        fh.truncate(0)
    append(log, "b\n")
    assert f.poll() == ["b"]
    assert (f.stats.truncations, f.stats.unrecovered) == (1, 1)
    f.close()


def _run_then_stop(log: Path, state: Path, lines: str) -> list[str]:
    append(log, lines)
    f = LogFollower(log, state_file=state)
    got = f.poll()
    f.close()
    return got


def test_copytruncate_while_down_reads_the_copy_then_the_file(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    assert _run_then_stop(log, state, "1\n2\n") == ["1", "2"]
    append(log, "3\n4\n")  # while down
    copytruncate(log, tmp_path / "access.log.1")
    append(log, "5\n")
    g = LogFollower(log, state_file=state)
    assert "draining rotated" in g.resume_info() and "access.log.1" in g.resume_info()
    assert g.poll() == ["3", "4", "5"]
    g.close()


def test_rename_with_immediate_gzip_while_down(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    _run_then_stop(log, state, "1\n")
    append(log, "2\n3\n")
    os.rename(log, tmp_path / "access.log.1")
    gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    append(log, "4\n")
    g = LogFollower(log, state_file=state)
    assert "access.log.1.gz" in g.resume_info()
    assert g.poll() == ["2", "3", "4"]
    assert g.stats.rotations == 1
    g.close()


def test_two_rotations_while_down_read_the_middle_file_whole(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    _run_then_stop(log, state, "1\n")
    append(log, "2\n")
    os.rename(log, tmp_path / "access.log.1")
    append(log, "3\n")  # a whole file written while down ...
    os.rename(tmp_path / "access.log.1", tmp_path / "access.log.2")
    gzip_file(tmp_path / "access.log.2", tmp_path / "access.log.2.gz")
    os.rename(log, tmp_path / "access.log.1")  # ... and rotated too
    append(log, "4\n")
    g = LogFollower(log, state_file=state)
    assert g.poll() == ["2", "3", "4"]
    assert g.stats.rotations == 2
    g.close()


def test_inode_reused_by_the_new_file_while_down(tmp_path: Path) -> None:
    """The rotated file was gzipped (its inode freed) and the new log got the same inode: to
    the follower, the same inode with other content. Simulated by rewriting in place."""
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    _run_then_stop(log, state, "old-1\n")
    append(log, "old-2\n")
    with open(tmp_path / "access.log.1.gz", "wb") as out:
        import gzip

        out.write(gzip.compress(log.read_bytes()))
    ino = log.stat().st_ino
    with open(log, "r+b") as fh:  # same inode, new content longer than the saved offset
        fh.truncate(0)
        fh.write(b"new-1-is-longer\n")
    assert log.stat().st_ino == ino
    g = LogFollower(log, state_file=state)
    assert "reusing the inode" in g.resume_info()
    assert g.poll() == ["old-2", "new-1-is-longer"]
    g.close()


def test_restart_in_the_middle_of_a_gzipped_rotation(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    _run_then_stop(log, state, "0\n")
    append(log, "".join(f"{i:03d}\n" for i in range(1, 100)))
    os.rename(log, tmp_path / "access.log.1")
    gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    append(log, "new\n")
    g = LogFollower(log, state_file=state, max_poll_bytes=40)
    got = g.poll() + g.poll()
    g.close()  # stopped half-way through the .gz
    h = LogFollower(log, state_file=state)
    got += h.poll() + h.poll()
    assert got == [f"{i:03d}" for i in range(1, 100)] + ["new"]
    h.close()


def test_first_start_at_end_then_restarts_resume(tmp_path: Path) -> None:
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    append(log, "old\n")
    f = LogFollower(log, state_file=state, from_start=False)
    assert f.poll() == [] and f.stats.skipped_bytes == 4
    f.close()
    append(log, "new\n")
    g = LogFollower(log, state_file=state, from_start=False)
    assert g.poll() == ["new"] and g.stats.skipped_bytes == 0
    g.close()


def test_rotated_siblings_order_and_gzip_in_progress(tmp_path: Path) -> None:
    from promreflex.follow import rotated_siblings

    for name in ["access.log", "access.log.1", "access.log.2.gz", "access.log.10.gz", "access.log.3",
                 "access.log.3.gz", "access.log.json", "access.logger", "other.log.1"]:
        append(tmp_path / name, "x\n")
    names = [p.name for p in rotated_siblings(tmp_path / "access.log")]
    assert names == ["access.log.10.gz", "access.log.3", "access.log.2.gz", "access.log.1"]
    for name in ["a.log-20240101.gz", "a.log-20240102"]:
        append(tmp_path / name, "x\n")
    os.utime(tmp_path / "a.log-20240101.gz", (1_700_000_000, 1_700_000_000))
    assert [p.name for p in rotated_siblings(tmp_path / "a.log")] == ["a.log-20240101.gz", "a.log-20240102"]


def test_read_lines_reads_plain_and_gzip_and_refuses_binary(tmp_path: Path) -> None:
    import gzip

    from promreflex.follow import NotTextError, check_text, read_lines

    plain, gz, junk, bz = tmp_path / "a.log", tmp_path / "a.log.1.gz", tmp_path / "junk", tmp_path / "a.log.2.bz2"
    plain.write_bytes(b"1\r\n2\nlast-no-newline")
    gz.write_bytes(gzip.compress(b"3\n4\n"))
    junk.write_bytes(bytes(range(256)) * 40)
    bz.write_bytes(b"BZh91AY&SY" + bytes(100))
    assert [ln for batch in read_lines(plain) for ln in batch] == ["1", "2", "last-no-newline"]
    assert [ln for batch in read_lines(gz) for ln in batch] == ["3", "4"]
    problem = check_text(gz, allow_gzip=False)
    assert problem is not None and "gzip" in problem
    for bad, word in [(junk, "not text"), (bz, "bzip2")]:
        with pytest.raises(NotTextError, match=word):
            next(read_lines(bad))
    gz_junk = tmp_path / "b.gz"
    gz_junk.write_bytes(gzip.compress(bytes(range(256)) * 40))
    with pytest.raises(NotTextError, match="gzip-compressed, and not text"):
        next(read_lines(gz_junk))


class _Writer:
    """A writer like nginx: keeps its log open (O_APPEND) until told to reopen."""

    def __init__(self, path: Path) -> None:
        self.path, self.n = path, 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, k: int) -> None:
        os.write(self.fd, "".join(f"line {self.n + i} {'x' * (i % 37)}\n" for i in range(k)).encode())
        self.n += k

    def reopen(self) -> None:
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def test_rotation_sequence_in_process_counts_every_line_once(tmp_path: Path) -> None:
    """The torture sequence without nginx: rotations while reading (with unread lines in
    flight) and while stopped, restarts, inode reuse; lines read = lines in every file left."""
    import re
    import subprocess

    log, state = tmp_path / "access.log", tmp_path / "st.json"
    w = _Writer(log)
    got: list[str] = []

    def shift() -> None:
        for n, p in sorted(((int(p.name.split(".")[2]), p) for p in tmp_path.glob("access.log.*")), reverse=True):
            p.rename(p.with_name(p.name.replace(f"access.log.{n}", f"access.log.{n + 1}", 1)))

    def rotate(kind: str) -> None:
        shift()
        if kind == "copytruncate":
            copytruncate(log, tmp_path / "access.log.1")
            return
        log.rename(tmp_path / "access.log.1")
        if kind == "reuse":  # gzip before the writer reopens: the new log may get the freed inode
            gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
            w.reopen()
            return
        w.write(3)  # still writing to the renamed file
        w.reopen()
        if kind == "gzip":
            gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")

    f = LogFollower(log, state_file=state, drain_grace=0)
    for kind in ["rename", "gzip", "copytruncate"]:  # while running, unread lines in flight
        w.write(20)
        got += f.poll()
        w.write(20)
        rotate(kind)
        w.write(20)
        got += f.poll() + f.poll()
    for kind in ["rename", "gzip", "copytruncate", "reuse", "two"]:  # while stopped
        w.write(20)
        got += f.poll()
        f.close()
        w.write(20)
        rotate("reuse" if kind == "two" else kind)
        w.write(20)
        if kind == "two":
            rotate("rename")
            w.write(20)
        f = LogFollower(log, state_file=state, drain_grace=0)
        got += f.poll() + f.poll() + f.poll()
    f.close()
    files = sorted(str(p) for p in tmp_path.glob("access.log*"))
    logged = subprocess.run(["zcat", "-f", *files], capture_output=True, check=True).stdout.decode().splitlines()
    numbers = sorted(int(re.match(r"line (\d+)", ln).group(1)) for ln in got)  # type: ignore[union-attr]
    assert numbers == list(range(w.n)) and len(logged) == w.n
    os.close(w.fd)


def test_restart_half_way_through_a_gzip_rotated_while_down(tmp_path: Path) -> None:
    """Two rotations while down, the middle file gzipped and read from 0: a second restart in
    the middle of it resumes there."""
    log, state = tmp_path / "access.log", tmp_path / "st.json"
    _run_then_stop(log, state, "0\n")
    os.rename(log, tmp_path / "access.log.2")
    append(log, "".join(f"{i:04d}\n" for i in range(1, 3000)))  # written whole while down
    os.rename(log, tmp_path / "access.log.1")
    gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    append(log, "new\n")
    g = LogFollower(log, state_file=state, max_poll_bytes=5000)
    got = g.poll()
    g.close()
    h = LogFollower(log, state_file=state)
    assert "access.log.1.gz" in h.resume_info()
    got += h.poll() + h.poll()
    assert got == [f"{i:04d}" for i in range(1, 3000)] + ["new"]
    h.close()


def _reading(log: Path, read: int, unread: int) -> tuple[_Writer, LogFollower, list[str]]:
    """A writer and a follower that has read ``read`` lines, ``unread`` more written since."""
    w = _Writer(log)
    f = LogFollower(log, drain_grace=0)
    w.write(read)
    got = f.poll()
    w.write(unread)
    return w, f, got


def _every_line_once(f: LogFollower, w: _Writer, got: list[str]) -> None:
    """Poll until nothing is left (draining included), then: every line written, each once."""
    for _ in range(4):
        got += f.poll()
    assert sorted(int(ln.split()[1]) for ln in got) == list(range(w.n))
    f.close()
    os.close(w.fd)


@pytest.mark.parametrize("second", ["rename", "gzip", "copytruncate"])
@pytest.mark.parametrize("first_gzip", [False, True])
def test_two_rotations_between_polls_read_the_file_between(tmp_path: Path, first_gzip: bool, second: str) -> None:
    """The torture test's failure (CI, 2026-11-26): a reader stopped (SIGSTOP, a starved CPU)
    across two rotations saw only the newest file: the one between, rotated away and gzipped
    without a line read from it, was lost (900 lines). Every line is read exactly once."""
    log = tmp_path / "access.log"
    w, f, got = _reading(log, 10, 5)  # in flight in the held file
    # first rotation: rename (+ gzip at once), the writer reopens
    log.rename(tmp_path / "access.log.1")
    w.write(3)
    w.reopen()
    w.write(7)  # the file between: no poll ever holds it
    if first_gzip:
        gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    # second rotation, still no poll
    for p in sorted(tmp_path.glob("access.log.*"), reverse=True):
        n = int(p.name.split(".")[2])
        p.rename(p.with_name(p.name.replace(f"access.log.{n}", f"access.log.{n + 1}", 1)))
    if second == "copytruncate":
        copytruncate(log, tmp_path / "access.log.1")
    else:
        log.rename(tmp_path / "access.log.1")
        w.write(2)
        w.reopen()
        if second == "gzip":
            gzip_file(tmp_path / "access.log.1", tmp_path / "access.log.1.gz")
    w.write(4)
    _every_line_once(f, w, got)


def test_an_older_file_compressed_after_the_rotation_is_not_read_again(tmp_path: Path) -> None:
    """Date-named rotations are ordered by modification time; a sibling rotated BEFORE the held
    file but compressed after it (a fresh timestamp) must not count as a file rotated since."""
    log = tmp_path / "access.log"
    old = tmp_path / "access.log-20261124"
    old.write_text("".join(f"line {i}\n" for i in range(100, 105)))  # read by an earlier reader
    os.utime(old, ns=(1, 1))
    w, f, got = _reading(log, 6, 2)
    log.rename(tmp_path / "access.log-20261125")
    w.reopen()
    w.write(3)
    held_written = (tmp_path / "access.log-20261125").stat().st_mtime_ns
    gzip_file(old, tmp_path / "access.log-20261124.gz")  # delaycompress: the older one, now
    os.utime(tmp_path / "access.log-20261124.gz", ns=(held_written + 10**9, held_written + 10**9))
    _every_line_once(f, w, got)


@pytest.mark.parametrize("delaycompress", [False, True])
def test_two_rotations_between_polls_with_date_names(tmp_path: Path, delaycompress: bool) -> None:
    """The same with logrotate's ``dateext`` names (ordered by time, checked by name). With
    ``delaycompress`` the held file is gzipped at the second rotation: it then has the newest
    timestamp, and the file between is older than it by time but not by name."""
    log = tmp_path / "access.log"
    w, f, got = _reading(log, 4, 2)
    log.rename(tmp_path / "access.log-20261125")
    w.reopen()
    w.write(5)
    log.rename(tmp_path / "access.log-20261126")
    w.reopen()
    if delaycompress:
        gzip_file(tmp_path / "access.log-20261125", tmp_path / "access.log-20261125.gz")
    else:
        gzip_file(tmp_path / "access.log-20261126", tmp_path / "access.log-20261126.gz")
    w.write(3)
    _every_line_once(f, w, got)


@pytest.mark.parametrize("names", [(".20261124", ".20261125", ".20261126"),  # dateformat .%Y%m%d
                                   ("-29112026", "-30112026", "-01122026")])  # -%d%m%Y: not text order at a month's end
def test_one_rotation_a_day_with_delaycompress_reads_each_line_once(tmp_path: Path, names: tuple[str, ...]) -> None:
    """Daily rotations with ``delaycompress``: at each rotation the previous day's file is
    gzipped (a fresh timestamp, a name that may sort after the new one): it was read already."""
    log = tmp_path / "access.log"
    w, f, got = _reading(log, 3, 2)
    prev = None
    for name in names:
        got += f.poll()
        log.rename(tmp_path / f"access.log{name}")
        w.reopen()
        if prev is not None:
            gzip_file(tmp_path / f"access.log{prev}", tmp_path / f"access.log{prev}.gz")
        prev = name
        w.write(4)
        got += f.poll()
        w.write(1)
    _every_line_once(f, w, got)


def test_a_held_file_rotated_away_and_deleted_unseen_is_a_counted_loss(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """``rotate 1`` and two rotations between polls: the held file is deleted and the one
    between is ``.1``. Nothing says which siblings are newer, so none is read: warned about and
    counted in ``unrecovered``, never silent."""
    log = tmp_path / "access.log"
    w, f, got = _reading(log, 3, 0)
    log.rename(tmp_path / "access.log.1")
    w.reopen()
    w.write(4)
    (tmp_path / "access.log.1").unlink()  # rotate 1: the held file goes
    log.rename(tmp_path / "access.log.1")
    w.reopen()
    w.write(2)
    with caplog.at_level("WARNING"):
        got += f.poll() + f.poll()
    assert f.stats.unrecovered == 1 and "cannot be placed" in caplog.text
    f.close()
    os.close(w.fd)


def test_a_rotated_file_written_to_long_after_the_rename_is_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's review: logrotate's postrotate running `nginx -s reload` (not USR1) leaves the
    old workers writing the rotated file until their last requests end; a 5 s request's line
    came after the follower had closed the file (quiet for 1 s) and was lost, uncounted."""
    clock = fake_clock(monkeypatch)
    log = tmp_path / "access.log"
    append(log, "1\n")
    f = LogFollower(log)
    assert f.poll() == ["1"]
    os.rename(log, tmp_path / "access.log.1")
    append(log, "2\n")  # the new workers' file
    assert f.poll() == ["2"]
    for _ in range(10):  # the old worker still serves its slow request: a minute of quiet polls
        clock["t"] += 6.0
        assert f.poll() == []
    append(tmp_path / "access.log.1", "slow\n")  # then it ends and is logged where that worker writes
    assert f.poll() == ["slow"]
    clock["t"] += 301.0
    assert f.poll() == [] and f.stats.lines == 3
    append(tmp_path / "access.log.1", "never\n")  # after the grace the file is let go
    assert f.poll() == []
    f.close()


def test_two_copytruncates_between_polls_read_the_copy_between(tmp_path: Path) -> None:
    """A stranger's review: a reader stopped (SIGSTOP, a starved CPU) across two copytruncate
    rotations read the copy holding its offset and then the live file: the copy made by the
    second rotation (what was written between the two) was skipped, uncounted."""
    log = tmp_path / "access.log"
    append(log, "1\n2\n")
    f = LogFollower(log)
    assert f.poll() == ["1", "2"]
    append(log, "3\n")
    copytruncate(log, tmp_path / "access.log.1")
    os.rename(tmp_path / "access.log.1", tmp_path / "access.log.2")  # the second rotation shifts it
    append(log, "4\n5\n")
    copytruncate(log, tmp_path / "access.log.1")
    append(log, "6\n")
    assert f.poll() == ["3", "4", "5", "6"]
    assert f.poll() + f.poll() == []
    assert (f.stats.truncations, f.stats.unrecovered) == (2, 0)
    f.close()


def test_a_state_file_that_cannot_be_written_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A stranger's review: with the state directory's disk full, every poll of every log logged a
    warning (4 a second per log), into a journal on that same full disk."""
    import logging

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = tmp_path / "access.log"
    f = LogFollower(log, state_file=blocker / "state.json")
    with caplog.at_level(logging.WARNING, logger="promreflex.follow"):
        for i in range(20):
            append(log, f"{i}\n")
            assert f.poll() == [str(i)]
    warned = [r for r in caplog.records if "cannot write follow state" in r.getMessage()]
    assert len(warned) == 1 and f.stats.state_write_errors >= 20
    f.close()


def test_deleted_rotated_files_are_let_go_sooner_and_never_piled_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review of the 5-minute drain: `rotate 0` (or size rotations) deleted each rotated file
    at once, and the follower held every one open for 5 minutes, their disk not freed, one
    descriptor per rotation with no bound."""
    import promreflex.follow as follow_mod

    clock = fake_clock(monkeypatch)
    log = tmp_path / "access.log"
    append(log, "0\n")
    f = LogFollower(log)
    assert f.poll() == ["0"]
    got: list[str] = []
    for i in range(1, 41):  # 40 rotations, each rotated file deleted at once
        append(log, f"{i}\n")
        os.rename(log, tmp_path / "access.log.1")
        os.unlink(tmp_path / "access.log.1")
        append(log, "")
        got += f.poll()
        clock["t"] += 1.0
        got += f.poll()
        assert len(f._draining) <= follow_mod.MAX_DRAINING
    assert got == [str(i) for i in range(1, 41)]
    clock["t"] += follow_mod.DELETED_GRACE_S + 1
    f.poll()
    f.poll()
    assert f._draining == []
    f.close()


def test_a_log_path_that_is_a_link_finds_the_copies_rotated_beside_its_file(tmp_path: Path) -> None:
    """/var/log/nginx/shop.log -> /srv/shop/logs/access.log: logrotate rotates the target's path
    (it refuses a link), so the copies are beside the file, not the link. They were looked for
    beside the link: a restart across a rotation lost the rest (a review), and --backfill read
    only the live file."""
    from exporters.accesslog.backfill import rotated_set
    from promreflex.follow import rotated_siblings

    real, links = tmp_path / "srv", tmp_path / "var"
    real.mkdir()
    links.mkdir()
    target, log, state = real / "access.log", links / "shop.log", tmp_path / "st.json"
    append(target, "1\n")
    log.symlink_to(target)
    f = LogFollower(log, state_file=state)
    assert f.poll() == ["1"]
    f.close()
    append(target, "2\n")  # written while the exporter was down, then rotated away
    os.rename(target, real / "access.log.1")
    append(target, "3\n")
    g = LogFollower(log, state_file=state)
    assert sorted(g.poll()) == ["2", "3"] and g.stats.unrecovered == 0
    g.close()
    assert rotated_siblings(log) == [real / "access.log.1"]
    assert rotated_set(log) == [real / "access.log.1", log]


def test_a_first_start_at_the_end_while_a_line_is_being_written_reads_that_line_whole(tmp_path: Path) -> None:
    """The rest of a half-written last line, read alone, was a rejected line for a request
    that was served (a review)."""
    log = tmp_path / "access.log"
    line = '10.0.0.1 - - [28/Nov/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "x"'
    append(log, line + "\n" + line[:30])
    f = LogFollower(log, from_start=False)
    assert f.poll() == [] and f.stats.skipped_bytes == len(line) + 1
    append(log, line[30:] + "\n")
    assert f.poll() == [line]
    f.close()
    alone = tmp_path / "one.log"  # a file that holds only the line being written
    append(alone, line[:30])
    g = LogFollower(alone, from_start=False)
    assert g.poll() == [] and g.stats.skipped_bytes == 0
    append(alone, line[30:] + "\n")
    assert g.poll() == [line]
    g.close()
    # A fragment left long ago (a writer killed, a full disk) is dead: the next line is not glued to it
    dead = tmp_path / "dead.log"
    append(dead, line + "\n" + line[:30])
    os.utime(dead, (time.time() - 60, time.time() - 60))
    h = LogFollower(dead, from_start=False)
    assert h.poll() == [] and h.stats.skipped_bytes == len(line) + 1 + 30
    append(dead, line + "\n")
    assert h.poll() == [line]
    h.close()
