"""Configuration of the mesh exporter: which workload wrote which log, in which format.

Example (YAML)::

    listen_address: 127.0.0.1:9182
    namespaces: [sock-shop]
    logs:
      - workload: front-end
        path: /var/log/mesh/front-end.log          # Istio's default text format
      - workload: carts
        path: /var/log/pods/carts/istio-proxy/0.log  # CRI wrapper is detected per line
        format: istio_json
      - workload: orders
        path: /var/log/mesh/orders.log
        format: envoy
        format_string: '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%" %RESPONSE_CODE% flags=%RESPONSE_FLAGS%'

Every problem is reported at once, naming its key (``logs[2].format_string: ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from promreflex.config import Duration, ListenAddress, Strict, find_duplicates, load_model

from exporters.mesh.formats import get_format

DEFAULT_LISTEN_ADDRESS = "127.0.0.1:9182"
_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class LogSource(Strict):
    """One sidecar log: the workload whose sidecar writes it, where, and how.

    ``path`` may be a glob (``/var/log/pods/*_carts-*/istio-proxy/*.log``): every matching
    file is read, as the same workload (or the one ``workload_field`` names per record). The
    pattern is expanded when the exporter starts."""

    workload: str = Field(pattern=_DNS_LABEL, description="source label for its records (a DNS label)")
    path: Path
    format: Literal["istio_text", "istio_text_legacy", "istio_json", "envoy", "ztunnel", "auto"] = "istio_text"
    format_string: str | None = None
    json_format: dict[str, str] | None = None
    workload_field: str | None = Field(
        default=None, description="record key (JSON key, Docker attr) naming the writer; falls back to workload"
    )
    from_start: bool = Field(
        default=False, description="no saved position: read the existing content (True) or start at its end"
    )

    @model_validator(mode="after")
    def _format_compiles(self) -> LogSource:
        get_format(self.format, self.format_string, self.json_format)  # ValueError names the problem
        return self


class MeshExporterConfig(Strict):
    listen_address: ListenAddress = DEFAULT_LISTEN_ADDRESS
    logs: list[LogSource] = Field(min_length=1)
    namespaces: list[str] = Field(default_factory=list, description="k8s namespaces: name.NAMESPACE is a service")
    max_services: int = Field(default=200, gt=0)
    max_line_bytes: int = Field(default=64 * 1024, gt=0)
    poll_interval: Duration = 0.25
    state_dir: Path | None = Field(default=None, description="where read positions survive restarts")

    @model_validator(mode="after")
    def _unique(self) -> MeshExporterConfig:
        dupes = find_duplicates([str(s.path) for s in self.logs])
        if dupes:
            raise ValueError(f"each log path may be listed once: {', '.join(dupes)}")
        return self


def load_mesh_config(path: str | Path) -> MeshExporterConfig:
    """Load and validate the YAML file; raises :class:`ConfigError` listing every problem."""
    return load_model(path, MeshExporterConfig, "listen_address:, logs:")


__all__ = ["DEFAULT_LISTEN_ADDRESS", "LogSource", "MeshExporterConfig", "load_mesh_config"]
