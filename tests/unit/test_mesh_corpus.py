"""Every line of the shared Envoy/Istio access-log corpus is parsed or rejected with a reason.

Counts are what the files hold (inspected by hand; see SOURCE.md beside them). Several files
interleave the client and the server sidecar of one request; where that matters the test
feeds each line to the stream of the sidecar that wrote it.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporters.mesh.collector import MeshExporter
from exporters.mesh.envoy_format import ISTIO_LEGACY_TEXT_FORMAT
from tests.corpus import corpus, needs_corpus

CORPUS = corpus("envoy-istio-access-logs")
RETRY_FORMAT = (  # ssup2 istio-retry-policy post, "[File 5]"
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%" %RESPONSE_CODE% '
    "retry_attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% flags=%RESPONSE_FLAGS% details=%RESPONSE_CODE_DETAILS%\n"
)

pytestmark = needs_corpus


def lines(rel: str) -> list[str]:
    return (CORPUS / rel).read_text().splitlines()


def feed(rel: str, fmt: str = "istio_text", format_string: str | None = None, workload: str = "w"):
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    stream = ex.add_stream(workload, fmt, format_string)
    stats = stream.feed(lines(rel))
    stats.add(stream.flush())
    return reg, ex, stats


def req(reg: CollectorRegistry, **labels: str) -> float:
    return reg.get_sample_value("promreflex_mesh_requests_total", labels) or 0.0


@pytest.mark.parametrize(
    ("rel", "n"),
    [
        ("text/istio.io_access-log-task.log", 2),
        ("text/slime_lazyload_tutorials.log", 6),
        ("text/ssup2_istio-circuit-breaking.log", 6),
        ("text/ssup2_istio-sidecar-proxy.log", 6),
    ],
)
def test_default_istio_text_files_parse_completely(rel: str, n: int) -> None:
    reg, _, stats = feed(rel)
    assert (stats.lines, stats.parsed, dict(stats.rejected)) == (n, n, {})
    assert reg.get_sample_value("promreflex_mesh_lines_total", {"workload": "w"}) == n


def test_circuit_breaking_overflow_is_counted_per_flag() -> None:
    reg, _, _ = feed("text/ssup2_istio-circuit-breaking.log", workload="fortio")
    edge = {"source": "fortio", "destination": "httpbin"}
    assert req(reg, **edge, code_class="5xx", response_flags="UO") == 3
    assert req(reg, **edge, code_class="2xx", response_flags="none") == 3
    # the three overflowed requests carry "-" as upstream service time: not observed
    assert reg.get_sample_value("promreflex_mesh_upstream_service_time_seconds_count", edge) == 3
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", edge) == 6
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_sum", edge) == pytest.approx(0.095)


def test_istio_io_task_both_sidecars() -> None:
    client, server = lines("text/istio.io_access-log-task.log")
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    sleep, httpbin = ex.add_stream("sleep"), ex.add_stream("httpbin")
    assert sleep.observe(client).parsed == 1 and httpbin.observe(server).parsed == 1
    assert req(reg, source="sleep", destination="httpbin", code_class="4xx", response_flags="none") == 1
    assert req(reg, source="unknown", destination="httpbin", code_class="4xx", response_flags="none") == 1
    assert ex.edges() == {("sleep", "httpbin")}


def test_slime_lazyload_goes_through_global_sidecar_first() -> None:
    _, ex, _ = feed("text/slime_lazyload_tutorials.log", workload="productpage")
    assert ex.edges() == {
        ("productpage", "global-sidecar"),
        ("productpage", "details"),
        ("productpage", "reviews"),
    }


def test_cray_lines_are_older_formats() -> None:
    _, _, stats = feed("text/cray_docs-csm_intermittent-503s.log")
    assert dict(stats.rejected) == {"format_mismatch": 2}
    # Istio 1.5-1.8 default: the first line is that format cut short in the source document
    _, _, stats = feed("text/cray_docs-csm_intermittent-503s.log", "istio_text_legacy")
    assert dict(stats.rejected) == {"truncated": 1, "format_mismatch": 1}
    # the second one has no UPSTREAM_TRANSPORT_FAILURE_REASON: give that format to the compiler
    older = ISTIO_LEGACY_TEXT_FORMAT.replace('"%UPSTREAM_TRANSPORT_FAILURE_REASON%" ', "")
    reg, _, stats = feed("text/cray_docs-csm_intermittent-503s.log", "envoy", older, workload="hbtd")
    assert (stats.parsed, dict(stats.rejected)) == (1, {"format_mismatch": 1})
    # authority api-gw-service-nmn.local is not a mesh service name
    assert req(reg, source="hbtd", destination="external", code_class="5xx", response_flags="UAEX") == 1


def test_retry_policy_custom_format() -> None:
    _, _, stats = feed("text/ssup2_istio-retry-policy_customfmt.log")
    assert dict(stats.rejected) == {"format_mismatch": 3}
    reg, _, stats = feed("text/ssup2_istio-retry-policy_customfmt.log", "envoy", RETRY_FORMAT)
    assert (stats.lines, stats.parsed) == (3, 3)
    # no cluster and no authority in this format: the destination is unknown, never a path
    assert req(reg, source="w", destination="unknown", code_class="5xx", response_flags="none") == 2
    assert req(reg, source="w", destination="unknown", code_class="5xx", response_flags="URX") == 1
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", {"source": "w", "destination": "unknown"}) is None


def test_retry_format_records() -> None:
    from exporters.mesh.envoy_format import CompiledFormat

    fmt = CompiledFormat(RETRY_FORMAT)
    recs = [fmt.parse(x) for x in lines("text/ssup2_istio-retry-policy_customfmt.log")]
    assert [(r["method"], r["path"], r["response_code"]) for r in recs] == [
        ("HEAD", "/status/501", 501),
        ("HEAD", "/status/502", 502),
        ("HEAD", "/status/503", 503),
    ]
    assert [r["upstream_request_attempt_count"] for r in recs] == [1, 1, 4]
    assert [r["response_flags"] for r in recs] == [(), (), ("URX",)]


def test_json_file_all_92_lines() -> None:
    reg, ex, stats = feed("json/ssup2_istio-sidecar-proxy-access-log.ndjson", "istio_json", workload="client")
    assert (stats.lines, stats.parsed, dict(stats.rejected)) == (92, 92, {})
    out = {"source": "client", "destination": "mock-server"}
    inb = {"source": "unknown", "destination": "client"}  # the file interleaves the server sidecar
    # gRPC failures answered with HTTP 200 take their status' class (Unavailable -> 5xx):
    # 2 HTTP 503s written "URX,UF" plus 2 gRPC Unavailable over HTTP 200.
    assert req(reg, **out, code_class="5xx", response_flags="UF,URX") == 4
    assert req(reg, **out, code_class="5xx", response_flags="UH") == 15  # 7 HTTP 503 + 8 gRPC Unavailable
    assert req(reg, **out, code_class="none", response_flags="DC") == 2
    assert req(reg, **inb, code_class="none", response_flags="DR") == 2
    assert req(reg, **inb, code_class="5xx", response_flags="UC") == 10  # gRPC errors over HTTP 200
    total = sum(
        s.value
        for m in reg.collect()
        if m.name == "promreflex_mesh_requests"
        for s in m.samples
        if s.name.endswith("_total")
    )
    assert total == 92
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", out) == 56
    assert reg.get_sample_value("promreflex_mesh_upstream_service_time_seconds_count", out) == 27
    grpc = {"OK": 4, "Unavailable": 16, "Unknown": 2, "Internal": 5}
    for status, n in grpc.items():
        assert reg.get_sample_value("promreflex_mesh_grpc_responses_total", {**out, "grpc_status": status}) == n
    assert ex.edges() == {("client", "mock-server")}
