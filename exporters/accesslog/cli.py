"""Command line of the access-log exporter: ``promreflex exporter-accesslog`` or
``python -m exporters.accesslog``.

Either a YAML file (``--config.file``) or one ``--log SITE=PATH[:FORMAT]`` per log; flags given
with a file override its top-level keys. ``custom`` formats and routes need the file.

Read positions are kept in ``--state.dir`` (default ``$XDG_STATE_HOME/promreflex/accesslog``,
i.e. ``~/.local/state/promreflex/accesslog``), so a restart, and rotations while the exporter is
down, lose and double-count nothing. A first start on an existing log begins at its end and
says so (log line, ``promreflex_accesslog_skipped_bytes_total``); ``--log.from-start`` reads it.
``--backfill`` counts the whole rotated set (``.gz`` included) once, prints the totals and exits.
SIGHUP (logrotate's postrotate) makes every log be re-checked at once; it does not reload the
configuration (restart for that: positions are saved). SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import glob
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from promreflex.logs import setup as setup_logging
from exporters.accesslog.config import AccessLogConfig, default_state_dir, load_accesslog_config
from exporters.accesslog.parse import FORMATS
from promreflex.config import ConfigError, validation_problems
from promreflex.errors import UserError

log = logging.getLogger("promreflex.exporter.accesslog")

COMMAND = "exporter-accesslog"


_FLAG_FORMATS = tuple(f for f in FORMATS if f != "custom")
_FORMAT_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def parse_log_flag(value: str) -> dict[str, str]:
    """``shop=/var/log/nginx/access.log:nginx_timed`` -> {site, path, format}.

    A suffix after the last ``:`` that looks like a format name but is none (``:nginx_timd``)
    is an error naming the known formats, not part of the path (unless that whole path exists);
    a glob is an error too: one ``--log`` per file.
    """
    site, eq, rest = value.partition("=")
    if not eq or not site or not rest:
        raise argparse.ArgumentTypeError(f"{value!r} is not SITE=PATH[:FORMAT]")
    known = ", ".join(_FLAG_FORMATS)
    path, colon, fmt = rest.rpartition(":")
    if colon and fmt in _FLAG_FORMATS:
        out = {"site": site, "path": path, "format": fmt}
    elif colon and not fmt and not os.path.exists(rest):
        raise argparse.ArgumentTypeError(f"{value!r}: empty FORMAT after ':' (drop the ':' for the default, "
                                         f"or name one: {known})")
    elif colon and fmt == "custom":
        raise argparse.ArgumentTypeError(f"{value!r}: format custom needs a log_format: use --config.file")
    elif colon and _FORMAT_LIKE.fullmatch(fmt) and not os.path.exists(rest):
        close = difflib.get_close_matches(fmt, _FLAG_FORMATS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise argparse.ArgumentTypeError(f"{value!r}: unknown format {fmt!r}{hint}; known formats: {known}")
    else:
        out = {"site": site, "path": rest}
    if glob.has_magic(out["path"]) and not os.path.exists(out["path"]):
        raise argparse.ArgumentTypeError(
            f"{value!r}: {out['path']!r} is a glob: give one --log SITE=PATH[:FORMAT] per file (formats: {known}); "
            "rotated copies are found by themselves"
        )
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config_file", type=Path, default=None,
                   help="YAML configuration (logs, routes, state_dir, ...)")
    p.add_argument("--log", dest="logs", action="append", type=parse_log_flag, default=[],
                   metavar="SITE=PATH[:FORMAT]",
                   help=f"follow PATH as SITE; FORMAT one of {', '.join(f for f in FORMATS if f != 'custom')} "
                        "(default nginx_combined). Repeat for several logs.")
    p.add_argument("--web.listen-address", dest="listen_address", default=None,
                   help="where /metrics is served (default 127.0.0.1:9181)")
    p.add_argument("--state.dir", dest="state_dir", type=Path, default=None,
                   help="where each log's read position is kept across restarts and rotations "
                        f"(default {default_state_dir()}, from $XDG_STATE_HOME)")
    p.add_argument("--log.from-start", dest="from_start", action="store_true", default=None,
                   help="read the existing content of logs with no saved position (default: start at the end, "
                        "counted in promreflex_accesslog_skipped_bytes_total)")
    p.add_argument("--log.poll-interval", dest="poll_interval", default=None, metavar="DURATION",
                   help="how often each log is read, e.g. 250ms (default 250ms)")
    p.add_argument("--backfill", action="store_true",
                   help="count each log's whole rotated set (access.log.N.gz ... access.log.1, access.log) once, "
                        "print the totals as a Prometheus exposition and exit")
    p.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> AccessLogConfig:
    """The configuration the flags describe; ConfigError names every problem."""
    overrides: dict[str, Any] = {
        k: v for k, v in (("listen_address", args.listen_address), ("state_dir", args.state_dir),
                          ("from_start", args.from_start), ("poll_interval", getattr(args, "poll_interval", None)))
        if v is not None
    }
    if args.config_file is not None:
        if args.logs:
            raise ConfigError("(flags)", ["give logs either with --log or in --config.file, not both"])
        base = load_accesslog_config(args.config_file)
        data = base.model_dump() | overrides
        source = f"{args.config_file} + flags"
    else:
        if not args.logs:
            raise ConfigError("(flags)", ["no log to follow: give --config.file or at least one --log SITE=PATH"])
        data = {"logs": args.logs, **overrides}
        source = "(flags)"
    if data.get("state_dir") is None:  # safe by default: positions kept unless a state dir is given elsewhere
        data["state_dir"] = default_state_dir()
    try:
        return AccessLogConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, validation_problems(e)) from e


async def _serve(config: AccessLogConfig) -> int:
    from prometheus_client import REGISTRY, disable_created_metrics

    from exporters.accesslog.exporter import AccessLogExporter
    from promreflex.httpd import metrics_app, serving, stop_on_signals  # aiohttp: not for --backfill

    disable_created_metrics()  # this process is the exporter: halve /metrics, Prometheus ignores them
    exporter = AccessLogExporter(config, registry=REGISTRY)
    try:
        log.info("read positions are kept in %s", config.state_dir)
        for line in exporter.resume_infos():
            log.info("%s", line)
        stop = stop_on_signals()
        wake = asyncio.Event()

        def on_sighup() -> None:
            log.info("SIGHUP: re-checking every log now (rotations are followed anyway; "
                     "the configuration is not reloaded: restart to change it, positions are saved)")
            wake.set()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
        try:
            async with serving(config.listen_address, metrics_app(REGISTRY, "promreflex access-log exporter")):
                log.info("serving /metrics on http://%s/metrics", config.listen_address)
                await exporter.run(stop, wake)
        except OSError as e:
            print(f"promreflex exporter-accesslog: cannot listen on {config.listen_address}: {e.strerror}",
                  file=sys.stderr)
            return 1
        log.info("stopped; read positions saved")
        return 0
    finally:
        exporter.close()


def cmd_exporter_accesslog(args: argparse.Namespace) -> int:
    """Run the exporter until SIGINT/SIGTERM (or, with ``--backfill``, count the rotated sets and
    exit). Configuration errors raise ConfigError; unusable files raise UserError."""
    config = config_from_args(args)
    if getattr(args, "backfill", False):
        from exporters.accesslog.backfill import backfill

        backfill(config)
        return 0
    return asyncio.run(_serve(config))


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``exporter-accesslog`` subcommand (handler in ``func``) to a ``promreflex`` CLI."""
    p = subparsers.add_parser(COMMAND, help="export HTTP request metrics from nginx/Apache access logs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_exporter_accesslog)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m exporters.accesslog``: the same flags as the subcommand."""
    parser = argparse.ArgumentParser(prog="python -m exporters.accesslog", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return cmd_exporter_accesslog(args)
    except ConfigError as e:
        print(f"promreflex exporter-accesslog: configuration error in {e}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"promreflex exporter-accesslog: {e}", file=sys.stderr)
        return 1
