"""``promreflex swift-timing``: where a Swift request's time goes, per hop and per node, from
packet captures of several nodes.

    swift-timing analyze --capture NODE=FILE ... --roles roles.yml [--json OUT] [--metrics]
    swift-timing diagram --capture NODE=FILE ... --roles roles.yml --out req.png (--trans-id TX | --request-index N | --window START,END)
    swift-timing serve   (--capture NODE=FILE ... | --live NODE=IFACE[@NETNS] ...) --roles roles.yml --web.listen-address HOST:PORT

Roles (which address is which node and which ip:port serves which Swift role): ``--roles`` (a
YAML or JSON mapping, ``promreflex swift-lab``'s ``roles.json`` included), ``--swift-dir`` (the
rings and ``proxy-server.conf``), ``--proxy-config``. Captures: pcap or pcapng, micro- or
nanosecond; damaged ones are read as far as they go and the rest is counted. ``serve`` exposes
``/metrics`` (``promreflex_swift_*``); beyond loopback it needs ``--web.token-file``.
Also ``python -m exporters.swift``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest

from promreflex.logs import setup as setup_logging
from exporters.swift.roles import RoleMap, load_roles
from promreflex.config import is_loopback, parse_duration, split_host_port
from promreflex.errors import UserError

if TYPE_CHECKING:
    from exporters.swift.live import LiveSource

COMMAND = "swift-timing"
log = logging.getLogger("promreflex.exporter.swift")


def _capture(value: str) -> tuple[str, Path]:
    node, eq, path = value.partition("=")
    if not eq or not node or not path:
        raise argparse.ArgumentTypeError(f"{value!r} is not NODE=FILE")
    return node, Path(path)


def _duration(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _signed_duration(value: str) -> float:
    """A duration that may be negative here: ``serve`` refuses it with a one-line error."""
    text = value.strip()
    return -_duration(text[1:]) if text.startswith("-") else _duration(text)


def _common(p: argparse.ArgumentParser, live: bool = False) -> None:
    p.add_argument("--capture", dest="captures", action="append", type=_capture, default=[], metavar="NODE=FILE",
                   help="a node's capture (pcap/pcapng); repeat per node, and per file of a node's rotated capture "
                        "(tcpdump -C/-G: read in the order of their first packets)")
    p.add_argument("--roles", type=Path, default=None, help="role mapping (YAML/JSON): nodes, services, hosts")
    p.add_argument("--swift-dir", type=Path, default=None, help="Swift's directory: *.ring.gz and proxy-server.conf")
    p.add_argument("--proxy-config", type=Path, default=None, help="the proxy-server.conf (bind_ip/bind_port)")
    p.add_argument("--swift-log", dest="swift_logs", action="append", type=Path, default=[], metavar="FILE",
                   help="a Swift server's access log (proxy or storage): transaction ids for the joins "
                        "when the captures' snap length cut the headers; repeat per file (not with --live)")
    p.add_argument("--clock-window", type=_duration, default=1.0, metavar="DURATION",
                   help="window of each clock offset estimate (default 1s)")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``swift-timing`` with its subcommands ``analyze``, ``diagram`` and ``serve``."""
    p = subparsers.add_parser(COMMAND, help="Swift packet timing: per-hop transit and per-node processing from captures",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="swift_command", required=True)
    a = sub.add_parser("analyze", help="analyse capture files, print the breakdown (JSON) or the metrics")
    _common(a)
    a.add_argument("--json", dest="json_out", default="-", help="write the summary here (default: stdout)")
    a.add_argument("--metrics", action="store_true", help="print the Prometheus exposition instead of JSON")
    a.set_defaults(func=cmd_analyze)
    d = sub.add_parser("diagram", help="draw a timing diagram (PNG/SVG) of one request or a time window")
    _common(d)
    d.add_argument("--out", required=True, type=Path, help="output file, .png or .svg")
    g = d.add_mutually_exclusive_group()
    g.add_argument("--trans-id", default=None, help="the request's Swift transaction id (X-Trans-Id)")
    g.add_argument("--request-index", type=int, default=None, help="the N-th request the proxy answered (from 0)")
    g.add_argument("--window", default=None, metavar="START,END", help="epoch seconds, reference node's clock")
    d.add_argument("--no-acks", action="store_true", help="leave pure ACKs out")
    d.set_defaults(func=cmd_diagram)
    s = sub.add_parser("serve", help="serve /metrics from capture files (once) or live tcpdump streams")
    # `--grace -1s` is a value, not an option: argparse takes "-1s" for one (only "-1" and "-1.5"
    # look like numbers to it) and said "expected one argument"; this way ``serve`` itself
    # answers "--grace: cannot be negative". (No option of ``serve`` starts with a digit.)
    s._negative_number_matcher = re.compile(r"^-\.?\d[\w.]*$")
    _common(s)
    s.add_argument("--live", action="append", default=[], metavar="NODE=IFACE[@NETNS]",
                   help="run tcpdump on IFACE (in network namespace NETNS); NODE=- reads a pcap stream on stdin")
    s.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:9315",
                   help="where /metrics is served (default 127.0.0.1:9315)")
    s.add_argument("--web.token-file", dest="token_file", type=Path, default=None,
                   help="bearer token required on every request (mandatory beyond loopback)")
    s.add_argument("--interval", type=_signed_duration, default=5.0, metavar="DURATION", help="live: analysis interval")
    s.add_argument("--grace", type=_signed_duration, default=2.0, metavar="DURATION",
                   help="live: how far behind the slowest capture a window ends")
    s.add_argument("--keep", type=_signed_duration, default=30.0, metavar="DURATION",
                   help="live: segments kept for matching (longest request counted)")
    s.add_argument("--snaplen", type=int, default=512, help="live: tcpdump snap length (X-Trans-Id needs ~400+)")
    s.add_argument("--threshold.node-processing", dest="node_threshold", type=_duration, default=0.25,
                   metavar="DURATION", help="published as promreflex_swift_node_processing_threshold_seconds "
                                            "(SwiftNodeSlow compares each node's p99 with it; default 250ms)")
    s.add_argument("--threshold.hop-transit", dest="hop_threshold", type=_duration, default=0.005,
                   metavar="DURATION", help="published as promreflex_swift_hop_transit_threshold_seconds "
                                            "(SwiftHopSlow; default 5ms)")
    s.set_defaults(func=cmd_serve)
    return p


