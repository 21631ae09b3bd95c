"""Offline mode: analyse a folder of MicroRCA-style metric CSVs.

The layout is the one MicroRCA's collector writes (elastisys/MicroRCA, ``MicroRCA_online.py``),
all files sharing one prefix:

- ``<prefix>_mpg.csv``: ``source,destination[,weight]``. Service -> service rows are calls;
  service -> node rows say where a container runs. A node that never calls anything and has
  neither latency nor resource data is taken as a host, not a service.
- ``<prefix>_latency_*.csv``: ``timestamp`` plus one column per call edge, ``caller_callee``,
  in milliseconds (the collector multiplies Istio's seconds by 1000). ``destination`` files
  are measured by the callee's sidecar (the service's own time); ``source`` files add the
  network and the caller's sidecar. Per edge the first file in ``latency_preference`` wins.
  Edges to TCP-only services (databases, RabbitMQ) carry no HTTP durations: the collector
  overwrites those columns with ``istio_tcp_sent_bytes_total`` byte rates, so they are skipped
  (``throughput_callee``), exactly the columns MicroRCA itself leaves out.
- ``<prefix>_<service>.csv``: ``timestamp,ctn_cpu,ctn_network,ctn_memory,node_*`` resource
  series of one service. ``ctn_cpu`` is ``rate(container_cpu_usage_seconds_total[1m])``
  (cores) and is scored as CPU. ``ctn_network`` is the transmitted-packet rate squared
  (``rate(...packets_total[1m]) / 1000 * rate(...) / 1000``): its square root is scored as
  network. ``ctn_memory`` is NOT scored: the collector writes
  ``rate(container_memory_working_set_bytes[1m]) / 1000``, the rate of a gauge. ``rate()``
  takes every fall of its input for a counter reset and counts the whole new value as growth,
  so when a container frees memory the column jumps to about (working set / 60 s) for the
  next minute: it reads a release of memory as a huge rise and cannot tell it from a leak.
  Scored, it outranks any real signal whenever some container's working set shrinks (on
  MicroRCA's published Sock Shop folder: user's column goes from 0.5 to 2,700 while carts,
  the faulty service, is slowed; the last set before this rule named user). The note in the
  report says so; ``OfflineOptions.resource_columns`` can add it back.

The analysis never reads the prefix (which in the published data names the injected fault;
``rca eval`` takes its truth from it) for meaning:
a service's latency is the element-wise maximum over the edges it receives, and the file name
of a resource series is only matched against service names the graph and latency files
already gave.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from datetime import datetime, UTC
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from controllers.rca.engine import analyse
from controllers.rca.models import AnalysisConfig, AnalysisInput, Finding, LatencyStats, Resource, ServiceData, TimeSeries


class OfflineDataError(ValueError):
    """The folder cannot be analysed (no graph file, a file without its required columns)."""


class OfflineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_unit_s: float = Field(default=0.001, gt=0)
    latency_preference: list[str] = ["latency_destination", "latency_source"]
    # Sock Shop's databases (``carts-db``) and RabbitMQ, and the stores of other demo shops
    # (Online Boutique's ``redis-cart``): TCP, not HTTP, so their columns are byte rates.
    throughput_callee: str = (
        r"(?:^|[-_])(?:db|redis|memcached|mongo(?:db)?|mysql|mariadb|postgres(?:ql)?|cassandra|rabbitmq|kafka"
        r"|zookeeper)(?:$|[-_])"
    )
    resource_columns: dict[Resource, str] = {"cpu": "ctn_cpu", "network": "ctn_network", "disk_io": "ctn_disk_io"}
    # Columns the collector squared: their square root is the measurement (ctn_network).
    squared_columns: tuple[str, ...] = ("ctn_network",)
    # Columns present but not scored, and why (the reason goes into the report's notes).
    unscored_columns: dict[str, str] = {
        "ctn_memory": "it is rate(container_memory_working_set_bytes[1m]) / 1000, the rate of a gauge: rate() "
                      "reads every fall of the working set as a counter reset, so memory being freed shows as a "
                      "jump to about (working set / 60 s); it cannot tell a release from a leak",
    }
    # The collector's units, not base units: ctn_cpu is cores, ctn_network (after the square
    # root) thousands of packets a second. The floors follow them.
    resource_scale_floor: dict[Resource, float] = {"cpu": 0.001, "memory": 1.0, "disk_io": 1.0, "network": 0.001}


class _Notes:
    """Counted rejections: bad cells are skipped, counted per file and said in the explanation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.bad_cells: dict[str, int] = defaultdict(int)

    def finish(self) -> list[str]:
        for name, n in sorted(self.bad_cells.items()):
            self.lines.append(f"{name}: skipped {n} cell(s) that were not numbers.")
        return self.lines


