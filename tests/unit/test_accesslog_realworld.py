"""The access-log exporter on what real deployments throw at it: nginx JSON logs, typos in the
format, globs, a wrong format, a compressed or binary file, a first start on an existing log,
no --state.dir, and the one-shot backfill of a rotated set (totals = ``zcat -f``)."""

from __future__ import annotations

import argparse
import gzip
import io
import logging
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from prometheus_client import CollectorRegistry, Histogram

from exporters.accesslog.backfill import backfill, rotated_set
from exporters.accesslog.cli import add_arguments, config_from_args, parse_log_flag
from exporters.accesslog.config import AccessLogConfig
from exporters.accesslog.exporter import AccessLogExporter
from exporters.accesslog.metrics import HistogramFamily
from exporters.accesslog.parse import build_parser
from promreflex.config import ConfigError
from promreflex.errors import UserError
from promreflex.follow import check_text
from tests.corpus import corpus, needs_corpus

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "accesslog"
CORPUS = corpus("web-access-logs")
CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")

# the log_format that wrote tests/fixtures/accesslog/nginx_json.log (nginx 1.22, escape=json)
JSON_FORMAT = ('{"time":"$time_iso8601","remote_addr":"$remote_addr","request":"$request","status":$status,'
               '"body_bytes_sent":$body_bytes_sent,"request_time":$request_time,'
               '"upstream_response_time":"$upstream_response_time","http_user_agent":"$http_user_agent"}')


def make(cfg: dict) -> tuple[AccessLogExporter, CollectorRegistry]:
    reg = CollectorRegistry()
    return AccessLogExporter(AccessLogConfig.model_validate(cfg), registry=reg), reg


def timed(i: int, status: int = 200, rt: float = 0.01, urt: str = "0.009") -> str:
    return (f'192.0.2.{i % 250} - - [10/Mar/2025:10:00:{i % 60:02d} +0000] "GET /p/{i} HTTP/1.1" {status} {i} '
            f'"-" "t/1" rt={rt:.3f} urt="{urt}"\n')


# ---------------------------------------------------------------- nginx JSON logs


def test_nginx_json_lines_with_empty_upstream_time_are_requests(tmp_path: Path) -> None:
    """Written by a real nginx with escape=json: requests served without an upstream have
    "upstream_response_time":"", one has two tries "0.000, 0.000", one a user agent with \\" and \\\\."""
    log = tmp_path / "json.log"
    shutil.copy(FIXTURES / "nginx_json.log", log)
    exp, reg = make({"logs": [{"site": "j", "path": str(log), "format": "custom", "log_format": JSON_FORMAT}],
                     "from_start": True})
    assert exp.poll() == 4
    get = reg.get_sample_value
    assert get("promreflex_http_requests_total", {"site": "j", "status_class": "2xx"}) == 4
    assert sum(get("promreflex_accesslog_parse_errors_total", {"site": "j", "reason": r}) or 0
               for r in ("no_match", "bad_time", "bad_status", "bad_bytes", "bad_encoding")) == 0
    assert get("promreflex_http_request_duration_seconds_count", {"site": "j"}) == 4
    assert get("promreflex_http_upstream_response_duration_seconds_count", {"site": "j"}) == 1  # only /up
    exp.close()


@pytest.mark.parametrize(("urt", "expected"), [("", None), ("-", None), ("0.001, 0.002", 0.003),
                                               ("0.010 : 0.005", 0.015), ("-, 0.004", 0.004), ("0.250", 0.25)])
def test_upstream_time_forms(urt: str, expected: float | None) -> None:
    p = build_parser("custom", '{"status":$status,"request_time":$request_time,"upstream_response_time":"$upstream_response_time"}')
    r = p.parse(f'{{"status":200,"request_time":0.5,"upstream_response_time":"{urt}"}}')
    assert not isinstance(r, str), r
    assert r.upstream_time == (pytest.approx(expected) if expected is not None else None)


# ---------------------------------------------------------------- silent misconfiguration


