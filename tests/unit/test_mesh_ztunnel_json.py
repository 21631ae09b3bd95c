"""ztunnel's access log when ztunnel logs JSON (``LOG_FORMAT=json``, Helm ``logAsJson``).

The lines are modelled on ztunnel's own source (istio/ztunnel ``src/telemetry.rs``,
``IstioJsonFormat``; ``src/proxy/metrics.rs``, the ``access`` events) and on a line published
from a real cluster: one compact JSON object per line, ``level`` (lower case), ``time``,
``scope`` (the tracing target: ``access``), ``message``, then the event's fields under their
dotted names (``src.addr``). Addresses and names are strings, ``bytes_sent``/``bytes_recv``
numbers, ``duration`` a string (``"15ms"``); a field ztunnel has no value for is left out.
Events inside spans (not the access events, which have no parent) carry each span's fields
as an object under the span's name. The text form of the same event (ztunnel's default) is
``<time>\\t<level>\\t<target>\\t<message>\\t<k=v ...>``, strings quoted, addresses and numbers
not: :func:`text` writes it, :func:`as_json` the JSON form, so a test can compare the two.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporters.mesh.collector import MeshExporter
from exporters.mesh.envoy_format import ParseError
from exporters.mesh.formats import get_format
from exporters.mesh.json_format import ISTIO_JSON
from exporters.mesh.runtime import wrap_cri, wrap_docker
from exporters.mesh.ztunnel_format import ZTUNNEL

_UNQUOTED = {"src.addr", "dst.addr", "dst.hbone_addr", "bytes_sent", "bytes_recv"}  # Display / u64


def as_json(ev: dict[str, Any]) -> str:
    """The JSON line ztunnel writes for an event: level, time, scope, message, fields."""
    obj = {"level": ev["level"], "time": ev["time"], "scope": ev.get("scope", "access"), "message": ev["message"]}
    obj.update(ev["fields"])
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def text(ev: dict[str, Any]) -> str:
    """The same event in ztunnel's default text form."""
    pairs = " ".join(k + "=" + (str(v) if k in _UNQUOTED else json.dumps(v)) for k, v in ev["fields"].items())
    return f"{ev['time']}\t{ev['level']}\t{ev.get('scope', 'access')}\t{ev['message']}\t{pairs}"


def event(level: str, message: str, time: str = "2024-08-21T15:32:05.754291Z", **fields: Any) -> dict[str, Any]:
    return {"level": level, "time": time, "message": message, "fields": {k.replace("__", "."): v for k, v in fields.items()}}


# The connections of istio.io's published text lines (test_mesh_ambient.py), as events.
OUT = event(
    "info", "connection complete",
    src__addr="10.42.0.9:33772", src__workload="curl-7656cf8794-6lsm4", src__namespace="default",
    src__identity="spiffe://cluster.local/ns/default/sa/curl", dst__addr="10.42.0.5:15008",
    dst__hbone_addr="10.42.0.5:9080", dst__service="details.default.svc.cluster.local",
    dst__workload="details-v1-857849f66-ft8wx", dst__namespace="default",
    dst__identity="spiffe://cluster.local/ns/default/sa/bookinfo-details", direction="outbound",
    bytes_sent=84, bytes_recv=358, duration="15ms",
)
IN = event(
    "info", "connection complete", "2024-05-04T09:59:05.028709Z",
    src__addr="10.244.1.12:60059", src__workload="curl-7656cf8794-r7zb9", src__namespace="default",
    src__identity="spiffe://cluster.local/ns/default/sa/curl", dst__addr="10.244.1.10:9080",
    dst__hbone_addr="10.244.1.10:9080", dst__service="productpage.default.svc.cluster.local",
    dst__workload="productpage-v1-87d54dd59-fn6vw", dst__namespace="default",
    dst__identity="spiffe://cluster.local/ns/default/sa/bookinfo-productpage", direction="inbound",
    bytes_sent=175, bytes_recv=80, duration="1ms",
)
# A connection that ended in an error: ERROR, "connection complete", an "error" field.
DENIED = event(
    "error", "connection complete", "2026-09-30T06:45:59.689271Z",
    src__addr="198.18.4.182:46376", src__workload="attacker", src__namespace="attacker",
    dst__addr="198.18.0.40:80", dst__service="backend.backend.svc.cluster.local", dst__workload="backend",
    dst__namespace="backend", direction="outbound", bytes_sent=0, bytes_recv=0, duration="0ms",
    error="connection closed due to policy rejection",
)
# Refused before ztunnel knew the workloads (log_early_deny): WARN "connection failed".
EARLY_DENY = event(
    "warn", "connection failed", "2026-09-30T06:46:00.000100Z",
    src__addr="198.18.4.182:46380", dst__addr="198.18.0.40:80", direction="inbound",
    error="unknown source: 198.18.4.182",
)
EXTERNAL = event(
    "info", "connection complete", "2026-08-03T15:47:26.637407Z",
    src__addr="10.244.0.5:54646", src__workload="http-client-6b4b85489f-t6sl2", src__namespace="default",
    dst__addr="142.251.209.46:80", direction="outbound", bytes_sent=74, bytes_recv=773, duration="357ms",
)
# With access-log debugging on (RUST_LOG=access=debug): DEBUG "connection opened", no bytes.
OPENED = event(
    "debug", "connection opened", "2024-08-21T15:32:05.700000Z",
    src__addr="10.42.0.9:33772", src__workload="curl-7656cf8794-6lsm4", src__namespace="default",
    dst__addr="10.42.0.5:15008", dst__hbone_addr="10.42.0.5:9080",
    dst__service="details.default.svc.cluster.local", direction="outbound",
)
CONNECTIONS = {"outbound": OUT, "inbound": IN, "denied": DENIED, "early_deny": EARLY_DENY, "external": EXTERNAL}

