"""``promreflex copy`` keeps what ``cp -a`` keeps: owner and group (as root; as a user what cp -a
keeps, compared with a real ``cp -a``), extended attributes and ACLs, hard links (across a stop
or a kill), holes (a checkpoint inside one, O_DIRECT), symlink mtimes, and brings a file already
complete in DST in line with the source's mode and owner. Each of these failed before (the copy
kept contents, modes and file mtimes only)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import random
import shutil
import stat
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from controllers.copy_guard.copier import (
    JOURNAL_VERSION,
    Control,
    Copier,
    Plan,
    Stopped,
    journal_path,
    make_plan,
    part_path,
    progress_path,
)

CHUNK = 4096
MiB = 1 << 20
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="giving files another owner (chown to uid 12345) needs root")


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after it runs (no checkpoint, no cleanup)."""


def _holds_user_xattrs(folder: Path) -> bool:
    probe = folder / ".xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture
def xdir(tmp_path) -> Iterator[Path]:
    """A folder on a filesystem with user extended attributes and ACLs: tmp_path (ext4 here),
    else one under /var/tmp (/tmp or tmp_path may be a tmpfs without user xattrs); skipped, and
    saying why, only if neither holds them."""
    if _holds_user_xattrs(tmp_path):
        yield tmp_path
        return
    other = Path(tempfile.mkdtemp(prefix="promreflex-xattr-", dir="/var/tmp"))
    try:
        if not _holds_user_xattrs(other):
            pytest.skip(f"neither {tmp_path} nor /var/tmp holds user extended attributes (findmnt -T shows "
                        "their filesystems): nothing here can keep them")
        yield other
    finally:
        shutil.rmtree(other, ignore_errors=True)


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL as the kernel stores it in system.posix_acl_*: version 2, then (tag, perm, id)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, qid) for tag, perm, qid in entries)


USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NOID = 0xFFFFFFFF
# u::rw-, u:12345:rw-, g::r--, g:4242:r--, m::rw-, o::---  (what `setfacl -m u:12345:rw,g:4242:r` gives)
FILE_ACL = acl((USER_OBJ, 6, NOID), (USER, 6, 12345), (GROUP_OBJ, 4, NOID), (GROUP, 4, 4242), (MASK, 6, NOID),
               (OTHER, 0, NOID))
# default ACL of a folder: u::rwx, u:12345:rwx, g::r-x, m::rwx, o::---
DIR_ACL = acl((USER_OBJ, 7, NOID), (USER, 7, 12345), (GROUP_OBJ, 5, NOID), (MASK, 7, NOID), (OTHER, 0, NOID))


def xattrs(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(os.listxattr(path, follow_symlinks=False))}


def meta(path: Path) -> tuple:
    s = path.lstat()
    return (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid, s.st_mtime_ns)


# ---------------------------------------------------------------------- owner and group
@needs_root
def test_as_root_files_folders_and_symlinks_get_the_sources_owner_and_group(tmp_path):
    src, dst = tmp_path / "www", tmp_path / "backup"
    (src / "wp-content" / "uploads").mkdir(parents=True)
    (src / "index.php").write_text("<?php\n")
    (src / "wp-content" / "uploads" / "a.jpg").write_bytes(os.urandom(3 * CHUNK + 5))
    (src / "current").symlink_to("wp-content")
    for path, (uid, gid) in {src: (33, 33), src / "index.php": (12345, 23456), src / "wp-content": (33, 4242),
                             src / "wp-content" / "uploads": (12345, 12345),
                             src / "wp-content" / "uploads" / "a.jpg": (54321, 33)}.items():
        os.chown(path, uid, gid)
    os.chown(src / "current", 777, 888, follow_symlinks=False)
    Copier(src, dst, chunk_size=CHUNK).run()
    for rel in ("", "index.php", "wp-content", "wp-content/uploads", "wp-content/uploads/a.jpg", "current"):
        assert meta(dst / rel) == meta(src / rel), rel
    assert (dst / "wp-content" / "uploads" / "a.jpg").read_bytes() == (src / "wp-content" / "uploads" / "a.jpg").read_bytes()


