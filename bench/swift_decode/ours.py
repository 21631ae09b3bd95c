"""One timed run of our decoder for the bench (a child process, so its whole CPU is measured).

``python -m bench.swift_decode.ours --roles roles.json match|full FILE...``: ``match`` reads every
capture and matches the segments across them; ``full`` runs the whole analysis. Prints one JSON
line: packets read, segments matched, and the CPU seconds of the work alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from exporters.swift.match import direct, match
from exporters.swift.pcap import read_capture
from exporters.swift.roles import load_roles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--roles", type=Path, required=True)
    p.add_argument("mode", choices=["match", "full"])
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args(argv)
    roles = load_roles(mapping=args.roles)
    caps = {f.stem: f for f in args.files}
    t0 = time.process_time()
    if args.mode == "match":
        directed = []
        packets = 0
        for i, (node, path) in enumerate(caps.items()):
            segs, stats = read_capture(path)
            packets += stats.packets
            directed.append(direct(i, segs, set(roles.nodes[node].addresses)))
        matched = len(match(directed))
    else:
        from exporters.swift.analyze import analyze

        b = analyze(caps, roles)
        packets = sum(s.packets for s in b.read.values())
        matched = len(b.matches)
    cpu = time.process_time() - t0
    print(json.dumps({"packets": packets, "matched": matched, "cpu_seconds": round(cpu, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
