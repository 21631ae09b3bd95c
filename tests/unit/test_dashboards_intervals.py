"""Every dashboard panel shows data at a 15, 30 and 60 s scrape (README, "Scrape and evaluation
intervals"), with the Grafana data source's scrape interval set to match (what Grafana derives
``$__rate_interval`` from).

Method: the rules tests' model applied to the panels, with promtool's engine (the same PromQL a
server runs, without a server): all of rules/ loaded and evaluated every S seconds; every metric
the panels and rules read fed at S, half an interval after the evaluations, with one scrape
missed (tests/rules_intervals.py); each panel query, as Grafana sends it at that interval, must
return data at EVERY evaluation over 20 minutes. A fixed ``[1m]`` in a panel, or a recorded
series with gaps, fails here. The missed scrape is a late one (its sample absent), not a failed
one: a failed scrape's staleness markers leave a panel that reads a gauge as it is one point
without data, which Grafana draws as a gap (the rules, which alert, hold gauges across it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import build
from dashboards.queries import panel_queries
from promreflex.config import REPO_ROOT
from tests import rules_intervals as ri

#: Panels that show events, not a signal: empty while no such alert fires, as meant.
EVENT_PANELS = {"Guard alerts"}
#: Known gaps, not this test's to fix: {interval: {"<dashboard>: <panel title>"}}. None now (the
#: copy guard's served rate had gaps at 60 s until its window ladder gained a 5m rung).
KNOWN_GAPS: dict[int, set[str]] = {}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "inf", "nan", "e"}


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, its `=` matchers) of every raw (unrecorded) selector of ``expr``."""
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    tokens = [m.group(0) for m in re.finditer(r'"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|[a-zA-Z_][\w:]*|\S', expr)]
    found = []
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if not re.fullmatch(r"[a-zA-Z_][\w:]*", token) or following == "(" or token.lower() in _KEYWORDS:
            continue
        if ":" in token:
            continue
        matchers = following if following.startswith("{") else ""
        found.append((token, dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers))))
    return found


def input_series(queries: list[str]) -> dict[str, ri.Value]:
    """The rules tests' healthy inputs of every rules file, plus a generic series for every other
    metric a panel reads: a counter (1/s) for *_total/_count/_sum/_bucket, a gauge (1) otherwise."""
    series: dict[str, ri.Value] = {}
    for concern in ri.concerns():
        assert concern.recorded is not None
        series.update(concern.recorded.series)
    # The copy guard's inputs (rules/copy-guard.rules.yml): a calibrated site serving 30 req/s.
    series.update({
        'promreflex_http_requests_total{job="accesslog", instance="a:1", site="shop", status_class="2xx"}':
            ri.counter((0, 30)),
        'promreflex_copy_guard_rps_threshold{job="node", instance="n:9100", site="shop"}': ri.steps((0, 20)),
        'promreflex_copy_guard_demand_floor_rps{job="node", instance="n:9100", site="shop"}': ri.steps((0, 20)),
        'nginx_connections_writing{job="nginx", instance="n:1"}': ri.steps((0, 1)),
    })
    fed = {name.split("{")[0] for name in series}
    known: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for expr in queries:
        for name, matchers in selectors(expr):
            if name in fed or name in {"ALERTS", "up", "time", "vector"} or (name, tuple(matchers.items())) in known:
                continue
            labels = {"job": "j", "instance": "i:1", **matchers}
            if name.endswith("_bucket"):
                labels["le"] = "+Inf"
            text = name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
            counter = re.search(r"_(total|count|sum|bucket)$", name) or name == "nginx_connections_accepted"
            series[text] = ri.counter((0, 1)) if counter else ri.steps((0, 1))
            known.add((name, tuple(matchers.items())))
    return series


@pytest.mark.parametrize("s", ri.INTERVALS)
def test_every_panel_shows_data_at_every_evaluation(s: int, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed (scripts/install-system.sh installs it)")
    panels = [(f"{name}: {title}", expr) for name, text in sorted(build.generate().items())
              for title, expr in panel_queries(yaml.safe_load(text), scrape_interval_s=s)
              if title not in EVENT_PANELS and f"{name}: {title}" not in KNOWN_GAPS.get(s, set())]
    assert len(panels) >= 90
    rules = sorted((REPO_ROOT / "rules").glob("*.rules.yml"))
    groups = [g["name"] for path in rules for g in yaml.safe_load(path.read_text())["groups"]]
    order = [g for g in groups if g.endswith(".rules")] + [g for g in groups if not g.endswith(".rules")]
    # 10m..30m, across the missed scrape at 23m: one value per evaluation.
    stretch, steps = f"[20m:{s}s]", 20 * 60 // s + 1
    checks = [{"expr": f"count_over_time(group({expr}){stretch})", "eval_time": "30m",
               "exp_samples": [{"labels": "{}", "value": steps}]} for _, expr in panels]
    half = f"{s * 500}ms" if s % 2 else f"{s // 2}s"
    doc = {
        "rule_files": [str(p) for p in rules], "evaluation_interval": f"{s}s", "group_eval_order": order,
        "tests": [{"name": f"every panel at {s} s", "interval": half,
                   "input_series": [{"series": k, "values": ri.tokens(v, s, 31 * 60, missed=True, failed=False)}
                                    for k, v in input_series([e for _, e in panels]).items()],
                   "promql_expr_test": checks}],
    }
    path = tmp_path / f"panels-{s}s.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100_000))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    failed = sorted({where for where, expr in panels if f'count_over_time(group({expr})' in output.replace('\\"', '"')})
    assert result.returncode == 0, f"panels without data at every evaluation at {s} s: {failed}\n{output[-3000:]}"


def test_selectors_finds_raw_metrics_and_their_matchers() -> None:
    expr = ('sum by (site, le) (rate(x_bucket{a="1", b=~"2"}[5m])) / on (site) y:recorded '
            'or label_replace(z_total[1m], "s", "$1", "d", "(.+)") and max(g) > 0')
    assert selectors(expr) == [("x_bucket", {"a": "1"}), ("z_total", {}), ("g", {})]
