import os

import pytest

from promreflex.fsutil import atomic_write_json, atomic_write_text, read_json


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_replaces_whole_file_keeping_mode_and_owner(tmp_path):
    p = tmp_path / "f.conf"
    p.write_text("old\n")
    os.chmod(p, 0o640)
    os.chown(p, 65534, 65534)  # nobody: the tests run as root here
    atomic_write_text(p, "new\n")
    st = p.stat()
    assert p.read_text() == "new\n"
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 65534, 65534)
    assert [x.name for x in tmp_path.iterdir()] == ["f.conf"]  # no temporary file left


def test_mode_override_and_json(tmp_path):
    p = tmp_path / "d" / "s.json"
    atomic_write_json(p, {"a": [1, 2]})
    assert read_json(p) == {"a": [1, 2]}
    atomic_write_text(p, "x", mode=0o600)
    assert p.stat().st_mode & 0o777 == 0o600
    assert read_json(tmp_path / "missing.json", default=7) == 7
