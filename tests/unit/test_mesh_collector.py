"""Metrics from fixture logs: runtime wrappers, edges, bounded labels, self-metrics, golden /metrics."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.mesh.collector import DURATION_BUCKETS, PARSE_ERROR_REASONS, MeshExporter
from exporters.mesh.envoy_format import ISTIO_TEXT
from exporters.mesh.labels import (
    LabelBudget,
    authority_host,
    code_class,
    derive_edge,
    flags_label,
    grpc_status_label,
    service_of_host,
)
from exporters.mesh.runtime import RuntimeUnwrapper, wrap_cri, wrap_docker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "mesh"
GOLDEN = FIXTURES / "golden-metrics.prom"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def fixture_exporter() -> tuple[CollectorRegistry, MeshExporter, dict]:
    """The three Sock-Shop-like fixture logs, fed through one exporter."""
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg, namespaces=["sock-shop"])
    streams = {
        "front-end.log": ex.add_stream("front-end"),
        "carts-cri.log": ex.add_stream("carts"),
        "orders-docker.log": ex.add_stream("orders-pod", "istio_json", workload_field="workload"),
    }
    stats = {}
    for name, stream in streams.items():
        st = stream.feed((FIXTURES / name).read_text().splitlines())
        st.add(stream.flush())
        stats[name] = st
    return reg, ex, stats


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


# ---------------------------------------------------------------- runtime wrappers


def test_cri_partial_pieces_are_joined_and_stderr_is_its_own_reason() -> None:
    u = RuntimeUnwrapper()
    ts = "2024-01-01T00:00:00.000000000Z"
    assert u.push(f"{ts} stdout P first half, ") == []
    assert u.push(f"{ts} stderr F envoy warning") [0].reason == "other_stream"
    [done] = u.push(f"{ts} stdout F second half")
    assert (done.text, done.reason) == ("first half, second half", None)
    [empty] = u.push(f"{ts} stdout F ")
    assert empty.text == ""


def test_cri_split_round_trip_and_overflow() -> None:
    msg = "x" * 250
    pieces = wrap_cri(msg, "2024-01-01T00:00:00Z", max_piece=100)
    assert [p.split(" ")[2] for p in pieces] == ["P", "P", "F"]
    u = RuntimeUnwrapper(max_bytes=1000)
    out = [r for p in pieces for r in u.push(p)]
    assert [r.text for r in out] == [msg]
    small = RuntimeUnwrapper(max_bytes=120)
    out = [r for p in pieces for r in small.push(p)]
    assert [(r.text, r.reason) for r in out] == [(None, "too_long")]


def test_docker_json_file_wrapper() -> None:
    u = RuntimeUnwrapper()
    line = wrap_docker('[2024] "GET / HTTP/1.1"', "2024-01-01T00:00:00Z", attrs={"workload": "carts"})
    [r] = u.push(line)
    assert r.text == '[2024] "GET / HTTP/1.1"' and r.fields == {"workload": "carts"}
    # a piece without the final newline continues in the next line (Docker splits at 16 KiB)
    assert u.push('{"log":"abc","stream":"stdout","time":"t"}') == []
    [r] = u.push('{"log":"def\\n","stream":"stdout","time":"t"}')
    assert r.text == "abcdef"
    [bad] = u.push('{"log":"cut')
    assert bad.reason == "bad_wrapper"


def test_plain_line_after_dangling_partial_flushes_it_as_truncated() -> None:
    u = RuntimeUnwrapper()
    u.push("2024-01-01T00:00:00Z stdout P never finished")
    out = u.push("a plain line")
    assert [(r.text, r.reason) for r in out] == [(None, "truncated"), ("a plain line", None)]


# ---------------------------------------------------------------- label derivation


@pytest.mark.parametrize(
    ("record", "edge"),
    [
        ({"upstream_cluster": "outbound|80||carts.sock-shop.svc.cluster.local"}, ("front-end", "carts")),
        ({"upstream_cluster": "outbound|9080|v2|reviews.default.svc.cluster.local"}, ("front-end", "reviews")),
        ({"upstream_cluster": "inbound|8080||", "authority": "carts:80"}, ("unknown", "front-end")),
        ({"upstream_cluster": "inbound|9080|http|productpage.default.svc.cluster.local"}, ("unknown", "front-end")),
        (
            {"upstream_cluster": "inbound|8080||", "downstream_peer_uri_san": "spiffe://cluster.local/ns/x/sa/sleep"},
            ("sleep", "front-end"),
        ),
        ({"upstream_cluster": "InboundPassthroughClusterIpv4"}, ("unknown", "front-end")),
        ({"upstream_cluster": "PassthroughCluster", "authority": "api.stripe.com"}, ("front-end", "external")),
        ({"upstream_cluster": "BlackHoleCluster"}, ("front-end", "blackhole")),
        ({"upstream_cluster": None, "authority": "carts:80"}, ("front-end", "carts")),
        ({"upstream_cluster": None, "authority": "carts.sock-shop.svc.cluster.local"}, ("front-end", "carts")),
        ({"upstream_cluster": None, "authority": "carts.sock-shop"}, ("front-end", "carts")),  # configured ns
        ({"upstream_cluster": None, "authority": "www.example.com:443"}, ("front-end", "external")),
        ({"upstream_cluster": None, "authority": "10.0.0.7:8080"}, ("front-end", "unknown")),
        ({"upstream_cluster": None, "authority": "[fd00::12]:8080"}, ("front-end", "unknown")),
        ({"upstream_cluster": "outbound|80||10.0.0.7"}, ("front-end", "unknown")),
        ({}, ("front-end", "unknown")),
    ],
)
def test_derive_edge(record: dict, edge: tuple[str, str]) -> None:
    assert derive_edge(record, "front-end", frozenset({"sock-shop"})) == edge


def test_authority_host_and_service_of_host() -> None:
    assert authority_host("carts:80") == "carts"
    assert authority_host("[::1]:8080") == "::1"
    assert authority_host("fd00::1") == "fd00::1"
    assert authority_host("-") is None
    assert service_of_host("Carts") == "carts"
    assert service_of_host("carts.sock-shop") == "external"  # namespace not configured
    assert service_of_host("under_score") == "unknown"


def test_flags_code_class_and_grpc_are_bounded() -> None:
    assert flags_label(()) == "none" and flags_label(None) == "none"
    assert flags_label(("URX", "UF")) == flags_label(("UF", "URX")) == "UF,URX"
    assert flags_label(("UpstreamConnectionFailure",)) == "UF"  # %RESPONSE_FLAGS_LONG%
    assert flags_label(("XYZ",)) == "other"
    assert flags_label(("UF", "URX", "UH")) == "other"
    assert [code_class(c) for c in (None, 0, 101, 200, 302, 404, 503, 999)] == [
        "none", "none", "1xx", "2xx", "3xx", "4xx", "5xx", "other",
    ]
    assert [grpc_status_label(s) for s in ("-", "OK", "14", 14, "unavailable", "Cancelled", "bogus", "99")] == [
        None, "OK", "Unavailable", "Unavailable", "Unavailable", "Canceled", "other", "other",
    ]


def test_label_budget_caps_service_names() -> None:
    b = LabelBudget(limit=2)
    assert [b.admit(n) for n in ("a", "b", "a", "c", "unknown", "external")] == ["a", "b", "a", "other", "unknown", "external"]
    assert b.overflowed == 1


def test_hostile_input_keeps_label_values_bounded() -> None:
    """Random paths, IPs and authorities: label values stay service names or reserved words."""
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg, max_services=5)
    stream = ex.add_stream("front-end")
    rnd = random.Random(7)
    base = ISTIO_TEXT.parse(
        '[2024-01-01T00:00:00.000Z] "GET / HTTP/1.1" 200 - via_upstream - "-" 0 1 1 1 "-" "-" "-" "a" "-" - - - - - -'
    )
    for i in range(400):
        authority = rnd.choice([f"10.{i % 250}.0.1:80", f"host{i}.example.com", f"svc{i}", f"[fd00::{i:x}]:80"])
        cluster = rnd.choice(["-", f"outbound|80||svc{i}.ns.svc.cluster.local", "inbound|80||"])
        rec = dict(base, path=f"/items/{i}?q={rnd.random()}", authority=authority, upstream_cluster=cluster,
                   response_code=rnd.choice([200, 404, 503, 0, 777]),
                   response_flags=rnd.choice([(), ("UH",), ("UF", "URX"), ("ZZ",)]))
        stream.observe(ISTIO_TEXT.format(rec))
    values = {
        (k, v)
        for m in reg.collect()
        for s in m.samples
        for k, v in s.labels.items()
        if k in ("source", "destination")
    }
    names = {v for _, v in values}
    assert names <= {"front-end", "svc0", "svc1", "svc2", "svc3", "svc4", "svc5", "svc6", "unknown", "external", "other"} | {
        f"svc{i}" for i in range(400)
    }
    assert len(names - {"unknown", "external", "other"}) <= 5
    assert "other" in names
    assert not any("/" in v or "." in v or ":" in v for v in names)
    flags = {s.labels["response_flags"] for m in reg.collect() for s in m.samples if "response_flags" in s.labels}
    assert flags <= {"none", "UH", "UF,URX", "other"}
    assert stream.stats.parsed == 400


# ---------------------------------------------------------------- fixture logs -> metrics


def test_fixture_line_accounting() -> None:
    reg, _, stats = fixture_exporter()
    fe, carts, orders = stats["front-end.log"], stats["carts-cri.log"], stats["orders-docker.log"]
    assert (fe.lines, fe.parsed, dict(fe.rejected)) == (13, 8, {"empty": 1, "truncated": 1, "format_mismatch": 3})
    assert (carts.lines, carts.parsed, dict(carts.rejected)) == (6, 4, {"other_stream": 1, "truncated": 1})
    assert (orders.lines, orders.parsed, dict(orders.rejected)) == (
        10,
        4,
        {"other_stream": 1, "bad_wrapper": 1, "bad_value": 1, "missing_field": 1, "invalid_json": 1, "truncated": 1},
    )
    for workload, st in (("front-end", fe), ("carts", carts), ("orders-pod", orders)):
        assert sample(reg, "promreflex_mesh_lines_total", workload=workload) == st.lines
        errors = sum(sample(reg, "promreflex_mesh_parse_errors_total", workload=workload, reason=r) for r in PARSE_ERROR_REASONS)
        assert st.lines == st.parsed + errors


def test_parse_error_reasons_exist_at_zero_before_any_line() -> None:
    reg = CollectorRegistry()
    MeshExporter(registry=reg).add_stream("carts")
    for r in PARSE_ERROR_REASONS:
        assert sample(reg, "promreflex_mesh_parse_errors_total", workload="carts", reason=r) == 0.0
    assert sample(reg, "promreflex_mesh_lines_total", workload="carts") == 0.0


def test_fixture_edges_and_values() -> None:
    reg, ex, _ = fixture_exporter()
    assert ex.edges() == {
        ("front-end", "catalogue"),
        ("front-end", "carts"),
        ("front-end", "orders"),
        ("front-end", "user"),
        ("front-end", "payment"),
        ("front-end", "external"),
        ("carts", "carts-db"),
        ("orders", "payment"),
        ("orders", "shipping"),
        ("orders-pod", "shipping"),  # attr "Orders_V2!" is no DNS label: the stream's workload
    }
    r = "promreflex_mesh_requests_total"
    assert sample(reg, r, source="front-end", destination="user", code_class="5xx", response_flags="UF,URX") == 1
    assert sample(reg, r, source="front-end", destination="carts", code_class="5xx", response_flags="UT") == 1
    assert sample(reg, r, source="front-end", destination="payment", code_class="4xx", response_flags="NR") == 1
    assert sample(reg, r, source="front-end", destination="unknown", code_class="2xx", response_flags="none") == 1  # IPv6
    assert sample(reg, r, source="unknown", destination="carts", code_class="none", response_flags="DC") == 1
    assert sample(reg, r, source="unknown", destination="carts", code_class="2xx", response_flags="none") == 2  # incl. the CRI-split one
    # the slow order (3.5 s) is above the 3 s bucket, the 15 s timeout below 30 s
    d = "promreflex_mesh_request_duration_seconds_bucket"
    assert sample(reg, d, source="front-end", destination="orders", le="3.0") == 0
    assert sample(reg, d, source="front-end", destination="orders", le="5.0") == 1
    assert sample(reg, d, source="front-end", destination="carts", le="10.0") == 1
    assert sample(reg, d, source="front-end", destination="carts", le="30.0") == 2
    u = "promreflex_mesh_upstream_service_time_seconds_sum"
    assert sample(reg, u, source="front-end", destination="orders") == pytest.approx(3.49)
    g = "promreflex_mesh_grpc_responses_total"
    assert sample(reg, g, source="orders", destination="shipping", grpc_status="OK") == 1
    assert sample(reg, g, source="orders", destination="shipping", grpc_status="Unavailable") == 1
    assert sample(reg, g, source="orders-pod", destination="shipping", grpc_status="Unavailable") == 1  # "14"
    assert sample(reg, "promreflex_mesh_edge_info", source="front-end", destination="carts") == 1


def test_buckets_cover_1ms_to_30s_with_3s_boundary() -> None:
    assert DURATION_BUCKETS[0] == 0.001 and DURATION_BUCKETS[-1] == 30.0 and 3.0 in DURATION_BUCKETS


def test_oversized_line_is_rejected_not_fatal() -> None:
    reg = CollectorRegistry()
    stream = MeshExporter(registry=reg, max_line_bytes=100).add_stream("carts")
    st = stream.feed(["x" * 101, ""])
    assert dict(st.rejected) == {"too_long": 1, "empty": 1}
    stream.reject("too_long", 2)  # what the follower dropped
    assert sample(reg, "promreflex_mesh_parse_errors_total", workload="carts", reason="too_long") == 3


def test_hostile_json_lines_are_counted_not_fatal() -> None:
    """Lines that killed the exporter (served too: every log stopped): JSON nested past
    Python's recursion limit (plain, in a Docker wrapper, under `auto`), a string status under
    a key the operator's own format does not map; and values no request has (a negative or
    absurd duration) that went into the histograms' sums."""
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    deep = '{"a":' + "[" * 30000 + "]" * 30000 + "}"
    plain = ex.add_stream("plain", "istio_json")
    auto = ex.add_stream("auto", "auto")
    docker = ex.add_stream("docker", "istio_json")
    custom = ex.add_stream("custom", "istio_json", json_format={"my_code": "%RESPONSE_CODE%", "duration": "%DURATION%"})
    good = ('{"start_time":"2024-01-01T00:00:00.000Z","method":"GET","path":"/","protocol":"HTTP/1.1",'
            '"response_code":200,"duration":%s,"authority":"carts","upstream_cluster":"-"}')
    assert plain.feed([deep, good % "-100000", good % "10000000000000", good % "5"]).parsed == 1
    assert auto.feed([deep]).parsed == 0
    assert docker.feed(['{"log":"' + "[" * 30000 + '\\n","stream":"stdout"}', '{"log":' + "[" * 30000 + "]" * 30000 + "}"]).parsed == 0
    assert custom.feed(['{"my_code":503,"response_code":"200","duration":3}', '{"response_code":"200","duration":3}']).parsed == 1
    rejected = {(w, r): sample(reg, "promreflex_mesh_parse_errors_total", workload=w, reason=r)
                for w, r in (("plain", "invalid_json"), ("plain", "bad_value"), ("auto", "invalid_json"),
                             ("docker", "invalid_json"), ("docker", "bad_wrapper"))}
    assert rejected == {("plain", "invalid_json"): 1, ("plain", "bad_value"): 2, ("auto", "invalid_json"): 1,
                        ("docker", "invalid_json"): 1, ("docker", "bad_wrapper"): 1}, rejected
    assert sample(reg, "promreflex_mesh_parse_errors_total", workload="custom", reason="missing_field") == 1
    sums = [s.value for m in reg.collect() for s in m.samples if s.name.endswith("duration_seconds_sum")]
    assert sums and all(0 <= v < 1 for v in sums), sums


