"""The copier sets owner, mode, times and extended attributes through a descriptor opened without
following (O_NOFOLLOW), never by a name that may have been swapped for a symlink since it was
checked: someone who can write in a DST folder (the site's user, for a restore run as root) must
not get a file OUTSIDE DST chmod'ed, chown'ed or touched. Each test swaps the name at the exact
point between the copier's check and its call, as a racing attacker would."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import pytest

from controllers.copy_guard import copier as copier_mod
from controllers.copy_guard.copier import Control, Copier, part_path

CHUNK = 4096
OLD_NS = 1_500_000_000_000_000_000


def outside_file(tmp_path: Path, mode: int = 0o600) -> Path:
    out = tmp_path / "outside-secret"
    out.write_text("secret")
    os.chmod(out, mode)
    os.utime(out, ns=(OLD_NS, OLD_NS))
    return out


def untouched(path: Path, mode: int, text: str | None = "secret") -> None:
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == mode, f"outside file's mode changed to {oct(stat.S_IMODE(st.st_mode))}"
    assert st.st_mtime_ns == OLD_NS, "outside file's mtime changed"
    if text is not None:
        assert path.read_text() == text


def swap_for_symlink(name: Path, target: Path) -> None:
    """What the attacker does: the name now points outside DST."""
    if name.is_dir() and not name.is_symlink():
        name.rename(name.with_name(name.name + ".moved"))
    else:
        name.unlink()
    name.symlink_to(target)


def wrap_sync_xattrs(monkeypatch, when):
    """Run ``when(src)`` right after the copier's _sync_xattrs (between its checks and its chmod)."""
    orig = Copier._sync_xattrs

    def racing(self, src, dst, *a, **k):
        r = orig(self, src, dst, *a, **k)
        when(Path(src))
        return r
    monkeypatch.setattr(Copier, "_sync_xattrs", racing)


# ---------------------------------------------------------------------- a file done before (_align)
def test_a_file_done_before_swapped_after_its_attributes_is_not_chmodded_through_the_symlink(tmp_path, monkeypatch):
    """The reviewer's case: a re-run aligns DST's mode; the name is swapped inside _sync_xattrs."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "index.html").write_text("hello")
    os.chmod(src / "index.html", 0o666)
    out = outside_file(tmp_path)
    Copier(src, dst).run()
    os.chmod(dst / "index.html", 0o644)  # differs: the re-run aligns it
    done = []

    def swap(s: Path) -> None:
        if s.name == "index.html" and not done:
            done.append(1)
            swap_for_symlink(dst / "index.html", out)
    wrap_sync_xattrs(monkeypatch, swap)
    Copier(src, dst).run()
    assert done
    untouched(out, 0o600)


def test_a_file_done_before_swapped_right_after_its_check_is_copied_again(tmp_path, monkeypatch):
    """Swapped between the lstat that finds it complete and the alignment: nothing is set on the
    symlink's target, and the file is made again (no traceback)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "index.html").write_text("hello")
    os.chmod(src / "index.html", 0o640)
    out = outside_file(tmp_path)
    Copier(src, dst).run()
    os.chmod(dst / "index.html", 0o600)
    final = dst / "index.html"
    real_lstat, done = Path.lstat, []

    def lstat(self):
        st = real_lstat(self)
        if self == final and not done and stat.S_ISREG(st.st_mode):
            done.append(1)
            swap_for_symlink(final, out)
        return st
    c = Copier(src, dst)
    monkeypatch.setattr(Path, "lstat", lstat)
    caught = None
    try:
        c.run()
    except Exception as e:  # (asserted below, after the outside file)
        caught = e
    monkeypatch.undo()
    assert done
    untouched(out, 0o600)
    assert caught is None
    assert not final.is_symlink() and final.read_text() == "hello"
    assert stat.S_IMODE(final.stat().st_mode) == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the source another owner (root only)")