def _roles(args: argparse.Namespace) -> RoleMap:
    return load_roles(mapping=args.roles, swift_dir=args.swift_dir, proxy_config=args.proxy_config)


def _check_captures(args: argparse.Namespace) -> dict[str, list[Path]]:
    """Each node's capture files: a node given again is another file of its capture (``tcpdump
    -C``/``-G`` rotation, a ring buffer), read in the order of their first packets."""
    if not args.captures:
        raise UserError("give at least one --capture NODE=FILE")
    caps: dict[str, list[Path]] = {}
    for node, path in args.captures:
        if not path.exists():
            raise UserError(f"--capture {node}={path}: no such file")
        if not path.is_file():
            raise UserError(f"--capture {node}={path}: not a regular file (a FIFO, directory or device); "
                            "copy it to a file first")
        same = next((n for n, ps in caps.items() for p in ps if p.samefile(path)), None)
        if same == node:
            raise UserError(f"--capture {node}={path}: given twice for node {node}")
        if same is not None:  # every segment would match itself: 0 us transits
            raise UserError(f"--capture {node}={path}: the same file as node {same}'s")
        caps.setdefault(node, []).append(path)
    return caps


def _read_rotated(node: str, paths: list[Path]) -> tuple[Any, Any]:
    """One node's capture from several files (a rotated capture): the files in the order of their
    first packets, their counts summed. Files may be given in any order; each is read as a
    capture of its own (a file that is none raises, and the caller names its --capture)."""
    from exporters.swift.analyze import capture_note
    from exporters.swift.pcap import ReadStats, Segments, read_capture

    parts, total = [], ReadStats()
    for path in paths:
        segs, stats = read_capture(path)
        total.add(stats)
        if note := capture_note(f"{node} ({path.name})", stats):
            print(f"promreflex {COMMAND}: {note}", file=sys.stderr)
        if len(segs):
            parts.append(segs)
    # Files in the order of their first packets; each file's own order is kept (the packets'
    # capture order is what tells a clock stepped back from reordered packets: not sorted)
    return Segments.concat(sorted(parts, key=lambda x: int(x.ts[0]))), total


