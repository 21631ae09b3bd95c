"""Compile an Envoy access-log format string into a parser (and a writer) for its lines.

Envoy writes access logs from a *format string*: literal text plus command operators
``%COMMAND%``, ``%COMMAND(ARG)%`` and ``%COMMAND(ARG):N%`` (the value truncated to N
characters), with ``%%`` for a literal percent sign (Envoy >= 1.22). Istio's default
``accessLogFormat`` is one such string. Hard-coding one regular expression per format would
break the day a mesh owner edits ``accessLogFormat``, so this module compiles *any* format
string into:

* a regular expression with one group per operator, where each operator's sub-pattern
  depends on its type (integers, response flags, the default timestamp) or, for free text,
  on the literal that follows it (``[^"]*`` inside quotes, ``[^ ]*`` before a space);
* a typed converter per operator (``-`` -> ``None``, integers, flag tuples, datetimes);
* a writer that renders a record back to a line the way Envoy would (:meth:`CompiledFormat.format`).

A line that does not match is classified, never fatal: ``truncated`` when it is a proper
prefix of some valid line (a copy cut short, a line cut by a size limit), ``format_mismatch``
otherwise.

Hostile lines cost linear time. A log line is input from anyone who can send a request, so
both regular expressions (the line's, and the ``truncated`` check's) are built never to
backtrack over an unbounded repeat: every unbounded repeat is possessive (``*+``, ``++``: it
never gives characters back) and the only repeats that do are bounded by 64. Matching a line,
or failing to, then costs time linear in its length (``bench/mesh_format_cost.py``: a 64 KB
line that does not match costs 1-3 ms).
Python's ``re`` backtracks, and the previous patterns (lazy ``.+?`` for an operator written
right before another one, greedy repeats elsewhere) tried every split of a line that did not
match: a 16 KB line took seconds with ``%UPSTREAM_HOST%%DURATION%``, and a 1 KB line more than
a minute with ``%PROTOCOL%.%PROTOCOL%.%PROTOCOL%.%PROTOCOL%!``. Where a value ends is decided by
classes instead, with these rules (the same splits as before, except where stated):

* Free text before a literal runs to the literal's first character, and a typed value (integer,
  flags, token) takes every character of its class: neither ever needs to give one back.
* Operators written back to back (``%RESPONSE_CODE%%RESPONSE_FLAGS%``, a *chain*) are split in
  one pass. Free text followed by a typed value that ends the chain is as short as it can be:
  the typed value is the longest one that ends the chain (``10.0.0.1:8012`` before a
  ``%DURATION%`` is ``10.0.0.1:`` and ``8012``, as before: back-to-back values are ambiguous
  by nature). Free text followed by free text takes one character; free text followed by a
  typed value and more stops where that value can start. A typed value takes every character
  of its class. Changed: no value in a chain holds the first character of the literal after the
  chain (as no free text before a literal could; so a flag list in a chain before ``,`` is one
  flag); a free text's ``:N`` bound is checked after the split; of two typed values in a row
  whose classes run into each other (``%DURATION%%BYTES_SENT%``) the first takes all it can.
* A value followed by a literal that starts with one of its own characters (a flag list before
  ``,`` in a comma-separated format, ``%PROTOCOL%/``) may end before any of them, the longest
  first, as before, but only before one of its last 63 (a format with several such values shares
  64 ways to match a line among them: 7 each for two, 3 for three).
* A ``START_TIME`` value is bounded: at most 64 fractional digits for the default format; 20
  digits for ``%s``, 9 for ``%f`` (Envoy's nanoseconds), 32 letters for a name; absl's
  directives (``%c``, ``%x``, ``%X``, ``%k``, ``%u``, ``%Ez``, ``%E*S``, ...) have their exact
  patterns. Such a timestamp is matched once, the first way its directives fit (trying each
  way against the rest of the line multiplied the work). A directive the parser does not know
  is 1-64 characters, shortest first, and may grow: a timestamp holding one is not atomic (at
  most 64 ways per unknown directive).

The exporter also rejects a line longer than its ``max_line_bytes`` (64 KiB unless configured;
``too_long``) before any parsing: a generous backstop (Envoy accepts request headers up to 60 KiB
by default, and a format may log them), not what keeps a line cheap.

Field names in a parsed record follow Istio's JSON access-log keys (``response_code``,
``upstream_cluster``, ``authority``, ...), so a text line and a JSON line give the same record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

from promreflex import recompat

# Istio's default text format (pilot/pkg/model/telemetry_logging.go, EnvoyTextLogFormat,
# Istio 1.9 onwards; also on istio.io "Default access log format").
ISTIO_TEXT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% '
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
)

# The Istio 1.5-1.8 (Mixer era) default: a quoted istio_policy_status where 1.9 put the code
# details, and %UPSTREAM_CLUSTER%. Older meshes (and many troubleshooting docs) still show it.
ISTIO_LEGACY_TEXT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    '%RESPONSE_CODE% %RESPONSE_FLAGS% "%DYNAMIC_METADATA(istio.mixer:status)%" '
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER% '
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
)

# Envoy's own default format string (envoyproxy.io, "Access logging", "Default format string"),
# used when an access log is configured without a format: what a plain Envoy writes.
ENVOY_DEFAULT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n'
)

# Envoy's own operator grammar (substitution_formatter.cc): NAME, optional (ARG) that may hold
# anything but ')', optional :N truncation, closing %.
_OPERATOR = re.compile(r"%([A-Z0-9_]+)(?:\(([^)]*)\))?(?::(\d+))?%")

# Operators whose value is an integer (or "-"). Durations are milliseconds, sizes bytes.
INT_COMMANDS = frozenset(
    {
        "RESPONSE_CODE",
        "BYTES_RECEIVED",
        "BYTES_SENT",
        "DURATION",
        "REQUEST_DURATION",
        "REQUEST_TX_DURATION",
        "RESPONSE_DURATION",
        "RESPONSE_TX_DURATION",
        "UPSTREAM_REQUEST_ATTEMPT_COUNT",
        "UPSTREAM_WIRE_BYTES_SENT",
        "UPSTREAM_WIRE_BYTES_RECEIVED",
        "UPSTREAM_HEADER_BYTES_SENT",
        "UPSTREAM_HEADER_BYTES_RECEIVED",
        "DOWNSTREAM_WIRE_BYTES_SENT",
        "DOWNSTREAM_WIRE_BYTES_RECEIVED",
        "DOWNSTREAM_HEADER_BYTES_SENT",
        "DOWNSTREAM_HEADER_BYTES_RECEIVED",
        "REQUEST_HEADERS_BYTES",
        "RESPONSE_HEADERS_BYTES",
        "RESPONSE_TRAILERS_BYTES",
        "GRPC_STATUS_NUMBER",
        "CONNECTION_ID",
        "UPSTREAM_CONNECTION_ID",
        "DOWNSTREAM_REMOTE_PORT",
        "DOWNSTREAM_LOCAL_PORT",
        "UPSTREAM_LOCAL_PORT",
        "UPSTREAM_REMOTE_PORT",
    }
)
FLAG_COMMANDS = frozenset({"RESPONSE_FLAGS", "RESPONSE_FLAGS_LONG"})
TIME_COMMANDS = frozenset({"START_TIME", "EMIT_TIME"})
DURATION_COMMANDS = frozenset({"DURATION", "REQUEST_DURATION", "REQUEST_TX_DURATION", "RESPONSE_DURATION",
                               "RESPONSE_TX_DURATION"})
# A year: beyond it a logged duration is junk. A proxied TCP connection's or a WebSocket's
# DURATION is its lifetime, and pooled connections live for days; they are counted, not timed
# (the collector times no request over MAX_TIMED_MS either: that is a stream, not a slow answer).
MAX_DURATION_MS = 366 * 86_400_000
MAX_TIMED_MS = 86_400_000
MAX_INT = 2**53
HEADER_COMMANDS = frozenset({"REQ", "RESP", "TRAILER"})
# Envoy's long names for the header commands (its current default format and Cilium's default
# JSON are written with them): read as the short ones, so the record keys are the same.
COMMAND_ALIASES = {"REQUEST_HEADER": "REQ", "RESPONSE_HEADER": "RESP", "RESPONSE_TRAILER": "TRAILER"}

# Operators whose values are protocol tokens (never spaces or quotes): matching them tightly
# keeps a line of another format from passing as a "truncated" line of this one.
TOKEN_OPERATORS = frozenset({("PROTOCOL", None), ("REQ", ":METHOD"), ("UPSTREAM_PROTOCOL", None)})

# Headers whose value is an integer although any header could hold anything: parsed leniently
# (a non-number becomes None instead of rejecting the line).
INT_HEADERS = frozenset({"X-ENVOY-UPSTREAM-SERVICE-TIME"})

# Record keys for operators, spelled like Istio's JSON access-log keys.
_NAMED: dict[tuple[str, str | None], str] = {
    ("REQ", ":METHOD"): "method",
    ("REQ", "X-ENVOY-ORIGINAL-PATH?:PATH"): "path",
    ("REQ", ":PATH"): "path",
    ("REQ", ":AUTHORITY"): "authority",
    ("REQ", "HOST"): "authority",  # Envoy stores HTTP/1's Host as :authority: the same value
    ("GRPC_STATUS", "CAMEL_STRING"): "grpc_status",
    ("GRPC_STATUS", "SNAKE_STRING"): "grpc_status",
    ("GRPC_STATUS", "NUMBER"): "grpc_status_number",
    ("REQ", "X-ENVOY-ORIGINAL-HOST?:AUTHORITY"): "authority",
    ("REQ", "X-FORWARDED-FOR"): "x_forwarded_for",
    ("REQ", "USER-AGENT"): "user_agent",
    ("REQ", "X-REQUEST-ID"): "request_id",
    ("RESP", "X-ENVOY-UPSTREAM-SERVICE-TIME"): "upstream_service_time",
    ("REQ", "X-ENVOY-UPSTREAM-SERVICE-TIME"): "upstream_service_time",
    ("UPSTREAM_CLUSTER_RAW", None): "upstream_cluster",
    ("UPSTREAM_CLUSTER", None): "upstream_cluster",
    ("DYNAMIC_METADATA", "istio.mixer:status"): "istio_policy_status",
}

_ISO_MS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z")


class FormatStringError(ValueError):
    """A format string Envoy itself would refuse (stray ``%``, unclosed operator, newline)."""


class ParseError(ValueError):
    """A line that is not a record of the format; ``reason`` is one of a small fixed set."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Operator:
    """One ``%COMMAND(ARG):N%`` with its record key, value type and regular expressions."""

    command: str
    arg: str | None
    max_length: int | None
    key: str
    kind: str  # "int", "int_header", "flags", "time", "strftime", "token", "str"

    @property
    def text(self) -> str:
        """The operator as written in a format string."""
        arg = f"({self.arg})" if self.arg is not None else ""
        trunc = f":{self.max_length}" if self.max_length is not None else ""
        return f"%{self.command}{arg}{trunc}%"

    def pattern(self, stop: str) -> str:
        """Regex for a full value followed by a literal that starts with ``stop`` (``""`` at the
        end of the line). Operators written back to back are compiled together, see
        :func:`chain_patterns`. No pattern backtracks over an unbounded repeat."""
        return value_pattern(self, stop)

    def partial_pattern(self, stop: str) -> str:
        """Regex for any prefix of a value (what a truncated line can end with)."""
        return partial_pattern(self, stop)

    def _bounded(self, value: int) -> int:
        """An integer field's value, or ValueError when no request could have it: negative (a
        JSON number; text digits cannot be), a duration over :data:`MAX_DURATION_MS` (a
        histogram's sum would jump by years, and go down with a negative one: a counter reset
        to ``rate()``), anything over 2**53 (no longer exact as a float)."""
        if value < 0:
            raise ValueError(f"{self.key}: {value} is negative")
        if value > MAX_INT or (self.command in DURATION_COMMANDS and value > MAX_DURATION_MS):
            raise ValueError(f"{self.key}: {value} is out of range")
        return value

    def convert(self, raw: Any) -> Any:
        """Typed value from a text field or a JSON value; ``-``/``null``/empty -> None.

        Raises ValueError on a value that cannot be of this operator's type.
        """
        if raw is None:
            return None
        if self.kind in ("int", "int_header") and isinstance(raw, int) and not isinstance(raw, bool):
            return self._bounded(raw)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise ValueError(f"{self.key}: expected a string or number, got {type(raw).__name__}")
        if raw in ("-", ""):
            return None if self.kind != "flags" else ()
        if self.kind == "int":
            if not raw.isdigit():
                raise ValueError(f"{self.key}: {raw[:20]!r} is not an integer")
            return self._bounded(int(raw))
        if self.kind == "int_header":
            return int(raw) if raw.isdigit() else None
        if self.kind == "flags":
            parts = tuple(raw.split(","))
            if not all(p.isalpha() for p in parts):
                raise ValueError(f"{self.key}: {raw[:20]!r} is not a list of response flags")
            return parts
        if self.kind == "time":
            if not _ISO_MS.fullmatch(raw):
                raise ValueError(f"{self.key}: {raw[:40]!r} is not an Envoy default timestamp")
            return datetime.fromisoformat(raw[:-1] + "+00:00")
        return raw

    def render(self, value: Any) -> str:
        """The text Envoy writes for ``value`` (``-`` when missing), truncated to ``:N``."""
        if value is None or value == ():
            text = "-"
        elif self.kind == "flags" and isinstance(value, (tuple, list)):
            text = ",".join(value)
        elif self.kind == "time" and isinstance(value, datetime):
            text = format_start_time(value)
        else:
            text = str(value)
        if self.max_length is not None and text != "-":
            text = text[: self.max_length]
        return text