@needs_root
def test_setuid_and_setgid_bits_survive_the_chown(tmp_path):
    """chown clears setuid and setgid: the mode must come after the owner."""
    src = tmp_path / "src"
    (src / "shared").mkdir(parents=True)
    (src / "su").write_bytes(b"\x7fELF")
    os.chown(src / "su", 12345, 12345)
    os.chmod(src / "su", 0o4755)
    (src / "sg").write_bytes(b"#!/bin/sh\n")
    os.chown(src / "sg", 0, 4242)
    os.chmod(src / "sg", 0o2750)
    os.chown(src / "shared", 12345, 4242)
    os.chmod(src / "shared", 0o3775)
    Copier(src, tmp_path / "dst").run()
    for rel in ("su", "sg", "shared"):
        assert meta(tmp_path / "dst" / rel) == meta(src / rel), rel


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This process as ``uid``:``gid`` (effective ids, no supplementary groups) and back."""
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


@pytest.mark.skipif(not ROOT or not shutil.which("runuser") or not shutil.which("cp"),
                    reason="comparing with `cp -a` run as nobody needs root (to become nobody) and runuser")
def test_as_a_user_it_keeps_what_cp_a_keeps(caplog):
    """As a user who may not give files their owner: the owner cp -a gives (its own), the group
    where it may, no setuid/setgid/sticky on a file whose owner is not kept (a folder keeps its
    sticky bit), and the xattrs it may set; the rest silently (a refused attribute: warned)."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody to copy as")
    work = Path(tempfile.mkdtemp(prefix="promreflex-cp-a-", dir="/var/tmp"))  # (tmp_path is root's 0700)
    try:
        os.chmod(work, 0o755)
        src, out = work / "src", work / "out"
        src.mkdir()
        out.mkdir()
        os.chown(out, nobody.pw_uid, nobody.pw_gid)
        owners = {"other": (12345, 12345), "mine-other-group": (nobody.pw_uid, 12345),
                  "mine": (nobody.pw_uid, nobody.pw_gid)}
        for who, (uid, gid) in owners.items():
            for mode in (0o4755, 0o2755, 0o6755, 0o1755, 0o0644):
                f = src / f"f-{who}-{mode:o}"
                f.write_text(who)
                os.chown(f, uid, gid)
                os.chmod(f, mode)
            for mode in (0o1777, 0o2775, 0o3777, 0o0755):
                d = src / f"d-{who}-{mode:o}"
                d.mkdir()
                os.chown(d, uid, gid)
                os.chmod(d, mode)
            link = src / f"l-{who}"
            link.symlink_to(f"f-{who}-644")
            os.chown(link, uid, gid, follow_symlinks=False)
        tagged = src / "f-mine-644"
        can_xattr = _holds_user_xattrs(work)
        if can_xattr:
            os.setxattr(tagged, "user.origin", b"shop")
            os.setxattr(tagged, "security.promreflex-test", b"x")  # a user cannot set security.*
        os.chmod(src, 0o755)
        cp = subprocess.run(["runuser", "-u", nobody.pw_name, "--", "cp", "-a", str(src), str(out / "cp")],
                            capture_output=True, text=True)
        assert cp.returncode == 0, cp.stderr
        with as_user(nobody.pw_uid, nobody.pw_gid), caplog.at_level(logging.WARNING, logger="promreflex.copy"):
            progress = Copier(src, out / "ours").run()
        assert progress.state == "done" and not progress.unreadable
        names = sorted(os.listdir(src))
        assert sorted(os.listdir(out / "ours")) == names
        for name in [""] + names:
            s_cp, s_ours = (out / "cp" / name).lstat(), (out / "ours" / name).lstat()
            assert (s_ours.st_uid, s_ours.st_gid) == (s_cp.st_uid, s_cp.st_gid), name
            if not stat.S_ISLNK(s_cp.st_mode):
                assert oct(s_ours.st_mode) == oct(s_cp.st_mode), name
        assert stat.S_IMODE((out / "ours" / "f-other-6755").stat().st_mode) == 0o755  # not setuid nobody
        assert stat.S_IMODE((out / "ours" / "f-mine-6755").stat().st_mode) == 0o6755  # its own: kept
        if can_xattr:
            assert xattrs(out / "ours" / "f-mine-644") == xattrs(out / "cp" / "f-mine-644") == {"user.origin": b"shop"}
            refused = [r.getMessage() for r in caplog.records if "security.promreflex-test" in r.getMessage()]
            assert len(refused) == 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------- extended attributes and ACLs
