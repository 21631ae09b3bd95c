"""Generate the Grafana dashboards with the Grafana Foundation SDK and write them as JSON.

Why generated: hand-edited dashboard JSON drifts from the metrics and rules it shows. Here each
panel is a few lines naming a PromQL expression and a unit; the committed JSON is what Grafana
provisions, and ``--check`` fails CI when the code and the committed files disagree, or when a
dashboard is not what Grafana 10.1's own types allow (``dashboards/schema``).

Adding a dashboard for a new capability: a module ``dashboards/<name>.py`` (found by
:func:`discover`) with::

    from dashboards.build import Query, new_dashboard, register, timeseries_panel

    @register("copy-guard.json")
    def copy_guard() -> dashboard.Dashboard:
        return new_dashboard("promreflex-copy-guard", "promreflex / copy guard", "...").with_row(
            dashboard.Row("Copy guard")
        ).with_panel(
            timeseries_panel("Site requests", "reqps", Query("site:promreflex_http_requests:rate5s"))
        )

Every panel reads from the ``${datasource}`` dashboard variable (type prometheus), so the same
JSON works against any Prometheus data source. Panel ids are numbered at render time, in order,
so they stay stable as long as the panel order does.

Usage: ``uv run python -m dashboards.build [--check] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
)

DASHBOARD_DIR = Path(__file__).resolve().parent

#: Name of the dashboard variable every panel and annotation reads its data source from.
DATASOURCE_VARIABLE = "datasource"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")

#: Filename -> function returning the dashboard builder. Filled by :func:`register`.
DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {}


def register(filename: str) -> Callable[[Callable[[], dashboard.Dashboard]], Callable[[], dashboard.Dashboard]]:
    """Register a dashboard factory under the JSON file name it is written to."""

    def decorator(factory: Callable[[], dashboard.Dashboard]) -> Callable[[], dashboard.Dashboard]:
        if filename in DASHBOARDS:
            raise ValueError(f"dashboard file {filename} registered twice")
        DASHBOARDS[filename] = factory
        return factory

    return decorator


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel and the legend Grafana shows for its series."""

    expr: str
    legend: str = ""


def _targets(queries: Sequence[Query | str], instant: bool) -> list[cogbuilder.Builder[variants.Dataquery]]:
    """Prometheus targets with refIds A, B, C...: Grafana needs them unique within a panel."""
    if not queries:
        raise ValueError("a panel needs at least one query")
    targets: list[cogbuilder.Builder[variants.Dataquery]] = []
    for i, q in enumerate(queries):
        q = Query(q) if isinstance(q, str) else q
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        if q.legend:
            target = target.legend_format(q.legend)
        targets.append(target.instant() if instant else target.range())
    return targets


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step's value is None (Grafana's "base" = -Infinity)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )


def timeseries_panel(
    title: str,
    unit: str,
    *queries: Query | str,
    description: str = "",
    width: int = 8,
    height: int = 8,
    max_value: float | None = None,
) -> timeseries.Panel:
    """A time series panel of ``queries`` in ``unit`` (a Grafana unit id: ``s``, ``reqps``, ``short``).

    The y axis starts at 0 (every series here is a count, rate, ratio or duration);
    ``max_value`` fixes its top, e.g. 1 for ratios.
    """
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries, instant=False))
        .unit(unit)
        .min(0)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
    )
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def stat_panel(
    title: str,
    unit: str,
    *queries: Query | str,
    description: str = "",
    width: int = 4,
    height: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
    value_text: Mapping[str, tuple[str, str]] | None = None,
) -> stat.Panel:
    """A single-value panel of the latest value of ``queries`` (instant queries).

    ``value_text`` maps exact values to (text, color), e.g. ``{"0": ("MISSING", "red")}``.
    """
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries, instant=True))
        .unit(unit)
        .span(width)
        .height(height)
        .thresholds(_thresholds(thresholds))
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if value_text:
        panel = panel.mappings(
            [ValueMap(options={v: ValueMappingResult(text=t, color=c) for v, (t, c) in value_text.items()})]
        )
    return panel


