"""A service's own resource usage, read from /proc, as Prometheus metrics.

Each simulated service serves these on its ``/metrics`` (the stand-in for cAdvisor's container
metrics), labelled with its service name so the RCA's resource templates select it with
``service="$service"``:

- ``promreflex_bench_process_cpu_seconds_total``: user + system CPU time (``/proc/self/stat``)
- ``promreflex_bench_process_resident_memory_bytes``: resident set size (``/proc/self/statm``)
- ``promreflex_bench_process_disk_io_bytes_total``: bytes read from and written to storage
  (``read_bytes`` + ``write_bytes`` of ``/proc/self/io``), by ``direction``
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# The resource templates the RCA reads these with ($service as the RCA fills it in).
RESOURCE_TEMPLATES = {
    "cpu": 'sum(rate(promreflex_bench_process_cpu_seconds_total{service="$service"}[5s]))',
    "memory": 'sum(promreflex_bench_process_resident_memory_bytes{service="$service"})',
    "disk_io": 'sum(rate(promreflex_bench_process_disk_io_bytes_total{service="$service"}[5s]))',
}


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float
    rss_bytes: int
    read_bytes: int
    write_bytes: int


def read_usage(pid: int | str = "self") -> Usage:
    """CPU seconds, RSS and storage I/O bytes of a process (``self`` by default)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat)
    with open(f"/proc/{pid}/statm", "rb") as f:
        rss = int(f.read().split()[1]) * PAGE
    io = {}
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                io[key.decode()] = int(value)
    except OSError:  # /proc/PID/io needs ptrace access; missing is zero, not a crash
        pass
    return Usage(cpu, rss, io.get("read_bytes", 0), io.get("write_bytes", 0))


class ProcessUsageCollector(Collector):
    """Fresh /proc readings at every scrape."""

    def __init__(self, service: str, pid: int | str = "self"):
        self.service = service
        self.pid = pid

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        u = read_usage(self.pid)
        cpu = CounterMetricFamily("promreflex_bench_process_cpu_seconds", "User and system CPU time of the service process.",
                                  labels=["service"])
        cpu.add_metric([self.service], u.cpu_seconds)
        yield cpu
        rss = GaugeMetricFamily("promreflex_bench_process_resident_memory_bytes", "Resident set size of the service process.",
                                labels=["service"])
        rss.add_metric([self.service], u.rss_bytes)
        yield rss
        io = CounterMetricFamily("promreflex_bench_process_disk_io_bytes", "Bytes the service process read from or wrote to storage.",
                                 labels=["service", "direction"])
        io.add_metric([self.service, "read"], u.read_bytes)
        io.add_metric([self.service, "write"], u.write_bytes)
        yield io