# One line written out as ztunnel writes it (key order and types of a line published from a
# cluster running ztunnel with LOG_FORMAT=json).
LITERAL = (
    '{"level":"info","time":"2024-08-21T15:32:05.754291Z","scope":"access","message":"connection complete",'
    '"src.addr":"10.42.0.9:33772","src.workload":"curl-7656cf8794-6lsm4","src.namespace":"default",'
    '"src.identity":"spiffe://cluster.local/ns/default/sa/curl","dst.addr":"10.42.0.5:15008",'
    '"dst.hbone_addr":"10.42.0.5:9080","dst.service":"details.default.svc.cluster.local",'
    '"dst.workload":"details-v1-857849f66-ft8wx","dst.namespace":"default",'
    '"dst.identity":"spiffe://cluster.local/ns/default/sa/bookinfo-details","direction":"outbound",'
    '"bytes_sent":84,"bytes_recv":358,"duration":"15ms"}'
)

# Other ztunnel lines in the same log: xds, an event inside spans (their fields as objects).
XDS = ('{"level":"info","time":"2024-08-21T15:30:00.100200Z","scope":"ztunnel::xds::client",'
       '"message":"Stream established","xds":{"id":1}}')
POLICY = ('{"level":"info","time":"2024-08-21T15:32:05.800000Z","scope":"ztunnel::state",'
          '"message":"deny policy match","policy":"default/deny-all","proxy":{"wl":"default/details-v1"},'
          '"inbound":{"id":"4703222e84d01205aa1511f86681682f","peer":"10.42.0.9:46266"}}')
XDS_TEXT = "2024-08-21T15:30:00.100200Z\tinfo\txds::client:xds{id=1}\tStream established"
POLICY_TEXT = ('2024-08-21T15:32:05.800000Z\tinfo\tstate:proxy{wl="default/details-v1"}:inbound{peer=10.42.0.9:46266}'
               '\tdeny policy match\tpolicy="default/deny-all"')

# Istio's JSON access log (Envoy's), which `auto` reads as before.
ENVOY_JSON = json.dumps({
    "start_time": "2024-03-01T12:00:00.123Z", "method": "GET", "path": "/carts/1/items", "protocol": "HTTP/1.1",
    "response_code": 200, "response_flags": "-", "bytes_received": 0, "bytes_sent": 42, "duration": 12,
    "upstream_cluster": "outbound|80||carts.sock-shop.svc.cluster.local", "authority": "carts:80",
})


def stream(fmt: str, workload: str = "ztunnel"):
    reg = CollectorRegistry()
    return reg, MeshExporter(registry=reg).add_stream(workload, fmt)


def reason(parser: Any, line: str) -> str:
    try:
        parser.parse(line)
    except ParseError as e:
        return e.reason
    return "parsed"


