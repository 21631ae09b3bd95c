"""Faults a simulated service can suffer, switched on and off at run time.

Each fault lives inside the service process (so the process's own CPU, memory and disk I/O
metrics show it, as a container's would) and is bounded in time and size:

- ``cpu``: ``threads`` threads spinning in Python for ``duty`` of every 10 ms. Together they
  take one core (the interpreter lock), and the request thread must win the lock against all
  of them at every step, so the service's own request handling slows down, like a pod whose
  CPU quota a runaway loop eats.
- ``memory``: the service keeps ``rate_mb_s`` of small objects a second (a leak, up to
  ``max_mb``). Allocation and the garbage collector's full passes over the growing heap stall
  request handling, as a leaking JVM's collections do.
- ``latency``: every request the service receives waits ``delay_ms`` more (a slow lock, a slow
  external call).
- ``disk``: every ``interval_ms``, a burst of ``writes`` random ``block_kb`` writes, each
  durable before the next (``O_DIRECT | O_DSYNC``; buffered + fsync where the filesystem
  refuses direct I/O), on the service's request thread (a database whose commits all wait for
  the disk: an fsync storm). The file never grows beyond ``file_mb``. How long a burst stalls
  depends on the disk: 0.35 ms per 4 KB write on this VM's raw disk (about 100 ms per default
  burst), 1 s / ``iops`` per write when the mesh gives each service a volume with an IOPS cap
  (:class:`bench.blkio.EmulatedDisk`, ``Mesh(volume_iops=...)``).

:class:`FaultController` starts one fault at a time, ends it at its deadline, and reports its
state; the service exposes it on ``/fault``.
"""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

FAULT_KINDS = ("cpu", "memory", "latency", "disk")
MAX_DURATION_S = 600.0


class FaultError(ValueError):
    """A fault request that is not allowed (unknown kind, parameter out of bounds)."""


def _param(params: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    raw = params.get(name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise FaultError(f"{name} must be a number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise FaultError(f"{name} must be within [{lo:g}, {hi:g}], got {value:g}")
    return value


class Fault:
    kind: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, tuple[float, float, float]]] = {}  # name: (default, min, max)

    def __init__(self, params: dict[str, Any] | None = None):
        params = dict(params or {})
        unknown = set(params) - set(self.PARAMS)
        if unknown:
            raise FaultError(f"{self.kind} fault has no parameter(s) {', '.join(sorted(unknown))} "
                             f"(it takes {', '.join(self.PARAMS) or 'none'})")
        self.params = {n: _param(params, n, *spec) for n, spec in self.PARAMS.items()}

    def start(self) -> None:
        """Begin (called inside the service's event loop)."""

    def stop(self) -> None:
        """End and give back what was taken. Idempotent."""

    def request_delay(self) -> float:
        """Seconds each incoming request waits because of this fault."""
        return 0.0

    def status(self) -> dict[str, Any]:
        return {}


class CpuHog(Fault):
    kind = "cpu"
    PARAMS = {"duty": (1.0, 0.05, 1.0), "threads": (4.0, 1.0, 16.0)}

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.spins = 0

    def _run(self) -> None:
        busy = 0.010 * self.params["duty"]
        while not self._stop.is_set():
            end = time.perf_counter() + busy
            n = 0
            while time.perf_counter() < end:
                n += 1
            self.spins += n
            if busy < 0.010:
                self._stop.wait(0.010 - busy)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._run, name=f"cpu-hog-{i}", daemon=True)
                         for i in range(int(self.params["threads"]))]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def status(self) -> dict[str, Any]:
        return {"running": self.running, "spins": self.spins}


class _LoopFault(Fault):
    """A fault that does something every ``tick`` seconds on the service's event loop."""

    tick = 0.1

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        self._task: asyncio.Task | None = None

    def step(self) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        while True:
            self.step()
            await asyncio.sleep(self.tick)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class MemoryGrowth(_LoopFault):
    kind = "memory"
    PARAMS = {"rate_mb_s": (40.0, 1.0, 200.0), "max_mb": (400.0, 1.0, 1024.0)}
    OBJECT_BYTES = 160  # a 3-element list with an int and a short string, roughly

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        self.kept: list[list[Any]] = []

    @property
    def held_bytes(self) -> int:
        return len(self.kept) * self.OBJECT_BYTES

    def step(self) -> None:
        limit = int(self.params["max_mb"] * 1024 * 1024 / self.OBJECT_BYTES)
        n = min(int(self.params["rate_mb_s"] * self.tick * 1024 * 1024 / self.OBJECT_BYTES), limit - len(self.kept))
        base = len(self.kept)
        self.kept.extend([i, str(i), None] for i in range(base, base + max(0, n)))

    def stop(self) -> None:
        super().stop()
        self.kept = []
        gc.collect()

    def status(self) -> dict[str, Any]:
        return {"held_bytes": self.held_bytes, "objects": len(self.kept)}


