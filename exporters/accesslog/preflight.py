"""What ``promreflex stack up`` checks before it starts the access-log exporter (the
capability's ``preflight``): a guarded nginx's log that its exporter cannot read.

The exporter reads the stack's log as ``nginx_timed`` (the ``promreflex`` log_format of README
"Guard a shop you already run"). An nginx that already runs writes ``combined`` unless step 1 was
followed: the exporter would count nothing and only say so in its own log after 100 rejected
lines, so ``stack up`` names it at once (``copy-guard doctor`` checks it too, with the same two
helpers: :func:`tail_lines` and :func:`timed_matcher`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporters.accesslog.parse import build_parser
from promreflex.capability import Context

TAIL_BYTES = 16 << 10
TAIL_LINES = 20


def tail_lines(path: Path, limit: int = TAIL_BYTES) -> list[str]:
    """The complete lines in the last ``limit`` bytes of ``path`` (OSError if unreadable)."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        data = f.read().decode("utf-8", "replace")
    lines = data.splitlines()
    return lines[1:] if len(data) >= limit else lines  # the first may be cut


def timed_matcher() -> Callable[[str], bool]:
    """Whether a line is in the promreflex (``nginx_timed``) format."""
    regex = build_parser("nginx_timed").regex
    return lambda line: regex.match(line.rstrip("\n")) is not None


def foreign_last_line(path: Path) -> str | None:
    """The last line of ``path`` when none of its last lines is in the ``nginx_timed`` format,
    else None (also for an empty or unreadable file: the exporter waits for it)."""
    try:
        lines = [ln for ln in tail_lines(path)[-TAIL_LINES:] if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    matches = timed_matcher()
    return None if any(matches(ln) for ln in lines) else lines[-1]


def warnings(ctx: Context) -> list[str]:
    nginx = getattr(getattr(ctx.config, "stack", None), "nginx", None)
    if not getattr(nginx, "external", False):
        return []  # the stack's own nginx writes the format itself
    path = Path(ctx.path("nginx_access_log"))
    last = foreign_last_line(path)
    if last is None:
        return []
    return [f"none of the last lines of stack.nginx.access_log {path} is in the promreflex format (README \"Guard a "
            f"shop you already run\", step 1): the access-log exporter will count nothing from it. "
            f"Last line: {last[:120]!r}"]