def test_user_attributes_and_acls_are_copied(xdir):
    src, dst = xdir / "src", xdir / "dst"
    (src / "uploads").mkdir(parents=True)
    f = src / "uploads" / "invoice.pdf"
    f.write_bytes(os.urandom(2 * CHUNK + 3))
    os.chmod(f, 0o640)
    os.setxattr(f, "user.checksum", b"\x00\xffbinary\n value")  # a value is bytes, not text
    os.setxattr(f, "user.empty", b"")
    os.setxattr(f, "system.posix_acl_access", FILE_ACL)
    os.setxattr(src / "uploads", "system.posix_acl_default", DIR_ACL)
    os.setxattr(src / "uploads", "user.folder", b"f")
    Copier(src, dst, chunk_size=CHUNK).run()
    got = xattrs(dst / "uploads" / "invoice.pdf")
    assert got == xattrs(f) and {"user.checksum", "user.empty", "system.posix_acl_access"} <= set(got)
    assert got["user.checksum"] == b"\x00\xffbinary\n value"
    assert xattrs(dst / "uploads") == xattrs(src / "uploads") and "system.posix_acl_default" in xattrs(dst / "uploads")
    assert meta(dst / "uploads" / "invoice.pdf") == meta(f)  # the ACL and the mode agree
    if shutil.which("getfacl"):
        show = lambda p: subprocess.run(["getfacl", "-cp", str(p)], capture_output=True, text=True).stdout  # noqa: E731
        assert show(dst / "uploads" / "invoice.pdf") == show(f)


@needs_root
def test_file_capabilities_survive_the_chown(xdir):
    """security.capability (setcap cap_net_bind_service+ep) is cleared by chown: set after it."""
    src = xdir / "src"
    src.mkdir()
    exe = src / "server"
    exe.write_bytes(b"\x7fELF" + os.urandom(100))
    os.chown(exe, 12345, 12345)
    os.chmod(exe, 0o755)
    cap = struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0)  # VFS_CAP_REVISION_2 | effective, permitted
    try:
        os.setxattr(exe, "security.capability", cap)
    except OSError as e:
        pytest.skip(f"this filesystem refuses security.capability: {e.strerror}")
    Copier(src, xdir / "dst").run()
    out = xdir / "dst" / "server"
    assert os.getxattr(out, "security.capability") == os.getxattr(exe, "security.capability")
    assert meta(out) == meta(exe)


def test_an_attribute_refused_is_warned_once_per_name_and_the_copy_goes_on(xdir, monkeypatch, caplog):
    src = xdir / "src"
    src.mkdir()
    for i in range(3):
        p = src / f"f{i}"
        p.write_text(str(i))
        os.setxattr(p, "user.refused", b"r")
        os.setxattr(p, "user.kept", b"k")
    real = os.setxattr

    def setxattr(path, name, value, *a, **k):  # a destination that does not take this one
        if name == "user.refused":
            raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP), str(path))
        return real(path, name, value, *a, **k)

    monkeypatch.setattr(os, "setxattr", setxattr)
    with caplog.at_level(logging.WARNING, logger="promreflex.copy"):
        progress = Copier(src, xdir / "dst").run()
    assert progress.state == "done"
    for i in range(3):
        assert xattrs(xdir / "dst" / f"f{i}") == {"user.kept": b"k"}
    warned = [r.getMessage() for r in caplog.records if "user.refused" in r.getMessage()]
    assert len(warned) == 1 and "not kept" in warned[0]


