"""Stop a bench with Ctrl-C or SIGTERM (a timeout, flock's caller, `kill`) and it unwinds.

The benches start processes (apps, proxies, stacks, meshes, copies, load generators) and stop
them in ``finally`` blocks. Python's default SIGTERM ends the interpreter without running them,
and a second signal raised again inside a cleanup cut it short: ``uv run`` forwards the signal
sent to it, and ``timeout`` signals a whole process group, so the bench often gets two. Killing
``uv`` and the admission bench together left the bench's app and its 16 workers running
(2026-11-26); the copy-guard bench answered only SIGINT, so a SIGTERM left its stack and copy.

:func:`interrupt_once` makes the FIRST SIGINT or SIGTERM raise in the main thread
(``KeyboardInterrupt`` for SIGINT; for SIGTERM ``SystemExit(143)``, or ``KeyboardInterrupt`` too
when the bench reports what it measured on an interrupt) and ignores every later one while the
bench unwinds. SIGKILL still ends it at once.
"""

from __future__ import annotations

import signal
from types import FrameType

SIGTERM_EXIT = 143  # 128 + SIGTERM, what a shell reports for a process ended by it
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupt_once(term_interrupts: bool = False) -> None:
    """Install the handlers (main thread only, as any Python signal handler)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        for sig in _SIGNALS:  # the cleanup must not be interrupted by the next one
            signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGINT or term_interrupts:
            raise KeyboardInterrupt
        raise SystemExit(SIGTERM_EXIT)

    for sig in _SIGNALS:
        signal.signal(sig, handler)
