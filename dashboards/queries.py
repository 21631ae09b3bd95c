"""Extract every PromQL expression of a dashboard, with Grafana's variables made concrete.

Why: a dashboard is only as good as its queries. Tests parse each expression with promtool (no
server needed) and the live stack test runs each one against Prometheus; both need plain PromQL,
so Grafana's template variables (``$__rate_interval``, ``${var}``, ``[[var]]``) are replaced by
the values Grafana itself would send (:func:`builtin_variables`), from the dashboard's time
range, the panel's width and the provisioned data source's scrape interval
(``compose/grafana/provisioning/datasources/prometheus.yml``, ``jsonData.timeInterval``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dashboards.build import iter_panels
from promreflex.config import REPO_ROOT

#: The Grafana data source the compose stack provisions; its ``jsonData.timeInterval`` is the
#: "Scrape interval" Grafana derives ``$__interval``'s floor and ``$__rate_interval`` from.
DATASOURCE_PROVISIONING = REPO_ROOT / "compose" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
#: Grafana's scrape interval for a Prometheus data source without ``timeInterval``.
GRAFANA_DEFAULT_SCRAPE_INTERVAL_S = 15.0
#: A panel's default "Max data points" is its width in pixels; the 24 grid columns are taken as
#: a full-HD screen (80 px a column). Narrower screens give longer ``$__interval`` values.
SCREEN_WIDTH_PX = 1920
#: Grafana's default dashboard range, for a dashboard without ``time``.
DEFAULT_RANGE = "now-6h"

# Grafana's rangeutil.roundInterval: an interval (ms) is rounded to the first "nice" value of
# the row whose upper bound it is under.
_ROUND_INTERVAL_MS = (
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000), (3_500, 2_000),
    (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000), (45_000, 30_000),
    (90_000, 60_000), (210_000, 120_000), (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000),
    (1_500_000, 1_200_000), (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
    (604_800_000, 86_400_000), (1_814_400_000, 604_800_000), (3_628_800_000, 2_592_000_000),
)
_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text: str | float | int) -> float:
    """Seconds of a Grafana/Prometheus duration (``200ms``, ``1s``, ``1m30s``; a bare number is seconds)."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"not a duration: {text!r}") from None
    return sum(float(n) * _UNITS_S[u] for n, u in parts)


def promql_duration(seconds: float) -> str:
    """A PromQL duration for ``seconds``, in whole milliseconds (``4s``, ``2500ms``)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def round_interval(seconds: float) -> float:
    """Grafana's rounding of a computed ``$__interval`` (rangeutil.roundInterval), in seconds."""
    ms = seconds * 1000
    return next((nice for bound, nice in _ROUND_INTERVAL_MS if ms < bound), 31_536_000_000) / 1000


def provisioned_scrape_interval(path: Path = DATASOURCE_PROVISIONING) -> float:
    """The provisioned Prometheus data source's ``timeInterval`` in seconds (Grafana's default if unset)."""
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for source in config.get("datasources") or []:
        if source.get("type") == "prometheus":
            value = (source.get("jsonData") or {}).get("timeInterval")
            return duration_seconds(value) if value else GRAFANA_DEFAULT_SCRAPE_INTERVAL_S
    raise ValueError(f"{path}: no prometheus data source")


def builtin_variables(range_s: float, max_data_points: float, scrape_interval_s: float,
                      min_interval_s: float | None = None) -> dict[str, str]:
    """Grafana's built-in variables for one query, as Grafana 10.1 computes them.

    ``$__interval`` = the range over the panel's max data points, rounded the Grafana way, and
    never below the panel's min interval (``min_interval_s``) or else the data source's scrape
    interval. ``$__rate_interval`` = max(``$__interval`` + scrape interval, 4 x scrape
    interval), where the scrape interval is the query's min step if set, else the data
    source's (Grafana's Prometheus data source, ``getRateIntervalScopedVariable``).
    """
    floor = min_interval_s if min_interval_s is not None else scrape_interval_s
    scrape = min_interval_s if min_interval_s is not None else scrape_interval_s
    interval = max(round_interval(range_s / max_data_points), floor)
    rate_interval = max(interval + scrape, 4 * scrape)
    return {
        "__interval": promql_duration(interval),
        "__interval_ms": str(round(interval * 1000)),
        "__rate_interval": promql_duration(rate_interval),
        "__range": promql_duration(range_s),
        "__range_s": str(round(range_s)),
        "__range_ms": str(round(range_s * 1000)),
    }


def dashboard_range_seconds(board: Mapping[str, Any]) -> float:
    """The length of the dashboard's default time range (``now-30m`` .. ``now``)."""
    start = ((board.get("time") or {}).get("from")) or DEFAULT_RANGE
    match = re.fullmatch(r"now-(\S+)", start)
    if not match or (board.get("time") or {}).get("to", "now") != "now":
        raise ValueError(f"only relative ranges ending now are supported, not {board.get('time')}")
    return duration_seconds(match.group(1))