@pytest.mark.parametrize("flag", ["shop=/var/log/nginx/access.log:nginx_timd", "shop=/x.log:combined"])
def test_format_typo_is_an_error_naming_the_formats(flag: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse_log_flag(flag)
    msg = str(exc.value)
    assert "unknown format" in msg and "nginx_timed" in msg and "apache_common" in msg
    if "timd" in flag:
        assert "did you mean nginx_timed" in msg


def test_glob_is_an_error_not_a_path(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is a glob"):
        parse_log_flag("shop=/var/log/nginx/*.log:nginx_timed")
    with pytest.raises(ValueError, match="is a glob pattern"):
        AccessLogConfig.model_validate({"logs": [{"site": "a", "path": "/var/log/nginx/*access.log"}]})
    odd = tmp_path / "odd:name.log"  # an existing file whose name only looks like PATH:FORMAT is fine
    odd.touch()
    assert parse_log_flag(f"a={odd}") == {"site": "a", "path": str(odd)}


def test_mostly_rejected_log_is_loud_and_rate_limited(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """nginx_timed on a plain combined log: every line is rejected; say so once, with the fix."""
    log = tmp_path / "combined.log"
    shutil.copy(FIXTURES / "shop_timed.log", log)
    combined = "".join(ln.split(" rt=")[0] + "\n" for ln in log.read_text(errors="replace").splitlines()
                       if " rt=" in ln and "\ufffd" not in ln)
    log.write_text(combined * 20)
    exp, reg = make({"logs": [{"site": "s", "path": str(log), "format": "nginx_timed"}], "from_start": True})
    with caplog.at_level(logging.WARNING, logger="exporters.accesslog.exporter"):
        n = exp.poll()
        with open(log, "a") as f:
            f.write(combined * 20)
        n += exp.poll()
    warnings = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"of {n // 2} lines" in warnings[0] and "no_match" in warnings[0] and "nginx_combined" in warnings[0]
    assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "s", "reason": "no_match"}) == n
    assert reg.get_sample_value("promreflex_accesslog_lines_total", {"site": "s"}) == n
    assert reg.get_sample_value("promreflex_accesslog_log_info", {"site": "s", "format": "nginx_timed"}) == 1
    exp.close()


@pytest.mark.parametrize("kind", ["gzip", "binary"])
def test_following_a_gz_or_binary_file_is_refused(tmp_path: Path, kind: str) -> None:
    log = tmp_path / "access.log.1.gz"
    data = gzip.compress(timed(1).encode()) if kind == "gzip" else random.Random(1).randbytes(8192)
    log.write_bytes(data)
    with pytest.raises(UserError, match="gzip-compressed file, not a text log" if kind == "gzip" else "not text"):
        make({"logs": [{"site": "a", "path": str(log)}], "from_start": True})


# ---------------------------------------------------------------- safe by default


def test_first_start_at_end_says_so_and_counts_skipped_bytes(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(timed(1) + timed(2))
    size = log.stat().st_size
    exp, reg = make({"logs": [{"site": "a", "path": str(log), "format": "nginx_timed"}],
                     "state_dir": str(tmp_path / "st")})
    info = exp.resume_infos()[0]
    assert f"skipped the {size} bytes" in info and "--log.from-start" in info
    assert reg.get_sample_value("promreflex_accesslog_skipped_bytes_total", {"site": "a"}) == size
    exp.poll()
    exp.close()
    with open(log, "a") as f:
        f.write(timed(3))
    exp, reg = make({"logs": [{"site": "a", "path": str(log), "format": "nginx_timed"}],
                     "state_dir": str(tmp_path / "st")})
    assert exp.poll() == 1 and reg.get_sample_value("promreflex_accesslog_skipped_bytes_total", {"site": "a"}) == 0
    exp.close()


def test_without_state_dir_flag_positions_go_to_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--log", f"a={tmp_path / 'a.log'}", "--log.poll-interval", "100ms"]))
    assert cfg.state_dir == tmp_path / "xdg" / "promreflex" / "accesslog"
    assert cfg.poll_interval == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="poll_interval"):
        config_from_args(p.parse_args(["--log", "a=/a.log", "--log.poll-interval", "soon"]))


# ---------------------------------------------------------------- histograms counted locally


def test_local_histogram_exposes_what_prometheus_client_would() -> None:
    buckets = (0.005, 0.01, 0.1, 0.5, 1.0)
    reg_a, reg_b = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("h_seconds", "h", ["site"], buckets=buckets, registry=reg_a)
    ours = HistogramFamily("h_seconds", "h", ["site"], buckets, reg_b)
    from bisect import bisect_left

    h = ours.labels("x")
    values = [0.0, 0.005, 0.0050001, 0.01, 0.3, 1.0, 7.5] + [random.Random(2).random() for _ in range(200)]
    for v in values:
        ref.labels("x").observe(v)
        h.counts[bisect_left(h.bounds, v)] += 1
        h.sum += v
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in reg_a.collect() for s in m.samples
               if not s.name.endswith("_created")}
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in reg_b.collect() for s in m.samples}
    assert got.keys() == samples.keys()
    for k, v in samples.items():
        assert got[k] == pytest.approx(v), k


