"""An emulated slower disk for the benchmark: a cgroup v1 blkio throttle shared by the site and
the copy.

Why: this VM's disk answers 64 KiB O_DIRECT reads in 0.2 ms and copies at about 1 GB/s each way
(measured: a 4 GiB ``dd iflag=direct oflag=direct`` takes 4.2 s), so a copy of a few GB is
over before a guard could matter, and sizing it to last 1-2 minutes would need 60-120 GB. The
paper's VM had an HDD. Both the site's process and the copy join ONE blkio cgroup whose
``blkio.throttle.{read,write}_bps_device`` caps the disk at ``mbps`` MB/s for the two together:
their I/O then queues in the same throttle, the way it queues at a slower disk's head. Measured
on this machine at 100 MB/s: the site alone served 74 product pages/s (24 x 64 KiB uncached
reads each); with an O_DIRECT copy in the same cgroup, 33 pages/s while the copy ran at 60 MB/s.

cgroup v1 throttles reads and direct writes; buffered writes are written back outside the
cgroup (STACK-NOTES), so the copy uses O_DIRECT. Needs root and the v1 blkio hierarchy;
:meth:`EmulatedDisk.available` says whether the host offers it.
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
    def __init__(self, path_on_disk: str | Path, mbps: float, name: str | None = None):
        self.device = whole_disk(path_on_disk)
        self.mbps = mbps
        self.dir = BLKIO / (name or f"promreflex-bench-copy-guard-{os.getpid()}")

    @staticmethod
    def available() -> bool:
        return (BLKIO / "blkio.throttle.read_bps_device").exists() and os.access(BLKIO, os.W_OK)

    def create(self) -> EmulatedDisk:
        self.dir.mkdir(exist_ok=True)
        bps = int(self.mbps * 1_000_000)
        for knob in ("read_bps_device", "write_bps_device"):
            (self.dir / f"blkio.throttle.{knob}").write_text(f"{self.device} {bps}\n")
        return self

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(f"{pid}\n")

    def io_bytes(self) -> dict[str, int]:
        out = {}
        try:
            for line in (self.dir / "blkio.throttle.io_service_bytes").read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.device:
                    out[parts[1].lower()] = int(parts[2])
        except OSError:
            pass
        return out

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
