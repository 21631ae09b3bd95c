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
  (``... "$http_user_agent" $request_time $upstream_response_time``) is accepted as well, when
  the first looks like ``$request_time`` (seconds with a fraction); ingress-nginx's default
  (``... "$http_user_agent" $request_length $request_time [...]``) is not this format: use
  ``custom`` with its ``log-format-upstream``.
* ``apache_combined``: ``%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"``; lines in
  ``common`` format (without referer and user agent) are accepted too.
* ``apache_common``: ``%h %l %u %t "%r" %>s %b``.
* ``apache_vhost_combined``: Debian's ``vhost_combined`` (``other_vhosts_access.log``),
  ``%v:%p %h %l %u %t "%r" %>s %O "%{Referer}i" "%{User-Agent}i"``: ``combined`` after the
  virtual host and port; lines without referer and user agent are accepted too.

Every built-in format ignores extra trailing fields, so a site that appended e.g. ``%D`` or
``"$http_x_forwarded_for"`` is still counted (use ``custom`` to read such a field).

The request time is read in seconds from ``$request_time`` (nginx; Apache ``%T``, whole
seconds). Apache's other duration fields have other units, so ``custom`` has two placeholders
that nginx does not define: ``$request_time_ms`` (milliseconds, Apache ``%{ms}T``) and
``$request_time_us`` (microseconds, Apache ``%D`` and ``%{us}T``), converted to seconds. A
``LogFormat "%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\" %D"`` is
``custom`` with ``log_format: '... "$http_user_agent" $request_time_us'``; mapping ``%D`` to
``$request_time`` would read microseconds as seconds.