def panel_variables(board: Mapping[str, Any], panel: Mapping[str, Any], target: Mapping[str, Any],
                    scrape_interval_s: float) -> dict[str, str]:
    """The built-in variables Grafana sends with one target of one panel."""
    width_px = (panel.get("gridPos") or {}).get("w", 24) * SCREEN_WIDTH_PX / 24
    max_data_points = panel.get("maxDataPoints") or width_px
    min_interval = target.get("interval") or panel.get("interval")
    return builtin_variables(dashboard_range_seconds(board), max_data_points, scrape_interval_s,
                             duration_seconds(min_interval) if min_interval else None)


# Grafana's own variable syntax: $name, [[name]] or [[name:format]], ${name}, ${name.field}, ${name:format}.
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::\w+)?\]\]|\$\{(\w+)(?:\.[^:}]+)?(?::[^}]+)?\}")


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace Grafana variables in ``expr`` by their values.

    ``variables`` are replaced (built-ins included: :func:`builtin_variables`). An unknown
    built-in (``$__something``) raises ValueError so a new one is never passed on silently; any
    other unknown name is left as written, as Grafana does, and then fails to parse as PromQL.
    """
    values = dict(variables or {})

    def replace(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g is not None)
        if name in values:
            return values[name]
        if name.startswith("__"):
            raise ValueError(f"no value for Grafana built-in variable ${name} in: {expr}")
        return match.group(0)

    return _VARIABLE.sub(replace, expr)


def _load(dashboard_json: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    """The parsed dashboard from a mapping, its JSON text, or a path to the file."""
    if isinstance(dashboard_json, Path):
        dashboard_json = dashboard_json.read_text(encoding="utf-8")
    return json.loads(dashboard_json) if isinstance(dashboard_json, str) else dashboard_json


def panel_queries(
    dashboard_json: Mapping[str, Any] | str | Path, variables: Mapping[str, str] | None = None,
    scrape_interval_s: float | None = None, panel_types: frozenset[str] | None = None,
) -> list[tuple[str, str]]:
    """``(panel_title, expr)`` for every Prometheus target of every panel, variables substituted.

    ``dashboard_json`` is the parsed dashboard, its JSON text, or a path to the file. Built-in
    variables get the values Grafana would send for that panel (:func:`panel_variables`) with
    the provisioned data source's scrape interval unless ``scrape_interval_s`` is given;
    ``variables`` add or override. ``panel_types`` limits the panels (e.g. ``{"stat"}``).
    Hidden targets and targets without an expression are skipped.
    """
    board = _load(dashboard_json)
    scrape = provisioned_scrape_interval() if scrape_interval_s is None else scrape_interval_s
    found: list[tuple[str, str]] = []
    for panel in iter_panels(board.get("panels") or []):
        if panel_types is not None and panel.get("type") not in panel_types:
            continue
        for target in panel.get("targets") or []:
            if target.get("expr") and not target.get("hide"):
                values = {**panel_variables(board, panel, target, scrape), **(variables or {})}
                found.append((panel.get("title", ""), substitute(target["expr"], values)))
    return found


def annotation_queries(
    dashboard_json: Mapping[str, Any] | str | Path, variables: Mapping[str, str] | None = None,
    scrape_interval_s: float | None = None,
) -> list[tuple[str, str]]:
    """``(annotation_name, expr)`` for every PromQL annotation (its ``target.expr``).

    Kept apart from :func:`panel_queries` because an annotation marks events: its query is
    legitimately empty while nothing happens (no alert firing but Watchdog). Built-ins as for a
    panel as wide as the dashboard.
    """
    board = _load(dashboard_json)
    scrape = provisioned_scrape_interval() if scrape_interval_s is None else scrape_interval_s
    found = []
    for annotation in (board.get("annotations") or {}).get("list") or []:
        target = annotation.get("target") or {}
        if target.get("expr"):
            values = {**panel_variables(board, {}, target, scrape), **(variables or {})}
            found.append((annotation.get("name", ""), substitute(target["expr"], values)))
    return found


def panels_without_data(dashboard_json: Any, has_data: Callable[[str], Any], timeout: float = 30.0,
                        panel_types: frozenset[str] | None = None) -> list[str]:
    """``"title: expr"`` for every panel query of a dashboard for which ``has_data(expr)`` stays
    falsy for ``timeout`` seconds (polled; recorded series appear after a few evaluations).
    What the dashboard tests assert is empty, against whichever stack the dashboard needs."""
    from promreflex.proc import Timeout, wait_until

    empty = []
    for title, expr in panel_queries(dashboard_json, panel_types=panel_types):
        try:
            wait_until(lambda: has_data(expr), timeout=timeout, interval=0.5, what=f"data for {title!r}")
        except Timeout:
            empty.append(f"{title}: {expr}")
    return empty
