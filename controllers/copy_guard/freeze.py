"""Pausing copies that promreflex did not start (rsync, cp, tar), by PID or process group.

Three methods, the first the host offers wins (``detect()``):

- ``cgroup2``: a child cgroup ``promreflex-copy-<id>-<digest of the registry>`` of the v2 hierarchy
  (``/sys/fs/cgroup/unified`` on a hybrid layout, ``/sys/fs/cgroup`` on a unified one); the
  processes are moved in and ``cgroup.freeze`` is set to 1. Frozen processes cannot tell, and a
  frozen process group stays frozen even if it forks (the children inherit the cgroup).
- ``cgroup1``: the same with the v1 freezer (``freezer.state`` FROZEN / THAWED).
- ``signal``: SIGSTOP / SIGCONT to the process group (``--pgid``) or to the process and its
  descendants (``--pid``). Works everywhere; a shell that started the copy sees it stopped.

A pause returns a *record* (plain JSON) holding everything needed to undo it, including each
process's original cgroup, so a resume can run in another process (the watchdog) after the
controller died. Resuming moves the processes back to where they were and removes the cgroup.

Throttling by duty cycle: a record with ``duty`` d in (0, 1) and ``period`` P (seconds) asks for
the processes to run d of every P and be frozen the rest (frozen first, from the record's
``since``): :func:`duty_phase` says which phase ``now`` falls in and when it ends, and
:func:`set_frozen` flips the state without moving anything (one write to ``cgroup.freeze`` or
``freezer.state``, or SIGSTOP/SIGCONT). Freezing holds any process, whatever it does (buffered
writes included: it cannot dirty pages while frozen). The watchdog runs the cycle, so it goes
on, and ends at the lease, whatever happens to the controller. ``duty`` 0 (or absent) is a pause.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "promreflex-copy-"
METHODS = ("cgroup2", "cgroup1", "signal")


class PauseError(Exception):
    """No method could pause (or resume) the processes."""


# ---------------------------------------------------------------------- processes
def group_members(pgid: int) -> list[int]:
    """Every live (non-zombie) process of process group ``pgid``."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass  # exited meanwhile
    return sorted(out)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it ([] when ``pid`` is gone)."""
    try:
        proc = psutil.Process(pid)
        return sorted([pid, *(kid.pid for kid in proc.children(recursive=True))])
    except (psutil.NoSuchProcess, ValueError):
        return []


def members(pid: int | None = None, pgid: int | None = None) -> list[int]:
    if pgid is not None:
        return group_members(pgid)
    if pid is not None:
        return descendants(pid)
    raise ValueError("give a pid or a pgid")


# ---------------------------------------------------------------------- cgroups
def v2_root() -> Path | None:
    for root in (CGROUP_ROOT / "unified", CGROUP_ROOT):
        if (root / "cgroup.procs").is_file() and (root / "cgroup.controllers").is_file():
            return root
    return None


def v1_freezer_root() -> Path | None:
    root = CGROUP_ROOT / "freezer"
    return root if (root / "cgroup.procs").is_file() else None


#: The cgroup a watchdog moves itself into (not a copy's: no PREFIX).
WATCHDOG_CGROUP = "promreflex-watchdog"


def leave_parent_cgroup(name: str = WATCHDOG_CGROUP) -> Path | None:
    """Move this process into a cgroup of its own, outside its parent's, where cgroup v2 lets
    us (root); the cgroup, or None (left where it was: the reason is logged by the caller).
    Whatever kills the controller's whole cgroup (``systemctl kill``, ``systemctl stop`` after
    its timeout, an OOM kill of the unit; not a pod's eviction: the pod goes) then spares the watchdog, which
    resumes the adopted copies when their lease ends: killed with the controller, it left two
    backups frozen until the controller was started again (a stranger's review, R4)."""
    root = v2_root()
    if root is None or not os.access(root, os.W_OK):
        return None
    target = root / name
    try:
        target.mkdir(exist_ok=True)
        _write(target / "cgroup.procs", str(os.getpid()))
    except OSError:
        return None
    return target


def _probe(root: Path | None, control: str) -> bool:
    """Can we create a child cgroup here that has ``control``? (removed at once)."""
    if root is None or not os.access(root, os.W_OK):
        return False
    probe = root / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        return (probe / control).is_file()
    except OSError:
        return False
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def detect() -> list[str]:
    """The methods this host offers, best first (``signal`` is always there)."""
    found = []
    if _probe(v2_root(), "cgroup.freeze"):
        found.append("cgroup2")
    if _probe(v1_freezer_root(), "freezer.state"):
        found.append("cgroup1")
    found.append("signal")
    return found


def _cgroup_of(pid: int, hierarchy: str) -> str | None:
    """The cgroup path of ``pid``: hierarchy "" for v2 (line ``0::/x``), "freezer" for v1."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            num, ctrls, path = line.split(":", 2)
            if (hierarchy == "" and num == "0" and ctrls == "") or hierarchy in ctrls.split(","):
                return path
    except (OSError, ValueError):
        return None
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _move(root: Path, rel: str, pid: int) -> None:
    target = root / rel.lstrip("/")
    try:
        _write(target / "cgroup.procs", str(pid))
    except ProcessLookupError:
        pass  # it exited meanwhile
    except OSError as e:
        if e.errno == 3:  # ESRCH
            return
        if rel != "/":
            _write(root / "cgroup.procs", str(pid))  # the original cgroup is gone: back to the root
        else:
            raise


def _wait_state(check, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


def _freeze_cgroup(method: str, name: str, pids: list[int]) -> dict[str, Any]:
    root = v2_root() if method == "cgroup2" else v1_freezer_root()
    if root is None:
        raise PauseError(f"{method}: no hierarchy")
    hierarchy = "" if method == "cgroup2" else "freezer"
    cg = root / f"{PREFIX}{name}"
    cg.mkdir(exist_ok=True)
    origins = {}
    try:
        for pid in pids:
            origin = _cgroup_of(pid, hierarchy)
            if origin is None:
                continue
            origins[str(pid)] = origin
            _move(cg.parent, "/" + cg.name, pid)
        if method == "cgroup2":
            _write(cg / "cgroup.freeze", "1")
            frozen = _wait_state(lambda: "frozen 1" in (cg / "cgroup.events").read_text())
        else:
            _write(cg / "freezer.state", "FROZEN")
            frozen = _wait_state(lambda: (cg / "freezer.state").read_text().strip() == "FROZEN")
        if not frozen:
            raise PauseError(f"{method}: {cg} did not reach the frozen state")
    except BaseException:
        _thaw_cgroup({"method": method, "cgroup": str(cg), "root": str(root), "origins": origins})
        raise
    return {"method": method, "cgroup": str(cg), "root": str(root), "origins": origins}


def _thaw_cgroup(record: dict[str, Any]) -> None:
    cg, root = Path(record["cgroup"]), Path(record["root"])
    if not cg.name.startswith(PREFIX) or not cg.is_dir():
        return
    if record["method"] == "cgroup2":
        _write(cg / "cgroup.freeze", "0")
    else:
        _write(cg / "freezer.state", "THAWED")
    origins = record.get("origins", {})
    try:
        inside = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        inside = []
    for pid in inside:
        _move(root, origins.get(str(pid), "/"), pid)
    try:
        cg.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------------- public
def cgroup_name(registry_dir: str | os.PathLike[str], copy_id: str) -> str:
    """The cgroup name of copy ``copy_id`` of a registry: the id and a digest of the registry's
    real path. Two registries on one host (two guards, two test runs) may both name a copy
    ``backup``; with the id alone they shared one cgroup, and one guard's duty cycle froze the
    other's copy."""
    digest = hashlib.sha256(os.path.realpath(registry_dir).encode()).hexdigest()[:8]
    return f"{copy_id}-{digest}"


def pause(name: str, *, pid: int | None = None, pgid: int | None = None,
          methods: list[str] | None = None) -> dict[str, Any]:
    """Pause the process (and its descendants) or the process group; returns the record that
    :func:`resume` takes. Tries ``methods`` (default: :func:`detect`) in order."""
    pids = members(pid, pgid)
    if not pids:
        raise PauseError(f"no process to pause (pid={pid}, pgid={pgid})")
    if 1 in pids or os.getpid() in pids or pgid in (0, 1, os.getpgrp()):
        raise PauseError("refusing to pause init or the process group of the pausing process itself")
    errors = []
    for method in methods or detect():
        try:
            if method == "signal":
                if pgid is not None:
                    os.killpg(pgid, signal.SIGSTOP)
                else:
                    for p in pids:
                        try:
                            os.kill(p, signal.SIGSTOP)
                        except ProcessLookupError:
                            pass
                record = {"method": "signal", "pgid": pgid, "pids": pids}
                _wait_state(lambda: is_frozen(record), timeout=1.0)  # signals are delivered asynchronously
                return record
            return _freeze_cgroup(method, name, pids)
        except (OSError, PauseError) as e:
            errors.append(f"{method}: {e}")
    raise PauseError("; ".join(errors))


def set_frozen(record: dict[str, Any], frozen: bool) -> None:
    """Freeze or thaw what ``record`` holds, in place (no process moves; idempotent). A cgroup
    that is gone (resumed meanwhile) is left alone."""
    method = record.get("method")
    if method == "signal":
        sig = signal.SIGSTOP if frozen else signal.SIGCONT
        pgid = record.get("pgid")
        try:
            if pgid is not None:
                os.killpg(int(pgid), sig)
            else:
                for p in record.get("pids", []):
                    try:
                        os.kill(int(p), sig)
                    except ProcessLookupError:
                        pass
        except ProcessLookupError:
            pass
        return
    if method not in ("cgroup2", "cgroup1"):
        raise PauseError(f"unknown pause method {method!r}")
    cg = Path(str(record.get("cgroup", "")))
    if not cg.name.startswith(PREFIX) or not cg.is_dir():
        return
    try:
        if method == "cgroup2":
            _write(cg / "cgroup.freeze", "1" if frozen else "0")
        else:
            _write(cg / "freezer.state", "FROZEN" if frozen else "THAWED")
    except FileNotFoundError:
        pass  # removed by a resume between the check and the write


def duty(record: dict[str, Any]) -> float:
    """The share of time the record's processes may run (0: paused; 1: free)."""
    try:
        d = float(record.get("duty") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, d)) if d == d else 0.0


