"""The copy registry and the adoption fallbacks (without touching real cgroups)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controllers.copy_guard import freeze
from controllers.copy_guard.registry import Entry, Registry, check_dir, process_start


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_add_list_and_remove(tmp_path):
    reg = Registry(tmp_path / "copies")
    me = os.getpid()
    reg.add(Entry(id="b", kind="copier", pid=me, pid_start=process_start(me), site="shop", created=2.0))
    reg.add(Entry(id="a", kind="adopted", pid=me, pid_start=process_start(me), pgid=None, site="blog", created=1.0))
    assert [e.id for e in reg.entries()] == ["a", "b"]
    assert [e.id for e in reg.for_site("shop")] == ["b"]
    assert reg.sites() == {"shop": 1, "blog": 1}
    reg.remove("a")
    reg.remove("a")  # twice is fine
    assert [e.id for e in reg.entries()] == ["b"]


def test_stale_entries_are_ignored_and_cleaned(tmp_path):
    reg = Registry(tmp_path)
    me = os.getpid()
    reg.add(Entry(id="dead", kind="copier", pid=dead_pid(), site="shop"))
    # Same PID, another process (PID reuse): the start time does not match.
    reg.add(Entry(id="reused", kind="adopted", pid=me, pid_start=(process_start(me) or 0) + 1, site="shop"))
    reg.add(Entry(id="live", kind="copier", pid=me, pid_start=process_start(me), site="shop"))
    assert [e.id for e in reg.entries()] == ["live"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json"]


def test_unreadable_files_are_skipped_not_fatal(tmp_path):
    reg = Registry(tmp_path)
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text(json.dumps({"id": "../x", "kind": "copier", "pid": 1, "site": "s"}))
    (tmp_path / "kind.json").write_text(json.dumps({"id": "k", "kind": "rm -rf", "pid": 1, "site": "s"}))
    assert reg.entries() == []
    assert Registry(tmp_path / "missing").entries() == []


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", "x" * 65])
def test_ids_cannot_be_paths(tmp_path, bad):
    with pytest.raises(ValueError):
        Registry(tmp_path).path(bad)


def test_detect_falls_back_to_signals_without_cgroups(tmp_path, monkeypatch):
    monkeypatch.setattr(freeze, "CGROUP_ROOT", tmp_path / "no-cgroups")
    assert freeze.detect() == ["signal"]
    assert freeze.v2_root() is None and freeze.v1_freezer_root() is None


def test_a_failing_method_falls_back_to_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(freeze, "CGROUP_ROOT", tmp_path / "no-cgroups")
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        record = freeze.pause("t1", pgid=sleeper.pid, methods=["cgroup2", "cgroup1", "signal"])
        assert record["method"] == "signal"
        assert freeze.is_frozen(record)
        freeze.resume(record)
        assert not freeze.is_frozen(record)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_never_pauses_init_or_itself():
    with pytest.raises(freeze.PauseError, match="refusing"):
        freeze.pause("t3", pid=1, methods=["signal"])
    with pytest.raises(freeze.PauseError, match="refusing"):
        freeze.pause("t4", pgid=os.getpgrp(), methods=["signal"])


def test_pausing_nothing_is_an_error():
    with pytest.raises(freeze.PauseError):
        freeze.pause("t2", pid=dead_pid())
    with pytest.raises(freeze.PauseError):
        freeze.resume({"method": "teleport"})


def test_members_of_a_pid_include_its_children():
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        from promreflex.proc import wait_until

        kids = wait_until(lambda: len(freeze.descendants(parent.pid)) == 3 and freeze.descendants(parent.pid),
                          timeout=10, what="two children")
        assert parent.pid in kids
        assert freeze.group_members(parent.pid) == kids  # new session: the group is the same set
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()


def test_start_times_come_from_psutil_and_tell_a_reused_pid():
    import psutil

    me = os.getpid()
    assert process_start(me) == psutil.Process(me).create_time()
    assert process_start(dead_pid()) is None
    assert Entry(id="x", kind="copier", pid=me, pid_start=process_start(me), site="s").alive()
    assert not Entry(id="x", kind="copier", pid=me, pid_start=process_start(me) - 1, site="s").alive()


def test_a_zombie_is_not_alive():
    import psutil

    from promreflex.proc import wait_until

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, timeout=10, what="a zombie")
    try:
        assert not Entry(id="z", kind="adopted", pid=child.pid, site="s").alive()
    finally:
        child.wait()


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o1777])
def test_a_registry_others_can_write_is_refused(tmp_path, mode):
    from promreflex.errors import UserError

    d = tmp_path / "copies"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(UserError, match="writable by group or others"):
        check_dir(d)
    with pytest.raises(UserError):  # and nothing registers into it
        Registry(d).add(Entry(id="a", kind="adopted", pid=os.getpid(), site="s"))
    assert list(d.iterdir()) == []


@pytest.mark.parametrize("theirs", ["copies", "parent"])
def test_a_registry_owned_by_someone_else_or_under_their_directory_is_refused(tmp_path, theirs):
    from promreflex.errors import UserError

    if os.geteuid() != 0:
        pytest.fail("needs root to chown (this suite runs as root)")
    d = tmp_path / "parent" / "copies"
    d.mkdir(mode=0o700, parents=True)
    os.chown(tmp_path / theirs if theirs == "parent" else d, 12345, 12345)
    words = "above it is owned by uid 12345" if theirs == "parent" else "copies is owned by uid 12345"
    with pytest.raises(UserError, match=words):
        check_dir(d, create=True)


@pytest.mark.parametrize("via", ["parent", "link"])
def test_a_registry_under_a_directory_others_can_write_is_refused(tmp_path, via):
    """Whoever can write a directory above the registry can rename it away and put their own
    in its place (or repoint a link): refused like a registry they can write."""
    from promreflex.errors import UserError

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    (shared / "copies").mkdir(mode=0o700)
    shared.chmod(0o777)  # no sticky bit
    target = shared / "copies"
    if via == "link":  # a private-looking path whose link resolves under the shared directory
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "copies").symlink_to(target)
        target = private / "copies"
    with pytest.raises(UserError, match=f"{shared} above it is writable by group or others"):
        check_dir(target)
    with pytest.raises(UserError):
        Registry(target).add(Entry(id="a", kind="adopted", pid=os.getpid(), site="s"))
    assert list((shared / "copies").iterdir()) == []
    shared.chmod(0o1777)  # sticky, like /tmp: nobody can rename what another user owns
    check_dir(target)


def test_a_link_someone_else_owns_on_the_way_is_refused_even_in_a_sticky_directory(tmp_path):
    """A link planted in /tmp by another user to a private directory of ours passes a check
    that follows links, and its owner can repoint it afterwards: refused."""
    from promreflex.errors import UserError

    if os.geteuid() != 0:
        pytest.fail("needs root to chown (this suite runs as root)")
    sticky = tmp_path / "sticky"
    sticky.mkdir(mode=0o700)
    sticky.chmod(0o1777)
    private = tmp_path / "private"
    (private / "copies").mkdir(mode=0o700, parents=True)
    link = sticky / "promreflex"
    link.symlink_to(private)
    check_dir(link / "copies")  # our own link: fine
    os.lchown(link, 12345, 12345)
    with pytest.raises(UserError, match=f"symbolic link {link} on the way is owned by uid 12345"):
        check_dir(link / "copies")


def test_a_loop_of_links_is_a_one_line_refusal(tmp_path):
    from promreflex.errors import UserError

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UserError, match="too many levels of symbolic links"):
        check_dir(tmp_path / "a" / "copies", create=True)


def test_missing_directories_are_made_private_whatever_the_umask(tmp_path):
    """Under umask 002 (Ubuntu's), parents made with the umask came out group-writable and the
    second start refused the registry the first one had made."""
    old = os.umask(0o002)
    try:
        reg = Registry(tmp_path / "state" / "promreflex" / "copies")
        reg.add(Entry(id="a", kind="adopted", pid=os.getpid(), site="s"))
        reg.add(Entry(id="b", kind="adopted", pid=os.getpid(), site="s"))
    finally:
        os.umask(old)
    for d in (tmp_path / "state", tmp_path / "state" / "promreflex", reg.dir):
        assert d.stat().st_mode & 0o077 == 0, d


def test_a_new_registry_is_private(tmp_path):
    reg = Registry(tmp_path / "a" / "copies")
    reg.add(Entry(id="a", kind="adopted", pid=os.getpid(), site="s"))
    assert (tmp_path / "a" / "copies").stat().st_mode & 0o077 == 0
    check_dir(reg.dir)


@pytest.mark.parametrize("bad", [{"pid": True}, {"pid": -1}, {"pid_start": "yesterday"}, {"control_url": 5},
                                 {"site": ["a"]}, {"id": 5}])
def test_entries_with_wrongly_typed_fields_are_skipped(tmp_path, bad):
    good = {"id": "k", "kind": "copier", "pid": os.getpid(), "site": "s"}
    (tmp_path / "k.json").write_text(json.dumps({**good, **bad}))
    assert Registry(tmp_path).entries() == []


def test_the_default_registry_is_absolute_and_the_same_from_any_directory(tmp_path, monkeypatch):
    """Issue 16: the default was `.promreflex/copies`, relative to each command's working
    directory, so a copy started elsewhere registered where the controller never looked."""
    from controllers.copy_guard import registry as registry_mod

    monkeypatch.delenv(registry_mod.ENV_DIR, raising=False)
    monkeypatch.setattr(registry_mod.os, "geteuid", lambda: 0)
    assert registry_mod.default_dir() == Path("/var/lib/promreflex/copies")
    monkeypatch.setattr(registry_mod.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    seen = set()
    for cwd in (tmp_path, tmp_path / "elsewhere"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        seen.add(Registry().dir)
    assert seen == {tmp_path / "state" / "promreflex" / "copies"}
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert registry_mod.default_dir() == tmp_path / "home" / ".local" / "state" / "promreflex" / "copies"
    monkeypatch.setenv(registry_mod.ENV_DIR, "rel/copies")
    assert registry_mod.default_dir() == tmp_path / "elsewhere" / "rel" / "copies"


def test_the_entry_lock_serialises_its_holders(tmp_path):
    import threading

    reg = Registry(tmp_path / "copies")
    order: list[str] = []
    inside = threading.Event()

    def other() -> None:
        with reg.locked("c1"):
            order.append("other")

    with reg.locked("c1"):
        t = threading.Thread(target=other)
        t.start()
        inside.wait(0.2)  # give the other thread every chance to enter (it must not)
        order.append("first")
    t.join(10)
    assert order == ["first", "other"]
    reg.remove("c1")
    assert not reg.lock_path("c1").exists()


def test_a_copys_cgroup_name_is_its_registrys(tmp_path):
    """Two registries' copies of one name are two cgroups; one registry reached through a link is one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    a, b = freeze.cgroup_name(tmp_path / "a", "backup"), freeze.cgroup_name(tmp_path / "b", "backup")
    assert a != b and a.startswith("backup-") and b.startswith("backup-")
    assert freeze.cgroup_name(tmp_path / "link", "backup") == a