How a variable becomes a regex group: a few variables have a shape of their own
(``$upstream_response_time`` may list several upstreams, ``"0.010, 0.020 : 0.005"``; so may every
``$upstream_*`` variable outside quotes, ``$upstream_addr`` ``10.1.0.7:80, 10.1.0.8:80`` and
``$upstream_response_length`` ``0, 0`` unquoted in ingress-nginx's default format; an unbracketed
``$time_local`` holds a space); every other
variable is a field that runs up to the next literal character of the format (``[^"]*`` before
a quote, ``\\S*`` before a space, ``.*?`` before anything else), which is what nginx's own
separators make unambiguous and is far cheaper than backtracking ``.*?`` everywhere. Values
whose syntax matters (status, bytes, times) are captured loosely and validated afterwards, so
a bad value is counted under its own rejection reason instead of a vague "no match".
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from promreflex import recompat

COMBINED = (
    '$remote_addr - $remote_user [$time_local] "$request" '
    '$status $body_bytes_sent "$http_referer" "$http_user_agent"'
)
COMMON = '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent'

# Rejection reasons, exported with every label value pre-created at 0.
REASONS = ("no_match", "bad_status", "bad_bytes", "bad_time", "oversized", "bad_encoding")

_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")
# "" too: with ``escape=json`` nginx writes an empty value, not "-", for a request that never
# reached an upstream
# A time nginx logs: whole seconds up to 5 digits (27.8 h; a longer one is junk, not a slow
# request: it would add years to a histogram's sum), see MAX_SECONDS.
_TIME_NUMBER = r"\d{1,5}(?:\.\d+)?"
MAX_SECONDS = 100_000.0
_TIME_ITEM = rf"(?:-|{_TIME_NUMBER})"
_TIME_SEP = "(?:, | : )"
_TIMES = rf"{_TIME_ITEM}(?:{_TIME_SEP}{_TIME_ITEM})*|"

# Variables whose own syntax is part of the pattern (anything else: "a field up to the next literal").
_NO_SPACE = r"\S*"
_SHAPED = {
    # never contain a space, so they stay one field also at the end of a format
    **dict.fromkeys(
        ("status", "body_bytes_sent", "bytes_sent", "request_time", "request_time_ms", "request_time_us",
         "request_length", "msec",
         "remote_addr", "remote_port", "server_port", "connection", "connection_requests",
         "time_iso8601", "pipe"),
        _NO_SPACE,
    ),
    "upstream_response_time": _TIMES,
    "upstream_connect_time": _TIMES,
    "upstream_header_time": _TIMES,
    # "" too: with escape=json nginx writes an unset variable empty (a request nginx answered
    # itself, a static file, a limit_req 429), where the default escaping writes "-"
    "upstream_status": r"-|\d{3}(?:(?:, | : )(?:-|\d{3}))*|",
}
# Variables nginx writes as a list when a request went to more than one upstream (retries: "a, b";
# an internal redirect to another group: "a : b"), unquoted in ingress-nginx's default
# log-format-upstream ($upstream_addr $upstream_response_length ...). The times and statuses above
# have their own list shapes; these get the generic one. Any other $upstream_* variable gets it
# too when it is not quoted (where quotes delimit the value anyway), except the upstream's header,
# cookie and trailer values.
_LISTS = frozenset(
    {"upstream_addr", "upstream_response_length", "upstream_bytes_sent", "upstream_bytes_received",
     "upstream_queue_time", "upstream_first_byte_time", "upstream_session_time",
     # the client's address and the proxies': "203.0.113.7, 10.0.0.2" (first in formats that log
     # the real client where $remote_addr goes)
     "http_x_forwarded_for", "proxy_add_x_forwarded_for"}
)
_LIST_SEP = "(?:, | : )"
# Header, cookie and trailer values of the upstream's answer: free text ("no-cache,no-store"),
# not lists of upstreams; a field up to the next literal, as any other variable.
_UPSTREAM_HEADERS = ("upstream_http_", "upstream_cookie_", "upstream_trailer_")


def _list_pattern(next_literal: str) -> str:
    """Items without spaces or commas (nor the next literal's first character), joined by
    ``, `` or `` : ``: linear, and a list ends where the format's next field starts."""
    c = next_literal[:1]
    item = rf"[^\s,{re.escape(c)}]*" if c and not c.isspace() and c != "," else r"[^\s,]*"
    return rf"{item}(?:{_LIST_SEP}{item})*"


# $time_local ("10/Oct/2023:13:55:36 +0000") always holds a space: outside brackets or quotes
# (which delimit it) it is matched by its own shape instead of as a field up to the next space.
_TIME_LOCAL = r"[^\s\]\[\"]+ [+-]\d{4}"


def _shape(name: str, next_literal: str) -> str | None:
    """The pattern of a variable with a shape of its own, or None (a field up to the next literal)."""
    shaped = _SHAPED.get(name)
    if shaped is not None:
        return shaped
    delimited = next_literal[:1] in ('"', "]")
    if name in _LISTS or (name.startswith("upstream_") and not name.startswith(_UPSTREAM_HEADERS)):
        return None if delimited else _list_pattern(next_literal)
    if name == "time_local" and not delimited:
        return _TIME_LOCAL
    return None
# Variables whose captured text the parser uses; the first listed that the format has wins.
_STATUS = ("status",)
_BYTES = ("body_bytes_sent", "bytes_sent")
_REQUEST_TIME = ("request_time", "request_time_ms", "request_time_us")
# What a request-time variable's value is divided by to give seconds.
TIME_DIVISORS = {"request_time": 1.0, "request_time_ms": 1e3, "request_time_us": 1e6}
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


# A quoted field. nginx's default escaping writes \x22 for a quote inside a value, so
# ``[^"]*`` is exact there, and about 3x cheaper for Python's re than the escape-aware form;
# ``escape=json`` writes \" instead, so JSON formats (a log_format starting with ``{``) get
# the escape-aware form: anything but a quote or backslash, or a backslash escape.
_QUOTED = '[^"]*'
_QUOTED_ESCAPES = r'[^"\\]*(?:\\.[^"\\]*)*'


def _no_space(next_literal: str) -> str:
    """A field without spaces that also stops at the next literal character (``"status":"200"``)."""
    c = next_literal[:1]
    return rf"[^\s{re.escape(c)}]*" if c and not c.isspace() else _NO_SPACE


def _field_pattern(next_literal: str, quoted: str = _QUOTED) -> str:
    if next_literal == "":
        return ".*"
    c = next_literal[0]
    if c == '"':
        return quoted
    if c == " ":
        return r"\S*"
    if c == "]":
        return r"[^\]]*"
    # Any other separator (`|`, `;`, `,`, a tab): the value runs to its first occurrence that is
    # not followed by a space, so lists nginx writes with ", " ($http_x_forwarded_for,
    # $upstream_addr) stay one value. A lazy `.*?` here let a value hold its separator anywhere, at
    # the cost of trying every split of a line that does not match: O(n^3) for a few fields (a
    # 4 KB line of a drifted format took 37 s). Possessive (`*+`): a value never gives back a
    # separator-and-space it took, as that rule says; greedy alone still let a line that does not
    # match try every "; " of one field against every one of the next (a client's User-Agent and
    # Referer of 8 KB each: 1 s of CPU per line, a stranger's review). A value holding its separator
    # otherwise is ambiguous: counted as a format mismatch. Where the format's own separator is
    # followed by a space (`$a; $b`) a value holding "; " is ambiguous with the separator itself:
    # there the value may give it back (greedy, not possessive: the split found last), as before.
    sep = re.escape(c)
    return f"(?:[^{sep}]|{sep}(?= ))*" + ("" if next_literal[1:2] == " " else "+")


# $remote_user (Apache's %u) as logged: nginx takes it from any client's Authorization header and
# writes it unescaped, spaces included ("John Smith", RFC 7617 allows them), so a field up to the
# next space lost that request (and a client could hide its requests so). Before " [$time_local]"
# it runs to the first " [dd/Mon/yyyy:", possessive: linear, never backtracking.
_USER_BEFORE_TIME = r"[^ \n]*+(?= \[)|[^ \n]*+(?: (?!\[\d{2}/[A-Za-z]{3}/\d{4}:)[^ \n]*+)*+"


def compile_log_format(log_format: str, *, trailing: bool = False,
                       escapes: bool | None = None) -> tuple[re.Pattern[str], list[str]]:
    """Compile an nginx ``log_format`` string into an anchored regex; return it and its variables.

    Each variable's first occurrence is a named group (later ones are matched but not
    captured: regex group names must be unique). ``trailing=True`` accepts and ignores extra
    space-separated text after the format. ``escapes=True``: quoted fields may hold ``\"``
    (Apache's mod_log_config escapes a quote so, and a backslash as ``\\``); None: for a JSON
    format only.
    """
    if not isinstance(log_format, str) or not log_format.strip():
        raise LogFormatError("log_format is empty")
    pieces = _VAR.split(log_format)
    # split() with two groups yields: literal, name-or-None, name-or-None, literal, ...
    literals = pieces[0::3]
    names = [a or b for a, b in zip(pieces[1::3], pieces[2::3], strict=True)]
    if not names:
        raise LogFormatError("log_format has no $variable")
    if escapes is None:  # a JSON format (escape=json writes \") unless said otherwise
        escapes = log_format.lstrip().startswith("{")
    quoted = _QUOTED_ESCAPES if escapes else _QUOTED
    out = [re.escape(literals[0])]
    seen: list[str] = []
    for i, name in enumerate(names):
        following = literals[i + 1]
        if following == "" and i + 1 < len(names):
            raise LogFormatError(
                f"${name} is directly followed by ${names[i + 1]}: with no separator between them "
                "the line cannot be split reliably; when the exporter reads neither (it reads $status, the "
                "times, the sizes and $request or $request_uri), describe the pair as one made-up variable "
                f"(${name}_{names[i + 1]})"
            )
        # with trailing text allowed, a format-final variable ends at the next space
        body = _shape(name, following) or _field_pattern(following or (" " if trailing else ""), quoted)
        if name == "remote_user" and following == " [" and names[i + 1:i + 2] == ["time_local"]:
            body = _USER_BEFORE_TIME
        if body == _NO_SPACE:
            body = _no_space(following)
        if name in seen:
            out.append(f"(?:{body})")
        else:
            seen.append(name)
            out.append(f"(?P<{name}>{body})")
        out.append(re.escape(following))
    if trailing:
        out.append(r"(?: .*)?")
    try:
        return recompat.compile("".join(out) + r"\Z"), seen
    except re.error as e:  # pragma: no cover - escape() and our bodies make this unreachable
        raise LogFormatError(f"log_format compiles to an invalid regex: {e}") from e


# Labelled, the time may be anything (junk is a counted bad_time); plain, it must look like
# nginx's $request_time (seconds with a fraction: "0.019"), so a log with other numbers after the
# user agent (ingress-nginx's `$request_length $request_time [...]`) is not read as times.
# Labelled fields between the two (NGINX's "Using NGINX Logging for APM" format, much copied:
# `rt=$request_time uct="$upstream_connect_time" uht="$upstream_header_time" urt="..."`) are
# skipped; they made the upstream time optional-and-absent, an empty histogram (a stranger's review).
# An unquoted value may be a list, as nginx writes them after a retry (`uct=0.000, 0.001` or
# `0.000 : 0.001`): stopped at its first space, the rest was taken for the upstream time.
_OTHER_LABELLED = r'(?: (?!urt=)\w+=(?:"[^"]*"|[^\s,]*(?:(?:, | : )[^\s,]*)*+))*+'
_TIMED_SUFFIX = (r' (?:rt=|(?=\d+\.\d+(?: |\Z)))(?P<request_time>\S+)' + _OTHER_LABELLED +
                 rf'(?: (?:urt=)?(?P<uq>"?)(?P<upstream_response_time>{_TIMES})(?P=uq))?')


def _timed_pattern() -> re.Pattern[str]:
    """``combined`` + request/upstream time, labelled (``rt=``/``urt="..."``) or plain fields."""
    combined, _ = compile_log_format(COMBINED)
    return recompat.compile(recompat.source(combined).removesuffix(r"\Z") + _TIMED_SUFFIX + r"(?: .*)?\Z")


def apache_combined_pattern() -> re.Pattern[str]:
    """Apache ``combined`` whose referer/user-agent part may be absent (``common`` lines)."""
    common, _ = compile_log_format(COMMON, escapes=True)  # (Apache writes a quote in a field as \")
    return recompat.compile(recompat.source(common).removesuffix(r"\Z") + rf'(?: "(?P<http_referer>{_QUOTED_ESCAPES})" '
                      rf'"(?P<http_user_agent>{_QUOTED_ESCAPES})")?(?: .*)?\Z')


def apache_vhost_pattern() -> re.Pattern[str]:
    """``%v:%p `` (a server name and port: no spaces) + Apache ``combined`` (Debian's
    ``vhost_combined``)."""
    return recompat.compile(r"[^\s:]*:\S* " + recompat.source(apache_combined_pattern()))


_USED = frozenset(_STATUS + _BYTES + _REQUEST_TIME + _UPSTREAM_TIME + _REQUEST + _URI)


def _lean(regex: re.Pattern[str], used: frozenset[str] = _USED) -> re.Pattern[str]:
    """The same regex with only the groups the parser reads capturing (and those a ``(?P=name)``
    refers to): about 10% less work per line for Python's re."""
    pattern = recompat.source(regex)
    keep = used | set(re.findall(r"\(\?P=(\w+)\)", pattern))
    lean = re.sub(r"(?<!\\)\(\?P<(\w+)>", lambda m: m.group(0) if m.group(1) in keep else "(?:", pattern)
    return recompat.compile(lean, regex.flags)


class BatchPattern(NamedTuple):
    """A regex that parses a whole batch of lines (joined by newlines) in one ``findall`` call:
    one tuple per line, so the per-line work stays in C. Each line matches one branch:
    the *strict* form of the format (status ``[1-5][0-9][0-9]``, bytes ``[0-9]+`` or ``-``,
    request time ``[0-9]+(.[0-9]+)?``: a subset of what :meth:`LineParser.parse` accepts, with the
    same values), or a catch-all whose group ``bad`` holds the line, for the exact parser to
    judge. Tuple positions of the fields (None: not in the format)."""

    regex: re.Pattern[str]
    status: int
    bytes: int | None
    request_time: int | None
    upstream_time: int | None
    request: int | None
    uri: int | None
    bad: int
    time_divisor: float = 1.0  # request-time column / this = seconds (TIME_DIVISORS)


_STRICT = {
    "status": "(?P<status>[1-5][0-9][0-9])",
    "body_bytes_sent": "(?:(?P<body_bytes_sent>[0-9]+)|-)",
    "bytes_sent": "(?:(?P<bytes_sent>[0-9]+)|-)",
    "request_time": rf"(?P<request_time>{_TIME_NUMBER})",
    # the same bound (below MAX_SECONDS) in their units: Apache writes %D and %{ms}T as integers
    "request_time_ms": r"(?P<request_time_ms>\d{1,8}(?:\.\d+)?)",
    "request_time_us": r"(?P<request_time_us>\d{1,11})",
    # the same strings as _TIMES (numbers first: the common case matches on the first try), but
    # "-" (no upstream) and "" (escape=json) leave the group empty
    "upstream_response_time": (rf"(?:(?P<upstream_response_time>{_TIME_NUMBER}(?:{_TIME_SEP}{_TIME_ITEM})*"
                               rf"|-(?:{_TIME_SEP}{_TIME_ITEM})+)|-|)"),
}
# nginx_timed's canonical form only (`` rt=0.012 urt="0.010"``): the optional labels and quote
# of the reference cost a backreference and backtracking on every line; the plain-fields variant
# falls to the catch-all and is counted by the line parser.
# (its groups are made strict with the others below)
_TIMED_STRICT_SUFFIX = r' rt=(?P<request_time>\S+)(?: (?!urt=)\w+="[^"]*")*+ urt="(?P<upstream_response_time>[^"]*)"'



def _replace_group(pattern: str, name: str, new: str) -> str:
    """``pattern`` with the whole group ``(?P<name>...)`` replaced by ``new`` (parentheses
    balanced, escapes and character classes skipped); unchanged when there is no such group."""
    start = pattern.find(f"(?P<{name}>")
    if start < 0:
        return pattern
    depth, i, in_class = 0, start, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a literal ] first in a class
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return pattern[:start] + new + pattern[i + 1 :]
        i += 1
    return pattern  # pragma: no cover - the pattern compiled, so its parentheses balance


