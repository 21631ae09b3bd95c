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
    # ... and nginx_timed finds no time where $request_time goes (a plain field must look like
    # one: a quoted field, or ingress-nginx's $request_length, is not read as the time)
    ("nginx_timed", "nginx-combined/lnav_shop_access_log_zanbil_1000.log", 1000, {"no_match": 1000}),
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
    [("GET /a?b=1 HTTP/1.1", "/a?b=1"), ("GET /x", "/x"), ("-", None), ("GET  HTTP/1.1", None),
     # the absolute form, by its path as nginx's $uri (a stranger's review: routed to "other")
     ("GET http://shop.example/checkout/pay?x=1 HTTP/1.1", "/checkout/pay?x=1"),
     ("GET HTTPS://shop.example:8443/a HTTP/1.1", "/a"), ("GET http://shop.example HTTP/1.1", "/")],
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


def test_a_value_never_gives_back_a_separator_and_space() -> None:
    """The rule above, held: a value runs to the first separator NOT followed by a space, so
    "x; y" is one value and never "x" then " y". Greedy alone gave such pairs back when the rest
    of the line failed, trying every "; " of one field against every one of the next: a client's
    User-Agent and Referer of 8 KB each cost 1 s of CPU per line (a stranger's review; here the
    split is checked, not timed)."""
    from exporters.accesslog.parse import compile_log_format

    rx, _ = compile_log_format("$http_referer;$http_user_agent;$status")
    assert rx.fullmatch("a; b; c;200") is None  # only "a" then " b; c" would split it: giving back "; "
    m = rx.fullmatch("a; b;Mozilla/5.0 (X11; Linux x86_64);200")
    assert m is not None and m.group("http_referer") == "a; b" and m.group("http_user_agent") == "Mozilla/5.0 (X11; Linux x86_64)"
    p = build_parser("custom", "$remote_addr;$time_iso8601;$request;$status;$body_bytes_sent;$http_referer;$http_user_agent;$request_time")
    ref, ua = "a" + "; a" * 2600, "b" + "; b" * 2600 + ";x; c"
    line = ";".join(["1.2.3.4", "2026-11-28T00:00:00+00:00", "GET / HTTP/1.1", "200", "3", ref, ua, "0.001"])
    assert p.parse(line) == "no_match"
    # a format whose own separator is followed by a space keeps giving back (the split found last)
    rx, _ = compile_log_format("$http_user_agent; $status")
    m = rx.fullmatch("Mozilla/5.0 (X11; Linux x86_64); 200")
    assert m is not None and m.group("http_user_agent") == "Mozilla/5.0 (X11; Linux x86_64)"


def batch_statuses(p, lines: list[str]) -> list[str]:
    """What the batch path (one findall over many lines) makes of each line: its status, or
    "bad" when it falls to the catch-all (then the line parser judges it)."""
    bp = p.batch
    rows = bp.regex.findall("".join(x + "\n" for x in lines))
    assert len(rows) == len(lines)
    return [r[bp.status] or "bad" if not r[bp.bad] else "bad" for r in rows]


# ingress-nginx's documented default log-format-upstream: $upstream_addr and
# $upstream_response_length are unquoted, and lists after a retry ("a, b").
INGRESS_NGINX = (
    '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
    '"$http_user_agent" $request_length $request_time [$proxy_upstream_name] [$proxy_alternative_upstream_name] '
    '$upstream_addr $upstream_response_length $upstream_response_time $upstream_status $req_id'
)
INGRESS_LINES = [
    '192.168.65.1 - - [10/Oct/2023:13:55:36 +0000] "GET /api HTTP/1.1" 200 5 "-" "curl/8.1.2" 80 0.010 '
    '[default-api-80] [] 10.1.0.7:80 5 0.009 200 6f5d1fda8b9a0c4b3a7f2c2e1d0b9a8c',
    '192.168.65.1 - - [10/Oct/2023:13:55:37 +0000] "GET /api HTTP/1.1" 502 150 "-" "curl/8.1.2" 80 0.010 '
    '[default-api-80] [] 10.1.0.7:80, 10.1.0.8:80 0, 0 0.004, 0.005 502, 502 7f5d1fda8b9a0c4b3a7f2c2e1d0b9a8c',
    '192.168.65.1 - - [10/Oct/2023:13:55:38 +0000] "GET /api HTTP/1.1" 504 160 "-" "curl/8.1.2" 80 10.002 '
    '[default-api-80] [] 10.1.0.7:80, 10.1.0.8:80, 10.1.0.9:80 0, 0, 0 5.000, 5.001, 0.001 504, 504, 502 8f5d',
    '192.168.65.1 - - [10/Oct/2023:13:55:39 +0000] "GET /x HTTP/1.1" 404 0 "-" "curl/8.1.2" 80 0.000 '
    '[] [] - - - - 9f5d',
    # an internal redirect to another upstream group: " : " between the groups
    '192.168.65.1 - - [10/Oct/2023:13:55:40 +0000] "GET /api HTTP/1.1" 503 0 "-" "curl/8.1.2" 80 0.020 '
    '[default-api-80] [] 10.1.0.7:80 : unix:/run/x.sock 0 : 12 0.004 : 0.010 502 : 503 af5d',
]


