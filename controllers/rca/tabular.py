"""Offline input in RCAEval's layout: one CSV, ``time`` then ``<service>_<metric>`` columns.

This is the layout of RCD's recordings (``normal.csv`` and ``anomalous.csv`` of one case) and
of RCAEval's datasets (``data.csv``, with ``inject_time.txt`` beside it). A case is given as:

- a folder holding ``normal.csv`` and ``anomalous.csv``: the normal recording is the baseline
  and the anomalous one is scored against it. They need not be one recording (RCD's lie hours
  apart, sometimes in either order): the normal one is moved in time to end one step before
  the anomalous one starts, so the split falls between them;
- a folder holding ``data.csv`` (and optionally ``inject_time.txt``, unix seconds), or one CSV
  file: the inject time splits it when known; otherwise the engine finds the anomaly's start
  (:mod:`controllers.rca.changepoint`).

Columns are split at the first ``_`` into service and metric (``carts-db_cpu`` -> carts-db,
cpu), and the metric is matched against an ordered list of patterns that say what it measures
(``DEFAULT_COLUMN_MAP``; ``--map PATTERN=KIND`` adds patterns ahead of it, ``KIND`` ``ignore``
drops a column). Load columns (request rates) are not scored: a fault lowers the load of
every service behind the one it slows, so a change in load says where traffic stopped, not
where the fault is. A column whose metric matches no pattern is skipped and named in the
report. A call graph is optional (``source,destination`` CSV, MicroRCA's ``*_mpg.csv`` works).

Units: latency is converted to seconds (``latency_unit_s``); other series are scored as they
are. The spread floors (:class:`~controllers.rca.models.AnalysisConfig`) assume base units
(cores, bytes, bytes/s) beside 5 % of the baseline level, so a mapped column in other units
should be in a base unit too (or its quiet baseline is scored against a floor that is too
large or too small).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from controllers.rca.models import AnalysisInput, Kind, Metric, ServiceData, TimeSeries
from controllers.rca.offline import OfflineDataError, _read, _timestamp

#: metric suffix pattern -> kind (None: not scored). First match wins.
DEFAULT_COLUMN_MAP: list[tuple[str, Kind | None]] = [
    (r"^(lod|load|workload|qps|rps|tps|requests?|throughput)([-_.].*)?$", None),
    (r"^(lat|latency|duration|rt|response[-_]?time)([-_.].*)?$", "latency"),
    (r"^(err|error|errors|error[-_]?rate|5xx|fail(ures?)?)([-_.].*)?$", "errors"),
    (r"^(cpu|container[-_]cpu.*)([-_.].*)?$", "cpu"),
    (r"^(mem|memory|container[-_]memory.*|rss|working[-_]?set)([-_.].*)?$", "memory"),
    (r"^(disk|diskio|disk[-_]io|io|fs|blkio|container[-_]fs.*)([-_.].*)?$", "disk_io"),
    (r"^(net|network|socket|sockets|tx|rx|container[-_]network.*)([-_.].*)?$", "network"),
]
KIND_NAMES = ("latency", "cpu", "memory", "disk_io", "network", "errors", "ignore")


class TableOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    column_map: list[tuple[str, Kind | None]] = DEFAULT_COLUMN_MAP
    latency_unit_s: float = 1.0  # RCD's and RCAEval's latencies are in seconds
    time_column: str = "time"


def parse_mapping(items: list[str]) -> list[tuple[str, Kind | None]]:
    """``PATTERN=KIND`` strings (``--map``) ahead of the defaults."""
    out: list[tuple[str, Kind | None]] = []
    for item in items:
        pattern, sep, kind = item.rpartition("=")
        if not sep or kind not in KIND_NAMES:
            raise OfflineDataError(f"--map {item!r}: use PATTERN=KIND, KIND one of {', '.join(KIND_NAMES)}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise OfflineDataError(f"--map {item!r}: {e}") from e
        out.append((pattern, None if kind == "ignore" else kind))  # type: ignore[arg-type]
    return out + DEFAULT_COLUMN_MAP


def _kind(metric: str, mapping: list[tuple[str, Kind | None]]) -> tuple[bool, Kind | None]:
    for pattern, kind in mapping:
        if re.search(pattern, metric, re.IGNORECASE):
            return True, kind
    return False, None


def _table(path: Path, opts: TableOptions) -> tuple[list[float], dict[str, list[tuple[float, float]]], int]:
    """(times, column -> points, non-numeric cells skipped)."""
    tcol = opts.time_column
    header, rows = _read(path, (tcol,))
    cols: dict[str, list[tuple[float, float]]] = {c: [] for c in header if c and c != tcol and not c.startswith("Unnamed")}
    times: list[float] = []
    bad = 0
    for line, row in enumerate(rows, 2):
        t = _timestamp(row[tcol], f"{path.name}:{line}")
        times.append(t)
        for c, pts in cols.items():
            cell = row.get(c, "")
            if cell == "":
                continue
            try:
                pts.append((t, float(cell)))
            except ValueError:
                bad += 1
    return times, cols, bad


def read_graph(path: str | Path) -> list[tuple[str, str]]:
    """``source,destination`` rows of a CSV (MicroRCA's ``*_mpg.csv`` included)."""
    _, rows = _read(Path(path), ("source", "destination"))
    return sorted({(r["source"], r["destination"]) for r in rows if r["source"] and r["destination"]})


def _step(times: list[float]) -> float:
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return statistics.median(gaps) if gaps else 1.0


def load_table(
    path: str | Path,
    *,
    normal: str | Path | None = None,
    inject_time: float | None = None,
    graph: list[tuple[str, str]] | None = None,
    options: TableOptions | None = None,
) -> AnalysisInput:
    """Read one recording (and optionally its normal recording) into analysis inputs."""
    opts = options or TableOptions()
    path = Path(path)
    times, cols, bad = _table(path, opts)
    if not times:
        raise OfflineDataError(f"{path}: no rows")
    notes: list[str] = []
    baseline_end = inject_time
    if normal is not None:
        ntimes, ncols, nbad = _table(Path(normal), opts)
        bad += nbad
        if ntimes:
            step = _step(times)
            shift = min(times) - step - max(ntimes)
            baseline_end = max(ntimes) + shift
            for c, pts in ncols.items():
                cols.setdefault(c, [])
                cols[c] = [(t + shift, v) for t, v in pts] + cols[c]
            notes.append(
                f"Baseline: {Path(normal).name} ({len(ntimes)} rows), moved to end one step before "
                f"{path.name} starts; {path.name} ({len(times)} rows) is scored against it."
            )
    elif inject_time is not None:
        notes.append(f"Baseline: the rows before the inject time t={inject_time:.0f}.")

    metrics: dict[str, list[Metric]] = defaultdict(list)
    unknown: list[str] = []
    ignored = 0
    for col, pts in cols.items():
        service, sep, metric = col.partition("_")
        if not sep or not service or not metric:
            unknown.append(col)
            continue
        known, kind = _kind(metric, opts.column_map)
        if not known:
            unknown.append(col)
            continue
        metrics.setdefault(service, [])
        if kind is None:
            ignored += 1
            continue
        unit = opts.latency_unit_s if kind == "latency" else 1.0
        metrics[service].append(Metric(kind=kind, name=col, series=TimeSeries(points=[(t, v * unit) for t, v in pts])))
    if unknown:
        notes.append(f"Columns whose metric is not known (see --map), skipped: {', '.join(sorted(unknown))}.")
    if ignored:
        notes.append(f"{ignored} load/throughput column(s) not scored (a fault moves load away from where it is).")
    if bad:
        notes.append(f"Skipped {bad} cell(s) that were not numbers.")
    if graph is None:
        notes.append("No call graph given: services are ranked by their own series only.")
    services = {s: ServiceData(metrics=ms) for s, ms in sorted(metrics.items())}
    return AnalysisInput(edges=graph or [], services=services, baseline_end=baseline_end, source=str(path), notes=notes)


def is_table_case(path: Path) -> bool:
    return path.is_file() or (path / "anomalous.csv").is_file() or (path / "data.csv").is_file()


def load_case(
    path: str | Path,
    *,
    inject_time: float | None = None,
    graph: list[tuple[str, str]] | None = None,
    options: TableOptions | None = None,
    use_split: bool = True,
) -> AnalysisInput:
    """A case in RCAEval's layout (see the module docstring). ``use_split=False`` ignores the
    normal/anomalous split and the inject time, so the engine must find the start itself."""
    p = Path(path)
    if p.is_file():
        return load_table(p, inject_time=inject_time if use_split else None, graph=graph, options=options)
    if (p / "anomalous.csv").is_file() and (p / "normal.csv").is_file():
        if use_split:
            return load_table(p / "anomalous.csv", normal=p / "normal.csv", graph=graph, options=options)
        data = load_table(p / "anomalous.csv", normal=p / "normal.csv", graph=graph, options=options)
        return data.model_copy(update={
            "baseline_end": None,
            "notes": [*data.notes, "The normal/anomalous split is withheld: the engine finds the start."],
        })
    if (p / "data.csv").is_file():
        if inject_time is None and use_split and (p / "inject_time.txt").is_file():
            text = (p / "inject_time.txt").read_text().strip()
            inject_time = _timestamp(text, str(p / "inject_time.txt"))
        return load_table(p / "data.csv", inject_time=inject_time if use_split else None, graph=graph, options=options)
    raise OfflineDataError(f"{p}: neither a CSV nor a folder with anomalous.csv + normal.csv or data.csv")