def _batch_pattern(regex: re.Pattern[str]) -> BatchPattern | None:
    """The :class:`BatchPattern` of a (lean) line regex, or None when it cannot be derived."""
    pattern = recompat.source(regex)
    if not pattern.endswith(r"\Z") or "(?P<bad>" in pattern:
        return None
    pattern = pattern[:-2].replace(_TIMED_SUFFIX, _TIMED_STRICT_SUFFIX)
    for name, strict in _STRICT.items():
        pattern = _replace_group(pattern, name, strict)
    # ``[^"]*`` may run past the end of a line (excluding \n too would make it 2x slower: a
    # one-character negated class has its own fast path in Python's re); a match spanning lines
    # leaves fewer tuples than lines, which the caller checks.
    try:
        compiled = recompat.compile(rf"^(?:{pattern}\n|(?P<bad>[^\n]*)\n)", re.MULTILINE)
    except re.error:  # pragma: no cover - derived from a pattern that compiled
        return None
    gi = compiled.groupindex

    def pos(candidates: tuple[str, ...]) -> int | None:
        g = _first(gi, candidates)
        return None if g is None else g - 1

    status = pos(_STATUS)
    if status is None or compiled.groups < 2:
        return None
    rt_name = next((n for n in _REQUEST_TIME if n in gi), "request_time")
    return BatchPattern(compiled, status, pos(_BYTES), pos(_REQUEST_TIME), pos(_UPSTREAM_TIME), pos(_REQUEST),
                        pos(_URI), gi["bad"] - 1, TIME_DIVISORS[rt_name])


