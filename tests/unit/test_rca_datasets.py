"""Recorded incident data laid out as other tools publish it (RCAEval RE1/RE2/RE3, AIOps,
Chaos Mesh fault names): reading, the inject time's unit, the truth of `rca eval`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from controllers.rca import analyse
from controllers.rca.evaluate import run, truth_of
from controllers.rca.offline import OfflineDataError
from controllers.rca.stats import robust_score
from controllers.rca.models import TimeSeries
from controllers.rca.tabular import load_case
from promreflex.cli import main

WOBBLE = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.3, -0.2]
SERVICES = ["frontend", "ts-order-service", "carts", "carts-db"]


def case(
    folder: Path,
    root: str = "ts-order-service",
    *,
    services: list[str] = SERVICES,
    n: int = 40,
    start: float = 1_692_569_000,
    step: float = 1,
    name: str = "data.csv",
    time_column: str = "time",
    inject: str | None = "same",
    row_end: str = "",
    encoding: str = "utf-8",
) -> Path:
    """An RCAEval RE1-like table: ``root``'s cpu and latency go up 5x at row n/2."""
    folder.mkdir(parents=True, exist_ok=True)
    cols = [f"{s}_{m}" for s in services for m in ("cpu", "mem", "latency-90")]
    lines = [",".join([time_column, *cols])]
    for i in range(n):
        cells = [f"{start + i * step:.0f}"]
        for j, s in enumerate(services):
            w = 1 + 0.05 * WOBBLE[(i + j) % len(WOBBLE)]
            hot = 5 if s == root and i >= n // 2 else 1
            cells += [f"{0.2 * w * hot:.6g}", f"{2e8 * w:.6g}", f"{0.05 * w * hot:.6g}"]
        lines.append(",".join(cells) + row_end)
    (folder / name).write_text("\n".join(lines) + "\n", encoding=encoding)
    if inject is not None:
        at = start + (n // 2) * step
        (folder / "inject_time.txt").write_text(f"{at:.0f}\n" if inject == "same" else inject)
    return folder


def test_rows_ending_with_a_comma_are_read(tmp_path):
    data = load_case(case(tmp_path / "c", row_end=","))
    assert analyse(data).top(1) == ["ts-order-service"]


def test_values_at_the_float_limit_are_skipped_with_a_note(tmp_path):
    assert robust_score(TimeSeries.of([1.7e308, -1.7e308, 1.7e308, 1.7e308])) is None
    folder = case(tmp_path / "c")
    rows = list(csv.reader((folder / "data.csv").open()))
    rows[0].append("frontend_error")
    for i, r in enumerate(rows[1:]):
        r.append("1.7e308" if i >= 20 else "-1.7e308")
    with (folder / "data.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    data = load_case(folder)
    assert any("too large" in n and "frontend_error" in n for n in data.notes)
    assert analyse(data).top(1) == ["ts-order-service"]


@pytest.mark.parametrize(("step", "inject_factor", "expected"), [(1000, 1 / 1000, "times 1000"), (1, 1000, "divided by 1000")])
def test_an_inject_time_in_the_other_unit_is_rescaled_with_a_note(tmp_path, step, inject_factor, expected):
    start = 1_692_569_000 * (1000 if step == 1000 else 1)
    at = (start + 20 * step) * inject_factor
    data = load_case(case(tmp_path / "c", start=start, step=step, inject=f"{at:.0f}"))
    assert data.baseline_end == start + 20 * step
    assert any(expected in n and "outside the data's time range" in n for n in data.notes)
    assert analyse(data).top(1) == ["ts-order-service"]


def test_an_inject_time_outside_the_data_is_refused_naming_both_ranges(tmp_path, capsys):
    folder = case(tmp_path / "c", inject="1692597800")  # 8 hours later: a naive local time
    with pytest.raises(OfflineDataError, match=r"1692597800.*outside.*\[1692569000\.000, 1692569039\.000\]"):
        load_case(folder)
    assert main(["rca", "offline", str(folder / "data.csv"), "--inject-time", "1792569000"]) == 2
    assert "outside the data's time range" in capsys.readouterr().err
    assert main(["rca", "offline", str(folder / "data.csv"), "--inject-time", "1692569020000", "--json"]) == 0
    assert any("divided by 1000" in s for s in json.loads(capsys.readouterr().out)["steps"])


def test_a_timestamp_column_and_a_byte_order_mark(tmp_path):
    assert load_case(case(tmp_path / "a", time_column="timestamp")).baseline_end == 1_692_569_020
    assert load_case(case(tmp_path / "b", encoding="utf-8-sig")).baseline_end == 1_692_569_020


def test_the_truth_is_the_longest_service_of_the_data_before_the_fault(tmp_path):
    c = tmp_path / "ts-order-service_network-delay" / "1"
    assert truth_of(c, ["ts-order", "ts-order-service", "frontend"]) == ("ts-order-service", "network-delay", None)
    assert truth_of(tmp_path / "carts-db-cpu" / "3", ["carts", "carts-db"]) == ("carts-db", "cpu", None)
    service, fault, note = truth_of(tmp_path / "RE1-TT" / "nothing_cpu" / "1", ["carts"])
    assert (service, fault) == ("nothing", "cpu") and note and "not a service in the data" in note
    results = run(case(tmp_path / "chaos" / "ts-order-service_pod-kill" / "1").parent.parent)
    assert [(r.service, r.fault, r.rank) for r in results] == [("ts-order-service", "pod-kill", 1)]


def test_eval_on_a_root_holding_systems_reads_the_truth_from_the_case_folder(tmp_path, capsys):
    case(tmp_path / "RE1" / "RE1-TT" / "ts-order-service_cpu" / "1")
    case(tmp_path / "RE1" / "RE1-SS" / "carts_mem" / "2", root="carts")
    case(tmp_path / "RE1" / "RE1-SS" / "queue_cpu" / "1", root="carts")
    assert main(["rca", "eval", str(tmp_path / "RE1"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    got = {c["case"]: (c["service"], c["rank"], c["note"]) for c in s["cases"]}
    assert got["RE1-TT/ts-order-service_cpu/1"] == ("ts-order-service", 1, None)
    assert got["RE1-SS/carts_mem/2"] == ("carts", 1, None)
    assert got["RE1-SS/queue_cpu/1"][1] is None and "not a service" in got["RE1-SS/queue_cpu/1"][2]
    assert main(["rca", "eval", str(tmp_path / "RE1")]) == 0
    assert "truth 'queue' is not a service in the data" in capsys.readouterr().out


def test_an_unreadable_case_is_listed_and_left_out_of_the_figures(tmp_path, capsys):
    case(tmp_path / "ds" / "ts-order-service_cpu" / "1")
    bad = tmp_path / "ds" / "carts_cpu" / "1"
    bad.mkdir(parents=True)
    (bad / "data.csv").write_text("when,carts_cpu\n1,2\n")
    errors: list = []
    results = run(tmp_path / "ds", errors=errors)
    assert [r.rank for r in results] == [1]
    assert [e.case for e in errors] == ["carts_cpu/1"] and str(bad / "data.csv") in errors[0].reason
    with pytest.raises(OfflineDataError, match=str(bad / "data.csv")):
        run(tmp_path / "ds")
    assert main(["rca", "eval", str(tmp_path / "ds"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["figures"]["overall"]["cases"] == 1 and s["errors"][0]["path"] == str(bad)
    assert main(["rca", "eval", str(tmp_path / "ds" / "carts_cpu")]) == 2
    assert "could be read" in capsys.readouterr().err


@pytest.mark.parametrize("tables", [("metrics.csv",), ("metrics.csv", "simple_metrics.csv")])
def test_rcaeval_re2_cases_are_table_cases(tmp_path, capsys, tables):
    folder = tmp_path / "RE2-TT" / "ts-order-service_cpu" / "1"
    for name in tables:
        case(folder, name=name)
    (folder / "logs.csv").write_text("time,timestamp,container_name,message\n1,1,frontend,hi\n")
    (folder / "traces.csv").write_text("traceID,spanID,serviceName,startTimeMillis,duration\n")
    data = load_case(folder)
    assert data.source.endswith(tables[-1]) and data.baseline_end == 1_692_569_020
    assert any("logs.csv and traces.csv are not" in n for n in data.notes)
    assert main(["rca", "eval", str(tmp_path / "RE2-TT"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cases"][0]["rank"] == 1
    assert main(["rca", "offline", str(folder)]) == 0
    out = capsys.readouterr()
    assert "_mpg.csv" not in out.err and out.out.splitlines()[1].split()[:2] == ["1", "ts-order-service"]


def test_a_folder_of_neither_layout_names_both(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main(["rca", "offline", str(tmp_path / "x")]) == 2
    assert "metrics.csv" in capsys.readouterr().err


def test_service_names_with_underscores_keep_their_columns(tmp_path):
    folder = case(tmp_path / "carts_db_cpu" / "1", root="carts_db", services=["frontend", "carts", "carts_db"])
    data = load_case(folder)
    assert sorted(data.services) == ["carts", "carts_db", "frontend"]
    assert {m.name for m in data.services["carts_db"].metrics} == {"carts_db_cpu", "carts_db_mem", "carts_db_latency-90"}
    assert [(r.service, r.rank) for r in run(folder.parent)] == [("carts_db", 1)]


def test_a_failed_start_detection_is_said(tmp_path):
    data = load_case(case(tmp_path / "c", root="none", inject=None))
    assert data.baseline_end is None
    assert "no change point over the 12 series is significant" in analyse(data).explain()


def test_a_repetition_folder_that_is_not_a_number(tmp_path):
    """``carts-cpu/run3`` read its truth from ``carts-cpu`` before the case-folder rule came."""
    assert truth_of(tmp_path / "carts-cpu" / "run3", ["carts", "orders"]) == ("carts", "cpu", None)
    assert truth_of(tmp_path / "carts-cpu", ["carts", "orders"]) == ("carts", "cpu", None)


def test_rcaeval_re2_metrics_csv_names_are_read_as_what_they_measure(tmp_path):
    """RCAEval RE2's metrics.csv names its columns after cAdvisor and Istio (dashes inside the
    metric): the Istio latency of a delay fault must be read as latency (it was skipped as an
    unknown metric, and the delay went unseen), settings (spec) are not signals."""
    n = 40
    svcs = ["cartservice", "frontend", "redis"]
    metrics = {
        "container-cpu-usage-seconds-total": 0.2, "container-spec-cpu-quota": 2e5,
        "container-memory-working-set-bytes": 2e8, "container-spec-memory-limit-bytes": 1e9,
        "container-sockets": 12.0, "container-blkio-device-usage-total": 3.0,
        "istio-request-total": 30.0, "istio-error-total": 0.5, "istio-bytes-50": 900.0,
        "istio-latency-50": 0.01, "istio-latency-90": 0.02,
    }
    cols = {f"{s}_{m}": [v * (1 + 0.05 * WOBBLE[(i + j) % len(WOBBLE)])
                         * (20 if s == "cartservice" and m.startswith("istio-latency") and i >= n // 2 else 1)
                         for i in range(n)]
            for j, s in enumerate(svcs) for m, v in metrics.items()}
    folder = tmp_path / "RE2-OB" / "cartservice_delay" / "1"
    folder.mkdir(parents=True)
    with (folder / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", *cols, "gke-cluster-1-pool-a_node-cpu-seconds-total"])
        for i in range(n):
            w.writerow([1_700_000_000 + i, *(c[i] for c in cols.values()), 1.0])
    (folder / "inject_time.txt").write_text(f"{1_700_000_000 + n // 2}\n")
    data = load_case(folder)
    assert sorted(data.services) == svcs
    kinds = {m.name.split("_", 1)[1]: m.kind for m in data.services["cartservice"].metrics}
    assert kinds == {"container-cpu-usage-seconds-total": "cpu", "container-memory-working-set-bytes": "memory",
                     "container-sockets": "network", "container-blkio-device-usage-total": "disk_io",
                     "istio-error-total": "errors", "istio-latency-50": "latency", "istio-latency-90": "latency"}
    assert any("node-cpu-seconds-total" in note for note in data.notes)  # a node's series: named, skipped
    assert analyse(data).top(1) == ["cartservice"]
    assert [(r.service, r.rank) for r in run(tmp_path / "RE2-OB")] == [("cartservice", 1)]


def test_a_latency_whose_name_says_milliseconds_is_read_in_milliseconds(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "data.csv").write_text(
        "time,cart_istio_request_duration_milliseconds_p90,cart_latency-90,cart_rt_us,cart_cpu\n"
        "1,250,0.25,250000,1\n2,250,0.25,250000,1\n")
    data = load_case(folder)
    assert sorted(data.services) == ["cart"]  # not a phantom `cart_istio_request`
    values = {m.name: m.series.points[0][1] for m in data.services["cart"].metrics if m.kind == "latency"}
    assert values == pytest.approx({"cart_istio_request_duration_milliseconds_p90": 0.25, "cart_latency-90": 0.25,
                                    "cart_rt_us": 0.25})


def test_a_service_named_as_another_plus_a_word_is_said(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "data.csv").write_text("time,cart_cpu,cart_process_cpu,front_cpu\n1,1,1,1\n2,1,1,1\n")
    data = load_case(folder)
    assert sorted(data.services) == ["cart", "cart_process", "front"]
    assert any("another service plus _word" in n and "cart_process" in n for n in data.notes)


def test_a_long_table_is_refused_not_analysed_empty(tmp_path, capsys):
    """AIOps 2022's layout (one row per pod, metric and value) has no <service>_<metric>
    column: exit 2 naming the layout, not an empty answer with exit 0."""
    folder = tmp_path / "cartservice_cpu" / "1"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text(
        "timestamp,cmdb_id,kpi_name,value\n1647790380,cartservice-0,container_cpu_usage_seconds,0.2\n")
    with pytest.raises(OfflineDataError, match="long table"):
        load_case(folder)
    assert main(["rca", "offline", str(folder)]) == 2
    assert "long table" in capsys.readouterr().err
    errors: list = []
    assert run(tmp_path, errors=errors) == [] and len(errors) == 1  # unreadable, not a scored miss


def test_pod_level_data_names_the_service_by_its_pods(tmp_path, capsys):
    pods = ["cartservice-0", "cartservice-1", "frontend-5d8f9c7b6d-x2k4p", "redis-cart-0"]
    case(tmp_path / "ds" / "cartservice_cpu" / "1", root="cartservice-1", services=pods)
    case(tmp_path / "ds" / "frontend_cpu" / "1", root="frontend-5d8f9c7b6d-x2k4p", services=pods)
    case(tmp_path / "ds" / "queue_cpu" / "1", root="cartservice-0", services=pods)
    got = {r.case: (r.rank, r.note) for r in run(tmp_path / "ds")}
    assert got["cartservice_cpu/1"][0] == 1 and "its pods cartservice-0, cartservice-1" in got["cartservice_cpu/1"][1]
    assert got["frontend_cpu/1"][0] == 1
    assert got["queue_cpu/1"][0] is None and "not a service in the data" in got["queue_cpu/1"][1]
    assert main(["rca", "eval", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "1 case(s) name a truth that is not a service in the data" in out
    from controllers.rca.evaluate import pods_of

    # Kubernetes' suffixes have no vowels: a sibling service is not a pod
    assert pods_of("carts", ["carts-redis", "carts-mongo", "carts-0", "carts-7d9fbc6b8d-x2k4p", "carts-bx9lq"]) == [
        "carts-0", "carts-7d9fbc6b8d-x2k4p", "carts-bx9lq"]


def test_an_inject_time_on_the_first_or_last_row_is_refused(tmp_path, capsys):
    """Nothing before it (or after it) to score: every series was scored against its whole window,
    fault included, and a wrong root cause named with no word of it."""
    start = 1_692_569_000
    for at, before, after in ((start, 1, 39), (start + 39, 40, 0), (start + 1, 2, 38)):
        folder = case(tmp_path / f"at{at}" / "ts-order-service_cpu" / "1", inject=f"{at}\n")
        with pytest.raises(OfflineDataError, match=f"leaves {before} row.s. before it and {after} after"):
            load_case(folder)
        assert main(["rca", "offline", str(folder)]) == 2
        assert "at least 3 before" in capsys.readouterr().err
    assert load_case(case(tmp_path / "ok" / "x_cpu" / "1", inject=f"{start + 3}\n")).baseline_end == start + 3


def test_a_service_that_stops_reporting_at_the_fault_is_said_not_scored_on_its_baseline(tmp_path):
    """A crashed container's columns are empty after the inject time: its baseline was scored
    against itself and shown as the fault's peak ("carts is slow")."""
    folder = case(tmp_path / "ts-order-service_cpu" / "1")
    table = folder / "data.csv"
    rows = list(csv.reader(table.open()))
    carts = [i for i, c in enumerate(rows[0]) if c.startswith("carts_")]
    for r in rows[21:]:
        for i in carts:
            r[i] = ""
    with table.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    finding = analyse(load_case(folder))
    carts_verdict = finding.verdict("carts")
    assert carts_verdict.signals == [] and carts_verdict.latency_s is None
    assert "No samples after the start (t=1692569020), so not scored: carts (carts_cpu, carts_mem, carts_latency-90)" in finding.explain()
    assert finding.top(1) == ["ts-order-service"]
    assert robust_score(TimeSeries.of([1, 2, 3, 9]), baseline_end=5) is None
    assert robust_score(TimeSeries.of([1, 2, 3, 9]), baseline_end=2).max == 9


def test_an_inject_time_beside_a_normal_anomalous_pair_is_refused(tmp_path, capsys):
    folder = tmp_path / "carts-cpu" / "1"
    case(folder, name="normal.csv", inject=None)
    case(folder, name="anomalous.csv", inject=None, start=1_692_569_100)
    assert main(["rca", "offline", str(folder), "--inject-time", "1692569110"]) == 2
    assert "normal.csv and anomalous.csv give the split" in capsys.readouterr().err


def test_pods_count_for_their_service_beside_its_own_series(tmp_path):
    """Istio latency by workload and cAdvisor by pod: the service's pod at rank 1 was a rank 3 miss."""
    services = ["cartservice", "cartservice-579f59597d-wc2lz", "frontend", "redis-cart"]
    case(tmp_path / "ds" / "cartservice_cpu" / "1", root="cartservice-579f59597d-wc2lz", services=services)
    [r] = run(tmp_path / "ds")
    assert r.rank == 1 and r.note and "itself and its pods cartservice-579f59597d-wc2lz" in r.note


def test_folders_of_data_that_are_no_case_are_listed_not_dropped(tmp_path, capsys):
    import gzip

    ds = tmp_path / "ds"
    case(ds / "ts-order-service_cpu" / "1")
    case(ds / "carts_cpu" / "1", name="normal.csv", inject=None)
    gz = case(ds / "frontend_cpu" / "1", root="frontend") / "data.csv"
    (gz.parent / "data.csv.gz").write_bytes(gzip.compress(gz.read_bytes()))
    gz.unlink()
    errors: list = []
    results = run(ds, errors=errors)
    assert [r.case for r in results] == ["ts-order-service_cpu/1"]
    assert sorted(e.case for e in errors) == ["carts_cpu/1", "frontend_cpu/1"]
    assert all("no case here" in e.reason for e in errors)
    assert main(["rca", "eval", str(ds)]) == 0
    out = capsys.readouterr()
    assert "carts_cpu/1" in out.out + out.err and "frontend_cpu/1" in out.out + out.err


def test_relative_paths_keep_the_truth(tmp_path, monkeypatch, capsys):
    case(tmp_path / "ts-order-service_cpu" / "3")
    monkeypatch.chdir(tmp_path / "ts-order-service_cpu")
    assert [r.rank for r in run("./3/")] == [1]
    monkeypatch.chdir(tmp_path / "ts-order-service_cpu" / "3")
    assert [(r.case, r.rank) for r in run(".")] == [("3", 1)]
    assert [r.rank for r in run("../")] == [1]
    assert main(["rca", "eval", "/nonexistent/x"]) == 2
    assert "no such folder" in capsys.readouterr().err
