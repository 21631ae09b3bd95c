"""Run the mesh exporter: follow every configured sidecar log, serve ``/metrics``.

``python -m exporters.mesh --config.file mesh.yml`` or, wired into the main CLI through
:func:`register`, ``promreflex exporter-mesh --config.file mesh.yml``. ``--oneshot`` reads the
logs once from the start, prints the metrics and exits (a dry run for a new format string);
it exits 1 when a configured path or glob names no file. Paths may be globs.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import hashlib
import logging
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics, generate_latest

from promreflex.logs import setup as setup_logging
from promreflex.config import ConfigError
from promreflex.errors import UserError
from promreflex.follow import FollowStats, LogFollower, follow, read_lines
from promreflex.httpd import metrics_app, serving, stop_on_signals

from exporters.mesh.collector import MeshExporter, MeshStream
from exporters.mesh.config import LogSource, MeshExporterConfig, load_mesh_config

log = logging.getLogger("promreflex.exporter.mesh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config.file", dest="config_file", required=True, help="mesh exporter YAML configuration")
    parser.add_argument(
        "--web.listen-address", dest="listen_address", default=None, help="override listen_address (HOST:PORT)"
    )
    parser.add_argument(
        "--oneshot", action="store_true", help="read every log once from the start, print the metrics and exit"
    )


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``exporter-mesh`` subcommand; its ``func`` default takes the parsed args, returns an exit code."""
    p = subparsers.add_parser("exporter-mesh", help="per-edge metrics from Istio/Envoy sidecar access logs")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


_GLOB = re.compile(r"[*?[]")


class MissingLogError(UserError):
    """A configured log path (or glob) names no file."""


def expand(cfg: MeshExporterConfig, *, must_exist: bool) -> list[tuple[LogSource, Path]]:
    """Every (log source, file) the configuration names: globs expanded (sorted), plain paths
    as given. ``must_exist``: a path or glob that names no file is an error (``--oneshot``);
    otherwise a plain path may appear later (the follower waits for it) and an empty glob is
    an error, since nothing would ever be read for it."""
    out: list[tuple[LogSource, Path]] = []
    missing: list[str] = []
    for src in cfg.logs:
        text = str(src.path)
        if _GLOB.search(text):
            matches = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file())
            if not matches:
                missing.append(f"{text} (a pattern that matches no file)")
            out += [(src, m) for m in matches]
        elif must_exist and not src.path.is_file():
            missing.append(text)
        else:
            out.append((src, src.path))
    if missing:
        raise MissingLogError(f"no such log: {', '.join(missing)}")
    return _first_entry_wins(out)


def _first_entry_wins(pairs: list[tuple[LogSource, Path]]) -> list[tuple[LogSource, Path]]:
    """Each file once, under the first entry that names it: a specific glob before a catch-all
    one (``sock-shop_carts-*`` for carts, then ``sock-shop_*`` for the rest) is a natural
    configuration, and a file read twice would count every request twice. Links are followed
    (``/var/log/containers/*.log`` links into ``/var/log/pods``)."""
    seen: dict[Path, LogSource] = {}
    out = []
    for src, path in pairs:
        real = path.resolve()
        first = seen.setdefault(real, src)
        if first is not src:
            log.warning("%s is named by %s (workload %s) and %s: read once, as %s",
                        path, first.path, first.workload, src.path, first.workload)
            continue
        out.append((src, path))
    return out


def _exporter(cfg: MeshExporterConfig, registry: CollectorRegistry) -> MeshExporter:
    return MeshExporter(
        registry=registry,
        namespaces=cfg.namespaces,
        max_services=cfg.max_services,
        max_line_bytes=cfg.max_line_bytes,
    )


def _stream(exporter: MeshExporter, src: LogSource, path: Path) -> MeshStream:
    return exporter.add_stream(
        src.workload,
        src.format,
        src.format_string,
        json_format=src.json_format,
        workload_field=src.workload_field,
        name=str(path),
    )


