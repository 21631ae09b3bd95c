"""What ``promreflex stack up`` checks before it starts the access-log exporter (the
capability's ``preflight``): a guarded nginx's log that its exporter cannot read.

The exporter reads the stack's log as ``nginx_timed`` (the ``promreflex`` log_format of README
"Guard a shop you already run"). An nginx that already runs writes ``combined`` unless step 1 was
followed: the exporter would count nothing and only say so in its own log after 100 rejected
lines, so ``stack up`` names it at once (``copy-guard doctor`` checks it too).
"""

from __future__ import annotations

from pathlib import Path

from exporters.accesslog.parse import build_parser
from promreflex.capability import Context

TAIL_BYTES = 16 << 10
TAIL_LINES = 20


def foreign_last_line(path: Path) -> str | None:
    """The last line of ``path`` when none of its last lines is in the ``nginx_timed`` format,
    else None (also for an empty or unreadable file: the exporter waits for it)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - TAIL_BYTES))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines()[-TAIL_LINES:] if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    regex = build_parser("nginx_timed").regex
    return None if any(regex.match(ln) for ln in lines) else lines[-1]


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
