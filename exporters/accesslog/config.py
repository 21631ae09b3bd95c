"""Configuration of the access-log exporter: which logs, in which format, with which routes.

Example (``exporters/accesslog/example.yml`` is the full one)::

    listen_address: 127.0.0.1:9181
    state_dir: /var/lib/promreflex/accesslog
    logs:
      - site: shop
        path: /var/log/nginx/access.log
        format: nginx_timed
        routes:
          - {name: checkout, prefix: /checkout}
          - {name: product, regex: '^/p/[0-9]+$'}

Routes are how a path becomes a label: raw paths are unbounded (every product id, every bot
probe) and would explode the series count, so a path is only ever exported as one of the
configured route names, or ``other``.
"""

from __future__ import annotations

import glob
import os
import re
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from exporters.accesslog.parse import LogFormatError, build_parser
from promreflex.config import Duration, ListenAddress, Strict, find_duplicates, load_model

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
"""Seconds. Dense below 1 s where shop pages live; 0.5 and 2.0 are Apdex T and 4T for T=0.5 s."""

MAX_ROUTES = 50
OTHER_ROUTE = "other"

Format = Literal["nginx_combined", "nginx_timed", "apache_combined", "apache_common", "apache_vhost_combined", "custom"]


class Route(Strict):
    """Paths starting with ``prefix``, or matching ``regex`` (searched from the path's start,
    query string excluded), are counted as ``name``. The first matching route wins."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_.:/-]{1,64}$")
    prefix: str | None = Field(default=None, min_length=1)
    regex: str | None = Field(default=None, min_length=1)

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from e
        return value

    @model_validator(mode="after")
    def _one_matcher(self) -> Route:
        if (self.prefix is None) == (self.regex is None):
            raise ValueError("give exactly one of prefix or regex")
        return self


class LogSource(Strict):
    """One access log. ``site`` is the label value its requests are counted under."""

    site: str = Field(pattern=r"^[a-zA-Z0-9_.:-]{1,64}$")
    path: Path
    format: Format = "nginx_combined"
    log_format: str | None = None
    backslash_escapes: StrictBool | None = None
    """``custom`` only: quoted fields may hold ``\"``, as Apache writes a quote in a field. Default:
    yes for a JSON format and for one using ``$request_time_us``/``$request_time_ms`` (an Apache
    log), no otherwise (nginx writes ``\x22``); set it for an Apache log read with ``$request_time``."""
    routes: list[Route] = Field(default_factory=list, max_length=MAX_ROUTES)
    rotated: str | None = Field(default=None, min_length=1)
    """Glob of the rotated copies, when they are not beside the log as ``<name>.N[.gz]`` or
    ``<name>-DATE[.gz]`` (logrotate ``olddir``, other names)."""

    @field_validator("path")
    @classmethod
    def _not_a_glob(cls, value: Path) -> Path:
        if glob.has_magic(str(value)) and not value.exists():
            raise ValueError(
                f"{str(value)!r} is a glob pattern: the exporter follows one file per log (one `site` "
                "label each); list each log separately. Rotated copies are found by themselves "
                "(or name them with `rotated:`)"
            )
        return value

    @model_validator(mode="after")
    def _format_consistent(self) -> LogSource:
        if self.format == "custom" and not self.log_format:
            raise ValueError("format 'custom' needs log_format (the nginx log_format string)")
        if self.format != "custom" and self.log_format is not None:
            raise ValueError(f"log_format is only read with format 'custom' (format is {self.format!r})")
        if self.format != "custom" and self.backslash_escapes is not None:
            raise ValueError(f"backslash_escapes is only read with format 'custom' (format is {self.format!r})")
        try:
            parser = build_parser(self.format, self.log_format, self.backslash_escapes)
        except LogFormatError as e:
            raise ValueError(f"log_format: {e}") from e
        if self.routes and not parser.has_path:
            raise ValueError("routes need a path: the log format has no $request, $request_uri or $uri")
        names = [r.name for r in self.routes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"route names must be unique: {', '.join(dupes)}")
        return self


class AccessLogConfig(Strict):
    """The whole exporter. ``from_start`` reads existing content of a log that has no saved
    state (first run); the default starts at its end, so a first start does not count a
    months-old backlog as a burst of new requests."""

    logs: list[LogSource] = Field(min_length=1)
    listen_address: ListenAddress = "127.0.0.1:9181"
    poll_interval: Duration = Field(default=0.25, gt=0)
    state_dir: Path | None = None
    from_start: bool = False
    max_line_bytes: int = Field(default=64 * 1024, ge=256)
    duration_buckets: tuple[float, ...] = DEFAULT_BUCKETS

    @field_validator("duration_buckets")
    @classmethod
    def _increasing(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(b <= a for a, b in pairwise(value)) or value[0] <= 0:
            raise ValueError("buckets must be positive and strictly increasing")
        return value

    @model_validator(mode="after")
    def _distinct_paths(self) -> AccessLogConfig:
        dupes = find_duplicates([str(s.path) for s in self.logs])
        if dupes:
            raise ValueError(f"each log path may appear once: {', '.join(dupes)}")
        return self

    @property
    def has_routes(self) -> bool:
        """True when any log maps paths to routes: only then is there a ``route`` label."""
        return any(s.routes for s in self.logs)


def default_state_dir() -> Path:
    """Where read positions live when no ``state_dir`` is given: ``$XDG_STATE_HOME/promreflex/accesslog``
    (``~/.local/state/promreflex/accesslog``). Positions are what make a restart, and a rotation
    while the exporter is down, lose and double-count nothing, so they are kept by default."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "promreflex" / "accesslog"


def load_accesslog_config(path: str | Path) -> AccessLogConfig:
    """Load and validate the YAML file; every problem is reported at once in a ConfigError."""
    return load_model(path, AccessLogConfig, "with a logs: list")