def new_dashboard(uid: str, title: str, description: str, tags: Sequence[str] = ()) -> dashboard.Dashboard:
    """A dashboard with the ``${datasource}`` variable, a firing-alerts annotation and sane defaults."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["promreflex", *tags])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus")
        )
        # Grafana's dashboard model expects annotations.list; this one marks alert transitions
        # on every time series panel (the alert -> action story at a glance).
        .annotation(
            dashboard.AnnotationQuery()
            .name("Firing alerts")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("red")
            .expr('ALERTS{alertstate="firing", alertname!="Watchdog"}')
        )
    )


PanelT = TypeVar("PanelT", bound=Mapping[str, Any])


def iter_panels(panels: Sequence[PanelT]) -> Iterator[PanelT]:
    """Every panel of a dashboard JSON, rows and the panels nested in collapsed rows included."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


#: Keys the SDK's VariableModel writes on every variable that Grafana 10.1's VariableModel has
#: not: the interval variable's ``auto*`` and the query variable's ``includeAll``.
_NOT_IN_GRAFANA_10_1_VARIABLES = ("auto", "auto_count", "auto_min", "includeAll")


def _as_grafana_10_1_types(data: dict[str, Any]) -> None:
    """Make the SDK's JSON what Grafana 10.1's own types say (dashboards/schema checks it).

    - An annotation's query goes in ``target`` (``AnnotationQuery<PrometheusDataQuery>``); the
      SDK's builder writes a top-level ``expr``, which Grafana's Prometheus data source also
      accepts but only by moving it to ``target`` when it loads the dashboard.
    - Variables: without the keys of other variable types (:data:`_NOT_IN_GRAFANA_10_1_VARIABLES`),
      and with ``datasource`` present (``null`` for a data source variable, as Grafana writes it).
    """
    for annotation in (data.get("annotations") or {}).get("list") or []:
        if "expr" in annotation:
            annotation["target"] = {"datasource": annotation.get("datasource"), "expr": annotation.pop("expr"),
                                    "refId": "Anno"}
    for variable in (data.get("templating") or {}).get("list") or []:
        if variable.get("type") != "interval":
            for key in _NOT_IN_GRAFANA_10_1_VARIABLES:
                variable.pop(key, None)
        variable.setdefault("datasource", None)


def render(board: dashboard.Dashboard) -> str:
    """The dashboard as stable, sorted JSON text with panel ids numbered 1..n in order."""
    data = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    _as_grafana_10_1_types(data)
    for number, panel in enumerate(iter_panels(data["panels"]), start=1):
        panel["id"] = number
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def discover() -> None:
    """Import every dashboard module of this package (each registers its dashboards): a
    capability adds ``dashboards/<name>.py`` and nothing else changes."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules([str(DASHBOARD_DIR)]):
        if module.name not in {"build", "queries", "schema", "__main__"}:
            importlib.import_module(f"dashboards.{module.name}")


def generate() -> dict[str, str]:
    """Filename -> JSON text for every registered dashboard."""
    discover()
    return {filename: render(factory()) for filename, factory in sorted(DASHBOARDS.items())}


def stale_files(directory: Path = DASHBOARD_DIR) -> list[str]:
    """Names of dashboards whose file in ``directory`` is missing or differs from the generated JSON."""
    stale = []
    for filename, text in generate().items():
        path = directory / filename
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(filename)
    return stale


def schema_errors() -> list[str]:
    """Every departure of a generated dashboard from Grafana's own types (dashboards/schema)."""
    from dashboards.schema import validate

    return [error for filename, text in generate().items() for error in validate(json.loads(text), filename)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a committed dashboard differs from the generated one or breaks Grafana's schema")
    parser.add_argument("--dir", type=Path, default=DASHBOARD_DIR, help="folder of the dashboard JSON files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.dir)
        for filename in stale:
            print(f"{args.dir / filename}: differs from the generated dashboard; run: uv run python -m dashboards.build", file=sys.stderr)
        invalid = schema_errors()
        for error in invalid:
            print(f"not what Grafana 10.1's types allow: {error}", file=sys.stderr)
        return 1 if stale or invalid else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for filename, text in generate().items():
        (args.dir / filename).write_text(text, encoding="utf-8")
        print(f"wrote {args.dir / filename}")
    return 0


if __name__ == "__main__":
    # Run as ``python -m dashboards.build`` this file is ``__main__``, a second copy of the
    # module: the dashboard modules register into ``dashboards.build``, so call that one's main.
    from dashboards import build as _build

    sys.exit(_build.main())