def test_an_acl_inherited_in_the_destination_is_taken_away(xdir):
    """DST's folder has a default ACL (an old backup's): new files would inherit an access ACL
    the source files do not have."""
    src, dst = xdir / "src", xdir / "dst"
    src.mkdir()
    (src / "plain").write_bytes(b"p" * 100)
    os.chmod(src / "plain", 0o600)
    dst.mkdir()
    os.setxattr(dst, "system.posix_acl_default", DIR_ACL)
    Copier(src, dst).run()
    assert xattrs(dst / "plain") == {} and meta(dst / "plain") == meta(src / "plain")
    assert xattrs(dst) == xattrs(src)  # (the folder's own default ACL too)


# ---------------------------------------------------------------------- hard links
def hard_linked_tree(root: Path, size: int = 3 * CHUNK + 7) -> Path:
    (root / "a").mkdir(parents=True)
    (root / "z").mkdir()
    (root / "a" / "data.bin").write_bytes(os.urandom(size))
    os.link(root / "a" / "data.bin", root / "a" / "same.bin")
    os.link(root / "a" / "data.bin", root / "z" / "again.bin")
    (root / "solo.bin").write_bytes(os.urandom(100))
    os.link(root / "solo.bin", root.parent / f"outside-{root.name}")  # its other name is outside SRC
    return root


def test_hard_links_are_linked_in_the_destination_not_copied_again(tmp_path):
    src = hard_linked_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    copier = Copier(src, dst, chunk_size=CHUNK)
    assert copier.progress.total_bytes == 3 * CHUNK + 7 + 100  # the linked file counts once
    progress = copier.run()
    first = (dst / "a" / "data.bin").stat()
    for rel in ("a/same.bin", "z/again.bin"):
        assert os.path.samestat((dst / rel).stat(), first), rel
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
    assert first.st_nlink == 3 and (dst / "solo.bin").stat().st_nlink == 1
    assert progress.copied_bytes == progress.done_bytes == 3 * CHUNK + 7 + 100
    assert not list(dst.rglob("*.promreflex-part"))
    # The plan says so, and reads back as written (JOURNAL_VERSION 3).
    plan = make_plan(src, dst)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert [(f.rel, f.link) for f in plan.files] == [("solo.bin", -1), ("a/data.bin", -1), ("a/same.bin", 1),
                                                      ("z/again.bin", 2)]  # (each to the name before it)
    assert JOURNAL_VERSION == 3


def test_a_stop_between_two_names_of_a_hard_link_resumes_to_a_link(tmp_path):
    src = hard_linked_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    control = Control()

    def stop_after_the_first_name(c: Copier) -> None:
        item = c.plan.files[c.next_index]
        if item.rel == "a/data.bin" and c.offset == item.size:
            control.stop()

    first = Copier(src, dst, chunk_size=CHUNK, control=control, on_chunk=stop_after_the_first_name)
    with pytest.raises(Stopped):
        first.run()
    assert (dst / "a" / "data.bin").exists() and not (dst / "a" / "same.bin").exists()
    second = Copier(src, dst, chunk_size=CHUNK)
    assert second.plan.files[second.next_index].rel == "a/same.bin"
    second.run()
    assert second.progress.copied_bytes == 0  # the names left are links
    ino = (dst / "a" / "data.bin").stat()
    assert os.path.samestat((dst / "a" / "same.bin").stat(), ino)
    assert os.path.samestat((dst / "z" / "again.bin").stat(), ino)


