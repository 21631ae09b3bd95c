"""A real Alertmanager (Debian's binary) on a free loopback port for integration tests: started
with ``config`` (a dict written as its YAML), no cluster, stopped when the block ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from promreflex.proc import Child, free_port, http_ok, wait_until

ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")


@contextmanager
def running_alertmanager(tmp_path: Path, config: dict[str, Any]) -> Iterator[str]:
    """Its URL while the block runs (its files and log under ``tmp_path``)."""
    port = free_port()
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    child = Child("alertmanager", [
        str(ALERTMANAGER), f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ], tmp_path / "alertmanager.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), timeout=30, what="alertmanager ready")
        yield url
    finally:
        child.stop()
