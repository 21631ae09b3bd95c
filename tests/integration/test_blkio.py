"""The benchmarks' emulated disks (bench/blkio.py): a process put in a group has its direct
writes counted, and so throttled, there; removing the group gives the process back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.blkio import BLKIO, EmulatedDisk

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not EmulatedDisk.available(), reason="needs root and the cgroup v1 blkio hierarchy")]

WRITER = """
import mmap, os, sys
sys.stdin.readline()                     # wait until the test has put us in the group
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o600)
buf = mmap.mmap(-1, 4096)
for i in range(int(sys.argv[2])):
    os.pwrite(fd, buf, (i % 16) * 4096)
os.close(fd)
print("done", flush=True)
"""


def test_an_iops_volume_counts_its_process_direct_writes_and_is_removed(tmp_path: Path) -> None:
    vol = EmulatedDisk(tmp_path, iops=500, name=f"promreflex-test-blkio-{tmp_path.name}").create()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "f.bin"), "40"],  # noqa: S603
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert (vol.dir / "blkio.throttle.write_iops_device").read_text().split() == [vol.device, "500"]
        assert (vol.dir / "blkio.throttle.write_bps_device").read_text().strip() == ""  # no byte cap asked
        vol.add(proc.pid)
        assert str(proc.pid) in (vol.dir / "cgroup.procs").read_text().split()
        out, _ = proc.communicate("go\n", timeout=60)
        assert out.strip() == "done" and proc.returncode == 0
        assert vol.io_counts().get("write", 0) >= 40
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        vol.remove()
    assert not vol.dir.exists()
    assert BLKIO.exists()
