"""Serving HTTP the same way in every promreflex process (controller, exporters, copier):
``/metrics`` from a prometheus_client registry, readiness endpoints, a stop on SIGINT/SIGTERM,
a clean shutdown, and the same defences against slow and hostile clients.

What :func:`serving` guarantees for every server (the figures are :class:`Limits`' defaults):

- **Header timeout** (10 s): once a request's first byte has arrived, its headers must be
  complete within ``header_timeout``, or the connection is closed. aiohttp has no header-read
  timeout of its own: the connection wrapper of this module notes when a request's first byte
  arrives, and a sweep (every second at most) closes connections whose request has not
  started (the app's handler not entered) that long after.
- **Idle timeout** (60 s): a connection that sends nothing (after opening, or after its last
  response) is closed by aiohttp's keep-alive timer (``keepalive_timeout=idle_timeout``), which
  in aiohttp 3.14 is armed when a connection opens and after every response and fires only
  while the connection waits for a request. Longer than the header timeout so Prometheus's
  keep-alive scrapes (every 15 s) reuse their connection. ``tests/unit/test_httpd.py`` pins
  both.
- **Body timeout** (10 s): :func:`read_body` reads a body within ``body_timeout`` or raises
  :class:`BodyTimeout` (the caller answers 408).
- **Size limit up front**: :func:`read_body` refuses a ``Content-Length`` above its limit
  before reading a byte (:class:`BodyTooLarge`, the caller answers 413), and stops reading a
  chunked body as soon as it passes the limit.
- **No draining**: after a response to a request whose body was not read (a 401, a 413), the
  connection is closed (``lingering_time=0``) instead of reading and discarding whatever the
  client still sends; :func:`discard_small_body` reads a small body (up to 64 KiB, within
  1 s) first so an honest client with a wrong token gets its 401 rather than a reset. The
  admission proxy asks for a lingering close instead (its peer is nginx, sending an app's upload).
- **Connection cap** below the open-file limit (``max_connections``, default the smaller of
  1,024 and the soft ``RLIMIT_NOFILE`` minus a quarter of it, at least 64 kept for the
  process's own files): at the cap, a new connection closes the connection that has waited
  longest without a request in progress (an idle keep-alive or a half-sent request), or is
  itself closed when every connection is busy. ``accept()`` therefore never fails with EMFILE,
  and a real client that sends its request at once always gets in, however many idle
  connections an attacker holds.
- **Counted**: every connection closed by these defences is counted in
  ``promreflex_server_connections_closed_total{listener, reason}`` (``header_timeout``,
  ``evicted``, ``refused``; all created at 0; ``listener`` the address bound) in the registry of
  the app's standard routes (:func:`add_standard_routes`) or the one given to :func:`serving`,
  beside the log line.
- **No log flood**: repeated lines of the ``asyncio`` and ``aiohttp`` loggers (e.g.
  "socket.accept() out of system resource") and of this module are let through once per
  10 s per message, with a count of what was suppressed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong, PayloadEncodingError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from promreflex.config import split_host_port
from promreflex.errors import UserError

log = logging.getLogger("promreflex.httpd")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_CONNECTIONS_CEILING = 1024
DISCARD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """What a promreflex server tolerates from a client (see the module docstring)."""

    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_connections: int | None = None  # None: derived from the open-file limit

    def connection_cap(self) -> int:
        return self.max_connections if self.max_connections is not None else default_max_connections()


LIMITS = web.AppKey("httpd_limits", Limits)
# The addresses the app is bound to (``getsockname()`` tuples), filled once :func:`serving`
# listens: how a server on port 0 learns its port.
ADDRESSES = web.AppKey("httpd_addresses", list)

#: The registry of the app's ``/metrics`` (set by :func:`add_standard_routes`): where
#: :func:`serving` counts the connections it closes, unless it is given another.
REGISTRY = web.AppKey("httpd_registry", CollectorRegistry)

#: The pool's connection a request came on (set by the pool's middleware; see on_disconnect).
CONNECTION: web.RequestKey[Any] = web.RequestKey("httpd_connection", object)
#: Set on a request whose connection the pool had already released when it arrived.
GONE: web.RequestKey[bool] = web.RequestKey("httpd_gone", bool)


def default_max_connections(nofile: int | None = None) -> int:
    """The connection cap for a soft open-file limit of ``nofile`` (this process's by default):
    the smaller of 1,024 and the limit minus a reserve (a quarter of it, at least 64) for the
    process's own files, client connections and child pipes; at least 16."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    return max(16, min(MAX_CONNECTIONS_CEILING, nofile - max(64, nofile // 4)))


# --------------------------------------------------------------------------- log flood
class RateLimitFilter(logging.Filter):
    """Lets each distinct message (logger name and format string) through at most once per
    ``interval`` seconds; the next one that passes says how many were suppressed."""

    def __init__(self, interval: float = 10.0):
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        if len(self._last) > 1000:  # bounded: forget the oldest keys
            for old in sorted(self._last, key=self._last.__getitem__)[:500]:
                self._last.pop(old, None)
                self._suppressed.pop(old, None)
        n = self._suppressed.pop(key, 0)
        if n:
            record.msg = f"{record.msg} ({n} similar lines suppressed in the last {self.interval:g}s)"
        return True


RATE_LIMITED_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.internal", "promreflex.httpd")


def rate_limit_logs(names: tuple[str, ...] = RATE_LIMITED_LOGGERS, interval: float = 10.0) -> None:
    """Install a :class:`RateLimitFilter` on each logger (once)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter(interval))


# --------------------------------------------------------------------------- requests aiohttp refuses
#: What aiohttp's handle_error logs before it makes its error page (aiohttp 3.14).
ERROR_PAGE_LOG = "Error handling request"


def parser_error_reason(exc: BaseException) -> str:
    """What was wrong with a request aiohttp's parser refused: ``header_too_large`` (a line or
    too many headers), ``bad_body`` (a Content-Encoding or Transfer-Encoding it cannot decode,
    e.g. ``zstd`` without its module) or ``malformed``."""
    if isinstance(exc, LineTooLong) or "Too many headers" in str(exc):
        return "header_too_large"
    if isinstance(exc, PayloadEncodingError):
        return "bad_body"
    return "malformed"


def parser_refusal(reason: str) -> web.HTTPException:
    """The default answer to a request aiohttp's parser refused: a fixed text naming what was
    wrong, none of the request's bytes (aiohttp's own page quotes the offending line back: a
    Cookie, an HttpOnly one too, CVE-2012-0053's class); 431 for headers too long or too many
    (RFC 6585), else 400; the connection closes."""
    exc: web.HTTPException
    if reason == "header_too_large":
        exc = web.HTTPRequestHeaderFieldsTooLarge(text="request line or header fields too large\n",
                                                  headers={"Cache-Control": "no-store"})
    elif reason == "bad_body":
        exc = web.HTTPBadRequest(text="bad request: a Content-Encoding or Transfer-Encoding this server cannot decode "
                                      "(send the body plain or gzip)\n", headers={"Cache-Control": "no-store"})
    else:
        exc = web.HTTPBadRequest(text="bad request: not an HTTP request this server can read\n",
                                 headers={"Cache-Control": "no-store"})
    exc.force_close()
    return exc


class ParserErrorLogger(logging.Logger):
    """aiohttp's server logger for one listener (``serving(..., logger=...)``; :func:`serving`
    installs one by default). A request aiohttp's parser refuses (unparsable, headers beyond its
    limits, a body encoding it cannot decode) reaches this logger through ``exception`` with the
    parser's error: it is counted (``count(reason)``, :func:`parser_error_reason`), logged as one
    line with the error's type (no traceback, none of the request's bytes: the message quotes the
    offending line) and answered with ``answer(reason)``: aiohttp calls this logger just before it
    makes its own error page, from the request's handler, where an HTTPException raised is sent
    instead. Anything else is logged as aiohttp logs it, traceback included."""

    def __init__(self, count: Callable[[str], None] | None = None,
                 answer: Callable[[str], web.HTTPException] = parser_refusal):
        super().__init__("aiohttp.server")
        self.server_log = logging.getLogger("aiohttp.server")
        self.parent = self.server_log
        self.count = count
        self.answer = answer

    def _refused(self, msg: object, exc: BadHttpMessage) -> None:
        reason = parser_error_reason(exc)
        if self.count is not None:
            self.count(reason)
        if str(msg).startswith(ERROR_PAGE_LOG):
            raise self.answer(reason)

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kw: Any) -> None:
        if not isinstance(exc_info, BadHttpMessage):  # a real error: with its traceback
            self.server_log.exception(msg, *args, exc_info=exc_info, **kw)
            return
        self.server_log.warning(f"{msg}: %s", *args, type(exc_info).__name__, **kw)
        self._refused(msg, exc_info)

    def debug(self, msg: object, *args: object, exc_info: Any = None, **kw: Any) -> None:
        if isinstance(exc_info, BadHttpMessage):  # aiohttp logs a non-HTTP first request at debug
            self.server_log.debug(msg, *args, **kw)
            self._refused(msg, exc_info)
            return
        self.server_log.debug(msg, *args, **kw)


# --------------------------------------------------------------------------- connections
class _Connection(asyncio.Protocol):
    """Wraps aiohttp's protocol to count the connection, know whether a request is in progress
    on it (set by the pool's middleware) and tell who asked (:func:`on_disconnect`) when its
    client leaves."""

    def __init__(self, pool: _ConnectionPool, inner: asyncio.Protocol):
        self.pool = pool
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0
        self.idle_since = time.monotonic()
        self.partial_since: float | None = None  # a request's first byte arrived, its handler not entered
        self.started = False
        self.lost = False
        self.watchers: list[Callable[[], None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.pool.admit(self):
            self.started = True
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.started:
            if not self.busy and self.partial_since is None:
                self.partial_since = time.monotonic()
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.started else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.release(self)
        self.lost = True
        watchers, self.watchers = self.watchers, []
        for callback in watchers:
            callback()
        if self.started:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()


class _ConnectionPool:
    """The protocol factory handed to ``loop.create_server``: caps the open connections."""

    def __init__(self, make: Callable[[], asyncio.Protocol], cap: int, header_timeout: float):
        self.make = make
        self.cap = cap
        self.header_timeout = header_timeout
        self.open: dict[asyncio.BaseTransport, _Connection] = {}
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self, self.make())

    def admit(self, conn: _Connection) -> bool:
        """Take ``conn`` in (closing the longest idle one at the cap); False when refused."""
        assert conn.transport is not None
        if len(self.open) >= self.cap:
            idle = [c for c in self.open.values() if not c.busy]
            if idle:
                victim = min(idle, key=lambda c: c.idle_since)
                self.evicted += 1
                log.warning("connection limit (%d) reached: closing the longest idle connection (%d closed so far)",
                            self.cap, self.evicted)
                self._drop(victim)
            else:
                self.refused += 1
                log.warning("connection limit (%d) reached and every connection is busy: refusing (%d so far)",
                            self.cap, self.refused)
                conn.transport.abort()  # connection_lost follows; the inner protocol never starts
                return False
        self.open[conn.transport] = conn
        return True

    def _drop(self, conn: _Connection) -> None:
        if conn.transport is not None:
            self.open.pop(conn.transport, None)
            conn.transport.abort()

    def release(self, conn: _Connection) -> None:
        if conn.transport is not None:
            self.open.pop(conn.transport, None)

    def sweep(self, now: float) -> int:
        """Close connections whose request headers did not complete within the header timeout."""
        late = [c for c in self.open.values()
                if not c.busy and c.partial_since is not None and now - c.partial_since > self.header_timeout]
        for conn in late:
            self._drop(conn)
        if late:
            self.timed_out += len(late)
            log.warning("closed %d connection(s) whose request headers did not arrive within %gs (%d so far)",
                        len(late), self.header_timeout, self.timed_out)
        return len(late)

    async def sweep_forever(self) -> None:
        interval = min(1.0, self.header_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.open.get(request.transport) if request.transport is not None else None
        if conn is None:
            # Released already: the client left before its request got here (connection_lost
            # takes the connection out of the pool before anything else). on_disconnect tells
            # such a request's watchers at once.
            request[GONE] = True
            return await handler(request)
        conn.busy += 1
        conn.partial_since = None
        request[CONNECTION] = conn
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.idle_since = time.monotonic()


def on_disconnect(request: web.Request, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` once when the client of ``request`` disconnects (soon, if it already
    has); returns the function that takes the call back. For a server run with aiohttp's
    ``handler_cancellation=False`` that still wants to drop work a gone client was waiting for,
    but not work already handed on (a proxy's request at its app). A request served without
    :func:`serving`'s connection pool is never told."""
    conn = request.get(CONNECTION)
    if conn is None and not request.get(GONE):
        return _nothing
    if conn is None or conn.lost or request.transport is None or request.transport.is_closing():
        handle = asyncio.get_running_loop().call_soon(callback)
        return handle.cancel
    conn.watchers.append(callback)

    def forget() -> None:
        try:
            conn.watchers.remove(callback)
        except ValueError:  # already called
            pass
    return forget


def _nothing() -> None:
    pass


class _CappedSite(web.TCPSite):
    """A TCPSite whose connections go through a :class:`_ConnectionPool`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, pool: _ConnectionPool):
        super().__init__(runner, host, port)
        self.pool = pool

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._server = await asyncio.get_running_loop().create_server(self.pool, self._host, self._port,
                                                                     backlog=self._backlog, reuse_address=True)


# --------------------------------------------------------------------------- bodies
class BodyError(Exception):
    """A body that cannot be read: broken chunking or content encoding (400 ``bad_body``)."""

    status = 400
    reason = "bad_body"


class BodyTooLarge(BodyError):
    status = 413
    reason = "too_large"


class BodyTimeout(BodyError):
    status = 408
    reason = "timeout"


class BodyLost(BodyError):
    """The sender closed or reset its connection before the whole body came (its own timeout, a
    proxy aborting the upload): its fault, not ours; the answer reaches no one."""

    status = 400
    reason = "client_disconnected"


async def read_body(request: web.Request, limit: int, timeout: float | None = None) -> bytes:
    """The request body, at most ``limit`` bytes, read within ``timeout`` seconds (default: the
    ``body_timeout`` of the limits the app is served with).

    Raises :class:`BodyTooLarge` before reading anything when ``Content-Length`` says more than
    ``limit`` (and as soon as a chunked or compressed body passes it once decoded),
    :class:`BodyTimeout` when the client is too slow, :class:`BodyError` for a body that cannot
    be decoded (a bad ``Content-Encoding``). Either way the body is not read further and the connection closes after the
    answer."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"Content-Length {request.content_length} is above the limit of {limit} bytes")
    if timeout is None:
        timeout = request.app.get(LIMITS, Limits()).body_timeout
    body, whole = await read_head(request, limit, timeout)
    if not whole:
        raise BodyTooLarge(f"body larger than {limit} bytes")
    return body


async def read_head(request: web.Request, limit: int, timeout: float) -> tuple[bytes, bool]:
    """Up to about ``limit`` bytes of the request body, read within ``timeout``: (the bytes, True
    when that is the whole body; False: more than ``limit`` came, the rest is unread).
    BodyTimeout / BodyError as :func:`read_body`."""
    buf = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while len(buf) <= limit:
                chunk = await request.content.readany()
                if not chunk:
                    return bytes(buf), True
                buf += chunk
    except TimeoutError:
        raise BodyTimeout(f"the body was not received within {timeout:g}s ({len(buf)} bytes arrived)") from None
    except web.RequestPayloadError as e:
        raise BodyError(f"the body cannot be read: {str(e).strip()}") from None
    except ConnectionError as e:  # aiohttp: ConnectionResetError("Connection lost")
        raise BodyLost(f"the sender's connection closed after {len(buf)} bytes of the body: {e}") from None
    return bytes(buf), False


async def discard_small_body(request: web.Request, limit: int = DISCARD_LIMIT, timeout: float = 1.0) -> None:
    """Before refusing a request whose body was not read: read (and drop) a body of at most
    ``limit`` bytes so the client sees the answer instead of a connection reset. A larger or
    slower body is left unread and the connection is closed after the answer."""
    length = request.content_length
    if length is None or length > limit or request.content.is_eof():
        return
    try:
        async with asyncio.timeout(timeout):
            await request.content.readexactly(length)
    except (TimeoutError, asyncio.IncompleteReadError):
        pass


# --------------------------------------------------------------------------- tokens
class TokenFiles:
    """Token files read when first needed and again whenever one changes (its size, time or
    inode): a token rotated in the file is used from the next call, with no restart (a review:
    an action kept the first token it read, so every call after a rotation got 401 until the
    controller restarted). Errors as :func:`read_token_file`."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int, int], str]] = {}

    def get(self, path: str | os.PathLike[str], what: str = "token file") -> str:
        key = Path(path)
        try:
            st = os.stat(key)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = (-1, -1, -1)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        token = read_token_file(key, what)
        self._cache[key] = (stamp, token)
        return token


class LiveToken:
    """A server's token from its token file, read again when the file changes (``value``): the
    callers re-read theirs (:class:`TokenFiles`), so a token rotated in a file both sides name is
    taken by both at once, with no restart (re-read on one side only, every call got 401 until
    the other restarted: a review). A file that turns bad (removed, mode 0644, emptied) keeps
    the last good token, said once in the log. ``value`` is ``initial`` without a file."""

    def __init__(self, path: str | os.PathLike[str] | None, what: str = "token file", initial: str | None = None):
        self.path = Path(path) if path is not None else None
        self.what = what
        self._files = TokenFiles()
        self._last = initial if initial is not None else (self._files.get(self.path, what) if self.path else "")
        self._said: str | None = None

    @property
    def value(self) -> str:
        if self.path is None:
            return self._last
        try:
            self._last = self._files.get(self.path, self.what)
            self._said = None
        except UserError as e:
            if self._said != str(e):
                self._said = str(e)
                logging.getLogger("promreflex.httpd").warning("%s; keeping the token read before", e)
        return self._last


def read_token_file(path: str | os.PathLike[str] | None, what: str = "token file") -> str:
    """The bearer token in ``path`` ("" when no path is given). Raises :class:`UserError` with
    one line when the file is missing, unreadable, empty, or readable (or writable) by its group
    or by others: a secret that every local user can read protects nothing, so it is refused
    like ssh refuses such a key (``chmod 600`` it; the process reading it must own it)."""
    if path is None:
        return ""
    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise UserError(f"{what} {path} is accessible by group or others (mode {stat.filemode(st.st_mode)}): "
                            f"run chmod 600 {path}")
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist: create it with a random token "
                        f"(umask 077; openssl rand -hex 32 > {path})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise UserError(f"{what} {path} is empty: write a random token into it (openssl rand -hex 32 > {path})")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise UserError(f"{what} {path} must hold one token on one line (no spaces or control characters)")
    return token


# --------------------------------------------------------------------------- counters
CLOSED_REASONS = ("header_timeout", "evicted", "refused")


class _ClosedConnections(Collector):
    """``promreflex_server_connections_closed_total`` of every server that counts into one
    registry (a process may serve several listeners into one ``/metrics``)."""

    def __init__(self) -> None:
        self.pools: dict[str, _ConnectionPool] = {}

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "promreflex_server_connections_closed",
            "Connections this server closed to defend itself, by listener and reason: header_timeout (a "
            "request's headers not complete within the header timeout: a slow or stalled client), evicted (the "
            "longest idle connection, closed at the connection cap to admit a new one), refused (a new "
            "connection at the cap while every connection had a request in progress).",
            labels=["listener", "reason"])
        for listener, pool in sorted(self.pools.items()):
            for reason, value in zip(CLOSED_REASONS, (pool.timed_out, pool.evicted, pool.refused), strict=True):
                family.add_metric([listener, reason], value)
        yield family


_CLOSED: dict[CollectorRegistry, _ClosedConnections] = {}  # (a registry hashes by identity)


def _count_closed(registry: CollectorRegistry, listener: str, pool: _ConnectionPool) -> Callable[[], None]:
    """Count ``pool``'s closes in ``registry`` under ``listener``; returns what stops it."""
    collector = _CLOSED.get(registry)
    if collector is None:
        collector = _CLOSED[registry] = _ClosedConnections()
        registry.register(collector)
    collector.pools[listener] = pool

    def stop() -> None:
        if collector.pools.get(listener) is pool:
            del collector.pools[listener]
        if not collector.pools and _CLOSED.get(registry) is collector:
            del _CLOSED[registry]
            registry.unregister(collector)
    return stop


# --------------------------------------------------------------------------- routes
def metrics_handler(registry: CollectorRegistry) -> Handler:
    """``GET /metrics``; the exposition is rendered in a thread so a large registry never
    stalls the event loop."""

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (handlers installed on the running loop)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    return stop


def add_standard_routes(app: web.Application, registry: CollectorRegistry, title: str = "promreflex") -> web.Application:
    """``/metrics``, ``/-/ready``, ``/-/healthy`` and an index line."""

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=f"{title}: see /metrics\n")

    if not app.frozen:
        app[REGISTRY] = registry
    app.router.add_get("/metrics", metrics_handler(registry))
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/-/healthy", ready)
    app.router.add_get("/", index)
    return app