def _unique(names: list[str]) -> list[str]:
    """Header names made unique as pandas does: a repeated ``x`` becomes ``x.1``, ``x.2``..."""
    taken = set(names)
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        if k == 0:
            out.append(n)
            continue
        while f"{n}.{k}" in taken:  # (time,time,time.1: the second time is time.2)
            k += 1
        taken.add(f"{n}.{k}")
        seen[n] = k + 1
        out.append(f"{n}.{k}")
    return out


def _read(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows) of a CSV, cells stripped. Read as ``utf-8-sig`` (a byte-order mark does
    not become part of the first column's name). Cells beyond the header (a row ending with a
    comma, which ``csv.DictReader`` keeps under the key ``None``) are ignored; a short row's
    missing cells are empty. A name the header repeats keeps its first column; the later ones are
    named as pandas names them (``time.1``), which RCAEval's loaders drop (``csv.DictReader`` kept
    the last: a second ``time`` column became the clock). Errors name the file's full path."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            # the header is the first line that is not blank (pandas' skip_blank_lines)
            first = next((row for row in reader if any(cell.strip() for cell in row)), [])
            header = _unique([h.strip() for h in first])
            rows = [{k: (row[i].strip() if i < len(row) else "") for i, k in enumerate(header)} for row in reader
                    if any(cell.strip() for cell in row)]  # a blank line is no row (DictReader, pandas)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise OfflineDataError(f"{path}: cannot read as CSV: {e}") from e
    missing = [c for c in required if c not in header]
    if missing:
        raise OfflineDataError(f"{path}: missing column(s) {', '.join(missing)} (has: {', '.join(header)})")
    return header, rows


