"""Start the session clients (:mod:`bench.admission.locustfile`) headless in a child process.

A child because importing locust patches the standard library with gevent. The child is
bounded in time (``--run-for`` plus a margin, then killed with its process group) and its
events land in a JSON-lines file read by :mod:`bench.admission.counting`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
REPO = Path(__file__).resolve().parents[2]


def parse_stages(text: str) -> list[tuple[float, int]]:
    stages = []
    for part in text.split(","):
        start, users = part.split(":")
        stages.append((float(start), int(users)))
    stages.sort()
    if not stages or stages[0][0] != 0 or any(u < 0 for _, u in stages):
        raise ValueError(f"--stages {text!r}: need 'start:users,...' starting at 0")
    return stages


class LoadError(Exception):
    """The clients did not run (locust failed or hung)."""


@dataclass(frozen=True)
class ClientModel:
    think_s: float
    timeout_s: float

    def cycle_s(self, session_s: float, pages: int = 7) -> float:
        """One session at light load: every page's service time plus a think time after each."""
        return pages * self.think_s + session_s


def locust_argv(host: str, stages: str, run_for: float, model: ClientModel, events: Path,
                spawn_rate: float, stagger: bool) -> list[str]:
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
            "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "0", "--exit-code-on-error", "0",
            "--think", f"{model.think_s:g}", "--client-timeout", f"{model.timeout_s:g}",
            "--events", str(events), "--stages", stages, "--run-for", f"{run_for:g}",
            "--arrival-rate", f"{spawn_rate:g}"]
    return argv + (["--stagger"] if stagger else [])


class Clients:
    """One locust run; ``start()`` returns at once, ``wait()`` until it ends (or kills it)."""

    def __init__(self, argv: list[str], log_path: Path, run_for: float, margin_s: float = 20.0):
        self.argv, self.log_path, self.deadline_s = argv, log_path, run_for + margin_s

    def start(self) -> Clients:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,  # noqa: S603 - our argv
                                     stdin=subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """Stop the clients now (the bench was interrupted)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self) -> None:
        try:
            code = self.proc.wait(timeout=self.deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise LoadError(f"the clients did not stop within {self.deadline_s:.0f}s; killed (log {self.log_path})") from None
        finally:
            self.log.close()
        if code != 0:
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise LoadError(f"locust exited {code}: {tail}")