@asynccontextmanager
async def serving(listen_address: str, app: web.Application, limits: Limits | None = None, *,
                  registry: CollectorRegistry | None = None, **runner_kwargs: Any) -> AsyncIterator[web.Application]:
    """Serve ``app`` on ``listen_address`` while the block runs, with the defences of this
    module (``limits``). The connections they close are counted in ``registry`` (by default
    the registry of the app's standard routes; none without either). Raises OSError when the
    address cannot be bound."""
    limits = limits or Limits()
    rate_limit_logs()
    addresses: list[Any] = []
    if not app.frozen:
        app[LIMITS] = limits
        app[ADDRESSES] = addresses
    pool: _ConnectionPool | None = None
    if not app.frozen:
        pool = _ConnectionPool(lambda: runner.server(), limits.connection_cap(), limits.header_timeout)  # type: ignore[misc]
        app.middlewares.insert(0, pool.middleware)
    # Without the pool (an app already frozen) the keep-alive timer is the header timeout too.
    runner_kwargs.setdefault("lingering_time", 0)  # (no draining: the module doc; a proxy asks otherwise)
    runner_kwargs.setdefault("logger", ParserErrorLogger())  # (a refused request: one line, a fixed answer)
    runner = web.AppRunner(app, access_log=None,
                           keepalive_timeout=limits.idle_timeout if pool else limits.header_timeout, **runner_kwargs)
    await runner.setup()
    try:
        host, port = split_host_port(listen_address)
        site = web.TCPSite(runner, host, port) if pool is None else _CappedSite(runner, host, port, pool)
        await site.start()
        server = site._server  # noqa: SLF001 - aiohttp keeps the asyncio server there
        addresses.extend(sock.getsockname() for sock in getattr(server, "sockets", None) or ())
        sweeper = asyncio.get_running_loop().create_task(pool.sweep_forever()) if pool else None
        counts = registry if registry is not None else app.get(REGISTRY)
        # The address bound (port 0 becomes the port the kernel gave): two servers of one
        # process never share a label set.
        bound = [f"[{a[0]}]:{a[1]}" if ":" in str(a[0]) else f"{a[0]}:{a[1]}" for a in addresses if isinstance(a, tuple)]
        listener = bound[0] if bound else listen_address
        uncount = _count_closed(counts, listener, pool) if pool is not None and counts is not None else None
        try:
            yield app
        finally:
            if sweeper is not None:
                sweeper.cancel()
            if uncount is not None:
                uncount()
    finally:
        await runner.cleanup()


def metrics_app(registry: CollectorRegistry, title: str) -> web.Application:
    """An app serving only the standard routes (what an exporter needs)."""
    return add_standard_routes(web.Application(), registry, title)