def test_killed_after_a_link_before_the_journal_the_resume_keeps_it(tmp_path):
    src = hard_linked_tree(tmp_path / "src")
    (src / "z" / "zz-last.bin").write_bytes(os.urandom(4 * CHUNK))  # (after z/again.bin, the last link)
    dst = tmp_path / "dst"

    def crash_in_the_last(c: Copier) -> None:
        if c.plan.files[c.next_index].rel == "z/zz-last.bin":
            raise Crash()

    with pytest.raises(Crash):
        Copier(src, dst, chunk_size=CHUNK, checkpoint_files=1000, checkpoint_seconds=float("inf"),
               checkpoint_bytes=1 << 30, on_chunk=crash_in_the_last).run()
    assert os.path.samestat((dst / "a" / "same.bin").stat(), (dst / "a" / "data.bin").stat())
    again = Copier(src, dst, chunk_size=CHUNK)
    assert again.next_index == 0  # (the journal never said more)
    again.run()
    assert again.progress.copied_bytes == 4 * CHUNK
    ino = (dst / "a" / "data.bin").stat()
    assert ino.st_nlink == 3 and os.path.samestat((dst / "z" / "again.bin").stat(), ino)
    assert not list(dst.rglob("*.promreflex-part")) and not journal_path(dst).exists()


def test_a_name_split_off_since_the_plan_is_copied_apart_and_the_others_still_linked(tmp_path):
    src = hard_linked_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    control = Control()
    control.stop()
    with pytest.raises(Stopped):
        Copier(src, dst, control=control).run()  # the plan: three names of one file
    new = src / "a" / ".same.new"
    new.write_bytes(b"an editor saved a new file under this name")
    new.rename(src / "a" / "same.bin")
    copier = Copier(src, dst, chunk_size=CHUNK)
    copier.run()
    assert (dst / "a" / "same.bin").read_bytes() == b"an editor saved a new file under this name"
    assert (dst / "a" / "same.bin").stat().st_nlink == 1
    assert os.path.samestat((dst / "z" / "again.bin").stat(), (dst / "a" / "data.bin").stat())
    assert copier.progress.done_bytes == copier.progress.total_bytes


def test_a_link_left_under_a_part_name_by_a_kill_is_never_written_through(tmp_path):
    """Killed between the link (under the part name) and its rename; then the name split off in
    the source: it is copied apart, and the copy it was linked to is not touched."""
    src = hard_linked_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    control = Control()

    def stop_after_the_first_name(c: Copier) -> None:
        item = c.plan.files[c.next_index]
        if item.rel == "a/data.bin" and c.offset == item.size:
            control.stop()

    with pytest.raises(Stopped):
        Copier(src, dst, chunk_size=CHUNK, control=control, on_chunk=stop_after_the_first_name).run()
    os.link(dst / "a" / "data.bin", part_path(dst / "a" / "same.bin"))  # (the kill came here)
    new = src / "a" / ".same.new"
    new.write_bytes(b"now a file of its own")
    new.rename(src / "a" / "same.bin")
    Copier(src, dst, chunk_size=CHUNK).run()
    assert (dst / "a" / "same.bin").read_bytes() == b"now a file of its own"
    assert (dst / "a" / "data.bin").read_bytes() == (src / "a" / "data.bin").read_bytes()
    assert meta(dst / "a" / "data.bin") == meta(src / "a" / "data.bin")
    assert not list(dst.rglob("*.promreflex-part"))


def test_a_symlink_left_under_a_part_name_is_never_followed(tmp_path):
    """A symlink is made under the part name, then renamed; killed in between, and the name a
    file in the source now: the copy writes its own part file, not through the link."""
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside.txt"
    src.mkdir()
    (src / "config").write_bytes(b"the file it is now")
    dst.mkdir()
    outside.write_bytes(b"not the copy's")
    outside.chmod(0o400)
    part_path(dst / "config").symlink_to(outside)
    Copier(src, dst).run()
    assert outside.read_bytes() == b"not the copy's" and stat.S_IMODE(outside.stat().st_mode) == 0o400
    assert (dst / "config").read_bytes() == b"the file it is now" and not (dst / "config").is_symlink()
    assert not part_path(dst / "config").is_symlink()


