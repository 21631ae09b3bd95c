"""The generated dashboards: committed JSON up to date, every panel well formed, every query
valid PromQL (promtool parses them without a server), and every recorded series they read
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
from dashboards.queries import annotation_queries, panel_queries, substitute
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
        pytest.skip("promtool is not installed")
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
    if not recorded:
        pytest.skip("rules/ defines no recording rules yet")
    used = {name for board in generated.values() for _, expr in all_queries(board) for name in _RECORDED.findall(expr)}
    assert used, "the dashboards read no recorded series"
    assert used <= recorded, f"not recorded by any rule in rules/: {sorted(used - recorded)}"


def test_panel_queries_substitute_grafana_variables() -> None:
    board = {
        "panels": [
            {"type": "row", "title": "r", "panels": [
                {"title": "nested", "targets": [{"expr": "rate(x_total[$__rate_interval])"}]},
            ]},
            {"title": "p", "targets": [
                {"expr": 'sum by (job) (up{job="${job}"}) / [[n:raw]]'},
                {"expr": "hidden", "hide": True},
                {"expr": ""},
            ]},
        ],
        "annotations": {"list": [{"name": "a", "expr": "changes(x[$__range])"}]},
    }
    assert panel_queries(board, {"job": "nginx", "n": "2"}) == [
        ("nested", "rate(x_total[1m])"),
        ("p", 'sum by (job) (up{job="nginx"}) / 2'),
    ]
    assert annotation_queries(json.dumps(board)) == [("a", "changes(x[1h])")]
    # Unknown user variables stay as written (as in Grafana) and then fail promtool.
    assert substitute("up{job=~\"$job\"}") == "up{job=~\"$job\"}"
    with pytest.raises(ValueError, match=r"\$__unknown"):
        substitute("rate(x[$__unknown])")


def test_panel_queries_of_the_committed_file_are_concrete() -> None:
    queries = panel_queries(build.DASHBOARD_DIR / "overview.json")
    assert len(queries) == 15
    assert ("Payload rejections by reason",
            "sum by (reason) (rate(promreflex_controller_payload_rejections_total[1m]))") in queries
    assert not [expr for _, expr in queries if "$" in expr or "[[" in expr]


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
