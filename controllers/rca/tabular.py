"""Offline input in RCAEval's layout: one CSV, ``time`` then ``<service>_<metric>`` columns.

This is the layout of RCD's recordings (``normal.csv`` and ``anomalous.csv`` of one case) and
of RCAEval's datasets (``data.csv``, with ``inject_time.txt`` beside it). A case is given as:

- a folder holding ``normal.csv`` and ``anomalous.csv``: the normal recording is the baseline
  and the anomalous one is scored against it. They need not be one recording (RCD's lie hours
  apart, sometimes in either order): the normal one is moved in time to end one step before
  the anomalous one starts, so the split falls between them;
- a folder holding one table (``TABLE_FILES``, first found: RE1's ``data.csv``, RE2/RE3's
  ``simple_metrics.csv`` then ``metrics.csv``, then ``simple_data.csv``) and optionally
  ``inject_time.txt`` (unix time), or one CSV file: the inject time splits it when known;
  otherwise the engine finds the anomaly's start (:mod:`controllers.rca.changepoint`). The
  order follows RCAEval's ``main.py``, which reads ``data.csv`` and, for datasets without it
  (RE2, RE3), ``simple_metrics.csv`` (the service-level subset of ``metrics.csv``). RE2/RE3's
  ``logs.csv`` and ``traces.csv`` are not read (a note says so).

The time column is ``time`` or ``timestamp`` (RCAEval, AIOps challenge, Nezha; any case), the
first the header has, unless ``TableOptions.time_column`` names one. Files are read as
``utf-8-sig``, so a byte-order mark is not part of the first column's name. An inject time
must lie within the data's time range: when it does not, but it does once multiplied or
divided by 1000 (seconds against milliseconds), that is used and a note says so; otherwise the
case is refused with both ranges in the message. The baseline is the rows up to the inject
time (a row exactly at it included; RCAEval's split puts it after: ``time < inject_time``).

A column is split into service and metric at its first ``_`` when the rest is a known metric
(``carts-db_cpu`` -> carts-db, cpu; ``svc_mem_rss`` -> svc, mem_rss); otherwise at the ``_``
nearest the end whose right part is a known metric (``carts_db_cpu`` -> carts_db, cpu). The
metric is matched against an ordered list of patterns that say what it measures (RCAEval RE2's
``metrics.csv`` names included: ``_container-cpu-usage-seconds-total``, ``_istio-latency-90``)
(``DEFAULT_COLUMN_MAP``; ``--map PATTERN=KIND`` adds patterns ahead of it, ``KIND`` ``ignore``
drops a column). A column whose values are too large to sum (near ±1.7e308) is skipped with
a note. Load columns (request rates) are not scored: a fault lowers the load of
every service behind the one it slows, so a change in load says where traffic stopped, not
where the fault is. A column whose metric matches no pattern is skipped and named in the
report. A call graph is optional (``source,destination`` CSV, MicroRCA's ``*_mpg.csv`` works).

Units: latency is converted to seconds: by the unit its name declares (``_milliseconds``,
``_ms``, ``_us``, ``_seconds``), else by ``latency_unit_s``; other series are scored as they
are. A service whose name is another service's plus ``_word`` is named in a note (a metric
name split in the wrong place makes a phantom service). The spread floors (:class:`~controllers.rca.models.AnalysisConfig`) assume base units
(cores, bytes, bytes/s) beside 5 % of the baseline level, so a mapped column in other units
should be in a base unit too (or its quiet baseline is scored against a floor that is too
large or too small). Two exceptions are recognised: a count of open sockets (``_socket``,
``container-sockets``) has a floor of one socket, and a table whose memory columns all stay below
1 MiB is read as MB (a floor of 1 MB; a note names the columns).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from controllers.rca.models import AnalysisInput, Kind, Metric, ServiceData, TimeSeries
from controllers.rca.offline import OfflineDataError, _check_inject, _read, _timestamp

#: metric suffix pattern -> kind (None: not scored). First match wins.
DEFAULT_COLUMN_MAP: list[tuple[str, Kind | None]] = [
    # RCAEval RE2's metrics.csv (``cartservice_istio-latency-90``, ``_istio-error-total``,
    # ``_istio-request-total``, ``_istio-bytes-50``) and Istio's own names
    # (``istio_request_duration_milliseconds``): what an Istio metric measures is in its name
    (r"^istio[-_].*(lat|latency|duration)", "latency"),
    (r"^istio[-_].*(err|error|errors|fail)", "errors"),
    (r"^istio[-_]", None),  # requests, bytes, TCP connections: load, not scored
    # cAdvisor's (RE2: ``container-spec-cpu-quota``, ``container-sockets``,
    # ``container-blkio-device-usage-total``): limits and quotas are settings, not signals
    (r"^container[-_]spec([-_.].*)?$", None),
    (r"^container[-_]sockets?([-_.].*)?$", "network"),
    (r"^container[-_]blkio([-_.].*)?$", "disk_io"),
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
    time_column: str | None = None  # None: the first of TIME_COLUMNS in the header (any case)


#: Time column names tried in order when ``TableOptions.time_column`` is None.
TIME_COLUMNS = ("time", "timestamp")
#: A case folder's table, first found (see the module docstring).
TABLE_FILES = ("data.csv", "simple_metrics.csv", "metrics.csv", "simple_data.csv")
#: Files of RE2/RE3 cases beside the metrics that are not read.
UNREAD_FILES = ("logs.csv", "traces.csv")


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
    if opts.time_column is not None:
        tcol = opts.time_column
        header, rows = _read(path, (tcol,))
    else:
        header, rows = _read(path, ())
        by_name = {h.lower(): h for h in reversed(header)}
        tcol = next((by_name[n] for n in TIME_COLUMNS if n in by_name), "")
        if not tcol:
            raise OfflineDataError(
                f"{path}: no time column ({' or '.join(TIME_COLUMNS)}) (has: {', '.join(header)})"
            )
    cols: dict[str, list[tuple[float, float]]] = {
        c: [] for c in header
        if c and c != tcol and c.lower() not in TIME_COLUMNS and not c.startswith("Unnamed")
    }
    times: list[float] = []
    bad = 0
    for line, row in enumerate(rows, 2):
        t = _timestamp(row[tcol], f"{path}:{line}")
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


#: A unit a latency column's name declares (``..._milliseconds_p90``, ``latency_ms``): it wins
#: over ``TableOptions.latency_unit_s``, which is for columns that do not say.
_DECLARED_UNITS: list[tuple[re.Pattern[str], float]] = [
    (re.compile(r"(^|[-_.])(ms|millis|milliseconds?)([-_.]|$)", re.IGNORECASE), 1e-3),
    (re.compile(r"(^|[-_.])(us|micros|microseconds?)([-_.]|$)", re.IGNORECASE), 1e-6),
    (re.compile(r"(^|[-_.])(ns|nanos|nanoseconds?)([-_.]|$)", re.IGNORECASE), 1e-9),
    (re.compile(r"(^|[-_.])(secs?|seconds?)([-_.]|$)", re.IGNORECASE), 1.0),
]


def declared_unit(metric: str) -> float | None:
    """Seconds per unit of a latency metric whose name says its unit (None: it does not)."""
    return next((unit for pattern, unit in _DECLARED_UNITS if pattern.search(metric)), None)


def _split_column(col: str, mapping: list[tuple[str, Kind | None]]) -> tuple[str, str, bool, Kind | None] | None:
    """(service, metric, known, kind) of a ``<service>_<metric>`` column: the first ``_`` when
    the metric after it is known, else the ``_`` nearest the end whose right part is known,
    else the first ``_`` (an unknown metric). None without a usable ``_``."""
    cuts = [i for i, ch in enumerate(col) if ch == "_" and 0 < i < len(col) - 1]
    if not cuts:
        return None
    for i in [cuts[0], *reversed(cuts[1:])]:
        known, kind = _kind(col[i + 1:], mapping)
        if known:
            return col[:i], col[i + 1:], True, kind
    return col[:cuts[0]], col[cuts[0] + 1:], False, None


#: Open sockets (RCAEval RE2's ``_socket``, cAdvisor's ``container-sockets``): a count, scored
#: with a spread floor of one socket, not the network kind's 1024 bytes/s (20 -> 80 sockets
#: scored z 0.06: an RE2 socket fault was never found). The whole metric name: ``socket-bytes``
#: is bytes.
_COUNT = re.compile(r"^(container[-_])?sockets?$", re.IGNORECASE)
#: A table whose memory columns all stay below this is not in bytes (no process lives in less
#: than 1 MiB): MB as RCAEval's preprocessing writes them. A leak of 350 -> 590 MB written in MB
#: scored z 0.0 against the 1 MiB floor; its floor is then 1 (MB), never 0 (a column at 0
#: through the baseline would score any blip in the 10^11s).
MIN_BYTES = 1024.0 * 1024.0
MB_FLOOR = 1.0


def _own_floor(metric: str, kind: Kind, table_in_mb: bool) -> float | None:
    """The spread floor in a column's own unit when the kind's default is in another one."""
    if kind == "network" and _COUNT.search(metric):
        return 1.0
    if kind == "memory" and table_in_mb:
        return MB_FLOOR
    return None


def _in_mb(memory: list[list[tuple[float, float]]]) -> bool:
    """Every memory column of the table stays below 1 MiB (and one is above 0): the table is in
    MB. One column alone is not enough: a table in bytes holds swap, a zero-filled gap, a page
    count (with its own floor of 1, a 4 KiB blip on a zero column took rank 1 in every case)."""
    tops = [max((abs(v) for _, v in pts if math.isfinite(v)), default=0.0) for pts in memory]
    return bool(tops) and max(tops) < MIN_BYTES and max(tops) > 0


def _summable(pts: list[tuple[float, float]]) -> bool:
    """False when the values' sum overflows (values near the float limit): not scorable."""
    try:
        return math.isfinite(math.fsum(v for _, v in pts if math.isfinite(v)))
    except OverflowError:
        return False


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
        inject_time, rescaled = _check_inject(inject_time, times, path)
        if rescaled:
            notes.append(rescaled)
        notes.append(f"Baseline: the rows before the inject time t={inject_time:.0f}.")
        baseline_end = inject_time

    metrics: dict[str, list[Metric]] = defaultdict(list)
    unknown: list[str] = []
    ignored = 0
    huge: list[str] = []
    not_bytes: list[str] = []
    split_of = {col: _split_column(col, opts.column_map) for col in cols}
    table_in_mb = _in_mb([pts for col, pts in cols.items() if (sp := split_of[col]) is not None and sp[2]
                          and sp[3] == "memory" and _summable(pts)])
    for col, pts in cols.items():
        split = split_of[col]
        if split is None or not split[2]:
            unknown.append(col)
            continue
        service, metric, _, kind = split
        if not _summable(pts):
            huge.append(col)
            continue
        metrics.setdefault(service, [])
        if kind is None:
            ignored += 1
            continue
        unit = (declared_unit(metric) or opts.latency_unit_s) if kind == "latency" else 1.0
        floor = _own_floor(metric, kind, table_in_mb)
        if floor is not None and kind == "memory":
            not_bytes.append(col)
        metrics[service].append(Metric(kind=kind, name=col, series=TimeSeries(points=[(t, v * unit) for t, v in pts]),
                                       scale_floor=floor))
    if not metrics:
        long_hint = " (a long table, one row per id, metric name and value? pivot it to one column per metric)" if any(
            c.lower() in ("value", "kpi_name", "metric", "name", "cmdb_id") for c in cols) else ""
        raise OfflineDataError(
            f"{path}: no <service>_<metric> column with a known metric (see --map){long_hint}; "
            f"columns: {', '.join(sorted(cols)[:20])}{' ...' if len(cols) > 20 else ''}"
        )
    nested = sorted(s for s in metrics if any(s.startswith(f"{o}_") for o in metrics if o != s))
    if nested:
        notes.append(
            f"Services named as another service plus _word (a column split away from its service?): "
            f"{', '.join(nested)}; if their columns are metrics of the shorter service, --map their metric names."
        )
    if unknown:
        notes.append(f"Columns whose metric is not known (see --map), skipped: {', '.join(sorted(unknown))}.")
    if huge:
        notes.append(f"Columns whose values are too large to score (their sum overflows), skipped: {', '.join(sorted(huge))}.")
    if ignored:
        notes.append(f"{ignored} load/throughput column(s) not scored (a fault moves load away from where it is).")
    if not_bytes:
        notes.append(f"Every memory column stays below {MIN_BYTES:.0f}, so the table is not in bytes: read as MB "
                     f"(spread floor {MB_FLOOR:g} MB, not 1 MiB): {', '.join(sorted(not_bytes))}.")
    if bad:
        notes.append(f"Skipped {bad} cell(s) that were not numbers.")
    if graph is None:
        notes.append("No call graph given: services are ranked by their own series only.")
    services = {s: ServiceData(metrics=ms) for s, ms in sorted(metrics.items())}
    return AnalysisInput(edges=graph or [], services=services, baseline_end=baseline_end, source=str(path), notes=notes)


