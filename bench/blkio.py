"""Emulated slower disks for the benchmarks: cgroup v1 blkio throttles.

Why: this VM's disk answers 64 KiB O_DIRECT reads in 0.2 ms, copies at about 1 GB/s each way
(measured: a 4 GiB ``dd iflag=direct oflag=direct`` takes 4.2 s) and makes a 4 KiB write
durable in about 0.35 ms. The papers' machines had an HDD or a cloud volume, where disk
contention is felt; here it is not, unless the disk is made slower.

- Copy guard (:mod:`bench.copy_guard`): the site's process and the copy join ONE group whose
  ``blkio.throttle.{read,write}_bps_device`` caps the disk at ``mbps`` MB/s for the two
  together: their I/O then queues in the same throttle, the way it queues at a slower disk's
  head. Measured at 100 MB/s: the site alone served 74 product pages/s (24 x 64 KiB uncached
  reads each); with an O_DIRECT copy in the same group, 33 pages/s while the copy ran at 60 MB/s.
- RCA mesh (:mod:`bench.rca.mesh`): each service's process joins its OWN group whose
  ``blkio.throttle.{read,write}_iops_device`` caps it at ``iops`` operations a second, like a
  pod's volume with provisioned IOPS (a small cloud volume allows a few hundred to a few
  thousand): a database's fsync storm then stalls that service, not its neighbours.

cgroup v1 throttles reads and direct writes; buffered writes are written back outside the
cgroup (STACK-NOTES), so the copy and the disk fault use O_DIRECT. Needs root and the v1 blkio
hierarchy; :meth:`EmulatedDisk.available` says whether the host offers it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")


def whole_disk(path: str | Path) -> str:
    """``major:minor`` of the whole disk holding ``path`` (a partition maps to its disk)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if (sys_dev / "partition").exists():
        return (sys_dev.resolve().parent / "dev").read_text().strip()
    return f"{major}:{minor}"


class EmulatedDisk:
    """One blkio group: ``mbps`` caps bytes a second, ``iops`` operations a second, each way (0: no cap)."""

    def __init__(self, path_on_disk: str | Path, mbps: float = 0.0, name: str | None = None, *, iops: float = 0.0):
        self.device = whole_disk(path_on_disk)
        self.mbps = mbps
        self.iops = iops
        self.dir = BLKIO / (name or f"promreflex-bench-copy-guard-{os.getpid()}")

    @staticmethod
    def available() -> bool:
        return (BLKIO / "blkio.throttle.read_bps_device").exists() and os.access(BLKIO, os.W_OK)

    def create(self) -> EmulatedDisk:
        self.dir.mkdir(exist_ok=True)
        caps = {"bps": int(self.mbps * 1_000_000), "iops": int(self.iops)}
        for unit, value in caps.items():
            if value > 0:
                for way in ("read", "write"):
                    (self.dir / f"blkio.throttle.{way}_{unit}_device").write_text(f"{self.device} {value}\n")
        return self

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(f"{pid}\n")

    def _per_direction(self, stat: str) -> dict[str, int]:
        out = {}
        try:
            for line in (self.dir / f"blkio.throttle.{stat}").read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.device:
                    out[parts[1].lower()] = int(parts[2])
        except OSError:
            pass
        return out

    def io_bytes(self) -> dict[str, int]:
        """Bytes the group's processes moved on the device, by direction (``read``, ``write``...)."""
        return self._per_direction("io_service_bytes")

    def io_counts(self) -> dict[str, int]:
        """I/O operations the group's processes issued on the device, by direction."""
        return self._per_direction("io_serviced")

    def remove(self, timeout: float = 10.0) -> None:
        """Move any process left back to the root group and remove the cgroup."""
        if not self.dir.exists():
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                pids = (self.dir / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:
                try:
                    (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            try:
                self.dir.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
