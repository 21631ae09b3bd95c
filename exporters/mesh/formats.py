"""Pick the parser/writer for a configured log format by name.

One place maps the names used in configuration (``istio_text``, ``istio_json``, ``envoy``,
...) to format objects, so the exporter, the writer and the config validation agree.
"""

from __future__ import annotations

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
from exporters.mesh.ztunnel_format import ZTUNNEL

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