# ---------------------------------------------------------------------- holes
def sparse_file(path: Path, size: int, extents: list[tuple[int, int]], seed: int = 1) -> bytes:
    """``size`` bytes, data only at ``extents`` (offset, length), holes elsewhere."""
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, length in extents:
            f.seek(off)
            f.write(rnd.randbytes(length))
    if path.stat().st_blocks * 512 >= size:
        pytest.skip(f"the filesystem of {path.parent} does not keep holes")
    return path.read_bytes()


def blocks(path: Path) -> int:
    return path.stat().st_blocks * 512


@pytest.mark.parametrize("io", ["fadvise", "direct", "buffered"])
def test_a_sparse_file_is_written_sparse(tmp_path, io):
    src = tmp_path / "vm.img"
    data = sparse_file(src, 64 * MiB, [(0, 70_000), (5 * MiB + 3 * CHUNK, 9000), (40 * MiB, 2 * MiB + 5),
                                       (64 * MiB - 100, 100)])
    out = tmp_path / "out.img"
    copier = Copier(src, out, chunk_size=MiB, io=io, checkpoint_bytes=MiB)
    copier.run()
    assert out.read_bytes() == data
    assert blocks(out) <= blocks(src) + 64 * 1024  # (an extent's rounding, not the holes' 60 MiB)
    assert copier.progress.copied_bytes < 3 * MiB and copier.progress.done_bytes == 64 * MiB


def test_a_checkpoint_inside_a_hole_resumes_there_and_stays_sparse(tmp_path):
    """The journal says 4 MiB into an 8 MiB hole (an older, dense copy's checkpoint) and the part
    file has those bytes, with garbage after them: cut back, the hole skipped, the rest copied."""
    src, out = tmp_path / "db.ibd", tmp_path / "copy.ibd"
    data = sparse_file(src, 16 * MiB, [(0, 1 * MiB), (9 * MiB, 1 * MiB), (16 * MiB - 10, 10)])
    control = Control()
    control.stop()
    with pytest.raises(Stopped):
        Copier(src, out, chunk_size=MiB, control=control).run()
    journal = journal_path(out)
    jid = json.loads(journal.read_text())["id"]
    progress_path(journal).write_text(json.dumps({"id": jid, "next": 0, "offset": 4 * MiB}))
    with open(part_path(out), "wb") as f:
        f.write(data[: 1 * MiB])
        f.truncate(4 * MiB)
        f.seek(4 * MiB)
        f.write(b"garbage written after the checkpoint")
    copier = Copier(src, out, chunk_size=MiB)
    assert copier.progress.resumed_from == 4 * MiB
    copier.run()
    assert out.read_bytes() == data
    assert copier.progress.copied_bytes == 1 * MiB + CHUNK  # the data after the hole only (whole blocks)
    assert blocks(out) <= blocks(src) + 64 * 1024


def test_killed_at_random_chunks_a_sparse_file_resumes_identical_and_sparse(tmp_path):
    rnd = random.Random(7)
    src = tmp_path / "src"
    src.mkdir()
    expected = {}
    for i in range(3):
        expected[f"s{i}"] = sparse_file(src / f"s{i}", 2 * MiB, [(rnd.randrange(0, 64) * CHUNK, rnd.randint(1, 5 * CHUNK)),
                                                                 (rnd.randrange(128, 256) * CHUNK, 3 * CHUNK + i),
                                                                 (2 * MiB - 1 - i, 1 + i)], seed=i)
    dst = tmp_path / "dst"
    chunk = 8 * CHUNK  # (a dense copy, 192 chunks, ends too: and fails on its blocks)
    runs = 0
    while True:
        runs += 1
        assert runs < 500, "the copy never finished"
        left = [rnd.randint(1, 4)]

        def maybe_crash(c: Copier, left=left) -> None:
            left[0] -= 1
            if left[0] == 0:
                part = part_path(c.final_path(c.plan.files[c.next_index]))
                with open(part, "ab") as f:
                    f.write(b"garbage after the checkpoint")
                raise Crash()

        try:
            Copier(src, dst, chunk_size=chunk, checkpoint_bytes=chunk * rnd.randint(1, 3), on_chunk=maybe_crash).run()
            break
        except Crash:
            for name, want in expected.items():
                if (dst / name).exists():
                    assert (dst / name).read_bytes() == want, name
    assert runs > 1
    for name, want in expected.items():
        assert (dst / name).read_bytes() == want
        assert blocks(dst / name) <= blocks(src / name) + 2 * chunk, name
    assert not list(dst.rglob("*.promreflex-part"))