def format_start_time(value: datetime) -> str:
    """Envoy's default ``%START_TIME%``: UTC, milliseconds, ``Z`` (2020-11-25T21:26:18.409Z)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


# Envoy's START_TIME(...) takes strftime directives plus %[1-9]f / %E[1-9]S for sub-seconds.
# Every piece is bounded (a timestamp's field is never 20 digits or 32 letters long), so a
# timestamp has a bounded length; it is matched once (an atomic group, see value_pattern). The
# directives are absl::FormatTime's (what Envoy formats START_TIME with): strftime's, in the C
# locale, plus %E#S/%E*S (seconds with # or any fractional digits), %E#f/%E*f, %Ez/%E*z and %E4Y.
_STRFTIME = {
    "Y": r"\d{4}", "y": r"\d{2}", "C": r"\d{2}", "G": r"\d{4}", "g": r"\d{2}",
    "m": r"\d{2}", "d": r"\d{2}", "e": r" ?\d{1,2}", "j": r"\d{3}",
    "H": r"\d{2}", "I": r"\d{2}", "k": r" ?\d{1,2}", "l": r" ?\d{1,2}", "M": r"\d{2}", "S": r"\d{2}",
    "s": r"\d{1,20}", "f": r"\d{9}", "u": r"\d", "w": r"\d", "U": r"\d{2}", "V": r"\d{2}", "W": r"\d{2}",
    "z": r"[+-]\d{4}", "Z": r"[A-Za-z0-9+-]{1,32}", "a": r"[A-Za-z]{1,32}", "A": r"[A-Za-z]{1,32}",
    "b": r"[A-Za-z]{1,32}", "h": r"[A-Za-z]{1,32}", "B": r"[A-Za-z]{1,32}", "p": r"[AaPp][Mm]",
    "T": r"\d{2}:\d{2}:\d{2}", "R": r"\d{2}:\d{2}", "r": r"\d{2}:\d{2}:\d{2} [AP]M",
    "F": r"\d{4}-\d{2}-\d{2}", "D": r"\d{2}/\d{2}/\d{2}", "x": r"\d{2}/\d{2}/\d{2}",
    "X": r"\d{2}:\d{2}:\d{2}", "c": r"[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}",
    "n": r"\n", "t": r"\t", "%": "%",
}
_DIRECTIVE = re.compile(r"%(E?)(\d*|\*)([A-Za-z%])")


def strftime_pattern(fmt: str) -> tuple[str, bool]:
    """Regex for the timestamps a ``START_TIME(fmt)`` writes, and whether every directive is
    known (then one way to fit: matched once, atomically). An unknown directive is 1-64 of any
    characters, tried shortest first: such a timestamp is not atomic (value_pattern)."""
    out, pos, exact = [], 0, True
    for m in _DIRECTIVE.finditer(fmt):
        out.append(re.escape(fmt[pos : m.start()]))
        ext, digits, d = m.groups()
        if ext and d == "S":
            out.append(r"\d{2}(?:\.\d{%d})?" % int(digits) if digits not in ("", "*") else r"\d{2}(?:\.\d{1,20})?")
        elif d == "f" and digits not in ("", "*"):  # (Envoy's %f alone: 9 digits, nanoseconds)
            out.append(r"\d{%d}" % int(digits))
        elif d == "f" and digits == "*":
            out.append(r"\d{1,20}")
        elif ext and d == "z":
            out.append(r"[+-]\d{2}:\d{2}(?::\d{2})?")
        elif ext and d == "Y" and digits == "4":
            out.append(r"\d{4}")
        elif d in _STRFTIME:
            out.append(_STRFTIME[d])
        else:
            out.append(r".{1,64}?")
            exact = False
        pos = m.end()
    out.append(re.escape(fmt[pos:]))
    return "".join(out), exact


# --- Line patterns -------------------------------------------------------------------------
#
# A line is hostile input: every pattern below decides each character once (possessive
# ``*+``/``++`` repeats, which never give characters back; atomic groups for timestamps) or
# tries a bounded number of alternatives (bounded repeats of at most 64, and at most
# GIVE_BACK_PATHS ends for the values that may end before one of their own characters). No
# unbounded repeat is ever backtracked into, so matching a line costs time linear in its length
# (times a constant of the format string), whether it matches or not. The module docstring
# states the rules this gives; tests/unit/test_mesh_format.py checks the patterns.

# The default %START_TIME% on a line (Envoy writes 3 fractional digits; 64 is the bound).
_ISO_LINE = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,64})?Z"

# A value of these kinds is a run of one character class (class body for [...], membership).
_DIGIT_BODY = r"\d"
_LETTER_BODY = "A-Za-z"
_TOKEN_BODY = r"A-Za-z0-9/._\-"
_FLAG_CHARS_BODY = r"A-Za-z,\-"  # what a cut flag list can hold
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_TOKEN_CHARS = _LETTERS | frozenset("0123456789/._-")
_BODY_CHARS = {  # the ASCII classes' characters, to write one without a character
    _LETTER_BODY: _LETTERS,
    _LETTER_BODY + ",": _LETTERS | {","},
    _FLAG_CHARS_BODY: _LETTERS | {",", "-"},
    _TOKEN_BODY: _TOKEN_CHARS,
}

# A value followed by a literal that starts with one of the value's own characters (a flag list
# before "," in a comma-separated format, ``%PROTOCOL%/``) may end before any of those characters.
# It is split before one of its last GIVE_BACK of them, the longest split first (as a greedy
# repeat would, without trying all the others). With several such values in one format the
# splits multiply, so they share one budget: GIVE_BACK_PATHS ways to match a line in all.
GIVE_BACK_PATHS = 64
GIVE_BACK = GIVE_BACK_PATHS - 1


def give_back_bound(count: int) -> int:
    """Splits each of ``count`` such values may try: (bound + 1) ** count <= GIVE_BACK_PATHS."""
    if count <= 1:
        return GIVE_BACK
    bound = 1
    while (bound + 2) ** count <= GIVE_BACK_PATHS:
        bound += 1
    return bound


TEXT_KINDS = frozenset({"str", "int_header"})


def _in_class(kind: str, ch: str) -> bool:
    """Whether ``ch`` can continue a value of a run ``kind`` (int, flags, token)."""
    if not ch:
        return False
    if kind == "int":
        return ch.isdecimal()
    if kind == "flags":
        return ch in _LETTERS
    return ch in _TOKEN_CHARS


def _class(chars: frozenset[str]) -> str:
    """A character class of exactly ``chars`` (ASCII), in ranges."""
    codes = sorted(ord(c) for c in chars)
    parts: list[str] = []
    i = 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(re.escape(chr(codes[i])) + "-" + re.escape(chr(codes[j])))
        else:
            parts.extend(re.escape(chr(c)) for c in codes[i : j + 1])
        i = j + 1
    return "[" + "".join(parts) + "]"


def _atom(body: str, without: str = "") -> str:
    """One character of class ``[body]``, except ``without`` (a character of the class)."""
    if not without:
        return f"[{body}]"
    if body == _DIGIT_BODY:
        return f"[^\\D{re.escape(without)}]"  # a digit (any \d) but that one
    return _class(_BODY_CHARS[body] - {without})


def _run_body(kind: str) -> str:
    return {"int": _DIGIT_BODY, "flags": _LETTER_BODY}.get(kind, _TOKEN_BODY)


def _give_back(first: str, unit: str, bound: int) -> str:
    """``first`` then ``unit`` repeated, ending before one of the last ``bound`` units.

    The head takes units while ``bound`` more follow (possessive: never given back), ``bound``
    at a time then one at a time; the tail takes the rest and gives them back one by one: at
    most ``bound + 1`` ends are tried, the longest first, the order a greedy ``(?:unit)*`` tries
    its last ``bound + 1`` ends in. A unit holds one separator, so each is read at most twice by
    the head's look-aheads, plus ``bound ** 2`` at the end: linear."""
    ahead = f"(?=(?:{unit}){{{bound}}})"
    return f"{first}(?:(?:{unit}){{{bound}}}{ahead})*+(?:{unit}{ahead})*+(?:{unit}){{0,{bound}}}"


