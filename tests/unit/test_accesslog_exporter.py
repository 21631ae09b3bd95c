"""The access-log exporter end to end on temporary logs: counts, routes, rotation, restarts, golden /metrics."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.accesslog.config import AccessLogConfig
from exporters.accesslog.exporter import AccessLogExporter, Router
from exporters.accesslog.parse import REASONS

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "accesslog"
GOLDEN = FIXTURES / "metrics.golden.txt"
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)
CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def line(status: int = 200, path: str = "/", nbytes: int = 100, rt: float | None = None, n: int = 0) -> str:
    """A synthetic combined (or timed) line; documentation-range addresses only."""
    base = f'192.0.2.{n % 250} - - [10/Mar/2025:10:00:00 +0000] "GET {path} HTTP/1.1" {status} {nbytes} "-" "test/1.0"'
    return base + (f' rt={rt:.3f} urt="{rt:.3f}"' if rt is not None else "") + "\n"


def write(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def make(cfg: dict, registry: CollectorRegistry | None = None) -> tuple[AccessLogExporter, CollectorRegistry]:
    registry = registry or CollectorRegistry()
    return AccessLogExporter(AccessLogConfig.model_validate(cfg), registry=registry), registry


def total(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    out = 0.0
    for fam in registry.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out += s.value
    return out


def series(registry: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [s.labels for fam in registry.collect() for s in fam.samples if s.name == name]


def test_counts_by_status_class_bytes_and_durations(tmp_path: Path) -> None:
    log = tmp_path / "shop.log"
    shutil.copy(FIXTURES / "shop_timed.log", log)
    exp, reg = make({"logs": [{"site": "shop", "path": str(log), "format": "nginx_timed"}], "from_start": True})
    assert exp.poll() == 14
    get = reg.get_sample_value
    assert [get("promreflex_http_requests_total", {"site": "shop", "status_class": c}) for c in CLASSES] == [0, 5, 1, 2, 1]
    assert get("promreflex_http_response_bytes_total", {"site": "shop"}) == 5120 + 2048 + 157 + 30100 + 153 + 8800 + 150
    assert get("promreflex_accesslog_lines_total", {"site": "shop"}) == 14
    errors = {r: get("promreflex_accesslog_parse_errors_total", {"site": "shop", "reason": r}) for r in REASONS}
    assert errors == {"no_match": 1, "bad_status": 1, "bad_bytes": 1, "bad_time": 1, "oversized": 0, "bad_encoding": 1}
    assert get("promreflex_http_request_duration_seconds_count", {"site": "shop"}) == 9
    assert get("promreflex_http_request_duration_seconds_bucket", {"site": "shop", "le": "0.005"}) == 4
    assert get("promreflex_http_request_duration_seconds_bucket", {"site": "shop", "le": "1.0"}) == 8
    assert get("promreflex_http_request_duration_seconds_sum", {"site": "shop"}) == pytest.approx(1.957)
    assert get("promreflex_http_upstream_response_duration_seconds_count", {"site": "shop"}) == 6
    assert get("promreflex_accesslog_last_line_timestamp_seconds", {"site": "shop"}) > 1.7e9
    # parsed + rejected == lines
    parsed = total(reg, "promreflex_http_requests_total", site="shop")
    assert parsed + sum(errors.values()) == 14
    exp.close()


def test_untimed_log_has_no_duration_series(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    write(log, line(200) + line(500))
    exp, reg = make({"logs": [{"site": "a", "path": str(log)}], "from_start": True})
    exp.poll()
    assert reg.get_sample_value("promreflex_http_requests_total", {"site": "a", "status_class": "5xx"}) == 1
    assert series(reg, "promreflex_http_request_duration_seconds_count") == []
    exp.close()


def test_error_counters_precreated_at_zero_before_any_line(tmp_path: Path) -> None:
    exp, reg = make({"logs": [{"site": "empty", "path": str(tmp_path / "missing.log")}]})
    assert exp.poll() == 0
    for reason in REASONS:
        assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "empty", "reason": reason}) == 0
    for c in CLASSES:
        assert reg.get_sample_value("promreflex_http_requests_total", {"site": "empty", "status_class": c}) == 0
    assert reg.get_sample_value("promreflex_accesslog_last_line_timestamp_seconds", {"site": "empty"}) is None
    exp.close()


def test_oversized_line_counted_as_line_and_error(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    write(log, line(200) + line(200, path="/" + "x" * 600) + line(404))
    exp, reg = make({"logs": [{"site": "a", "path": str(log)}], "from_start": True, "max_line_bytes": 256})
    exp.poll()
    assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "a", "reason": "oversized"}) == 1
    assert reg.get_sample_value("promreflex_accesslog_lines_total", {"site": "a"}) == 3
    assert total(reg, "promreflex_http_requests_total", site="a") == 2
    exp.close()


@pytest.mark.parametrize("fmt", ["nginx_combined", "nginx_timed"])
def test_a_poll_of_only_an_oversized_line_is_counted_not_a_crash(tmp_path: Path, fmt: str) -> None:
    """A stranger's review: a poll (or a backfill chunk) holding nothing but an over-long line
    killed the exporter of every format with a latency histogram (an empty batch against the
    histograms, zip(strict=True)); restarted, it resumed past the line, never counted."""
    log = tmp_path / "a.log"
    write(log, line(200, path="/" + "x" * 600))
    exp, reg = make({"logs": [{"site": "a", "path": str(log), "format": fmt}], "from_start": True,
                     "max_line_bytes": 256})
    exp.poll()
    assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "a", "reason": "oversized"}) == 1
    assert reg.get_sample_value("promreflex_accesslog_lines_total", {"site": "a"}) == 1
    exp.close()


def test_many_distinct_paths_make_no_path_labels(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    write(log, "".join(line(200, path=f"/p/{i}?ref={i}", rt=0.01, n=i) for i in range(500)))
    exp, reg = make({"logs": [{"site": "a", "path": str(log), "format": "nginx_timed"}], "from_start": True})
    exp.poll()
    req = series(reg, "promreflex_http_requests_total")
    assert len(req) == 5 and all(set(s) == {"site", "status_class"} for s in req)
    all_values = {v for fam in reg.collect() for s in fam.samples for v in s.labels.values()}
    assert not any(v.startswith("/") for v in all_values)
    assert total(reg, "promreflex_http_requests_total") == 500
    exp.close()


def test_routes_bound_the_route_label(tmp_path: Path) -> None:
    shop, plain = tmp_path / "shop.log", tmp_path / "plain.log"
    paths = ["/checkout/cart", "/checkout", "/p/1", "/p/2?x=1", "/p/2/reviews", "/about", "/", "garbage"] * 10
    write(shop, "".join(line(200, path=p, rt=0.02, n=i) for i, p in enumerate(paths)))
    write(shop, "".join(line(200, path=f"/random/{i}", rt=0.02, n=i) for i in range(300)))
    write(plain, line(200) + line(302))
    routes = [{"name": "checkout", "prefix": "/checkout"}, {"name": "product", "regex": r"/p/[0-9]+$"}]
    exp, reg = make({
        "logs": [
            {"site": "shop", "path": str(shop), "format": "nginx_timed", "routes": routes},
            {"site": "plain", "path": str(plain)},
        ],
        "from_start": True,
    })
    exp.poll()
    get = reg.get_sample_value
    assert get("promreflex_http_requests_total", {"site": "shop", "status_class": "2xx", "route": "checkout"}) == 20
    assert get("promreflex_http_requests_total", {"site": "shop", "status_class": "2xx", "route": "product"}) == 20
    assert get("promreflex_http_requests_total", {"site": "shop", "status_class": "2xx", "route": "other"}) == 340
    assert get("promreflex_http_request_duration_seconds_count", {"site": "shop", "route": "product"}) == 20
    # a site without routes carries route="" (stored by Prometheus as no route label)
    assert get("promreflex_http_requests_total", {"site": "plain", "status_class": "3xx", "route": ""}) == 1
    routes_seen = {s["route"] for s in series(reg, "promreflex_http_requests_total")}
    assert routes_seen == {"checkout", "product", "other", ""}
    exp.close()


def test_router_first_match_wins_and_query_is_ignored() -> None:
    from exporters.accesslog.config import Route

    r = Router([Route(name="a", prefix="/a"), Route(name="ab", prefix="/ab"), Route(name="q", regex=r"/q$")])
    assert [r.route(p) for p in ["/abc", "/q?x=/a", "/q/", None, ""]] == ["a", "q", "other", "other", "other"]
    assert r.names == ["a", "ab", "q", "other"]


def test_rotation_and_restarts_neither_lose_nor_double_count(tmp_path: Path) -> None:
    """Lines written = the sum of the counters of every exporter run, through rename rotations
    (while running and while down), copytruncate and restarts with the same state dir."""
    log = tmp_path / "access.log"
    cfg = {
        "logs": [{"site": "shop", "path": str(log), "format": "nginx_timed"}],
        "state_dir": str(tmp_path / "state"),
        "from_start": True,
    }
    written = {"n": 0}

    def emit(path: Path, k: int, status: int = 200) -> None:
        write(path, "".join(line(status, rt=0.01, n=written["n"] + i) for i in range(k)))
        written["n"] += k

    counted: list[float] = []

    def finish(exp: AccessLogExporter, reg: CollectorRegistry) -> None:
        exp.close()
        counted.append(total(reg, "promreflex_http_requests_total", site="shop"))
        assert total(reg, "promreflex_accesslog_parse_errors_total") == 0

    # run 1: lines, a partial line at shutdown, rename rotation with late writes to the old file
    exp, reg = make(cfg)
    emit(log, 10)
    exp.poll()
    emit(log, 5)
    os.rename(log, tmp_path / "access.log.1")
    emit(tmp_path / "access.log.1", 3)  # the writer has not reopened yet
    emit(log, 4, status=500)
    exp.poll()
    exp.poll()
    emit(log, 2)
    write(log, line(201, rt=0.01).rstrip("\n")[:40])  # half a line: must be counted once, by the next run
    finish(exp, reg)
    assert reg.get_sample_value("promreflex_accesslog_rotations_total", {"site": "shop"}) == 1

    # while down: the rest of the half line, more lines, and a rotation
    write(log, line(201, rt=0.01)[40:])
    written["n"] += 1
    emit(log, 6)
    os.rename(tmp_path / "access.log.1", tmp_path / "access.log.2")
    os.rename(log, tmp_path / "access.log.1")
    emit(log, 7)

    # run 2: resumes the rotated file from its saved offset, then the new one
    exp, reg = make(cfg)
    assert "draining rotated" in exp.resume_infos()[0]
    exp.poll()
    exp.poll()
    emit(log, 3)
    exp.poll()
    # copytruncate: the copy keeps what was read, the file restarts empty
    shutil.copy(log, tmp_path / "access.log.copy")
    with open(log, "r+b") as f:
        f.truncate(0)
    emit(log, 2, status=404)
    exp.poll()
    assert reg.get_sample_value("promreflex_accesslog_truncations_total", {"site": "shop"}) == 1
    finish(exp, reg)

    # run 3: nothing new; a restart alone must count nothing twice
    exp, reg = make(cfg)
    assert "resumed inode" in exp.resume_infos()[0]
    exp.poll()
    emit(log, 1)
    exp.poll()
    finish(exp, reg)

    assert counted == [22, 21, 1]
    assert sum(counted) == written["n"] == 44


def normalized_exposition(registry: CollectorRegistry) -> str:
    """The exposition without what changes from run to run (creation times, read time)."""
    text = generate_latest(registry).decode()
    keep = [ln for ln in text.splitlines() if "_created" not in ln]
    out = "\n".join(keep) + "\n"
    return re.sub(r"(promreflex_accesslog_last_line_timestamp_seconds\{[^}]*\}) \S+", r"\1 1.7e+09", out)


def golden_registry(tmp_path: Path) -> CollectorRegistry:
    shop, plain = tmp_path / "shop.log", tmp_path / "plain.log"
    shutil.copy(FIXTURES / "shop_timed.log", shop)
    write(plain, line(200) + line(301) + line(404) + "garbage\n")
    exp, reg = make({
        "logs": [
            {"site": "shop", "path": str(shop), "format": "nginx_timed",
             "routes": [{"name": "checkout", "prefix": "/checkout"}, {"name": "product", "regex": r"/p/[0-9]+$"}]},
            {"site": "plain", "path": str(plain), "format": "nginx_combined"},
        ],
        "from_start": True,
    })
    exp.poll()
    exp.close()
    return reg


def test_golden_metrics(tmp_path: Path) -> None:
    got = normalized_exposition(golden_registry(tmp_path))
    if os.environ.get("PROMREFLEX_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "exposition changed: review it, then rerun with PROMREFLEX_UPDATE_GOLDEN=1"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
@pytest.mark.parametrize("which", ["golden", "live"])
def test_promtool_check_metrics(tmp_path: Path, which: str) -> None:
    text = GOLDEN.read_text() if which == "golden" else generate_latest(golden_registry(tmp_path)).decode()
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout + res.stderr == ""


def test_an_absurd_time_is_bad_time_in_a_batch_too(tmp_path: Path) -> None:
    """The batch path (most lines) took any run of digits as a time: rt=1e20 s went into the
    histogram's sum."""
    log = tmp_path / "shop.log"
    line = '203.0.113.9 - - [27/Nov/2026:01:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "ua" rt={} urt="0.003"\n'
    log.write_text(line.format("0.004") * 50 + line.format("99999999999999999999") + line.format("0.006") * 49)
    exp, reg = make({"logs": [{"site": "shop", "path": str(log), "format": "nginx_timed"}], "from_start": True})
    assert exp.poll() == 100
    get = reg.get_sample_value
    assert get("promreflex_accesslog_parse_errors_total", {"site": "shop", "reason": "bad_time"}) == 1
    assert get("promreflex_http_request_duration_seconds_count", {"site": "shop"}) == 99
    assert get("promreflex_http_request_duration_seconds_sum", {"site": "shop"}) == pytest.approx(50 * 0.004 + 49 * 0.006)


