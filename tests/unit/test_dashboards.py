"""The generated dashboards: committed JSON up to date, valid against Grafana's own types (the
Grafana 10.1 they target), every panel well formed, every query valid PromQL (promtool parses
them without a server) with Grafana's variables as Grafana would send them, stat panels that
show 0 rather than "No data" when their metric is absent, and every recorded series they read
defined by a rule in rules/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import build
from dashboards.queries import (
    annotation_queries,
    builtin_variables,
    panel_queries,
    provisioned_scrape_interval,
    round_interval,
    substitute,
)
from dashboards.schema import SCHEMA_DIR, schemas, validate
from promreflex.config import REPO_ROOT

PANEL_TYPES_WITH_UNIT = {"timeseries", "stat"}
# A recorded series name has a colon (level:metric:operation); raw metric names never do.
_RECORDED = re.compile(r"\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]\b")


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in build.generate().items()}


def promtool_check(queries: list[tuple[str, str]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Record each expression as a rule and let promtool parse them all: no server needed."""
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed (scripts/install-system.sh installs it)")
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": expr, "labels": {"panel": title}}
        for i, (title, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    return subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def all_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    return panel_queries(board) + [(f"annotation: {n}", e) for n, e in annotation_queries(board)]


def test_committed_json_is_what_the_code_generates() -> None:
    assert build.stale_files() == [], "run: uv run python -m dashboards.build"
    assert set(build.DASHBOARDS) == {p.name for p in build.DASHBOARD_DIR.glob("*.json")}


def test_check_mode_fails_on_a_stale_file(tmp_path: Path) -> None:
    assert build.main(["--dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "overview.json"
    path.write_text(path.read_text().replace("promreflex / overview", "hand-edited"))
    assert build.main(["--check", "--dir", str(tmp_path)]) == 1
    path.unlink()
    assert build.main(["--check", "--dir", str(tmp_path)]) == 1


def test_generation_is_deterministic_and_uids_are_stable(generated: dict[str, dict[str, Any]]) -> None:
    assert build.generate() == build.generate()
    assert generated["overview.json"]["uid"] == "promreflex-overview"
    uids = [board["uid"] for board in generated.values()]
    assert len(uids) == len(set(uids))


def test_every_panel_is_well_formed(generated: dict[str, dict[str, Any]]) -> None:
    for filename, board in generated.items():
        panels = list(build.iter_panels(board["panels"]))
        ids = [p["id"] for p in panels]
        assert ids == list(range(1, len(panels) + 1)), f"{filename}: panel ids"
        data_panels = [p for p in panels if p["type"] != "row"]
        assert data_panels, filename
        for panel in data_panels:
            where = f"{filename}: panel {panel.get('title')!r}"
            assert panel.get("title"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel.get("targets"), f"{where} has no target"
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids), f"{where}: refIds {ref_ids}"
            for target in panel["targets"]:
                assert target["expr"].strip(), where
                assert target["datasource"] == panel["datasource"], where
            if panel["type"] in PANEL_TYPES_WITH_UNIT:
                assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
            x, w = panel["gridPos"]["x"], panel["gridPos"]["w"]
            assert x >= 0 and x + w <= 24, f"{where} overflows the grid"


def test_datasource_is_a_prometheus_variable(generated: dict[str, dict[str, Any]]) -> None:
    for filename, board in generated.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", filename
        assert variables["datasource"]["query"] == "prometheus", filename
        for annotation in board["annotations"]["list"]:
            assert annotation["datasource"]["uid"] == "${datasource}", filename


def test_overview_shows_stack_controller_and_nginx(generated: dict[str, dict[str, Any]]) -> None:
    board = generated["overview.json"]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Stack health", "Controller", "nginx"]
    exprs = "\n".join(expr for _, expr in panel_queries(board))
    for series in (
        "job:up:ratio", "up == 0", 'ALERTS{alertname="Watchdog"', "status_result:promreflex_controller_notifications:rate1m",
        "action_result:promreflex_controller_actions:rate1m",
        "action:promreflex_controller_action_duration_seconds:p95_5m",
        "promreflex_controller_last_reconcile_timestamp_seconds", "promreflex_controller_applied_alerts",
        "nginx_http_requests_total", "nginx_connections_active",
    ):
        assert series in exprs, series


def test_every_query_parses_with_promtool(generated: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    queries = [q for board in generated.values() for q in all_queries(board)]
    assert len(queries) >= 15
    result = promtool_check(queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_promtool_check_catches_a_broken_query(tmp_path: Path) -> None:
    result = promtool_check([("good", "sum(up)"), ("broken", "sum(rate(up[$__typo]))")], tmp_path)
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def test_recorded_series_are_defined_in_rules(generated: dict[str, dict[str, Any]]) -> None:
    recorded = {
        rule["record"]
        for path in sorted((REPO_ROOT / "rules").glob("*.yml"))
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", [])
        for rule in group.get("rules", [])
        if "record" in rule
    }
    assert recorded, "rules/ defines no recording rules"
    used = {name for board in generated.values() for _, expr in all_queries(board) for name in _RECORDED.findall(expr)}
    assert used, "the dashboards read no recorded series"
    assert used <= recorded, f"not recorded by any rule in rules/: {sorted(used - recorded)}"


def test_panel_queries_substitute_grafana_variables() -> None:
    board = {
        "time": {"from": "now-1h", "to": "now"},
        "panels": [
            {"type": "row", "title": "r", "panels": [
                {"title": "nested", "gridPos": {"w": 24}, "targets": [{"expr": "rate(x_total[$__rate_interval])"}]},
            ]},
            {"title": "p", "gridPos": {"w": 12}, "targets": [
                {"expr": 'sum by (job) (up{job="${job}"}) / [[n:raw]]'},
                {"expr": "rate(y_total[$__rate_interval]) / $__interval_ms", "interval": "30s"},
                {"expr": "hidden", "hide": True},
                {"expr": ""},
            ]},
        ],
        "annotations": {"list": [{"name": "a", "target": {"expr": "changes(x[$__range])", "refId": "Anno"}}]},
    }
    # 1 h over 1920 px: 1.9 s, rounded to 2 s; +15 s scrape = 17 s, below 4 x 15 s.
    assert panel_queries(board, {"job": "nginx", "n": "2"}, scrape_interval_s=15) == [
        ("nested", "rate(x_total[60s])"),
        ("p", 'sum by (job) (up{job="nginx"}) / 2'),
        # The query's min step replaces the scrape interval: max(30 s + 30 s, 4 x 30 s).
        ("p", "rate(y_total[120s]) / 30000"),
    ]
    # With a 1 s scrape interval the same panel gets max(2 s + 1 s, 4 x 1 s) = 4 s.
    assert panel_queries(board, scrape_interval_s=1)[0] == ("nested", "rate(x_total[4s])")
    assert annotation_queries(json.dumps(board), scrape_interval_s=15) == [("a", "changes(x[3600s])")]
    # Unknown user variables stay as written (as in Grafana) and then fail promtool.
    assert substitute("up{job=~\"$job\"}") == "up{job=~\"$job\"}"
    with pytest.raises(ValueError, match=r"\$__unknown"):
        substitute("rate(x[$__unknown])")


@pytest.mark.parametrize(("range_s", "points", "scrape", "interval", "rate"), [
    (1800, 640, 1, "2s", "4s"),  # the compose data source (timeInterval 1s), a third of the screen, 30 m
    (1800, 320, 1, "5s", "6s"),  # 5.6 s rounds to 5 s: then interval + scrape wins over 4 x scrape
    (1800, 640, 15, "15s", "60s"),  # Grafana's default scrape interval: 4 x 15 s
    (86400, 640, 15, "120s", "135s"),  # a day: 135 s rounds to 2 m; 2 m + 15 s
    (300, 1920, 0.2, "200ms", "800ms"),
])
def test_builtin_variables_follow_grafanas_rule(range_s, points, scrape, interval, rate) -> None:
    values = builtin_variables(range_s, points, scrape)
    assert (values["__interval"], values["__rate_interval"]) == (interval, rate)


def test_round_interval_is_grafanas_table() -> None:
    assert [round_interval(s) for s in (0.012, 0.3, 1.4, 1.6, 3.6, 13, 20, 50, 100, 200, 300, 1000)] == [
        0.01, 0.2, 1, 2, 5, 15, 20, 60, 120, 120, 300, 900]


def test_rate_interval_is_four_times_the_provisioned_scrape_interval() -> None:
    """What Grafana sends for the compose data source (timeInterval 1s), not a fixed 1m."""
    assert provisioned_scrape_interval() == 1.0
    queries = dict(panel_queries(build.DASHBOARD_DIR / "overview.json"))
    assert queries["Payload rejections by reason"] == (
        "sum by (reason) (rate(promreflex_controller_payload_rejections_total[4s]))")
    assert queries["nginx request rate"] == "sum(rate(nginx_http_requests_total[4s]))"


def test_panel_queries_of_the_committed_file_are_concrete() -> None:
    queries = panel_queries(build.DASHBOARD_DIR / "overview.json")
    assert len(queries) == 15
    assert not [expr for _, expr in queries if "$" in expr or "[[" in expr]


# --- Grafana's own types -----------------------------------------------------------------------

def test_every_dashboard_is_what_grafanas_types_allow(generated: dict[str, dict[str, Any]]) -> None:
    for filename, board in generated.items():
        assert validate(board, filename) == []
    assert build.schema_errors() == []


def _broken(board: dict[str, Any], title: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A deep copy of ``board`` and the copy's panel named ``title``."""
    copy = json.loads(json.dumps(board))
    return copy, next(p for p in build.iter_panels(copy["panels"]) if p.get("title") == title)


@pytest.mark.parametrize(("mutation", "expected"), [
    ("refresh as a number", "refresh"),
    ("unknown dashboard key", "'colour' was unexpected"),
    ("schemaVersion of another Grafana", "schemaVersion"),
    ("annotation query as a top-level expr", "'expr' was unexpected"),
    ("stat graphMode not in the enum", "graphMode"),
    ("timeseries without fieldConfig", "'fieldConfig' is a required property"),
    ("target expr as a number", "targets/0/expr"),
    ("unknown panel type", "no Grafana type for panel type 'graph2'"),
    ("value mapping of an unknown type", "mappings/0"),
    ("nested panel in a row broken", "legend/displayMode"),
])
def test_the_schema_check_rejects_a_broken_dashboard(generated: dict[str, dict[str, Any]], mutation: str,
                                                    expected: str) -> None:
    board, stat = _broken(generated["overview.json"], "Watchdog")
    series = next(p for p in build.iter_panels(board["panels"]) if p["type"] == "timeseries")
    if mutation == "refresh as a number":
        board["refresh"] = 10
    elif mutation == "unknown dashboard key":
        board["colour"] = "blue"
    elif mutation == "schemaVersion of another Grafana":
        board["schemaVersion"] = 39
    elif mutation == "annotation query as a top-level expr":
        annotation = board["annotations"]["list"][0]
        annotation["expr"] = annotation.pop("target")["expr"]
    elif mutation == "stat graphMode not in the enum":
        stat["options"]["graphMode"] = "sparkline"
    elif mutation == "timeseries without fieldConfig":
        del series["fieldConfig"]
    elif mutation == "target expr as a number":
        stat["targets"][0]["expr"] = 1
    elif mutation == "unknown panel type":
        series["type"] = "graph2"
    elif mutation == "value mapping of an unknown type":
        stat["fieldConfig"]["defaults"]["mappings"][0]["type"] = "lookup"
    elif mutation == "nested panel in a row broken":
        series["options"]["legend"]["displayMode"] = "bullets"
        board["panels"] = [{"type": "row", "title": "collapsed", "collapsed": True, "id": 99,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0}, "panels": [series]}]
    errors = validate(board, "overview.json")
    assert errors, mutation
    assert any(expected in error for error in errors), errors


def test_check_mode_fails_on_a_dashboard_grafana_would_not_type(tmp_path: Path, monkeypatch, capsys) -> None:
    assert build.main(["--dir", str(tmp_path)]) == 0
    real = build.generate

    def generate_broken() -> dict[str, str]:
        texts = real()
        board = json.loads(texts["overview.json"])
        board["refresh"] = 10
        return {**texts, "overview.json": build.json.dumps(board)}

    monkeypatch.setattr(build, "generate", generate_broken)
    monkeypatch.setattr(build, "stale_files", lambda directory: [])
    assert build.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "overview.json: refresh" in capsys.readouterr().err


def test_the_schema_is_grafanas_for_the_grafana_the_stack_runs() -> None:
    """Provenance: the committed schema comes from the pinned @grafana/schema and today's types.ts,
    and that version is the Grafana image compose runs (and the Foundation SDK's 10.1)."""
    import hashlib

    source = schemas()["source"]
    pinned = json.loads((SCHEMA_DIR / "package.json").read_text())["dependencies"]
    assert source["@grafana/schema"] == pinned["@grafana/schema"]
    assert source["ts-json-schema-generator"] == pinned["ts-json-schema-generator"]
    assert source["types.ts sha256"] == hashlib.sha256((SCHEMA_DIR / "types.ts").read_bytes()).hexdigest(), (
        "types.ts changed: run uv run python -m dashboards.schema.regenerate")
    env = (REPO_ROOT / "compose" / ".env").read_text()
    assert f"GRAFANA_IMAGE=grafana/grafana:{pinned['@grafana/schema']}" in env
    assert pinned["@grafana/schema"].startswith("10.1.")
    assert all(board["schemaVersion"] == 36 for board in map(json.loads, build.generate().values()))


# --- stat panels: 0, not "No data" ----------------------------------------------------------------

#: Stat panels for which no data is the truth: no controller has reconciled, so there is no age.
NO_DATA_IS_MEANT = {"Time since last reconcile"}


def test_stat_panels_show_a_value_when_their_metrics_are_absent(generated: dict[str, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    """Each stat query against an empty Prometheus (promtool, no series at all) returns one
    value: a count, sum or state whose metric is absent is 0 there, not "No data"."""
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed (scripts/install-system.sh installs it)")
    queries = [(f"{name}: {title}", expr) for name, board in sorted(generated.items())
               for title, expr in panel_queries(board, panel_types=frozenset({"stat"}))
               if title not in NO_DATA_IS_MEANT]
    assert len(queries) >= 9
    (tmp_path / "none.rules.yml").write_text("groups: []\n")
    tests = [{"name": where, "interval": "15s", "input_series": [],
              "promql_expr_test": [{"expr": f"group({expr})", "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 1}]}]}
             for where, expr in queries]
    path = tmp_path / "stat-panels.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": ["none.rules.yml"], "tests": tests}))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, "stat panels showing \"No data\" where 0 is meant:\n" + result.stdout + result.stderr


def test_the_command_line_writes_and_checks_every_dashboard(tmp_path) -> None:
    """As `make test` runs it: `python -m dashboards.build --check` must see every dashboard."""
    import subprocess
    import sys

    check = subprocess.run([sys.executable, "-m", "dashboards.build", "--check", "--dir", str(tmp_path)],
                           capture_output=True, text=True)
    assert check.returncode == 1 and "overview.json" in check.stderr
    write = subprocess.run([sys.executable, "-m", "dashboards.build", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert write.returncode == 0 and (tmp_path / "overview.json").is_file()
    assert subprocess.run([sys.executable, "-m", "dashboards.build", "--check", "--dir", str(tmp_path)]).returncode == 0
