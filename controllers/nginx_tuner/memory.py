"""nginx's memory: the sum over the master and its children of PSS (or USS as a fallback).

Why PSS and not RSS (the paper read ``top``'s RES): master and workers share the binary,
libc and, after ``fork``, many copy-on-write pages, plus the shared-memory zones. Summing RSS
counts those once per process, so adding a worker "costs" the whole binary again. PSS
(proportional set size) splits every shared page among the processes mapping it, so the sum
over the group is the group's fair share of physical memory. Caveat: pages shared with
processes *outside* nginx (libc with every other program) are split with them too, so the
figure moves a little when unrelated processes start or stop: compare readings taken
side by side, not across days.

Source: psutil's ``memory_full_info()`` (``/proc/PID/smaps_rollup``, one small read per
process, or ``/proc/PID/smaps`` on kernels before 4.14). PSS by default; USS (unique set size:
private pages only, which leaves out everything shared, including nginx's own shared zones, so
it reads lower) on request. The result names the method so a sweep never mixes the two.

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

import psutil
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from controllers.nginx_tuner.procfs import children, cmdline

Method = Literal["pss", "uss"]


@dataclass(frozen=True)
class MemoryReading:
    """Memory of one process group at one moment."""

    total_bytes: int
    method: Method
    per_process: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    vanished: tuple[int, ...] = ()  # processes that exited while being read (not counted)


def process_memory(pid: int, method: Method = "pss") -> int:
    """PSS (or USS) of one process in bytes. Raises ProcessLookupError when it is gone and
    PermissionError when its memory map may not be read (another user's process, not root)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: no memory map any more
            raise ProcessLookupError(f"pid {pid} exited")
        info = proc.memory_full_info()
    except psutil.NoSuchProcess as e:
        raise ProcessLookupError(f"pid {pid} exited") from e
    except psutil.AccessDenied as e:
        raise PermissionError(f"may not read the memory map of pid {pid}") from e
    return int(info.pss if method == "pss" else info.uss)


def group_memory(pids: list[int], method: Method | None = None) -> MemoryReading:
    """Sum PSS (default) or USS over ``pids``; processes that exit meanwhile are reported, not counted."""
    if not pids:
        raise ValueError("no processes to measure")
    method = method or "pss"
    per: dict[int, int] = {}
    vanished: list[int] = []
    for pid in pids:
        try:
            per[pid] = process_memory(pid, method)
        except ProcessLookupError:
            vanished.append(pid)  # exited between listing and reading (e.g. an old worker)
    if not per:
        raise ProcessLookupError(f"all of {pids} exited before they could be measured")
    return MemoryReading(sum(per.values()), method, per, tuple(vanished))


def nginx_memory(master_pid: int, method: Method | None = None) -> MemoryReading:
    """Memory of an nginx master and all its children (workers, cache manager/loader)."""
    return group_memory([master_pid, *children(master_pid)], method)


class NginxMemoryCollector:
    """``promreflex_nginx_memory_bytes{method}`` of the nginx whose master is in ``pid_file``.

    Read at scrape time (a few small /proc reads). When the pid file is missing or stale,
    only ``promreflex_nginx_memory_up 0`` is exported, so an alert on memory goes quiet
    instead of reading a stale value, and ``up``-style alerts can catch it. Served by
    ``promreflex exporter-nginx-memory``; the passive tuner and ``rules/nginx.rules.yml`` read it.
    """

    def __init__(self, pid_file: Path, registry: CollectorRegistry = REGISTRY):
        self.pid_file = Path(pid_file)
        registry.register(self)

    def _master(self) -> int:
        pid = int(self.pid_file.read_text().strip())
        if "master process" not in cmdline(pid):
            raise ProcessLookupError(f"pid {pid} is not an nginx master")
        return pid

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("promreflex_nginx_memory_up", "1 when nginx's master was found and measured.")
        try:
            reading = nginx_memory(self._master())
        except (OSError, ValueError, ProcessLookupError):
            up.add_metric([], 0)
            yield up
            return
        mem = GaugeMetricFamily(
            "promreflex_nginx_memory_bytes",
            "nginx memory: PSS summed over master and workers.",
            labels=["method"],
        )
        mem.add_metric([reading.method], reading.total_bytes)
        yield mem
        yield GaugeMetricFamily("promreflex_nginx_processes", "nginx processes measured (master + workers).", value=len(reading.per_process))
        up.add_metric([], 1)
        yield up
