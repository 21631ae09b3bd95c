"""The Envoy format-string compiler: operators, '-', '%%', ':N', classification, round trips."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime, UTC
from pathlib import Path
from re import _constants as sre_c, _parser as sre_parse
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporters.mesh.cli import oneshot
from exporters.mesh.config import MeshExporterConfig
from exporters.mesh.envoy_format import (
    ENVOY_DEFAULT_FORMAT,
    ISTIO_LEGACY_TEXT_FORMAT,
    ISTIO_TEXT,
    ISTIO_TEXT_FORMAT,
    CompiledFormat,
    FormatStringError,
    Operator,
    ParseError,
    tokenize,
)
from exporters.mesh.json_format import ISTIO_JSON, ISTIO_JSON_FORMAT, JsonFormat

# client-side line of istio.io's access-log task (the same request as the corpus file)
ISTIO_LINE = (
    '[2020-11-25T21:26:18.409Z] "GET /status/418 HTTP/1.1" 418 - via_upstream - "-" 0 135 4 4 "-" '
    '"curl/7.73.0-DEV" "84961386-6d84-929d-98bd-c5aee93b5c88" "httpbin:8000" "10.44.1.27:80" '
    "outbound|8000||httpbin.foo.svc.cluster.local 10.44.1.23:37652 10.0.45.184:8000 10.44.1.23:46520 - default"
)


def test_istio_default_is_compiled_from_its_format_string() -> None:
    assert ISTIO_TEXT.format_string == ISTIO_TEXT_FORMAT
    assert ISTIO_TEXT_FORMAT.startswith('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%"')
    assert len(ISTIO_TEXT.operators) == 24
    assert ISTIO_TEXT.keys[:5] == ["start_time", "method", "path", "protocol", "response_code"]
    assert "upstream_cluster" in ISTIO_TEXT.keys and "upstream_service_time" in ISTIO_TEXT.keys


def test_parse_istio_line_typed_values_and_dashes() -> None:
    r = ISTIO_TEXT.parse(ISTIO_LINE)
    assert r["start_time"] == datetime(2020, 11, 25, 21, 26, 18, 409000, tzinfo=UTC)
    assert (r["method"], r["path"], r["protocol"]) == ("GET", "/status/418", "HTTP/1.1")
    assert r["response_code"] == 418 and r["response_flags"] == ()
    assert (r["bytes_received"], r["bytes_sent"], r["duration"], r["upstream_service_time"]) == (0, 135, 4, 4)
    # every "-" is None
    assert r["connection_termination_details"] is None
    assert r["upstream_transport_failure_reason"] is None and r["x_forwarded_for"] is None
    assert r["requested_server_name"] is None
    assert r["upstream_cluster"] == "outbound|8000||httpbin.foo.svc.cluster.local"
    assert r["route_name"] == "default"


def test_response_flags_are_split() -> None:
    line = ISTIO_LINE.replace("418 - via_upstream", "503 UF,URX upstream_reset_before_response_started{connection_failure}")
    r = ISTIO_TEXT.parse(line)
    assert r["response_flags"] == ("UF", "URX")
    assert r["response_code_details"] == "upstream_reset_before_response_started{connection_failure}"


def test_upstream_service_time_dash_and_junk_are_none() -> None:
    assert ISTIO_TEXT.parse(ISTIO_LINE.replace(" 4 4 ", " 4 - "))["upstream_service_time"] is None
    # a header can hold anything: junk there does not reject the line
    assert ISTIO_TEXT.parse(ISTIO_LINE.replace(" 4 4 ", " 4 abc "))["upstream_service_time"] is None


def test_ipv6_addresses_and_http2() -> None:
    line = (
        '[2024-01-01T00:00:00.000Z] "POST /cart.v1.Cart/Add HTTP/2" 200 - via_upstream - "-" 12 34 5 4 "-" '
        '"grpc-go/1.60" "id-1" "[::1]:8080" "[fd00::12]:8080" outbound|8080||carts.shop.svc.cluster.local '
        "[fd00::5]:40001 [::1]:8080 [fd00::5]:43210 - default"
    )
    r = ISTIO_TEXT.parse(line)
    assert r["protocol"] == "HTTP/2"
    assert r["authority"] == "[::1]:8080"
    assert r["upstream_host"] == "[fd00::12]:8080"
    assert r["downstream_remote_address"] == "[fd00::5]:43210"
    assert ISTIO_TEXT.format(r) == line


def test_operator_grammar_args_truncation_and_percent_escape() -> None:
    toks = tokenize("%START_TIME(%Y/%m/%dT%H:%M:%S%z %s)% 100%% %REQ(USER-AGENT):5% %HOSTNAME%%PROTOCOL%\\n")
    ops = [t for t in toks if isinstance(t, Operator)]
    assert [(o.command, o.arg, o.max_length) for o in ops] == [
        ("START_TIME", "%Y/%m/%dT%H:%M:%S%z %s", None),
        ("REQ", "USER-AGENT", 5),
        ("HOSTNAME", None, None),
        ("PROTOCOL", None, None),
    ]
    assert " 100% " in toks  # %% is one literal percent sign
    assert ops[0].kind == "strftime" and ops[1].key == "user_agent"


def test_truncation_is_applied_when_writing_and_bounds_parsing() -> None:
    f = CompiledFormat("%REQ(USER-AGENT):5% %RESPONSE_CODE%")
    assert f.format({"user_agent": "curl/8.0", "response_code": 200}) == "curl/ 200"
    assert f.parse("curl/ 200") == {"user_agent": "curl/", "response_code": 200}
    with pytest.raises(ParseError) as e:
        f.parse("curl/8.0 200")  # longer than :5 cannot come from this format
    assert e.value.reason == "format_mismatch"


def test_custom_start_time_and_percent_literal_round_trip() -> None:
    f = CompiledFormat("%START_TIME(%Y/%m/%dT%H:%M:%S%z %s)% 100%% %HOSTNAME%%PROTOCOL% end")
    rec = {"start_time": "2024/01/01T00:00:00+0000 1704067200", "hostname": "pod-1", "protocol": "HTTP/2"}
    line = f.format(rec)
    assert line == "2024/01/01T00:00:00+0000 1704067200 100% pod-1HTTP/2 end"
    assert f.parse("2024/01/01T00:00:00+0000 1704067200 100% -- end") == {
        "start_time": "2024/01/01T00:00:00+0000 1704067200",
        "hostname": None,
        "protocol": None,
    }
    assert f.parse(f.format({})) == {"start_time": None, "hostname": None, "protocol": None}


@pytest.mark.parametrize(
    "bad",
    ["%", "50% off %DURATION%", "%REQ(X%", "no operator here", "%DURATION%\n%BYTES_SENT%"],
)
def test_bad_format_strings_are_refused(bad: str) -> None:
    with pytest.raises(FormatStringError):
        CompiledFormat(bad)


def test_truncated_line_vs_format_mismatch() -> None:
    cut = ISTIO_LINE.index(" outbound|")
    with pytest.raises(ParseError) as e:
        ISTIO_TEXT.parse(ISTIO_LINE[:cut])
    assert e.value.reason == "truncated"
    with pytest.raises(ParseError) as e:
        ISTIO_TEXT.parse(ISTIO_LINE[: ISTIO_LINE.index("HTTP/1.1") + 4])  # cut inside a field
    assert e.value.reason == "truncated"
    for junk in [ISTIO_LINE[cut + 1 :], "hello world", ISTIO_LINE.replace(" 418 ", " 4x8 ")]:
        with pytest.raises(ParseError) as e:
            ISTIO_TEXT.parse(junk)
        assert e.value.reason == "format_mismatch", junk


def test_text_round_trip_record_line_record() -> None:
    r = ISTIO_TEXT.parse(ISTIO_LINE)
    assert ISTIO_TEXT.format(r) == ISTIO_LINE
    r2 = dict(r, response_code=503, response_flags=("UF", "URX"), upstream_service_time=None, authority="carts:80")
    assert ISTIO_TEXT.parse(ISTIO_TEXT.format(r2)) == r2


def test_json_parses_strings_or_numbers_to_the_same_record() -> None:
    text_record = ISTIO_TEXT.parse(ISTIO_LINE)
    as_numbers = ISTIO_JSON.format(text_record)
    obj = json.loads(as_numbers)
    assert list(obj) == list(ISTIO_JSON_FORMAT)
    assert obj["duration"] == 4 and obj["upstream_service_time"] == "4" and obj["response_flags"] == "-"
    assert obj["x_forwarded_for"] is None
    as_strings = json.dumps({k: ("-" if v is None else str(v)) for k, v in obj.items()})
    assert ISTIO_JSON.parse(as_numbers) == text_record
    assert ISTIO_JSON.parse(as_strings) == text_record


def test_json_extras_grpc_and_unknown_keys() -> None:
    r = ISTIO_JSON.parse('{"response_code":"200","grpc_status":"Unavailable","workload":"carts","nested":{"a":1}}')
    assert r["response_code"] == 200 and r["grpc_status"] == "Unavailable"
    assert r["workload"] == "carts" and "nested" not in r


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"response_code": 200, "meth', "truncated"),
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('{"method": "GET"}', "missing_field"),
        ('{"response_code": "abc"}', "bad_value"),
        ('{"response_code": 200, "duration": {"x": 1}}', "bad_value"),
    ],
)
def test_json_rejections(line: str, reason: str) -> None:
    with pytest.raises(ParseError) as e:
        ISTIO_JSON.parse(line)
    assert e.value.reason == reason


def test_custom_json_dictionary_maps_keys_by_operator() -> None:
    fmt = JsonFormat({"status": "%RESPONSE_CODE%", "took_ms": "%DURATION%", "svc": "%UPSTREAM_CLUSTER%"})
    r = fmt.parse('{"status": 201, "took_ms": "7", "svc": "outbound|80||carts.x.svc.cluster.local"}')
    assert r == {"response_code": 201, "duration": 7, "upstream_cluster": "outbound|80||carts.x.svc.cluster.local"}
    assert json.loads(fmt.format(r)) == {"status": 201, "took_ms": 7, "svc": "outbound|80||carts.x.svc.cluster.local"}


# ---------------------------------------------------------------- hostile lines cost linear time


def backtracking_repeats(rx: str) -> list[tuple[int, int | None]]:
    """(min, max) of every repeat of the pattern ``rx`` (as built: CompiledFormat.source; the
    compiled one may be emulated, promreflex.recompat) that can give back what it took (greedy or lazy:
    not possessive), max None when unbounded. Python's ``re`` backtracks, and a failing match
    tries every count of each such repeat: over an unbounded one that is O(n) per attempt,
    O(n^2) and worse when they nest or follow each other."""
    out: list[tuple[int, int | None]] = []

    def walk(sub: Any) -> None:
        for op, av in sub:
            if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
                out.append((av[0], None if av[1] == sre_c.MAXREPEAT else av[1]))
                walk(av[2])
            elif op is sre_c.POSSESSIVE_REPEAT:
                walk(av[2])
            elif op is sre_c.SUBPATTERN:
                walk(av[3])
            elif op is sre_c.BRANCH:
                for branch in av[1]:
                    walk(branch)
            elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
                walk(av[1])
            elif op is sre_c.ATOMIC_GROUP:
                walk(av)

    walk(sre_parse.parse(rx))
    return out


COSTLY_FORMATS = [
    ISTIO_TEXT_FORMAT,
    ISTIO_LEGACY_TEXT_FORMAT,
    ENVOY_DEFAULT_FORMAT,
    "%UPSTREAM_HOST%%DURATION%",  # 8 s for a 16 KB line that did not match
    "%RESPONSE_CODE%%RESPONSE_FLAGS% %UPSTREAM_HOST%%DURATION% %A%%B%%C% %D%%RESPONSE_FLAGS%%E% x",
    "%START_TIME%,%RESPONSE_CODE%,%RESPONSE_FLAGS%,%ROUTE_NAME%,%RESPONSE_FLAGS_LONG%,%DURATION%",
    "%PROTOCOL%.%PROTOCOL%.%PROTOCOL%.%PROTOCOL%!",  # more than a minute for 1 KB
    "%REQ(:METHOD)%-%DURATION%1%BYTES_SENT%/x",
    "%START_TIME(%s%f%Q)% %A%%START_TIME% %B%%START_TIME(%Y)%%C%",
    "%REQ(USER-AGENT):10%%RESPONSE_CODE% %REQ(X):3%%REQ(Y):2% end",
]


@pytest.mark.parametrize("fs", COSTLY_FORMATS)
def test_patterns_never_backtrack_over_an_unbounded_repeat(fs: str) -> None:
    """A line is hostile input: whether it matches or not, it must cost time linear in its
    length. Every unbounded repeat is possessive; the repeats that may give back are small."""
    f = CompiledFormat(fs)
    for rx in (f.source, f.prefix_source):
        costly = [r for r in backtracking_repeats(rx) if r[1] is None or r[1] > 64]
        assert costly == [], (fs, rx is f.source, costly)


# Operators back to back, and values followed by one of their own characters: the split the
# former backtracking pattern made (free text in a chain limited to the chain's next literal
# character, a documented change), compared on every string of a small alphabet.
SPLITS = [
    ("%UPSTREAM_HOST%%DURATION% %ROUTE_NAME%", r"([^ \n]+?)(-|\d+) (.*)", "1a- ", 6),
    ("%UPSTREAM_HOST%%DURATION%", r"(.+?)(-|\d+)", "1a-", 7),
    ("%UPSTREAM_HOST%%RESPONSE_FLAGS%", r"(.+?)(-|[A-Za-z]+(?:,[A-Za-z]+)*)", "aB,-1", 6),
    ("%HOSTNAME%%PROTOCOL%!", r"([^!\n]+?)(-|[A-Za-z0-9/._-]+)!", "a1/-.!", 6),
    ("%A%%DURATION%%B%!", r"([^!\n]+?)(-|\d+)([^!\n]*)!", "a1-!", 7),
    ("%A%%B%!", r"([^!\n]+?)([^!\n]*)!", "ab!", 7),
    ("%RESPONSE_CODE%%RESPONSE_FLAGS%!", r"(-|\d+)(-|[A-Za-z]+(?:,[A-Za-z]+)*)!", "1A,-!", 6),
    ("%RESPONSE_FLAGS%,%ROUTE_NAME%,%DURATION%", r"(-|[A-Za-z]+(?:,[A-Za-z]+)*),([^,\n]*),(-|\d+)", "AB,1-", 7),
    ("%PROTOCOL%.%ROUTE_NAME%", r"(-|[A-Za-z0-9/._-]+)\.(.*)", "a1.-/", 6),
]


@pytest.mark.parametrize(("fs", "reference", "alphabet", "longest"), SPLITS, ids=[s[0] for s in SPLITS])
def test_ambiguous_splits_are_decided_in_one_pass_as_before(fs: str, reference: str, alphabet: str, longest: int) -> None:
    f = CompiledFormat(fs)
    assert [r for r in backtracking_repeats(f.source) if r[1] is None] == []
    ref = re.compile(reference)
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            line = "".join(chars)
            want, got = ref.fullmatch(line), f.regex.fullmatch(line)
            fields = got and tuple(got.group(f"f{i}") for i in range(ref.groups))
            assert (want and want.groups()) == fields, (fs, line)


def test_adjacent_free_text_stops_at_the_next_literal() -> None:
    f = CompiledFormat("%UPSTREAM_HOST%%DURATION% %ROUTE_NAME%")
    # back to back values are ambiguous: the free text is as short as it can be (as before)
    assert f.parse("10.0.0.1:8012 default") == {"upstream_host": "10.0.0.1:", "duration": 8012, "route_name": "default"}
    assert f.parse("-4 default") == {"upstream_host": None, "duration": 4, "route_name": "default"}
    # ... and, like any free text before a literal, holds no space when a space follows the chain
    with pytest.raises(ParseError) as e:
        f.parse("a b12 default")
    assert e.value.reason == "format_mismatch"
    # a CSV line whose flag list is followed by more letters still splits where it fits
    csv = CompiledFormat("%START_TIME%,%RESPONSE_CODE%,%RESPONSE_FLAGS%,%ROUTE_NAME%,%UPSTREAM_CLUSTER%,%DURATION%")
    r = csv.parse("2024-05-01T10:00:00.000Z,503,UF,URX,default,PassthroughCluster,12")
    assert (r["response_flags"], r["route_name"], r["upstream_cluster"]) == (("UF", "URX"), "default", "PassthroughCluster")
    # a :N bound of free text in a chain is checked after the split
    bounded = CompiledFormat("%REQ(X-A):3%%RESPONSE_CODE% x")
    assert bounded.parse("abc200 x") == {"req_x_a": "abc", "response_code": 200}
    with pytest.raises(ParseError):
        bounded.parse("abcd200 x")


def test_a_long_hostile_line_is_a_counted_rejection_and_the_log_goes_on(tmp_path: Path) -> None:
    """Through the exporter (oneshot over a file): a 60 KB line that does not fit is one
    format_mismatch, a line over max_line_bytes one too_long, and the lines around them count."""
    fs = "%RESPONSE_CODE% %UPSTREAM_HOST%%DURATION% %UPSTREAM_CLUSTER%"
    assert [r for r in backtracking_repeats(CompiledFormat(fs).source) if r[1] is None] == []
    good = "200 -4 outbound|80||carts.shop.svc.cluster.local"
    log = tmp_path / "orders.log"
    log.write_text("\n".join([good, "200 " + "1" * 61_440 + "x default", "200 " + "1" * 70_000, good]) + "\n")
    cfg = MeshExporterConfig.model_validate(
        {"logs": [{"workload": "orders", "path": str(log), "format": "envoy", "format_string": fs}]}
    )
    registry = CollectorRegistry()
    oneshot(cfg, registry)
    value = registry.get_sample_value
    assert value("promreflex_mesh_lines_total", {"workload": "orders"}) == 4
    errors = {r: value("promreflex_mesh_parse_errors_total", {"workload": "orders", "reason": r})
              for r in ("format_mismatch", "too_long", "truncated")}
    assert errors == {"format_mismatch": 1, "too_long": 1, "truncated": 0}
    edge = {"source": "orders", "destination": "carts", "code_class": "2xx", "response_flags": "none"}
    assert value("promreflex_mesh_requests_total", edge) == 2


# START_TIME with absl's strftime directives (a stranger's review of the linear-time patterns:
# every directive the parser did not know matched one character, atomically, so every line of
# such a format was a format_mismatch). Envoy's %f alone is 9 digits (its docs).
@pytest.mark.parametrize("fmt, line, start", [
    ("[%START_TIME(%c)%] \"%REQ(:METHOD)%\" %RESPONSE_CODE%", '[Fri Nov 27 17:46:44 2026] "GET" 200',
     "Fri Nov 27 17:46:44 2026"),
    ("[%START_TIME(%c)%] %RESPONSE_CODE%", "[Fri Nov  6 07:46:44 2026] 200", "Fri Nov  6 07:46:44 2026"),
    ("[%START_TIME(%x %X)%] %RESPONSE_CODE%", "[11/27/26 17:46:44] 200", "11/27/26 17:46:44"),
    ("[%START_TIME(%u %k %l %r)%] %RESPONSE_CODE%", "[5 17  5 05:46:44 PM] 200", "5 17  5 05:46:44 PM"),
    ("[%START_TIME(%G-W%V-%u %C%g %U %W %w %h)%] %RESPONSE_CODE%", "[2026-W48-5 2026 47 47 5 Nov] 200",
     "2026-W48-5 2026 47 47 5 Nov"),
    ("[%START_TIME(%Y%m%d%H%M%S)%] %RESPONSE_CODE%", "[20261127174644] 200", "20261127174644"),
    ("[%START_TIME(%s%f)%] %RESPONSE_CODE%", "[1790000000123456789] 200", "1790000000123456789"),
    ("[%START_TIME(%Y-%m-%dT%H:%M:%E3S%Ez)%] %RESPONSE_CODE%", "[2026-11-27T17:46:44.123+00:00] 200",
     "2026-11-27T17:46:44.123+00:00"),
    ("[%START_TIME(%H:%M:%E*S %E4Y)%] %RESPONSE_CODE%", "[17:46:44.5 2026] 200", "17:46:44.5 2026"),
    ("[%START_TIME(%Q %Y)%] %RESPONSE_CODE%", "[whatever it is 2026] 200", "whatever it is 2026"),  # unknown: free
])
def test_start_time_with_absl_directives_parses(fmt, line, start):
    record = CompiledFormat(fmt).parse(line)
    assert record["start_time"] == start and record["response_code"] == 200
