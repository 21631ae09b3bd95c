"""Rotation torture on a real nginx writing real requests: the exporter's counts equal the
number of lines nginx logged (``zcat -f`` over every file left), through every rotation
logrotate does, while the exporter runs (paused with SIGSTOP so that unread lines are always
in flight) and while it is down, with restarts and a reused inode.

    flock /tmp/promreflex-heavy.lock uv run --frozen pytest tests/integration/test_accesslog_rotation_torture.py

Traffic is paused while logrotate's own racy steps run (between ``cp`` and truncate for
copytruncate, between the rename and nginx's reopen before a gzip): lines written there are
lost by logrotate itself, in no file, so no reader could count them.
"""

from __future__ import annotations

import gzip
import http.client
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from promreflex.foundation import NGINX_LOG_FORMAT
from promreflex.proc import Child, free_port, http_ok, port_in_use, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


class Traffic:
    """Requests on one keep-alive connection from a background thread, pausable, bounded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = 0
        self._go = threading.Event()
        self._idle = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        i = 0
        while not self._stop:
            if not self._go.is_set():
                self._idle.set()
                self._go.wait(0.05)
                continue
            self._idle.clear()
            path = "/missing" if i % 10 == 0 else f"/p/{i}"
            try:
                conn.request("GET", path)
                conn.getresponse().read()
                self.sent += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            i += 1
        conn.close()

    def burst(self, n: int) -> None:
        """Send about ``n`` more requests, then pause."""
        target = self.sent + n
        self._go.set()
        wait_until(lambda: self.sent >= target, timeout=60, interval=0.01, what=f"{n} requests sent")
        self.pause()

    def pause(self) -> None:
        self._go.clear()
        wait_until(self._idle.is_set, timeout=30, interval=0.01, what="traffic paused")

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=10)


def metric(url: str, name: str) -> float:
    body = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines() if ln.startswith(name + "{"))


class Rig:
    def __init__(self, d: Path) -> None:
        self.d = d
        self.logs = d / "logs"
        self.logs.mkdir()
        self.log = self.logs / "access.log"
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        (d / "nginx.conf").write_text(f"""
user root root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
    log_format promreflex '{NGINX_LOG_FORMAT}';
    access_log {self.log} promreflex;
    client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
    server {{
        listen 127.0.0.1:{self.port};
        location /p/ {{ return 200 "ok\\n"; }}
    }}
}}
""")
        self.nginx = Child("nginx", [NGINX, "-p", str(d), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
                           d / "nginx.out").start()
        # a connect, not a request: every logged line is one the traffic thread counted
        wait_until(lambda: port_in_use("127.0.0.1", self.port), timeout=30, what="nginx up")
        self.traffic = Traffic(self.port)
        self.exporter: Child | None = None
        self.counted = 0.0  # requests counted by exporter runs already stopped
        self.runs = 0

    # -------------------------------------------------------------- exporter
    def start(self) -> None:
        self.runs += 1
        argv = [sys.executable, "-m", "exporters.accesslog", "--log", f"shop={self.log}:nginx_timed",
                "--state.dir", str(self.d / "state"), "--log.from-start", "--log.poll-interval", "100ms",
                "--web.listen-address", f"127.0.0.1:{self.metrics_port}"]
        self.exporter = Child(f"exporter-{self.runs}", argv, self.d / f"exporter-{self.runs}.out", cwd=REPO).start()
        wait_until(lambda: http_ok(self.url), timeout=60, what="exporter /metrics")

    def requests_now(self) -> float:
        return metric(self.url, "promreflex_http_requests_total")

    def settle(self) -> float:
        """With traffic paused and quiesced every line is in the files: wait until this run has
        counted up to them (not "3 s without change": a stall right after a partial read could
        pass for caught up), then 1 s more for a double count to show (the final assertion
        reports it). A run that never gets there has lost lines: said at once, with the logs."""
        target = self.logged() - self.counted
        try:
            wait_until(lambda: self.requests_now() >= target, timeout=60, interval=0.1,
                       what=f"exporter caught up to {target:.0f} lines")
        except Exception as e:
            raise AssertionError(
                f"exporter run {self.runs} counted {self.requests_now():.0f} of the {target:.0f} lines nginx "
                f"logged since the last run ({e})\n" + self.logs()) from e
        time.sleep(1.0)
        return self.requests_now()

    def logs(self) -> str:
        return "\n".join((self.d / f"exporter-{i}.out").read_text()[-1500:] for i in range(1, self.runs + 1))

    def stop(self) -> None:
        assert self.exporter is not None
        self.quiesce()
        self.counted += self.settle()
        self.exporter.stop()
        assert self.exporter.popen is not None and self.exporter.popen.returncode == 0, self.exporter.tail()
        self.exporter = None

    def pause_exporter(self) -> None:
        assert self.exporter is not None
        os.kill(self.exporter.pid, signal.SIGSTOP)

    def resume_exporter(self) -> None:
        assert self.exporter is not None
        os.kill(self.exporter.pid, signal.SIGCONT)

    # -------------------------------------------------------------- logrotate, step by step
    def _shift(self) -> None:
        """access.log.N[.gz] -> access.log.N+1[.gz], oldest first."""
        rotated = sorted(
            (int(p.name.split(".")[2]), p) for p in self.logs.iterdir() if p.name.startswith("access.log.")
        )
        for n, p in reversed(rotated):
            p.rename(p.with_name(p.name.replace(f"access.log.{n}", f"access.log.{n + 1}", 1)))

    def nginx_pids(self) -> list[int]:
        """The master and its workers (the processes whose parent is the master)."""
        pids = [self.nginx.pid]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == self.nginx.pid:
                pids.append(int(stat.parent.name))
        return pids

    def holding(self, dev_ino: tuple[int, int]) -> list[int]:
        """The nginx processes that still have the file (device, inode) open."""
        held = []
        for pid in self.nginx_pids():
            for fd in Path(f"/proc/{pid}/fd").glob("*"):
                try:
                    st = fd.stat()
                    if (st.st_dev, st.st_ino) == dev_ino:
                        held.append(pid)
                except OSError:
                    continue  # closed meanwhile
        return held

    def reopen(self) -> None:
        """SIGUSR1, then wait until every nginx process has closed the old file: the master
        creates the new log before its workers reopen, and a worker slow to get there (two busy
        cores) wrote a line into the old file after the test had compressed and removed it."""
        ino = self.log.stat().st_ino if self.log.exists() else None
        st = os.stat(self.logs / "access.log.1")
        old = (st.st_dev, st.st_ino)
        os.kill(self.nginx.pid, signal.SIGUSR1)
        wait_until(lambda: self.log.exists() and self.log.stat().st_ino != ino, timeout=30, interval=0.01,
                   what="nginx reopened its log")
        wait_until(lambda: not self.holding(old), timeout=30, interval=0.01,
                   what="every nginx process closed the rotated log")

    def quiesce(self) -> None:
        """Pause traffic and wait until nginx has logged every request answered (it writes the
        line just after the response: a line written during logrotate's racy steps is lost)."""
        self.traffic.pause()
        try:
            wait_until(lambda: self.logged() == self.traffic.sent, timeout=30, interval=0.02,
                       what="nginx logged every request answered")
        except Exception as e:
            raise AssertionError(f"{e}: {self.traffic.sent} answered, {self.logged()} lines logged") from e

    def rename(self, compress: bool) -> None:
        """Rename rotation; ``compress``: gzip at once (logrotate without delaycompress)."""
        self.quiesce()
        self._shift()
        self.log.rename(self.logs / "access.log.1")
        self.traffic.burst(30)  # nginx still writes to the renamed file until it reopens
        self.quiesce()
        self.reopen()
        if compress:  # the plain file removed: its inode is free once nginx has closed it
            with open(self.logs / "access.log.1", "rb") as fi, gzip.open(self.logs / "access.log.1.gz", "wb") as fo:
                shutil.copyfileobj(fi, fo)
            (self.logs / "access.log.1").unlink()

    def copytruncate(self) -> None:
        self.quiesce()
        self._shift()
        shutil.copyfile(self.log, self.logs / "access.log.1")
        with open(self.log, "r+b") as f:
            f.truncate(0)

    def rotate(self, action: str) -> None:
        if action == "copytruncate":
            self.copytruncate()
        else:
            self.rename(compress=action == "rename_gzip")

    def logged(self) -> int:
        """Lines nginx wrote, in every file left: ``zcat -f``."""
        files = sorted(str(p) for p in self.logs.iterdir())
        out = subprocess.run(["zcat", "-f", *files], capture_output=True, check=True).stdout
        return out.count(b"\n")

    def close(self) -> None:
        self.traffic.close()
        if self.exporter is not None:
            self.resume_exporter()
            self.exporter.stop()
        self.nginx.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    (tmp_path / "tmp").mkdir()
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_rotation_torture_loses_and_double_counts_nothing(rig: Rig) -> None:
    burst = 150
    rig.start()
    rig.traffic.burst(burst)

    # --- each rotation while running (paused, so that unread lines are in flight when it
    #     happens), then each while the exporter is down, followed by a restart
    for down in (False, True):
        for action in ("rename", "rename_gzip", "copytruncate"):
            rig.traffic.burst(burst)
            rig.stop() if down else rig.pause_exporter()
            rig.traffic.burst(burst)
            rig.rotate(action)
            rig.traffic.burst(burst)
            rig.start() if down else rig.resume_exporter()
            rig.traffic.burst(burst)

    # --- two rotations while down, the first gzipped: the inode it frees goes to the newest log
    #     (ext4 hands it out again at once), so the saved inode now names a file with other content
    rig.stop()
    saved_ino = rig.log.stat().st_ino
    rig.traffic.burst(burst)
    rig.rename(compress=True)
    rig.traffic.burst(burst)
    rig.rename(compress=False)
    reused = rig.log.stat().st_ino == saved_ino
    rig.traffic.burst(burst)
    rig.start()
    rig.traffic.burst(burst)

    # --- a plain restart, and a SIGHUP (logrotate's postrotate habit) that must not kill it
    rig.stop()
    rig.start()
    assert rig.exporter is not None
    os.kill(rig.exporter.pid, signal.SIGHUP)
    rig.traffic.burst(burst)
    assert rig.exporter.alive(), rig.exporter.tail()
    rig.stop()

    logged = rig.logged()
    assert rig.traffic.sent == logged, "nginx logged every request sent"
    assert rig.counted == logged, (
        f"exporter counted {rig.counted} over {rig.runs} runs, nginx logged {logged} "
        f"(inode reused: {reused})\n" + rig.logs())
    print(f"{logged} requests, {rig.runs} exporter runs, inode reused by the new log: {reused}")