# ---------------------------------------------------------------- backfill


def zcat_lines(files: list[Path]) -> list[str]:
    out = subprocess.run(["zcat", "-f", *map(str, files)], capture_output=True, check=True).stdout
    return out.decode("utf-8", "replace").splitlines()


def class_totals(lines: list[str], fmt: str) -> dict[str, int]:
    p = build_parser(fmt)
    out = dict.fromkeys(CLASSES, 0)
    for ln in lines:
        r = p.parse(ln)
        if not isinstance(r, str):
            out[f"{r.status // 100}xx"] += 1
    return out


def run_backfill(log: Path, fmt: str) -> tuple[CollectorRegistry, str]:
    out, err = io.StringIO(), io.StringIO()
    cfg = AccessLogConfig.model_validate({"logs": [{"site": "s", "path": str(log), "format": fmt}]})
    reg = backfill(cfg, out=out, err=err)
    return reg, err.getvalue()


def check_against_zcat(log: Path, fmt: str) -> None:
    files = rotated_set(log)
    lines = zcat_lines(files)
    reg, err = run_backfill(log, fmt)
    get = reg.get_sample_value
    assert get("promreflex_accesslog_lines_total", {"site": "s"}) == len(lines), err
    assert {c: get("promreflex_http_requests_total", {"site": "s", "status_class": c}) for c in CLASSES} == \
        class_totals(lines, fmt)
    for f in files:
        assert str(f) in err


