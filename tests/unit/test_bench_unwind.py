"""bench.unwind: the first SIGINT or SIGTERM unwinds a bench (its finally blocks run to their
end), the next ones do not cut the cleanup short. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from pathlib import Path
from bench.unwind import interrupt_once
interrupt_once(term_interrupts=sys.argv[2] == "1")
out = Path(sys.argv[1])
try:
    (out / "started").write_text("")
    time.sleep(60)
except KeyboardInterrupt:
    (out / "interrupted").write_text("")  # the copy-guard bench reports what it measured here
finally:
    (out / "cleaning").write_text("")
    time.sleep(1.0)  # a slow cleanup (stopping processes) that the next signals arrive during
    (out / "cleaned").write_text("")
"""


def _wait_for(path: Path, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        if time.monotonic() > end:
            pytest.fail(f"{path.name} never appeared")
        time.sleep(0.02)


@pytest.mark.parametrize(("sig", "term_interrupts", "signals", "interrupted", "code"), [
    (signal.SIGTERM, False, 1, False, 143),
    (signal.SIGTERM, False, 3, False, 143),  # uv forwards one, timeout signals the group
    (signal.SIGTERM, True, 3, True, 0),  # the copy-guard bench: a SIGTERM reports like Ctrl-C
    (signal.SIGINT, False, 3, True, 0),
])
def test_the_first_signal_unwinds_and_the_cleanup_runs_to_its_end(
        tmp_path: Path, sig: int, term_interrupts: bool, signals: int, interrupted: bool, code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), "1" if term_interrupts else "0"], cwd=ROOT)
    try:
        _wait_for(tmp_path / "started")
        proc.send_signal(sig)
        _wait_for(tmp_path / "cleaning")
        for _ in range(signals - 1):  # more signals while the cleanup runs
            proc.send_signal(sig)
            proc.send_signal(signal.SIGTERM if sig == signal.SIGINT else signal.SIGINT)
        assert proc.wait(timeout=30) == code
        assert (tmp_path / "cleaned").exists()
        assert (tmp_path / "interrupted").exists() == interrupted
    finally:
        proc.kill()
        proc.wait()