def _first(groupindex: dict[str, int] | Any, candidates: tuple[str, ...]) -> int | None:
    for name in candidates:
        if name in groupindex:
            return groupindex[name]
    return None


class LineParser:
    """A compiled format. :meth:`parse` returns :class:`Parsed` or a rejection reason (``REASONS``).

    Group positions are resolved once here so the per-line path is one ``match`` plus a few
    indexed ``group`` calls.
    """

    __slots__ = ("name", "regex", "batch", "batch_without_path", "_status", "_bytes", "_rt", "_urt", "_request",
                 "_uri", "time_divisor", "raw_bytes")

    @property
    def groups(self) -> tuple[int, int | None, int | None, int | None, int | None, int | None]:
        """Group numbers of status, body bytes, request time, upstream time, $request, $uri
        (None: not in the format), for callers that run the regex themselves in a hot loop."""
        return self._status, self._bytes, self._rt, self._urt, self._request, self._uri

    def __init__(self, name: str, regex: re.Pattern[str], raw_bytes: bool = False) -> None:
        self.name = name
        # escape=json (a JSON log_format) leaves bytes above 0x7F as they came: a request line of
        # raw bytes (a TLS handshake on the plain port, a binary URI) is such a log's, not damage
        self.raw_bytes = raw_bytes
        self.regex = _lean(regex)
        self.batch = _batch_pattern(self.regex)
        # without routes the path is not read: one group fewer to capture per line
        self.batch_without_path = _batch_pattern(_lean(self.regex, _USED - set(_REQUEST + _URI)))
        gi = self.regex.groupindex
        status = _first(gi, _STATUS)
        if status is None:
            raise LogFormatError(f"format {name!r} has no $status: nothing to count requests by")
        self._status: int = status
        self._bytes = _first(gi, _BYTES)
        self._rt = _first(gi, _REQUEST_TIME)
        # seconds = value / time_divisor ($request_time_ms, $request_time_us: Apache %{ms}T, %D)
        self.time_divisor = TIME_DIVISORS[next((n for n in _REQUEST_TIME if n in gi), "request_time")]
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
        # line is damaged, whatever the regex would make of it; escape=json does not escape them
        # (raw_bytes), so there only a NUL is.
        if "\x00" in line or ("\ufffd" in line and not self.raw_bytes):
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
            if b.isascii() and b.isdigit():
                body_bytes = int(b)
            elif b != "-":
                return "bad_bytes"
        rt = urt = None
        if self._rt is not None:
            rt = _seconds(m.group(self._rt), self.time_divisor)
            if rt is None:
                return "bad_time"
        if self._urt is not None:
            u = m.group(self._urt)
            if u and u != "-":
                urt = sum_times(u)
        path = None
        if want_path:
            if self._uri is not None:
                path = m.group(self._uri)
            elif self._request is not None:
                path = request_path(m.group(self._request))
        return Parsed(int(status_s), body_bytes, rt, urt, path)


