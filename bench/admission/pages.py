"""The paper's session: seven pages, their CPU cost, and the time scale of a bench run.

Seed 002 (slides of a master's thesis, Tomcat prototype): a shop session is
login (30 ms), browse x3 (30 ms each), search (400 ms), buy (30 ms), logout (30 ms), with a
constant think time of 3 s between pages and a client timeout of 60 s per request; a client
whose request fails retries the whole session from its first page.

Time scale. A bench point must last several client timeouts to reach a steady state, and the
heavy-lock budget of this machine is about 25 minutes for everything, so every duration of a
run (page CPU costs, think time, client timeout, warm-up and window, the proxy's control
windows) is multiplied by one factor ``scale`` (default 0.1: search costs 40 ms of CPU, think
time is 0.3 s, the timeout 6 s). A scaled run is the paper's experiment played ``1/scale``
times faster: the same number of clients saturates the app, sessions/s are ``1/scale`` times
the unscaled figure. What does not scale is the fixed per-request cost of HTTP on this
machine (about a millisecond of CPU over nginx, the proxy and the app), which is why the scale
stops at 0.1. Every table prints the scale beside the conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER_THINK_S = 3.0
PAPER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Page:
    number: int  # 1..7: the position in the session (the paper's "page number")
    name: str  # page class (browse x3 share one class, as one servlet does)
    path: str
    paper_ms: float  # CPU per request in the paper's prototype
    logout: bool = False


PAGES: tuple[Page, ...] = (
    Page(1, "login", "/shop/login", 30.0),
    Page(2, "browse", "/shop/browse/1", 30.0),
    Page(3, "browse", "/shop/browse/2", 30.0),
    Page(4, "browse", "/shop/browse/3", 30.0),
    Page(5, "search", "/shop/search", 400.0),
    Page(6, "buy", "/shop/buy", 30.0),
    Page(7, "logout", "/shop/logout", 30.0, logout=True),
)
PAGE_CLASSES: dict[str, float] = {p.name: p.paper_ms for p in PAGES}  # class -> paper CPU ms
STATIC_PATH = "/shop/static/logo.svg"  # no work at all: the overhead measurement's page
SESSION_PAPER_MS = sum(p.paper_ms for p in PAGES)  # 580 ms of CPU per session

# The paper's grouping of failures in its "failures by page" figure.
PAGE_GROUPS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("1", (1,)), ("2-4", (2, 3, 4)), ("5", (5,)), ("6-7", (6, 7)))


def page_class(path: str) -> str | None:
    for p in PAGES:
        if p.path == path:
            return p.name
    return None
