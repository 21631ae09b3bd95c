"""A WSGI middleware that delays requests: the "slow object server" the Swift bench injects.

The lab copies this file into its own directory and names it in the object server's pipeline
(``paste.filter_factory = promreflex_swift_delay:filter_factory``): Swift's servers run under
Debian's ``/usr/bin/python3``, which must not import the project's packages, so this module uses
the standard library only.

The delay is read from ``delay_file`` (milliseconds, a float; missing or empty: no delay) at most
every ``reload_interval`` seconds, so the bench can switch it on and off without restarting the
server. The delay is applied before the request reaches the object server with
``eventlet.sleep`` (Swift's servers do not monkey-patch ``time``: a ``time.sleep`` would stall
every request of the worker, not only the delayed one), so it adds to the node's processing time
(request in -> response out), not to any network hop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

try:  # Swift's servers run on eventlet; elsewhere (unit tests) a plain sleep does.
    from eventlet import sleep as _sleep  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the interpreter
    _sleep = time.sleep

MAX_DELAY_MS = 60_000.0


def read_delay_ms(path: str) -> float:
    """The delay in the file, clamped to [0, MAX_DELAY_MS]; 0 when the file is missing or bad."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return 0.0
    try:
        value = float(text) if text else 0.0
    except ValueError:
        return 0.0
    if value != value:  # NaN
        return 0.0
    return min(max(value, 0.0), MAX_DELAY_MS)


class DelayMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]], conf: dict[str, str]) -> None:
        self.app = app
        self.delay_file = conf.get("delay_file", "")
        self.methods = {m.strip().upper() for m in conf.get("methods", "PUT,GET").split(",") if m.strip()}
        self.reload_interval = float(conf.get("reload_interval", "0.5"))
        self._delay_ms = 0.0
        self._checked = 0.0

    def delay_ms(self) -> float:
        now = time.monotonic()
        if self.delay_file and now - self._checked >= self.reload_interval:
            self._checked = now
            self._delay_ms = read_delay_ms(self.delay_file) if os.path.exists(self.delay_file) else 0.0
        return self._delay_ms

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "").upper() in self.methods:
            delay = self.delay_ms()
            if delay > 0:
                _sleep(delay / 1000.0)
        return self.app(environ, start_response)


def filter_factory(global_conf: dict[str, str], **local_conf: str) -> Callable[[Any], DelayMiddleware]:
    conf = {**global_conf, **local_conf}

    def make(app: Any) -> DelayMiddleware:
        return DelayMiddleware(app, conf)

    return make