# ---------------------------------------------------------------------- symlinks, files done before
def test_symlink_mtimes_are_kept_even_for_a_symlink_already_in_dst(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "current").symlink_to("releases/42")
    os.utime(src / "current", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000), follow_symlinks=False)
    dst.mkdir()
    (dst / "old").symlink_to("releases/41")  # (not in the source: left alone)
    Copier(src, dst).run()
    assert (dst / "current").lstat().st_mtime_ns == 1_600_000_000_000_000_000
    assert os.readlink(dst / "current") == "releases/42"
    os.utime(src / "current", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000), follow_symlinks=False)
    Copier(src, dst).run()  # the same link, a new mtime
    assert (dst / "current").lstat().st_mtime_ns == 1_700_000_000_000_000_000
    assert not list(dst.glob("*.promreflex-part"))


def test_a_file_already_complete_in_dst_gets_the_sources_mode_and_owner(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    f = src / "wp-config.php"
    f.write_text("<?php define('DB_PASSWORD', 'x');\n")
    os.chmod(f, 0o644)
    Copier(src, dst).run()
    os.chmod(f, 0o640)  # tightened after the last backup: the mtime does not change
    if ROOT:
        os.chown(f, 33, 33)
    again = Copier(src, dst)
    again.run()
    assert again.progress.copied_bytes == 0  # size and mtime equal: not copied again
    assert meta(dst / "wp-config.php") == meta(f)


def test_a_copy_journaled_by_the_version_before_goes_on_and_links(tmp_path):
    """A journal of version 2 (no owners, no hard links in its plan): planned again, the file it
    was in goes on from its offset (not copied from the start), the hard links are linked."""
    src = hard_linked_tree(tmp_path / "src", size=8 * CHUNK)
    big = src / "big.bin"
    big.write_bytes(os.urandom(10 * CHUNK))
    dst = tmp_path / "dst"
    (dst / "a").mkdir(parents=True)
    (dst / "z").mkdir()
    rels = ["a/data.bin", "a/same.bin", "big.bin", "solo.bin", "z/again.bin"]
    files = [[r, (src / r).stat().st_size, (src / r).stat().st_mtime_ns, 0o644] for r in rels]
    old_plan = {"src": str(src), "dst": str(dst), "single": False, "files": files,
                "dirs": [["", 0o755, 0], ["a", 0o755, 0], ["z", 0o755, 0]], "links": [], "skipped": [],
                "unreadable": []}
    # The old version had copied a/data.bin and a/same.bin (apart) and 6 chunks of big.bin.
    for r in rels[:2]:
        shutil.copy2(src / r, dst / r)
    with open(part_path(dst / "big.bin"), "wb") as part:
        part.write(big.read_bytes()[: 6 * CHUNK])
    journal_path(dst).write_text(json.dumps({"version": 2, "id": "0123456789abcdef", "plan": old_plan}))
    progress_path(journal_path(dst)).write_text(json.dumps({"id": "0123456789abcdef", "next": 2, "offset": 6 * CHUNK}))
    copier = Copier(src, dst, chunk_size=CHUNK)
    copier.run()
    assert copier.progress.copied_bytes == 4 * CHUNK + 100  # the rest of big.bin, and solo.bin
    assert big.read_bytes() == (dst / "big.bin").read_bytes()
    ino = (dst / "a" / "data.bin").stat()
    assert os.path.samestat((dst / "a" / "same.bin").stat(), ino)  # the old separate copy: a link now
    assert os.path.samestat((dst / "z" / "again.bin").stat(), ino)
    assert not list(dst.rglob("*.promreflex-part")) and not journal_path(dst).exists()