# ---------------------------------------------------------------- golden /metrics


def exposition() -> str:
    reg, _, _ = fixture_exporter()
    text = generate_latest(reg).decode()
    return "".join(line + "\n" for line in text.splitlines() if "_created" not in line)


def test_golden_metrics() -> None:
    text = exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
def test_golden_metrics_pass_promtool() -> None:
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=GOLDEN.read_bytes(), capture_output=True, timeout=30)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    assert b"promreflex_mesh_requests_total" in GOLDEN.read_bytes()


# ---------------------------------------------------------------- per-line failures never stop the exporter


GRPC_HEADER_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    '%RESPONSE_FLAGS% %DURATION% "%REQ(:AUTHORITY)%" %UPSTREAM_CLUSTER% %RESP(GRPC-STATUS)%'
)


def test_grpc_status_with_non_ascii_digits_is_other_not_a_crash() -> None:
    """str.isdigit() is true for "²" and "٣"; int() refuses them: the exporter died."""
    for junk in ("²", "٣", "９", "1²"):
        assert grpc_status_label(junk) == "other"
    assert grpc_status_label("14") == "Unavailable" and grpc_status_label(True) == "other"
    reg = CollectorRegistry()
    stream = MeshExporter(registry=reg).add_stream("front-end", "envoy", GRPC_HEADER_FORMAT)
    head = '[2024-05-01T10:00:00.000Z] "POST /pkg.Svc/Get HTTP/2" 200 - 3 "cart:7070" outbound|7070||cart.default.svc.cluster.local '
    st = stream.feed([head + "14", head + "²", head + "0"])
    assert (st.lines, st.parsed) == (3, 3)
    edge = {"source": "front-end", "destination": "cart"}
    assert sample(reg, "promreflex_mesh_grpc_responses_total", **edge, grpc_status="other") == 1
    assert sample(reg, "promreflex_mesh_grpc_responses_total", **edge, grpc_status="OK") == 1
    assert sample(reg, "promreflex_mesh_lines_total", workload="front-end") == 3