def _split_run(body: str, stop: str, bound: int) -> str:
    """A run of ``[body]`` followed by a literal starting with ``stop``, itself of the class."""
    other = _atom(body, stop)
    unit = f"{re.escape(stop)}{other}*+"
    return _give_back(f"(?:{other}++|{unit})", unit, bound)  # never empty, as [body]+


# Values Envoy writes itself (cluster and route names, addresses, its own detail codes): they
# never hold a quote. Envoy does not escape a quote in a logged header (envoyproxy/envoy#4191),
# so a User-Agent of ``x" "y`` shifts every quoted field after it by one; these fields then hold
# one (``"10.244.1.5:9080"`` as the cluster) and the line is refused, not read with the request
# id as its destination.
QUOTE_FREE_COMMANDS = frozenset({
    "UPSTREAM_CLUSTER", "UPSTREAM_CLUSTER_RAW", "UPSTREAM_HOST", "UPSTREAM_LOCAL_ADDRESS",
    "UPSTREAM_REMOTE_ADDRESS", "DOWNSTREAM_LOCAL_ADDRESS", "DOWNSTREAM_REMOTE_ADDRESS",
    "DOWNSTREAM_DIRECT_REMOTE_ADDRESS", "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT",
    "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT", "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT",
    "UPSTREAM_HOST_NAME", "ROUTE_NAME", "RESPONSE_CODE_DETAILS", "CONNECTION_TERMINATION_DETAILS",
    "UPSTREAM_TRANSPORT_FAILURE_REASON",
})


