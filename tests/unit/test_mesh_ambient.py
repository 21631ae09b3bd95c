"""The mesh exporter on logs from other setups: Istio ambient (ztunnel, waypoints), kubectl
and Filebeat wrappers, gRPC failures over HTTP 200, Envoy's own default format, --oneshot on
real files (globs, a last line without newline, missing paths), the label-budget counter.

Sample lines are the published ones (istio.io ambient docs, Envoy's access-log docs, Kiali's
waypoint test), unchanged apart from joining the docs' wrapped lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporters.mesh import cli
from exporters.mesh.collector import MeshExporter
from exporters.mesh.labels import workload_of_pod
from exporters.mesh.config import load_mesh_config

# istio.io, "Troubleshoot connectivity issues with ztunnel" / "Verify mutual TLS is enabled".
ZT_OUT = (
    '2024-08-21T15:32:05.754291Z info access connection complete src.addr=10.42.0.9:33772 '
    'src.workload="curl-7656cf8794-6lsm4" src.namespace="default" src.identity="spiffe://cluster.local/ns/default/sa/curl" '
    'dst.addr=10.42.0.5:15008 dst.hbone_addr=10.42.0.5:9080 dst.service="details.default.svc.cluster.local" '
    'dst.workload="details-v1-857849f66-ft8wx" dst.namespace="default" '
    'dst.identity="spiffe://cluster.local/ns/default/sa/bookinfo-details" direction="outbound" bytes_sent=84 '
    'bytes_recv=358 duration="15ms"'
)
ZT_IN = (
    '2024-05-04T09:59:05.028709Z info access connection complete src.addr=10.244.1.12:60059 '
    'src.workload="curl-7656cf8794-r7zb9" src.namespace="default" src.identity="spiffe://cluster.local/ns/default/sa/curl" '
    'dst.addr=10.244.1.10:9080 dst.hbone_addr="10.244.1.10:9080" dst.service="productpage.default.svc.cluster.local" '
    'dst.workload="productpage-v1-87d54dd59-fn6vw" dst.namespace="productpage" '
    'dst.identity="spiffe://cluster.local/ns/default/sa/bookinfo-productpage" direction="inbound" bytes_sent=175 '
    'bytes_recv=80 duration="1ms"'
)
ZT_DENIED = (
    '2026-09-30T06:45:59.689271Z error access connection complete src.addr=198.18.4.182:46376 src.workload="attacker" '
    'src.namespace="attacker" src.cluster="Kubernetes" dst.addr=198.18.0.40:80 '
    'dst.service="backend.backend.svc.cluster.local" dst.workload="backend" dst.namespace="backend" '
    'direction="outbound" error="connection closed due to policy rejection"'
)
ZT_EXTERNAL = (
    '2026-08-03T15:47:26.637407Z info access connection complete src.addr=10.244.0.5:54646 '
    'src.workload="http-client-6b4b85489f-t6sl2" src.namespace="default" dst.addr=142.251.209.46:80 '
    'direction="outbound" bytes_sent=74 bytes_recv=773 duration="357ms"'
)
# A waypoint's log (Istio's text format; Kiali's test data and istio.io's waypoint tasks).
WAYPOINT = (
    '[2025-01-30T12:10:13.279Z] "GET /details/0 HTTP/1.1" 200 - via_upstream - "-" 0 178 0 0 "-" '
    '"Go-http-client/1.1" "e7d5b6ce-5f7f-9731-8471-ca5bcd650a72" "details:9080" '
    '"envoy://connect_originate/10.244.0.32:9080" inbound-vip|9080|http|details.bookinfo.svc.cluster.local '
    'envoy://internal_client_address/ 10.96.185.196:9080 10.244.0.37:52134 - default'
)
WAYPOINT_403 = (
    '[2024-10-14T20:15:48.344Z] "GET /details/1 HTTP/1.1" 403 - rbac_access_denied_matched_policy[none] - "-" 0 19 0 - '
    '"-" "curl/8.10.1" "83c73503-607e-4590-9de6-d8c243970763" "bookinfo.example.com" "-" '
    'inbound-vip|9080|http|details.backend.svc.cluster.local - 10.96.104.243:9080 10.244.0.42:48646 - default'
)
# Envoy's documentation, "Default format string" example.
ENVOY_DEFAULT = (
    '[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" '
    '"nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80"'
)
ISTIO_TEXT = (
    '[2024-03-01T12:00:00.123Z] "GET /carts/1/items HTTP/1.1" 200 - via_upstream - "-" 0 42 12 11 "-" '
    '"node-fetch/1.0" "rid-1" "carts:80" "10.0.0.7:80" outbound|80||carts.sock-shop.svc.cluster.local '
    '10.0.0.5:40000 10.0.0.7:80 10.0.0.5:39000 - default'
)


def exporter(fmt: str, workload: str = "node", **kw) -> tuple[CollectorRegistry, MeshExporter, object]:
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg, **kw)
    return reg, ex, ex.add_stream(workload, fmt)


def requests(reg: CollectorRegistry, **labels: str) -> float:
    return reg.get_sample_value("promreflex_mesh_requests_total", labels) or 0.0


def test_ztunnel_l4_lines_map_to_services():
    reg, ex, stream = exporter("ztunnel", workload="ztunnel")
    stats = stream.feed([ZT_OUT, ZT_IN, ZT_DENIED, ZT_EXTERNAL])
    assert (stats.parsed, dict(stats.rejected)) == (4, {})
    assert requests(reg, source="curl", destination="details", code_class="tcp", response_flags="none") == 1
    # inbound: the caller is its service account (as for a sidecar's inbound record)
    assert requests(reg, source="curl", destination="productpage", code_class="tcp", response_flags="none") == 1
    assert requests(reg, source="attacker", destination="backend", code_class="none", response_flags="none") == 1
    assert requests(reg, source="http-client", destination="external", code_class="tcp", response_flags="none") == 1
    assert ("curl", "details") in ex.edges() and ("attacker", "backend") in ex.edges()
    # a connection's lifetime is not a request's latency
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count",
                                {"source": "curl", "destination": "details"}) is None


def test_waypoint_clusters_name_the_service():
    reg, ex, stream = exporter("istio_text", workload="waypoint")
    assert stream.feed([WAYPOINT, WAYPOINT_403]).parsed == 2
    assert requests(reg, source="unknown", destination="details", code_class="2xx", response_flags="none") == 1
    assert requests(reg, source="unknown", destination="details", code_class="4xx", response_flags="none") == 1
    assert requests(reg, source="waypoint", destination="external", code_class="2xx", response_flags="none") == 0


def test_kubectl_timestamps_and_filebeat_envelopes_are_unwrapped():
    reg, _, stream = exporter("auto", workload="front-end")
    beats = json.dumps({
        "@timestamp": "2024-03-01T12:00:00.200Z", "message": ISTIO_TEXT,
        "input": {"type": "container"}, "ecs": {"version": "8.0.0"}, "log": {"offset": 0, "file": {"path": "/x"}},
    })
    beats_cri = json.dumps({"@timestamp": "2024-03-01T12:00:00.200Z", "message": "2024-03-01T12:00:00.1Z stdout F " + ISTIO_TEXT,
                            "agent": {"type": "filebeat"}})
    lines = [
        "2024-03-01T12:00:00.123456789Z " + ISTIO_TEXT,  # kubectl logs --timestamps
        "2024-08-21T15:32:05.754300Z " + ZT_OUT,  # kubectl logs --timestamps on a ztunnel
        beats,
        beats_cri,
    ]
    stats = stream.feed(lines)
    assert (stats.parsed, dict(stats.rejected)) == (4, {})
    assert requests(reg, source="front-end", destination="carts", code_class="2xx", response_flags="none") == 3
    assert requests(reg, source="curl", destination="details", code_class="tcp", response_flags="none") == 1


def test_grpc_failures_over_http_200_are_failures():
    fmt = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
           '%RESPONSE_FLAGS% %GRPC_STATUS% %DURATION% "%REQ(:AUTHORITY)%" %UPSTREAM_CLUSTER_RAW%')
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    text = ex.add_stream("checkout", "envoy", fmt)
    cluster = "outbound|50051||payment.shop.svc.cluster.local"
    assert text.feed([
        f'[2024-03-01T12:00:00.000Z] "POST /hipstershop.PaymentService/Charge HTTP/2" 200 - Unavailable 3 "payment:50051" {cluster}',
        f'[2024-03-01T12:00:00.100Z] "POST /hipstershop.PaymentService/Charge HTTP/2" 200 - OK 3 "payment:50051" {cluster}',
        f'[2024-03-01T12:00:00.200Z] "POST /hipstershop.PaymentService/Charge HTTP/2" 200 - NotFound 3 "payment:50051" {cluster}',
    ]).parsed == 3
    js = ex.add_stream("cart", "istio_json")
    assert js.feed([json.dumps({"response_code": 200, "grpc_status": "14", "duration": 2,
                                "upstream_cluster": "outbound|7070||redis.shop.svc.cluster.local"})]).parsed == 1
    edge = {"source": "checkout", "destination": "payment", "response_flags": "none"}
    assert requests(reg, **edge, code_class="5xx") == 1  # Unavailable ~ 503
    assert requests(reg, **edge, code_class="2xx") == 1
    assert requests(reg, **edge, code_class="4xx") == 1  # NotFound ~ 404: the caller's error
    assert requests(reg, source="cart", destination="redis", response_flags="none", code_class="5xx") == 1


def test_envoy_default_format_needs_no_format_string():
    for fmt in ("envoy", "auto"):
        reg, _, stream = exporter(fmt, workload="edge")
        assert stream.feed([ENVOY_DEFAULT]).parsed == 1
        assert requests(reg, source="edge", destination="locations", code_class="2xx", response_flags="none") == 1
        assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_sum",
                                    {"source": "edge", "destination": "locations"}) == pytest.approx(0.226)


def test_label_overflow_is_exported_per_label():
    reg, _, stream = exporter("istio_text", workload="a", max_services=2)
    assert reg.get_sample_value("promreflex_mesh_label_overflow_total", {"label": "destination"}) == 0
    lines = [ISTIO_TEXT.replace("carts", name) for name in ("carts", "orders", "user")]
    stream.feed(lines)
    assert reg.get_sample_value("promreflex_mesh_label_overflow_total", {"label": "destination"}) == 2
    assert reg.get_sample_value("promreflex_mesh_label_overflow_total", {"label": "source"}) == 0


def config(tmp_path: Path, logs: list[dict]) -> Path:
    path = tmp_path / "mesh.yml"
    path.write_text(yaml.safe_dump({"logs": logs}))
    return path


def run_oneshot(cfg: Path, capsys) -> tuple[int, str, str]:
    code = cli.main(["--config.file", str(cfg), "--oneshot"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_oneshot_globs_keeps_an_unterminated_last_line_and_fails_on_missing_paths(tmp_path, capsys):
    pods = tmp_path / "pods"
    for i, pod in enumerate(("front-end-6f48dfb7db-862sm", "front-end-6f48dfb7db-x9k2p")):
        d = pods / pod / "istio-proxy"
        d.mkdir(parents=True)
        body = "\n".join([ISTIO_TEXT] * (i + 1))  # no newline at the end of either file
        (d / "0.log").write_text(body)
    cfg = config(tmp_path, [{"workload": "front-end", "path": str(pods / "*" / "istio-proxy" / "*.log")}])
    code, out, _ = run_oneshot(cfg, capsys)
    assert code == 0
    assert ('promreflex_mesh_requests_total{code_class="2xx",destination="carts",response_flags="none",'
            'source="front-end"} 3.0') in out
    assert load_mesh_config(cfg).logs[0].path.name == "*.log"

    code, _, err = run_oneshot(config(tmp_path, [{"workload": "a", "path": str(tmp_path / "nope.log")}]), capsys)
    assert code == 1 and "no such log" in err and "nope.log" in err
    code, _, err = run_oneshot(config(tmp_path, [{"workload": "a", "path": str(tmp_path / "none-*.log")}]), capsys)
    assert code == 1 and "matches no file" in err


# A sidecar's record of a proxied TCP connection (MySQL): Envoy logs no method, protocol or
# response code, and DURATION is the connection's lifetime (here 600 s and 45 s).
TCP_OK = (
    '[2024-05-01T10:00:00.000Z] "- - -" 0 - - - "-" 1205 3410 600000 - "-" "-" "-" "-" "10.244.1.9:3306" '
    'outbound|3306||orders-db.shop.svc.cluster.local 10.244.2.3:41234 10.96.0.50:3306 10.244.2.3:55012 - -'
)
TCP_UF = (
    '[2024-05-01T10:00:02.000Z] "- - -" 0 UF - - "-" 0 0 1 - "-" "-" "-" "-" "10.244.1.9:3306" '
    'outbound|3306||orders-db.shop.svc.cluster.local - 10.96.0.50:3306 10.244.2.3:55016 - -'
)
HTTP_DC = (  # an HTTP request that got no answer: still an error
    '[2024-05-01T10:00:03.000Z] "GET /orders HTTP/1.1" 0 DC - - "-" 0 0 7 - "-" "curl" "r" "orders-db:80" '
    '"10.244.1.9:80" outbound|80||orders-db.shop.svc.cluster.local - 10.96.0.50:80 10.244.2.3:55018 - default'
)


def test_sidecar_tcp_connections_are_tcp_not_errors_and_stay_out_of_latency():
    reg, ex, stream = exporter("istio_text", "orders")
    assert stream.feed([TCP_OK, TCP_OK.replace("600000", "45000"), TCP_UF, HTTP_DC]).parsed == 4
    edge = {"source": "orders", "destination": "orders-db"}
    assert requests(reg, **edge, code_class="tcp", response_flags="none") == 2
    assert requests(reg, **edge, code_class="none", response_flags="UF") == 1  # failed: an error, as ztunnel's
    assert requests(reg, **edge, code_class="none", response_flags="DC") == 1
    # only the HTTP request is a request duration
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", edge) == 1
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_sum", edge) == pytest.approx(0.007)


def test_sidecar_tcp_in_json_and_envoy_format_strings():
    reg, ex, stream = exporter("istio_json", "orders")
    rec = {"start_time": "2024-05-01T10:00:00.000Z", "method": None, "path": None, "protocol": None,
           "response_code": 0, "response_flags": "-", "duration": 600000,
           "upstream_cluster": "outbound|3306||orders-db.shop.svc.cluster.local", "authority": None}
    failed = {**rec, "response_flags": "UH", "duration": 0}
    assert stream.feed([json.dumps(rec), json.dumps(failed)]).parsed == 2
    edge = {"source": "orders", "destination": "orders-db"}
    assert requests(reg, **edge, code_class="tcp", response_flags="none") == 1
    assert requests(reg, **edge, code_class="none", response_flags="UH") == 1
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", edge) is None

    fs = '[%START_TIME%] %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER%'
    reg = CollectorRegistry()
    stream = MeshExporter(registry=reg).add_stream("orders", "envoy", fs)
    tail = ' "10.0.0.1:3306" outbound|3306||orders-db.shop.svc.cluster.local'
    lines = ["[2024-05-01T10:00:00.000Z] - - 1205 3410 600000" + tail,
             "[2024-05-01T10:00:01.000Z] 0 UF,URX 0 0 2" + tail]
    assert stream.feed(lines).parsed == 2
    assert requests(reg, **edge, code_class="tcp", response_flags="none") == 1
    assert requests(reg, **edge, code_class="none", response_flags="UF,URX") == 1
    assert reg.get_sample_value("promreflex_mesh_request_duration_seconds_count", edge) is None


# ztunnel with access-log debugging on: a DEBUG "connection opened" line precedes each
# connection's "connection complete" (istio/ztunnel src/proxy/metrics.rs).
ZT_OPENED = (
    '2024-08-21T15:32:05.700000Z\tdebug\taccess\tconnection opened\tsrc.addr=10.42.0.9:33772 '
    'src.workload="curl-7656cf8794-6lsm4" src.namespace="default" dst.addr=10.42.0.5:15008 '
    'dst.hbone_addr=10.42.0.5:9080 dst.service="details.default.svc.cluster.local" direction="outbound"'
)


@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_ztunnel_connection_opened_is_skipped_not_counted_twice(fmt):
    reg, ex, stream = exporter(fmt, workload="ztunnel")
    st = stream.feed([ZT_OPENED, ZT_OUT, ZT_OPENED.replace("\tdebug\t", "\tinfo\t"), ZT_DENIED])
    assert (st.lines, st.parsed, dict(st.rejected)) == (4, 2, {"not_a_record": 2})
    assert requests(reg, source="curl", destination="details", code_class="tcp", response_flags="none") == 1
    assert requests(reg, source="attacker", destination="backend", code_class="none", response_flags="none") == 1
    errors = {r: reg.get_sample_value("promreflex_mesh_parse_errors_total", {"workload": "ztunnel", "reason": r})
              for r in ("not_a_record", "format_mismatch")}
    assert errors == {"not_a_record": 2, "format_mismatch": 0}
    assert reg.get_sample_value("promreflex_mesh_lines_total", {"workload": "ztunnel"}) == 4


def test_not_a_record_exists_at_zero_only_for_formats_that_skip():
    reg, ex, _ = exporter("ztunnel", workload="zt")
    ex.add_stream("carts", "istio_text")
    value = reg.get_sample_value
    assert value("promreflex_mesh_parse_errors_total", {"workload": "zt", "reason": "not_a_record"}) == 0
    assert value("promreflex_mesh_parse_errors_total", {"workload": "carts", "reason": "not_a_record"}) is None



def test_a_connection_is_one_edge_from_both_ztunnels():
    # Bookinfo runs productpage as the account bookinfo-productpage (istio/istio
    # samples/bookinfo/platform/kube/bookinfo.yaml). The caller's ztunnel names its pod; the
    # callee's ztunnel names the pod and the account: both sides are one edge, productpage ->
    # details (the account's node bookinfo-productpage came from the inbound side before).
    out = ZT_OUT.replace('src.workload="curl-7656cf8794-6lsm4"', 'src.workload="productpage-v1-87d54dd59-fn6vw"').replace(
        "sa/curl", "sa/bookinfo-productpage")
    inbound = out.replace('direction="outbound"', 'direction="inbound"')
    reg, ex, stream = exporter("ztunnel", workload="ztunnel")
    assert stream.feed([out, inbound]).parsed == 2
    assert requests(reg, source="productpage", destination="details", code_class="tcp", response_flags="none") == 2
    assert ex.edges() == {("productpage", "details")}
    # without a pod, the account (not matched to a workload: shop-api would have merged into api)
    no_pod = inbound.replace('src.workload="productpage-v1-87d54dd59-fn6vw" ', "")
    assert stream.feed([no_pod]).parsed == 1
    assert requests(reg, source="bookinfo-productpage", destination="details", code_class="tcp", response_flags="none") == 1


@pytest.mark.parametrize(("pod", "workload"), [
    ("report-28312345-x7k2p", "report"),  # a CronJob's run: <cronjob>-<scheduled minute>-<pod suffix>
    ("productpage-v1-87d54dd59-fn6vw", "productpage"),
    ("node-exporter-nq6cw", "node-exporter"),
    ("web-0", "web-0"),  # a StatefulSet's pod keeps its ordinal
])
def test_pods_of_a_cronjob_are_one_workload(pod, workload):
    assert workload_of_pod(pod) == workload
