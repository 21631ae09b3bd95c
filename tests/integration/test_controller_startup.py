"""Start-up errors a user can fix: ``python -m promreflex controller`` (and ``check-config``)
print one line naming the problem and exit non-zero, without a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from promreflex.proc import free_port
from tests.controller_process import REPO, ControllerProcess


def _config(tmp_path: Path, port: int, token_file: Path | None) -> Path:
    return ControllerProcess(tmp_path, [{"name": "all", "matchers": ['alertname=~".+"'], "action": "log"}],
                             settings={"token_file": str(token_file) if token_file else None}, port=port).config_file()


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "promreflex", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def _assert_one_clear_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    err = done.stderr.strip()
    assert done.returncode != 0, (done.returncode, done.stdout, err)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]


def _token(tmp_path: Path, content: str | None, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    return path


@pytest.mark.parametrize("content, mode, words", [
    (None, 0o600, ("token", "does not exist")),
    ("", 0o600, ("token", "is empty")),
    ("s3cret\n", 0o644, ("token", "chmod 600")),
    ("s3cret\n", 0o640, ("token", "chmod 600")),
], ids=["missing", "empty", "world-readable", "group-readable"])
@pytest.mark.parametrize("command", ["controller", "check-config"])
def test_an_unusable_token_file_is_one_line_and_a_failure(tmp_path, command, content, mode, words):
    cfg = _config(tmp_path, free_port(), _token(tmp_path, content, mode))
    _assert_one_clear_line(_run(command, f"--config.file={cfg}"), *words)


def test_a_busy_port_is_one_line_and_a_failure(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = _config(tmp_path, port, _token(tmp_path, "s3cret\n"))
        done = _run("controller", f"--config.file={cfg}")
    _assert_one_clear_line(done, f"127.0.0.1:{port}", "already in use")


def test_check_config_of_a_usable_configuration_is_ok(tmp_path):
    cfg = _config(tmp_path, free_port(), _token(tmp_path, "s3cret\n"))
    done = _run("check-config", f"--config.file={cfg}")
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