def test_ingress_nginx_is_not_read_as_nginx_timed() -> None:
    """nginx_timed took ingress-nginx's `$request_length $request_time` for its two plain time
    fields: 80 s for a request of 10 ms, the request time read as the upstream's; no rejection,
    no warning. A plain time must look like $request_time now (custom reads the log exactly,
    above and below)."""
    timed = build_parser("nginx_timed")
    assert [timed.parse(x) for x in INGRESS_LINES] == ["no_match"] * len(INGRESS_LINES)
    plain = INGRESS_LINES[0].split(' 80 0.010 ')[0] + " 0.010 0.009"  # the plain variant itself
    assert timed.parse(plain).request_time == pytest.approx(0.010)


def test_ingress_nginx_retries_with_upstream_lists_are_counted() -> None:
    p = build_parser("custom", INGRESS_NGINX)
    got = [p.parse(x) for x in INGRESS_LINES]
    assert [r if isinstance(r, str) else r.status for r in got] == [200, 502, 504, 404, 503]
    assert got[2].upstream_time == pytest.approx(10.002) and got[3].upstream_time is None
    assert batch_statuses(p, INGRESS_LINES) == ["200", "502", "504", "404", "503"]
    m = compile_log_format(INGRESS_NGINX)[0].match(INGRESS_LINES[2])
    assert m is not None and m["upstream_addr"] == "10.1.0.7:80, 10.1.0.8:80, 10.1.0.9:80"
    assert m["upstream_response_length"] == "0, 0, 0" and m["req_id"] == "8f5d"


@pytest.mark.parametrize(
    "var",
    ["upstream_addr", "upstream_response_length", "upstream_bytes_sent", "upstream_bytes_received",
     "upstream_connect_time", "upstream_header_time", "upstream_status", "upstream_queue_time"],
)
def test_every_upstream_list_variable_may_be_a_list_unquoted(var: str) -> None:
    value = "10.0.0.1:80, 10.0.0.2:80 : 10.0.0.3:80" if var == "upstream_addr" else "0.001, 0.002 : 0.003"
    if var == "upstream_status":
        value = "502, 504 : 200"
    for fmt in (f"$status ${var} $request_time", f"$status|${var}|$request_time", f"$status ${var}"):
        line = fmt.replace(f"${var}", value).replace("$status", "200").replace("$request_time", "0.5")
        m = compile_log_format(fmt)[0].match(line)
        assert m is not None and m[var] == value, (fmt, line)
    m = compile_log_format(f'$status "${{{var}}}"')[0].match(f'200 "{value}"')
    assert m is not None and m[var] == value
    if var in ("upstream_addr", "upstream_response_length"):  # quoted: anything up to the quote, as before
        m = compile_log_format(f'$status "${{{var}}}"')[0].match('200 "a b, c"')
        assert m is not None and m[var] == "a b, c"


def test_time_local_without_brackets() -> None:
    fmt = '$time_local $remote_addr "$request" $status $body_bytes_sent $request_time'
    p = build_parser("custom", fmt)
    line = '10/Oct/2023:13:55:36 +0000 192.0.2.1 "GET / HTTP/1.1" 200 45 0.123'
    assert p.parse(line) == Parsed(200, 45, 0.123, None, None)
    assert batch_statuses(p, [line]) == ["200"]
    assert p.parse('10/Oct/2023:13:55:36 192.0.2.1 "GET / HTTP/1.1" 200 45 0.123') == "no_match"


APACHE_D = '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" '


