"""nginx's memory: the sum over the master and its children of PSS (or USS as a fallback).

Why PSS and not RSS (the paper read ``top``'s RES): master and workers share the binary,
libc and, after ``fork``, many copy-on-write pages, plus the shared-memory zones. Summing RSS
counts those once per process, so adding a worker "costs" the whole binary again. PSS
(proportional set size) splits every shared page among the processes mapping it, so the sum
over the group is the group's fair share of physical memory. Caveat: pages shared with
processes *outside* nginx (libc with every other program) are split with them too, so the
figure moves a little when unrelated processes start or stop: compare readings taken
side by side, not across days.

Source: ``/proc/PID/smaps_rollup`` (Linux >= 4.14, one small read per process). When it is
missing, ``/proc/PID/smaps`` is summed for USS (unique set size: ``Private_Clean +
Private_Dirty``), which leaves out everything shared, including nginx's own shared zones, so
it reads lower than PSS; the result names the method so a sweep never mixes the two.

What the keepalive sweep should expect: an idle keepalive connection in nginx costs a
connection slot plus small buffers (the request pool is freed between requests), and worker
heaps rarely shrink after a peak, so differences between ``keepalive_timeout`` values are
small next to run-to-run noise; hence repeats and confidence intervals in ``pareto``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from controllers.nginx_tuner.procfs import PROC, children, cmdline

Method = Literal["pss", "uss"]


@dataclass(frozen=True)
class MemoryReading:
    """Memory of one process group at one moment."""

    total_bytes: int
    method: Method
    per_process: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    vanished: tuple[int, ...] = ()  # processes that exited while being read (not counted)


def _kb_fields(text: str, names: tuple[str, ...]) -> int:
    """Sum of the ``Name:   123 kB`` lines for the given names, in bytes."""
    total = 0
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            parts = rest.split()
            if len(parts) != 2 or parts[1] != "kB":
                raise ValueError(f"unexpected smaps line: {line!r}")
            total += int(parts[0]) * 1024
    return total


def process_pss(pid: int, proc_root: Path = PROC) -> int:
    """PSS of one process in bytes, from smaps_rollup (raises OSError when unavailable)."""
    return _kb_fields((proc_root / str(pid) / "smaps_rollup").read_text(), ("Pss",))


def process_uss(pid: int, proc_root: Path = PROC) -> int:
    """USS of one process in bytes: private pages summed over every mapping in smaps."""
    return _kb_fields((proc_root / str(pid) / "smaps").read_text(), ("Private_Clean", "Private_Dirty"))


def pss_available(pid: int, proc_root: Path = PROC) -> bool:
    return (proc_root / str(pid) / "smaps_rollup").exists()


def group_memory(pids: list[int], proc_root: Path = PROC, method: Method | None = None) -> MemoryReading:
    """Sum PSS (or USS when smaps_rollup is missing) over ``pids``; one method for all."""
    if not pids:
        raise ValueError("no processes to measure")
    if method is None:
        method = "pss" if pss_available(pids[0], proc_root) else "uss"
    reader = process_pss if method == "pss" else process_uss
    per: dict[int, int] = {}
    vanished: list[int] = []
    for pid in pids:
        try:
            per[pid] = reader(pid, proc_root)
        except FileNotFoundError:
            vanished.append(pid)  # exited between listing and reading (e.g. old worker)
        except ProcessLookupError:
            vanished.append(pid)
    if not per:
        raise ProcessLookupError(f"all of {pids} exited before they could be measured")
    return MemoryReading(sum(per.values()), method, per, tuple(vanished))


def nginx_memory(master_pid: int, proc_root: Path = PROC, method: Method | None = None) -> MemoryReading:
    """Memory of an nginx master and all its children (workers, cache manager/loader)."""
    return group_memory([master_pid, *children(master_pid, proc_root)], proc_root, method)


class NginxMemoryCollector:
    """``promreflex_nginx_memory_bytes{method}`` of the nginx whose master is in ``pid_file``.

    Read at scrape time (a few small /proc reads). When the pid file is missing or stale,
    only ``promreflex_nginx_memory_up 0`` is exported, so an alert on memory goes quiet
    instead of reading a stale value, and ``up``-style alerts can catch it. Served by
    ``promreflex exporter-nginx-memory``; the passive tuner and ``rules/nginx.rules.yml`` read it.
    """

    def __init__(self, pid_file: Path, registry: CollectorRegistry = REGISTRY, proc_root: Path = PROC):
        self.pid_file = Path(pid_file)
        self.proc_root = proc_root
        registry.register(self)

    def _master(self) -> int:
        pid = int(self.pid_file.read_text().strip())
        if "master process" not in cmdline(pid, self.proc_root):
            raise ProcessLookupError(f"pid {pid} is not an nginx master")
        return pid

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("promreflex_nginx_memory_up", "1 when nginx's master was found and measured.")
        try:
            reading = nginx_memory(self._master(), self.proc_root)
        except (OSError, ValueError, ProcessLookupError):
            up.add_metric([], 0)
            yield up
            return
        mem = GaugeMetricFamily(
            "promreflex_nginx_memory_bytes",
            "nginx memory: PSS (or USS where smaps_rollup is missing) summed over master and workers.",
            labels=["method"],
        )
        mem.add_metric([reading.method], reading.total_bytes)
        yield mem
        yield GaugeMetricFamily("promreflex_nginx_processes", "nginx processes measured (master + workers).", value=len(reading.per_process))
        up.add_metric([], 1)
        yield up
