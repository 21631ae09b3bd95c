"""Envoy and Istio logs as other teams write them (a stranger's review, 2026-11-28): each case
was read wrongly, refused or crashed the exporter before. Files: tests/fixtures/mesh/stranger/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.mesh.collector import MeshExporter
from exporters.mesh.runtime import RuntimeUnwrapper, wrap_cri

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "mesh" / "stranger"
ISTIO_TAIL = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
              '%RESPONSE_FLAGS% %DURATION% "%REQ(:AUTHORITY)%" %UPSTREAM_CLUSTER%')


def feed(fmt: str, workload: str, lines: list[str], format_string: str | None = None, *,
         json_format: dict | None = None, namespaces: tuple[str, ...] = ()):
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg, namespaces=namespaces)
    stream = ex.add_stream(workload, fmt, format_string, json_format=json_format)
    stream.feed(lines)
    stream.flush()
    requests: dict[tuple[str, str, str], float] = {}
    for m in reg.collect():
        for s in m.samples:
            if m.name == "promreflex_mesh_requests" and s.name.endswith("_total") and s.value:
                key = (s.labels["source"], s.labels["destination"], s.labels["code_class"])
                requests[key] = requests.get(key, 0) + s.value  # summed over the response flags
    grpc = {s.labels["grpc_status"]: s.value for m in reg.collect() if m.name == "promreflex_mesh_grpc_responses"
            for s in m.samples if s.name.endswith("_total") and s.value}
    timed = sum(s.value for m in reg.collect() if m.name == "promreflex_mesh_request_duration_seconds"
                for s in m.samples if s.name.endswith("_count"))
    return stream.stats, requests, grpc, timed


def lines(name: str) -> list[str]:
    return (HERE / name).read_text(encoding="utf-8").splitlines()


def test_a_quote_in_a_client_header_is_refused_not_read_with_shifted_fields():
    """Envoy does not escape ``"`` in a header (envoyproxy/envoy#4191): a User-Agent ``x" "y``
    made the request id the destination, and 200 such requests filled the label budget."""
    stats, requests, _, _ = feed("istio_text", "productpage", lines("ua_quote.log"))
    assert stats.parsed == 0 and stats.rejected["format_mismatch"] == 2
    assert requests == {}
    clean = [line.replace('x" "y)', "x y)").replace('curl/8" "a" "b', "curl/8 a b") for line in lines("ua_quote.log")]
    stats, requests, _, _ = feed("istio_text", "productpage", clean)
    assert requests == {("productpage", "reviews", "2xx"): 1, ("productpage", "reviews", "5xx"): 1}


def test_grpc_calls_envoy_failed_itself_are_failures_without_a_grpc_status():
    """``200 UH``: Envoy's local reply to a gRPC call is HTTP 200 with grpc-status 14; Istio's
    default formats do not log the status, and these counted as 2xx."""
    _, requests, _, _ = feed("istio_text", "frontend", lines("grpc_local_reply.log"))
    assert requests == {("frontend", "maestro-grpc", "5xx"): 1, ("frontend", "cartservice", "5xx"): 2}
    text = "\n".join(lines("grpc_local_reply.log"))
    _, requests, _, _ = feed("istio_text", "frontend", text.replace(" 200 UH ", " 200 DC ").splitlines()[:1])
    assert requests == {("frontend", "maestro-grpc", "2xx"): 1}  # a client that left is no failure


@pytest.mark.parametrize("arg", ["SNAKE_STRING", "CAMEL_STRING"])
def test_grpc_status_with_an_argument_is_read(arg):
    fmt = ISTIO_TAIL + f" %GRPC_STATUS({arg})%"
    got = lines("grpc_snake.log")
    if arg == "CAMEL_STRING":
        got = [g.replace("UNAVAILABLE", "Unavailable").replace("NOT_FOUND", "NotFound") for g in got]
    _, requests, grpc, _ = feed("envoy", "client", got, fmt)
    assert requests == {("client", "greeter", "5xx"): 1, ("client", "greeter", "4xx"): 1, ("client", "greeter", "2xx"): 1}
    assert grpc == {"Unavailable": 1, "NotFound": 1, "OK": 1}


def test_an_ecs_style_json_log_is_not_taken_for_a_filebeat_event():
    jf = json.loads((HERE / "jf_ecs.json").read_text())
    stats, requests, _, _ = feed("istio_json", "front-end", lines("ecs.log"), json_format=jf)
    assert stats.parsed == 2
    assert requests == {("front-end", "carts", "5xx"): 1, ("front-end", "carts", "2xx"): 1}
    # A Filebeat event whose own keys were dropped (drop_fields: agent, ecs, input, log) still is one
    raw = lines("grpc_local_reply.log")[0]
    event = json.dumps({"@timestamp": "2025-09-10T03:25:30.208Z", "message": raw,
                        "kubernetes": {"pod": {"name": "frontend-1"}}, "host": {"name": "node-1"}})
    stats, requests, _, _ = feed("istio_text", "frontend", [event])
    assert stats.parsed == 1 and requests == {("frontend", "maestro-grpc", "5xx"): 1}


def test_kubectl_timestamps_before_a_format_of_any_start():
    emissary = ('ACCESS [%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
                '%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
                '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
                '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"')
    stats, requests, _, _ = feed("envoy", "emissary", lines("emissary_kts.log"), emissary, namespaces=("default",))
    assert stats.parsed == 2
    assert requests == {("emissary", "external", "2xx"): 1, ("emissary", "quote", "2xx"): 1}


def test_host_names_of_pods_kubernetes_and_consul():
    """A StatefulSet pod's and a pod IP's DNS names are their service's; localhost is no service;
    Consul Connect's clusters say the edge; an FQDN whose second label is a namespace is external;
    %REQ(HOST)% is the authority."""
    envoy_default = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
                     '%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
                     '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
                     '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"')
    _, requests, _, _ = feed("envoy", "app", lines("podhost.log"), envoy_default)
    assert requests == {("app", "es-master-headless", "2xx"): 2, ("app", "reviews", "2xx"): 1}
    _, requests, _, _ = feed("istio_json", "web", lines("consul.log"))
    assert requests == {("web", "backend", "2xx"): 1, ("unknown", "web", "2xx"): 1}
    from exporters.mesh.labels import _consul_service

    # a service-resolver's subset comes first; a partition's cluster says internal-v1
    assert [_consul_service(c) for c in ("v2.backend.default.dc1.internal.3bb1.consul",
                                         "backend.ns.part.dc1.internal-v1.td.consul",
                                         "v2.backend.ns.part.dc1.internal-v1.td.consul", "x.consul",
                                         "internal-api.default.dc1.internal.3bb1.consul",
                                         "api.internal.dc1.internal.3bb1.consul",
                                         "billing.default.default.peer1.external.3bb1.consul")] == [
        "backend", "backend", "backend", "unknown", "internal-api", "api", "billing"]
    _, requests, _, _ = feed("istio_text", "checkout", lines("nscollide.log"), namespaces=("payments",))
    assert requests == {("checkout", "external", "2xx"): 1, ("checkout", "api", "2xx"): 1}
    fmt = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
           '%RESPONSE_FLAGS% %DURATION% "%REQ(HOST)%" "%UPSTREAM_HOST%"')
    _, requests, _, _ = feed("envoy", "front-end", lines("reqhost.log"), fmt)
    assert requests == {("front-end", "carts", "5xx"): 1}


def test_day_long_connections_are_counted_not_refused_or_timed():
    stats, requests, _, timed = feed("istio_text", "app", lines("longconn.log"))
    assert stats.parsed == 3 and timed == 0
    assert requests == {("app", "postgres", "tcp"): 1, ("app", "kafka", "tcp"): 1, ("app", "chat", "1xx"): 1}


def test_an_rbac_refusal_of_a_tcp_connection_is_a_failure_as_ext_authz_is():
    _, requests, _, _ = feed("istio_text", "notebook", lines("tcp_rbac.log"))
    assert requests == {("unknown", "notebook", "none"): 2}


def test_fluent_bit_records_with_log_first_and_raw_lines():
    """Fluent Bit's CRI-parsed records with ``log`` first were taken for Docker pieces (no final
    newline: 460 records glued into one too_long); ``{"log": "<raw CRI line>"}`` likewise."""
    base = lines("grpc_local_reply.log")[0].replace(" 200 UH ", " 200 - ")
    pieces = [base[:60], base[60:]]
    records = [json.dumps({"log": pieces[0], "stream": "stdout", "_p": "P", "time": "2025-09-10T03:25:30Z"}),
               json.dumps({"log": pieces[1], "stream": "stdout", "_p": "F", "time": "2025-09-10T03:25:30Z"})]
    records += [json.dumps({"log": base, "stream": "stdout", "_p": "F", "time": "t"})] * 3
    records += [json.dumps({"log": cri}) for cri in wrap_cri(base, "2025-09-10T03:25:30.1Z")]
    records += [json.dumps({"stream": "stdout", "logtag": "P", "log": pieces[0]}),
                json.dumps({"stream": "stdout", "logtag": "F", "log": pieces[1]})]
    # Fluent Bit's Elasticsearch output adds @timestamp: not a Filebeat event (its pieces joined)
    records += [json.dumps({"@timestamp": "2025-09-10T03:25:30Z", "stream": "stdout", "logtag": tag, "message": p})
                for tag, p in (("P", pieces[0]), ("F", pieces[1]))]
    stats, requests, _, _ = feed("istio_text", "frontend", records)
    assert stats.parsed == 7 and dict(stats.rejected) == {}
    assert requests == {("frontend", "maestro-grpc", "2xx"): 7}
    out = RuntimeUnwrapper().push(json.dumps({"log": "x\n", "stream": "stdout", "time": "t"}))
    assert [u.text for u in out] == ["x"]  # Docker json-file still


def test_two_globs_naming_one_file_read_it_once(tmp_path, capsys):
    from promreflex.cli import main

    pod = tmp_path / "pods" / "sock-shop_carts-abc" / "istio-proxy"
    pod.mkdir(parents=True)
    (pod / "0.log").write_text(lines("grpc_local_reply.log")[0] + "\n")
    cfg = tmp_path / "mesh.yml"
    cfg.write_text(
        "logs:\n"
        f"  - {{path: '{tmp_path}/pods/sock-shop_carts-*/istio-proxy/*.log', workload: carts, format: istio_text}}\n"
        f"  - {{path: '{tmp_path}/pods/sock-shop_*/istio-proxy/*.log', workload: other, format: istio_text}}\n"
    )
    assert main(["exporter-mesh", "--config.file", str(cfg), "--oneshot"]) == 0
    out = capsys.readouterr().out
    assert 'promreflex_mesh_requests_total{code_class="5xx",destination="maestro-grpc",response_flags="UH",source="carts"} 1.0' in out
    assert 'source="other"' not in out