def duty_phase(record: dict[str, Any], now: float) -> tuple[bool, float]:
    """(frozen, when this phase ends) at ``now`` for a duty-cycled record: each ``period``
    starts frozen for ``(1 - duty) * period`` and runs for the rest. A pause (duty 0) is frozen
    for good (the phase ends at the lease)."""
    d = duty(record)
    until = float(record.get("until") or now)
    if d <= 0.0:
        return True, until
    if d >= 1.0:
        return False, until
    try:
        period = max(0.05, float(record.get("period") or 1.0))
        since = float(record.get("since") or 0.0)
    except (TypeError, ValueError):
        period, since = 1.0, 0.0
    start = now - (now - since) % period
    off = (1.0 - d) * period
    if now < start + off:
        return True, start + off
    return False, start + period


def resume(record: dict[str, Any]) -> None:
    """Undo :func:`pause` (idempotent; processes that exited meanwhile are fine)."""
    method = record.get("method")
    if method == "signal":
        pgid = record.get("pgid")
        if pgid is not None:
            try:
                os.killpg(int(pgid), signal.SIGCONT)
            except ProcessLookupError:
                pass
        else:
            for p in record.get("pids", []):
                try:
                    os.kill(int(p), signal.SIGCONT)
                except ProcessLookupError:
                    pass
        _wait_state(lambda: not any(stopped(int(p)) for p in record.get("pids", [])), timeout=1.0)
    elif method in ("cgroup2", "cgroup1"):
        _thaw_cgroup(record)
    else:
        raise PauseError(f"unknown pause method {method!r}")


