"""Command line of the access-log exporter: ``promreflex exporter-accesslog`` or
``python -m exporters.accesslog``.

Either a YAML file (``--config.file``) or one ``--log SITE=PATH[:FORMAT]`` per log; flags given
with a file override its top-level keys. ``custom`` formats and routes need the file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from exporters.accesslog.config import AccessLogConfig, load_accesslog_config
from exporters.accesslog.parse import FORMATS
from promreflex.config import ConfigError, validation_problems
from promreflex.httpd import metrics_app, serving, stop_on_signals

log = logging.getLogger("promreflex.exporter.accesslog")

COMMAND = "exporter-accesslog"


def parse_log_flag(value: str) -> dict[str, str]:
    """``shop=/var/log/nginx/access.log:nginx_timed`` -> {site, path, format}."""
    site, eq, rest = value.partition("=")
    if not eq or not site or not rest:
        raise argparse.ArgumentTypeError(f"{value!r} is not SITE=PATH[:FORMAT]")
    path, colon, fmt = rest.rpartition(":")
    if colon and fmt in FORMATS and fmt != "custom":
        return {"site": site, "path": path, "format": fmt}
    return {"site": site, "path": rest}


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
                   help="where each log's read position is kept across restarts")
    p.add_argument("--log.from-start", dest="from_start", action="store_true", default=None,
                   help="read the existing content of logs with no saved position (default: start at the end)")
    p.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> AccessLogConfig:
    """The configuration the flags describe; ConfigError names every problem."""
    overrides: dict[str, Any] = {
        k: v for k, v in (("listen_address", args.listen_address), ("state_dir", args.state_dir),
                          ("from_start", args.from_start)) if v is not None
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
    try:
        return AccessLogConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, validation_problems(e)) from e


async def _serve(config: AccessLogConfig) -> int:
    from prometheus_client import REGISTRY, disable_created_metrics

    from exporters.accesslog.exporter import AccessLogExporter

    disable_created_metrics()  # this process is the exporter: halve /metrics, Prometheus ignores them
    exporter = AccessLogExporter(config, registry=REGISTRY)
    try:
        for line in exporter.resume_infos():
            log.info("%s", line)
        stop = stop_on_signals()
        try:
            async with serving(config.listen_address, metrics_app(REGISTRY, "promreflex access-log exporter")):
                log.info("serving /metrics on http://%s/metrics", config.listen_address)
                await exporter.run(stop)
        except OSError as e:
            print(f"promreflex exporter-accesslog: cannot listen on {config.listen_address}: {e.strerror}",
                  file=sys.stderr)
            return 1
        log.info("stopped; read positions saved")
        return 0
    finally:
        exporter.close()


def cmd_exporter_accesslog(args: argparse.Namespace) -> int:
    """Run the exporter until SIGINT/SIGTERM. Configuration errors raise ConfigError."""
    config = config_from_args(args)
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
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return cmd_exporter_accesslog(args)
    except ConfigError as e:
        print(f"promreflex exporter-accesslog: configuration error in {e}", file=sys.stderr)
        return 2
