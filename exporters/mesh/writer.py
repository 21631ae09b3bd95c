"""Write access-log lines the way an Istio sidecar would, from records.

A simulated mesh (a Sock-Shop-like set of services on loopback) can log each request through
:class:`AccessLogWriter` with the very format object the exporter parses with, so what the
exporter reads is what Istio would have written: same field order, ``-`` for missing values,
``outbound|PORT||HOST`` cluster names, optionally wrapped by a container runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, Literal

from exporters.mesh.formats import get_format
from exporters.mesh.runtime import wrap_cri, wrap_docker

Runtime = Literal["cri", "docker"] | None


def outbound_cluster(service: str, namespace: str = "default", port: int = 80, subset: str = "") -> str:
    """Istio's cluster name for calls to ``service``: ``outbound|80||carts.sock-shop.svc.cluster.local``."""
    return f"outbound|{port}|{subset}|{service}.{namespace}.svc.cluster.local"


def inbound_cluster(port: int) -> str:
    """Istio's cluster name on the receiving sidecar: ``inbound|8080||``."""
    return f"inbound|{port}||"


def runtime_timestamp(now: datetime | None = None) -> str:
    """RFC 3339 with nanoseconds, as CRI and Docker write (``2024-01-01T00:00:00.000000000Z``)."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond * 1000:09d}Z"


class AccessLogWriter:
    """Append records to ``path`` as ``format`` lines (optionally in a runtime wrapper).

    ``line(record)`` only renders; ``write(record)`` appends and flushes, one ``write(2)`` per
    record, so a follower never sees half a record unless the writer is killed mid-line.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        format: str = "istio_text",
        format_string: str | None = None,
        *,
        json_format: Mapping[str, str] | None = None,
        runtime: Runtime = None,
        attrs: dict[str, str] | None = None,
    ):
        self.path = Path(path)
        self.format = get_format(format, format_string, json_format)
        self.runtime = runtime
        self.attrs = attrs
        self._fh = open(self.path, "a", encoding="utf-8")

    def line(self, record: Mapping[str, Any]) -> str:
        """The text appended for ``record`` (without the final newline)."""
        text = self.format.format(record)
        if self.runtime == "cri":
            return "\n".join(wrap_cri(text, runtime_timestamp()))
        if self.runtime == "docker":
            return wrap_docker(text, runtime_timestamp(), attrs=self.attrs)
        return text

    def write(self, record: Mapping[str, Any]) -> None:
        self._fh.write(self.line(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> AccessLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AccessLogWriter", "inbound_cluster", "outbound_cluster", "runtime_timestamp"]
