"""Logging set-up shared by every command: one record, one line.

A message quotes what others wrote (an alert's label values, a log line, a path): a newline in
one forged a line of its own in the log (``site shop\\n2026-11-28 12:00:00,000 INFO ...``, a
stranger's review), so control characters in the message are escaped. A traceback keeps its
lines: it is ours, and comes after the message.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ESCAPES = {c: f"\\x{c:02x}" for c in range(32) if c != 9} | {10: "\\n", 13: "\\r", 127: "\\x7f"}


class OneLineFormatter(logging.Formatter):
    """A formatter that writes the message on one line (control characters escaped)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.translate(_ESCAPES)
        return super().formatMessage(record)


def setup(level: str | int = "info") -> None:
    """``logging.basicConfig`` with :class:`OneLineFormatter` (a no-op when logging is set up)."""
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
