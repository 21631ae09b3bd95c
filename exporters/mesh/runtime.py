"""Take container-runtime wrappers off log lines, joining the pieces of split lines.

A sidecar's access log usually reaches disk through the container runtime, not as Envoy wrote it:

* CRI (containerd, CRI-O): ``2024-01-01T00:00:00.000000000Z stdout F <message>``; a message
  longer than the runtime's buffer is split into ``P`` (partial) pieces ended by an ``F`` piece.
* Docker json-file: ``{"log":"<message>\\n","stream":"stdout","time":"...","attrs":{...}}``;
  a piece whose ``log`` lacks the final newline continues in the next line.

* ``kubectl logs --timestamps``: ``2024-01-01T00:00:00.123456789Z <message>``, one RFC 3339
  timestamp and a space before the message (taken off once; a ztunnel line's own timestamp
  stays, its format reads it).
* Filebeat/Elastic Agent output: ``{"@timestamp":...,"message":"<message>",...}``, a JSON
  object whose ``message`` is the original line (recognised by ``message`` plus one of
  Beats' own keys: ``agent``, ``ecs``, ``input``, a ``log`` object, or Logstash's ``@version``,
  or by ``@timestamp`` with nothing but Beats metadata beside it (``drop_fields`` took the rest);
  not by ``@timestamp`` beside access-log fields: an access log written for Elasticsearch).
* Fluent Bit's records as its tail input with the CRI or Docker parser writes them (to a file,
  Elasticsearch, CloudWatch: AWS Container Insights): ``{"time":...,"stream":"stdout",
  "_p":"F","log":"<message>",...}`` (any key order, ``log`` first included; ``_p`` ``P``: a
  partial piece; ``{"log":"<raw runtime line>"}`` without a parser is unwrapped again), or with
  ``message`` and ``logtag`` for ``log`` and ``_p``; Vector's ``kubernetes_logs`` source:
  ``{"message":"<message>","source_type":"kubernetes_logs","stream":"stdout",...}``.
* ``kubectl logs --prefix``: ``[pod/<pod>/<container>] <message>``.

Lines without a wrapper pass through unchanged, so one reader handles a plain Envoy log file,
``/var/log/pods/.../istio-proxy/0.log`` and a Docker container log alike. Envoy writes access
logs to stdout; stderr messages (Envoy's own log) come out as rejections with reason
``other_stream``, so the count of lines read still adds up.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_CRI = re.compile(r"(\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:\d{2})) (stdout|stderr) ([A-Z](?::[A-Z]+)*) ?")
_DOCKER_PREFIX = '{"log":'
_KUBECTL_TS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}) (?=[\[{]|\d{4}-)")
RFC3339_PREFIX = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}) ")
# Keys only a Beats (or Logstash) event has: an access log written for Elasticsearch may itself
# have ``@timestamp`` and ``message`` (ECS style), so those two alone say nothing.
_BEATS_KEYS = ("agent", "ecs", "input", "@version")
# What else a Beats event may carry when its own keys were dropped (``drop_fields: [agent, ecs,
# input, log]`` is common): metadata, never an access log's fields.
_BEATS_METADATA = frozenset({"@timestamp", "@metadata", "message", "kubernetes", "host", "container", "stream",
                             "fields", "tags", "cloud", "orchestrator", "data_stream", "event", "service"})
_KUBECTL_PREFIX = re.compile(r"\[pod/[^/\]\s]+/[^\]\s]+\] ")
_STREAMS = ("stdout", "stderr")


@dataclass
class Unwrapped:
    """One logical log message, or why there is none (``reason``)."""

    text: str | None
    reason: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # runtime metadata (Docker attrs)


@dataclass
class _Pending:
    parts: list[str] = field(default_factory=list)
    size: int = 0
    overflow: bool = False

    def add(self, piece: str, limit: int) -> None:
        if self.overflow:
            return
        self.size += len(piece)
        if self.size > limit:
            self.overflow = True
            self.parts.clear()
        else:
            self.parts.append(piece)


class RuntimeUnwrapper:
    """Stateful per log file: ``push(line)`` returns the complete messages it finishes.

    ``max_bytes`` bounds a joined message (pieces beyond it are dropped and the message is
    rejected as ``too_long``), so a runaway writer cannot grow memory.
    """

    def __init__(self, max_bytes: int = 64 * 1024):
        self.max_bytes = max_bytes
        self._pending: dict[str, _Pending] = {}

    def push(self, line: str) -> list[Unwrapped]:
        """Unwrap one physical line; 0, 1 or 2 results (a dangling partial is flushed first)."""
        line = line.rstrip("\r\n")
        m = _CRI.match(line)
        if m is not None:
            msg = line[m.end() :]
            return self._piece(m.group(2), msg, final="P" not in m.group(3).split(":"), fields={})
        prefix = _KUBECTL_PREFIX.match(line)
        if prefix is not None:
            line = line[prefix.end():]
        ts = _KUBECTL_TS.match(line)
        if ts is not None:
            line = line[ts.end():]
        if line.startswith("{") and not line.startswith(_DOCKER_PREFIX) and '"stream"' in line:
            env = _collector_record(line)
            if env is not None:  # Fluent Bit, Vector: the runtime's own pieces, re-encoded
                stream, msg, final = env
                return self._piece(stream, msg, final=final, fields={})
        if line.startswith("{") and '"message"' in line:
            beats = _beats_message(line)
            if beats is not None:  # Filebeat's "log" input keeps a runtime wrapper inside
                return self.push(beats)
        if line.startswith(_DOCKER_PREFIX):
            try:
                obj = json.loads(line)
                msg = obj["log"]
                stream = obj.get("stream", "stdout")
                if not isinstance(msg, str) or not isinstance(stream, str):
                    raise TypeError("log and stream must be strings")
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                return [*self.flush(), Unwrapped(None, "bad_wrapper", {"detail": str(e)[:80]})]
            if "_p" in obj or "logtag" in obj:  # Fluent Bit's record with "log" first: its flag says
                tag = obj.get("_p", obj.get("logtag"))
                return self._piece(stream, msg.rstrip("\r\n"), final=tag != "P", fields={})
            if "stream" not in obj:  # a collector's record of the raw line (Fluent Bit's tail, no parser)
                return self.push(msg) if msg.strip() else [*self.flush(), Unwrapped(msg)]
            attrs = obj.get("attrs")
            fields = {k: v for k, v in attrs.items() if isinstance(v, str)} if isinstance(attrs, dict) else {}
            final = msg.endswith("\n")
            return self._piece(stream, msg.rstrip("\r\n") if final else msg, final=final, fields=fields)
        return [*self.flush(), Unwrapped(line)]

    def flush(self) -> list[Unwrapped]:
        """End every unfinished split message (its final piece never came): ``truncated``."""
        out = []
        for stream, pend in list(self._pending.items()):
            del self._pending[stream]
            if stream == "stdout":
                out.append(Unwrapped(None, "too_long" if pend.overflow else "truncated"))
        return out

    def _piece(self, stream: str, msg: str, *, final: bool, fields: dict[str, Any]) -> list[Unwrapped]:
        pend = self._pending.get(stream)
        if not final:
            if pend is None:
                pend = self._pending[stream] = _Pending()
            pend.add(msg, self.max_bytes)
            return []
        if pend is not None:
            del self._pending[stream]
            pend.add(msg, self.max_bytes)
            if stream != "stdout":
                return [Unwrapped(None, "other_stream", fields)]
            if pend.overflow:
                return [Unwrapped(None, "too_long", fields)]
            return [Unwrapped("".join(pend.parts), None, fields)]
        if stream != "stdout":
            return [Unwrapped(None, "other_stream", fields)]
        if len(msg) > self.max_bytes:
            return [Unwrapped(None, "too_long", fields)]
        return [Unwrapped(msg, None, fields)]


def _collector_record(line: str) -> tuple[str, str, bool] | None:
    """(stream, message, final) of a log collector's record of one runtime line (Fluent Bit's
    ``log``/``_p`` or ``message``/``logtag``, Vector's ``kubernetes_logs``), or None when
    ``line`` is not one (an Istio JSON access line has no ``stream``)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("stream") not in _STREAMS:
        return None
    if isinstance(obj.get("log"), str):  # Fluent Bit's _p; fluentd's CRI parser's logtag
        msg, tag = obj["log"], obj.get("_p", obj.get("logtag"))
    elif isinstance(obj.get("message"), str) and ("logtag" in obj or obj.get("source_type") == "kubernetes_logs"):
        msg, tag = obj["message"], obj.get("logtag")
    else:
        return None
    return obj["stream"], msg.rstrip("\r\n"), tag != "P"