def test_a_record_that_cannot_be_counted_is_a_rejection_and_the_stream_goes_on() -> None:
    """Fuzz find: a JSON line with an extra "l4" key and a number for dst_service raised
    AttributeError in service_of_host, out of feed() (and so out of follow())."""
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    stream = ex.add_stream("w", "istio_json")
    good = '{"response_code":200,"method":"GET","protocol":"HTTP/1.1","authority":"carts","duration":5}'
    l4 = '{"response_code":200,"l4":true,"dst_service":7,"direction":"outbound"}'
    st = stream.feed([l4, good])
    assert st.lines == 2 and st.parsed == 2  # a non-string host is "unknown", not a crash
    assert service_of_host(7) == "unknown" and authority_host(7) is None  # type: ignore[arg-type]

    def broken(record, workload):  # any bug in counting: one line lost and counted
        raise RuntimeError("bug")

    ex.count = broken  # type: ignore[method-assign]
    st = stream.feed([good, good])
    assert (st.lines, st.parsed, dict(st.rejected)) == (2, 0, {"bad_value": 2})
    assert sample(reg, "promreflex_mesh_lines_total", workload="w") == 4
    assert sample(reg, "promreflex_mesh_parse_errors_total", workload="w", reason="bad_value") == 2


# Envoy's current built-in default format, written with its long header commands.
ENVOY_DEFAULT_LONG = (
    '[%START_TIME%] "%REQUEST_HEADER(:METHOD)% %REQUEST_HEADER(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESPONSE_HEADER(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQUEST_HEADER(X-FORWARDED-FOR)%" '
    '"%REQUEST_HEADER(USER-AGENT)%" "%REQUEST_HEADER(X-REQUEST-ID)%" "%REQUEST_HEADER(:AUTHORITY)%" "%UPSTREAM_HOST%"'
)
ENVOY_DEFAULT_LINE = ('[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" '
                      '"nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80"')
