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
- the source of an ``outbound`` record is the pod in ``src.workload`` (its workload name); of
  an ``inbound`` one, the caller's service account from ``src.identity`` (as for a sidecar's
  inbound record, so reading both ztunnels counts a connection once per side);
- the status is ``none`` (no answer) when the connection failed, else ``tcp``; its duration is
  the connection's lifetime, not a request's latency, so it is not put into the request
  duration histogram.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporters.mesh.envoy_format import ParseError

_TS = r"\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:?\d{2})"
_HEAD = re.compile(rf"^(?:{_TS}\s+){{0,2}}(?P<level>trace|debug|info|warn|error)\s+access\s+(?P<message>[^=]*?)\s+(?=[\w.]+=)")
_PAIR = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|[^\s"]+)\s*')
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s)$")
_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0}
COMPLETE = "connection complete"


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


class ZtunnelFormat:
    """Parser (and writer, for tests and simulations) of ztunnel's access lines."""

    def parse(self, line: str) -> dict[str, Any]:
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
        if "src.addr" not in fields and "dst.addr" not in fields:
            raise ParseError("missing_field", "src.addr / dst.addr")
        failed = "error" in fields or head.group("level") in ("warn", "error")
        message = head.group("message").strip().lower()
        if message != COMPLETE and not failed:
            # "connection opened" (DEBUG): the same connection's "connection complete" follows
            raise ParseError("not_a_record", f"{message or 'no message'!r} is not a finished connection")
        return {
            "l4": True,
            "level": head.group("level"),
            "message": head.group("message"),
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
