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

Field names in a parsed record follow Istio's JSON access-log keys (``response_code``,
``upstream_cluster``, ``authority``, ...), so a text line and a JSON line give the same record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

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
MAX_DURATION_MS = 86_400_000  # a day: beyond it a logged duration is junk, not a slow request
MAX_INT = 2**53
HEADER_COMMANDS = frozenset({"REQ", "RESP", "TRAILER"})

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

    def pattern(self, stop: str | None) -> str:
        """Regex for a full value; ``stop`` is the first character of the next literal,
        ``""`` at the end of the line, None when another operator follows directly (then
        the split is ambiguous: this value takes as little as it can, at least one character,
        since Envoy writes ``-`` for an empty value)."""
        if self.kind == "int":
            return r"-|\d+"
        if self.kind == "flags":
            return r"-|[A-Za-z]+(?:,[A-Za-z]+)*"
        if self.kind == "time":
            return "-|" + _ISO_MS.pattern
        if self.kind == "token":
            return r"-|[A-Za-z0-9/._-]+"
        if self.kind == "strftime":
            return "-|" + strftime_pattern(self.arg or "")
        return _text_class(stop, self.max_length, lazy=stop is None)

    def partial_pattern(self, stop: str | None) -> str:
        """Regex for any prefix of a value (what a truncated line can end with)."""
        if self.kind == "int":
            return r"-|\d*"
        if self.kind == "flags":
            return r"[A-Za-z,-]*"
        if self.kind == "time":
            return r"[\dT:.Z-]*"
        if self.kind == "token":
            return r"[A-Za-z0-9/._-]*"
        if self.kind == "strftime":
            return _text_class(stop, None, lazy=False)
        return _text_class(stop, self.max_length, lazy=False)

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
_STRFTIME = {
    "Y": r"\d{4}", "y": r"\d{2}", "m": r"\d{2}", "d": r"\d{2}", "H": r"\d{2}", "I": r"\d{2}",
    "M": r"\d{2}", "S": r"\d{2}", "j": r"\d{3}", "e": r" ?\d{1,2}", "s": r"\d+", "f": r"\d+",
    "z": r"[+-]\d{4}", "Z": r"[A-Za-z]+", "a": r"[A-Za-z]+", "A": r"[A-Za-z]+", "b": r"[A-Za-z]+",
    "B": r"[A-Za-z]+", "p": r"[AP]M", "T": r"\d{2}:\d{2}:\d{2}", "F": r"\d{4}-\d{2}-\d{2}",
    "D": r"\d{2}/\d{2}/\d{2}", "R": r"\d{2}:\d{2}", "%": "%",
}
_DIRECTIVE = re.compile(r"%(E?)(\d*)([A-Za-z%])")


def strftime_pattern(fmt: str) -> str:
    """Regex for the timestamps a ``START_TIME(fmt)`` writes (unknown directives: lazy text)."""
    out, pos = [], 0
    for m in _DIRECTIVE.finditer(fmt):
        out.append(re.escape(fmt[pos : m.start()]))
        ext, digits, d = m.groups()
        if d == "S" and ext:
            out.append(r"\d{2}(?:\.\d+)?")
        elif d == "f" and digits:
            out.append(r"\d{%d}" % int(digits))
        else:
            out.append(_STRFTIME.get(d, r".+?"))
        pos = m.end()
    out.append(re.escape(fmt[pos:]))
    return "".join(out)


def _text_class(stop: str | None, max_length: int | None, *, lazy: bool) -> str:
    """Free text up to the next literal's first character (anything at the end of the line)."""
    body = "." if not stop else "[^" + re.escape(stop) + "\\n]"
    low = 1 if lazy else 0
    count = ("+" if lazy else "*") if max_length is None else "{%d,%d}" % (low, max(max_length, 1))
    return body + count + ("?" if lazy else "")


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
        full, partial = self._build()
        self.regex = re.compile(full)
        self.prefix_regex = re.compile(partial)

    def _stop_after(self, index: int) -> str | None:
        """First character of the literal after token ``index``; "" at the end, None before an operator."""
        if index + 1 >= len(self.tokens):
            return ""
        nxt = self.tokens[index + 1]
        return nxt[0] if isinstance(nxt, str) else None

    def _build(self) -> tuple[str, str]:
        full_parts: list[str] = []
        # A line is truncated when it is a proper prefix of a valid line:
        # P(i) = partial(token i) | token i P(i+1), built from the end.
        prefix = ""
        pieces: list[tuple[str, str]] = []
        group = 0
        for i, tok in enumerate(self.tokens):
            if isinstance(tok, str):
                full = re.escape(tok)
                part = "|".join(re.escape(tok[:k]) for k in range(len(tok)))
            else:
                stop = self._stop_after(i)
                full = f"(?P<f{group}>{tok.pattern(stop)})"
                part = tok.partial_pattern(stop)
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