def _text_class(stop: str, max_length: int | None, quote_free: bool = False) -> str:
    """Free text up to the next literal's first character (anything at the end of the line);
    ``quote_free``: a value that never holds a ``"`` (:data:`QUOTE_FREE_COMMANDS`)."""
    excluded = re.escape(stop) + ('"' if quote_free and stop != '"' else "")
    body = "." if not excluded else "[^" + excluded + "\\n]"
    count = "*+" if max_length is None else "{0,%d}+" % max(max_length, 1)
    return body + count


def gives_back(op: Operator, stop: str) -> bool:
    """Whether a value of ``op`` before a literal starting with ``stop`` may end at a ``stop``."""
    return (op.kind in ("int", "token") and _in_class(op.kind, stop)) or (op.kind == "flags" and stop == ",")


def value_pattern(op: Operator, stop: str, bound: int = GIVE_BACK) -> str:
    """Regex for a value of ``op`` followed by a literal starting with ``stop`` ("" at the end);
    ``bound``: how many of its own ``stop`` characters it may end before (see GIVE_BACK)."""
    kind = op.kind
    if kind == "int":
        return "-|" + (_split_run(_DIGIT_BODY, stop, bound) if _in_class(kind, stop) else r"\d++")
    if kind == "flags":
        if stop == ",":
            return "-|" + _give_back("[A-Za-z]++", ",[A-Za-z]++", bound)
        letter = _atom(_LETTER_BODY, stop if _in_class(kind, stop) else "")
        return f"-|{letter}++(?:,{letter}++)*+"
    if kind == "token":
        if _in_class(kind, stop):
            return f"-(?={re.escape(stop)})|" + _split_run(_TOKEN_BODY, stop, bound)
        return f"[{_TOKEN_BODY}]++"
    if kind == "time":
        return f"(?>-|{_ISO_LINE})"
    if kind == "strftime":  # matched once, the first way its directives fit: splits would multiply
        pattern, exact = strftime_pattern(op.arg or "")
        # (an unknown directive: its 1-64 characters must be free to grow, at most 64 ways each)
        return f"(?>-|{pattern})" if exact else f"(?:-|{pattern})"
    return _text_class(stop, op.max_length, op.command in QUOTE_FREE_COMMANDS)


