"""The proxies' own log lines in the access log's stream (exporters/mesh/formats.py,
``proxy_log_line``): an istio-proxy container's stdout, or ``kubectl logs`` (stdout and stderr
merged), carries pilot-agent's lines and Envoy's own besides the access log, and a ztunnel's log
its other targets' lines. They are skipped under ``proxy_log``, which the rejected ratio of
PromreflexMeshLogMostlyRejected leaves out (an idle pod's start-up lines made its log "mostly
rejected"); a malformed ACCESS line is still a rejection. The line shapes are those of
istio/istio#13939, #27834, #37888, #51160 (pilot-agent, Envoy as Istio formats it, Envoy's
default layout) and istio/ztunnel's tracing output; the values are made up."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from exporters.mesh.collector import MeshExporter
from exporters.mesh.formats import proxy_log_line

ACCESS = (
    '[2024-03-01T12:00:00.123Z] "GET /carts/1/items HTTP/1.1" 200 - via_upstream - "-" 0 42 12 11 "-" '
    '"node-fetch/1.0" "rid-1" "carts:80" "10.0.0.7:80" outbound|80||carts.sock-shop.svc.cluster.local '
    '10.0.0.5:40000 10.0.0.7:80 10.0.0.5:39000 - default'
)
ENVOY_DEFAULT = (
    '[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" '
    '"nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80"'
)
PILOT_AGENT = [
    '2025-02-03T08:00:01.000100Z\tinfo\tFLAG: --concurrency="2"',
    "2025-02-03T08:00:01.200300Z\tinfo\txdsproxy\tconnected to upstream XDS server: istiod.istio-system.svc:15012",
    "2025-02-03T08:00:01.300400Z\twarn\tEnvoy proxy is NOT ready: config not received from XDS server (is Istiod running?)",
    "2025-02-03T08:00:02.000500Z     info    Readiness succeeded in 1.1s",  # tabs rendered as spaces
    '{"level":"info","time":"2025-02-03T08:00:01.400000Z","scope":"ads","msg":"ADS: new connection for node:sidecar~1"}',
]
ENVOY = [
    "2025-02-03T08:00:01.500600Z\twarning\tenvoy config external/envoy/source/common/config/grpc_stream.h:152\t"
    "StreamAggregatedResources gRPC config stream closed: 14, no healthy upstream\tthread=15",
    "2025-02-03T08:00:01.600700Z\tdebug\tenvoy http\t[external/envoy/source/common/http/conn_manager_impl.cc:300] [C12] new stream",
    "[2025-02-03 08:00:01.700][15][warning][config] [source/common/config/grpc_stream.h:101] gRPC config stream closed: 14",
]
ZTUNNEL_OTHER = [
    "2025-02-03T08:00:01.800000Z\tinfo\txds::client:xds{id=1}\tStream established",
    '{"level":"info","time":"2025-02-03T08:00:01.900000Z","scope":"ztunnel::xds::client","message":"received response"}',
]


def _stream(fmt: str):
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    return reg, ex.add_stream("carts", fmt)


@pytest.mark.parametrize("fmt", ["istio_text", "envoy", "istio_json", "auto"])
def test_a_sidecars_own_lines_are_skipped_as_proxy_log(fmt: str) -> None:
    reg, s = _stream(fmt)
    access = {"envoy": ENVOY_DEFAULT}.get(fmt, ACCESS) if fmt != "istio_json" else json.dumps({
        "start_time": "2024-03-01T12:00:00.123Z", "method": "GET", "path": "/carts/1/items", "protocol": "HTTP/1.1",
        "response_code": 200, "response_flags": "-", "duration": 12, "authority": "carts:80",
        "upstream_cluster": "outbound|80||carts.sock-shop.svc.cluster.local"})
    st = s.feed([*PILOT_AGENT, access, *ENVOY])
    assert (st.lines, st.parsed, dict(st.rejected)) == (9, 1, {"proxy_log": 8})
    assert reg.get_sample_value("promreflex_mesh_parse_errors_total", {"workload": "carts", "reason": "proxy_log"}) == 8
    assert reg.get_sample_value("promreflex_mesh_lines_total", {"workload": "carts"}) == 9


@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_ztunnels_other_targets_are_skipped_as_proxy_log(fmt: str) -> None:
    _, s = _stream(fmt)
    st = s.feed(ZTUNNEL_OTHER)
    assert dict(st.rejected) == {"proxy_log": 2}


@pytest.mark.parametrize("line", [
    # a broken access line is a rejection, whatever it starts with
    '[2024-03-01T12:00:00.123Z] "GET /carts/1/items HTTP/1.1" 200 - via_upstream',
    "2024-03-01T12:00:00.123Z 200 GET /carts/1/items 12",  # a custom format's line, not its format
    "2024-03-01T12:00:00.123Z\tnotalevel\tads\tsomething",
    # ztunnel's access target is the access log itself: a broken access line, not its own log
    "2024-08-21T15:32:05.754291Z\tinfo\taccess\tconnection complete\tsrc.workload=\"x\"",
    '{"level":"info","time":"2024-08-21T15:32:05.754291Z","scope":"access","message":"connection complete"}',
    '{"level":"info","msg":"no time"}',
    '{"level":"info","time":"2024-08-21T15:32:05Z","scope":"ads","response_code":200}',
    # a JSON access log whose format renamed the status key, with level/time/msg keys of its own
    '{"level":"info","time":"2024-08-21T15:32:05Z","msg":"req","method":"GET","path":"/x","status":200}',
    '{"level":"info","time":' + "[" * 5000 + "]" * 5000 + "}",
    "[2024-03-01 12:00:00.000][15][loud][config] not a level",
])
def test_what_is_not_a_proxys_own_line(line: str) -> None:
    assert not proxy_log_line(line)
    for fmt in ("istio_text", "ztunnel", "istio_json"):
        _, s = _stream(fmt)
        st = s.feed([line])
        assert st.lines == 1 and "proxy_log" not in st.rejected, (fmt, st)


def test_proxy_log_exists_at_zero_for_every_log() -> None:
    reg = CollectorRegistry()
    ex = MeshExporter(registry=reg)
    for fmt in ("istio_text", "istio_json", "envoy", "ztunnel", "auto"):
        ex.add_stream(f"w-{fmt.replace('_', '-')}", fmt)
        assert reg.get_sample_value("promreflex_mesh_parse_errors_total",
                                    {"workload": f"w-{fmt.replace('_', '-')}", "reason": "proxy_log"}) == 0


# pilot-agent at start-up: "Effective config:" and the YAML that follows, one line each, no time
EFFECTIVE_CONFIG = [
    "2025-02-03T08:00:01.000900Z\tinfo\tEffective config: binaryPath: /usr/local/bin/envoy",
    "concurrency: 2",
    "configPath: ./etc/istio/proxy",
    "controlPlaneAuthPolicy: MUTUAL_TLS",
    "discoveryAddress: istiod.istio-system.svc:15012",
    "drainDuration: 45s",
    "proxyMetadata:",
    "  ISTIO_META_ENABLE_HBONE: \"true\"",
    "",
    "2025-02-03T08:00:01.001000Z\tinfo\tJWT policy is third-party-jwt",
]


def test_a_multi_line_message_of_the_proxy_is_skipped_whole() -> None:
    _, s = _stream("istio_text")
    st = s.feed([*EFFECTIVE_CONFIG, ACCESS])
    assert (st.parsed, dict(st.rejected)) == (1, {"proxy_log": 9, "empty": 1})


def test_a_broken_line_after_an_access_line_or_a_record_start_is_still_rejected() -> None:
    _, s = _stream("istio_text")
    # after an access line, a stray line is a rejection; after the proxy's own line, a line that
    # begins a record of its own (`[`, `{`, a time first) is judged by itself
    st = s.feed([ACCESS, "concurrency: 2", PILOT_AGENT[1], '[2024-03-01T12:00:00.123Z] "GET /broken',
                 PILOT_AGENT[1], "2024-03-01T12:00:00.123Z 200 GET /x"])
    assert (st.parsed, dict(st.rejected)) == (1, {"format_mismatch": 2, "proxy_log": 2, "truncated": 1}), st


@pytest.mark.parametrize("custom", [
    'GET /carts/1/items HTTP/1.1 200 12ms "carts:80"',  # %REQ(:METHOD)% first
    "10.0.0.5:40000 GET /carts/1/items 200",  # %DOWNSTREAM_REMOTE_ADDRESS% first
    "2024-03-01 12:00:00 GET /carts/1/items 200",  # %START_TIME(%Y-%m-%d %H:%M:%S)%
    "1709294400 GET /carts/1/items 200",  # %START_TIME(%s)%
])
def test_a_wrong_format_after_a_pilot_agent_line_is_still_rejected(custom: str) -> None:
    """An istio-proxy's stdout begins with pilot-agent's lines; a format the exporter was not
    told about must still be counted as rejected after them (else PromreflexMeshLogMostlyRejected,
    whose ratio leaves proxy_log out, could never fire for the fault it is for)."""
    for fmt in ("istio_text", "auto"):
        _, s = _stream(fmt)
        st = s.feed([PILOT_AGENT[1], *[custom] * 50])
        assert dict(st.rejected) == {"proxy_log": 1, "format_mismatch": 50}, (fmt, custom, st)


def test_a_continuation_is_capped() -> None:
    from exporters.mesh.formats import PROXY_LOG_CONTINUATION

    _, s = _stream("istio_text")
    st = s.feed([PILOT_AGENT[1], *["  key: value"] * (PROXY_LOG_CONTINUATION + 3)])
    assert dict(st.rejected) == {"proxy_log": PROXY_LOG_CONTINUATION + 1, "format_mismatch": 3}


def test_a_line_the_parser_fails_on_ends_the_proxys_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line whose parse raises a bug (counted ``bad_value``) is a line of its own: the
    YAML-shaped lines after it are not the proxy's message going on."""
    _, s = _stream("istio_text")
    parse = s.format.parse

    def buggy(text: str):
        if text == "BUG":
            raise RuntimeError("a parser's bug")
        return parse(text)

    monkeypatch.setattr(s.format, "parse", buggy)
    st = s.feed([PILOT_AGENT[1], "BUG", "  key: value"])
    assert dict(st.rejected) == {"proxy_log": 1, "bad_value": 1, "format_mismatch": 1}, st