def test_backfill_of_a_generated_rotated_set_equals_zcat(tmp_path: Path) -> None:
    """logrotate's usual layout: access.log.5.gz ... access.log.2.gz, access.log.1 (delaycompress), access.log."""
    rnd = random.Random(7)
    log = tmp_path / "access.log"
    n = 0
    names = ["access.log.5.gz", "access.log.4.gz", "access.log.3.gz", "access.log.2.gz", "access.log.1", "access.log"]
    for name in names:
        text = "".join(timed(n + i, rnd.choice([200, 200, 301, 404, 502]), rnd.random()) for i in range(rnd.randint(50, 300)))
        n += text.count("\n")
        data = text.encode()
        (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    (tmp_path / "other.log.1").write_text(timed(0))  # not ours
    assert [p.name for p in rotated_set(log)] == names
    check_against_zcat(log, "nginx_timed")
    reg, _ = run_backfill(log, "nginx_timed")
    assert reg.get_sample_value("promreflex_accesslog_lines_total", {"site": "s"}) == n


def test_a_log_with_a_hole_of_zeros_from_a_crash_is_read(tmp_path: Path) -> None:
    """A crash leaves a block of NUL bytes in a log: the exporters refused to start on it and the
    backfill refused the file (100 good lines lost, the service down). Now the lines are counted;
    the one holding the hole is rejected with a reason."""
    log = tmp_path / "access.log"
    log.write_bytes("".join(timed(i) for i in range(50)).encode() + b"\0" * 4096
                    + "".join(timed(i) for i in range(50, 100)).encode())
    assert check_text(log, allow_gzip=True) is None
    reg, err = run_backfill(log, "nginx_timed")
    get = reg.get_sample_value
    assert get("promreflex_http_requests_total", {"site": "s", "status_class": "2xx"}) == 99, err
    assert get("promreflex_accesslog_lines_total", {"site": "s"}) == 100, err
    (tmp_path / "elf").write_bytes(bytes(range(256)) * 64)  # a binary file is still refused
    assert check_text(tmp_path / "elf", allow_gzip=True) is not None
    (tmp_path / "utf16").write_bytes(timed(1).encode("utf-16-le") * 20)  # every other byte NUL: not this reader's text
    assert check_text(tmp_path / "utf16", allow_gzip=True) is not None


def test_backfill_of_two_logs_of_one_site_reads_each_once(tmp_path: Path) -> None:
    """Two logs for one site (two vhosts' files): the first was ignored and the second counted twice."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("".join(timed(i) for i in range(100)))
    b.write_text("".join(timed(i, 404) for i in range(109)))
    out, err = io.StringIO(), io.StringIO()
    cfg = AccessLogConfig.model_validate({"logs": [{"site": "s", "path": str(a), "format": "nginx_timed"},
                                                   {"site": "s", "path": str(b), "format": "nginx_timed"}]})
    reg = backfill(cfg, out=out, err=err)
    get = reg.get_sample_value
    assert get("promreflex_accesslog_lines_total", {"site": "s"}) == 209, err.getvalue()
    assert get("promreflex_http_requests_total", {"site": "s", "status_class": "2xx"}) == 100
    assert get("promreflex_http_requests_total", {"site": "s", "status_class": "4xx"}) == 109
    assert err.getvalue().count("total 209 lines") == 1


@needs_corpus
@pytest.mark.parametrize(("name", "fmt"), [("apache/elastic-examples_apache_logs.log", "apache_combined"),
                                           ("nginx-combined/lnav_shop_access_log_zanbil_1000.log", "nginx_combined")])
def test_backfill_of_the_corpus_split_into_a_rotated_set_equals_zcat(tmp_path: Path, name: str, fmt: str) -> None:
    lines = (CORPUS / name).read_bytes().splitlines(keepends=True)
    log = tmp_path / "access.log"
    q = len(lines) // 4
    parts = [lines[:q], lines[q : 2 * q], lines[2 * q : 3 * q], lines[3 * q :]]
    (tmp_path / "access.log.3.gz").write_bytes(gzip.compress(b"".join(parts[0])))
    (tmp_path / "access.log.2.gz").write_bytes(gzip.compress(b"".join(parts[1])))
    (tmp_path / "access.log.1").write_bytes(b"".join(parts[2]))
    log.write_bytes(b"".join(parts[3]))
    check_against_zcat(log, fmt)


def test_backfill_refuses_binary_and_other_compressions_before_counting(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(timed(1))
    (tmp_path / "access.log.1.gz").write_bytes(gzip.compress(random.Random(3).randbytes(4096)))
    (tmp_path / "access.log.2.xz").write_bytes(b"\xfd7zXZ\x00" + bytes(64))
    out = io.StringIO()
    with pytest.raises(UserError) as exc:
        backfill(AccessLogConfig.model_validate({"logs": [{"site": "s", "path": str(log)}]}), out=out, err=io.StringIO())
    msg = str(exc.value)
    assert "access.log.1.gz" in msg and "not text" in msg and "access.log.2.xz" in msg and "xz" in msg
    assert out.getvalue() == ""  # nothing counted, nothing printed


# ---------------------------------------------------------------- the batch path equals the exact one


ODD_LINES = [ln.replace("\n", "") for ln in [
    timed(1), timed(2, 304, 0.0, "-"), timed(3, 502, 1.25, "0.600, 0.640"), timed(4, urt="-, 0.004"),
    timed(5, urt="0.400 : 0.015"), timed(6, urt=""), timed(7, urt="-, -"),
    timed(8).replace("rt=0.010", "rt=1e-3"), timed(9).replace("rt=0.010", "rt=-1"),
    timed(10).replace("rt=0.010", "rt=nan"), timed(11).replace("rt=0.010", "rt=0.010x"),
    timed(12).replace(" 200 12 ", " 200 1_000 "), timed(13).replace(" 200 13 ", " 099 13 "),
    timed(14).replace(" 200 14 ", " 200 - "), timed(15).replace('"t/1"', '"unbalanced'), "", "garbage",
    timed(16).replace('rt=0.010 urt="0.009"', "0.010 0.009"), timed(17).rstrip() + " trailing",
]]


def batch_and_exact(cfg_log: dict, lines: list[str]) -> None:
    exp, _ = make({"logs": [{"site": "s", "path": "/nonexistent/x.log", **cfg_log}]})
    site = exp.sites[0]
    batch, exact = site._count_batch(lines), site._count_exact(lines)  # noqa: SLF001 - the two paths are the point
    assert batch is not None
    assert (batch.counts, batch.errors, batch.body_bytes) == (exact.counts, exact.errors, exact.body_bytes)
    assert batch.durations == exact.durations and batch.upstream == exact.upstream
    exp.close()


@pytest.mark.parametrize("routes", [None, [{"name": "p", "regex": "/p/[0-9]+$"}, {"name": "img", "prefix": "/image"}]])
def test_batch_path_counts_exactly_like_the_line_parser(routes: list | None) -> None:
    extra = {"routes": routes} if routes else {}
    text = (FIXTURES / "shop_timed.log").read_text(errors="replace").splitlines()
    fixture = [ln for ln in text if "\ufffd" not in ln]  # damaged bytes take the exact path anyway
    batch_and_exact({"format": "nginx_timed", **extra}, ODD_LINES + fixture)
    batch_and_exact({"format": "nginx_combined", **extra}, ODD_LINES + fixture)
    batch_and_exact({"format": "custom", "log_format": JSON_FORMAT, **extra},
                    (FIXTURES / "nginx_json.log").read_text().splitlines() + ["{}", ""])
    if CORPUS.is_dir() or os.environ.get("CI", "").lower() == "true":  # the corpus part: required under CI
        for name, fmt in [("apache/elastic-examples_apache_logs.log", "apache_combined"),
                          ("apache/elastic-examples_apache_logs.log", "nginx_combined"),
                          ("nginx-combined/lnav_shop_access_log_zanbil_1000.log", "nginx_timed"),
                          ("nginx-combined/duplex-dev_nginx_access.log", "apache_common")]:
            lines = [ln for ln in (CORPUS / name).read_text(errors="replace").splitlines() if "\ufffd" not in ln]
            batch_and_exact({"format": fmt, **extra}, lines)


def test_a_quote_left_open_does_not_swallow_the_next_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    open_quote = '192.0.2.1 - - [10/Mar/2025:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "agent'
    log.write_text(open_quote + "\n" + timed(2) + timed(3))
    exp, reg = make({"logs": [{"site": "s", "path": str(log), "format": "nginx_timed"}], "from_start": True})
    exp.poll()
    assert reg.get_sample_value("promreflex_http_requests_total", {"site": "s", "status_class": "2xx"}) == 2
    assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "s", "reason": "no_match"}) == 1
    exp.close()


# ---------------------------------------------------------------- formats as others write them (review M)

# nginx 1.22 wrote tests/fixtures/accesslog/nginx_json_upstream_status.log with this format (escape=json),
# as published JSON formats log $upstream_status: a request nginx answered itself (a static file, its
# own 404, a `return`, a limit_req 429) has "upstream_status":"" (escape=json writes an unset variable
# empty), and every such line was rejected
JSON_UPSTREAM_STATUS = (
    '{"time_local":"$time_local","remote_addr":"$remote_addr","request_method":"$request_method",'
    '"request_uri":"$request_uri","status":$status,"body_bytes_sent":$body_bytes_sent,"http_referer":"$http_referer",'
    '"http_user_agent":"$http_user_agent","request_time":$request_time,"upstream_response_time":"$upstream_response_time",'
    '"upstream_addr":"$upstream_addr","upstream_status":"$upstream_status"}')
# Apache 2.4 wrote tests/fixtures/accesslog/apache_quotes_D.log with
# LogFormat "%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\" %D" (its first line: a
# request, a Referer and a User-Agent holding quotes, which Apache writes as \")
APACHE_D = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
            '"$http_user_agent" $request_time_us')


def classes(reg: CollectorRegistry, site: str) -> dict[str, float]:
    return {c: reg.get_sample_value("promreflex_http_requests_total", {"site": site, "status_class": c}) or 0
            for c in CLASSES}


def test_json_lines_with_an_empty_upstream_status_are_requests(tmp_path: Path) -> None:
    log = tmp_path / "json.log"
    shutil.copy(FIXTURES / "nginx_json_upstream_status.log", log)
    exp, reg = make({"logs": [{"site": "j", "path": str(log), "format": "custom", "log_format": JSON_UPSTREAM_STATUS}],
                     "from_start": True})
    assert exp.poll() == 25
    assert classes(reg, "j") == {"1xx": 0, "2xx": 8, "3xx": 1, "4xx": 14, "5xx": 2}
    assert reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "j", "reason": "no_match"}) == 0
    exp.close()
    parser = build_parser("custom", JSON_UPSTREAM_STATUS)  # the line-by-line path too
    assert not [ln for ln in log.read_text().splitlines() if isinstance(parser.parse(ln), str)]


@pytest.mark.parametrize(("log_format", "escapes", "read"), [
    (APACHE_D, None, True),  # $request_time_us: an Apache log, whose quoted fields hold \"
    (APACHE_D.replace("_us", "_ms"), None, True),
    (APACHE_D.replace("_us", ""), True, True),  # %T as $request_time: said in the configuration
    (APACHE_D.replace("_us", ""), None, False),  # nginx writes \x22: not escape-aware by default
    (APACHE_D, False, False),
])
def test_an_apache_log_read_with_a_custom_format_keeps_requests_holding_quotes(
        tmp_path: Path, log_format: str, escapes: bool | None, read: bool) -> None:
    log = tmp_path / "apache.log"
    lines = (FIXTURES / "apache_quotes_D.log").read_text().splitlines()
    if "$request_time_" not in log_format:  # %T: whole seconds in the last field
        lines = [ln.rsplit(" ", 1)[0] + " 0" for ln in lines]
    log.write_text("\n".join(lines) + "\n")
    source = {"site": "a", "path": str(log), "format": "custom", "log_format": log_format}
    if escapes is not None:
        source["backslash_escapes"] = escapes
    exp, reg = make({"logs": [source], "from_start": True})
    exp.poll()
    rejected = reg.get_sample_value("promreflex_accesslog_parse_errors_total", {"site": "a", "reason": "no_match"})
    assert rejected == (0 if read else 1)
    assert classes(reg, "a")["4xx"] == (6 if read else 5)
    exp.close()


def test_backslash_escapes_belongs_to_custom_formats() -> None:
    with pytest.raises(ValueError, match="backslash_escapes is only read with format 'custom'"):
        AccessLogConfig.model_validate({"logs": [{"site": "a", "path": "/x.log", "backslash_escapes": True}]})


def test_the_warning_names_runs_of_spaces_and_nginx_gzip(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Bitnami's nginx `main`: '... "$request" $status  $body_bytes_sent ...' (two spaces), written by nginx
    bitnami = tmp_path / "bitnami.log"
    bitnami.touch()
    # `access_log ... gzip`: nginx creates the file empty, then writes gzip members into it
    gz = tmp_path / "access.log.gz"
    gz.touch()
    exp, _ = make({"logs": [{"site": "b", "path": str(bitnami)}, {"site": "g", "path": str(gz)}]})
    line = '127.0.0.1 - - [28/Nov/2026:15:54:42 +0000] "GET / HTTP/1.1" 200  6 "-" "curl/7.88.1" "-"\n'
    bitnami.write_text(line * 150)
    gz.write_bytes(b"".join(gzip.compress(timed(i).encode() * 50) for i in range(150)))
    with caplog.at_level(logging.WARNING, logger="exporters.accesslog.exporter"):
        exp.poll()
    said = {r.getMessage().split(":")[0]: r.getMessage() for r in caplog.records if "rejected" in r.getMessage()}
    assert "two or more spaces between fields" in said["site b"] and "format: custom" in said["site b"]
    assert "nginx writes this log gzip-compressed" in said["site g"]
    exp.close()


def test_ingress_nginx_default_format_with_escape_json(tmp_path: Path) -> None:
    # ingress-nginx's upstreaminfo with log-format-escape-json (nginx 1.22 wrote these): a request
    # answered by nginx itself leaves the upstream fields empty, not "-"; quotes come as \"
    fmt = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
           '"$http_user_agent" $request_length $request_time [$proxy_upstream_name] [$proxy_alternative_upstream_name] '
           '$upstream_addr $upstream_response_length $upstream_response_time $upstream_status $req_id')
    lines = [
        '127.0.0.1 -  [28/Nov/2026:16:07:46 +0000] "GET /missing HTTP/1.1" 404 153 "" "" 61 0.000 [default-shop-80] []     '
        '066ad8609c40fdbd0e174aff8decb85f',
        '127.0.0.1 -  [28/Nov/2026:16:07:47 +0000] "GET /q\\"uote\\\\back?x=1 HTTP/1.1" 404 153 "http://ex ample/ a\\"b" '
        '"Mo\\"zilla \\\\ 5.0 \u2713" 132 0.000 [default-shop-80] []     0a1b2c3d4e5f60718293a4b5c6d7e8f9',
        '127.0.0.1 -  [28/Nov/2026:16:07:47 +0000] "GET /app HTTP/1.1" 200 6 "" "curl/7.88.1" 70 0.002 [default-shop-80] [] '
        '127.0.0.1:21201 6 0.002 200 1f2e3d4c5b6a79880796a5b4c3d2e1f0',
    ]
    parser = build_parser("custom", fmt, backslash_escapes=True)
    assert [getattr(parser.parse(ln), "status", None) for ln in lines] == [404, 404, 200]
    assert build_parser("custom", fmt).parse(lines[1]) == "no_match"  # nginx's default escaping: \x22


def test_backslash_escapes_is_a_strict_switch_and_named_by_the_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError):
        AccessLogConfig.model_validate({"logs": [{"site": "a", "path": "/x.log", "format": "custom",
                                                  "log_format": APACHE_D, "backslash_escapes": "yes"}]})
    json_line = '{"status":200,"request_time":0.5,"ua":"a \\" b"}'
    json_format = '{"status":$status,"request_time":$request_time,"ua":"$http_user_agent"}'
    assert not isinstance(build_parser("custom", json_format).parse(json_line), str)
    assert build_parser("custom", json_format, backslash_escapes=False).parse(json_line) == "no_match"  # as said
    # Apache's %T written as $request_time: nothing says it is Apache's; the warning does
    log = tmp_path / "apache.log"
    log.touch()
    fmt = APACHE_D.replace("_us", "")
    exp, _ = make({"logs": [{"site": "a", "path": str(log), "format": "custom", "log_format": fmt}]})
    quoted = '127.0.0.1 - - [28/Nov/2026:15:55:58 +0000] "GET /q\\"uote HTTP/1.1" 404 236 "-" "Mo\\"zilla" 0\n'
    log.write_text(quoted * 150)
    with caplog.at_level(logging.WARNING, logger="exporters.accesslog.exporter"):
        exp.poll()
    assert "add `backslash_escapes: true`" in caplog.text
    exp.close()