def _timestamp(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        ts = datetime.fromisoformat(text)
    except ValueError as e:
        raise OfflineDataError(f"{where}: {text!r} is neither a unix time nor an ISO date") from e
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp()


def _check_inject(inject_time: float, times: list[float], path: Path) -> tuple[float, str | None]:
    """The inject time to use and a note when it was rescaled. It must lie within the data's
    time range; a factor of 1000 (seconds against milliseconds) is detected and undone."""
    lo, hi = min(times), max(times)
    if lo <= inject_time <= hi:
        return _rows_around(inject_time, times, path), None
    for scaled, how in ((inject_time * 1000, "times 1000 (seconds against milliseconds)"),
                        (inject_time / 1000, "divided by 1000 (milliseconds against seconds)")):
        if lo <= scaled <= hi:
            return _rows_around(scaled, times, path), (
                f"The inject time {inject_time:.0f} lies outside the data's time range "
                f"[{lo:.0f}, {hi:.0f}]; {how} it lies inside, so t={scaled:.0f} is used."
            )
    raise OfflineDataError(
        f"{path}: the inject time {inject_time:.3f} lies outside the data's time range [{lo:.3f}, {hi:.3f}] "
        "(also times 1000 and divided by 1000): check the units (seconds or milliseconds) and the time zone "
        "of both (a naive ISO time is read as UTC)"
    )


#: Rows an inject time must leave before it (the engine's ``min_baseline_points``) and after it:
#: with fewer, every series would be scored against its whole window, the fault included.
MIN_ROWS_BEFORE, MIN_ROWS_AFTER = 3, 1


def _rows_around(inject_time: float, times: list[float], path: Path) -> float:
    """``inject_time``, refused when it leaves too few rows on either side (on the first or the
    last row: nothing to compare the fault with, or no fault to score)."""
    before = len({t for t in times if t <= inject_time})
    after = len({t for t in times if t > inject_time})
    if before < MIN_ROWS_BEFORE or after < MIN_ROWS_AFTER:
        raise OfflineDataError(
            f"{path}: the inject time {inject_time:.3f} leaves {before} row(s) before it and {after} after it; "
            f"at least {MIN_ROWS_BEFORE} before (the baseline) and {MIN_ROWS_AFTER} after (the fault) are needed"
        )
    return inject_time


def _series(path: Path, rows: list[dict[str, str]], column: str, unit: float, notes: _Notes) -> TimeSeries:
    points = []
    for line, row in enumerate(rows, 2):
        cell = row.get(column, "")
        if cell == "":
            continue
        try:
            value = float(cell)
        except ValueError:
            notes.bad_cells[path.name] += 1
            continue
        points.append((_timestamp(row["timestamp"], f"{path}:{line}"), value * unit))
    return TimeSeries(points=points)


def _split_edge(column: str, known: set[str]) -> tuple[str, str] | None:
    """``front-end_carts`` -> (front-end, carts). Names may hold ``_`` themselves, so the split
    whose both halves are known services wins; a single ``_`` is accepted as is."""
    cuts = [i for i, ch in enumerate(column) if ch == "_"]
    for i in cuts:
        a, b = column[:i], column[i + 1:]
        if a in known and b in known:
            return a, b
    if len(cuts) == 1 and 0 < cuts[0] < len(column) - 1:
        return column[:cuts[0]], column[cuts[0] + 1:]
    return None


def load_dir(path: str | Path, options: OfflineOptions | None = None, *, inject_time: float | None = None) -> AnalysisInput:
    """Read a MicroRCA-style folder into analysis inputs (see the module docstring); with
    ``inject_time`` the rows up to it are the baseline (checked as a table's inject time is)."""
    opts = options or OfflineOptions()
    folder = Path(path)
    if not folder.is_dir():
        raise OfflineDataError(f"{folder}: not a folder")
    files = sorted(folder.glob("*.csv"))
    graphs = [f for f in files if f.stem == "mpg" or f.stem.endswith("_mpg")]
    if len(graphs) != 1:
        raise OfflineDataError(
            f"{folder}: expected one *_mpg.csv dependency file (one MicroRCA case per folder: move each prefix's "
            f"files into a folder of its own), found {len(graphs)}; "
            "a table case is a CSV file or a folder with normal.csv + anomalous.csv, data.csv, "
            "simple_data.csv, simple_metrics.csv or metrics.csv"
        )
    notes = _Notes()
    graph = graphs[0]
    # The files of the case share the graph file's prefix, which names the fault in the published
    # data (``svc_latency_carts_mpg.csv``: "latency" is in every name): only the part after it says
    # what a file holds (``latency_source_50``, ``carts``).
    prefix = graph.stem[: -len("mpg")]
    own = {f: f.stem[len(prefix):] for f in files if f != graph and f.stem.startswith(prefix)}
    foreign = [f.name for f in files if f != graph and f not in own]
    if foreign:
        notes.lines.append(f"Files without the graph file's prefix {prefix!r}, skipped: {', '.join(foreign)}.")

    _, graph_rows = _read(graph, ("source", "destination"))
    raw_edges = [(r["source"], r["destination"]) for r in graph_rows if r["source"] and r["destination"]]

    latency_files = [f for f, part in own.items() if part.startswith("latency")]
    rank = {p: i for i, p in enumerate(opts.latency_preference)}
    latency_files.sort(key=lambda f: (min((rank[p] for p in rank if own[f].startswith(p)), default=len(rank)), f.name))
    tables = {f: _read(f, ("timestamp",)) for f in latency_files}

    known = {n for e in raw_edges for n in e}
    callers = {a for a, _ in raw_edges}
    named_in_latency: set[str] = set()
    edge_columns: dict[tuple[str, str], tuple[Path, list[dict[str, str]], str]] = {}
    unparsed: list[str] = []
    for f, (header, rows) in tables.items():
        for col in header:
            if col in ("", "timestamp") or col.startswith("Unnamed"):
                continue
            edge = _split_edge(col, known)
            if edge is None:
                unparsed.append(f"{f.name}:{col}")
                continue
            named_in_latency.update(edge)
            edge_columns.setdefault(edge, (f, rows, col))
    if unparsed:
        notes.lines.append(f"Columns not of the form caller_callee, skipped: {', '.join(unparsed)}.")

    resource_files = [f for f in own if f not in tables]
    services_seen = callers | named_in_latency
    resource_of: dict[str, Path] = {}
    for f in resource_files:
        parts = own[f].split("_")
        suffixes = ["_".join(parts[i:]) for i in range(len(parts))]
        match = next((s for s in suffixes if s in services_seen or s in known), None)
        if match is None:
            notes.lines.append(f"{f.name}: no service of the graph matches the file name, skipped.")
            continue
        resource_of[match] = f
    services_seen |= set(resource_of)
    hosts = sorted(known - services_seen)
    if hosts:
        notes.lines.append(f"Treated as hosts (placement, not calls): {', '.join(hosts)}.")
    edges = sorted({(a, b) for a, b in raw_edges if a in services_seen and b in services_seen})

    throughput = re.compile(opts.throughput_callee)
    skipped_tcp = sorted(f"{a}_{b}" for a, b in edge_columns if throughput.search(b))
    if skipped_tcp:
        notes.lines.append(
            "Latency columns of TCP-only callees hold byte rates in MicroRCA's collector, not "
            f"durations, skipped: {', '.join(skipped_tcp)}."
        )
    incoming: dict[str, list[TimeSeries]] = defaultdict(list)
    for (_, b), (f, rows, col) in sorted(edge_columns.items()):
        if not throughput.search(b):
            incoming[b].append(_series(f, rows, col, opts.latency_unit_s, notes))

    data: dict[str, ServiceData] = {}
    unscored: set[str] = set()
    for svc in sorted(services_seen):
        latency = None
        if svc in incoming:
            latency = LatencyStats(series=TimeSeries.max_of(incoming[svc]))
        resources: dict[Resource, TimeSeries] = {}
        if svc in resource_of:
            f = resource_of[svc]
            header, rows = _read(f, ("timestamp",))
            for res, col in opts.resource_columns.items():
                if col in header:
                    series = _series(f, rows, col, 1.0, notes)
                    if col in opts.squared_columns:
                        series = TimeSeries(points=[(t, math.sqrt(v)) for t, v in series.points if v >= 0])
                    resources[res] = series
            unscored |= {c for c in opts.unscored_columns if c in header and c not in opts.resource_columns.values()}
        data[svc] = ServiceData(latency=latency, resources=resources)
    for col in sorted(unscored):
        notes.lines.append(f"{col} is not scored: {opts.unscored_columns[col]}.")
    baseline_end = None
    if inject_time is not None:
        times = sorted({t for d in data.values() for _, x in d.named_series() for t, _ in x.points})
        if not times:
            raise OfflineDataError(f"{folder}: no samples to place the inject time in")
        baseline_end, rescaled = _check_inject(inject_time, times, folder)
        if rescaled:
            notes.lines.append(rescaled)
        notes.lines.append(f"Baseline: the rows before the inject time t={baseline_end:.0f}.")
    return AnalysisInput(edges=edges, services=data, source=str(folder), notes=notes.finish(), baseline_end=baseline_end)


def microrca_config(options: OfflineOptions | None = None, config: AnalysisConfig | None = None) -> AnalysisConfig:
    """The analysis settings for a MicroRCA folder: ``config`` as given, else the resource spread
    floors in the collector's units (``options.resource_scale_floor``): ``rca offline`` and
    ``rca eval`` analyse a folder alike."""
    if config is not None:
        return config
    return AnalysisConfig.model_validate({"resource_scale_floor": (options or OfflineOptions()).resource_scale_floor})


def analyse_dir(
    path: str | Path,
    threshold: float = 3.0,
    *,
    config: AnalysisConfig | None = None,
    options: OfflineOptions | None = None,
    inject_time: float | None = None,
) -> Finding:
    """Analyse a MicroRCA-style folder; ``threshold`` (seconds) is the absolute candidate line.

    Without ``config`` the resource spread floors follow the collector's units
    (``options.resource_scale_floor``); a given ``config`` is used as is, threshold aside."""
    opts = options or OfflineOptions()
    cfg = AnalysisConfig.model_validate({**microrca_config(opts, config).model_dump(), "threshold_s": threshold})
    return analyse(load_dir(path, opts, inject_time=inject_time), cfg)
