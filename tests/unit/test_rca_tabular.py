"""RCAEval/RCD-layout input, the anomaly start, ranking every service, and `rca eval`."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.corpus import corpus, needs_corpus

from controllers.rca import AnalysisInput, ServiceData, TimeSeries, analyse
from controllers.rca.changepoint import detect
from controllers.rca.evaluate import ac_at, avg_at
from controllers.rca.models import Metric
from controllers.rca.offline import OfflineDataError
from controllers.rca.tabular import load_case, parse_mapping
from promreflex.cli import main

RCD = corpus("rca-datasets/rcd_sock-shop")
WOBBLE = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.3, -0.2]


def noisy(level: float, n: int, rel: float = 0.05, offset: int = 0) -> list[float]:
    return [level * (1 + rel * WOBBLE[(i + offset) % len(WOBBLE)]) for i in range(n)]


def write_csv(path: Path, columns: dict[str, list[float]], start: float = 1000.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(columns.values())))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", *columns])
        for i in range(n):
            w.writerow([start + i, *(columns[c][i] for c in columns)])
    return path


def rcd_case(folder: Path, hot: str, n: int = 40) -> Path:
    """An RCD-like pair: latency only for carts (which is slow in both recordings), CPU and
    memory for all; ``hot`` burns CPU in the anomalous recording. Normal comes *after*."""
    def cols(anomalous: bool) -> dict[str, list[float]]:
        out = {}
        for i, s in enumerate(["carts", "orders", "payment", "user"]):
            cpu = noisy(1.0 + i, n, offset=i)
            if anomalous and s == hot:
                cpu = [c * 30 for c in cpu]
            out[f"{s}_cpu"] = cpu
            out[f"{s}_mem"] = noisy(2e8, n, rel=0.01, offset=i)
        out["carts_lat_90"] = noisy(4.0, n, offset=3)  # chronically above the 3 s line
        out["carts_lod"] = noisy(10.0, n) if not anomalous else noisy(3.0, n)
        return out

    write_csv(folder / "anomalous.csv", cols(True), start=1000.0)
    write_csv(folder / "normal.csv", cols(False), start=9000.0)
    return folder


def test_a_service_without_latency_ranks_first_and_the_slow_one_is_not_named(tmp_path):
    data = load_case(rcd_case(tmp_path / "orders-cpu" / "1", "orders"))
    assert data.baseline_end is not None and data.baseline_end < 1000.0  # normal moved before
    assert data.services["orders"].latency is None
    f = analyse(data)
    assert f.top(1) == ["orders"] and f.verdict("orders").top_signal == "cpu:orders_cpu"
    # carts is above 3 s in both recordings: slow by the line (evidence), but no change.
    carts = f.verdict("carts")
    assert carts.slow and carts.score < 3.5 and f.rank_of("carts") > 1
    assert any("load/throughput" in n for n in data.notes)


def test_withheld_split_is_found_by_change_point(tmp_path):
    data = load_case(rcd_case(tmp_path / "user-cpu" / "1", "user"), use_split=False)
    assert data.baseline_end is None
    f = analyse(data)
    assert f.top(1) == ["user"]
    assert "earliest significant change point" in f.explain()


def test_data_csv_with_inject_time_and_mapping(tmp_path):
    n = 30
    case = tmp_path / "pay_delay" / "1"
    write_csv(case / "data.csv", {
        "front_rt": noisy(0.1, n),
        "pay_rt": [v * (5 if i >= 20 else 1) for i, v in enumerate(noisy(0.02, n))],
        "pay_gc": noisy(1.0, n),
        "front_weird": noisy(1.0, n),
    })
    (case / "inject_time.txt").write_text("1020\n# injected by chaos-mesh\n")  # the first line, as RCAEval reads it
    data = load_case(case, options=None)
    assert data.baseline_end == 1020.0
    assert [m.kind for m in data.services["pay"].metrics] == ["latency"]  # gc: unknown metric
    assert any("pay_gc" in n and "front_weird" in n for n in data.notes)
    mapped = load_case(case, options=__import__("controllers.rca.tabular", fromlist=["x"]).TableOptions(
        column_map=parse_mapping(["^gc$=memory", "^weird$=ignore"])))
    assert {m.kind for m in mapped.services["pay"].metrics} == {"latency", "memory"}
    assert analyse(data).top(1) == ["pay"]
    with pytest.raises(OfflineDataError, match="PATTERN=KIND"):
        parse_mapping(["gc"])


def test_caller_side_latency_names_the_callee_of_a_delayed_edge():
    """A network delay on front -> pay shows in the caller-side latency of the edge only;
    front's own latency rises as it waits. pay must come first, front's rise is explained."""
    n = 30
    t = lambda vs: TimeSeries.of(vs, start=0.0)  # noqa: E731
    from controllers.rca.models import LatencyStats
    delayed = [v + (0.3 if i >= 20 else 0) for i, v in enumerate(noisy(0.02, n))]
    f = analyse(AnalysisInput(
        edges=[("front", "pay"), ("front", "cat")],
        services={
            "front": ServiceData(latency=LatencyStats(series=t([v + 0.1 for v in delayed]))),
            "pay": ServiceData(latency=LatencyStats(series=t(noisy(0.02, n))),
                               metrics=[Metric(kind="latency", name="caller-side latency", series=t(delayed))]),
            "cat": ServiceData(latency=LatencyStats(series=t(noisy(0.01, n)))),
        },
    ))
    assert f.top(1) == ["pay"] and f.verdict("pay").group == "root_cause"
    assert f.verdict("front").latency_explained and f.verdict("front").group == "symptom"


def test_change_point_detects_the_earliest_change_not_the_largest():
    n = 60
    early = TimeSeries.of([1.0 if i < 20 or i >= 35 else 3.0 for i in range(n)])  # an episode 20..34
    late = TimeSeries.of([1.0 if i < 45 else 50.0 for i in range(n)])  # a bigger change later
    cp = detect([early, late])
    assert cp is not None and cp.start == 20.0
    assert detect([TimeSeries.of(noisy(1.0, n))]) is None  # noise alone is not a change


def test_ac_and_avg():
    ranks = [1, 2, None, 6]
    assert ac_at(ranks, 1) == 0.25 and ac_at(ranks, 3) == 0.5
    assert avg_at(ranks, 5) == pytest.approx((0.25 + 0.5 + 0.5 + 0.5 + 0.5) / 5)


def test_eval_cli_prints_figures_and_writes_summary_and_plot(tmp_path, capsys):
    for svc in ("orders", "user"):
        rcd_case(tmp_path / "ds" / f"{svc}-cpu" / "1", svc)
    assert main(["rca", "eval", str(tmp_path / "ds"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "overall" in out and "BARO Avg@5" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["figures"]["overall"]["ac1"] == 1.0 and summary["figures"]["cpu"]["published_avg5"]["BARO"] == 0.97
    assert (tmp_path / "out" / "ranks.png").read_bytes()[:4] == b"\x89PNG"


def test_offline_cli_reads_an_rcd_pair(tmp_path, capsys):
    case = rcd_case(tmp_path / "payment-cpu" / "1", "payment")
    assert main(["rca", "offline", str(case)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["1", "payment"]
    assert main(["rca", "offline", str(tmp_path / "nothing")]) == 2


@needs_corpus
def test_rcd_sock_shop_through_the_cli(capsys):
    assert main(["rca", "eval", str(RCD), "--json"]) == 0
    overall = json.loads(capsys.readouterr().out)["figures"]["overall"]
    assert overall["cases"] == 30 and overall["ac1"] >= 0.9 and overall["avg5"] >= 0.97


def test_offline_cli_single_csv_with_inject_time_and_map(tmp_path, capsys):
    n = 30
    path = write_csv(tmp_path / "rec.csv", {
        "front_rt": noisy(0.1, n),
        "pay_gc": [v * (8 if i >= 20 else 1) for i, v in enumerate(noisy(2e8, n))],  # bytes, as floors assume
    })
    assert main(["rca", "offline", str(path), "--inject-time", "1020", "--map", "^gc$=memory", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["ranking"][0]["service"] == "pay" and f["ranking"][0]["top_signal"] == "memory:pay_gc"
    assert any("before the inject time t=1020" in step for step in f["steps"])


def test_offline_cli_prometheus_range_needs_start_before_end(capsys):
    assert main(["rca", "offline", "--prometheus.url", "http://127.0.0.1:9", "--start", "100"]) == 2
    assert "--start before --end" in capsys.readouterr().err
    assert main(["rca", "offline", "--prometheus.url", "http://127.0.0.1:9", "--start", "100", "--end", "200",
                 "--inject-time", "300"]) == 2
    assert "between --start and --end" in capsys.readouterr().err
    assert main(["rca", "offline"]) == 2


@needs_corpus
def test_the_conclusion_follows_the_ranking_and_names_the_rules_candidate_beside_it() -> None:
    # orders' CPU fault: orders ranks first; the dependency rule alone names carts (slow, its
    # dependencies unmeasured). The conclusion must be the ranking's head, the rule's evidence beside.
    finding = analyse(load_case(RCD / "orders-cpu" / "3"))
    assert finding.ranking[0].service == "orders" and finding.root_causes[:1] == ["carts"]
    assert finding.steps[-1].startswith("-> root cause orders (ranked first by anomaly score); "
                                        "the dependency rule alone would name carts")


def _fault_case(folder: Path, columns: dict[str, list[float]], inject_row: int) -> Path:
    write_csv(folder / "data.csv", columns)
    (folder / "inject_time.txt").write_text(str(1000 + inject_row))
    return folder


def test_a_socket_fault_is_scored_in_sockets_not_bytes_per_second(tmp_path):
    # RCAEval RE2's `<svc>_socket` counts open sockets (tens). Scored against the network kind's
    # floor of 1024 bytes/s, 20 -> 80 sockets made z 0.06: an RE2 socket fault was never named.
    n, k = 120, 60
    sockets = [20 + WOBBLE[i % 10] * 5 for i in range(k)] + [80 + WOBBLE[i % 10] * 5 for i in range(n - k)]
    case = _fault_case(tmp_path / "checkoutservice_socket" / "1", {
        "checkoutservice_socket": sockets, "checkoutservice_cpu": noisy(0.3, n),
        "frontend_cpu": noisy(0.2, n, offset=3), "frontend_latency-90": noisy(0.05, n, rel=0.2, offset=5),
    }, k)
    result = analyse(load_case(case))
    assert result.ranking[0].service == "checkoutservice", [(v.service, v.score) for v in result.ranking]
    assert result.ranking[0].score > 10


def test_a_memory_leak_written_in_mb_is_scored_and_said(tmp_path):
    # RCAEval's preprocessing (and other datasets) write memory in MB: 350 -> 590 MB scored
    # z 0.0 against the 1 MiB floor, the leaking service ranked last.
    n, k = 240, 120
    leak = noisy(350, k, rel=0.01) + [350 + 2 * i for i in range(n - k)]
    case = _fault_case(tmp_path / "ts-order-service_mem" / "1", {
        "ts-order-service_mem": leak, "ts-order-service_cpu": noisy(0.4, n),
        "ts-auth-service_mem": noisy(420, n, rel=0.01, offset=2), "ts-auth-service_cpu": noisy(0.5, n, rel=0.3),
        "ts-gateway-service_latency-90": noisy(0.08, n, rel=0.2, offset=4),
    }, k)
    data = load_case(case)
    result = analyse(data)
    assert result.ranking[0].service == "ts-order-service", [(v.service, v.score) for v in result.ranking]
    assert any("not in bytes" in n and "ts-order-service_mem" in n for n in data.notes), data.notes
    # in bytes the floor stays (a 2e8-byte column is not rescaled, and no note)
    bytes_case = _fault_case(tmp_path / "b" / "1", {"svc_mem": noisy(2e8, n, rel=0.01), "svc_cpu": noisy(1.0, n)}, k)
    assert not any("not in bytes" in n for n in load_case(bytes_case).notes)


def test_rca_eval_follows_linked_system_folders(tmp_path, capsys):
    # Datasets kept on another disk and linked into a benchmark root: rglob does not follow
    # links, and `rca eval` said "no cases" (exit 2).
    store = tmp_path / "disk2" / "re1ss"
    rcd_case(store / "carts_cpu" / "1", "carts")
    root = tmp_path / "RE1"
    root.mkdir()
    (root / "RE1-SS").symlink_to(store, target_is_directory=True)
    (root / "again").symlink_to(store, target_is_directory=True)  # the same folder twice: read once
    (store / "loop").symlink_to(root, target_is_directory=True)  # a loop: not followed forever
    rcd_case(root / "RE1-OB" / "orders_cpu" / "1", "orders")  # a real system beside them
    (root / "a-latest").symlink_to(root / "RE1-OB" / "orders_cpu" / "1", target_is_directory=True)
    assert main(["rca", "eval", str(root), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    # two cases, each named first; the real folder is read (its name is the label), not the
    # link met before it ("a-latest" sorts first)
    assert re.search(r"^overall\s+2\s+1\.00", out, re.MULTILINE), out
    assert "a-latest" not in out, out


def test_a_repeated_time_column_keeps_the_first_as_the_clock(tmp_path):
    # RCAEval's loaders drop `time.1` (pandas' name for a repeated header): such files exist.
    # csv.DictReader kept the last `time`: a second column of HH:MM refused the case with
    # "'21:24' is neither a unix time nor an ISO date".
    n = 40
    path = tmp_path / "carts_cpu" / "1" / "data.csv"
    path.parent.mkdir(parents=True)
    cpu = noisy(1.0, 20) + [30.0] * 20
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", "carts_cpu", "orders_cpu", "time"])
        for i in range(n):
            w.writerow([1000 + i, cpu[i], noisy(2.0, n)[i], f"21:{i:02d}"])
    (path.parent / "inject_time.txt").write_text("1020")
    data = load_case(path.parent)
    assert data.baseline_end == 1020
    assert analyse(data).ranking[0].service == "carts"


def test_memory_in_mb_keeps_a_floor_and_socket_bytes_stay_bytes(tmp_path):
    # A review of the MB fix: with no floor at all, a sidecar's memory at 0 MB through the
    # baseline scored z ~1e11 on one 0.4 MB blip and took rank 1 (RCD in MB: AC@1 1.00 -> 0.00).
    from controllers.rca.tabular import _own_floor

    n, k = 120, 60
    cpu = noisy(1.0, k) + [c * 30 for c in noisy(1.0, n - k)]
    ghost = [0.0] * (n - 5) + [0.4] + [0.0] * 4
    case = _fault_case(tmp_path / "carts_cpu" / "1", {
        "carts_cpu": cpu, "carts_mem": noisy(300, n, rel=0.01), "orders_cpu": noisy(2.0, n, offset=2),
        "orders_mem": noisy(250, n, rel=0.01, offset=3), "sidecar_mem": ghost,
    }, k)
    result = analyse(load_case(case))
    assert result.ranking[0].service == "carts", [(v.service, v.score) for v in result.ranking]
    # only a count of sockets is scored in sockets: a bytes column with "socket" in its name is bytes
    assert _own_floor("socket", "network", False) == 1.0
    assert _own_floor("container-sockets", "network", False) == 1.0
    assert _own_floor("socket-bytes-sent", "network", False) is None
    assert _own_floor("mem_socket_buffers", "memory", False) is None


def test_a_table_in_bytes_keeps_the_byte_floor_for_its_tiny_memory_columns(tmp_path):
    # A review of the MB fix: a column in bytes that stays under 1 MiB (swap on a swapless node,
    # a zero-filled gap) was read as MB, floor 1 (byte): a 4 KiB blip took rank 1 in every case.
    # Only a table whose memory columns all stay under 1 MiB is in MB.
    n, k = 120, 60
    cpu = noisy(1.0, k) + [c * 30 for c in noisy(1.0, n - k)]
    case = _fault_case(tmp_path / "carts_cpu" / "1", {
        "carts_cpu": cpu, "carts_mem": noisy(3e8, n, rel=0.01), "orders_cpu": noisy(2.0, n, offset=2),
        "orders_mem": noisy(2.5e8, n, rel=0.01, offset=3), "sidecar_mem": [0.0] * (n - 5) + [4096.0] + [0.0] * 4,
    }, k)
    data = load_case(case)
    assert analyse(data).ranking[0].service == "carts"
    assert not any("read as MB" in n for n in data.notes), data.notes


def test_a_header_after_blank_lines_and_repeated_names_twice(tmp_path):
    from controllers.rca.offline import _unique

    assert _unique(["time", "time", "time.1", "a", "a"]) == ["time", "time.2", "time.1", "a", "a.1"]
    case = rcd_case(tmp_path / "carts-cpu" / "1", "carts")
    text = (case / "normal.csv").read_text()
    (case / "normal.csv").write_text("\n \n" + text)  # (pandas reads the first non-blank line as the header)
    assert analyse(load_case(case)).ranking[0].service == "carts"


def test_a_blank_line_in_a_table_is_no_row(tmp_path):
    # A trailing blank line (a file appended with echo): csv.DictReader and pandas skip it; the
    # header fix read it as a row with an empty time and refused the case.
    case = rcd_case(tmp_path / "carts-cpu" / "1", "carts")
    with (case / "normal.csv").open("a") as f:
        f.write("\n")
    with (case / "anomalous.csv").open("a") as f:
        f.write("\n\n")
    assert analyse(load_case(case)).ranking[0].service == "carts"