def _analyze(args: argparse.Namespace) -> Any:
    from exporters.swift.analyze import analyze
    from exporters.swift.pcap import CaptureError
    from exporters.swift.swiftlogs import SwiftLogError

    caps = _check_captures(args)
    for log in args.swift_logs:
        if not log.is_file():
            raise UserError(f"--swift-log {log}: " + ("no such file" if not log.exists() else "not a regular file"))
    captures: dict[str, Any] = {}
    read_stats = {}
    try:
        for node, paths in caps.items():  # (in the order given)
            if len(paths) == 1:
                captures[node] = paths[0]
                continue
            captures[node], read_stats[node] = _read_rotated(node, paths)
            if not read_stats[node].segments:
                print(f"promreflex {COMMAND}: capture of {node}: 0 TCP segments in its {len(paths)} files", file=sys.stderr)
        b = analyze(captures, _roles(args), window_s=args.clock_window, logs=args.swift_logs, read_stats=read_stats)
    except SwiftLogError as e:
        raise UserError(f"--swift-log {e.path}: {e.reason}") from None
    except CaptureError as e:  # name the --capture (node and file) that is not a capture
        who = next((n for n, ps in caps.items() for p in ps if e.path is not None and str(p) == str(e.path)), None)
        if who is None:
            raise UserError(str(e)) from e
        raise UserError(f"--capture {who}={e.path}: not a pcap or pcapng capture ({e.reason})") from e
    except OSError as e:
        raise UserError(f"cannot read {e.filename or 'a capture'}: {e.strerror or e}") from e
    for note in b.notes:  # a --swift-log that gave nothing: said, not silent
        print(f"promreflex {COMMAND}: {note}", file=sys.stderr)
    return b


def _check_out(flag: str, path: Path) -> None:
    """Fail before the analysis when its result could not be written."""
    import os
    parent = path.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: directory {parent} is not writable")


def _window(text: str) -> tuple[float, float]:
    """``START,END`` in epoch seconds: finite, START < END, between 1970 and 2116."""
    import math

    from exporters.swift.pcap import MAX_TS
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--window {text!r}: START,END in epoch seconds") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi <= MAX_TS / 1e9):
        raise UserError(f"--window {text!r}: START,END in epoch seconds, START < END (finite, 1970 to 2116)")
    return lo, hi


def cmd_analyze(args: argparse.Namespace) -> int:
    if args.json_out != "-" and not args.metrics:
        _check_out("--json", Path(args.json_out))
    b = _analyze(args)
    if args.metrics:
        from exporters.swift.metrics import SwiftTimingCollector

        reg = CollectorRegistry()
        SwiftTimingCollector(b.nodes, registry=reg).add(b)
        sys.stdout.write(generate_latest(reg).decode())
        return 0
    text = json.dumps(b.summary(), indent=1, sort_keys=False)
    if args.json_out == "-":
        print(text)
    else:
        try:
            Path(args.json_out).write_text(text + "\n")
        except OSError as e:
            raise UserError(f"--json {args.json_out}: {e.strerror or e}") from None
    return 0


def cmd_diagram(args: argparse.Namespace) -> int:
    from exporters.swift.diagram import draw

    if args.out.suffix.lower() not in (".png", ".svg"):
        raise UserError(f"--out {args.out}: .png or .svg")
    _check_out("--out", args.out)
    window = _window(args.window) if args.window else None
    b = _analyze(args)
    drawn = draw(b, args.out, trans_id=args.trans_id, index=args.request_index, window=window, acks=not args.no_acks)
    print(f"{args.out}: {drawn['segments']} segments, {drawn['exchanges']} exchanges")
    return 0