def partial_pattern(op: Operator, stop: str, in_chain: bool = False) -> str:
    """Regex for any prefix of a value of ``op`` (what a truncated line can end with); in a
    chain, a flag list or token never holds ``stop`` (see :func:`chain_patterns`)."""
    kind = op.kind
    if kind == "int":
        return r"-|\d*+"
    if kind == "flags":
        without = stop if in_chain and stop and (stop == "," or stop in _LETTERS) else ""
        return _atom(_FLAG_CHARS_BODY, without) + "*+"
    if kind == "time":
        return r"[\dT:.Z-]*+"
    if kind == "token":
        return _atom(_TOKEN_BODY, stop if in_chain and stop != "-" and _in_class(kind, stop) else "") + "*+"
    if kind == "strftime":
        return _text_class(stop, None)
    return _text_class(stop, op.max_length, op.command in QUOTE_FREE_COMMANDS)


def _chain_typed(op: Operator, stop: str) -> str:
    """A typed value inside a chain: all the characters of its class it finds (never ``stop``)."""
    kind = op.kind
    if kind in ("int", "flags", "token"):
        body = _run_body(kind)
        ch = _atom(body, stop if _in_class(kind, stop) else "")
        if kind == "flags" and stop != ",":
            return f"-|{ch}++(?:,{ch}++)*+"
        if kind == "token" and stop != "-":
            return f"{ch}++"
        return f"-|{ch}++"
    return value_pattern(op, stop)


