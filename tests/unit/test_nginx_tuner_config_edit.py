"""One-line edits of nginx configs (controllers.nginx_tuner.config_edit), on fixture copies."""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import crossplane
import pytest

from controllers.nginx_tuner import config_edit
from controllers.nginx_tuner.config_edit import ConfigEditError, get_directive, restore_backup, set_directive

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nginx"


@pytest.fixture
def conf(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A private copy of the fixture folder given by indirect parametrisation."""
    name = request.param
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest / "nginx.conf"


def changes(before: str, after: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) between two texts, per difflib."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [ln[1:] for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if config_edit.DEFAULT_BACKUP_DIRNAME not in p.parts)



@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_changes_exactly_one_line_and_keeps_second_argument(conf: Path) -> None:
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", 30)
    after = conf.read_text()
    removed, added = changes(before, after)
    assert removed == ["    keepalive_timeout 65 60;  # second value: Keep-Alive response header"]
    assert added == ["    keepalive_timeout 30 60;  # second value: Keep-Alive response header"]
    assert (res.file, res.line, res.old_args, res.new_args, res.inserted, res.changed) == (conf, 14, ("65", "60"), ("30", "60"), False, True)
    assert get_directive(conf, "keepalive_timeout").args == ("30", "60")


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_sequence_value_replaces_all_arguments(conf: Path) -> None:
    before = conf.read_text()
    set_directive(conf, "keepalive_timeout", ["20s"])
    removed, added = changes(before, conf.read_text())
    assert (len(removed), added) == (1, ["    keepalive_timeout 20s;  # second value: Keep-Alive response header"])


@pytest.mark.parametrize("conf", ["absent"], indirect=True)
def test_absent_directive_is_inserted_as_one_line_in_http(conf: Path) -> None:
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "15")
    removed, added = changes(before, conf.read_text())
    assert removed == []
    assert added == [f"\tkeepalive_timeout 15;  {config_edit.INSERT_COMMENT}"]  # the block's tab indent
    assert res.inserted and res.old_args is None and "absent" in res.message and "inserted" in res.message
    http = next(d for d in crossplane.parse(str(conf))["config"][0]["parsed"] if d["directive"] == "http")
    assert [d["args"] for d in http["block"] if d["directive"] == "keepalive_timeout"] == [["15"]]
    assert get_directive(conf, "keepalive_timeout").line == res.line == 9


@pytest.mark.parametrize("conf", ["include"], indirect=True)
def test_directive_in_included_file_is_edited_there(conf: Path) -> None:
    main_before = conf.read_bytes()
    inc = conf.parent / "conf.d" / "tuning.conf"
    inc_before = inc.read_text()
    res = set_directive(conf, "keepalive_timeout", "40s")
    assert res.file == inc
    assert conf.read_bytes() == main_before
    assert changes(inc_before, inc.read_text()) == (["keepalive_timeout 75s;"], ["keepalive_timeout 40s;"])


@pytest.mark.parametrize("conf", ["include"], indirect=True)
def test_a_symlinked_include_stays_a_link_and_its_target_is_edited(conf: Path) -> None:
    """sites-enabled/x -> ../sites-available/x: the file nginx reads through the link is edited
    and the link stays (replacing it with a file forked the config), backup and restore too."""
    inc = conf.parent / "conf.d" / "tuning.conf"
    real = conf.parent / "available.conf"
    inc.rename(real)
    inc.symlink_to(Path("..") / real.name)
    before = real.read_text()
    res = set_directive(conf, "keepalive_timeout", "40s")
    assert inc.is_symlink() and "keepalive_timeout 40s;" in real.read_text()
    config_edit.restore_backup(res.file, conf.parent / config_edit.DEFAULT_BACKUP_DIRNAME)
    assert inc.is_symlink() and real.read_text() == before


@pytest.mark.parametrize("conf", ["servers"], indirect=True)
def test_named_server_only_changes_that_server(conf: Path) -> None:
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "12", server_name="www.shop.example")
    assert changes(before, conf.read_text()) == (["        keepalive_timeout 30;"], ["        keepalive_timeout 12;"])
    assert res.line == 9
    assert get_directive(conf, "keepalive_timeout").args == ("65",)  # http level untouched


@pytest.mark.parametrize("conf", ["servers"], indirect=True)
def test_a_server_name_is_found_whatever_its_case(conf: Path) -> None:
    """nginx compares host names without regard to case; `--nginx.server-name` was exact (a
    stranger's review: `server_name Shop.Example.COM;` was "found 0")."""
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "12", server_name="WWW.Shop.Example")
    assert res.changed and res.line == 9
    assert changes(before, conf.read_text()) == (["        keepalive_timeout 30;"], ["        keepalive_timeout 12;"])


@pytest.mark.parametrize("conf", ["servers"], indirect=True)
def test_one_line_server_block_gets_the_statement_inline(conf: Path) -> None:
    before = conf.read_text()
    res = set_directive(conf, "keepalive_timeout", "7", server_name="api.example")
    assert changes(before, conf.read_text()) == (
        ["    server { listen 81; server_name api.example; }"],
        ["    server { keepalive_timeout 7; listen 81; server_name api.example; }"],
    )
    assert res.inserted and get_directive(conf, "keepalive_timeout", server_name="api.example").args == ("7",)


@pytest.mark.parametrize("conf", ["servers"], indirect=True)
def test_http_level_edit_reports_nested_redefinition(conf: Path) -> None:
    res = set_directive(conf, "keepalive_timeout", "20")
    assert [(loc.line, loc.args) for loc in res.shadowed_by] == [(9, ("30",))]
    assert "redefined" in res.message


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_same_value_writes_nothing(conf: Path) -> None:
    st = conf.stat()
    res = set_directive(conf, "keepalive_timeout", "65")
    assert (res.changed, res.backup) == (False, None)
    assert conf.stat().st_ino == st.st_ino and conf.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
@pytest.mark.parametrize("bad", ["75; include /etc/passwd", "7 5", "'x'", "{", "a#b", ""])
def test_unsafe_values_are_refused(conf: Path, bad: str) -> None:
    before = conf.read_bytes()
    with pytest.raises(ConfigEditError):
        set_directive(conf, "keepalive_timeout", bad)
    assert conf.read_bytes() == before
    assert listing(conf.parent) == ["nginx.conf"]


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_duplicate_in_scope_and_multiline_are_refused(conf: Path) -> None:
    text = conf.read_text()
    conf.write_text(text.replace("    gzip on;", "    gzip on;\n    keepalive_timeout 5;"))
    with pytest.raises(ConfigEditError, match="2 times"):
        set_directive(conf, "keepalive_timeout", "9")
    conf.write_text(text.replace("keepalive_timeout 65 60;", "keepalive_timeout\n        65 60;"))
    with pytest.raises(ConfigEditError, match="several lines"):
        set_directive(conf, "keepalive_timeout", "9")


def test_malformed_config_is_a_clear_error(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text("events {}\nhttp {\n    keepalive_timeout 5;\n")  # unclosed block
    with pytest.raises(ConfigEditError, match="cannot parse"):
        set_directive(conf, "keepalive_timeout", "9")
    assert conf.read_text().endswith("keepalive_timeout 5;\n")


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_atomic_write_leaves_no_temporary_files_and_keeps_mode_owner_and_backup(conf: Path) -> None:
    before = conf.read_bytes()
    os.chmod(conf, 0o640)
    owner = (65534, 65534) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    os.chown(conf, *owner)
    res = set_directive(conf, "keepalive_timeout", "33")
    st = conf.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, *owner)
    assert listing(conf.parent) == ["nginx.conf"]
    assert res.backup is not None and res.backup.read_bytes() == before
    assert res.backup.parent == conf.parent / config_edit.DEFAULT_BACKUP_DIRNAME
    restore_backup(conf, res.backup.parent)
    assert conf.read_bytes() == before
    assert listing(conf.parent) == ["nginx.conf"]


@pytest.mark.parametrize("conf", ["simple"], indirect=True)
def test_failed_replace_keeps_old_file_and_removes_temporary(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = conf.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(config_edit.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        set_directive(conf, "keepalive_timeout", "33")
    assert conf.read_bytes() == before
    assert listing(conf.parent) == ["nginx.conf"]


def test_crlf_line_endings_are_kept(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_bytes(b"events {}\r\nhttp {\r\n    keepalive_timeout 65;\r\n}\r\n")
    set_directive(conf, "keepalive_timeout", "5")
    assert conf.read_bytes() == b"events {}\r\nhttp {\r\n    keepalive_timeout 5;\r\n}\r\n"
    set_directive(conf, "send_timeout", "5s")
    assert conf.read_bytes().count(b"\r\n") == 5 and b"\n" not in conf.read_bytes().replace(b"\r\n", b"")


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_bytes(b"events {}\nhttp {\n    # caf\xe9\n    keepalive_timeout 65;\n}\n")
    with pytest.raises(ConfigEditError):
        set_directive(conf, "keepalive_timeout", "5")
    assert b"keepalive_timeout 65;" in conf.read_bytes()


def test_tokenizer_handles_quotes_comments_and_variables() -> None:
    toks = config_edit.tokenize('set $a "x; y" ; # c;\nreturn 200 ${a}b;')
    assert [t.text for t in toks] == ["set", "$a", '"x; y"', ";", "return", "200", "${a}b", ";"]
    assert [t.line for t in toks][-1] == 2