@pytest.mark.parametrize(
    ("var", "values", "seconds"),
    [
        # Apache %D / %{us}T: microseconds
        ("request_time_us", ["2345", "345678", "0", "99999999999"], [0.002345, 0.345678, 0.0, 99999.999999]),
        # Apache %{ms}T: milliseconds
        ("request_time_ms", ["2", "345", "12.5"], [0.002, 0.345, 0.0125]),
        # Apache %T: whole seconds, as nginx's $request_time
        ("request_time", ["0", "3"], [0.0, 3.0]),
    ],
)
def test_request_time_units_for_apache_durations(var: str, values: list[str], seconds: list[float]) -> None:
    """%D is microseconds: read as $request_time a 2.3 ms request was 2345 s, and a 0.35 s one
    was rejected as bad_time (and not counted at all)."""
    p = build_parser("custom", APACHE_D + "$" + var)
    assert p.has_times
    lines = [f'192.0.2.1 - - [10/Oct/2023:13:55:36 -0700] "GET / HTTP/1.1" 200 45 "-" "Mozilla" {v}' for v in values]
    got = [p.parse(x) for x in lines]
    assert [r.request_time for r in got] == pytest.approx(seconds)  # type: ignore[union-attr]
    # the batch path reads the same column in the same unit
    bp = p.batch
    rows = bp.regex.findall("".join(x + "\n" for x in lines))
    assert [float(r[bp.request_time]) / bp.time_divisor for r in rows] == pytest.approx(seconds)


def test_request_time_us_beyond_the_bound_is_bad_time() -> None:
    p = build_parser("custom", APACHE_D + "$request_time_us")
    line = '192.0.2.1 - - [10/Oct/2023:13:55:36 -0700] "GET / HTTP/1.1" 200 45 "-" "Mozilla" {}'
    assert p.parse(line.format("100000000000")) == "bad_time"  # 1e5 s
    assert p.parse(line.format("x")) == "bad_time"


def test_apache_vhost_combined_is_built_in() -> None:
    """Debian's other_vhosts_access.log: `%v:%p` before `combined`; was no_match with apache_combined."""
    p = build_parser("apache_vhost_combined")
    lines = [
        'www.example.com:443 192.0.2.1 - - [10/Oct/2023:13:55:36 -0700] "GET /a HTTP/1.1" 200 45 "-" "Mozilla x"',
        'www.example.com:80 2001:db8::1 - - [10/Oct/2023:13:55:36 -0700] "GET / HTTP/1.1" 404 - "-" "-"',
        'shop:80 192.0.2.1 - bob [10/Oct/2023:13:55:36 -0700] "POST /c HTTP/1.1" 503 0',
    ]
    assert [p.parse(x, want_path=True) for x in lines] == [
        Parsed(200, 45, None, None, "/a"), Parsed(404, 0, None, None, "/"), Parsed(503, 0, None, None, "/c")]
    assert batch_statuses(p, lines) == ["200", "404", "503"]
    assert p.parse('192.0.2.1 - - [10/Oct/2023:13:55:36 -0700] "GET / HTTP/1.1" 200 45 "-" "M"') == "no_match"
    from exporters.accesslog.config import AccessLogConfig

    cfg = AccessLogConfig.model_validate({"logs": [{"site": "w", "path": "/x.log", "format": "apache_vhost_combined"}]})
    assert cfg.logs[0].format == "apache_vhost_combined"


@pytest.mark.parametrize("var", ["upstream_http_cache_control", "upstream_cookie_session", "upstream_trailer_grpc_status"])
def test_the_upstreams_header_values_are_free_text_not_lists(var: str) -> None:
    """A header value with a comma ("no-cache,no-store") parsed before the list patterns came,
    and was then no_match (a review of that change)."""
    fmt = f"$status ${var} $request_time"
    m = compile_log_format(fmt)[0].match("200 no-cache,no-store 0.5")
    assert m is not None and m[var] == "no-cache,no-store"


