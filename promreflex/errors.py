"""Errors a user can act on. The CLI prints such an error as one clear line (no traceback) and
exits non-zero; every component raises a subclass (or this class) for failures at start-up that
come from the user's environment: a busy port, a missing or unreadable file, a corrupt state."""

from __future__ import annotations


class UserError(Exception):
    """A failure with a message that says what is wrong and what to do; no traceback."""
