"""The controller's state store: group commits with the fsync off the event loop, and a failed
commit (a full disk) that is written again by the next one, so memory and disk agree once
writing works."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading

import pytest

from controllers.store import StateStore


async def test_concurrent_commits_share_transactions_and_fsync_off_the_loop(tmp_path, monkeypatch):
    store = StateStore(tmp_path / "s.db")
    real = store._conn
    begins = 0
    fsyncs: list[int] = []
    real_fsync = os.fsync

    class Spy:
        def execute(self, sql, params=()):
            nonlocal begins
            begins += sql == "BEGIN"
            return real.execute(sql, params)

        def executemany(self, sql, rows):
            return real.executemany(sql, rows)

    def fsync(fd):
        fsyncs.append(threading.get_ident())
        real_fsync(fd)

    store._conn = Spy()  # type: ignore[assignment]
    monkeypatch.setattr("controllers.store.os.fsync", fsync)

    async def one(n: int) -> None:
        store.put_last_fire("r", f"t{n}", float(n))
        await asyncio.sleep(0.001 * (n % 7))
        await store.commit()

    await asyncio.gather(*(one(n) for n in range(500)))
    store._conn = real
    store.close()
    assert 1 <= begins < 100  # group commits: far fewer transactions than callers
    assert 1 <= len(fsyncs) <= begins and threading.get_ident() not in fsyncs  # never on the event loop
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*) FROM last_fire").fetchone()[0] == 500


async def test_a_failed_commit_is_written_again_by_the_next(tmp_path):
    store = StateStore(tmp_path / "s.db")
    store.put_last_fire("r", "warm", 1.0)
    await store.commit()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count={pages}")  # the disk is full
    store.put_entry("r", "fp", "{}" + " " * 20000, "firing", "resolved", None)
    with pytest.raises(sqlite3.Error, match="full"):
        await store.commit()
    store._conn.execute("PRAGMA max_page_count=1000000")  # space again
    await store.commit()  # nothing new queued: the failed statements are written now
    store.close()
    loaded = StateStore(tmp_path / "s.db").load(seen_since=0)
    assert [(e["route"], e["fingerprint"], e["desired"]) for e in loaded.entries] == [("r", "fp", "firing")]
