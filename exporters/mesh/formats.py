"""Pick the parser/writer for a configured log format by name.

One place maps the names used in configuration (``istio_text``, ``istio_json``, ``envoy``,
...) to format objects, so the exporter, the writer and the config validation agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from exporters.mesh.envoy_format import (
    ENVOY_DEFAULT,
    ISTIO_LEGACY_TEXT,
    ISTIO_TEXT,
    CompiledFormat,
    ParseError,
)
from exporters.mesh.json_format import ISTIO_JSON, ISTIO_JSON_EXTRA_FIELDS, JsonFormat, load_object
from exporters.mesh.ztunnel_format import TIMESTAMP, ZTUNNEL

FORMAT_NAMES = ("istio_text", "istio_text_legacy", "istio_json", "envoy", "ztunnel", "auto")


class LineFormat(Protocol):
    """What the exporter and the writer need from a format."""

    def parse(self, line: str) -> dict[str, Any]: ...

    def format(self, record: Mapping[str, Any]) -> str: ...


class AutoFormat:
    """Each line in the first known format that takes it: Istio's text (1.9+ and legacy),
    Envoy's own default, Istio's JSON, ztunnel (text or JSON). For a log whose format nobody
    wrote down (a plain Envoy, a waypoint, a node's ztunnel); a rejected line gets the reason of
    the format that came closest (``truncated`` before ``format_mismatch``). A JSON line is
    ztunnel's when :meth:`ZtunnelFormat.claims` its object (then its reason is final), else
    Istio's JSON."""

    formats: tuple[LineFormat, ...] = (ISTIO_TEXT, ENVOY_DEFAULT, ISTIO_LEGACY_TEXT, ISTIO_JSON, ZTUNNEL)

    def parse(self, line: str) -> dict[str, Any]:
        if line.lstrip().startswith("{"):
            obj = load_object(line)
            return ZTUNNEL.parse_object(obj) if ZTUNNEL.claims(obj) else ISTIO_JSON.parse_object(obj)
        candidates = [f for f in self.formats if f is not ISTIO_JSON]
        reason, detail = "format_mismatch", "no known format takes the line"
        for fmt in candidates:
            try:
                return fmt.parse(line)
            except ParseError as e:
                if e.reason != "format_mismatch" and reason == "format_mismatch":
                    reason, detail = e.reason, str(e)
        raise ParseError(reason, detail)

    def format(self, record: Mapping[str, Any]) -> str:
        return ISTIO_TEXT.format(record)


AUTO = AutoFormat()


# The proxies' own log lines, which reach the exporter in the same stream as the access log
# (a container's stdout, or `kubectl logs`, which merges stdout and stderr):
# - Istio's pilot-agent, in every istio-proxy container (istio.io/pkg/log):
#   `2023-09-05T08:47:58.505633Z<TAB>info<TAB>xdsproxy<TAB>connected to upstream XDS server: ...`
#   (the scope is left out for the default one: `...Z<TAB>info<TAB>FLAG: --concurrency="2"`), or
#   with --log_as_json `{"level":"info","time":"...","scope":"ads","msg":"..."}`;
# - Envoy's own log as Istio formats it (`...Z<TAB>warning<TAB>envoy config ...<TAB>...`), or in
#   Envoy's default layout (`[2019-03-01 01:07:03.833][11][warning][config] [...] ...`: not
#   Istio's access-log line, whose time has a `T` and is followed by the request);
# - ztunnel's lines of any target but `access` (`...Z<TAB>info<TAB>xds::client:xds{id=1}<TAB>...`,
#   or its JSON with that `scope`).
# They are not access-log lines in a format the exporter was not told about, so they are skipped
# under the reason `proxy_log`, not rejected as `format_mismatch` (an idle pod's start-up lines
# fired PromreflexMeshLogMostlyRejected). Only a line its format REJECTED is looked at, so an
# access-log format that happens to start the same way still parses. A message can span lines
# (pilot-agent's "Effective config:" YAML at start-up): a rejected YAML-shaped line right after a
# proxy's own line continues it, up to PROXY_LOG_CONTINUATION lines (so a wrong access-log format
# after a pilot-agent line is still counted as rejected: its lines are not YAML). A JSON object
# with an access log's fields (a format whose status key was renamed) is not one.
PROXY_LOG_CONTINUATION = 500
PROXY_LOG_LEVELS = frozenset({"trace", "debug", "info", "warn", "warning", "error", "critical", "fatal"})
_PROXY_LOG_HEAD = re.compile(rf"^(?:{TIMESTAMP}\s+)?{TIMESTAMP}\s+(?P<level>[a-z]+)\s+(?P<next>\S+)")
# Keys of Istio's and Envoy's JSON access logs (docs' default JSON format) a proxy's own log line lacks.
_ACCESS_LOG_KEYS = frozenset({"response_code", "start_time", "method", "path", "authority", "upstream_cluster",
                              "upstream_host", "downstream_remote_address", "request_id", "response_flags",
                              "user_agent", "x_forwarded_for"})
_RECORD_START = re.compile(rf"^\s*(?:[\[{{]|{TIMESTAMP})")
_YAML_LINE = re.compile(r"^(?:\s+\S|[\w.\-/\"']+:(?:\s|$)|-\s)")
_ENVOY_LOG_HEAD = re.compile(r"^(?:\S+\s+)?\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+\]\[\d+\]\[(?P<level>[a-z]+)\]\[")


def proxy_log_line(text: str) -> bool:
    """Whether ``text`` is a line of a proxy's own log (above), not an access-log line."""
    line = text.lstrip()
    if line.startswith("{"):
        try:
            obj = load_object(line)
        except ParseError:
            return False
        level, scope = obj.get("level"), obj.get("scope", obj.get("target"))
        return (isinstance(level, str) and level.lower() in PROXY_LOG_LEVELS
                and not _ACCESS_LOG_KEYS.intersection(obj)
                and isinstance(obj.get("time", obj.get("timestamp")), str)
                and (isinstance(scope, str) or isinstance(obj.get("msg", obj.get("message")), str))
                and scope != "access")
    head = _PROXY_LOG_HEAD.match(line)
    if head is not None:
        return head.group("level") in PROXY_LOG_LEVELS and head.group("next") != "access"
    head = _ENVOY_LOG_HEAD.match(line)
    return head is not None and head.group("level") in PROXY_LOG_LEVELS


def proxy_log_continues(text: str) -> bool:
    """Whether ``text``, rejected right after a proxy's own line (or its continuation), continues
    that line's message: YAML-shaped (indented, ``key: value``, ``- item``) and not the start of
    a record (no time first, no ``[`` or ``{``). An access line of a format the exporter was not
    told about (it begins with a method, an address, a time without ``T``) is not."""
    return _RECORD_START.match(text) is None and _YAML_LINE.match(text) is not None


def get_format(
    name: str, format_string: str | None = None, json_format: Mapping[str, str] | None = None
) -> LineFormat:
    """The format object for ``name``; ``envoy`` compiles ``format_string``.

    ``envoy`` without a format string is Envoy's own default format; ``auto`` recognises each
    line. Raises ValueError (FormatStringError for a bad format string) naming what is wrong.
    """
    if name == "envoy":
        return CompiledFormat(format_string) if format_string else ENVOY_DEFAULT
    if format_string is not None:
        raise ValueError(f"format_string is only for format 'envoy' (this log has format {name!r})")
    if name == "istio_json":
        return JsonFormat(json_format, ISTIO_JSON_EXTRA_FIELDS) if json_format else ISTIO_JSON
    if json_format is not None:
        raise ValueError(f"json_format is only for format 'istio_json' (this log has format {name!r})")
    if name == "istio_text":
        return ISTIO_TEXT
    if name == "istio_text_legacy":
        return ISTIO_LEGACY_TEXT
    if name == "ztunnel":
        return ZTUNNEL
    if name == "auto":
        return AUTO
    raise ValueError(f"unknown format {name!r} (one of {', '.join(FORMAT_NAMES)})")


__all__ = ["AUTO", "FORMAT_NAMES", "AutoFormat", "LineFormat", "get_format"]