def _token_middleware(token: str) -> Any:
    from aiohttp import web

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization", "") != f"Bearer {token}":
            return web.Response(status=401, text="a bearer token is required\n")
        return await handler(request)

    return check


def cmd_serve(args: argparse.Namespace) -> int:
    from promreflex.httpd import read_token_file

    if bool(args.captures) == bool(args.live):
        raise UserError("give either --capture NODE=FILE ... (analysed once) or --live NODE=IFACE[@NETNS] ...")
    if args.live and args.swift_logs:
        raise UserError("--swift-log: not read with --live (only with --capture): leave it out")
    try:
        host, _ = split_host_port(args.listen_address)
    except ValueError as e:
        raise UserError(f"--web.listen-address: {e}") from None
    token = read_token_file(args.token_file, "--web.token-file")
    if not is_loopback(host) and not token:
        raise UserError(f"--web.listen-address {args.listen_address} is beyond loopback: give --web.token-file")
    sources = _check_live(args)
    roles = _roles(args)
    setup_logging()
    return asyncio.run(_serve(args, roles, token, sources))


def _check_live(args: argparse.Namespace) -> list[LiveSource]:
    """The ``--live`` sources, checked before anything is served; the live durations."""
    from exporters.swift.live import LiveSource, missing_tools

    for name, value in (("--interval", args.interval), ("--keep", args.keep)):
        if not value > 0:
            raise UserError(f"{name}: must be above 0")
    if not args.grace >= 0:
        raise UserError("--grace: cannot be negative")
    sources = [LiveSource.parse(v) for v in args.live]
    if sum(1 for s in sources if s.interface is None) > 1:
        raise UserError("--live NODE=-: only one node can read standard input")
    seen: set[str] = set()
    for s in sources:
        if s.node in seen:
            raise UserError(f"--live: node {s.node!r} given twice")
        seen.add(s.node)
    if missing := missing_tools(sources):
        raise UserError(f"--live needs {' and '.join(missing)}: not found on PATH")
    return sources


async def _serve(args: argparse.Namespace, roles: RoleMap, token: str, sources: list[LiveSource]) -> int:
    from prometheus_client import REGISTRY

    from exporters.swift.live import LiveAnalyzer, StreamHealth, run_live
    from exporters.swift.metrics import SwiftTimingCollector
    from promreflex.httpd import metrics_app, serving, stop_on_signals

    stop = stop_on_signals()
    app = metrics_app(REGISTRY, "promreflex swift packet timing")
    if token:
        app.middlewares.append(_token_middleware(token))
    nodes = [s.node for s in sources] or [n for n, _ in args.captures]
    collector = SwiftTimingCollector(nodes, registry=REGISTRY, node_threshold_s=args.node_threshold,
                                     hop_threshold_s=args.hop_threshold)
    try:
        async with serving(args.listen_address, app):
            log.info("serving /metrics on http://%s/metrics", args.listen_address)
            if args.captures:
                t0 = time.perf_counter()
                b = await asyncio.to_thread(_analyze, args)
                collector.add(b, time.perf_counter() - t0)
                log.info("analysed %d captures: %d segments matched", len(b.nodes), len(b.matches))
                await stop.wait()
            else:
                live = LiveAnalyzer(nodes, roles, collector, grace_s=args.grace, keep_s=args.keep,
                                    window_s=args.clock_window)
                health = StreamHealth(nodes, registry=REGISTRY)
                await run_live(sources, live, stop, interval_s=args.interval, snaplen=args.snaplen, health=health)
                await stop.wait()
    except OSError as e:
        raise UserError(f"cannot listen on {args.listen_address}: {e.strerror or e}") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.swift", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    register(sub)
    args = parser.parse_args([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"promreflex {COMMAND}: {e}", file=sys.stderr)
        return 1
