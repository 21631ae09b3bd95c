"""nginx memory from /proc (controllers.nginx_tuner.memory) on fixture proc trees.

Fixture trees: pid 100 is the master (ppid 1), 101 and 102 are workers, 103 is a zombie
child (not counted), 200 is an unrelated process. ``proc_pss`` has smaps_rollup with
``Pss: 1000+pid kB``; ``proc_uss`` has only smaps, two mappings with Private_Clean 4 kB and
Private_Dirty ``pid`` kB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controllers.nginx_tuner.memory import group_memory, nginx_memory
from controllers.nginx_tuner.procfs import children, cmdline, ppid

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nginx"


def test_children_skip_zombies_and_strangers() -> None:
    root = FIXTURES / "proc_pss"
    assert children(100, root) == [101, 102]
    assert ppid(103, root) is None and ppid(101, root) == 100 and ppid(999, root) is None
    assert cmdline(999, root) == ""


def test_pss_summed_over_master_and_workers() -> None:
    r = nginx_memory(100, FIXTURES / "proc_pss")
    assert r.method == "pss"
    assert r.per_process == {100: 1100 * 1024, 101: 1101 * 1024, 102: 1102 * 1024}
    assert r.total_bytes == 3303 * 1024


def test_uss_fallback_without_smaps_rollup() -> None:
    r = nginx_memory(100, FIXTURES / "proc_uss")
    assert r.method == "uss"
    assert r.per_process == {100: 104 * 1024, 101: 105 * 1024, 102: 106 * 1024}
    assert r.total_bytes == 315 * 1024


def test_process_exiting_mid_read_is_reported_not_counted(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc_pss", root)
    (root / "102" / "smaps_rollup").unlink()  # as if worker 102 exited after being listed
    r = nginx_memory(100, root)
    assert (r.vanished, r.total_bytes) == ((102,), 2201 * 1024)
    with pytest.raises(ProcessLookupError):
        group_memory([102], root, method="pss")


def test_garbage_smaps_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc_pss", root)
    (root / "100" / "smaps_rollup").write_text("Pss: lots\n")
    with pytest.raises(ValueError, match="unexpected smaps line"):
        nginx_memory(100, root)