# Envoy Gateway's default JSON (an EG waypoint in an ambient mesh, as kubectl logs printed it)
ENVOY_GATEWAY_LINE = (
    '{":authority":"backend:3000","bytes_received":0,"bytes_sent":466,"connection_termination_details":null,'
    '"downstream_local_address":"10.244.0.14:3000","downstream_remote_address":"10.244.0.12:34805","duration":1,'
    '"method":"GET","protocol":"HTTP/1.1","requested_server_name":null,"response_code":200,'
    '"response_code_details":"via_upstream","response_flags":"-",'
    '"route_name":"httproute/envoy-gateway-system/backend/rule/0/match/0/backend","start_time":"2025-04-09T11:44:45.639Z",'
    '"upstream_cluster":"httproute/envoy-gateway-system/backend/rule/0","upstream_host":"10.244.0.13:3000",'
    '"upstream_local_address":"10.244.0.14:58822","upstream_transport_failure_reason":null,"user-agent":"curl/7.88.1",'
    '"x-envoy-origin-path":"/","x-envoy-upstream-service-time":"3","x-forwarded-for":"10.244.0.12",'
    '"x-request-id":"ab1e4da7-5f1d-45ea-bb4a-fa1ccd03b82b"}'
)


@pytest.mark.parametrize("fmt,format_string,line,destination,upstream_s", [
    ("envoy", ENVOY_DEFAULT_LONG, ENVOY_DEFAULT_LINE, "locations", 0.1),
    ("istio_json", None, ENVOY_GATEWAY_LINE, "backend", 0.003),
    ("auto", None, ENVOY_GATEWAY_LINE, "backend", 0.003),
])
def test_other_spellings_of_the_same_fields_give_the_same_record(fmt, format_string, line, destination, upstream_s):
    """Envoy's current default format writes %REQUEST_HEADER(...)% / %RESPONSE_HEADER(...)%
    (long names of REQ/RESP), Envoy Gateway's default JSON keys headers by their own names
    (":authority"): both parsed, but every request went to destination "unknown", no upstream
    time, no dependency edge."""
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    st = ex.add_stream("w", fmt, format_string).feed([line])
    assert st.parsed == 1, st
    text = generate_latest(reg).decode()
    assert f'destination="{destination}"' in text and 'destination="unknown"' not in text
    assert sample(reg, "promreflex_mesh_upstream_service_time_seconds_sum", source="w",
                  destination=destination) == pytest.approx(upstream_s)


