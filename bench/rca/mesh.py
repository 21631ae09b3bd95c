"""Run the Sock-Shop-like mesh on loopback: one process per service, plus the mesh exporter.

    with Mesh(workdir) as mesh:          # every service ready, exporter following their logs
        mesh.url("front-end")            # where the shop answers
        mesh.inject("carts", "latency", duration_s=30, delay_ms=300)
        mesh.clear("carts")

Each service is two real processes on free loopback ports, as a pod with Istio is two
containers: the application (:mod:`bench.rca.service`) and its sidecar proxy
(:mod:`bench.rca.sidecar`), which writes ``workdir/logs/<service>.log`` (Istio text or JSON, as
the topology says). The mesh exporter (``python -m exporters.mesh``) follows all the logs and
serves ``/metrics``.

``volume_iops``: give each application process its own volume with that many read and write
operations a second (a blkio throttle, :class:`bench.blkio.EmulatedDisk`), as a pod's
provisioned-IOPS volume; 0 or a host without the v1 blkio hierarchy leaves the raw disk
(:attr:`Mesh.volumes` says which).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.blkio import EmulatedDisk
from bench.rca.topology import NAMESPACE, SERVICES
from promreflex.proc import Child, free_port, http_ok, port_in_use, wait_until

REPO = Path(__file__).resolve().parents[2]


class MeshError(RuntimeError):
    pass


class Mesh:
    def __init__(self, workdir: Path, services: list[str] | None = None, *, exporter: bool = True,
                 log_format: str | None = None, python: str = sys.executable, volume_iops: float = 0.0):
        self.workdir = Path(workdir).resolve()
        self.services = list(services or SERVICES)
        missing = {d for s in self.services for d in SERVICES[s].dependencies()} - set(self.services)
        if missing:
            raise MeshError(f"services {sorted(missing)} are called but not part of the mesh")
        self.with_exporter = exporter
        self.log_format = log_format
        self.python = python
        self.children: dict[str, Child] = {}
        self.ports: dict[str, int] = {}
        self.app_ports: dict[str, int] = {}
        self.outbound_ports: dict[str, int] = {}
        self.exporter_port: int | None = None
        self.volume_iops = volume_iops
        self.volumes: dict[str, EmulatedDisk] = {}

    # ----------------------------------------------------------------- layout
    @property
    def mesh_file(self) -> Path:
        return self.workdir / "mesh.json"

    @property
    def edge_delays_file(self) -> Path:
        return self.workdir / "edge-delays.json"

    def log_path(self, service: str) -> Path:
        return self.workdir / "logs" / f"{service}.log"

    def log_format_of(self, service: str) -> str:
        return self.log_format or SERVICES[service].log_format

    def url(self, service: str) -> str:
        """The service's address in the mesh: its sidecar's inbound port."""
        return f"http://127.0.0.1:{self.ports[service]}"

    def app_url(self, service: str) -> str:
        """The application itself (/metrics, /fault), bypassing the sidecar."""
        return f"http://127.0.0.1:{self.app_ports[service]}"

    @property
    def exporter_url(self) -> str:
        return f"http://127.0.0.1:{self.exporter_port}"

    def targets(self) -> list[str]:
        """host:port of every service's /metrics."""
        return [f"127.0.0.1:{self.app_ports[s]}" for s in self.services]

    def pid(self, service: str) -> int:
        """The application process of ``service`` (not its sidecar)."""
        return self.children[service].pid

    def exporter_config(self) -> dict[str, Any]:
        return {
            "listen_address": f"127.0.0.1:{self.exporter_port}",
            "poll_interval": "100ms",
            "namespaces": [NAMESPACE],
            "logs": [{"workload": s, "path": str(self.log_path(s)), "format": self.log_format_of(s), "from_start": True}
                     for s in self.services],
        }

    # ----------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 60.0) -> Mesh:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.ports = {s: free_port() for s in self.services}
        self.app_ports = {s: free_port() for s in self.services}
        self.outbound_ports = {s: free_port() for s in self.services}
        self.exporter_port = free_port() if self.with_exporter else None
        self.edge_delays_file.write_text("{}")
        layout = {"namespace": NAMESPACE, "edge_delays_file": str(self.edge_delays_file), "services": {
            s: {"port": self.ports[s], "app_port": self.app_ports[s], "outbound_port": self.outbound_ports[s],
                "log": str(self.log_path(s)), "format": self.log_format_of(s),
                "data_dir": str(self.workdir / "data" / s)} for s in self.services}}
        self.mesh_file.write_text(json.dumps(layout, indent=2))
        for s in self.services:
            self.log_path(s).touch()
        try:
            for s in self.services:
                for module, name in (("bench.rca.service", s), ("bench.rca.sidecar", f"{s}-sidecar")):
                    self.children[name] = Child(
                        name, [self.python, "-m", module, "--mesh-file", str(self.mesh_file), "--name", s],
                        self.workdir / "procs" / f"{name}.out", cwd=REPO,
                    ).start()
            if self.volume_iops > 0 and EmulatedDisk.available():
                for s in self.services:
                    vol = EmulatedDisk(self.workdir, iops=self.volume_iops, name=f"promreflex-bench-rca-{os.getpid()}-{s}")
                    self.volumes[s] = vol.create()
                    vol.add(self.children[s].pid)
            if self.with_exporter:
                cfg = self.workdir / "mesh-exporter.yml"
                cfg.write_text(yaml.safe_dump(self.exporter_config(), sort_keys=False))
                self.children["mesh-exporter"] = Child(
                    "mesh-exporter", [self.python, "-m", "exporters.mesh", "--config.file", str(cfg)],
                    self.workdir / "procs" / "mesh-exporter.out", cwd=REPO,
                ).start()
            for name, child in self.children.items():
                if name == "mesh-exporter":
                    probe = partial(http_ok, self.exporter_url + "/metrics")
                elif name.endswith("-sidecar"):
                    s = name.removesuffix("-sidecar")
                    probe = partial(lambda a, b: port_in_use("127.0.0.1", a) and port_in_use("127.0.0.1", b),
                                    self.ports[s], self.outbound_ports[s])
                else:
                    probe = partial(http_ok, self.app_url(name) + "/-/ready")

                def ready(child=child, probe=probe) -> bool:
                    if not child.alive():
                        raise MeshError(f"{child.name} exited at start:\n{child.tail()}")
                    return probe()

                wait_until(ready, timeout=timeout, interval=0.05, what=f"{name} ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop(grace=5)
        for vol in self.volumes.values():
            vol.remove()
        self.volumes.clear()

    def __enter__(self) -> Mesh:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dead(self) -> list[str]:
        return [n for n, c in self.children.items() if not c.alive()]

    # ----------------------------------------------------------------- faults
    def _fault_request(self, service: str, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.app_url(service)}/fault", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
                return json.load(resp)
        except urllib.error.HTTPError as e:
            raise MeshError(f"{service} refused the fault: {e.read().decode(errors='replace')}") from e

    def inject(self, service: str, kind: str, duration_s: float = 60.0, **params: float) -> dict[str, Any]:
        return self._fault_request(service, "POST", {"kind": kind, "duration_s": duration_s, "params": params})

    def clear(self, service: str) -> dict[str, Any]:
        return self._fault_request(service, "DELETE")

    def delay_edge(self, caller: str, callee: str, delay_s: float) -> None:
        """Slow the link caller -> callee by ``delay_s`` (0 clears it): the caller's sidecar
        waits before forwarding, as a degraded network path would. Only the caller's side of
        the edge sees it; the callee's own records do not."""
        try:
            table = json.loads(self.edge_delays_file.read_text())
        except (OSError, ValueError):
            table = {}
        if delay_s > 0:
            table.setdefault(caller, {})[callee] = delay_s
        else:
            table.get(caller, {}).pop(callee, None)
        tmp = self.edge_delays_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        tmp.replace(self.edge_delays_file)

    def fault_status(self, service: str) -> dict[str, Any]:
        return self._fault_request(service, "GET")
