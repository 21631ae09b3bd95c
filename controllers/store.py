"""The controller's durable state: one SQLite database in WAL mode, fsynced off the event loop.

What it holds (``controller.state_file``):

- ``entries``: per (route, alert fingerprint) the alert, its desired and applied state
  (``firing``, ``resolved``, or ``unknown`` after a run that may have done part of its work),
  and the transition in flight (the *intent*, written and committed before an action runs);
- ``bindings``: per route name the route as configured when its entries were applied (action,
  params, timeout, ...), so that a start with a configuration that removed the route, or
  changed its action, still resolves them with what applied them;
- ``latest``: per fingerprint the newest (startsAt, status) seen, the ordering memory;
- ``seen``: the dedupe keys (fingerprint, status, startsAt) delivered within ``dedupe_window``;
- ``last_fire``: per (route, target) when a fire last ran, for cooldowns.

How a write becomes durable, and why the work is split this way: callers queue statements
(``put_*``/``update_*``/``delete_*``) and await :meth:`StateStore.commit`. Every commit of one
event-loop iteration shares one transaction, run at the end of that iteration: only the rows
that changed, a few microseconds each (never the whole state), written into the WAL in the OS
page cache (``synchronous=NORMAL``). From then on a SIGKILL loses nothing. Before any waiter is
answered, a syncer thread fsyncs the WAL (one fsync for every transaction committed before it
began: group commit), so a power cut loses nothing answered either. The fsync and the
checkpoints are the slow part and run off the event loop; the statements themselves run on it
because handing thousands of rows to a writer thread costs more under the GIL than running
them (measured: 25,000 statements of a 5,000-alert burst took 1.8 s of writer-thread time
against 0.4-0.5 s on the loop).

Start-up problems a user can fix (a file that is not a readable SQLite database, one written
by another program, no permission) raise :class:`promreflex.errors.UserError` with one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby
from operator import itemgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promreflex.errors import UserError

log = logging.getLogger("promreflex.controller")

SCHEMA_VERSION = 2
CHECKPOINT_BYTES = 4 * 1024 * 1024
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    route TEXT NOT NULL, fingerprint TEXT NOT NULL, alert TEXT NOT NULL,
    desired TEXT NOT NULL, applied TEXT NOT NULL, inflight TEXT,
    PRIMARY KEY (route, fingerprint));
CREATE TABLE IF NOT EXISTS latest (
    fingerprint TEXT PRIMARY KEY, starts_at TEXT NOT NULL, status TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS seen (
    fingerprint TEXT NOT NULL, status TEXT NOT NULL, starts_at TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (fingerprint, status, starts_at));
CREATE INDEX IF NOT EXISTS seen_at ON seen (at);
CREATE TABLE IF NOT EXISTS last_fire (
    route TEXT NOT NULL, target TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (route, target));
CREATE TABLE IF NOT EXISTS bindings (name TEXT PRIMARY KEY, binding TEXT NOT NULL);
"""
#: What turns a database of schema version N into N + 1 (each run in one transaction with the
#: version's update). 1 -> 2: the bindings table (created by SCHEMA already, as for a new file).
MIGRATIONS = {1: "CREATE TABLE IF NOT EXISTS bindings (name TEXT PRIMARY KEY, binding TEXT NOT NULL);"}


