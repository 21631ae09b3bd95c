"""Extract every PromQL expression of a dashboard, with Grafana's variables made concrete.

Why: a dashboard is only as good as its queries. Tests parse each expression with promtool (no
server needed) and the live stack test runs each one against Prometheus; both need plain PromQL,
so Grafana's template variables (``$__rate_interval``, ``${var}``, ``[[var]]``) are replaced by
concrete values here, the way Grafana would before sending the query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dashboards.build import iter_panels

#: Values for Grafana's built-in variables, as a short dashboard range would give them.
BUILTIN_VARIABLES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

# Grafana's own variable syntax: $name, [[name]] or [[name:format]], ${name}, ${name.field}, ${name:format}.
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::\w+)?\]\]|\$\{(\w+)(?:\.[^:}]+)?(?::[^}]+)?\}")


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace Grafana variables in ``expr`` by their values.

    Known built-ins (:data:`BUILTIN_VARIABLES`) and ``variables`` are replaced. An unknown
    built-in (``$__something``) raises ValueError so a new one is never passed on silently; any
    other unknown name is left as written, as Grafana does, and then fails to parse as PromQL.
    """
    values = {**BUILTIN_VARIABLES, **(variables or {})}

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
    dashboard_json: Mapping[str, Any] | str | Path, variables: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``(panel_title, expr)`` for every Prometheus target of every panel, variables substituted.

    ``dashboard_json`` is the parsed dashboard, its JSON text, or a path to the file. Hidden
    targets and targets without an expression are skipped. Every one of these queries returns
    data on the running stack.
    """
    found: list[tuple[str, str]] = []
    for panel in iter_panels(_load(dashboard_json).get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr") and not target.get("hide"):
                found.append((panel.get("title", ""), substitute(target["expr"], variables)))
    return found


def annotation_queries(
    dashboard_json: Mapping[str, Any] | str | Path, variables: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``(annotation_name, expr)`` for every PromQL annotation.

    Kept apart from :func:`panel_queries` because an annotation marks events: its query is
    legitimately empty while nothing happens (no alert firing but Watchdog).
    """
    annotations = (_load(dashboard_json).get("annotations") or {}).get("list") or []
    return [(a.get("name", ""), substitute(a["expr"], variables)) for a in annotations if a.get("expr")]


def panels_without_data(dashboard_json: Any, has_data: Callable[[str], Any], timeout: float = 30.0) -> list[str]:
    """``"title: expr"`` for every panel query of a dashboard for which ``has_data(expr)`` stays
    falsy for ``timeout`` seconds (polled; recorded series appear after a few evaluations).
    What the dashboard tests assert is empty, against whichever stack the dashboard needs."""
    from promreflex.proc import Timeout, wait_until

    empty = []
    for title, expr in panel_queries(dashboard_json):
        try:
            wait_until(lambda: has_data(expr), timeout=timeout, interval=0.5, what=f"data for {title!r}")
        except Timeout:
            empty.append(f"{title}: {expr}")
    return empty
