"""The copy registry: one JSON file per running copy in a directory (default
``.promreflex/copies/``), so the copy-guard action finds every copy it may pause.

A copy registers itself (``promreflex copy``) or is adopted (``promreflex copy-guard adopt``):

    {"id": "...", "kind": "copier" | "adopted", "pid": 1234, "pid_start": 567890,
     "pgid": 1234 | null, "site": "shop", "src": "...", "dst": "...",
     "control_url": "http://127.0.0.1:PORT" | null, "token_file": null, "created": 1.7e9,
     "pause": null | {"method": "cgroup2" | "cgroup1" | "signal", "until": 1.7e9, ...}}

``pid_start`` (the process start time in clock ticks, /proc/PID/stat field 22) guards against
PID reuse: an entry whose process is gone, or whose PID now belongs to another process, is
stale; :meth:`Registry.entries` ignores and removes it. Entries are written atomically; the
``pause`` record of adopted copies is the lease the watchdog enforces (see ``watchdog.py``).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from promreflex.fsutil import atomic_write_json
from promreflex.proc import pid_alive

DEFAULT_DIR = Path(".promreflex/copies")
ID_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (None when it does not exist)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, pid_start: int | None) -> bool:
    """True when ``pid`` is alive and is still the process that was registered."""
    if not pid_alive(pid):
        return False
    return pid_start is None or process_start(pid) == pid_start


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
    pid_start: int | None = None
    pgid: int | None = None  # adopted by process group
    control_url: str | None = None
    token_file: str | None = None
    created: float = field(default_factory=time.time)
    pause: dict[str, Any] | None = None

    def alive(self) -> bool:
        return same_process(self.pid, self.pid_start)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        entry = cls(**known)
        if not ID_RE.match(entry.id) or entry.kind not in ("copier", "adopted") or not isinstance(entry.pid, int):
            raise ValueError(f"bad registry entry {data!r}")
        return entry


class Registry:
    def __init__(self, directory: str | Path = DEFAULT_DIR):
        self.dir = Path(directory)

    def path(self, copy_id: str) -> Path:
        if not ID_RE.match(copy_id):
            raise ValueError(f"bad copy id {copy_id!r}")
        return self.dir / f"{copy_id}.json"

    def add(self, entry: Entry) -> Path:
        # 0700: whoever can write an entry can have the guard stop a process group.
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(entry.id)
        atomic_write_json(path, asdict(entry))
        return path

    update = add

    def remove(self, copy_id: str) -> None:
        try:
            self.path(copy_id).unlink()
        except FileNotFoundError:
            pass

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
