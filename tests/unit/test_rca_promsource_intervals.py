"""The root-cause analysis' default Prometheus queries (controllers/rca/promsource.py: the
latency without the mesh rules, the cAdvisor and process-exporter resource presets) return a value
at every evaluation at a 15, 30 and 60 s scrape, one scrape missed (README, "Scrape and
evaluation intervals"). The same model as the rules' and the dashboards' interval tests
(tests/rules_intervals.py), with promtool's engine: a fixed ``rate(x[1m])`` holds one sample at a
60 s scrape, and the analysis then had no latency and no resource evidence. The missed scrape is
a late one (its sample absent): a failed one leaves the memory presets, which read a gauge as it
is, one point short in a range the analysis reads whole."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from controllers.rca.promsource import CADVISOR_RESOURCES, PROCESS_RESOURCES, PromQueries, render
from tests import rules_intervals as ri

SERIES: dict[str, ri.Value] = {
    'container_cpu_usage_seconds_total{job="cadvisor", instance="k:1", container="carts"}': ri.counter((0, 0.5)),
    'container_memory_working_set_bytes{job="cadvisor", instance="k:1", container="carts"}': ri.steps((0, 1e8)),
    'container_fs_reads_bytes_total{job="cadvisor", instance="k:1", container="carts"}': ri.counter((0, 1000)),
    'container_fs_writes_bytes_total{job="cadvisor", instance="k:1", container="carts"}': ri.counter((0, 2000)),
    'namedprocess_namegroup_cpu_seconds_total{job="process", instance="p:1", groupname="carts", mode="user"}':
        ri.counter((0, 0.5)),
    'namedprocess_namegroup_memory_bytes{job="process", instance="p:1", groupname="carts", memtype="resident"}':
        ri.steps((0, 1e8)),
    'namedprocess_namegroup_read_bytes_total{job="process", instance="p:1", groupname="carts"}': ri.counter((0, 1000)),
    'namedprocess_namegroup_write_bytes_total{job="process", instance="p:1", groupname="carts"}': ri.counter((0, 2000)),
    'promreflex_mesh_request_duration_seconds_bucket{job="mesh", instance="m:1", destination="carts", le="0.5"}':
        ri.counter((0, 9)),
    'promreflex_mesh_request_duration_seconds_bucket{job="mesh", instance="m:1", destination="carts", le="+Inf"}':
        ri.counter((0, 10)),
}


def queries() -> list[tuple[str, str]]:
    out = [("latency", render(PromQueries().latency))]
    for preset, templates in (("cadvisor", CADVISOR_RESOURCES), ("process", PROCESS_RESOURCES)):
        out += [(f"{preset} {res}", render(t, service="carts")) for res, t in templates.items()]
    return out


def promtool_test(doc: dict, path: Path) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on ``doc`` written to ``path``."""
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed (scripts/install-system.sh installs it)")
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100_000))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("s", ri.INTERVALS)
def test_the_default_queries_have_a_value_at_every_evaluation(s: int, tmp_path: Path) -> None:
    stretch, steps = f"[20m:{s}s]", 20 * 60 // s + 1  # 10m..30m, across the missed scrape
    half = f"{s * 500}ms" if s % 2 else f"{s // 2}s"
    checks = [{"expr": f"count_over_time(group({expr}){stretch})", "eval_time": "30m",
               "exp_samples": [{"labels": "{}", "value": steps}]} for _, expr in queries()]
    doc = {"evaluation_interval": f"{s}s", "tests": [{
        "name": f"rca queries at {s} s", "interval": half,
        "input_series": [{"series": k, "values": ri.tokens(v, s, 31 * 60, missed=True, failed=False)} for k, v in SERIES.items()],
        "promql_expr_test": checks}]}
    result = promtool_test(doc, tmp_path / f"rca-{s}s.test.yml")
    output = (result.stdout + result.stderr).replace('\\"', '"')
    failed = [name for name, expr in queries() if f"count_over_time(group({expr})" in output]
    assert result.returncode == 0, f"queries without a value at every evaluation at {s} s: {failed}\n{output[-2000:]}"


def test_disk_io_is_the_sum_of_reads_and_writes_and_either_alone(tmp_path: Path) -> None:
    writes_only = {k: v for k, v in SERIES.items() if "read" not in k}
    tests = []
    for name, series, want in (("both", SERIES, 3000), ("writes only", writes_only, 2000)):
        tests.append({"name": name, "interval": "15s",
                      "input_series": [{"series": k, "values": ri.tokens(v, 30, 31 * 60, missed=False)}
                                       for k, v in series.items()],
                      "promql_expr_test": [{"expr": f'round({render(t["disk_io"], service="carts")})', "eval_time": "20m",
                                            "exp_samples": [{"labels": "{}", "value": want}]}
                                           for t in (CADVISOR_RESOURCES, PROCESS_RESOURCES)]})
    result = promtool_test({"evaluation_interval": "30s", "tests": tests}, tmp_path / "disk.test.yml")
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]


def test_a_container_that_went_away_leaves_the_rates_when_it_goes(tmp_path: Path) -> None:
    """Its series go stale (the pod was replaced): its rate is gone within 2 minutes, not kept
    by the 5m rung for 5 (a restarted container counted twice in the CPU evidence); and one
    failed scrape (staleness markers, then samples again) does not blank the other one's."""
    cpu = render(CADVISOR_RESOURCES["cpu"], service="carts")
    doc = {"evaluation_interval": "1s", "tests": [{
        "name": "carts replaced at 61 s", "interval": "1s",
        "input_series": [
            {"series": 'container_cpu_usage_seconds_total{job="cadvisor", instance="k:1", container="carts", pod="a"}',
             "values": "0+1x60 stale"},
            {"series": 'container_cpu_usage_seconds_total{job="cadvisor", instance="k:1", container="carts", pod="b"}',
             "values": "_x61 0+0.5x150 stale 76+0.5x200"}],
        "promql_expr_test": [{"expr": f"round({cpu} * 100)", "eval_time": t,
                              "exp_samples": [{"labels": "{}", "value": 50}]} for t in ("3m32s", "4m")]}]}
    result = promtool_test(doc, tmp_path / "gone.test.yml")
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