def test_a_hard_link_swapped_after_its_chown_is_not_chmodded_through_the_symlink(tmp_path, monkeypatch):
    """A second name of a hard-linked file, linked before: the source's owner changed, so the
    link is chowned, then chmodded; the name is swapped between the two."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a").write_text("data")
    os.link(src / "a", src / "b")
    os.chmod(src / "a", 0o640)
    out = outside_file(tmp_path)
    Copier(src, dst).run()
    assert os.path.samefile(dst / "a", dst / "b")
    done = []
    orig_source_changed, orig_chown = Copier._source_changed, Copier._chown

    def source_changed(self, item, s):
        if Path(s).name == "b" and not done:
            os.chown(src / "b", 4321, 4321)  # a live source: its owner changed after "a" was done
            os.chmod(src / "b", 0o640)  # (chown cleared nothing: the mode stays)
        return orig_source_changed(self, item, s)

    def chown(self, target, uid, gid, s):
        r = orig_chown(self, target, uid, gid, s)
        if Path(s).name == "b" and not done:
            done.append(1)
            swap_for_symlink(dst / "b", out)
        return r
    monkeypatch.setattr(Copier, "_source_changed", source_changed)
    monkeypatch.setattr(Copier, "_chown", chown)
    Copier(src, dst).run()
    assert done
    untouched(out, 0o600)
    assert out.stat().st_uid == 0


# ---------------------------------------------------------------------- the part file
def test_a_part_file_swapped_after_its_attributes_keeps_mode_and_mtime_off_the_symlinks_target(tmp_path, monkeypatch):
    """The part file's mode and mtime are set through the descriptor its data was written to."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "f.txt").write_bytes(b"x" * (3 * CHUNK + 5))
    os.chmod(src / "f.txt", 0o644)
    out = outside_file(tmp_path)
    part, done = part_path(dst / "f.txt"), []

    def swap(s: Path) -> None:
        if s.name == "f.txt" and not done:
            done.append(1)
            swap_for_symlink(part, out)
    wrap_sync_xattrs(monkeypatch, swap)
    Copier(src, dst, chunk_size=CHUNK).run()
    assert done
    untouched(out, 0o600)


def test_a_leftover_part_file_swapped_after_its_check_is_not_chmodded_through_the_symlink(tmp_path, monkeypatch):
    """A part file left by a stop or a kill, not 0o600 (given the source's mode by an earlier
    attempt): made 0o600 again before it is written; swapped right after the copier checked it
    (its lstat before, its fstat now)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f.txt").write_bytes(b"y" * (2 * CHUNK))
    out = outside_file(tmp_path, 0o644)
    part = part_path(dst / "f.txt")
    part.write_bytes(b"old")
    os.chmod(part, 0o644)
    done: list[int] = []

    def swap_once() -> None:
        if not done:
            done.append(1)
            swap_for_symlink(part, out)
    real_lstat, real_fstat = Path.lstat, os.fstat

    def lstat(self):
        st = real_lstat(self)
        if self == part and stat.S_ISREG(st.st_mode):
            swap_once()
        return st

    def fstat(fd):
        st = real_fstat(fd)
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(part) and stat.S_ISREG(st.st_mode):
                swap_once()
        except OSError:
            pass
        return st
    c = Copier(src, dst, chunk_size=CHUNK)
    monkeypatch.setattr(Path, "lstat", lstat)
    monkeypatch.setattr(os, "fstat", fstat)
    caught = None
    try:
        c.run()
    except Exception as e:  # (asserted below, after the outside file)
        caught = e
    monkeypatch.undo()
    assert done
    untouched(out, 0o644)
    assert caught is None


def test_a_leftover_part_that_is_a_symlink_or_a_fifo_is_replaced_not_followed(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "a.txt").write_bytes(b"a" * 100)
    (src / "b.txt").write_bytes(b"b" * 100)
    out = outside_file(tmp_path, 0o644)
    part_path(dst / "a.txt").symlink_to(out)
    os.mkfifo(part_path(dst / "b.txt"))
    Copier(src, dst).run()  # (a FIFO opened for writing would block without O_NONBLOCK)
    untouched(out, 0o644)
    assert (dst / "a.txt").read_bytes() == b"a" * 100 and (dst / "b.txt").read_bytes() == b"b" * 100


def test_a_read_only_part_file_left_by_a_change_is_written_again_as_a_user(tmp_path, monkeypatch):
    """As test_copy_guard_copier_real's read-only case, hooked on the descriptor's chmod: attempt 1
    gave the part file the source's 0444, the source changed, attempt 2 (not root: cannot open it
    for writing) makes it 0o600 through a descriptor and writes it."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    f = src / "ro.txt"
    f.write_bytes(b"a" * 3 * CHUNK)
    f.chmod(0o444)
    real_chmod, calls = os.chmod, []

    def name_of(path) -> str:
        return os.readlink(f"/proc/self/fd/{path}") if isinstance(path, int) else str(path)

    def chmod(path, mode, *a, **k):
        real_chmod(path, mode, *a, **k)
        if name_of(path).endswith(".promreflex-part") and mode == 0o444 and not calls:
            calls.append(1)
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    monkeypatch.setattr(os, "chmod", chmod)
    real_os_open = os.open

    def os_open(path, flags, mode=0o777, *a, **k):  # as a non-root user would see it
        if (str(path).endswith(".promreflex-part") and os.path.exists(path) and flags & os.O_WRONLY
                and os.stat(path).st_mode & 0o200 == 0):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_os_open(path, flags, mode, *a, **k)
    monkeypatch.setattr(os, "open", os_open)
    Copier(src, dst, chunk_size=CHUNK).run()
    assert calls and (dst / "ro.txt").read_bytes() == f.read_bytes()
    assert (dst / "ro.txt").stat().st_mode & 0o777 == 0o444