def _beats_message(line: str) -> str | None:
    """The original line inside a Filebeat event, or None when ``line`` is not one."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("message"), str):
        return None
    beats = (any(k in obj for k in _BEATS_KEYS) or isinstance(obj.get("log"), dict)  # Filebeat's log.file.path
             or ("@timestamp" in obj and obj.keys() <= _BEATS_METADATA))
    return obj["message"] if beats else None


def wrap_cri(message: str, timestamp: str, stream: str = "stdout", max_piece: int | None = None) -> list[str]:
    """CRI log lines for ``message`` (split into ``P`` pieces past ``max_piece`` characters).

    The inverse of :class:`RuntimeUnwrapper` for CRI; used to write test and simulation logs
    the way a kubelet's runtime stores them.
    """
    if max_piece is None or len(message) <= max_piece:
        return [f"{timestamp} {stream} F {message}"]
    pieces = [message[i : i + max_piece] for i in range(0, len(message), max_piece)]
    return [f"{timestamp} {stream} {'F' if i == len(pieces) - 1 else 'P'} {p}" for i, p in enumerate(pieces)]


def wrap_docker(message: str, timestamp: str, stream: str = "stdout", attrs: dict[str, str] | None = None) -> str:
    """One Docker json-file line for ``message``."""
    obj: dict[str, Any] = {"log": message + "\n", "stream": stream}
    if attrs:
        obj["attrs"] = attrs
    obj["time"] = timestamp
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


__all__ = ["RuntimeUnwrapper", "Unwrapped", "wrap_cri", "wrap_docker"]