@dataclass
class Loaded:
    """Everything the engine needs to resume, read once at start."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    latest: list[tuple[str, str, str, float]] = field(default_factory=list)
    seen: list[tuple[str, str, str, float]] = field(default_factory=list)
    last_fire: list[tuple[str, str, float]] = field(default_factory=list)
    bindings: dict[str, str] = field(default_factory=dict)  # route name -> its binding (JSON)


def _unusable(path: Path, why: str) -> UserError:
    return UserError(
        f"controller state {path} is unusable ({why}); fix or move it aside "
        "(the controller then starts with no applied state and reconciles with Alertmanager)"
    )


class StateStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        legacy = self._legacy_json()
        self._conn = self._open()
        self._pending: list[tuple[str, tuple[Any, ...]]] = []
        self._carry: list[tuple[str, tuple[Any, ...]]] = []
        self._batch_done: asyncio.Future[None] | None = None
        self._unsynced: list[asyncio.Future[None]] = []
        self._syncing: asyncio.Task[None] | None = None
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="promreflex-state-sync")
        self._checkpointer: sqlite3.Connection | None = None
        self._closed = False
        if legacy is not None:
            self._import_legacy(*legacy)

    # ------------------------------------------------------------------ opening
    def _legacy_json(self) -> tuple[Path, dict[str, Any]] | None:
        """An old JSON state file (before the database) at the configured path, or beside it
        with a ``.json`` suffix while the database does not exist yet: read once, renamed to
        ``*.migrated``, its applied alerts and cooldowns imported."""
        candidates = [self.path]
        if not self.path.exists() and self.path.suffix != ".json":
            candidates.append(self.path.with_suffix(".json"))
        for candidate in candidates:
            try:
                with candidate.open("rb") as f:
                    head = f.read(1)
                    if head != b"{":
                        continue
                    data = json.loads(head + f.read())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as e:
                raise _unusable(candidate, f"an old JSON state file that cannot be read: {e}") from e
            if not isinstance(data, dict):
                raise _unusable(candidate, "an old JSON state file that is not an object")
            aside = candidate.with_name(candidate.name + ".migrated")
            candidate.rename(aside)
            log.warning("imported the old JSON state file %s into %s; the old file is now %s",
                        candidate, self.path, aside.name)
            return aside, data
        return None

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # created private (0600; SQLite gives its -wal and -shm files the database's mode):
            # alert labels are in it; an existing file keeps its mode
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, str(e)) from e
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            # NORMAL: a commit writes the WAL without fsync; _sync then fsyncs it off the event
            # loop before any waiter is answered (FULL would fsync inside the commit, on the loop).
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints: see _fsync_and_checkpoint
            conn.execute(f"PRAGMA journal_size_limit={CHECKPOINT_BYTES}")
            ok = conn.execute("PRAGMA quick_check").fetchone()
            if ok is None or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {ok[0] if ok else 'no answer'}")
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "meta" not in tables:
                raise sqlite3.DatabaseError(f"a SQLite database of another program (tables: {', '.join(sorted(tables))})")
            # One transaction: a process killed here leaves either no schema or all of it.
            conn.executescript(f"BEGIN; {SCHEMA} INSERT OR IGNORE INTO meta VALUES ('schema', '{SCHEMA_VERSION}'); COMMIT;")
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = int(row[0]) if row is not None and str(row[0]).isdigit() else None
            if version is None or version > SCHEMA_VERSION or version < min(MIGRATIONS):
                raise sqlite3.DatabaseError(f"schema version {row and row[0]}, this controller reads "
                                            f"{min(MIGRATIONS)} to {SCHEMA_VERSION}")
            for v in range(version, SCHEMA_VERSION):
                conn.executescript(f"BEGIN; {MIGRATIONS[v]} UPDATE meta SET value = '{v + 1}' WHERE key = 'schema'; COMMIT;")
                log.info("controller state %s: schema version %d -> %d", self.path, v, v + 1)
        except sqlite3.Error as e:
            conn.close()
            raise _unusable(self.path, str(e)) from e
        return conn

    def _import_legacy(self, source: Path, data: dict[str, Any]) -> None:
        with self._conn:
            self._conn.execute("BEGIN")
            for item in data.get("applied", []):
                alert = item.get("alert") or {}
                fp = alert.get("fingerprint") or ""
                if not fp or "route" not in item:
                    continue
                self._conn.execute(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, 'firing', 'firing', NULL)",
                    (item["route"], fp, json.dumps(alert)),
                )
            for key, at in (data.get("last_fire") or {}).items():
                route, _, target = key.partition("\x00")
                self._conn.execute("INSERT OR REPLACE INTO last_fire VALUES (?, ?, ?)", (route, target, float(at)))

    def load(self, seen_since: float) -> Loaded:
        c = self._conn
        out = Loaded()
        for route, fp, alert, desired, applied, inflight in c.execute(
                "SELECT route, fingerprint, alert, desired, applied, inflight FROM entries"):
            out.entries.append({"route": route, "fingerprint": fp, "alert": json.loads(alert), "desired": desired,
                                "applied": applied, "inflight": inflight})
        out.latest = list(c.execute("SELECT fingerprint, starts_at, status, at FROM latest"))
        out.seen = list(c.execute(
            "SELECT fingerprint, status, starts_at, at FROM seen WHERE at >= ? ORDER BY at", (seen_since,)))
        out.last_fire = list(c.execute("SELECT route, target, at FROM last_fire"))
        out.bindings = dict(c.execute("SELECT name, binding FROM bindings"))
        return out

    # ------------------------------------------------------------------ writing
    # Each method queues one statement; the next :meth:`commit` writes it (in call order).
    def put_entry(self, route: str, fingerprint: str, alert_json: str, desired: str, applied: str,
                  inflight: str | None) -> None:
        self._pending.append(("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                              (route, fingerprint, alert_json, desired, applied, inflight)))

    def update_entry(self, route: str, fingerprint: str, desired: str, applied: str, inflight: str | None) -> None:
        self._pending.append(("UPDATE entries SET desired = ?, applied = ?, inflight = ? WHERE route = ? AND fingerprint = ?",
                              (desired, applied, inflight, route, fingerprint)))

    def delete_entry(self, route: str, fingerprint: str) -> None:
        self._pending.append(("DELETE FROM entries WHERE route = ? AND fingerprint = ?", (route, fingerprint)))

    def put_latest(self, fingerprint: str, starts_at: str, status: str, at: float) -> None:
        self._pending.append(("INSERT OR REPLACE INTO latest VALUES (?, ?, ?, ?)", (fingerprint, starts_at, status, at)))

    def delete_latest(self, fingerprint: str) -> None:
        self._pending.append(("DELETE FROM latest WHERE fingerprint = ?", (fingerprint,)))

    def put_seen(self, key: tuple[str, str, str], at: float) -> None:
        self._pending.append(("INSERT OR REPLACE INTO seen VALUES (?, ?, ?, ?)", (*key, at)))

    def delete_seen(self, key: tuple[str, str, str]) -> None:
        self._pending.append(("DELETE FROM seen WHERE fingerprint = ? AND status = ? AND starts_at = ?", key))

    def expire_seen(self, before: float) -> None:
        self._pending.append(("DELETE FROM seen WHERE at < ?", (before,)))

    def put_last_fire(self, route: str, target: str, at: float) -> None:
        self._pending.append(("INSERT OR REPLACE INTO last_fire VALUES (?, ?, ?)", (route, target, at)))

    def put_binding(self, name: str, binding_json: str) -> None:
        self._pending.append(("INSERT OR REPLACE INTO bindings VALUES (?, ?)", (name, binding_json)))

    def delete_binding(self, name: str) -> None:
        self._pending.append(("DELETE FROM bindings WHERE name = ?", (name,)))

    async def commit(self) -> None:
        """Return once every statement queued so far, by anyone, is committed and on disk."""
        if self._closed:
            raise RuntimeError("the state store is closed")
        loop = asyncio.get_running_loop()
        if self._batch_done is None:  # callers of this loop iteration share one transaction
            self._batch_done = loop.create_future()
            loop.call_soon(self._write, loop)
        await asyncio.shield(self._batch_done)

    def _write(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the queued statements in one transaction (in memory and the OS page cache: a
        SIGKILL from here on loses nothing), then hand the fsync to the syncer thread."""
        batch, self._pending = self._pending, []
        fut, self._batch_done = self._batch_done, None
        assert fut is not None
        statements = self._carry + batch
        try:
            self._conn.execute("BEGIN")
            for sql, run in groupby(statements, key=itemgetter(0)):
                self._conn.executemany(sql, [params for _, params in run])
            self._conn.execute("COMMIT")
            self._carry = []
        except Exception as e:  # noqa: BLE001 - every waiter must hear of it, or it waits forever
            log.error("cannot write the controller state %s: %s", self.path, e)
            # Written again, first, by the next commit, so that memory and disk agree once
            # writing works again (every statement is idempotent).
            self._carry = statements
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            fut.set_exception(e)
            fut.exception()  # retrieved: a batch nobody awaits any more must not warn
            return
        self._unsynced.append(fut)
        if self._syncing is None or self._syncing.done():
            self._syncing = loop.create_task(self._sync())

    async def _sync(self) -> None:
        """fsync the WAL for every transaction committed before the fsync began (group commit);
        checkpoint in the same thread now and then, with a connection of its own."""
        loop = asyncio.get_running_loop()
        while self._unsynced:
            waiting, self._unsynced = self._unsynced, []
            try:
                await loop.run_in_executor(self._syncer, self._fsync_and_checkpoint)
            except (OSError, RuntimeError) as e:  # RuntimeError: closed meanwhile
                log.error("cannot sync the controller state %s: %s", self.path, e)
                for fut in waiting:
                    if not fut.done():
                        fut.set_exception(e)
                        fut.exception()
                continue
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)

    def _fsync_and_checkpoint(self) -> None:
        wal = f"{self.path}-wal"
        fd = os.open(wal, os.O_RDONLY)
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > CHECKPOINT_BYTES:
            # PASSIVE never blocks the writer; once all frames are in the database, the next
            # transaction starts the WAL over (and journal_size_limit truncates it).
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self.path, check_same_thread=False)
            try:
                self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as e:
                log.warning("cannot checkpoint the controller state %s: %s", self.path, e)

    def close(self) -> None:
        """Write what is queued (without waiting for a caller), sync, checkpoint, close."""
        if self._closed:
            return
        self._closed = True
        self._syncer.shutdown(wait=True)
        try:
            statements = self._carry + self._pending
            if statements:
                with self._conn:
                    self._conn.execute("BEGIN")
                    for sql, params in statements:
                        self._conn.execute(sql, params)
                self._pending = self._carry = []
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:
            log.error("cannot write the controller state %s: %s", self.path, e)
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._conn.close()