def table_file(folder: Path) -> Path | None:
    """The table of a case folder, the first of ``TABLE_FILES`` present (None: none is)."""
    return next((folder / n for n in TABLE_FILES if (folder / n).is_file()), None)


def is_table_case(path: Path) -> bool:
    """A CSV file, or a folder with normal.csv + anomalous.csv or one of ``TABLE_FILES``."""
    return path.is_file() or (path / "anomalous.csv").is_file() or table_file(path) is not None


def load_case(
    path: str | Path,
    *,
    inject_time: float | None = None,
    graph: list[tuple[str, str]] | None = None,
    options: TableOptions | None = None,
    use_split: bool = True,
) -> AnalysisInput:
    """A case in RCAEval's layout (see the module docstring). ``use_split=False`` ignores the
    normal/anomalous split and the inject time, so the engine must find the start itself.
    A folder's ``inject_time.txt`` is read when no ``inject_time`` is given; a CSV file given
    alone has none (give ``inject_time``)."""
    p = Path(path)
    if p.is_file():
        return load_table(p, inject_time=inject_time if use_split else None, graph=graph, options=options)
    if (p / "anomalous.csv").is_file() and (p / "normal.csv").is_file():
        if inject_time is not None and use_split:
            raise OfflineDataError(
                f"{p}: normal.csv and anomalous.csv give the split (normal.csv is the baseline); an inject time "
                "is for one table (data.csv, a CSV file) or a MicroRCA folder: give anomalous.csv alone with it"
            )
        if use_split:
            return load_table(p / "anomalous.csv", normal=p / "normal.csv", graph=graph, options=options)
        data = load_table(p / "anomalous.csv", normal=p / "normal.csv", graph=graph, options=options)
        return data.model_copy(update={
            "baseline_end": None,
            "notes": [*data.notes, "The normal/anomalous split is withheld: the engine finds the start."],
        })
    table = table_file(p)
    if table is not None:
        if inject_time is None and use_split and (p / "inject_time.txt").is_file():
            # the first line, as RCAEval's main.py reads it (a second line, a comment, is not the time)
            lines = (p / "inject_time.txt").read_text(encoding="utf-8-sig").strip().splitlines()
            inject_time = _timestamp(lines[0].strip() if lines else "", str(p / "inject_time.txt"))
        data = load_table(table, inject_time=inject_time if use_split else None, graph=graph, options=options)
        unread = [n for n in UNREAD_FILES if (p / n).is_file()]
        if unread:
            data = data.model_copy(update={"notes": [
                *data.notes, f"Only the metrics ({table.name}) are read; {' and '.join(unread)} are not.",
            ]})
        return data
    raise OfflineDataError(
        f"{p}: neither a CSV nor a folder with anomalous.csv + normal.csv or one of {', '.join(TABLE_FILES)}"
    )
