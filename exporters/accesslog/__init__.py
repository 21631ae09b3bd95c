"""Access-log exporter: HTTP request counts, status classes, durations and bytes per site,
read from nginx or Apache access logs (the signal stub_status and the stock nginx exporter do
not give: status codes and latency).

Modules: ``parse`` (formats -> compiled regexes), ``config`` (pydantic models, YAML),
``metrics`` (metric families), ``exporter`` (follow + parse + count), ``cli`` (flags and the
``exporter-accesslog`` subcommand). Log following itself is :mod:`promreflex.follow`.
"""

from exporters.accesslog.config import AccessLogConfig, LogSource, Route, load_accesslog_config
from exporters.accesslog.exporter import AccessLogExporter
from exporters.accesslog.parse import FORMATS, REASONS, build_parser, compile_log_format

__all__ = [
    "FORMATS",
    "REASONS",
    "AccessLogConfig",
    "AccessLogExporter",
    "LogSource",
    "Route",
    "build_parser",
    "compile_log_format",
    "load_accesslog_config",
]
