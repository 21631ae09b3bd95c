"""``promreflex rca``: ``offline DIR`` analyses a folder of metric CSVs, ``analyse`` asks a
Prometheus server (the mesh rules' recorded series) once, ``explain`` prints the chain of
reasoning of the latest report (the online controller's ``rca`` action writes it).

:func:`register` adds the subcommand to an argparse parser; each handler is stored as
``args.func`` and returns the exit status (0 ok, 1 nothing to show, 2 unusable input).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from promreflex.config import parse_duration

DEFAULT_REPORT = Path(".promreflex/rca/latest.json")


def _seconds(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value <= 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _offline(args: argparse.Namespace) -> int:
    from controllers.rca.offline import OfflineDataError, analyse_dir

    try:
        finding = analyse_dir(args.dir, threshold=args.threshold)
    except OfflineDataError as e:
        print(f"rca offline: {e}", file=sys.stderr)
        return 2
    return _show(finding, args)


def _analyse(args: argparse.Namespace) -> int:
    import asyncio

    from controllers.rca.action import MESH_QUERIES
    from controllers.rca.models import AnalysisConfig
    from controllers.rca.promsource import PromSourceConfig, PromSourceError, analyse_prometheus

    source = PromSourceConfig.model_validate({
        "queries": {**MESH_QUERIES, "resources": args.resources},
        "window": args.window, "baseline": args.baseline, "step": args.step,
    })
    try:
        finding = asyncio.run(analyse_prometheus(args.prometheus_url, source, AnalysisConfig(threshold_s=args.threshold)))
    except PromSourceError as e:
        print(f"rca analyse: {e}", file=sys.stderr)
        return 2
    return _show(finding, args)


def _show(finding, args: argparse.Namespace) -> int:
    if args.save:
        finding.save(args.save)
    if args.json:
        print(finding.to_json())
    else:
        print(finding.table())
        print()
        print(finding.explain())
    return 0


def _explain(args: argparse.Namespace) -> int:
    from controllers.rca.models import Finding

    path = Path(args.report)
    try:
        finding = Finding.load(path)
    except FileNotFoundError:
        print(f"rca explain: no report at {path} (the online analysis writes one when it runs)", file=sys.stderr)
        return 1
    except (OSError, ValueError, ValidationError) as e:
        first = str(e).splitlines()[0]
        print(f"rca explain: {path} is not an RCA report: {first}", file=sys.stderr)
        return 2
    print(finding.explain())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rca offline``, ``rca analyse`` and ``rca explain`` to a CLI's subcommands."""
    from controllers.rca.promsource import RESOURCE_PRESETS

    rca = subparsers.add_parser("rca", help="root-cause analysis of slow services")
    sub = rca.add_subparsers(dest="rca_command", metavar="{offline,analyse,explain}")
    sub.required = True

    off = sub.add_parser("offline", help="analyse a folder of MicroRCA-style metric CSVs")
    off.add_argument("dir", help="folder with *_mpg.csv, *_latency_*.csv and <prefix>_<service>.csv")
    off.add_argument("--threshold", type=_seconds, default=3.0, metavar="SECONDS",
                     help="absolute candidate line: 3, 3s, 500ms (default 3s)")
    off.add_argument("--json", action="store_true", help="print the finding as JSON")
    off.add_argument("--save", metavar="FILE", help="also write the finding as a JSON report")
    off.set_defaults(func=_offline)

    ana = sub.add_parser("analyse", help="analyse once from a Prometheus server (rules/mesh.rules.yml series)")
    ana.add_argument("--prometheus.url", dest="prometheus_url", default="http://127.0.0.1:9090", metavar="URL",
                     help="Prometheus to query (default http://127.0.0.1:9090)")
    ana.add_argument("--threshold", type=_seconds, default=3.0, metavar="SECONDS",
                     help="absolute candidate line: 3, 3s, 500ms (default 3s)")
    ana.add_argument("--resources", choices=sorted(RESOURCE_PRESETS), default="cadvisor",
                     help="resource queries: cAdvisor containers or process-exporter groups (default cadvisor)")
    ana.add_argument("--window", type=_seconds, default=300.0, metavar="DURATION",
                     help="recent window scored against the baseline (default 5m)")
    ana.add_argument("--baseline", type=_seconds, default=900.0, metavar="DURATION",
                     help="baseline before the window (default 15m)")
    ana.add_argument("--step", type=_seconds, default=15.0, metavar="DURATION", help="range query step (default 15s)")
    ana.add_argument("--json", action="store_true", help="print the finding as JSON")
    ana.add_argument("--save", metavar="FILE", help="also write the finding as a JSON report")
    ana.set_defaults(func=_analyse)

    exp = sub.add_parser("explain", help="print the chain of reasoning of the latest report")
    exp.add_argument("--report", default=str(DEFAULT_REPORT), metavar="FILE",
                     help=f"report to read (default {DEFAULT_REPORT})")
    exp.set_defaults(func=_explain)
