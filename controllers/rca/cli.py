"""``promreflex rca``: ``offline PATH`` analyses recorded metrics (RCAEval/RCD CSVs, MicroRCA
folders, or a range of a live Prometheus), ``eval DATASET`` scores a folder of fault cases,
``analyse`` asks a Prometheus server (the mesh rules' recorded series) once, ``explain`` prints the chain of
reasoning of the latest report (the online controller's ``rca`` action writes it).

:func:`register` adds the subcommand to an argparse parser; each handler is stored as
``args.func`` and returns the exit status (0 ok, 1 nothing to show, 2 unusable input).
``rca eval`` lists a case it cannot read as an error (path and reason), leaves it out of the
figures and goes on; it exits with 2 only when no case could be read at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from controllers.rca.presets import DEFAULT_REPORT, MESH_QUERIES
from promreflex.config import parse_duration

if TYPE_CHECKING:
    from controllers.rca.models import Finding
    from controllers.rca.offline import OfflineOptions
    from controllers.rca.tabular import TableOptions


def _seconds(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value <= 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _time(text: str) -> float:
    from controllers.rca.offline import OfflineDataError, _timestamp

    try:
        return _timestamp(text, "time")
    except OfflineDataError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _table_options(args: argparse.Namespace) -> TableOptions:
    from controllers.rca.tabular import TableOptions, parse_mapping

    unit = {} if args.latency_unit is None else {"latency_unit_s": args.latency_unit}
    return TableOptions(column_map=parse_mapping(args.map or []), **unit)


def _microrca_options(args: argparse.Namespace) -> OfflineOptions:
    """The flags that apply to a MicroRCA folder (its latencies are in ms unless
    ``--latency-unit`` says otherwise); ``--map`` is for tables, and refused here."""
    from controllers.rca.offline import OfflineDataError, OfflineOptions

    if args.map:
        raise OfflineDataError("--map applies to tables (RCD, RCAEval), not to a MicroRCA folder, "
                               "whose columns are edges and the collector's ctn_* series")
    return OfflineOptions() if args.latency_unit is None else OfflineOptions(latency_unit_s=args.latency_unit)


def _offline(args: argparse.Namespace) -> int:
    from controllers.rca.engine import analyse
    from controllers.rca.models import AnalysisConfig
    from controllers.rca.offline import OfflineDataError, analyse_dir
    from controllers.rca.tabular import is_table_case, load_case, read_graph

    try:
        if args.prometheus_url:
            return _offline_prometheus(args)
        if not args.path:
            print("rca offline: give a PATH or --prometheus.url with --start and --end", file=sys.stderr)
            return 2
        path = Path(args.path)
        graph = read_graph(args.graph) if args.graph else None
        if is_table_case(path):
            data = load_case(path, inject_time=args.inject_time, graph=graph, options=_table_options(args))
            finding = analyse(data, AnalysisConfig(threshold_s=args.threshold))
        else:
            finding = analyse_dir(path, threshold=args.threshold, options=_microrca_options(args),
                                  inject_time=args.inject_time)
    except OfflineDataError as e:
        print(f"rca offline: {e}", file=sys.stderr)
        return 2
    return _show(finding, args)


def _offline_prometheus(args: argparse.Namespace) -> int:
    import asyncio

    from controllers.rca.models import AnalysisConfig
    from controllers.rca.promsource import PromSourceConfig, PromSourceError, analyse_range

    if args.start is None or args.end is None or not args.start < args.end:
        print("rca offline: --prometheus.url needs --start before --end", file=sys.stderr)
        return 2
    if args.inject_time is not None and not args.start < args.inject_time < args.end:
        print("rca offline: --inject-time must lie between --start and --end", file=sys.stderr)
        return 2
    source = PromSourceConfig.model_validate({
        "queries": {**MESH_QUERIES, "resources": args.resources}, "step": args.step,
    })
    try:
        finding = asyncio.run(analyse_range(
            args.prometheus_url, source, AnalysisConfig(threshold_s=args.threshold),
            start=args.start, end=args.end, inject_time=args.inject_time,
        ))
    except PromSourceError as e:
        print(f"rca offline: {e}", file=sys.stderr)
        return 2
    return _show(finding, args)


def _eval(args: argparse.Namespace) -> int:
    from controllers.rca import evaluate
    from controllers.rca.offline import OfflineDataError
    from controllers.rca.tabular import read_graph

    errors: list[evaluate.CaseError] = []
    try:
        graph = read_graph(args.graph) if args.graph else None
        results = evaluate.run(
            args.dataset, graph=graph, options=_table_options(args), use_split=not args.no_split, errors=errors,
            microrca=None if args.map else _microrca_options(args),
        )
    except OfflineDataError as e:
        print(f"rca eval: {e}", file=sys.stderr)
        return 2
    if args.json or not results:
        for err in errors:
            print(f"rca eval: {err.case}: error, not scored: {err.reason}", file=sys.stderr)
    if not results:
        print(f"rca eval: none of the {len(errors)} case(s) could be read", file=sys.stderr)
        return 2
    summary = evaluate.summary(results, errors)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for r in results:
            line = f"{r.case:<28} truth {r.service:<14} rank {r.rank if r.rank is not None else '-':<3} top {', '.join(r.top[:3])}"
            print(f"{line}  ({r.note})" if r.note else line)
        for err in errors:
            print(f"{err.case:<28} error ({err.path}): {err.reason}")
        print()
        print(evaluate.table(summary))
        if errors:
            print(f"\n{len(errors)} case(s) could not be read and are not in the figures.")
        strangers = [r for r in results if r.note is not None and "is not a service in the data" in r.note]
        if strangers:
            print(f"\n{len(strangers)} case(s) name a truth that is not a service in the data (rank -, a miss in "
                  "the figures): check their folder names against the services the data names.")
        print(f"\npublished: {summary['published']} (another system's figures are not comparable)")
    if args.out:
        mode = "split withheld, start found by change point" if args.no_split else "baseline split as given"
        js, png = evaluate.write(summary, results, args.out, title=f"rca eval {Path(args.dataset).name} ({mode})")
        print(f"wrote {js} and {png}", file=sys.stderr)
    return 0


def _analyse(args: argparse.Namespace) -> int:
    import asyncio

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


def _show(finding: Finding, args: argparse.Namespace) -> int:
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


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", metavar="CSV", help="call graph, source,destination rows (optional)")
    p.add_argument("--map", action="append", metavar="PATTERN=KIND",
                   help="metric-name pattern -> latency, cpu, memory, disk_io, network, errors or ignore "
                        "(repeatable; tried before the built-in patterns)")
    p.add_argument("--latency-unit", dest="latency_unit", type=_seconds, default=None, metavar="DURATION",
                   help="unit of latency columns whose names do not say it: 1s, 1ms "
                        "(default: 1s in tables, 1ms in MicroRCA folders, as their collectors write them)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rca offline``, ``rca eval``, ``rca analyse`` and ``rca explain`` to a CLI's subcommands."""
    from controllers.rca.promsource import RESOURCE_PRESETS

    rca = subparsers.add_parser("rca", help="root-cause analysis of slow services")
    sub = rca.add_subparsers(dest="rca_command", metavar="{offline,eval,analyse,explain}")
    sub.required = True

    off = sub.add_parser("offline", help="analyse recorded metrics: RCAEval/RCD CSVs, MicroRCA folders, a Prometheus range")
    off.add_argument("path", nargs="?", metavar="PATH",
                     help="a CSV (time + <service>_<metric> columns), a folder with normal.csv + anomalous.csv "
                          "or data.csv / simple_metrics.csv / metrics.csv [+ inject_time.txt], or a MicroRCA folder "
                          "(*_mpg.csv, *_latency_*.csv)")
    off.add_argument("--inject-time", dest="inject_time", type=_time, metavar="TIME",
                     help="when the anomaly started (unix time or ISO; must lie within the data's time range, "
                          "a factor of 1000 is undone with a note); default: found by change-point detection")
    off.add_argument("--prometheus.url", dest="prometheus_url", metavar="URL",
                     help="read --start..--end from this Prometheus instead of files (the live action's queries)")
    off.add_argument("--start", type=_time, metavar="TIME", help="range start for --prometheus.url")
    off.add_argument("--end", type=_time, metavar="TIME", help="range end for --prometheus.url")
    off.add_argument("--step", type=_seconds, default=15.0, metavar="DURATION",
                     help="range query step for --prometheus.url (default 15s)")
    off.add_argument("--resources", choices=sorted(RESOURCE_PRESETS), default="cadvisor",
                     help="resource queries for --prometheus.url (default cadvisor)")
    _add_table_flags(off)
    off.add_argument("--threshold", type=_seconds, default=3.0, metavar="SECONDS",
                     help="absolute latency line (evidence, not a gate): 3, 3s, 500ms (default 3s)")
    off.add_argument("--json", action="store_true", help="print the finding as JSON")
    off.add_argument("--save", metavar="FILE", help="also write the finding as a JSON report")
    off.set_defaults(func=_offline)

    ev = sub.add_parser("eval", help="run a folder of fault cases and print AC@1, AC@3, Avg@5 per fault kind")
    ev.add_argument("dataset", metavar="DATASET",
                    help="folder of cases named <service>-<fault>[/<run>] (RCD, RCAEval), or a root of such "
                         "folders per system (RE1/RE1-TT/...), holding either layout")
    _add_table_flags(ev)
    ev.add_argument("--no-split", dest="no_split", action="store_true",
                    help="withhold the normal/anomalous split and inject times: the start must be found")
    ev.add_argument("--out", metavar="DIR", help="write summary.json and ranks.png (a plot of the ranks) there")
    ev.add_argument("--json", action="store_true", help="print the summary as JSON")
    ev.set_defaults(func=_eval)

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
