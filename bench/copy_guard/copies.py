"""The copies the bench runs, and what the guard did to them.

- :class:`PromreflexCopy`: ``promreflex copy SRC DST`` (registered, its control endpoint sampled
  at 10 Hz for progress).
- :class:`AdoptedCp`: a real ``cp SRC DST`` started by the bench and registered with
  ``promreflex copy-guard adopt --pid`` (paused and throttled by freezing, as a user's rsync/cp).
- :class:`GuardSampler`: the controller's ``promreflex_copy_guard_share{site}`` at 5 Hz (1 free,
  0 paused, between: throttled) and its counters before/after the run, the same way for both
  kinds of copy: pauses, time paused, mean share while the copy ran.

Both copies expose ``start()``, ``running()``, ``wait(timeout) -> seconds | None``, ``kill()``,
``cleanup()``, ``started``/``ended``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from promreflex.proc import free_port

GB = 1 << 30
_SAMPLE = re.compile(r'^(promreflex_copy_guard_[a-z_]+)\{([^}]*)\} ([0-9.eE+-]+|NaN)$')


def drop_cache(path: Path) -> None:
    """Evict a (clean) file from the page cache, so every run's copy starts from a cold source."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _get_json(url: str, timeout: float = 1.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
        return json.load(resp)


class _Copy:
    kind = "?"

    def __init__(self, src: Path, dst: Path, registry_dir: Path, site: str, log_path: Path, cgroup: Path | None):
        self.src, self.dst, self.registry_dir, self.site, self.log_path, self.cgroup = src, dst, registry_dir, site, log_path, cgroup
        self.started = 0.0
        self.ended: float | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.progress: list[tuple[float, int]] = []  # (t, bytes done)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, argv: list[str]) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.started = time.time()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,  # noqa: S603 - our argv
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(f"{self.proc.pid}\n")
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        assert self.proc is not None
        while not self._stop.is_set():
            if self.proc.poll() is not None:
                self.ended = time.time()  # to 0.1 s
                return
            done = self.done_bytes()
            if done is not None:
                self.progress.append((time.time(), done))
            self._stop.wait(0.1)

    def start(self) -> _Copy:
        raise NotImplementedError

    def done_bytes(self) -> int | None:
        raise NotImplementedError

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> float | None:
        """Seconds from start to exit (None if it failed or had to be killed)."""
        assert self.proc is not None
        try:
            code: int | None = self.proc.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._stop.set()
        self.ended = self.ended or time.time()
        self.log.close()
        if code != 0:
            print(f"  {self.kind} exited {code}; see {self.log_path}", flush=True)
            return None
        return self.ended - self.started

    def hold(self, on: bool) -> bool:
        """Stop (SIGSTOP) or continue (SIGCONT) the copy's process group, as the oracle arm does;
        False if the copy is no longer running."""
        if not self.running():
            return False
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a frozen or stopped copy must die too
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def cleanup(self) -> None:
        """Remove the destination (unlinking also drops its dirty pages: the next run starts clean)."""
        remove_destination(self.dst)


def remove_destination(dst: Path) -> None:
    """A copy's destination and the copier's manifest and partial file: gone before each run too,
    so a copy left over by an interrupted bench cannot make the next one end at once."""
    for p in (dst, dst.parent / f".{dst.name}.promreflex-copy.json", dst.parent / f".{dst.name}.promreflex-part"):
        p.unlink(missing_ok=True)


class PromreflexCopy(_Copy):
    kind = "promreflex copy"

    def __init__(self, *args: Any, io: str = "direct", chunk: str = "1M", **kw: Any):
        super().__init__(*args, **kw)
        self.io, self.chunk = io, chunk
        self.url = f"http://127.0.0.1:{free_port()}"

    def start(self) -> PromreflexCopy:
        self._spawn([sys.executable, "-m", "promreflex", "copy", str(self.src), str(self.dst), "--site", self.site,
                     "--registry.dir", str(self.registry_dir), "--web.listen-address", self.url.removeprefix("http://"),
                     "--io", self.io, "--chunk-size", self.chunk, "--fresh"])
        return self

    def done_bytes(self) -> int | None:
        try:
            return int(_get_json(f"{self.url}/status", timeout=0.5)["done_bytes"])
        except (OSError, ValueError, KeyError):
            return None


class AdoptedCp(_Copy):
    kind = "cp (adopted)"

    def start(self) -> AdoptedCp:
        self._spawn(["cp", str(self.src), str(self.dst)])
        assert self.proc is not None
        out = subprocess.run([sys.executable, "-m", "promreflex", "copy-guard", "adopt", "--pid", str(self.proc.pid),  # noqa: S603
                              "--site", self.site, "--registry.dir", str(self.registry_dir), "--src", str(self.src),
                              "--dst", str(self.dst)], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode != 0:
            self.kill()
            raise RuntimeError(f"copy-guard adopt failed: {out.stdout}{out.stderr}")
        return self

    def done_bytes(self) -> int | None:
        try:
            return self.dst.stat().st_size
        except OSError:
            return None


def make_copy(kind: str, src: Path, dst: Path, registry_dir: Path, site: str, log_path: Path,
              cgroup: Path | None, io: str = "direct", chunk: str = "1M") -> _Copy:
    if kind == "promreflex":
        return PromreflexCopy(src, dst, registry_dir, site, log_path, cgroup, io=io, chunk=chunk)
    if kind == "cp":
        return AdoptedCp(src, dst, registry_dir, site, log_path, cgroup)
    raise ValueError(f"unknown copy kind {kind!r} (promreflex or cp)")


def parse_guard_metrics(text: str, site: str) -> dict[str, float]:
    """``promreflex_copy_guard_*`` samples of ``site`` from a /metrics page, summed over the
    other labels: ``{"promreflex_copy_guard_share": 1.0, "promreflex_copy_guard_pauses_total": 3, ...}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or f'site="{site}"' not in m.group(2):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


class GuardSampler:
    """The controller's view of the site's copies during one run."""

    COUNTERS = ("promreflex_copy_guard_pauses_total", "promreflex_copy_guard_emergency_pauses_total",
                "promreflex_copy_guard_throttle_decreases_total", "promreflex_copy_guard_throttle_increases_total",
                "promreflex_copy_guard_forced_resumes_total", "promreflex_copy_guard_pause_seconds_total")

    def __init__(self, metrics_url: str | None, site: str, interval: float = 0.2):
        self.url, self.site, self.interval = metrics_url, site, interval
        self.share: list[tuple[float, float]] = []
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict[str, float] | None:
        if not self.url:
            return None
        try:
            with urllib.request.urlopen(self.url, timeout=1) as resp:  # noqa: S310 - loopback
                return parse_guard_metrics(resp.read().decode(), self.site)
        except OSError:
            return None

    def start(self) -> GuardSampler:
        self.before = self._read() or {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            m = self._read()
            if m is not None and "promreflex_copy_guard_share" in m:
                self.share.append((time.time(), m["promreflex_copy_guard_share"]))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
        self.after = self._read() or {}
        return self.deltas()

    def deltas(self) -> dict[str, float]:
        return {k.removeprefix("promreflex_copy_guard_"): self.after.get(k, 0.0) - self.before.get(k, 0.0)
                for k in self.COUNTERS if k in self.after}