def test_what_other_servers_write_inside_quotes_and_lists() -> None:
    """A stranger's review with real output: Apache writes a quote inside a field as \\" (probes
    with quotes in the request line were no_match in every Apache format); nginx's escape=json
    leaves bytes above 0x7F raw (a TLS handshake on the plain port, a binary URI: bad_encoding);
    an unquoted $proxy_add_x_forwarded_for list first in the line (no_match for every proxied
    request, a biased sample)."""
    apache = '127.0.0.1 - - [28/Nov/2026:01:36:38 +0000] "GET /q?x=\\"quoted\\" HTTP/1.1" 404 416 "-" "agent \\"q\\" \\\\ back"'
    for fmt, ln in (("apache_combined", apache), ("apache_common", apache), ("apache_vhost_combined", "h:80 " + apache)):
        got = build_parser(fmt).parse(ln)
        assert not isinstance(got, str) and (got.status, got.body_bytes) == (404, 416), (fmt, got)
    json_fmt = ('{"time":"$time_iso8601","request":"$request","status":$status,"body_bytes_sent":$body_bytes_sent,'
                '"request_time":$request_time}')
    raw = b'{"time":"2026-11-28T01:35:56+00:00","request":"GET /\xff\xfe HTTP/1.1","status":404,"body_bytes_sent":153,' \
          b'"request_time":0.000}'.decode("utf-8", errors="replace")
    got = build_parser("custom", json_fmt).parse(raw)
    assert not isinstance(got, str) and got.status == 404
    assert build_parser("nginx_combined").parse("\ufffd" + apache) == "bad_encoding"  # (nginx escapes: damage)
    assert build_parser("custom", json_fmt).parse(raw.replace("GET", "G\x00T")) == "bad_encoding"
    xff = build_parser("custom", '$proxy_add_x_forwarded_for - $remote_user [$time_local] "$request" $status '
                                 '$body_bytes_sent "$http_referer" "$http_user_agent"')
    for first in ("203.0.113.7, 10.0.0.2", "198.51.100.9"):
        got = xff.parse(f'{first} - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1" 200 612 "-" "Mozilla/5.0"')
        assert not isinstance(got, str) and got.status == 200, (first, got)


def test_nginx_timed_reads_urt_after_other_labelled_fields() -> None:
    """A stranger's review: NGINX's much-copied APM format puts `uct="..." uht="..."` between
    `rt=` and `urt=`; every line was accepted and the upstream histogram stayed empty."""
    p = build_parser("nginx_timed")
    line = ('203.0.113.9 - - [27/Nov/2026:01:00:00 +0000] "GET /app/ HTTP/1.1" 200 5 "-" "curl/8" '
            'rt=0.105 uct="0.001" uht="0.100" urt="0.102, 0.003"')
    r = p.parse(line)
    assert r.request_time == 0.105 and r.upstream_time == pytest.approx(0.105), r
    assert batch_statuses(p, [line, line]) == ["200", "200"]
    rows = p.batch.regex.findall(line + "\n")
    assert rows[0][p.batch.upstream_time] == "0.102, 0.003"
    # no upstream: the labelled fields alone are no upstream time
    r = p.parse(line.replace(' urt="0.102, 0.003"', ""))
    assert r.request_time == 0.105 and r.upstream_time is None, r
    # unquoted, as prometheus-nginxlog-exporter's docs show it, after a retry: the lists are
    # skipped whole (a review of the fix: the second connect time was read as the upstream time)
    unquoted = ('127.0.0.1 - - [28/Nov/2026:04:56:07 +0000] "GET /slow1 HTTP/1.1" 200 4 "-" "curl/7.88.1" '
                'rt=0.305 uct=0.000, 0.001 uht=0.304, 0.001 urt=0.304, 0.001')
    r = p.parse(unquoted)
    assert r.request_time == 0.305 and r.upstream_time == pytest.approx(0.305), r
    r = p.parse(unquoted.replace(", 0.001", " : 0.001"))
    assert r.upstream_time == pytest.approx(0.305), r


@pytest.mark.parametrize("fmt", ["nginx_combined", "nginx_timed", "apache_combined", "apache_common",
                                 "apache_vhost_combined"])
def test_a_user_name_with_spaces_is_counted(fmt: str) -> None:
    """nginx logs $remote_user (Apache %u) unescaped, from any client's Authorization header
    (curl -u 'John Smith:pw'): a field up to the next space rejected the line, and any client
    could hide its requests so (a stranger's review on nginx 1.22)."""
    p = build_parser(fmt)
    tail = ' "-" "curl/7.88.1" rt=0.120 urt="0.100"' if fmt == "nginx_timed" else ' "-" "curl/7.88.1"'
    tail = "" if fmt == "apache_common" else tail
    head = "shop:80 " if fmt == "apache_vhost_combined" else ""
    for user in ("John Smith", "x rt=1 y", "a [b] c", "-"):
        line = f'{head}127.0.0.1 - {user} [28/Nov/2026:12:58:15 +0000] "GET /x HTTP/1.1" 401 6{tail}'
        r = p.parse(line)
        assert isinstance(r, Parsed) and r.status == 401 and r.body_bytes == 6, (user, r)
