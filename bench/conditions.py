"""The conditions a benchmark ran under, measured with psutil (no hand-parsed ``/proc``).

The benches share a 2-core machine with other work, so every figure is printed beside what the
machine was doing while it was measured: CPU busy, steal and iowait (machine-wide, sampled once
a second), the 1-minute load average (at start, end and its maximum), and, for named groups of
processes (e.g. "control plane" and "load"), the CPU seconds each group used and the cores that
makes on average.

    with HostSampler(groups={"load": lambda: [pid]}) as host:
        ...
    print(describe(host.summary()))
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

PidSource = Callable[[], Iterable[int]]


def _tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes and all their descendants (skipping any that are gone)."""
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out[p.pid] = p
            for c in p.children(recursive=True):
                out[c.pid] = c
        except psutil.Error:
            continue
    return list(out.values())


class HostSampler:
    """Samples the machine once per ``interval`` seconds in a background thread until stopped."""

    def __init__(self, interval: float = 1.0, groups: Mapping[str, PidSource] | None = None):
        self.interval = interval
        self.groups = dict(groups or {})
        self.cpu: list[dict[str, float]] = []  # per sample: busy, steal, iowait (percent of all cores)
        self.load1: list[float] = []
        # group -> pid -> (create_time, first cpu seconds, last cpu seconds)
        self._cpu_s: dict[str, dict[int, tuple[float, float, float]]] = {g: {} for g in self.groups}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = self.ended = 0.0

    def _sample_groups(self) -> None:
        for group, source in self.groups.items():
            try:
                procs = _tree(source())
            except Exception:  # noqa: BLE001 - a pid source that fails (stack going down) samples nothing
                continue
            seen = self._cpu_s[group]
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        created = p.create_time()
                except psutil.Error:
                    continue
                used = t.user + t.system
                first = seen.get(p.pid)
                if first is None or first[0] != created:  # new process (or a reused pid)
                    # a process born during the window counts from 0, one already running from now
                    base = used if self.started and created < self.started else 0.0
                    seen[p.pid] = (created, base, used)
                else:
                    seen[p.pid] = (created, first[1], used)

    def _sample(self) -> None:
        ct = psutil.cpu_times_percent(interval=None)
        steal, iowait = getattr(ct, "steal", 0.0), getattr(ct, "iowait", 0.0)
        # busy: time spent running something here (user, nice, system, irq); steal and iowait apart
        self.cpu.append({"busy": 100.0 - ct.idle - iowait - steal, "steal": steal, "iowait": iowait})
        self.load1.append(os.getloadavg()[0])
        self._sample_groups()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> HostSampler:
        self.started = time.time()
        psutil.cpu_times_percent(interval=None)  # the next call measures from here
        self.load1.append(os.getloadavg()[0])
        self._sample_groups()
        self._thread = threading.Thread(target=self._loop, name="host-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._sample()
            self.ended = time.time()
        return self.summary()

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """Means over the samples; group CPU as seconds and as cores (seconds / wall seconds)."""
        wall = max(1e-9, (self.ended or time.time()) - self.started)

        def mean(key: str) -> float | None:
            return statistics.mean(s[key] for s in self.cpu) if self.cpu else None

        groups = {}
        for group, per_pid in self._cpu_s.items():
            secs = sum(last - first for _, first, last in per_pid.values())
            groups[group] = {"cpu_seconds": round(secs, 2), "cores": round(secs / wall, 2), "processes": len(per_pid)}
        return {
            "cores": psutil.cpu_count(),
            "seconds": round(wall, 1),
            "cpu_busy_pct": _round(mean("busy")),
            "cpu_steal_pct": _round(mean("steal")),
            "cpu_iowait_pct": _round(mean("iowait")),
            "load1_start": _round(self.load1[0] if self.load1 else None),
            "load1_end": _round(self.load1[-1] if self.load1 else None),
            "load1_max": _round(max(self.load1) if self.load1 else None),
            "groups": groups,
        }


@dataclass(frozen=True)
class ChildRun:
    """What one child process cost: exit code, CPU seconds (user + system), wall seconds, peak
    RSS (``ru_maxrss``: on Linux at least the parent's peak at the fork, so a floor, not the
    child's own figure when it stays below that), and its output when captured."""

    returncode: int
    cpu_s: float
    wall_s: float
    maxrss_mib: float
    stdout: bytes


def run_child(argv: Sequence[str], *, cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
              stdout: Any = None, stderr: Any = subprocess.DEVNULL) -> ChildRun:
    """Run ``argv`` to its end and read its own resource use from ``os.wait4`` (start-up included).

    ``stdout=None`` CAPTURES its output into ``ChildRun.stdout`` (unlike ``subprocess``, where None
    inherits); a file or ``subprocess.DEVNULL`` sends it there. Give ``stderr`` a file, not a pipe:
    nobody reads a pipe while it runs. Interrupted (Ctrl-C, a signal's exception), the child is
    killed and reaped before the exception goes on: a bench that stops leaves no child running.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE if stdout is None else stdout,  # noqa: S603 - the bench's argv
                            stderr=stderr, cwd=cwd, env=None if env is None else dict(env))
    try:
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        if proc.stdout:
            proc.stdout.close()
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ChildRun(proc.returncode, usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, out)


def write_result(path: Path, text: str) -> int:
    """Write a result file, making its directory; 0, or 2 with a one-line error (no traceback)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        print(f"cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def describe(s: dict[str, Any]) -> str:
    """One line: ``2 cores, CPU busy 97% (steal 3%, iowait 1%), load 1m 3.1 -> 4.2 (max 4.5) ...``."""
    def pct(key: str) -> str:
        v = s.get(key)
        return "?" if v is None else f"{v:.0f}%"

    text = (f"{s['cores']} cores, CPU busy {pct('cpu_busy_pct')} (steal {pct('cpu_steal_pct')}, iowait "
            f"{pct('cpu_iowait_pct')}) over {s['seconds']:.0f}s, load average (1m) {s['load1_start']} -> "
            f"{s['load1_end']} (max {s['load1_max']})")
    groups = s.get("groups") or {}
    if groups:
        text += "; CPU used by " + ", ".join(f"{g} {v['cores']:.2f} cores" for g, v in groups.items())
    return text


def take_lock(f: Any, path: Path, log: Callable[[str], Any] = print) -> None:
    """flock ``f`` exclusively; when another heavy job holds it, say so before waiting (a bench
    that printed nothing for 8 minutes looked hung to a newcomer)."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        log(f"  waiting for {path}: another heavy job holds it (this run starts when it ends)")
        sys.stdout.flush()  # (behind a pipe print is block-buffered: said now, not after the wait)
    fcntl.flock(f, fcntl.LOCK_EX)


@contextmanager
def heavy_lock(path: Path | None) -> Iterator[None]:
    """Hold ``path`` (flock) for one run: other heavy jobs on the machine (integration tests,
    other benches) wait for the run and may go between runs; the stack idles meanwhile."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        t = time.monotonic()
        take_lock(f, path)
        if time.monotonic() - t > 1:
            print(f"  waited {time.monotonic() - t:.0f}s for {path}", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class ChunkedLock:
    """The heavy-job lock (flock on ``path``) held over consecutive runs in chunks of at most
    ``max_s``: :meth:`need` keeps it if the next run (``expected_s``) fits in the current chunk,
    else releases it (other heavy jobs go between chunks) and takes it again. ``path`` None:
    no lock. ``held_s`` and ``chunks`` say how long the bench held the machine, for its conditions."""

    def __init__(self, path: Path | None, max_s: float = 570.0, log: Callable[[str], Any] = print):
        self.path, self.max_s, self.log = path, max_s, log
        self.f: Any = None
        self.since = 0.0
        self.held_s = 0.0  # over the whole bench
        self.chunks = 0

    def need(self, expected_s: float) -> None:
        if self.path is None:
            return
        if self.f is not None and time.monotonic() - self.since + expected_s > self.max_s:
            self.release()
        if self.f is None:
            t = time.monotonic()
            f = open(self.path, "a")  # noqa: SIM115 - closed in release()
            try:
                take_lock(f, self.path, self.log)
            except BaseException:  # interrupted while waiting: nothing held
                f.close()
                raise
            self.f, self.since = f, time.monotonic()
            self.chunks += 1
            self.log(f"  holding {self.path} (chunk {self.chunks}; waited {self.since - t:.0f}s)")

    before = need  # the copy-guard bench's name for it

    def release(self) -> None:
        if self.f is not None:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()
            self.f = None
            held = time.monotonic() - self.since
            self.held_s += held
            self.log(f"  released {self.path} after {held:.0f}s (total held {self.held_s / 60:.1f} min)")

    def __enter__(self) -> ChunkedLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def parse_deadline(text: str, now: float | None = None) -> float:
    """A bench's ``--deadline`` (a heavy-lock slot's end): ``HH:MM`` UTC (the next such time, or one
    up to 12 h past) or Unix seconds."""
    if ":" not in text:
        return float(text)
    try:
        at = datetime.strptime(text, "%H:%M").time()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time of day (HH:MM, UTC): {text!r}") from None
    ref = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC)
    when = datetime.combine(ref.date(), at, tzinfo=UTC)
    if when < ref - timedelta(hours=12):
        when += timedelta(days=1)
    return when.timestamp()
