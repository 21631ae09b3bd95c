"""``promreflex copy`` / ``copy-guard`` argument handling, adopt, list and resume-all."""

from __future__ import annotations

import argparse
import subprocess

import pytest

from controllers.copy_guard import freeze
from controllers.copy_guard.cli import parse_size, register
from promreflex.cli import main
from controllers.copy_guard.registry import Registry


@pytest.mark.parametrize("text, value", [("1048576", 1 << 20), ("1M", 1 << 20), ("64K", 65536), ("64KiB", 65536),
                                         ("2g", 2 << 30), ("0", 0), ("1.5M", 1572864)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1M", "1X", "M"])
def test_bad_sizes(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_register_adds_both_subcommands():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["copy", "a", "b", "--rate-limit", "10M", "--io", "direct", "--site", "shop"])
    assert (args.rate_limit, args.io, args.site, args.chunk_size) == (10 << 20, "direct", "shop", 1 << 20)
    with pytest.raises(SystemExit):
        parser.parse_args(["copy", "a", "b", "--site", "../x"])
    with pytest.raises(SystemExit):
        parser.parse_args(["copy-guard", "adopt", "--pid", "1", "--pgid", "1"])


def test_copy_of_a_missing_source_is_a_usage_error(tmp_path, capsys):
    assert main(["copy", str(tmp_path / "nope"), str(tmp_path / "x"), "--no-register"]) == 2
    assert "cannot read source" in capsys.readouterr().err


def test_adopt_list_resume_all(tmp_path, capsys):
    reg = tmp_path / "copies"
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert main(["copy-guard", "adopt", f"--pgid={sleeper.pid}", "--site=shop", f"--registry.dir={reg}",
                     "--id=s1", "--src=/data", "--dst=/backup"]) == 0
        assert "adopted process group" in capsys.readouterr().out
        entry = Registry(reg).get("s1")
        entry.pause = freeze.pause("s1", pgid=sleeper.pid, methods=["signal"])
        Registry(reg).update(entry)
        assert main(["copy-guard", "list", f"--registry.dir={reg}"]) == 0
        out = capsys.readouterr().out
        assert "s1" in out and "signal" in out and "/data -> /backup" in out
        assert main(["copy-guard", "resume-all", f"--registry.dir={reg}"]) == 0
        assert freeze.stopped(sleeper.pid) is False
        assert Registry(reg).get("s1").pause is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert main(["copy-guard", "adopt", "--pid=999999999", f"--registry.dir={reg}"]) == 1


def test_copy_refuses_a_token_file_others_can_read(tmp_path, capsys):
    src = tmp_path / "src"
    src.write_bytes(b"x")
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o644)
    assert main(["copy", str(src), str(tmp_path / "dst"), "--no-register", f"--web.token-file={token}"]) == 2
    err = capsys.readouterr().err
    assert "chmod 600" in err and err.count("\n") == 1
    assert not (tmp_path / "dst").exists()


def test_commands_run_from_different_directories_share_one_registry(tmp_path, monkeypatch, capsys):
    from controllers.copy_guard import registry as registry_mod

    monkeypatch.setenv(registry_mod.ENV_DIR, str(tmp_path / "copies"))
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        monkeypatch.chdir(tmp_path / "a")
        assert main(["copy-guard", "adopt", f"--pid={sleeper.pid}", "--id=s2"]) == 0
        monkeypatch.chdir(tmp_path / "b")
        capsys.readouterr()
        assert main(["copy-guard", "list"]) == 0
        assert "s2" in capsys.readouterr().out
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not (tmp_path / "a" / ".promreflex").exists()


def test_list_shows_an_adopted_copys_duty(tmp_path, capsys):
    reg = tmp_path / "copies"
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert main(["copy-guard", "adopt", f"--pid={sleeper.pid}", f"--registry.dir={reg}", "--id=s3"]) == 0
        entry = Registry(reg).get("s3")
        entry.pause = {"method": "signal", "pids": [sleeper.pid], "duty": 0.25, "until": 0}
        Registry(reg).update(entry)
        capsys.readouterr()
        assert main(["copy-guard", "list", f"--registry.dir={reg}"]) == 0
        assert "signal 25%" in capsys.readouterr().out
    finally:
        sleeper.kill()
        sleeper.wait()


def test_list_shows_what_a_promreflex_copy_says_of_itself():
    """`copy-guard list` showed "-" for a `promreflex copy` even while it was paused."""
    import json

    from controllers.copy_guard.cli import _copy_state
    from tests.unit.test_copy_guard_doctor import Quiet, serving

    answer = {"state": "paused", "share": 0.0}

    class Status(Quiet):
        def do_GET(self) -> None:  # noqa: N802
            self.reply(json.dumps(answer).encode())

    with serving(Status) as address:
        url = f"http://{address}"
        assert _copy_state(url) == "paused"
        answer.update(state="throttled", share=0.25)
        assert _copy_state(url) == "25%"
        answer.update(state="running", share=1.0)
        assert _copy_state(url) == "no"
    assert _copy_state(url) == "?"  # it no longer answers
    assert _copy_state(None) == "-"


def test_adopt_refuses_what_is_never_a_copy_and_forget_undoes_one(tmp_path, capsys):
    """A stranger's review: `adopt --pid 1` was accepted (its freeze takes every process on the
    host), as was the shop's own nginx or php-fpm, frozen at the shop's busiest; and nothing
    undid an adoption but deleting its JSON by hand."""
    import os
    import sys

    reg = tmp_path / "copies"
    assert main(["copy-guard", "adopt", "--pid=1", f"--registry.dir={reg}"]) == 1
    assert "PID 1" in capsys.readouterr().err
    assert main(["copy-guard", "adopt", "--pid=1", "--force", f"--registry.dir={reg}"]) == 1  # never, even forced
    assert main(["copy-guard", "adopt", f"--pid={os.getpid()}", f"--registry.dir={reg}"]) == 1  # this command itself
    capsys.readouterr()
    nginx = subprocess.Popen(["bash", "-c", 'exec -a nginx sleep 30'])
    try:
        from promreflex.proc import wait_until
        from controllers.nginx_tuner.procfs import cmdline

        wait_until(lambda: cmdline(nginx.pid).startswith("nginx"), timeout=10, what="the stand-in nginx")
        assert main(["copy-guard", "adopt", f"--pid={nginx.pid}", f"--registry.dir={reg}"]) == 1
        assert "not a copy; --force if it really is the copy" in capsys.readouterr().err
        assert Registry(reg).entries() == []
    finally:
        nginx.kill()
        nginx.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert main(["copy-guard", "adopt", f"--pid={sleeper.pid}", f"--registry.dir={reg}", "--id=mistake"]) == 0
        entry = Registry(reg).get("mistake")
        entry.pause = freeze.pause("mistake", pid=sleeper.pid, methods=["signal"])
        Registry(reg).update(entry)
        assert freeze.stopped(sleeper.pid) is True
        assert main(["copy-guard", "forget", "mistake", f"--registry.dir={reg}"]) == 0
        assert freeze.stopped(sleeper.pid) is False and Registry(reg).get("mistake") is None
        assert main(["copy-guard", "forget", "mistake", f"--registry.dir={reg}"]) == 1
    finally:
        sleeper.kill()
        sleeper.wait()