def requests(reg: CollectorRegistry, **labels: str) -> float:
    return reg.get_sample_value("promreflex_mesh_requests_total", labels) or 0.0


def samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in reg.collect() for s in m.samples if not s.name.endswith("_created")}


@pytest.mark.parametrize("name", sorted(CONNECTIONS))
@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_a_json_line_is_the_same_record_as_its_text_line(fmt: str, name: str) -> None:
    ev = CONNECTIONS[name]
    parser = get_format(fmt)
    assert parser.parse(as_json(ev)) == parser.parse(text(ev)) == ZTUNNEL.parse(text(ev))


def test_the_literal_line_is_read_field_by_field() -> None:
    rec = ZTUNNEL.parse(LITERAL)
    assert rec == ZTUNNEL.parse(text(OUT)) == get_format("auto").parse(LITERAL)
    assert (rec["src_workload"], rec["dst_service"], rec["direction"]) == (
        "curl-7656cf8794-6lsm4", "details.default.svc.cluster.local", "outbound")
    assert (rec["bytes_sent"], rec["bytes_received"], rec["connection_duration"], rec["failed"]) == (84, 358, 15, False)


@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_json_and_text_logs_give_the_same_metrics(fmt: str) -> None:
    events = [OPENED, OUT, IN, DENIED, EARLY_DENY, EXTERNAL]
    reg_text, s_text = stream(fmt)
    reg_json, s_json = stream(fmt)
    st_text, st_json = s_text.feed([text(e) for e in events]), s_json.feed([as_json(e) for e in events])
    assert (st_json.lines, st_json.parsed, dict(st_json.rejected)) == (6, 5, {"not_a_record": 1})
    assert (st_text.lines, st_text.parsed, dict(st_text.rejected)) == (6, 5, {"not_a_record": 1})
    assert samples(reg_json) == samples(reg_text)
    assert requests(reg_json, source="curl", destination="details", code_class="tcp", response_flags="none") == 1
    assert requests(reg_json, source="curl", destination="productpage", code_class="tcp", response_flags="none") == 1
    assert requests(reg_json, source="attacker", destination="backend", code_class="none", response_flags="none") == 1
    assert requests(reg_json, source="unknown", destination="unknown", code_class="none", response_flags="none") == 1
    assert requests(reg_json, source="http-client", destination="external", code_class="tcp", response_flags="none") == 1


@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_json_lines_inside_runtime_wrappers(fmt: str) -> None:
    reg, s = stream(fmt)
    line = as_json(OUT)
    wrapped = [
        *wrap_cri(line, "2024-08-21T15:32:05.754400000Z"),
        *wrap_cri(as_json(IN), "2024-05-04T09:59:05.028800000Z", max_piece=100),  # P pieces, then F
        wrap_docker(as_json(DENIED), "2026-09-30T06:45:59.689300Z"),
        "2024-08-21T15:32:05.754300Z " + line,  # kubectl logs --timestamps
        json.dumps({"@timestamp": "2024-08-21T15:32:05.760Z", "message": line, "agent": {"type": "filebeat"}}),
        *wrap_cri(as_json(OPENED), "2024-08-21T15:32:05.700100000Z"),
    ]
    st = s.feed(wrapped)
    st.add(s.flush())
    assert (st.parsed, dict(st.rejected)) == (5, {"not_a_record": 1})
    assert requests(reg, source="curl", destination="details", code_class="tcp", response_flags="none") == 3
    assert requests(reg, source="curl", destination="productpage", code_class="tcp", response_flags="none") == 1
    assert requests(reg, source="attacker", destination="backend", code_class="none", response_flags="none") == 1


@pytest.mark.parametrize("fmt", ["ztunnel", "auto"])
def test_other_ztunnel_json_lines_are_rejected_as_their_text_lines_are(fmt: str) -> None:
    parser = get_format(fmt)
    for js, txt in ((XDS, XDS_TEXT), (POLICY, POLICY_TEXT), (as_json(OPENED), text(OPENED))):
        assert reason(parser, js) == reason(parser, txt) != "parsed"
    # ztunnel's lines of other targets (xds, policy) are its own log, skipped as proxy_log (not
    # rejections of the format: PromreflexMeshLogMostlyRejected leaves them out), JSON and text
    reg, s = stream(fmt)
    st = s.feed([XDS, POLICY, as_json(OPENED), as_json(OUT), XDS_TEXT, POLICY_TEXT])
    assert (st.parsed, dict(st.rejected)) == (1, {"proxy_log": 4, "not_a_record": 1})