def build(
    cfg: MeshExporterConfig, registry: CollectorRegistry, *, from_start: bool | None = None
) -> tuple[MeshExporter, list[tuple[LogFollower, MeshStream]]]:
    """The exporter and one (follower, stream) pair per log file (globs expanded;
    ``from_start`` overrides each log's)."""
    exporter = _exporter(cfg, registry)
    pairs = []
    for src, path in expand(cfg, must_exist=False):
        stream = _stream(exporter, src, path)
        state = None
        if cfg.state_dir is not None:
            digest = hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()
            state = cfg.state_dir / f"mesh-{src.workload}-{digest}.json"
        follower = LogFollower(
            path,
            state_file=state,
            from_start=src.from_start if from_start is None else from_start,
            max_line_bytes=cfg.max_line_bytes,
        )
        log.info("%s", follower.resume_info())
        pairs.append((follower, stream))
    return exporter, pairs


class _Feeder:
    """Hands each poll's lines to the right stream; oversized lines the follower dropped count as too_long."""

    def __init__(self, pairs: list[tuple[LogFollower, MeshStream]]):
        self.streams = {id(f): s for f, s in pairs}
        self.oversized = {id(f): 0 for f, _ in pairs}

    def __call__(self, follower: LogFollower, lines: list[str]) -> None:
        stream = self.streams[id(follower)]
        dropped = follower.stats.oversized_lines - self.oversized[id(follower)]
        if dropped:
            self.oversized[id(follower)] = follower.stats.oversized_lines
            stream.reject("too_long", dropped)
        stream.feed(lines)


def oneshot(cfg: MeshExporterConfig, registry: CollectorRegistry) -> bytes:
    """Read every log file whole once, its last line too when it lacks a newline; the
    exposition text of the result. A path or glob naming no file is a
    :class:`MissingLogError` (the CLI exits 1)."""
    exporter = _exporter(cfg, registry)
    for src, path in expand(cfg, must_exist=True):
        stream = _stream(exporter, src, path)
        stats = FollowStats()
        for lines in read_lines(path, max_line_bytes=cfg.max_line_bytes, stats=stats):
            stream.feed(lines)
        if stats.oversized_lines:
            stream.reject("too_long", stats.oversized_lines)
        stream.flush()
    return generate_latest(registry)


async def serve(cfg: MeshExporterConfig, registry: CollectorRegistry, stop: asyncio.Event | None = None) -> None:
    """Follow the logs and serve ``/metrics`` until ``stop`` is set (SIGINT/SIGTERM when none is
    given; SIGHUP then re-checks every log at once, as the access-log exporter does: a logrotate
    ``postrotate`` that signals the log readers killed it)."""
    wake = asyncio.Event()
    if stop is None:
        stop = stop_on_signals()

        def on_sighup() -> None:
            log.info("SIGHUP: re-checking every log now (the configuration is not reloaded: restart to change it)")
            wake.set()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
    _, pairs = build(cfg, registry)
    try:
        async with serving(cfg.listen_address, metrics_app(registry, "promreflex mesh exporter")):
            log.info("serving /metrics on %s", cfg.listen_address)
            await follow([f for f, _ in pairs], _Feeder(pairs), interval=cfg.poll_interval, stop=stop, wake=wake)
    finally:
        for f, _ in pairs:
            f.close()


def run(args: argparse.Namespace) -> int:
    """Entry point for parsed arguments (used by ``promreflex exporter-mesh`` and ``python -m``)."""
    try:
        cfg = load_mesh_config(Path(args.config_file))
        if args.listen_address:
            cfg = MeshExporterConfig.model_validate({**cfg.model_dump(), "listen_address": args.listen_address})
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:  # a bad --web.listen-address
        print(f"--web.listen-address: {e}", file=sys.stderr)
        return 2
    if args.oneshot:
        try:
            text = oneshot(cfg, CollectorRegistry())
        except UserError as e:
            print(f"exporter-mesh: {e}", file=sys.stderr)
            return 1
        sys.stdout.write(text.decode())
        return 0
    disable_created_metrics()  # _created series only double the output of a log exporter
    setup_logging()
    try:
        asyncio.run(serve(cfg, REGISTRY))
    except MissingLogError as e:
        print(f"exporter-mesh: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"cannot listen on {cfg.listen_address}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.mesh", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = ["MissingLogError", "add_arguments", "build", "expand", "main", "oneshot", "register", "run", "serve"]