@pytest.mark.parametrize("routes", [None, [{"name": "api", "prefix": "/api"}]])
def test_apache_microseconds_are_seconds_in_the_histogram(tmp_path: Path, routes: list | None) -> None:
    """Apache %D (microseconds) read through `$request_time_us`, on the batch path (with and
    without routes) and the exact one (the last, odd line): 2345 us is 0.002345 s, not 2345 s."""
    log = tmp_path / "apache.log"
    line = '192.0.2.1 - - [10/Oct/2023:13:55:36 -0700] "GET /api HTTP/1.1" 200 45 "-" "Mozilla" {}\n'
    log.write_text(line.format("2345") * 60 + line.format("345678") * 39 + line.format("1e3"))
    fmt = '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" $request_time_us'
    site = {"site": "apache", "path": str(log), "format": "custom", "log_format": fmt}
    if routes:
        site["routes"] = routes
    exp, reg = make({"logs": [site], "from_start": True})
    assert exp.poll() == 100
    assert total(reg, "promreflex_accesslog_parse_errors_total", site="apache") == 0
    assert total(reg, "promreflex_http_request_duration_seconds_count", site="apache") == 100
    want = 60 * 0.002345 + 39 * 0.345678 + 0.001
    assert total(reg, "promreflex_http_request_duration_seconds_sum", site="apache") == pytest.approx(want)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/null"])
def test_a_log_that_is_no_regular_file_is_refused_at_start(tmp_path: Path, kind: str) -> None:
    """A stranger's review: the official nginx image links its access log to /dev/stdout; given
    such a path (or a FIFO) the exporter started, said the file did not exist yet, and exported
    zeros for good."""
    from exporters.accesslog.exporter import check_followable
    from promreflex.errors import UserError

    log = tmp_path / "access.log"
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to("/dev/null")
    with pytest.raises(UserError, match="is not a regular file"):
        check_followable(log)
    check_followable(tmp_path / "not-yet.log")  # a file that does not exist yet is still followed