ISTIO_19_LINE = (
    '[2020-11-25T21:26:18.409Z] "GET /status/418 HTTP/1.1" 418 - via_upstream - "-" 0 135 4 4 "-" "curl/7.73.0-DEV" '
    '"84961386-6d84-929d-98bd-c5aee93b5c88" "httpbin:8000" "10.44.1.27:80" '
    "outbound|8000||httpbin.foo.svc.cluster.local 10.44.1.23:37652 10.0.45.184:8000 10.44.1.23:46520 - default"
)


def _json_line(**obj: object) -> str:
    import json

    return json.dumps(obj)


@pytest.mark.parametrize("lines,parsed,rejected", [
    # Fluent Bit's tail input with the CRI parser (AWS Container Insights' shape): key order its own
    ([_json_line(time="2026-08-09T02:57:08.636329927Z", stream="stdout", _p="F", log=ISTIO_19_LINE,
                 kubernetes={"pod_name": "sleep"})], 1, {}),
    # ... a line the runtime split: P then F pieces, joined
    ([_json_line(time="t", stream="stdout", _p="P", log=ISTIO_19_LINE[:100]),
      _json_line(time="t", stream="stdout", _p="F", log=ISTIO_19_LINE[100:])], 1, {}),
    # ... with message/logtag instead of log/_p
    ([_json_line(time="t", stream="stdout", logtag="F", message=ISTIO_19_LINE)], 1, {}),
    # Vector's kubernetes_logs source, Envoy's own stderr line beside an access line
    ([_json_line(file="/var/log/pods/x/istio-proxy/0.log", message=ISTIO_19_LINE, source_type="kubernetes_logs",
                 stream="stdout"),
      _json_line(message="2020-11-25T21:26:18.409Z\twarning\tenvoy config\tclosed", source_type="kubernetes_logs",
                 stream="stderr")], 1, {"other_stream": 1}),
    # kubectl logs --prefix
    (["[pod/sleep-7656cf8794-6lsm4/istio-proxy] " + ISTIO_19_LINE], 1, {}),
])
def test_log_collectors_records_are_unwrapped(lines, parsed, rejected):
    """Fluent Bit and Vector re-encode the runtime's lines: they were rejected (missing_field under
    auto, which reads as a broken JSON access log)."""
    for fmt in ("istio_text", "auto"):
        reg = CollectorRegistry()
        st = MeshExporter(registry=reg).add_stream("w", fmt).feed(lines)
        assert (st.parsed, dict(st.rejected)) == (parsed, rejected), (fmt, st)
        assert sample(reg, "promreflex_mesh_requests_total", source="w", destination="httpbin", code_class="4xx",
                      response_flags="none") == 1


@pytest.mark.parametrize("line", [
    ISTIO_19_LINE.replace('"GET /status/418 HTTP/1.1" 418', '"GET /ws HTTP/1.1" 101').replace(" 4 4 ", " 3600000 4 "),
    ISTIO_19_LINE.replace('"GET /status/418 HTTP/1.1" 418', '"CONNECT - HTTP/2" 200').replace(" 4 4 ", " 3600000 4 "),
])
def test_an_upgraded_or_tunnelled_request_keeps_its_lifetime_out_of_the_latency(line):
    """A WebSocket (101) or CONNECT record is written when the socket closes: its DURATION is the
    session's hour, which put an edge's p99 latency in +Inf. Counted, not timed."""
    reg = CollectorRegistry()
    st = MeshExporter(registry=reg).add_stream("w", "istio_text").feed([line])
    assert st.parsed == 1
    assert sum(sample(reg, "promreflex_mesh_requests_total", source="w", destination="httpbin", code_class=c,
                      response_flags="none") or 0 for c in ("1xx", "2xx")) == 1
    assert not sample(reg, "promreflex_mesh_request_duration_seconds_count", source="w", destination="httpbin")