def _seconds(text: str, divisor: float = 1.0) -> float | None:
    """A non-negative finite number of seconds below :data:`MAX_SECONDS`, or None (``text`` is
    in seconds / ``divisor``: 1e3 for milliseconds, 1e6 for microseconds)."""
    try:
        v = float(text) if divisor == 1.0 else float(text) / divisor
    except ValueError:
        return None
    return v if 0 <= v < MAX_SECONDS else None


def sum_times(text: str) -> float | None:
    """An upstream time, or the total of a list (``"0.010, 0.020 : 0.005"``: every try and
    redirect); None when nothing in it is a time (``-``, ``""``, ``"-, -"``)."""
    total, any_value = 0.0, False
    for part in _TIME_SPLIT.split(text):
        v = _seconds(part) if part and part != "-" else None
        if v is not None:
            total += v
            any_value = True
    return total if any_value else None


_TIME_SPLIT = re.compile(_TIME_SEP)


def request_path(request: str) -> str | None:
    """The path of a request line ``"GET /a/b?x=1 HTTP/1.1"`` -> ``/a/b?x=1``; None if it has none."""
    first = request.find(" ")
    if first < 0:
        return None
    end = request.find(" ", first + 1)
    target = request[first + 1 :] if end < 0 else request[first + 1 : end]
    if target[:8].lower().startswith(("http://", "https://")):
        # The absolute form (`GET http://shop.example/checkout HTTP/1.1`: proxies, some bots):
        # routed by its path, as nginx's $uri is.
        slash = target.find("/", target.find("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    return target or None


FORMATS = ("nginx_combined", "nginx_timed", "apache_combined", "apache_common", "apache_vhost_combined", "custom")


#: Variables only an Apache log has (``%D``, ``%{ms}T`` written with nginx names): a ``custom``
#: format that uses one describes a log Apache writes, whose quoted fields hold ``\"``.
APACHE_ONLY = ("request_time_us", "request_time_ms")


def backslash_escapes_of(log_format: str, backslash_escapes: bool | None = None) -> bool:
    """Whether a ``custom`` format's quoted fields may hold ``\"`` (Apache's mod_log_config and
    nginx's ``escape=json`` write a quote so; nginx's default escaping writes ``\x22``).
    ``backslash_escapes`` as configured, else: a JSON format, or one using an Apache-only
    variable. The escape-aware form reads nginx's own escaping identically, at about 0.4 us
    more per line, which is why it is not every format's."""
    if backslash_escapes is not None:
        return backslash_escapes
    return log_format.lstrip().startswith("{") or any(
        m.group(1) in APACHE_ONLY or m.group(2) in APACHE_ONLY for m in _VAR.finditer(log_format))


def build_parser(fmt: str, log_format: str | None = None, backslash_escapes: bool | None = None) -> LineParser:
    """The parser for a built-in format name, or for ``custom`` with its ``log_format``
    (``backslash_escapes``: see :func:`backslash_escapes_of`)."""
    if fmt == "nginx_combined":
        return LineParser(fmt, compile_log_format(COMBINED, trailing=True)[0])
    if fmt == "nginx_timed":
        return LineParser(fmt, _timed_pattern())
    if fmt == "apache_combined":
        return LineParser(fmt, apache_combined_pattern())
    if fmt == "apache_common":
        return LineParser(fmt, compile_log_format(COMMON, trailing=True, escapes=True)[0])
    if fmt == "apache_vhost_combined":
        return LineParser(fmt, apache_vhost_pattern())
    if fmt == "custom":
        if not log_format:
            raise LogFormatError("format 'custom' needs log_format")
        escapes = backslash_escapes_of(log_format, backslash_escapes)
        return LineParser(fmt, compile_log_format(log_format, escapes=escapes)[0],
                          raw_bytes=log_format.lstrip().startswith("{"))
    raise LogFormatError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
