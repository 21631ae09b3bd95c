"""A small capture set from the running lab: fresh captures on every node, a verified PUT and
GET of 1 B, 1 KB and 1 MB objects (``repeat`` each) from the client namespace, then the captures,
the address -> role map and Swift's logs copied to ``out``.

``python -m bench.swift sample --out /work/notes/swift-captures`` (the lab must be up).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from exporters.swift.lab import AUTH_KEY, AUTH_USER, ROLES_FILE, SwiftLab

SIZES = (1, 1024, 1024 * 1024)


def capture_set(lab: SwiftLab, out: Path, repeat: int = 3, tag: str = "sample",
                delay: tuple[str, float] | None = None, shape: tuple[str, str] | None = None) -> dict[str, Any]:
    """Capture a PUT/GET run of every size in ``SIZES`` into ``out``; returns the run's summary.
    ``delay``: (storage node, milliseconds) added to that node's object PUTs and GETs meanwhile;
    ``shape``: (node, tbf rate such as ``20mbit``) on the bridge's port into that node meanwhile."""
    out.mkdir(parents=True, exist_ok=True)
    if shape:
        lab.shape_link(*shape)
    if delay:
        lab.set_object_delay(*delay)
        time.sleep(1.0)  # the middleware re-reads its file every 0.5 s
    logs_before = {p.name: p.stat().st_size for p in lab.log_dir.glob("*.log")}
    lab.start_captures(tag)
    time.sleep(0.2)
    started = time.time()
    text = lab.run_in_client(["-m", "exporters.swift.lab_client", "--auth", lab.auth_url, "--user", AUTH_USER,
                              "--key", AUTH_KEY, "roundtrip", "--container", f"{tag}-{int(started)}",
                              "--sizes", ",".join(map(str, SIZES)), "--repeat", str(repeat)],
                             timeout=300, what="the sample PUT/GET run")
    ended = time.time()
    time.sleep(0.5)  # let the last ACKs and FINs reach every capture
    lab.stop_captures()
    if delay:
        lab.set_object_delay(delay[0], 0)
    if shape:
        lab.shape_link(shape[0], None)
    result = json.loads(text.strip().splitlines()[-1])
    for node in lab.nodes:
        shutil.copyfile(lab.capture_path(tag, node.name), out / f"{node.name}.pcap")
    shutil.copyfile(lab.dir / ROLES_FILE, out / "roles.json")
    (out / "logs").mkdir(exist_ok=True)
    for log in sorted(lab.log_dir.glob("*.log")):
        if log.name.startswith("tcpdump-"):
            continue
        with open(log, "rb") as f:  # only the lines written during this run
            f.seek(logs_before.get(log.name, 0))
            (out / "logs" / log.name).write_bytes(f.read())
    summary = {"started": started, "ended": ended, "sizes": list(SIZES), "repeat": repeat, "ok": result.get("ok"),
               "injected_object_delay": {"node": delay[0], "ms": delay[1]} if delay else None,
               "injected_link_shaping": {"into_node": shape[0], "tbf_rate": shape[1]} if shape else None,
               "objects": result.get("objects", []),
               "captures": {n.name: {"file": f"{n.name}.pcap", "address": n.address, "role": n.role,
                                     "bytes": (out / f"{n.name}.pcap").stat().st_size} for n in lab.nodes}}
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    # Captures again on the lab's usual files, so the lab keeps recording after the sample.
    lab.start_captures("captures")
    return summary
