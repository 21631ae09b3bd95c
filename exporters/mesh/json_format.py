"""Istio's JSON access-log encoding: one JSON object per line, each key bound to one operator.

Istio's ``accessLogEncoding: JSON`` writes Envoy's *format dictionary*: a key per field whose
value is an operator (``"duration": "%DURATION%"``). Parsing goes through the same
:class:`~exporters.mesh.envoy_format.Operator` converters as the text format, so a JSON line
and a text line of one request give the same record (same keys, same types), whether the
writer emitted numbers (``"duration": 4``) or strings (``"duration": "4"``, as a TEXT format
that merely looks like JSON does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from exporters.mesh.envoy_format import Operator, ParseError, format_start_time, parse_operator

# Istio's default (pilot/pkg/model/telemetry_logging.go, EnvoyJSONLogFormatIstio), in the
# order istio.io documents it.
ISTIO_JSON_FORMAT: dict[str, str] = {
    "start_time": "%START_TIME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration": "%DURATION%",
    "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%",
    "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "authority": "%REQ(:AUTHORITY)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%",
    "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "route_name": "%ROUTE_NAME%",
}

# Keys mesh owners commonly add to the default (gRPC status, retries, timings); understood
# when present, never written by default.
ISTIO_JSON_EXTRA_FIELDS: dict[str, str] = {
    "grpc_status": "%GRPC_STATUS%",
    "upstream_request_attempt_count": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "request_duration": "%REQUEST_DURATION%",
    "response_duration": "%RESPONSE_DURATION%",
    "response_tx_duration": "%RESPONSE_TX_DURATION%",
    "istio_policy_status": "%DYNAMIC_METADATA(istio.mixer:status)%",
    # Envoy Gateway's default JSON (gateway.envoyproxy.io, "Proxy Access Logs") keys the headers
    # by their own names: without these its every request went to destination "unknown"
    ":authority": "%REQ(:AUTHORITY)%",
    "x-envoy-upstream-service-time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x-envoy-origin-path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "user-agent": "%REQ(USER-AGENT)%",
    "x-request-id": "%REQ(X-REQUEST-ID)%",
    "x-forwarded-for": "%REQ(X-FORWARDED-FOR)%",
}

_SCALAR = (str, int, float, bool, type(None))

# Record keys that operators produce, with types the collector relies on: a line's key that the
# format does not name may not fill one of them with an untyped raw value (a string
# "response_code" then reached the status class and the exporter died on it).
_TYPED_KEYS = frozenset(
    op.key for op in (parse_operator(v) for v in {**ISTIO_JSON_FORMAT, **ISTIO_JSON_EXTRA_FIELDS}.values())
    if op is not None and op.kind != "str"
)


def load_object(line: str) -> dict[str, Any]:
    """The JSON object one log line holds; :class:`ParseError` ``truncated`` for a proper prefix
    of an object, ``invalid_json`` for anything else that is not one (nested too deeply too)."""
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ParseError("invalid_json", "nested too deeply") from None
    except ValueError as e:
        pos, msg = getattr(e, "pos", 0), getattr(e, "msg", "")
        ended_early = pos >= len(line.rstrip()) or msg.startswith("Unterminated string")
        if line.lstrip().startswith("{") and ended_early:
            raise ParseError("truncated", "JSON object ends early") from None
        raise ParseError("invalid_json", str(e)[:80]) from None
    if not isinstance(obj, dict):
        raise ParseError("invalid_json", f"a JSON {type(obj).__name__}, not an object")
    return obj


class JsonFormat:
    """Parser and writer for one JSON format dictionary (key -> operator string).

    Keys whose value is not a single operator are kept as raw strings under their own key.
    Keys of a line that the dictionary does not name (``workload``, say) are kept when they are
    scalars and do not shadow a parsed field. ``required`` names record keys a line must carry.
    """

    def __init__(
        self,
        fields: Mapping[str, str] = ISTIO_JSON_FORMAT,
        extra_fields: Mapping[str, str] | None = None,
        required: tuple[str, ...] = ("response_code",),
    ):
        self.fields = dict(fields)
        self.ops: dict[str, Operator | None] = {k: parse_operator(v) for k, v in self.fields.items()}
        for k, v in (extra_fields or {}).items():
            self.ops.setdefault(k, parse_operator(v))
        self.required = required
        self._typed = _TYPED_KEYS | {op.key for op in self.ops.values() if op is not None and op.kind != "str"}

    def parse(self, line: str) -> dict[str, Any]:
        """Typed record for one JSON line; raises :class:`ParseError` (never anything else)."""
        return self.parse_object(load_object(line))

    def parse_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Typed record for one line's JSON object (as :func:`load_object` returns it)."""
        record: dict[str, Any] = {}
        extras: dict[str, Any] = {}
        for key, value in obj.items():
            op = self.ops.get(key)
            if op is None:
                if isinstance(value, _SCALAR) and key not in self._typed:
                    extras[key] = value
                continue
            try:
                record[op.key] = op.convert(value)
            except ValueError as e:
                raise ParseError("bad_value", str(e)) from None
        for key, value in extras.items():
            record.setdefault(key, value)
        missing = [k for k in self.required if k not in record]
        if missing:
            raise ParseError("missing_field", ", ".join(missing))
        return record

    def format(self, record: Mapping[str, Any]) -> str:
        """One compact JSON line the way Envoy's JSON formatter writes it.

        Integers are numbers, missing values ``null`` (``-`` for response flags, as Envoy),
        header values strings.
        """
        out: dict[str, Any] = {}
        for key in self.fields:
            op = self.ops[key]
            out[key] = _json_value(op, record.get(op.key if op else key))
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _json_value(op: Operator | None, value: Any) -> Any:
    if op is None:
        return "-" if value is None else str(value)
    if op.kind == "flags":
        return op.render(value)
    if value is None:
        return None
    if op.kind == "int":
        return int(value)
    if isinstance(value, datetime):
        return format_start_time(value)
    return op.render(value)


ISTIO_JSON = JsonFormat(ISTIO_JSON_FORMAT, ISTIO_JSON_EXTRA_FIELDS)

__all__ = ["ISTIO_JSON", "ISTIO_JSON_EXTRA_FIELDS", "ISTIO_JSON_FORMAT", "JsonFormat", "load_object"]
