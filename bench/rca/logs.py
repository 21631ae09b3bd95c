"""Read the simulated sidecars' logs back with the mesh exporter's own parsers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from exporters.mesh.formats import get_format


@dataclass(frozen=True)
class Record:
    start: float  # unix seconds
    duration_s: float
    inbound: bool
    destination: str | None  # the called service for outbound records
    code: int


def read_records(path: Path, fmt: str) -> list[Record]:
    parser = get_format(fmt)
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = parser.parse(line)
        except Exception:  # noqa: BLE001 - a torn last line while the writer runs; skip it
            continue
        start = r.get("start_time")
        if not isinstance(start, datetime) or r.get("duration") is None:
            continue
        cluster = str(r.get("upstream_cluster") or "")
        inbound = cluster.startswith("inbound|")
        dest = cluster.split("|")[3].split(".")[0] if cluster.startswith("outbound|") else None
        out.append(Record(start.timestamp(), int(r["duration"]) / 1000.0, inbound, dest, int(r.get("response_code") or 0)))
    return out


def inbound_durations(path: Path, fmt: str, t0: float, t1: float) -> list[float]:
    """Durations of the requests a service received that started within [t0, t1)."""
    return [r.duration_s for r in read_records(path, fmt) if r.inbound and t0 <= r.start < t1]
