import os
from pathlib import Path

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


def test_writes_utf8_under_a_c_locale_without_utf8_mode(tmp_path):
    """A config with a "« Café »" comment, read as UTF-8, could not be written back under
    LC_ALL=C with Python's UTF-8 mode off (UnicodeEncodeError: a stranger's review)."""
    import subprocess
    import sys

    target = tmp_path / "nginx.conf"
    code = ("import sys; from promreflex.fsutil import atomic_write_text; "
            "atomic_write_text(sys.argv[1], '# \\u00ab Caf\\u00e9 \\u00bb\\r\\nhttp {}\\n')")  # (ASCII argv)
    env = {"LC_ALL": "C", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, str(target)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert target.read_bytes() == "# « Café »\r\nhttp {}\n".encode()  # UTF-8, the CRLF kept