def intact(record: dict[str, Any]) -> bool:
    """True while the record still holds something: its cgroup exists with processes in it,
    or (signals) one of its processes lives. False: hold the processes again from scratch."""
    method = record.get("method")
    if method == "signal":
        return any(stopped(int(p)) is not None for p in record.get("pids", []))
    cg = Path(str(record.get("cgroup", "")))
    try:
        return cg.name.startswith(PREFIX) and bool((cg / "cgroup.procs").read_text().split())
    except OSError:
        return False


def forget(record: dict[str, Any]) -> None:
    """Clean up after processes that died while paused (an empty freezer cgroup)."""
    try:
        if record.get("method") in ("cgroup2", "cgroup1"):
            _thaw_cgroup(record)
    except (OSError, PauseError):
        pass


def stopped(pid: int) -> bool | None:
    """True while ``pid`` is stopped by a signal (or traced), None when it is gone."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except (psutil.NoSuchProcess, ValueError):
        return None


def is_frozen(record: dict[str, Any]) -> bool:
    """True while the record's processes are held (for tests and ``copy-guard list``)."""
    method = record.get("method")
    if method == "signal":
        pids = record.get("pids", [])
        return bool(pids) and all(stopped(int(p)) is not False for p in pids)
    cg = Path(record.get("cgroup", ""))
    try:
        if method == "cgroup2":
            return "frozen 1" in (cg / "cgroup.events").read_text()
        return (cg / "freezer.state").read_text().strip() == "FROZEN"
    except OSError:
        return False
