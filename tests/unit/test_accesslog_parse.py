"""Access-log parsing: the real-world corpus, the built-in formats, and user log_format strings."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from exporters.accesslog.parse import (
    REASONS,
    LogFormatError,
    Parsed,
    build_parser,
    compile_log_format,
    request_path,
)
from tests.corpus import corpus, needs_corpus

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "accesslog"
CORPUS = corpus("web-access-logs")


def classify(fmt: str, path: Path) -> Counter:
    """Status class or rejection reason of every line of a file."""
    parser = build_parser(fmt)
    out: Counter = Counter()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            r = parser.parse(line.rstrip("\n"))
            out[r if isinstance(r, str) else f"{r.status // 100}xx"] += 1
    return out


# Observed on the corpus first, then frozen: every line is either a request or a named rejection.
CORPUS_EXPECTED = [
    # one Apache line has its user agent cut off before the closing quote: nginx_combined rejects
    # it, while the Apache formats (common + ignored trailing text) still count its status
    ("nginx_combined", "apache/elastic-examples_apache_logs.log", 10000,
     {"2xx": 9170, "3xx": 609, "4xx": 217, "5xx": 3, "no_match": 1}),
    ("apache_combined", "apache/elastic-examples_apache_logs.log", 10000,
     {"2xx": 9171, "3xx": 609, "4xx": 217, "5xx": 3}),
    ("apache_common", "apache/elastic-examples_apache_logs.log", 10000,
     {"2xx": 9171, "3xx": 609, "4xx": 217, "5xx": 3}),
    # includes a TLS handshake sent to the plain-HTTP port (status 400, request escaped by nginx)
    ("nginx_combined", "nginx-combined/duplex-dev_nginx_access.log", 78,
     {"2xx": 10, "3xx": 20, "4xx": 2, "5xx": 46}),
    # combined plus a trailing "$http_x_forwarded_for": the trailing field is ignored ...
    ("nginx_combined", "nginx-combined/lnav_shop_access_log_zanbil_1000.log", 1000,
     {"2xx": 938, "3xx": 38, "4xx": 24}),
    # ... and nginx_timed finds a non-time where $request_time goes
    ("nginx_timed", "nginx-combined/lnav_shop_access_log_zanbil_1000.log", 1000, {"bad_time": 1000}),
    # a timed format on a log without times matches nothing
    ("nginx_timed", "nginx-combined/duplex-dev_nginx_access.log", 78, {"no_match": 78}),
]


@needs_corpus
@pytest.mark.parametrize(("fmt", "name", "total", "expected"), CORPUS_EXPECTED)
def test_corpus_every_line_parsed_or_rejected_with_reason(fmt: str, name: str, total: int, expected: dict) -> None:
    path = CORPUS / name
    got = classify(fmt, path)
    n_lines = sum(1 for _ in open(path, "rb"))
    assert n_lines == total
    assert sum(got.values()) == total
    assert dict(got) == expected
    assert set(got) - {"1xx", "2xx", "3xx", "4xx", "5xx"} <= set(REASONS)


def test_timed_fixture_each_line() -> None:
    parser = build_parser("nginx_timed")
    lines = (FIXTURES / "shop_timed.log").read_text(encoding="utf-8", errors="replace").splitlines()
    got = [parser.parse(line, want_path=True) for line in lines]
    assert got[0] == Parsed(200, 5120, 0.004, 0.003, "/")
    assert got[2].status == 502 and got[2].upstream_time == pytest.approx(1.24)  # two upstream tries summed
    assert got[4] == Parsed(304, 0, 0.0, None, "/static/app.css")  # urt="-": served locally
    assert got[5] == Parsed(404, 153, 0.012, 0.011, "/p/99/reviews")  # plain trailing fields
    assert got[6].upstream_time == pytest.approx(0.415)  # internal redirect: "0.400 : 0.015"
    assert got[7] == Parsed(200, 0, 0.001, None, "/healthz")  # $body_bytes_sent "-"
    assert got[8:14] == ["bad_status", "bad_time", "bad_bytes", "no_match", got[12], "bad_encoding"]
    assert got[12].status == 400 and got[12].path is None  # TLS bytes on the HTTP port: no path


def test_apache_combined_accepts_common_lines() -> None:
    p = build_parser("apache_combined")
    r = p.parse('198.51.100.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326')
    assert r == Parsed(200, 2326, None, None, None)
    assert not p.has_times


def test_nul_bytes_are_bad_encoding() -> None:
    assert build_parser("nginx_combined").parse("\x00\x00\x00") == "bad_encoding"


def test_custom_log_format_with_forwarded_for_and_times() -> None:
    fmt = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
           '"$http_referer" "$http_user_agent" "$http_x_forwarded_for" $request_time $upstream_response_time '
           '$pipe ${upstream_cache_status}')
    p = build_parser("custom", fmt)
    assert p.has_times and p.has_upstream_times and p.has_path
    line = ('203.0.113.5 - alice [10/Mar/2025:10:00:00 +0100] "GET /p/1?x=2 HTTP/2.0" 201 99 '
            '"-" "agent with spaces" "198.51.100.1, 198.51.100.2" 0.250 0.100, 0.120 . HIT')
    assert p.parse(line, want_path=True) == Parsed(201, 99, 0.25, pytest.approx(0.22), "/p/1?x=2")
    regex, names = compile_log_format(fmt)
    m = regex.match(line)
    assert m is not None
    assert m["http_x_forwarded_for"] == "198.51.100.1, 198.51.100.2"
    assert m["upstream_cache_status"] == "HIT"
    assert names[-1] == "upstream_cache_status"


def test_custom_log_format_uri_variable_and_repeated_variable() -> None:
    p = build_parser("custom", "$status|$uri|$request_time|$status")
    assert p.parse("200|/a b/c|0.5|200", want_path=True) == Parsed(200, 0, 0.5, None, "/a b/c")
    assert p.parse("200|/x|0.5", want_path=True) == "no_match"


def test_custom_log_format_unknown_variables_are_fields() -> None:
    regex, names = compile_log_format('$ssl_protocol/$ssl_cipher "$request" $status $my_var_1')
    assert names == ["ssl_protocol", "ssl_cipher", "request", "status", "my_var_1"]
    m = regex.match('TLSv1.3/TLS_AES_256_GCM_SHA384 "GET / HTTP/1.1" 200 anything at all')
    assert m is not None and m["ssl_cipher"] == "TLS_AES_256_GCM_SHA384" and m["my_var_1"] == "anything at all"


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("", "needs log_format"),
        ("   ", "empty"),
        ("no variables here", "no $variable"),
        ("$remote_addr$status", "directly followed"),
        ("$remote_addr $request_time", "no $status"),
    ],
)
def test_bad_log_formats_are_clear_errors(fmt: str, message: str) -> None:
    with pytest.raises(LogFormatError, match=message.replace("$", r"\$")):
        build_parser("custom", fmt)


def test_unknown_format_name() -> None:
    with pytest.raises(LogFormatError, match="unknown format"):
        build_parser("iis")


@pytest.mark.parametrize(
    ("request_line", "path"),
    [("GET /a?b=1 HTTP/1.1", "/a?b=1"), ("GET /x", "/x"), ("-", None), ("GET  HTTP/1.1", None)],
)
def test_request_path(request_line: str, path: str | None) -> None:
    assert request_path(request_line) == path


def test_literal_regex_characters_in_format_are_escaped() -> None:
    p = build_parser("custom", "($status) [$body_bytes_sent] *$request_time+")
    assert p.parse("(200) [5] *0.1+") == Parsed(200, 5, 0.1, None, None)
    assert p.parse("x200) [5] *0.1+") == "no_match"


def test_absurd_times_are_bad_time_on_both_paths() -> None:
    """A time no request has (20 digits: 1e20 s) went into the histogram's sum, where later
    observations vanish in float precision: bad_time, by the line parser and the batch path."""
    p = build_parser("nginx_timed")
    line = ('203.0.113.9 - - [27/Nov/2026:01:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "ua" '
            'rt={} urt="0.003"')
    assert p.parse(line.format("0.004")).request_time == 0.004
    for junk in ("99999999999999999999", "100000.0", "1e308", "inf", "nan"):
        assert p.parse(line.format(junk)) == "bad_time", junk


def test_a_custom_separator_splits_without_trying_every_split() -> None:
    """`$a|$b|$c`: each value runs to its separator. A lazy `.*?` per field tried every split
    of a line that did not match (O(n^3): a 4 KB line of a drifted format took 37 s)."""
    from exporters.accesslog.parse import compile_log_format

    rx, names = compile_log_format("$remote_addr|$host|$request_id|$x $status")
    assert ".*?" not in rx.pattern
    m = rx.match("1.2.3.4|shop.example|abc123|y 200")
    assert m is not None and m.group("host") == "shop.example" and m.group("status") == "200"
    assert rx.match("1.2.3.4|" + "a|" * 2000 + "x") is None
    # lists nginx writes with ", " stay one value under a comma-separated format
    rx, _ = compile_log_format("$remote_addr,$http_x_forwarded_for,$status,$request_time")
    m = rx.match("10.0.0.1,1.2.3.4, 5.6.7.8,200,0.010")
    assert m is not None and m.group("http_x_forwarded_for") == "1.2.3.4, 5.6.7.8" and m.group("status") == "200"