def _starts(op: Operator) -> str:
    """Lookahead body: a value of the typed ``op`` starts here."""
    if op.kind in ("int", "flags", "token"):
        return f"[{_run_body(op.kind)}\\-]"
    return f"(?:{value_pattern(op, '')})"


def _up_to_suffix(op: Operator, stop: str, region: str) -> str:
    """What free text takes after its first character when the typed ``op`` follows it and ends
    the chain: everything but the longest value of ``op`` that ends the region. That is where a
    lazy ``.+?`` split it (the text as short as it can be), decided in one pass."""
    end = re.escape(stop) if stop else r"\Z"
    if op.kind not in ("int", "flags", "token"):  # a timestamp: bounded, so look ahead for it
        at_end = f"(?={end})" if stop else end
        return f"(?:(?!(?:{value_pattern(op, '')}){at_end}){region})*+"
    kind = op.kind
    body = _run_body(kind)
    without = stop if _in_class(kind, stop) else ""
    ch = _atom(body, without)
    dash = kind != "token" or stop == "-"  # "-" is a value of its own, not a run character
    comma = kind == "flags" and stop != ","  # flags: a comma-separated list
    excluded = body + ("\\n" if not stop else re.escape(stop) + "\\n") + ("\\-" if dash else "") + ("," if comma else "")
    other = f"[^{excluded}]"  # a character no value of op can hold
    run = _atom(body + ",", without) if comma else ch
    units = []
    if comma:
        units.append(f"(?:{ch}++(?:,{ch}++)*+)?,,++")  # a list cut by ",,": no flag list runs over it
        units.append(",++")  # commas no flag list starts with
    units.append(f"{run}*+{other}")  # a run that something else ends
    if dash and stop != "-":
        units.append(f"{run}*+-(?!{end})")  # a "-" that is not the value at the end
    if dash:
        units.append(f"{run}++(?=-{end})")  # the run before a "-" value at the end
    return "(?:" + "|".join(units) + ")*+"


