"""Process and port plumbing shared by the stack supervisor, controllers, benchmarks and tests.

Nothing here knows about a particular capability: free ports, polling for a condition with a
deadline (never a fixed sleep), and starting/stopping child processes by PID.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


def die_with_parent() -> None:
    """A ``preexec_fn``: in the child, before exec, have Linux SIGKILL it when the thread that
    forked it ends (``PR_SET_PDEATHSIG``; a SIGKILLed parent included). Fork from a thread that
    outlives the child (the main one, or one that waits for it), or it dies with that thread."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux


class Timeout(Exception):
    """A condition polled by :func:`wait_until` did not hold before its deadline."""


_RECENT_PORTS: deque[int] = deque(maxlen=4096)
_PORTS_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (the kernel picks it).

    Callers often pick several ports before binding any (a mesh of 30 processes, a stack of
    six): the kernel may then hand out the same free port twice. So a port this process was
    given recently (the last 4096) is never returned again.
    """
    with _PORTS_LOCK:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _RECENT_PORTS:
                break
        _RECENT_PORTS.append(port)
        return port


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (or the address is otherwise taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
        return False


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``condition`` until it returns a truthy value and return that value.

    Exceptions raised by the condition count as "not yet". Raises :class:`Timeout` naming
    ``what`` and the last exception when the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - "not yet" by design
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise Timeout(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        time.sleep(interval)


def http_ok(url: str, timeout: float = 1.0, headers: dict[str, str] | None = None) -> bool:
    """True when GET url answers 2xx."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback URLs we build
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def pid_alive(pid: int) -> bool:
    """True when a process with this PID exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def terminate(pid: int, grace: float = 10.0, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to ``pid``, wait up to ``grace`` seconds, then SIGKILL. True if it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    try:
        wait_until(lambda: not pid_alive(pid), timeout=grace, interval=0.05, what=f"pid {pid} to exit")
        return True
    except Timeout:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        try:
            wait_until(lambda: not pid_alive(pid), timeout=5, interval=0.05, what=f"pid {pid} to die")
        except Timeout:
            return False
        return True


@dataclass
class Child:
    """A child process started with its output sent to a log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - owned by the child
        try:
            self.popen = subprocess.Popen(  # noqa: S603 - argv built by us, never from alert data
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