def test_auto_tells_ztunnel_json_from_envoy_json() -> None:
    auto = get_format("auto")
    assert auto.parse(ENVOY_JSON) == ISTIO_JSON.parse(ENVOY_JSON)
    # an Envoy JSON log whose format adds keys like ztunnel's is still Envoy's
    extra = json.dumps({**json.loads(ENVOY_JSON), "level": "info", "scope": "access"})
    assert auto.parse(extra)["response_code"] == 200
    reg, s = stream("auto", workload="front-end")
    st = s.feed([ENVOY_JSON, as_json(OUT), ENVOY_JSON[:-5], as_json(OUT)[:-5]])
    assert (st.parsed, dict(st.rejected)) == (2, {"truncated": 2})
    assert requests(reg, source="front-end", destination="carts", code_class="2xx", response_flags="none") == 1
    assert requests(reg, source="curl", destination="details", code_class="tcp", response_flags="none") == 1


def _with(ev: dict[str, Any], **fields: Any) -> str:
    obj = json.loads(as_json(ev))
    for k, v in fields.items():
        if v is _DROP:
            obj.pop(k.replace("__", "."), None)
        else:
            obj[k.replace("__", ".")] = v
    return json.dumps(obj)


_DROP = object()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (as_json(OUT)[:120], "truncated"),
        (as_json(OUT)[:-1], "truncated"),
        ('{"level":"info","scope":"access",message:"connection complete"}', "invalid_json"),
        ('{"level":"info"} trailing', "invalid_json"),
        ('{"a":' + "[" * 20_000 + "]" * 20_000 + "}", "invalid_json"),
        (_with(OUT, src__addr=_DROP, dst__addr=_DROP), "missing_field"),
        (_with(OUT, bytes_sent=True), "bad_value"),
        (_with(OUT, bytes_recv=1.5), "bad_value"),
        (_with(OUT, src__workload={"name": "curl"}), "bad_value"),
        (_with(OUT, dst__service=["details"]), "bad_value"),
        (_with(OUT, message=7), "bad_value"),
        (_with(OUT, error=["x"]), "bad_value"),
        (_with(OUT, scope="ztunnel::proxy"), "proxy_log"),
        (_with(OPENED, level="DEBUG"), "not_a_record"),
        ('{"level":"info","time":"2024-08-21T15:32:05.754291Z","scope":"access"}', "missing_field"),
    ],
)
def test_hostile_json_lines_are_counted_rejections(line: str, reason: str) -> None:
    reg, s = stream("ztunnel")
    st = s.feed([line, as_json(OUT)])
    assert (st.lines, st.parsed, dict(st.rejected)) == (2, 1, {reason: 1})
    assert reg.get_sample_value("promreflex_mesh_parse_errors_total", {"workload": "ztunnel", "reason": reason}) == 1


def test_long_json_lines_are_read_or_too_long() -> None:
    reg, s = stream("ztunnel")
    long_error = _with(DENIED, error="x" * 60_000)
    st = s.feed([long_error, _with(DENIED, error="y" * 70_000), _with(OUT, src__workload='"\\' * 10_000)])
    assert (st.parsed, dict(st.rejected)) == (2, {"too_long": 1})
    assert ZTUNNEL.parse(long_error)["error"] == "x" * 60_000
    assert requests(reg, source="attacker", destination="backend", code_class="none", response_flags="none") == 1
    assert requests(reg, source="unknown", destination="details", code_class="tcp", response_flags="none") == 1


def test_tracing_default_json_layout_is_read_too() -> None:
    # tracing-subscriber's own JSON (flattened fields), which ztunnel's LOG_FORMAT=json wrote
    # before its Istio-style formatter: "timestamp", upper-case "level", "target".
    obj = {"timestamp": OUT["time"], "level": "INFO", "message": "connection complete", **OUT["fields"],
           "target": "access"}
    assert ZTUNNEL.parse(json.dumps(obj)) == ZTUNNEL.parse(text(OUT))
    failed = {**obj, "level": "ERROR", "error": "connection timed out"}
    assert ZTUNNEL.parse(json.dumps(failed))["failed"] is True
