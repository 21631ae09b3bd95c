"""One copier per destination: a second `promreflex copy` into the same DST (a cron job started
again while the first still runs) is refused while the first copies, with the first one's pid,
instead of writing the same part files and journal; the lock file goes with the journal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controllers.copy_guard.copier import Control, Copier, CopyBusy, Stopped, journal_path, lock_path

CHUNK = 4096
REPO = Path(__file__).resolve().parents[2]


def tree(root: Path, files: int = 4, size: int = 8 * CHUNK) -> Path:
    root.mkdir()
    for i in range(files):
        (root / f"f{i}.bin").write_bytes(os.urandom(size))
    return root


def held_copier(src: Path, dst: Path) -> tuple[Copier, threading.Thread, threading.Event, Control]:
    """A copier running in a thread and held by a pause after its first chunk."""
    control = Control()
    first_chunk = threading.Event()

    def on_chunk(_c: Copier) -> None:
        if not first_chunk.is_set():
            control.pause(lease=60)
            first_chunk.set()

    copier = Copier(src, dst, control=control, chunk_size=CHUNK, on_chunk=on_chunk)

    def run() -> None:
        try:
            copier.run()
        except Stopped:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert first_chunk.wait(30), "the first copier never copied a chunk"
    return copier, thread, first_chunk, control


def test_a_second_copier_into_the_same_destination_is_refused_while_the_first_runs(tmp_path):
    src, dst = tree(tmp_path / "src"), tmp_path / "dst"
    copier, thread, _, control = held_copier(src, dst)
    try:
        with pytest.raises(CopyBusy) as err:
            Copier(src, dst, chunk_size=CHUNK)
        assert f"pid {os.getpid()}" in str(err.value) and str(dst) in str(err.value)
    finally:
        control.stop()
        thread.join(30)
    # Stopped: the lock is free, the second run resumes and finishes; the lock file goes with the journal.
    Copier(src, dst, chunk_size=CHUNK).run()
    for i in range(4):
        assert (dst / f"f{i}.bin").read_bytes() == (src / f"f{i}.bin").read_bytes()
    journal = journal_path(dst)
    assert not journal.exists() and not lock_path(journal).exists()


def test_another_destination_beside_it_is_not_held(tmp_path):
    src = tree(tmp_path / "src")
    _, thread, _, control = held_copier(src, tmp_path / "dst")
    try:
        Copier(src, tmp_path / "dst2", chunk_size=CHUNK).run()  # same parent, another DST: copies
        assert (tmp_path / "dst2" / "f0.bin").read_bytes() == (src / "f0.bin").read_bytes()
    finally:
        control.stop()
        thread.join(30)


def test_a_lock_file_left_by_a_killed_copy_does_not_hold_the_next(tmp_path):
    src, dst = tree(tmp_path / "src"), tmp_path / "dst"
    lock = lock_path(journal_path(dst))
    lock.write_text("999999\n")  # a SIGKILLed copier's file: flock went with its process
    Copier(src, dst, chunk_size=CHUNK).run()
    assert (dst / "f3.bin").read_bytes() == (src / "f3.bin").read_bytes() and not lock.exists()


def test_promreflex_copy_twice_into_one_destination_says_so_and_exits_1(tmp_path):
    src, dst = tree(tmp_path / "src", files=2), tmp_path / "dst"
    _, thread, _, control = held_copier(src, dst)
    try:
        env = {**os.environ, "PROMREFLEX_COPY_REGISTRY": str(tmp_path / "registry")}
        out = subprocess.run([sys.executable, "-m", "promreflex", "copy", str(src), str(dst)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    finally:
        control.stop()
        thread.join(30)
    assert out.returncode == 1, out.stderr
    assert "another promreflex copy" in out.stderr and "Traceback" not in out.stderr
