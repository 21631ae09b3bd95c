"""Istio ambient's ztunnel access logs: one L4 connection per line.

ztunnel (Rust, ``tracing``) writes, per connection it proxied::

    2024-08-21T15:32:05.754291Z info access connection complete src.addr=10.42.0.9:33772
      src.workload="curl-7656cf8794-6lsm4" src.namespace="default" src.identity="spiffe://cluster.local/ns/default/sa/curl"
      dst.addr=10.42.0.5:15008 dst.hbone_addr=10.42.0.5:9080 dst.service="details.default.svc.cluster.local"
      dst.workload="details-v1-857849f66-ft8wx" dst.namespace="default" dst.identity="spiffe://cluster.local/ns/default/sa/bookinfo-details"
      direction="outbound" bytes_sent=84 bytes_recv=358 duration="15ms"

(one line; istio.io, "Troubleshoot connectivity issues with ztunnel"). A failed connection is
logged at ``error`` or ``warn`` with an ``error="..."`` field. Only ``connection complete`` lines
and those failed forms are records: with access-log debugging on, ztunnel also writes
``debug access connection opened ...`` for every connection (istio/ztunnel
``src/proxy/metrics.rs``), whose ``connection complete`` line follows; such a line (any other
message that is not a failure) is skipped, counted under the reason ``not_a_record`` (not a
rejection of the log's format). The record this parser returns carries ``l4`` so the edge and
status rules treat it as a connection, not an HTTP request:

- the destination is ``dst.service`` (a mesh hostname), else the pod in ``dst.workload``, else
  ``external`` for an outbound connection that left the mesh (only ``dst.addr``);
- the source is the pod in ``src.workload`` (its workload name), on both sides (an inbound line
  names it too, so reading both ztunnels counts a connection once per side, as one edge); an
  inbound line without it, the caller's service account from ``src.identity`` (as for a
  sidecar's inbound record);
- the status is ``none`` (no answer) when the connection failed, else ``tcp``; its duration is
  the connection's lifetime, not a request's latency, so it is not put into the request
  duration histogram.

With ``LOG_FORMAT=json`` (Helm ``logAsJson``) ztunnel writes the same events as one JSON object
a line (istio/ztunnel ``src/telemetry.rs``, ``IstioJsonFormat``)::

    {"level":"info","time":"2024-08-21T15:32:05.754291Z","scope":"access","message":"connection complete",
     "src.addr":"10.42.0.9:33772","src.workload":"curl-7656cf8794-6lsm4",...,"direction":"outbound",
     "bytes_sent":84,"bytes_recv":358,"duration":"15ms"}

(one line): the level in lower case, the tracing target as ``scope`` (not shortened: other lines
say ``ztunnel::xds::client``), the message, then the event's fields under their dotted names,
addresses and names as strings, byte counts as numbers, a field without a value left out;
fields of enclosing spans come as objects under each span's name (the access events have no
span). Earlier ztunnels wrote tracing-subscriber's own JSON: ``timestamp``, ``level`` in upper
case, ``target``, the fields flattened. Both are read, by :meth:`ZtunnelFormat.parse` (a line
that starts with ``{``) and by ``auto`` (an object whose ``level`` is a tracing level and that
names a ``scope`` or ``target``, and has no ``response_code``, is ztunnel's), into the record
the text line of the same event gives. A ztunnel line that is not an access line is a
``format_mismatch`` of this format in either form (the exporter then skips it as ztunnel's own
log, ``proxy_log``: exporters.mesh.formats.proxy_log_line); a JSON value of a type ztunnel does not write (a boolean,
a list, an object where a field is a string or a number) is ``bad_value``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporters.mesh.envoy_format import ParseError
from exporters.mesh.json_format import load_object

TIMESTAMP = r"\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:?\d{2})"
_HEAD = re.compile(rf"^(?:{TIMESTAMP}\s+){{0,2}}(?P<level>trace|debug|info|warn|error)\s+access\s+(?P<message>[^=]*?)\s+(?=[\w.]+=)")
_PAIR = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|[^\s"]+)\s*')
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s)$")
_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0}
COMPLETE = "connection complete"
LEVELS = frozenset({"trace", "debug", "info", "warn", "error"})
# The fields a record is made of, as ztunnel names them (text keys and JSON keys alike).
FIELDS = ("src.addr", "src.workload", "src.identity", "dst.addr", "dst.service", "dst.workload",
          "direction", "bytes_sent", "bytes_recv", "duration", "error")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _duration_ms(value: str | None) -> int | None:
    m = _DURATION.match(value or "")
    return None if m is None else round(float(m.group(1)) * _UNITS_MS[m.group(2)])


def _record(level: str, message: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """The record of an access event: its level, message and fields (values as text)."""
    if "src.addr" not in fields and "dst.addr" not in fields:
        raise ParseError("missing_field", "src.addr / dst.addr")
    failed = "error" in fields or level in ("warn", "error")
    kind = message.strip().lower()
    if kind != COMPLETE and not failed:
        # "connection opened" (DEBUG): the same connection's "connection complete" follows
        raise ParseError("not_a_record", f"{kind or 'no message'!r} is not a finished connection")
    return {
        "l4": True,
        "level": level,
        "message": message,
        "direction": fields.get("direction"),
        "src_workload": fields.get("src.workload"),
        "src_identity": fields.get("src.identity"),
        "dst_service": fields.get("dst.service"),
        "dst_workload": fields.get("dst.workload"),
        "dst_addr": fields.get("dst.addr"),
        "bytes_sent": _int(fields.get("bytes_sent")),
        "bytes_received": _int(fields.get("bytes_recv")),
        "connection_duration": _duration_ms(fields.get("duration")),
        "error": fields.get("error") if failed else None,
        "failed": failed,
    }


class ZtunnelFormat:
    """Parser (and writer, for tests and simulations) of ztunnel's access lines, text or JSON."""

    def parse(self, line: str) -> dict[str, Any]:
        """The record of one access line, text or JSON; raises :class:`ParseError` only."""
        if line.lstrip().startswith("{"):
            return self.parse_object(load_object(line))
        head = _HEAD.match(line)
        if head is None:
            raise ParseError("format_mismatch", "not a ztunnel access line")
        fields: dict[str, str] = {}
        pos = head.end()
        while pos < len(line):
            m = _PAIR.match(line, pos)
            if m is None:
                if line[pos:].count('"') % 2 == 1:
                    raise ParseError("truncated", "a quoted value never ends")
                raise ParseError("format_mismatch", f"not key=value at {line[pos:pos + 20]!r}")
            fields[m.group(1)] = _unquote(m.group(2))
            pos = m.end()
        return _record(head.group("level"), head.group("message"), fields)

    @staticmethod
    def claims(obj: Mapping[str, Any]) -> bool:
        """Whether a line's JSON object is one of ztunnel's log lines (any target), so ``auto``
        leaves it to this format rather than to Istio's JSON."""
        level, target = obj.get("level"), obj.get("scope", obj.get("target"))
        return (isinstance(level, str) and level.lower() in LEVELS and isinstance(target, str)
                and "response_code" not in obj)

    def parse_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The record of a JSON line's object: the same as of the text line of the event."""
        if not self.claims(obj):
            raise ParseError("format_mismatch", "not a ztunnel JSON line")
        if obj.get("scope", obj.get("target")) != "access":
            raise ParseError("format_mismatch", "not a ztunnel access line")
        message = obj.get("message", "")
        if not isinstance(message, str):
            raise ParseError("bad_value", f"message: a JSON {type(message).__name__}")
        fields: dict[str, str] = {}
        for key in FIELDS:
            value = obj.get(key)
            if value is None:  # ztunnel leaves out a field it has no value for
                continue
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ParseError("bad_value", f"{key}: a JSON {type(value).__name__}")
            fields[key] = str(value)  # as the text line has it, so both give one record
        return _record(obj["level"].lower(), message, fields)

    def format(self, record: Mapping[str, Any]) -> str:
        """A line as ztunnel writes it (the fields this parser reads)."""
        level = "error" if record.get("failed") or record.get("error") else "info"
        parts = [f"2024-01-01T00:00:00.000000Z {level} access connection complete"]
        quoted = {
            "src.workload": record.get("src_workload"), "src.identity": record.get("src_identity"),
            "dst.service": record.get("dst_service"), "dst.workload": record.get("dst_workload"),
            "direction": record.get("direction"),
        }
        parts.append(f"src.addr=10.0.0.1:40000 dst.addr={record.get('dst_addr') or '10.0.0.2:15008'}")
        parts += [f'{k}="{v}"' for k, v in quoted.items() if v is not None]
        for key, name in (("bytes_sent", "bytes_sent"), ("bytes_received", "bytes_recv")):
            if record.get(key) is not None:
                parts.append(f"{name}={record[key]}")
        if record.get("connection_duration") is not None:
            parts.append(f'duration="{record["connection_duration"]}ms"')
        if record.get("error"):
            parts.append(f'error="{record["error"]}"')
        return " ".join(parts)


ZTUNNEL = ZtunnelFormat()

__all__ = ["ZTUNNEL", "ZtunnelFormat"]
