"""LogFollower on real temporary files: growth, partial lines, rotations, truncation, restarts."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from promreflex.follow import LogFollower, follow


def append(path: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, "ab") as f:
        f.write(data)


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
    assert "from its end (offset 4)" in f.resume_info()
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
    assert len(f._cur.buf) == 0 and f._cur.discarding  # noqa: SLF001 - the bound is the point
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
