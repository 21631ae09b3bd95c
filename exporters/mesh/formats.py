"""Pick the parser/writer for a configured log format by name.

One place maps the names used in configuration (``istio_text``, ``istio_json``, ``envoy``,
...) to format objects, so the exporter, the writer and the config validation agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from exporters.mesh.envoy_format import ISTIO_LEGACY_TEXT, ISTIO_TEXT, CompiledFormat
from exporters.mesh.json_format import ISTIO_JSON, ISTIO_JSON_EXTRA_FIELDS, JsonFormat

FORMAT_NAMES = ("istio_text", "istio_text_legacy", "istio_json", "envoy")


class LineFormat(Protocol):
    """What the exporter and the writer need from a format."""

    def parse(self, line: str) -> dict[str, Any]: ...

    def format(self, record: Mapping[str, Any]) -> str: ...


def get_format(
    name: str, format_string: str | None = None, json_format: Mapping[str, str] | None = None
) -> LineFormat:
    """The format object for ``name``; ``envoy`` compiles ``format_string``.

    Raises ValueError (FormatStringError for a bad format string) naming what is wrong.
    """
    if name == "envoy":
        if not format_string:
            raise ValueError("format 'envoy' needs format_string")
        return CompiledFormat(format_string)
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
    raise ValueError(f"unknown format {name!r} (one of {', '.join(FORMAT_NAMES)})")


__all__ = ["FORMAT_NAMES", "LineFormat", "get_format"]