# ---------------------------------------------------------------------- folders
def folder_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("f")
    os.chmod(src / "sub", 0o750)
    outdir = tmp_path / "outside-dir"
    outdir.mkdir()
    os.chmod(outdir, 0o700)
    os.utime(outdir, ns=(OLD_NS, OLD_NS))
    return src, dst, outdir


def test_a_folder_swapped_after_its_attributes_is_not_chmodded_nor_touched_through_the_symlink(tmp_path, monkeypatch):
    src, dst, outdir = folder_tree(tmp_path)
    done = []

    def swap(s: Path) -> None:
        if s == src / "sub" and not done:
            done.append(1)
            swap_for_symlink(dst / "sub", outdir)
    wrap_sync_xattrs(monkeypatch, swap)
    Copier(src, dst).run()
    assert done
    untouched(outdir, 0o700, text=None)


def test_a_folder_swapped_before_the_folder_pass_is_skipped_with_a_warning(tmp_path, caplog):
    """Swapped once the files are copied, before the folders get their metadata: not followed,
    warned, the copy ends."""
    src, dst, outdir = folder_tree(tmp_path)

    class Racing(Control):
        holds = 0

        def hold(self) -> None:
            Racing.holds += 1
            if Racing.holds == 2:  # (one file: the hold after it, before links and folders)
                swap_for_symlink(dst / "sub", outdir)
            super().hold()
    caught = None
    with caplog.at_level(logging.WARNING, logger="promreflex.copy"):
        try:
            progress = Copier(src, dst, control=Racing()).run()
        except Exception as e:  # (asserted below, after the outside folder)
            caught = e
    assert Racing.holds >= 2
    untouched(outdir, 0o700, text=None)
    assert caught is None and progress.state == "done"
    assert any("no longer a folder" in r.getMessage() for r in caplog.records)


def test_metadata_opens_are_never_left_open(tmp_path):
    """Every descriptor opened for metadata is closed (files, folders, a re-run's alignment)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(20):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"f{i}").write_text(str(i))
    before = len(os.listdir("/proc/self/fd"))
    Copier(src, dst).run()
    for p in dst.rglob("f*"):
        os.chmod(p, 0o600)
    Copier(src, dst).run()
    assert len(os.listdir("/proc/self/fd")) == before


def test_meta_open_refuses_what_is_not_a_regular_file(tmp_path):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    for name, folder in (("d", False), ("fifo", False), ("link", False), ("link", True), ("fifo", True)):
        with pytest.raises(copier_mod._Changed):
            copier_mod._Meta.open(tmp_path / name, folder=folder)
