"""The access-log exporter as a real process: serves /metrics, follows appends, resumes after a restart."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from promreflex.proc import Child, free_port, http_ok, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def line(i: int, status: int = 200) -> str:
    return f'192.0.2.1 - - [10/Mar/2025:10:00:00 +0000] "GET /p/{i} HTTP/1.1" {status} 10 "-" "t" rt=0.010 urt="0.009"\n'


def requests_total(url: str) -> float:
    body = urllib.request.urlopen(url, timeout=2).read().decode()  # noqa: S310 - loopback
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in body.splitlines()
        if ln.startswith("promreflex_http_requests_total{") and 'site="shop"' in ln
    )


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[dict]:
    log = tmp_path / "access.log"
    log.write_text("".join(line(i) for i in range(5)))
    port = free_port()
    argv = [sys.executable, "-m", "exporters.accesslog", "--log", f"shop={log}:nginx_timed",
            "--state.dir", str(tmp_path / "state"), "--log.from-start",
            "--web.listen-address", f"127.0.0.1:{port}"]
    children: list[Child] = []

    def start(name: str) -> Child:
        child = Child(name, argv, tmp_path / f"{name}.log", cwd=REPO).start()
        children.append(child)
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/metrics"), timeout=30, what=f"{name} /metrics")
        return child

    try:
        yield {"log": log, "url": f"http://127.0.0.1:{port}/metrics", "start": start}
    finally:
        for c in children:
            c.stop()


def test_follows_appends_and_resumes_after_restart(exporter: dict) -> None:
    log, url = exporter["log"], exporter["url"]
    first = exporter["start"]("run1")
    wait_until(lambda: requests_total(url) == 5, timeout=30, what="5 backlog lines counted")
    with open(log, "a") as f:
        f.write("".join(line(i, 503) for i in range(5, 8)))
    wait_until(lambda: requests_total(url) == 8, timeout=30, what="3 appended lines counted")
    first.stop()
    assert first.popen is not None and first.popen.returncode == 0, first.tail()
    with open(log, "a") as f:
        f.write(line(8))  # written while the exporter is down

    second = exporter["start"]("run2")
    wait_until(lambda: requests_total(url) == 1, timeout=30, what="only the line written while down counted")
    assert "resumed inode" in second.tail(50), second.tail(50)


def test_sighup_neither_kills_nor_loses(exporter: dict) -> None:
    """logrotate's postrotate often sends SIGHUP: the exporter keeps running and counting."""
    import os
    import signal

    log, url = exporter["log"], exporter["url"]
    child = exporter["start"]("hup")
    wait_until(lambda: requests_total(url) == 5, timeout=30, what="backlog counted")
    os.kill(child.pid, signal.SIGHUP)
    with open(log, "a") as f:
        f.write(line(9))
    wait_until(lambda: requests_total(url) == 6, timeout=30, what="line after SIGHUP counted")
    # (the line may be read before the loop runs the signal's callback: poll for its log line)
    wait_until(lambda: "SIGHUP" in child.tail(50), timeout=10, what="the SIGHUP logged")
    assert child.alive(), child.tail(50)


def test_unknown_format_and_gz_log_are_one_line_errors(tmp_path: Path) -> None:
    import gzip
    import subprocess

    base = [sys.executable, "-m", "exporters.accesslog", "--state.dir", str(tmp_path / "st")]
    typo = subprocess.run([*base, "--log", f"shop={tmp_path}/access.log:nginx_timd"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "did you mean nginx_timed" in typo.stderr, typo.stderr
    gz = tmp_path / "access.log.1.gz"
    gz.write_bytes(gzip.compress(line(1).encode()))
    refused = subprocess.run([*base, "--log", f"shop={gz}:nginx_timed"], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "gzip-compressed" in refused.stderr and "Traceback" not in refused.stderr
