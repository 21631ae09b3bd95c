"""Access-log line parsers compiled from nginx ``log_format`` strings.

Every supported format, built-in or user-given, is written as an nginx ``log_format`` string
and compiled by one function into one anchored regular expression, so there is exactly one
parsing path to make fast and correct. Apache's ``combined``/``common`` have the same shape as
nginx's (``%t`` prints the brackets, ``%r`` the request line), so they are expressed with
nginx variable names too.

Built-in formats (``FORMATS``):

* ``nginx_combined``: nginx's predefined ``combined``. Extra trailing fields (a common habit:
  ``"$http_x_forwarded_for"``) are accepted and ignored.
* ``nginx_timed``: the promreflex format, ``combined`` plus request and upstream times::

      log_format promreflex '$remote_addr - $remote_user [$time_local] "$request" '
                            '$status $body_bytes_sent "$http_referer" "$http_user_agent" '
                            'rt=$request_time urt="$upstream_response_time"';

  The common variant with the two times as plain trailing fields
  (``... "$http_user_agent" $request_time $upstream_response_time``) is accepted as well.
* ``apache_combined``: ``%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"``; lines in
  ``common`` format (without referer and user agent) are accepted too.
* ``apache_common``: ``%h %l %u %t "%r" %>s %b``.

Every built-in format ignores extra trailing fields, so a site that appended e.g. ``%D`` or
``"$http_x_forwarded_for"`` is still counted (use ``custom`` to read such a field).

How a variable becomes a regex group: a few variables have a shape of their own
(``$upstream_response_time`` may list several upstreams, ``"0.010, 0.020 : 0.005"``); every other
variable is a field that runs up to the next literal character of the format (``[^"]*`` before
a quote, ``\\S*`` before a space, ``.*?`` before anything else), which is what nginx's own
separators make unambiguous and is far cheaper than backtracking ``.*?`` everywhere. Values
whose syntax matters (status, bytes, times) are captured loosely and validated afterwards, so
a bad value is counted under its own rejection reason instead of a vague "no match".
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

COMBINED = (
    '$remote_addr - $remote_user [$time_local] "$request" '
    '$status $body_bytes_sent "$http_referer" "$http_user_agent"'
)
COMMON = '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent'

# Rejection reasons, exported with every label value pre-created at 0.
REASONS = ("no_match", "bad_status", "bad_bytes", "bad_time", "oversized", "bad_encoding")

_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")
_TIMES = r"-|\d+(?:\.\d+)?(?:(?:, | : )(?:-|\d+(?:\.\d+)?))*"

# Variables whose own syntax is part of the pattern (anything else: "a field up to the next literal").
_NO_SPACE = r"\S*"
_SHAPED = {
    # never contain a space, so they stay one field also at the end of a format
    **dict.fromkeys(
        ("status", "body_bytes_sent", "bytes_sent", "request_time", "request_length", "msec",
         "remote_addr", "remote_port", "server_port", "connection", "connection_requests",
         "time_iso8601", "pipe"),
        _NO_SPACE,
    ),
    "upstream_response_time": _TIMES,
    "upstream_connect_time": _TIMES,
    "upstream_header_time": _TIMES,
    "upstream_status": r"-|\d{3}(?:(?:, | : )(?:-|\d{3}))*",
}
# Variables whose captured text the parser uses; the first listed that the format has wins.
_STATUS = ("status",)
_BYTES = ("body_bytes_sent", "bytes_sent")
_REQUEST_TIME = ("request_time",)
_UPSTREAM_TIME = ("upstream_response_time",)
_REQUEST = ("request",)
_URI = ("request_uri", "uri", "document_uri")


class Parsed(NamedTuple):
    """The parts of one line that become metrics (everything else is not kept)."""

    status: int
    body_bytes: int
    request_time: float | None
    upstream_time: float | None
    path: str | None  # only filled when asked for (routes configured)


class LogFormatError(ValueError):
    """A log_format string that cannot be compiled into a parser."""


def _field_pattern(next_literal: str) -> str:
    if next_literal == "":
        return ".*"
    c = next_literal[0]
    if c == '"':
        return '[^"]*'
    if c == " ":
        return r"\S*"
    if c == "]":
        return r"[^\]]*"
    return ".*?"


def compile_log_format(log_format: str, *, trailing: bool = False) -> tuple[re.Pattern[str], list[str]]:
    """Compile an nginx ``log_format`` string into an anchored regex; return it and its variables.

    Each variable's first occurrence is a named group (later ones are matched but not
    captured: regex group names must be unique). ``trailing=True`` accepts and ignores extra
    space-separated text after the format.
    """
    if not isinstance(log_format, str) or not log_format.strip():
        raise LogFormatError("log_format is empty")
    pieces = _VAR.split(log_format)
    # split() with two groups yields: literal, name-or-None, name-or-None, literal, ...
    literals = pieces[0::3]
    names = [a or b for a, b in zip(pieces[1::3], pieces[2::3], strict=True)]
    if not names:
        raise LogFormatError("log_format has no $variable")
    out = [re.escape(literals[0])]
    seen: list[str] = []
    for i, name in enumerate(names):
        following = literals[i + 1]
        if following == "" and i + 1 < len(names):
            raise LogFormatError(
                f"${name} is directly followed by ${names[i + 1]}: with no separator between them "
                "the line cannot be split reliably"
            )
        # with trailing text allowed, a format-final variable ends at the next space
        body = _SHAPED.get(name) or _field_pattern(following or (" " if trailing else ""))
        if name in seen:
            out.append(f"(?:{body})")
        else:
            seen.append(name)
            out.append(f"(?P<{name}>{body})")
        out.append(re.escape(following))
    if trailing:
        out.append(r"(?: .*)?")
    try:
        return re.compile("".join(out) + r"\Z"), seen
    except re.error as e:  # pragma: no cover - escape() and our bodies make this unreachable
        raise LogFormatError(f"log_format compiles to an invalid regex: {e}") from e


def _timed_pattern() -> re.Pattern[str]:
    """``combined`` + request/upstream time, labelled (``rt=``/``urt="..."``) or plain fields."""
    combined, _ = compile_log_format(COMBINED)
    return re.compile(
        combined.pattern.removesuffix(r"\Z")
        + r' (?:rt=)?(?P<request_time>\S+)'
        + rf'(?: (?:urt=)?(?P<uq>"?)(?P<upstream_response_time>{_TIMES})(?P=uq))?'
        + r"(?: .*)?\Z"
    )


def _apache_combined_pattern() -> re.Pattern[str]:
    """Apache ``combined`` whose referer/user-agent part may be absent (``common`` lines)."""
    common, _ = compile_log_format(COMMON)
    return re.compile(common.pattern.removesuffix(r"\Z") + r'(?: "(?P<http_referer>[^"]*)" "(?P<http_user_agent>[^"]*)")?(?: .*)?\Z')


def _first(groupindex: dict[str, int], candidates: tuple[str, ...]) -> int | None:
    for name in candidates:
        if name in groupindex:
            return groupindex[name]
    return None


class LineParser:
    """A compiled format. :meth:`parse` returns :class:`Parsed` or a rejection reason (``REASONS``).

    Group positions are resolved once here so the per-line path is one ``match`` plus a few
    indexed ``group`` calls.
    """

    __slots__ = ("name", "regex", "_status", "_bytes", "_rt", "_urt", "_request", "_uri")

    def __init__(self, name: str, regex: re.Pattern[str]) -> None:
        self.name = name
        self.regex = regex
        gi = regex.groupindex
        status = _first(gi, _STATUS)
        if status is None:
            raise LogFormatError(f"format {name!r} has no $status: nothing to count requests by")
        self._status: int = status
        self._bytes = _first(gi, _BYTES)
        self._rt = _first(gi, _REQUEST_TIME)
        self._urt = _first(gi, _UPSTREAM_TIME)
        self._request = _first(gi, _REQUEST)
        self._uri = _first(gi, _URI)

    @property
    def has_times(self) -> bool:
        """True when lines carry ``$request_time`` (the duration histogram is fed)."""
        return self._rt is not None

    @property
    def has_upstream_times(self) -> bool:
        return self._urt is not None

    @property
    def has_path(self) -> bool:
        """True when a request path can be read (``$request`` or ``$request_uri``/``$uri``)."""
        return self._request is not None or self._uri is not None

    def parse(self, line: str, want_path: bool = False) -> Parsed | str:
        # nginx and Apache escape every byte outside printable ASCII (\xNN), so a replacement
        # character (undecodable bytes) or a NUL (zero-filled blocks after a crash) means the
        # line is damaged, whatever the regex would make of it.
        if "\ufffd" in line or "\x00" in line:
            return "bad_encoding"
        m = self.regex.match(line)
        if m is None:
            return "no_match"
        status_s = m.group(self._status)
        if len(status_s) != 3 or not status_s.isdigit() or not "1" <= status_s[0] <= "5":
            return "bad_status"
        body_bytes = 0
        if self._bytes is not None:
            b = m.group(self._bytes)
            if b.isdigit():
                body_bytes = int(b)
            elif b != "-":
                return "bad_bytes"
        rt = urt = None
        if self._rt is not None:
            rt = _seconds(m.group(self._rt))
            if rt is None:
                return "bad_time"
        if self._urt is not None:
            u = m.group(self._urt)
            if u is not None and u != "-":
                urt = _sum_times(u)
        path = None
        if want_path:
            if self._uri is not None:
                path = m.group(self._uri)
            elif self._request is not None:
                path = request_path(m.group(self._request))
        return Parsed(int(status_s), body_bytes, rt, urt, path)


def _seconds(text: str) -> float | None:
    """A non-negative finite number of seconds, or None."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v >= 0 and math.isfinite(v) else None