def chain_patterns(ops: list[Operator], stop: str) -> list[str]:
    """Patterns for operators written back to back (``%UPSTREAM_HOST%%DURATION%``), followed by
    a literal starting with ``stop`` ("" at the end of the line). The split is decided by the
    values' classes in one pass; see the module docstring for the rules."""
    region = "." if not stop else f"[^{re.escape(stop)}\\n]"
    out = []
    for j, op in enumerate(ops):
        nxt = ops[j + 1] if j + 1 < len(ops) else None
        if op.kind not in TEXT_KINDS:
            out.append(_chain_typed(op, stop))
        elif nxt is None:
            out.append(region + "*+")
        elif nxt.kind in TEXT_KINDS:
            out.append(region)
        elif j + 2 == len(ops):
            out.append(region + _up_to_suffix(nxt, stop, region))
        else:
            out.append(f"{region}(?:(?!{_starts(nxt)}){region})*+")
    return out


def operator_key(command: str, arg: str | None) -> str:
    """Record key for an operator: Istio's JSON key where one exists, else derived from it."""
    norm_arg = arg.upper() if arg is not None and command in HEADER_COMMANDS else arg
    named = _NAMED.get((command, norm_arg))
    if named:
        return named
    if arg is None or command in TIME_COMMANDS:
        return command.lower()
    if command in HEADER_COMMANDS:
        first = arg.split("?")[0].lstrip(":")
        return f"{command.lower()}_{re.sub(r'[^a-z0-9]+', '_', first.lower()).strip('_')}"
    return f"{command.lower()}_{re.sub(r'[^a-z0-9]+', '_', arg.lower()).strip('_')}"


def make_operator(command: str, arg: str | None = None, max_length: int | None = None) -> Operator:
    """Build the :class:`Operator` for one command (used by the text and the JSON formats)."""
    command = COMMAND_ALIASES.get(command, command)
    if command in INT_COMMANDS:
        kind = "int"
    elif command in FLAG_COMMANDS:
        kind = "flags"
    elif command in TIME_COMMANDS:
        kind = "time" if arg is None else "strftime"
    elif command in HEADER_COMMANDS and arg is not None and arg.split("?")[0].upper() in INT_HEADERS:
        kind = "int_header"
    elif (command, arg.upper() if arg else None) in TOKEN_OPERATORS:
        kind = "token"
    else:
        kind = "str"
    return Operator(command, arg, max_length, operator_key(command, arg), kind)


def parse_operator(text: str) -> Operator | None:
    """The operator when ``text`` is exactly one ``%COMMAND(ARG):N%``; else None."""
    m = _OPERATOR.fullmatch(text)
    if m is None:
        return None
    return make_operator(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None)


def tokenize(format_string: str) -> list[str | Operator]:
    """Split a format string into literal strings and :class:`Operator` objects.

    ``%%`` is a literal ``%``; a ``%`` that starts no valid operator is an error, as in Envoy.
    One trailing newline (real, or the two characters ``\\n`` pasted from docs) is dropped:
    Envoy needs it to end the record, a parser gets lines without it.
    """
    fs = format_string
    if fs.endswith("\n"):
        fs = fs[:-1]
    elif fs.endswith("\\n"):
        fs = fs[:-2]
    if "\n" in fs:
        raise FormatStringError("a newline inside the format string splits one record over several lines")
    tokens: list[str | Operator] = []
    literal: list[str] = []
    i = 0
    while i < len(fs):
        ch = fs[i]
        if ch != "%":
            literal.append(ch)
            i += 1
            continue
        if fs.startswith("%%", i):
            literal.append("%")
            i += 2
            continue
        m = _OPERATOR.match(fs, i)
        if m is None:
            raise FormatStringError(f"'%' at position {i} starts no operator: {fs[i:i + 30]!r}")
        if literal:
            tokens.append("".join(literal))
            literal = []
        tokens.append(make_operator(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None))
        i = m.end()
    if literal:
        tokens.append("".join(literal))
    if not any(isinstance(t, Operator) for t in tokens):
        raise FormatStringError("the format string has no command operator")
    return tokens