class AddedLatency(Fault):
    kind = "latency"
    PARAMS = {"delay_ms": (250.0, 1.0, 10_000.0)}

    def request_delay(self) -> float:
        return self.params["delay_ms"] / 1000.0


class DiskHog(_LoopFault):
    kind = "disk"
    PARAMS = {"writes": (300.0, 1.0, 5000.0), "block_kb": (4.0, 1.0, 1024.0), "interval_ms": (250.0, 10.0, 10_000.0),
              "file_mb": (16.0, 1.0, 256.0)}

    def __init__(self, params: dict[str, Any] | None = None, directory: Path | None = None):
        super().__init__(params)
        self.tick = self.params["interval_ms"] / 1000.0
        self.path = Path(directory or ".") / "disk-hog.bin"
        self.written = 0
        self.syncs = 0
        self._fd: int | None = None
        self.direct = False
        size = -(-int(self.params["block_kb"] * 1024) // 4096) * 4096  # whole pages, as O_DIRECT wants
        self._block = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
        self._block.write(os.urandom(size))
        self._slots = max(1, int(self.params["file_mb"] * 1024 * 1024) // size)
        self._rng = random.Random(0)

    def start(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o600)
            os.pwrite(self._fd, self._block, 0)  # tmpfs and some others refuse O_DIRECT only here
            self.direct = True
        except OSError:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        super().start()

    def step(self) -> None:
        """A burst of ``writes`` random block writes, each made durable (fsync) before the next."""
        if self._fd is None:
            return
        for _ in range(int(self.params["writes"])):
            self.written += os.pwrite(self._fd, self._block, self._rng.randrange(self._slots) * len(self._block))
            if not self.direct:
                os.fsync(self._fd)
            self.syncs += 1

    def stop(self) -> None:
        super().stop()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        return {"written_bytes": self.written, "fsyncs": self.syncs, "direct": self.direct}


KINDS: dict[str, type[Fault]] = {f.kind: f for f in (CpuHog, MemoryGrowth, AddedLatency, DiskHog)}


class FaultController:
    """At most one active fault, ended at its deadline (or by :meth:`clear`)."""

    def __init__(self, data_dir: Path | None = None, clock=time.monotonic):
        self.data_dir = data_dir
        self.clock = clock
        self.fault: Fault | None = None
        self.deadline: float | None = None
        self.started: float | None = None
        self.injected_total: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)

    def make(self, kind: str, params: dict[str, Any] | None = None) -> Fault:
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
        if kind == "disk":
            return DiskHog(params, self.data_dir)
        return KINDS[kind](params)

    def inject(self, kind: str, duration_s: float = 60.0, params: dict[str, Any] | None = None) -> Fault:
        """Replace any active fault with a new one lasting ``duration_s`` (at most 10 minutes)."""
        duration = _param({"duration_s": duration_s}, "duration_s", 60.0, 0.1, MAX_DURATION_S)
        fault = self.make(kind, params)  # validate before touching the current one
        self.clear()
        fault.start()
        self.fault, self.started, self.deadline = fault, self.clock(), self.clock() + duration
        self.injected_total[kind] += 1
        return fault

    def clear(self) -> bool:
        if self.fault is None:
            return False
        self.fault.stop()
        self.fault = self.deadline = self.started = None
        return True

    def expire(self) -> bool:
        """End the fault if its time is up; call it now and then (the service does, every 100 ms)."""
        if self.fault is not None and self.deadline is not None and self.clock() >= self.deadline:
            return self.clear()
        return False

    def request_delay(self) -> float:
        self.expire()
        return self.fault.request_delay() if self.fault else 0.0

    def status(self) -> dict[str, Any]:
        if self.fault is None:
            return {"kind": None}
        return {
            "kind": self.fault.kind, "params": self.fault.params,
            "remaining_s": max(0.0, (self.deadline or 0) - self.clock()), **self.fault.status(),
        }