def _sum_times(text: str) -> float | None:
    """Total of an upstream time list (``"0.010, 0.020 : 0.005"``): every try and redirect."""
    total, any_value = 0.0, False
    for part in re.split(r", | : ", text):
        if part != "-":
            total += float(part)
            any_value = True
    return total if any_value else None


def request_path(request: str) -> str | None:
    """The path of a request line ``"GET /a/b?x=1 HTTP/1.1"`` -> ``/a/b?x=1``; None if it has none."""
    first = request.find(" ")
    if first < 0:
        return None
    end = request.find(" ", first + 1)
    target = request[first + 1 :] if end < 0 else request[first + 1 : end]
    return target or None


FORMATS = ("nginx_combined", "nginx_timed", "apache_combined", "apache_common", "custom")


def build_parser(fmt: str, log_format: str | None = None) -> LineParser:
    """The parser for a built-in format name, or for ``custom`` with its ``log_format``."""
    if fmt == "nginx_combined":
        return LineParser(fmt, compile_log_format(COMBINED, trailing=True)[0])
    if fmt == "nginx_timed":
        return LineParser(fmt, _timed_pattern())
    if fmt == "apache_combined":
        return LineParser(fmt, _apache_combined_pattern())
    if fmt == "apache_common":
        return LineParser(fmt, compile_log_format(COMMON, trailing=True)[0])
    if fmt == "custom":
        if not log_format:
            raise LogFormatError("format 'custom' needs log_format")
        return LineParser(fmt, compile_log_format(log_format)[0])
    raise LogFormatError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
