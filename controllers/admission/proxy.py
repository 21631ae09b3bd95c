"""The admission proxy: nginx -> this proxy -> the app.

Per request: exempt paths (static assets) go straight through. Otherwise the path gives the page
class; the session cookie (signed, tracked: ``cookies.py``) gives the session, or the request is a
new session and waits in the session queue (``sched.SessionScheduler``) - or gets the
waiting-room page at once (503, ``Retry-After``, its position and an estimate) when that queue is
full or a hold set waiting-room mode. An admitted session's requests wait only in their page
class' queue (``sched.PageClass``), then go to the app with the page's timeout.

Classification reads the path as nginx does for ``location`` (:func:`path_readings`): decoded
once (``%2e`` is a dot, ``%2F`` a slash), empty segments merged, ``.``/``..`` resolved (RFC 3986
5.2.4); a target that climbs above the root is refused (400 ``bad_target``, as nginx does), so is
one with a fragment. The app gets the target as the client sent it (nginx's ``proxy_pass``
without a URI does the same), and an app may read it otherwise (``%2F`` as data, ``\\`` as a
slash, ``;parameters`` stripped, dot segments left or resolved, empty segments kept): a request is
exempt only if it is exempt under every such reading, and its page class is the normalised
path's. Browsers resolve dot segments themselves; only hand-made targets take the slower path.

Bounded everywhere: a page queue and the session queue have a capacity and a maximum wait, the
app a per-page timeout (504) and a connect failure answer (502); a client that leaves while its
request waits (or uploads, or an exempt request is at the app) is dropped and counted: its handler
is cancelled (``ClientWatch``); one that leaves while the app works on its page request is counted
too, but the request keeps its page slot until the app answers (or the page's timeout ends the
wait), as the app's work goes on; a session is limited to ``max_in_flight`` requests at once (429).

Forwarding: the method, raw path and query, body and headers pass through, minus the hop-by-hop
headers (RFC 9110 7.6.1: Connection and every header it names, Keep-Alive, TE, Trailer,
Transfer-Encoding, Upgrade, ``Proxy`` and every ``Proxy-*``) and this proxy's own cookie;
``X-Forwarded-For`` gets the peer appended, ``X-Forwarded-Host`` is set when absent;
``X-Forwarded-Proto`` passes as nginx set it and is never made up (the proxy does not know the
visitor's scheme). Header values pass byte for byte, also bytes that are not UTF-8 (obs-text, RFC
9110 5.5: aiohttp decodes them as surrogate escapes and would drop them when it writes: such
headers are written by :func:`serialize_headers_as_received`). An app's answer without a
``Content-Type`` gets none. A WebSocket (any ``Upgrade`` but ``h2c``) cannot pass: 501, counted.
Bodies are not decoded, neither the request's nor the app's (``auto_decompress=False`` on both
sides: a gzip request body reaches the app byte for byte); a transfer coding other than chunked
is refused (501). The first MiB of every request body (chunked too) is read
before the request queues, within the body timeout (else 408); the rest of a larger one streams
to the app (``BodyPump``): a pause longer than the body timeout, or less than a MiB per body
timeout on average, ends it with 408 and frees its slot (outcome ``body_timeout``), and an app
that leaves it unread for the page timeout gets 504. ``Expect: 100-continue`` is answered here,
not sent on, and only once the request is let in: a new visitor the waiting room turns away gets
its 503 before sending the body. There is no size limit of the proxy's own: nginx's
``client_max_body_size`` (1m by default) is the limit. Responses up to 64 KiB are read whole (the
slot is free before the client reads); larger ones stream (keep nginx's ``proxy_buffering on`` so
a slow reader does not hold a slot). The app may not set this proxy's cookie: such a
``Set-Cookie`` is dropped.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict
from functools import partial
from html import escape as html_escape
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote_plus

import aiohttp
from aiohttp import http_writer, web
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from yarl import URL

from controllers.admission.config import AdmissionSection
from controllers.admission.cookies import CookieCodec, CookieError, KeyRing
from controllers.admission.metrics import EXEMPT_OUTCOMES, OUTCOMES, AdmissionMetrics
from controllers.admission.sched import (
    Clock,
    Hold,
    Holds,
    PageClass,
    QueueFull,
    QueueIntegral,
    Sessions,
    SessionScheduler,
    SessionState,
    Waiting,
)
from promreflex.httpd import (
    LIMITS,
    BodyError,
    Limits,
    LiveToken,
    ParserErrorLogger,
    add_standard_routes,
    on_disconnect,
    parser_refusal,
    read_body,
    read_head,
)

log = logging.getLogger("promreflex.admission")

HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"))
#: What upstream_headers does with a request header, by its lower-case name (one look-up per
#: header, :meth:`AdmissionProxy.header_action` for a name not listed): _PASS goes through.
_PASS, _DROP, _XFF, _COOKIE, _HOST = range(5)
REQUEST_HEADER_ACTIONS = {**dict.fromkeys(HOP_BY_HOP, _DROP), "expect": _DROP, "proxy": _DROP,
                          "x-forwarded-for": _XFF, "cookie": _COOKIE, "x-forwarded-host": _HOST}
#: Header names learnt by :meth:`AdmissionProxy.header_action` at most (past it, worked out
#: each time): request header names repeat, so the look-up stays one dictionary access.
HEADER_NAMES_LEARNT = 1024
#: Response headers not sent on: the hop-by-hop ones, and Content-Length when the proxy read the
#: body whole (aiohttp sets it for what it sends).
RESPONSE_DROP = HOP_BY_HOP
RESPONSE_DROP_BUFFERED = HOP_BY_HOP | {"content-length"}
MAX_BUFFERED_REQUEST = 1 << 20
#: The request bodies held in memory at once, every queued and forwarded request together: each
#: reads up to MAX_BUFFERED_REQUEST before it queues, and past this sum a request reads only what
#: already arrived (one chunk) and streams the rest once let in. 500 cookieless 1 MB POSTs queued
#: for a session took 550 MB, and every page queue as much again (a stranger's review, Q F8).
MAX_BUFFERED_TOTAL = 64 << 20
MAX_BUFFERED_RESPONSE = 64 << 10
#: Request headers the proxy accepts (nginx's default large_client_header_buffers: 4 x 8k): one
#: line at most MAX_HEADER_LINE bytes, all of them at most MAX_HEADER_BYTES; beyond -> 431.
MAX_HEADER_LINE = 8190
MAX_HEADER_BYTES = 32 << 10
#: aiohttp's parser limits, set above ours so the proxy answers 431 itself; a request beyond
#: even these gets aiohttp's 400 (counted through :class:`promreflex.httpd.ParserErrorLogger`).
PARSER_LIMITS: dict[str, int] = {"max_line_size": 4 * MAX_HEADER_LINE, "max_field_size": 4 * MAX_HEADER_LINE}
HOLDER = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
#: Per-request memories (:meth:`AdmissionProxy.route`, :meth:`AdmissionProxy.cookie_parts`): at
#: most this many entries of at most MEMO_KEY_CHARS characters each; past it a memory starts over.
MEMO_ENTRIES = 4096
MEMO_KEY_CHARS = 1024
#: Retry-After (s) of the waiting-room page while nobody is let in for an unknown time
#: (waiting-room mode, a full shop with no session ending yet): what waiting rooms commonly use.
CLOSED_RETRY = 30
STOPPING_RETRY = 2  # seconds: a restart (the next process listens within a second or two)
#: The longest Retry-After (and estimate) the waiting-room page gives.
MAX_RETRY = 300
#: Set on a request whose connection the proxy cut because the app broke off its streamed answer.
UPSTREAM_BROKE = web.RequestKey("promreflex_upstream_broke", bool)
#: How long a stopping proxy waits for the requests in progress (aiohttp's shutdown_timeout):
#: said in the log when it stops.
SHUTDOWN_TIMEOUT = 60.0


class Route(enum.Enum):
    """What :meth:`AdmissionProxy.route` answers besides a page class (or None: exempt)."""

    CLIMBS = "climbs"  # a reading of the path climbs above the root: 400 bad_target


# ------------------------------------------------------------------ reading a path
#: Whatever lets an app read a path otherwise than its plain decoding: a dot segment (``/.``,
#: ``/%2e``), an encoded slash or backslash, a backslash, a ``;parameter``, an empty segment.
_AMBIGUOUS = re.compile(r"/\.|/%2[eE]|%2[fF]|%5[cC]|[\\;]|//")
_ENCODED_SLASH = re.compile(r"%2[fF]")
#: An ambiguous path longer than this is read only the normalised way, and never exempt: its
#: readings cost time in proportion to its length (a quarter of a millisecond at this length, its
#: every kind of ambiguity in it), and no browser sends such a path.
READINGS_MAX_CHARS = 512


def decoded_path(raw: str) -> str:
    """``raw`` (a target's path as sent) decoded as aiohttp's ``request.path`` is: percent-decoded
    once, ``%2F`` included."""
    return URL.build(path=raw, encoded=True).path


def resolve_dot_segments(segments: list[str]) -> str | None:
    """The absolute path of ``segments`` (the parts after its first ``/``) with ``.`` and ``..``
    removed (RFC 3986 5.2.4); None when a ``..`` climbs above the root (nginx: 400)."""
    out: list[str] = []
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        if seg == "." or seg == "..":
            if seg == "..":
                if not out:
                    return None
                out.pop()
            if i == last:  # "/a/b/.." is "/a/", not "/a"
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def path_readings(raw: str, decoded: str | None = None, first_only: bool = False) -> list[str] | None:
    """The paths an app may take ``raw`` (a request target's path as the client sent it, the
    query left out) for, the normalised one first: what nginx matches its ``location`` blocks
    on (decoded once, ``%2e`` a dot and ``%2F`` a slash; empty segments merged; dot segments
    resolved). The others: ``%2F`` kept as data, ``\\`` (also ``%5C``) taken as a slash
    (Windows servers), ``;parameters`` stripped from each segment (servlet containers), empty
    segments kept, dot segments left as they are; every combination. None when one of them
    climbs above the root. ``decoded``: the plain decoding of ``raw`` when the caller has it
    (aiohttp's ``request.path``). A path with none of what makes readings differ (the common
    case) has one reading, its decoding. ``first_only``: the normalised reading alone."""
    if decoded is None:
        decoded = decoded_path(raw)
    if not _AMBIGUOUS.search(raw):
        return [decoded]
    texts = [decoded]
    if _ENCODED_SLASH.search(raw):  # (decoded once: "%252F" is the text "%2F", not a slash)
        texts.append(decoded_path(_ENCODED_SLASH.sub("%252F", raw)))
    readings: dict[str, None] = {}  # (ordered, without repeats)
    for text in texts:
        for backslash in (False, True):
            if backslash and "\\" not in text:
                continue
            segments = (text.replace("\\", "/") if backslash else text).split("/")[1:]
            for params in (False, True):
                if params and not any(";" in seg for seg in segments):
                    continue
                cut = [seg.split(";", 1)[0] for seg in segments] if params else segments
                for merge in (True, False):
                    parts = [seg for seg in cut[:-1] if seg] + cut[-1:] if merge else cut
                    resolved = resolve_dot_segments(parts)
                    if resolved is None:
                        return None
                    if first_only:
                        return [resolved]
                    readings[resolved] = None
                    readings["/" + "/".join(parts)] = None  # an app that resolves no dot segment
    return list(readings)


# ------------------------------------------------------------------ header bytes as received
#: True while aiohttp serializes headers that carry bytes outside UTF-8 (surrogate escapes).
_AS_RECEIVED: ContextVar[bool] = ContextVar("promreflex_admission_headers_as_received", default=False)
#: What aiohttp refuses in a header (its writer's check: CR, LF and the other controls but TAB).
_FORBIDDEN_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def serialize_headers_as_received(status_line: str, headers: Any) -> bytes:
    """A head as aiohttp's writer makes it, but every header byte as it was received: aiohttp's
    parsers decode a value as UTF-8 with surrogate escapes (``caf\\xe9`` -> ``"caf\\udce9"``) and
    its writer encodes UTF-8 and drops the surrogates (``caf``); here they become their bytes
    again (RFC 9110 5.5: obs-text is opaque data). The same refusal of control characters."""
    lines = [status_line]
    for name, value in headers.items():
        lines.append(f"{name}: {value}")
    for line in lines:
        if _FORBIDDEN_IN_HEADER.search(line):
            raise ValueError("Forbidden control character detected in headers. Potential header injection attack.")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def install_header_serializer() -> None:
    """Have aiohttp's writer (``http_writer._serialize_headers``, which its server and client
    both call per message) use :func:`serialize_headers_as_received` while ``_AS_RECEIVED`` is
    set, and its own otherwise (once per process). Only the proxy sets it, around the messages
    whose headers hold a byte that is not ASCII; every other message is written as before."""
    own = http_writer._serialize_headers
    if getattr(own, "promreflex_as_received", False):
        return

    def serialize(status_line: str, headers: Any) -> bytes:
        if _AS_RECEIVED.get():
            return serialize_headers_as_received(status_line, headers)
        return own(status_line, headers)

    serialize.promreflex_as_received = True  # type: ignore[attr-defined]
    http_writer._serialize_headers = serialize


class _AsTheAppSent(web.StreamResponse):
    """The app's answer: its header bytes as received (``as_received``) and no ``Content-Type``
    where it sent none (``untyped``; aiohttp would add ``application/octet-stream``, which makes a
    browser download what it would have sniffed). Used only for answers that need either."""

    as_received = False
    untyped = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        if self.untyped:
            self._headers.popall("Content-Type", None)

    async def _write_headers(self) -> None:
        if not self.as_received:
            await super()._write_headers()
            return
        token = _AS_RECEIVED.set(True)
        try:
            await super()._write_headers()
        finally:
            _AS_RECEIVED.reset(token)


class AsTheAppSentStream(_AsTheAppSent):
    pass


class AsTheAppSentResponse(_AsTheAppSent, web.Response):
    pass


class HoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["waiting_room", "session_cap"]
    session_cap: int | None = Field(default=None, ge=0)
    lease: float = Field(gt=0)
    reason: str = Field(default="", max_length=200)


def _connection_tokens(headers: Any) -> frozenset[str]:
    return frozenset(t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(","))


def own_cookies_in(header: str, prefix: str) -> list[str]:
    """The values of the cookie ``prefix`` (``name=``) in one Cookie header, in order (a client
    may send junk before a valid one; a browser sends one per matching path or domain, in one
    header or several: :meth:`AdmissionProxy.cookie_parts` is called per header); the other
    cookies are not parsed (they are the app's)."""
    out = []
    for part in header.split(";"):
        part = part.strip()
        if part.startswith(prefix):
            value = part[len(prefix):]
            out.append(value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value)
    return out


class UploadStalled(Exception):
    """The client paused a streamed request body longer than the body timeout."""


class AppNotReading(Exception):
    """The app took no byte of a streamed request body for its page's timeout."""


class BodyPump:
    """A request body larger than what is read up front, streamed to the app: ``head`` (already
    read), then the rest as the client sends it. The client must keep sending: a pause longer
    than ``idle``, or less than one MiB per ``idle`` on average after the first, raises
    UploadStalled (aiohttp ends the upstream request with it as the cause), so a trickle cannot
    hold a page slot. ``handed`` is when a chunk was handed to aiohttp and not taken yet: the app
    is not reading (``AdmissionProxy.forward`` bounds that by the page timeout: aiohttp's read
    timer only starts once the body is sent)."""

    def __init__(self, request: web.Request, head: bytes, idle: float):
        self.request, self.head, self.idle = request, head, idle
        self.handed: float | None = None

    def __aiter__(self) -> Any:
        return self._chunks()

    async def _chunks(self) -> Any:
        loop = asyncio.get_running_loop()
        received, waited = len(self.head), 0.0  # waited: on the client only (not while the app reads slowly)
        if self.head:
            self.handed = loop.time()
            yield self.head
            self.handed = None
        while True:
            wait = min(self.idle, self.idle * (1 + received / MAX_BUFFERED_REQUEST) - waited)
            if wait <= 0:
                raise UploadStalled(f"the body arrived slower than 1 MiB per {self.idle:g}s")
            t0 = loop.time()
            try:
                async with asyncio.timeout(wait):
                    chunk = await self.request.content.readany()
            except TimeoutError:
                raise UploadStalled(f"the body paused for more than {wait:g}s") from None
            finally:
                waited += loop.time() - t0
            if not chunk:
                return
            received += len(chunk)
            self.handed = loop.time()
            yield chunk
            self.handed = None


def describe_error(e: BaseException) -> str:
    """An upstream error for the log, without the request it carried (a ClientResponseError's
    repr holds the request's headers: cookies, Authorization)."""
    if isinstance(e, aiohttp.ClientResponseError):
        return f"{type(e).__name__}: {e.status} {e.message}"
    return f"{type(e).__name__}: {e}"


def header_problem(raw_headers: Any) -> str | None:
    """Why these request headers are too large (None: they are not). ``Cookie`` is bounded by the
    total only: nginx joins an HTTP/2 browser's cookies into one line for its upstream, which it
    passes past 8 KiB (a review: 10.6 KB of cookies, 200 from nginx and the app, 431 here)."""
    total = 0
    for name, value in raw_headers:
        size = len(name) + len(value) + 4
        if size > MAX_HEADER_LINE and name.lower() not in (b"cookie", "cookie"):
            return f"a header line is longer than {MAX_HEADER_LINE} bytes"
        total += size
    if total > MAX_HEADER_BYTES:
        return f"the request headers are longer than {MAX_HEADER_BYTES} bytes"
    return None


def refusal(reason: str) -> web.HTTPException:
    """The answer to a request aiohttp's parser refused (:func:`promreflex.httpd.parser_refusal`),
    with the proxy's words: 431 for headers too long or too many (also for a request line beyond
    32 KiB, which aiohttp's error does not tell from a header line: nginx answers 414 for one over
    its 8 KiB first), else 400."""
    if reason != "header_too_large":
        exc = web.HTTPBadRequest(text="bad request: not a request this proxy can read\n",
                                 headers={"Cache-Control": "no-store"})
        exc.force_close()
        return exc
    return parser_refusal(reason)


def _plain(status: int, text: str, retry_after: int | None = None, close: bool = False) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    resp = web.Response(status=status, text=text + "\n", headers=headers)
    if close:  # (a request body left unread: the connection cannot carry another request)
        resp.force_close()
    return resp


#: After an answer given before the request's body was all read (the app's early 401 or 413 to
#: an upload, the waiting room's 503 after the first MiB), the rest of the body is read and
#: dropped for up to this long before the connection closes, as nginx and aiohttp's own servers
#: do. Closed at once, the unread data made the kernel reset the connection while nginx was still
#: sending the body, and nginx lost the answer: 502 in 1 to 5 of 10 uploads of 20 MB.
LINGERING_S = 5.0
#: CORS preflights of one client (its address) at the app or in a page queue at once (429 beyond):
#: they need no admission, so without a bound anyone sending their two headers could fill a
#: page's FIFO queue ahead of admitted visitors in waiting-room mode (20.6 s for 0.5 s with 60 of
#: them); a bound for all clients together let one client's 8 refuse everyone's (a review).
PREFLIGHTS_AT_ONCE = 8
MAX_PREFLIGHT_CLIENTS = 10_000  # clients with a preflight in flight (the table's size bound)


def _cors_preflight(request: web.Request) -> bool:
    """A CORS preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``): the
    browser sends it without cookies, before a cross-origin request of a visitor who may well be
    in. Taken for a new session, each one queued, took an admission and left a session nobody
    used, and in waiting-room mode got the 503 without CORS headers: the browser then blocked the
    real request of a visitor already admitted. So it goes to the app without a session, through
    its page's limit and queue, at most ``PREFLIGHTS_AT_ONCE`` of one client at once."""
    return (request.method == "OPTIONS" and "Origin" in request.headers
            and "Access-Control-Request-Method" in request.headers)


def _chunked_only(headers: Any) -> bool:
    """A request's Transfer-Encoding, if any, is ``chunked`` alone: any other coding would reach
    the app de-chunked but still coded, and without a word of it (RFC 9112 6.1: 501)."""
    te = headers.get("Transfer-Encoding")
    if te is None:
        return True
    return [t.strip().lower() for v in headers.getall("Transfer-Encoding") for t in v.split(",")] == ["chunked"]


def _expects_continue(request: web.Request) -> bool:
    expect = request.headers.get("Expect")
    return expect is not None and request.version == aiohttp.HttpVersion11 and expect.lower() == "100-continue"


class ClientWatch:
    """Drops a request whose client left: the client's disconnect cancels the request's
    handler (what aiohttp's ``handler_cancellation`` does), except while the request is at the
    app (``handed_on``: a callable, told at once), where the answer is awaited and dropped.
    One shielded task per request did this before; awaiting the app in the handler itself is
    one task and two loop turns fewer per request (the proxy's added p99 at 1,000 req/s on a
    session page: about 0.2 ms less, ``bench.admission --overhead only``)."""

    __slots__ = ("task", "lost", "handed_on", "_forget")

    def __init__(self, request: web.Request):
        self.task = asyncio.current_task()
        self.lost = False
        self.handed_on: Callable[[ClientWatch], None] | None = None
        self._forget: Callable[[], None] | None = on_disconnect(request, self._gone)

    def close(self) -> None:
        """The request is over: no call any more, and no reference cycle left for the garbage
        collector (the registration refers back to this watch; one cycle per request made the
        collections that stall a request, +1 ms at the p99)."""
        if self._forget is not None:
            self._forget()
            self._forget = None
        self.task = None
        self.handed_on = None

    def _gone(self) -> None:
        self.lost = True
        if self.handed_on is not None:
            self.handed_on(self)
        elif self.task is not None:
            self.task.cancel()

    def drop(self) -> None:
        """Stop waiting for the app's answer (the proxy is stopping)."""
        if self.task is not None:
            self.task.cancel()


class AdmissionProxy:
    def __init__(self, cfg: AdmissionSection, ring: KeyRing | None = None,
                 registry: CollectorRegistry | None = None, clock: Clock = time.monotonic,
                 wall: Clock = time.time, token: str | LiveToken = ""):
        self.cfg = cfg
        self.clock, self.wall = clock, wall
        self.token = token
        self.registry = registry or CollectorRegistry()
        self.metrics = AdmissionMetrics(self.registry, cfg.page_names())
        self.codec = CookieCodec(ring or KeyRing.ephemeral())
        self.integral = QueueIntegral(clock())
        ps = cfg.page_scheduler
        self.pages = {p.name: PageClass(p.name, ps, self.integral, clock, p.timeout, p.logout) for p in cfg.pages}
        self.pages[cfg.default_page] = PageClass(cfg.default_page, ps, self.integral, clock)
        # Path-only classes (in order, with their rank), and those that need the query string too
        # (tried before a path-only class of a later rank: :meth:`with_query`).
        self.patterns = [(re.compile(p.pattern), self.pages[p.name]) for p in cfg.pages if p.query is None]
        self.ranks = {p.name: i for i, p in enumerate(cfg.pages)}
        self.query_patterns = [(i, re.compile(p.pattern), re.compile(p.query), self.pages[p.name])
                               for i, p in enumerate(cfg.pages) if p.query is not None]
        self.exempt = [re.compile(e) for e in cfg.exempt]
        self.holds = Holds(clock, self._expired, cfg.control.holds_file, wall)
        for h in self.holds.load():
            log.warning("hold %s (%s) kept from before the restart, %.0f s of its lease left", h.holder, h.mode,
                        h.expires - clock())
        if cfg.control.holds_file is None:
            log.info("control.holds_file is not set: holds (a waiting room, a session cap) do not survive a restart")
        self.scheduler = SessionScheduler(cfg.session_scheduler, cfg.session.queue_capacity, self.integral,
                                          self.holds, clock, self._oldest_wait)
        self.sessions = Sessions(cfg.session.idle_timeout, clock, wall(), cfg.session.max_sessions)
        self.upstream = cfg.upstream.rstrip("/")
        self.client: aiohttp.ClientSession | None = None
        self._timeouts = {name: aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=page.timeout)
                          for name, page in self.pages.items()}
        self._tasks: list[asyncio.Task[None]] = []
        self.buffered = 0  # request body bytes held in memory now (MAX_BUFFERED_TOTAL)
        # Requests whose client left while the app worked on them: they keep their page slot
        # until the app answers (or its page timeout ends the wait), see through_page.
        self._lingering: set[ClientWatch] = set()
        # CORS preflights in flight, by client (``_preflight``): never active, never admitted
        self._preflights: dict[str, SessionState] = {}
        self._stopping = False
        self.in_progress = 0  # requests in the handler now (said in the log when the proxy stops)
        self._own_cookie = cfg.session.cookie_name + "="
        # Paths and Cookie headers repeat (a session sends the same cookie with each request, a
        # shop has few page paths): what the per-request regular expressions and cookie parsing
        # found is remembered (bounded: MEMO_ENTRIES, MEMO_KEY_CHARS). Both depend only on the
        # configuration, which does not change while the proxy runs. Routes are remembered by
        # the path as sent (its readings differ by spelling: path_readings).
        self._routes: dict[str, PageClass | Route | None] = {}
        self._cookies: dict[str, tuple[tuple[str, ...], str]] = {}
        self._header_actions = dict(REQUEST_HEADER_ACTIONS)
        # Labelled children looked up once (a labels() call per use costs more than the count).
        self._requests = {(p, o): self.metrics.requests.labels(p, o) for p in self.pages for o in OUTCOMES}
        self._exempt_requests = {o: self.metrics.exempt_requests.labels(o) for o in EXEMPT_OUTCOMES}
        self._page_wait = {p: self.metrics.page_wait.labels(p) for p in self.pages}
        self._upstream_time = {p: self.metrics.upstream.labels(p) for p in self.pages}
        self._gauges()
        install_header_serializer()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.cfg.upstream_keepalive),
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._dispatch()), loop.create_task(self._sweep())]

    async def close(self) -> None:
        self.drop_lingering()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()

    def drop_lingering(self) -> None:
        """Stop waiting for the app's answers to clients that left (at shutdown: nobody reads
        them, and the server would wait for them)."""
        self._stopping = True
        for watch in list(self._lingering):
            watch.drop()
        # New sessions waiting for their turn are answered at once (come back in a moment): a
        # restart in a crowd kept this process, its port already closed, up to max_queue_wait
        # for them, while every admitted session's request found no one listening (a review).
        for w in self.scheduler.flush():
            if not w.fut.done():
                w.fut.set_result(False)

    def reload_keys(self, ring: KeyRing) -> None:
        self.codec = CookieCodec(ring)

    def _gauges(self) -> None:
        m = self.metrics
        for name, page in self.pages.items():
            m.page_queue.labels(name).set_function(partial(lambda p: len(p.queue), page))
            m.page_limit.labels(name).set_function(partial(lambda p: p.limit, page))
            m.page_in_flight.labels(name).set_function(partial(lambda p: p.in_flight, page))
            m.page_throughput.labels(name).set_function(partial(lambda p: p.regulator.throughput, page))
        m.session_queue.set_function(lambda: len(self.scheduler.queue))
        m.interval.set_function(lambda: self.scheduler.interval)
        m.active.set_function(lambda: len(self.sessions.active))
        # Read-only views (the exposition runs in a thread): expired holds are pruned by the sweeper.
        m.waiting_room.set_function(lambda: int(any(h.mode == "waiting_room" for h in list(self.holds.holds.values()))))
        m.session_cap.set_function(lambda: min([h.session_cap for h in list(self.holds.holds.values())
                                                 if h.mode == "session_cap" and h.session_cap is not None] or [-1]))
        m.holds.set_function(lambda: len(self.holds.holds))
        m.threshold.set(self.cfg.session_scheduler.queue_threshold)
        m.abandon_threshold.set(self.cfg.alerts.abandon_ratio)

    async def _dispatch(self) -> None:
        sched = self.scheduler
        while True:
            sched.wake.clear()
            try:
                delay = sched.poll(len(self.sessions.active))
            except Exception:  # noqa: BLE001 - the dispatcher must survive anything
                log.exception("session dispatcher")
                delay = 0.1
            if delay is None:
                await sched.wake.wait()
            elif delay > 0:
                try:
                    async with asyncio.timeout(delay):  # not wait_for: see action.py
                        await sched.wake.wait()
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(0)

    async def _sweep(self, every: float = 0.25) -> None:
        n = 0
        while True:
            await asyncio.sleep(every)
            try:
                self.sweep()
                n += 1
                if n % 240 == 0:
                    self.sessions.prune_ended(self.wall())
            except Exception:  # noqa: BLE001
                log.exception("admission sweep")

    def sweep(self) -> None:
        """Idle sessions -> abandoned; expired holds; regulation windows with no completion."""
        for s in self.sessions.idle():
            self.metrics.abandoned.labels(s.last_page or self.cfg.default_page).inc()
            self.scheduler.session_ended()
        self.holds.prune()
        for page in self.pages.values():
            page.regulate()
        self.scheduler.control(self.clock())
        self._apply_waiting_room()

    def _oldest_wait(self, now: float) -> float:
        """How long the oldest request in any page queue has waited (the session scheduler's
        starvation guard)."""
        return max(page.oldest_wait(now) for page in self.pages.values())

    def _expired(self, hold: Hold) -> None:
        self.metrics.holds_expired.inc()
        log.warning("hold %s (%s) expired: its lease was not renewed", hold.holder, hold.mode)
        self.scheduler.wake.set()

    def _apply_waiting_room(self) -> None:
        if self.scheduler.queue and self.holds.waiting_room():
            for w in self.scheduler.flush():
                if not w.fut.done():
                    w.fut.set_result(False)

    # ------------------------------------------------------------------ the proxy
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BUFFERED_REQUEST, middlewares=[self._door])
        app.router.add_route("*", "/{tail:.*}", self.handle, expect_handler=self._expect)
        return app

    @web.middleware
    async def _door(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A target no route takes (``OPTIONS *``, ``CONNECT host:port``: aiohttp's router would
        answer 404 uncounted) is refused like any target that is not origin-form."""
        if request.match_info.http_exception is None:
            return await handler(request)
        self._count_bad("bad_target")
        return _plain(400, "bad request target: origin-form (/path) only")

    async def _expect(self, request: web.Request) -> None:
        """``Expect``: aiohttp's own handler sends ``100 Continue`` before the request is
        handled; here it is sent when the body is read (:meth:`_handle`), after a new visitor is
        let in, so one the waiting room turns away gets its 503 before sending the body. Other
        expectations: 417, as aiohttp does."""
        if request.version == aiohttp.HttpVersion11 and \
                request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers.get('Expect', '')}")

    def server_kwargs(self) -> dict[str, Any]:
        """What the proxy's listener needs from aiohttp (``serving(..., **proxy.server_kwargs())``):
        handler cancellation (a client that leaves drops its queued request), bodies as sent (no
        decompression), parser limits above the proxy's own header limits, a logger that
        counts what the parser refuses, how long a stop waits for requests in progress, and a
        lingering close (``LINGERING_S``)."""
        return {"handler_cancellation": False, "logger": ParserErrorLogger(self._count_bad, refusal), "auto_decompress": False,
                "shutdown_timeout": SHUTDOWN_TIMEOUT, "lingering_time": LINGERING_S, **PARSER_LIMITS}

    def _count_bad(self, reason: str) -> None:
        # (the parser's "bad_body", an encoding it cannot decode, is one of the proxy's "malformed":
        # the proxy passes bodies through undecoded, so only a broken framing gets there)
        self.metrics.bad_requests.labels("malformed" if reason == "bad_body" else reason).inc()

    def classify(self, path: str) -> PageClass:
        for rx, page in self.patterns:
            if rx.search(path):
                return page
        return self.pages[self.cfg.default_page]

    def with_query(self, raw: str, page: PageClass, query: str) -> PageClass:
        """``page`` (the path's class) or the first class that needs a query string whose path
        and query both match, when that one comes before ``page`` in the configuration."""
        rank = self.ranks.get(page.name, len(self.ranks))  # (the default class: after every configured one)
        path = self._normal(raw)
        for i, rx, qrx, qpage in self.query_patterns:
            if i >= rank:
                break
            # as sent, or decoded as the app reads it: `?%73=shoes` is `?s=shoes` to PHP, and took
            # a search out of its class (a review)
            if rx.search(path) and (qrx.search(query) or qrx.search(unquote_plus(query))):
                return qpage
        return page

    def _normal(self, raw: str) -> str:
        readings = path_readings(raw, first_only=True)
        return readings[0] if readings else raw

    def route(self, raw: str) -> PageClass | Route | None:
        """The page class of the path ``raw`` (as the client sent it, without the query): that
        of its normalised reading; None when every reading of it is exempt (forwarded without a
        session); ``Route.CLIMBS`` when a reading climbs above the root (:func:`path_readings`;
        beyond READINGS_MAX_CHARS an ambiguous path is read the normalised way only, and is not
        exempt)."""
        try:
            return self._routes[raw]
        except KeyError:
            pass
        long = len(raw) > READINGS_MAX_CHARS and _AMBIGUOUS.search(raw) is not None
        readings = path_readings(raw, first_only=long)
        page: PageClass | Route | None
        if readings is None:
            page = Route.CLIMBS
        elif not long and all(any(rx.search(path) for rx in self.exempt) for path in readings):
            page = None
        else:
            page = self.classify(readings[0])
        if len(raw) <= MEMO_KEY_CHARS:
            if len(self._routes) >= MEMO_ENTRIES:
                self._routes.clear()
            self._routes[raw] = page
        return page

    def header_action(self, name: str) -> int:
        """What upstream_headers does with a request header not in REQUEST_HEADER_ACTIONS
        (``name`` in lower case): ``Proxy-*`` is dropped (the README's promise; ``Proxy`` itself
        is httpoxy's), the rest passes. Learnt, up to HEADER_NAMES_LEARNT names."""
        action = _DROP if name.startswith("proxy-") else _PASS
        if len(self._header_actions) < len(REQUEST_HEADER_ACTIONS) + HEADER_NAMES_LEARNT:
            self._header_actions[name] = action
        return action

    def cookie_parts(self, header: str) -> tuple[tuple[str, ...], str]:
        """One Cookie header holding this proxy's cookie: the values of its own cookie in it
        (:func:`own_cookies_in`) and the header without them, for the app ("": nothing left)."""
        parts = self._cookies.get(header)
        if parts is None:
            own = self._own_cookie
            parts = (tuple(own_cookies_in(header, own)),
                     "; ".join(c for c in (p.strip() for p in header.split(";")) if c and not c.startswith(own)))
            if len(header) <= MEMO_KEY_CHARS:
                if len(self._cookies) >= MEMO_ENTRIES:
                    self._cookies.clear()
                self._cookies[header] = parts
        return parts

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watch = ClientWatch(request)
        self.in_progress += 1
        try:
            return await self._handle(request, watch)
        finally:
            self.in_progress -= 1
            watch.close()

    async def _handle(self, request: web.Request, watch: ClientWatch) -> web.StreamResponse:
        problem = header_problem(request.raw_headers)
        if problem is not None:
            self._count_bad("header_too_large")
            resp = _plain(431, f"request header fields too large: {problem}")
            resp.force_close()
            return resp
        target = request.raw_path
        if not target.startswith("/") or "#" in target:
            # (a fragment: aiohttp routes the path before it, an app that does not would take
            # "/static/#/../../item" for "/item")
            self._count_bad("bad_target")
            return _plain(400, "bad request target: origin-form (/path, no #fragment) only")
        if request.version[0] != 1:  # HTTP/0.9 ("GET /path" alone): no headers, no Host
            self._count_bad("malformed")
            return _plain(400, "HTTP/1.0 or HTTP/1.1 only", close=True)
        if "Upgrade" in request.headers and self._refuses_upgrade(request):
            self._count_bad("upgrade")
            return _plain(501, "this proxy does not pass WebSocket or other protocol upgrades: nginx should send "
                               "such paths to the app directly", close=True)
        page = self.route(request.rel_url.raw_path)
        if self.query_patterns and isinstance(page, PageClass):
            page = self.with_query(request.rel_url.raw_path, page, request.rel_url.raw_query_string)
        if page is Route.CLIMBS:
            self._count_bad("bad_target")
            return _plain(400, "bad request target: its path climbs above the root")
        # A CORS preflight needs no session (a browser never sends cookies with it: Fetch) but
        # keeps its page's limit and queue: as exempt, anyone sending its two headers had an
        # unmetered way to the app on any page, waiting room or not (a review of the first fix).
        preflight = page is not None and _cors_preflight(request)
        body: bytes | Any = None
        session: SessionState | None = None
        cookie: str | None = None
        admitted_first = False
        reserved = False  # an Expect request's place in its session's max_in_flight, taken before its body
        held = 0  # bytes of its body this request holds in memory (MAX_BUFFERED_TOTAL)
        try:
            if request.body_exists:
                if not _chunked_only(request.headers):
                    self._count_bad("transfer_coding")
                    return _plain(501, "a transfer coding other than chunked is not supported", close=True)
                if _expects_continue(request):
                    if page is not None and not preflight:  # a page request: let in first, then ask for the body
                        got = await self._session(request, page)
                        if isinstance(got, web.StreamResponse):
                            got.force_close()  # (the body was never asked for)
                            return got
                        session, cookie = got
                        admitted_first = reserved = True
                        session.in_flight += 1  # (counted from the check: the body is asked for after it)
                    try:
                        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    except ConnectionError:
                        return self._with_cookie(_plain(400, "the client left", close=True), cookie)
                    request.writer.output_size = 0  # (as aiohttp's own: the answer has not begun)
                timeout = request.app.get(LIMITS, Limits()).body_timeout
                try:  # the first MiB of any body before it queues: a slow uploader holds no page slot
                    # the allowance is taken before the read (requests read side by side), then trued up
                    held = allowance = max(0, min(MAX_BUFFERED_REQUEST, MAX_BUFFERED_TOTAL - self.buffered))
                    self.buffered += allowance
                    head, whole = (await read_head(request, allowance, timeout)) if allowance else (b"", False)
                    self.buffered += len(head) - allowance
                    held = len(head)
                except BodyError as e:
                    self._count_bad({413: "body_too_large", 408: "body_timeout"}.get(e.status, "malformed"))
                    return self._with_cookie(_plain(e.status, str(e), close=True), cookie)
                body = head if whole else BodyPump(request, head, timeout)
            if page is None:
                return await self._exempt(request, body)
            if preflight:  # through the page's limit and queue, on a session per client that no one keeps
                return await self._preflight(request, page, body, watch)
            if not admitted_first:
                got = await self._session(request, page)
                if isinstance(got, web.StreamResponse):
                    return got
                session, cookie = got
            assert session is not None
            session.last_page = page.name
            reserved = False  # (handed on: through_page releases it)
            answer = await self.through_page(request, page, session, cookie, body, watch, reserved=admitted_first)
        finally:
            self.buffered -= held
            if reserved and session is not None:
                session.in_flight -= 1
                self.sessions.touch(session)
        if cookie is not None and not answer.prepared and not self._sets_own_cookie(answer):
            # The proxy's own answer (a page queue full or too slow, the app down or silent) to a
            # session's first request: the session was admitted, so it keeps its place. Without
            # the cookie its retry would be one more new session and this one a phantom, active
            # until its idle timeout and then counted as abandoned.
            answer.headers.add("Set-Cookie", self._cookie_header(cookie, self.cfg.session.max_age))
        return answer

    async def _preflight(self, request: web.Request, page: PageClass, body: bytes | Any,
                         watch: ClientWatch) -> web.StreamResponse:
        """A CORS preflight (``_cors_preflight``): at most ``PREFLIGHTS_AT_ONCE`` per client at
        once (its address as nginx appended it to ``X-Forwarded-For``, else the peer's), on a
        session of its own that is never active nor admitted."""
        forwarded = request.headers.get("X-Forwarded-For", "")
        client = forwarded.rsplit(",", 1)[-1].strip() or request.remote or ""
        passing = self._preflights.get(client)
        if passing is None:
            if len(self._preflights) >= MAX_PREFLIGHT_CLIENTS:
                self._requests[page.name, "session_busy"].inc()
                return _plain(429, "too many CORS preflights at once", retry_after=1)
            passing = self._preflights[client] = SessionState(sid="", issued=0.0, expires=0.0, last_seen=0.0)
        if passing.in_flight >= PREFLIGHTS_AT_ONCE:
            self._requests[page.name, "session_busy"].inc()
            return _plain(429, "too many CORS preflights of this client at once", retry_after=1)
        try:
            return await self.through_page(request, page, passing, None, body, watch)
        finally:
            if passing.in_flight <= 0:
                self._preflights.pop(client, None)

    async def _session(self, request: web.Request, page: PageClass) -> tuple[SessionState, str | None] | web.Response:
        """The request's session and, for a new one, its cookie to set; or the answer to a
        request not let in (the waiting room, or 429 beyond ``max_in_flight``)."""
        session = self.session_of(request)
        cookie: str | None = None
        if session is None:
            admitted = await self.admit(request, page)
            if isinstance(admitted, web.StreamResponse):
                return admitted
            session = admitted
            cookie = self.codec.issue(session.sid, session.issued, self.cfg.session.max_age)
        if session.in_flight >= self.cfg.session.max_in_flight:
            self._requests[page.name, "session_busy"].inc()
            return _plain(429, "too many requests of this session at once", retry_after=1)
        return session, cookie

    def _with_cookie(self, resp: web.Response, cookie: str | None) -> web.Response:
        """The proxy's own answer to the first request of a session just admitted: with its
        cookie (it keeps its place)."""
        if cookie is not None:
            resp.headers.add("Set-Cookie", self._cookie_header(cookie, self.cfg.session.max_age))
        return resp

    @staticmethod
    def _refuses_upgrade(request: web.Request) -> bool:
        """An ``Upgrade`` this proxy cannot pass: any protocol but ``h2c``, which a server may
        ignore (RFC 9110 7.8; curl --http2 asks for it), as it is ignored here (a hop-by-hop
        header, not sent on)."""
        protocols = {p.strip().lower() for v in request.headers.getall("Upgrade") for p in v.split(",")}
        return bool(protocols - {"h2c", ""})

    async def _exempt(self, request: web.Request, body: bytes | Any) -> web.StreamResponse:
        try:
            resp, outcome = await self.forward(request, None, body, None)
        except asyncio.CancelledError:  # the client left while the app worked (ClientWatch)
            self._exempt_requests["client_gone"].inc()
            raise
        self._exempt_requests[outcome].inc()
        return resp

    def _sets_own_cookie(self, resp: web.StreamResponse) -> bool:
        return any(v.startswith(self._own_cookie) for v in resp.headers.getall("Set-Cookie", ()))

    def session_of(self, request: web.Request) -> SessionState | None:
        own = self._own_cookie
        values = [v for header in request.headers.getall("Cookie", ()) if own in header
                  for v in self.cookie_parts(header)[0] if v]  # "": a logout's blank
        if not values:
            return None
        ticket = None
        for value in values:  # the first that verifies; each refused one is counted
            try:
                ticket = self.codec.verify(value, self.wall())
                break
            except CookieError as e:
                self.metrics.cookies.labels(e.reason).inc()
        if ticket is None:
            return None
        s = self.sessions.active.get(ticket.sid)
        if s is not None:
            return s
        previous = (ticket.sid not in self.sessions.ended
                    and ticket.issued <= int(self.sessions.started))  # (the same second: the previous process's)
        if (previous and self.cfg.session.readmit_after_restart
                and len(self.sessions.active) < self.cfg.session.max_sessions):
            self.metrics.readmitted.inc()
            return self.sessions.add(ticket.sid, ticket.issued, ticket.expires, "")
        # "ended": logged out, idle or replayed; "not_readmitted": a session of the process before
        # a restart that this one does not take back (readmit_after_restart off, or max_sessions
        # reached): it was counted as "ended", which the runbook reads as replayed cookies.
        self.metrics.cookies.labels("not_readmitted" if previous else "ended").inc()
        return None

    async def admit(self, request: web.Request, page: PageClass) -> SessionState | web.Response:
        sched, m = self.scheduler, self.metrics
        if self._stopping:  # (a new session on a connection still open while this process stops)
            m.rejected.labels("stopping").inc()
            return self.waiting_room("stopping", request.method)
        if self.holds.waiting_room():
            m.rejected.labels("waiting_room_mode").inc()
            return self.waiting_room("waiting_room_mode", request.method)
        if len(self.sessions.active) >= self.cfg.session.max_sessions:  # the memory bound
            m.rejected.labels("sessions_full").inc()
            return self.waiting_room("sessions_full", request.method)
        direct = not self.cfg.session_scheduler.enabled and self.holds.session_cap() is None
        if not direct:
            try:
                w = sched.enqueue()
            except QueueFull:
                m.rejected.labels("queue_full").inc()
                return self.waiting_room("queue_full", request.method)
            reason = await self._wait_session(w, request)
            if reason is not None:
                return self.waiting_room(reason, request.method)
        m.admitted.inc()
        now = self.wall()
        return self.sessions.add(self.codec.new_sid(), now, now + self.cfg.session.max_age, page.name)

    async def _wait_session(self, w: Waiting, request: web.Request) -> str | None:
        """None: admitted; else why not (counted)."""
        sched, m = self.scheduler, self.metrics
        try:
            async with asyncio.timeout(self.cfg.session.max_queue_wait):
                admitted = await w.fut
        except TimeoutError:
            sched.withdraw(w)
            m.rejected.labels("queue_timeout").inc()
            return "queue_timeout"
        except asyncio.CancelledError:
            sched.withdraw(w)
            m.rejected.labels("client_gone").inc()
            raise
        m.session_wait.observe(self.clock() - w.since)
        if not admitted:
            reason = "stopping" if self._stopping else "waiting_room_mode"
            m.rejected.labels(reason).inc()
            return reason
        return None

    def waiting_room(self, reason: str, method: str = "GET") -> web.Response:
        """The 503 page for a new session not let in. What it says depends on what holds the
        door, so that its estimate and ``Retry-After`` are true:
        - the session scheduler admits at its interval (queue full, waited too long): the place
          the visitor would take (``X-Queue-Position``) and position x interval
          (``X-Queue-Estimate-Seconds``);
        - a session cap or ``max_sessions`` is reached: nobody goes in until a session ends, so
          the estimate is the sessions to end before this one's turn over the rate sessions end;
        - waiting-room mode: nobody goes in until the hold ends (its lease, renewed by whoever
          set it): no position, a retry in ``CLOSED_RETRY`` seconds or the lease left if sooner.
        """
        now = self.clock()
        queued = len(self.scheduler.queue)
        headers = {"Cache-Control": "no-store"}
        if reason == "stopping":  # this process is stopping: the next one (a restart) takes the visitor
            retry, text = STOPPING_RETRY, "The shop is restarting: it lets you in again in a moment."
        elif reason == "waiting_room_mode":
            left = [h.expires - now for h in self.holds.holds.values() if h.mode == "waiting_room"]
            retry = max(1, min(CLOSED_RETRY, math.ceil(max(left, default=CLOSED_RETRY))))
            text = "The shop lets no new visitors in for the moment."
        else:
            position = queued + 1
            long_wait = False
            cap = self.holds.session_cap()
            limit = min(self.cfg.session.max_sessions, cap) if cap is not None else self.cfg.session.max_sessions
            full = len(self.sessions.active) >= limit
            if full or reason == "sessions_full":
                rate = self.scheduler.departure_rate or 0.0
                ahead = len(self.sessions.active) - limit + position
                est = ahead / rate if rate > 0 else None
                # The rate is smoothed per period and halves each period no session ends: after
                # a quiet spell it said "about 9829876954 s" (a stranger's review). Beyond what
                # Retry-After may say no number is honest; the page still retries no sooner
                # than Retry-After's longest (faster refreshes would only add load at the peak).
                if est is not None and est > MAX_RETRY:
                    est, long_wait = None, True
            else:
                est = self.scheduler.position_estimate(position)
            if est is None:
                retry = MAX_RETRY if long_wait else CLOSED_RETRY
                text = "The shop is full: a visitor is let in when another one leaves."
            else:
                retry = max(1, min(MAX_RETRY, math.ceil(est)))
                text = (f"{queued} visitor{'' if queued == 1 else 's'} ahead of you; you would be let in in "
                        f"about {est:.0f} s.")
                headers.update({"X-Queue-Position": str(position), "X-Queue-Estimate-Seconds": f"{est:.1f}"})
        if method in ("GET", "HEAD"):
            refresh = f"<meta http-equiv=\"refresh\" content=\"{retry}\">"
            after = f"This page retries by itself in {retry} s."
        else:
            # A form sent with an ended session (an editor who paused past idle_timeout) met the
            # waiting room, and the page's refresh asked again with a GET: what was typed was lost
            # (a stranger's review with DokuWiki, Q F5). No refresh: the browser's Back keeps the form.
            refresh = ""
            after = (f"What you sent ({html_escape(method[:20])}) was not received: go back and send it again "
                     f"in {retry} s; your browser keeps what you typed.")
        html = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>Waiting room</title>"
                f"{refresh}</head><body><h1>The shop is busy</h1>"
                f"<p>{text} {after}</p></body></html>\n")
        return web.Response(status=503, text=html, content_type="text/html",
                            headers={"Retry-After": str(retry), **headers})

    async def through_page(self, request: web.Request, page: PageClass, session: SessionState, cookie: str | None,
                           body: bytes | Any, watch: ClientWatch, reserved: bool = False) -> web.StreamResponse:
        """Wait for a slot of ``page``, then forward. The session counts the request in flight
        (``max_in_flight``) for as long as it holds or waits for a slot: a request whose client
        left while the app works on it keeps both until the app answers (``watch.handed_on``),
        so disconnecting does not let one session take every slot of a page. ``reserved``: the
        request was counted already (an ``Expect: 100-continue`` request, from its admission)."""
        m = self.metrics
        if not reserved:
            session.in_flight += 1
        try:
            try:
                fut = page.acquire()
            except QueueFull:
                self._requests[page.name, "queue_full"].inc()
                return _plain(503, f"page {page.name} is saturated: try again", retry_after=1)
            t0 = self.clock()
            if fut is not None:
                try:
                    async with asyncio.timeout(self.cfg.page_scheduler.max_queue_wait):
                        await fut
                except TimeoutError:
                    page.withdraw(fut)
                    self._requests[page.name, "queue_timeout"].inc()
                    self._page_wait[page.name].observe(self.clock() - t0)
                    return _plain(503, f"page {page.name}: waited too long for a slot", retry_after=1)
                except asyncio.CancelledError:
                    page.withdraw(fut)
                    self._requests[page.name, "client_gone"].inc()
                    raise
            waited = self.clock() - t0
            self._page_wait[page.name].observe(waited)
            if fut is not None:
                self.scheduler.page_waited(waited)

            extra: Callable[[int], list[tuple[str, str]]] | None = None
            if cookie is not None or page.logout:  # most requests have nothing to add: no closure for them
                def extra(status: int) -> list[tuple[str, str]]:
                    out: list[tuple[str, str]] = []
                    if watch.lost:  # the client left before the answer: no cookie, no completed session
                        return out
                    if cookie is not None:
                        out.append(("Set-Cookie", self._cookie_header(cookie, self.cfg.session.max_age)))
                    if page.logout and status < 400 and self.sessions.end(session.sid) is not None:
                        m.completed.inc()
                        self.scheduler.session_ended()
                        out = [("Set-Cookie", self._cookie_header("", 0))]
                    return out

            served = False
            mark = page.begin()
            try:
                # The client may leave now: the app's work on the page goes on, so does its slot
                # (or the page limit would stop counting work the app is doing), until the app
                # answers (the answer is then dropped) or the page's timeout ends the wait.
                watch.handed_on = partial(self._left_at_app, request, page)
                try:
                    resp, outcome = await self.forward(request, page, body, extra)
                except ConnectionError:  # (forward answers these itself; a last net, never a 500 and its traceback)
                    if not watch.lost:
                        self._requests[page.name, "client_gone"].inc()
                    return _plain(400, "the client left")
                finally:
                    watch.handed_on = None
                    self._lingering.discard(watch)
                served = outcome == "served"  # the app did the page's work: progress for the regulator
                if not watch.lost or request.get(UPSTREAM_BROKE):  # (else counted when it left)
                    self._requests[page.name, outcome].inc()
                return resp
            finally:
                page.release(served, mark)
        finally:
            session.in_flight -= 1
            self.sessions.touch(session)

    def _left_at_app(self, request: web.Request, page: PageClass, watch: ClientWatch) -> None:
        """The client of a request at the app left: counted now, its slot kept until the app
        answers. Not when forward cut the connection itself because the app broke off a
        streamed answer: that is the app's failure (counted as such), not a client leaving."""
        if not request.get(UPSTREAM_BROKE):
            self._requests[page.name, "client_gone"].inc()
            if self._stopping:  # nobody will read the answer and shutdown would wait for it
                watch.drop()
            else:
                self._lingering.add(watch)

    def _cookie_header(self, value: str, max_age: float) -> str:
        s = self.cfg.session
        return (f"{s.cookie_name}={value}; Path={s.cookie_path}; Max-Age={int(max_age)}; HttpOnly; "
                f"SameSite={s.cookie_samesite}"
                + ("; Secure" if s.cookie_secure else ""))

    def upstream_headers(self, request: web.Request) -> tuple[list[tuple[str, str]], bool]:
        """The request's headers for the app (one pass, no intermediate mapping), and whether
        one holds a byte that is not ASCII (then written as received: serialize_headers_as_received).
        ``X-Forwarded-Proto`` is not added: only nginx knows the visitor's scheme (set it there:
        ``proxy_set_header X-Forwarded-Proto $scheme``); the app gets what nginx sent, or none."""
        headers = request.headers
        named = _connection_tokens(headers) if "Connection" in headers else None
        own = self._own_cookie
        actions = self._header_actions
        out: list[tuple[str, str]] = []
        prior: list[str] = []
        host = False
        ascii_only = True
        for k, v in headers.items():
            lk = k.lower()
            if named is not None and lk in named:
                continue
            action = actions.get(lk)
            if action is None:
                action = self.header_action(lk)
            if action:
                if action == _DROP:
                    # (Expect: 100-continue is answered here, before the body is read; sent on, the
                    # client would wait for the app's own 100, which an app may never send)
                    continue
                if action == _XFF:
                    prior.append(v)
                    continue
                if action == _COOKIE:
                    if own in v:
                        v = self.cookie_parts(v)[1]
                        if not v:
                            continue
                else:
                    host = True
            if not v.isascii():
                ascii_only = False
            out.append((k, v))
        peer = request.remote or ""
        out.append(("X-Forwarded-For", f"{', '.join(prior)}, {peer}" if prior else peer))
        if not host and request.host:
            out.append(("X-Forwarded-Host", request.host))
            ascii_only = ascii_only and request.host.isascii()
        return out, not ascii_only

    async def forward(self, request: web.Request, page: PageClass | None, body: bytes | None,
                      extra: Callable[[int], list[tuple[str, str]]] | None) -> tuple[web.StreamResponse, str]:
        """Send the request to the app (``page`` None: an exempt request). Returns the response
        and its outcome.

        The app's time is bounded by aiohttp's own timers (``sock_read``: no byte for the page's
        timeout -> 504), not by one more timer per request; small answers (with a Content-Length
        up to 64 KiB) are read whole, so the page slot is free before the client reads."""
        assert self.client is not None
        name = page.name if page is not None else self.cfg.default_page
        t0 = self.clock() if page is not None else 0.0

        def done(resp: web.StreamResponse, outcome: str) -> tuple[web.StreamResponse, str]:
            if page is not None:
                self._upstream_time[name].observe(self.clock() - t0)
            return resp, outcome

        timeout = page.timeout if page is not None else self.cfg.page_scheduler.timeout
        headers, as_received = self.upstream_headers(request)
        token = _AS_RECEIVED.set(True) if as_received else None  # (the request's head is written in this task)
        try:
            sending = self.client.request(
                request.method, URL(self.upstream + request.raw_path, encoded=True),
                headers=headers, data=body, allow_redirects=False,
                timeout=self._timeouts[name], compress=None, chunked=None)
            up = await (self._watched(sending, body, timeout) if isinstance(body, BodyPump) else sending)
        except TimeoutError:
            return done(_plain(504, f"the app did not answer within {timeout:g}s"), "upstream_timeout")
        except AppNotReading:
            return done(_plain(504, f"the app did not read the request body for {timeout:g}s"), "upstream_timeout")
        except (aiohttp.ClientError, OSError) as e:
            if request.transport is None or request.transport.is_closing():
                return done(_plain(400, "the client left during its upload"), "client_gone")  # not the app's fault
            if isinstance(e.__cause__, UploadStalled):  # the client's upload paused: its fault, not the app's
                stalled = _plain(408, f"request body: {e.__cause__}")
                stalled.force_close()
                return done(stalled, "body_timeout")
            log.warning("upstream %s: %s", self.upstream, describe_error(e))
            if isinstance(e, aiohttp.ClientResponseError):  # it answered, with something unreadable
                return done(_plain(502, f"the app's response could not be read: {e.message}"), "upstream_error")
            return done(_plain(502, "the app cannot be reached"), "upstream_error")
        finally:
            if token is not None:
                _AS_RECEIVED.reset(token)
        try:
            status = up.status
            length = up.content_length
            empty = request.method == "HEAD" or status in (204, 304) or 100 <= status < 200
            buffered = not empty and length is not None and length <= MAX_BUFFERED_RESPONSE
            raw = up.headers
            named = _connection_tokens(raw) if "Connection" in raw else None
            drop = RESPONSE_DROP_BUFFERED if buffered else RESPONSE_DROP
            reason = up.reason
            ascii_only = reason is None or reason.isascii()
            # A list, not a CIMultiDict: aiohttp's response copies what it is given into its own.
            out: list[tuple[str, str]] = []
            for k, v in raw.items():
                lk = k.lower()
                if lk in drop or (named is not None and lk in named):
                    continue
                if lk == "set-cookie" and v.split("=", 1)[0].strip() == self.cfg.session.cookie_name:
                    continue  # only the proxy sets its session cookie (browsers trim the name's spaces)
                if not v.isascii():
                    ascii_only = False
                out.append((k, v))
            outcome = "upstream_5xx" if status >= 500 else "served"
            if extra is not None:
                out += extra(status)
            untyped = "Content-Type" not in raw
            if buffered:
                try:
                    payload = await up.read()
                except TimeoutError:
                    return done(_plain(504, "the app's response did not complete in time"), "upstream_timeout")
                except (aiohttp.ClientError, OSError) as e:  # it closed the connection mid-body
                    log.warning("upstream %s broke off a response: %s", self.upstream, describe_error(e))
                    return done(_plain(502, "the app's response was cut short"), "upstream_error")
                if ascii_only and not untyped:
                    return done(web.Response(status=status, reason=reason, body=payload, headers=out), outcome)
                answer = AsTheAppSentResponse(status=status, reason=reason, body=payload, headers=out)
                answer.as_received, answer.untyped = not ascii_only, untyped
                return done(answer, outcome)
            if ascii_only and not untyped:
                resp = web.StreamResponse(status=status, reason=reason, headers=out)
            else:
                resp = AsTheAppSentStream(status=status, reason=reason, headers=out)
                resp.as_received, resp.untyped = not ascii_only, untyped
            if request.version < (1, 1) and "Content-Length" not in raw:
                # HTTP/1.0 has no chunks: a streamed answer of no length ends with the connection
                # (an HTTP/1.0 client asking for keep-alive waited 60 s for an end never sent; a review)
                resp.force_close()
            try:
                await resp.prepare(request)
            except ConnectionError:  # the client left before its answer began (counted where it left)
                return done(resp, "client_gone")
            if not empty:
                try:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    if request.transport is None or request.transport.is_closing():
                        return done(resp, "client_gone")  # the client left mid-stream (counted where it left)
                    # Headers are gone: the only honest signal left is to cut the connection.
                    log.warning("upstream %s broke off a streamed response: %s", self.upstream, describe_error(e))
                    request[UPSTREAM_BROKE] = True  # the cancellation that follows is not a client leaving
                    request.transport.abort()
                    return done(resp, "upstream_error")
            try:
                await resp.write_eof()
            except ConnectionError:  # the client left as its answer ended
                return done(resp, "client_gone")
            return done(resp, outcome)
        finally:
            up.release()

    @staticmethod
    async def _watched(sending: Any, pump: BodyPump, limit: float) -> Any:
        """Await the upstream request while ``pump`` streams its body; AppNotReading when the
        app has taken no chunk for ``limit`` seconds (the page timeout)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(sending)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(1.0, limit))
                if done:
                    return task.result()
                if pump.handed is not None and loop.time() - pump.handed > limit:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)  # (our own cancellation still raises)
                    raise AppNotReading
        except asyncio.CancelledError:
            task.cancel()
            raise

    # ------------------------------------------------------------------ control
    def control_app(self) -> web.Application:
        app = add_standard_routes(web.Application(client_max_size=4096, middlewares=[self._control_unrouted]),
                                  self.registry, "promreflex admission proxy")
        app.router.add_get("/api/v1/state", self.get_state)
        app.router.add_put("/api/v1/holds/{holder}", self.put_hold)
        app.router.add_delete("/api/v1/holds/{holder}", self.delete_hold)
        return app

    @web.middleware
    async def _control_unrouted(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A control request no route takes is counted: 404 ``not_found``, a wrong method (405)
        ``bad_request``."""
        exc = request.match_info.http_exception
        if exc is not None:
            self.metrics.control.labels("not_found" if exc.status == 404 else "bad_request").inc()
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        token = self.token.value if isinstance(self.token, LiveToken) else self.token
        if not token:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    def _control(self, result: str, status: int, payload: dict[str, Any]) -> web.Response:
        self.metrics.control.labels(result).inc()
        return web.json_response(payload, status=status)

    async def get_state(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._control("unauthorized", 401, {"error": "bearer token required"})
        return self._control("ok", 200, self.state())

    def state(self) -> dict[str, Any]:
        now = self.clock()
        self.holds.prune()
        return {
            "pages": {n: {"limit": p.limit, "in_flight": p.in_flight, "queue": len(p.queue),
                          "throughput": round(p.regulator.throughput, 3), "knee": p.regulator.knee(),
                          "last_decision": p.decisions[-1].why if p.decisions else None}
                      for n, p in self.pages.items()},
            "sessions": {"active": len(self.sessions.active), "queue": len(self.scheduler.queue),
                         "interval_seconds": self.scheduler.interval,
                         "departure_rate": self.scheduler.departure_rate,
                         "last_period": asdict(self.scheduler.periods[-1]) if self.scheduler.periods else None},
            "waiting_room": self.holds.waiting_room(), "session_cap": self.holds.session_cap(),
            "holds": {h.holder: {"mode": h.mode, "session_cap": h.session_cap, "reason": h.reason,
                                 "expires_in": round(h.expires - now, 3)} for h in self.holds.holds.values()},
        }

    async def put_hold(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._control("unauthorized", 401, {"error": "bearer token required"})
        holder = request.match_info["holder"]
        if not HOLDER.match(holder):
            return self._control("bad_request", 400, {"error": "holder: 1-200 of letters, digits, '_.:-'"})
        try:
            raw = json.loads(await read_body(request, 4096))
            req = HoldRequest.model_validate(raw)
        except BodyError as e:
            return self._control("bad_request", e.status, {"error": str(e)})
        except (ValueError, ValidationError) as e:
            return self._control("bad_request", 400, {"error": f"not a hold: {e}"})
        if req.mode == "session_cap" and req.session_cap is None:
            return self._control("bad_request", 400, {"error": "mode session_cap needs session_cap"})
        lease = min(req.lease, self.cfg.control.max_lease)
        self.holds.put(Hold(holder, req.mode, req.session_cap if req.mode == "session_cap" else None,
                            self.clock() + lease, req.reason))
        self._apply_waiting_room()
        self.scheduler.wake.set()
        return self._control("ok", 200, {"holder": holder, "mode": req.mode, "session_cap": req.session_cap,
                                         "lease": lease})

    async def delete_hold(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._control("unauthorized", 401, {"error": "bearer token required"})
        holder = request.match_info["holder"]
        removed = self.holds.remove(holder)
        self.scheduler.wake.set()
        return self._control("ok", 200, {"holder": holder, "removed": removed})


def load_ring(key_file: Path | None) -> KeyRing:
    if key_file is None:
        log.warning("no session.key_file: signing with an ephemeral key (cookies do not survive a restart)")
        return KeyRing.ephemeral()
    return KeyRing.from_file(key_file)