class CompiledFormat:
    """Parser and writer for one Envoy text format string.

    ``parse(line)`` returns a dict keyed by :attr:`Operator.key` (typed values, None for
    ``-``) or raises :class:`ParseError` with reason ``truncated`` or ``format_mismatch``.
    ``format(record)`` writes the line Envoy would write for that record (no newline).
    """

    def __init__(self, format_string: str):
        self.format_string = format_string
        self.tokens = tokenize(format_string)
        self.operators: list[Operator] = [t for t in self.tokens if isinstance(t, Operator)]
        self.keys = list(dict.fromkeys(op.key for op in self.operators))
        # free text inside a chain: its :N bound is checked after the split (group name, bound)
        self._length_checks: list[tuple[str, int]] = []
        full, partial = self._build()
        # the patterns as built (possessive, atomic); compiled as they are where the interpreter
        # matches those right, else emulated (promreflex.recompat: Debian 12's Python 3.11.2)
        self.source, self.prefix_source = full, partial
        self.regex = recompat.compile(full)
        self.prefix_regex = recompat.compile(partial)

    def _value_patterns(self) -> dict[int, tuple[str, str]]:
        """Full and partial pattern of each operator, by token index: one at a time before a
        literal or the end, a chain's together (:func:`chain_patterns`)."""
        out: dict[int, tuple[str, str]] = {}
        tokens = self.tokens
        splits = sum(
            1
            for k, t in enumerate(tokens)
            if isinstance(t, Operator) and k + 1 < len(tokens) and isinstance(after := tokens[k + 1], str)
            and (k == 0 or not isinstance(tokens[k - 1], Operator)) and gives_back(t, after[0])
        )
        bound = give_back_bound(splits)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if not isinstance(tok, Operator):
                i += 1
                continue
            j = i
            while j + 1 < len(tokens) and isinstance(tokens[j + 1], Operator):
                j += 1
            ops = [t for t in tokens[i : j + 1] if isinstance(t, Operator)]
            after = tokens[j + 1] if j + 1 < len(tokens) else ""
            stop = after[0] if isinstance(after, str) and after else ""
            fulls = [value_pattern(tok, stop, bound)] if i == j else chain_patterns(ops, stop)
            for k, (op, full) in enumerate(zip(ops, fulls, strict=True)):
                out[i + k] = (full, partial_pattern(op, stop, in_chain=i != j))
            i = j + 1
        return out

    def _build(self) -> tuple[str, str]:
        full_parts: list[str] = []
        # A line is truncated when it is a proper prefix of a valid line:
        # P(i) = partial(token i) | token i P(i+1), built from the end. Every token's pattern is
        # decided in one pass, so P(i+1) is tried at most once per way token i matches.
        prefix = ""
        pieces: list[tuple[str, str]] = []
        patterns = self._value_patterns()
        group = 0
        for i, tok in enumerate(self.tokens):
            if isinstance(tok, str):
                full = re.escape(tok)
                part = "|".join(re.escape(tok[:k]) for k in range(len(tok)))
            else:
                value, part = patterns[i]
                full = f"(?P<f{group}>{value})"
                in_chain = any(isinstance(self.tokens[k], Operator) for k in (i - 1, i + 1) if 0 <= k < len(self.tokens))
                if in_chain and tok.kind in TEXT_KINDS and tok.max_length is not None:
                    self._length_checks.append((f"f{group}", max(tok.max_length, 1)))
                group += 1
            full_parts.append(full)
            # the partial alternative inside a nested group must not capture
            pieces.append((re.sub(r"\(\?P<f\d+>", "(?:", full), part))
        for full, part in reversed(pieces):
            prefix = f"(?:{full}{prefix}|(?:{part}))" if prefix else f"(?:{part})"
        return "".join(full_parts), prefix

    def parse(self, line: str) -> dict[str, Any]:
        """Typed record for ``line``; raises :class:`ParseError` (never anything else)."""
        m = self.regex.fullmatch(line)
        if m is None:
            if self.prefix_regex.fullmatch(line):
                raise ParseError("truncated", "line ends before the format does")
            raise ParseError("format_mismatch", "line does not fit the format string")
        for name, bound in self._length_checks:
            if len(m.group(name)) > bound:
                raise ParseError("format_mismatch", f"a value is longer than its :{bound}")
        record: dict[str, Any] = {}
        for n, op in enumerate(self.operators):
            raw = m.group(f"f{n}")
            try:
                value = op.convert(raw)
            except ValueError as e:
                raise ParseError("format_mismatch", str(e)) from None
            if record.get(op.key) in (None, ()):
                record[op.key] = value
        return record

    def format(self, record: Mapping[str, Any]) -> str:
        """The line Envoy writes for ``record`` (missing keys are written as ``-``)."""
        out: list[str] = []
        for tok in self.tokens:
            out.append(tok if isinstance(tok, str) else tok.render(record.get(tok.key)))
        return "".join(out)


ISTIO_TEXT = CompiledFormat(ISTIO_TEXT_FORMAT)
ISTIO_LEGACY_TEXT = CompiledFormat(ISTIO_LEGACY_TEXT_FORMAT)
ENVOY_DEFAULT = CompiledFormat(ENVOY_DEFAULT_FORMAT)

__all__ = [
    "CompiledFormat",
    "FormatStringError",
    "ENVOY_DEFAULT",
    "ENVOY_DEFAULT_FORMAT",
    "ISTIO_LEGACY_TEXT",
    "ISTIO_LEGACY_TEXT_FORMAT",
    "ISTIO_TEXT",
    "ISTIO_TEXT_FORMAT",
    "Operator",
    "ParseError",
    "format_start_time",
    "make_operator",
    "parse_operator",
    "tokenize",
]
