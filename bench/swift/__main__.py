"""``python -m bench.swift [sweep|sample] ...``: see :mod:`bench.swift.run` and :mod:`bench.swift.sample`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from promreflex.errors import UserError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sample":
        from bench.swift.sample import capture_set
        from exporters.swift.lab import SwiftLab

        p = argparse.ArgumentParser(prog="python -m bench.swift sample")
        p.add_argument("--lab.dir", dest="lab_dir", type=Path, default=None)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--repeat", type=int, default=3)
        p.add_argument("--delay-node", dest="delay_node", default=None, help="a storage node to slow down (s1..)")
        p.add_argument("--delay-ms", dest="delay_ms", type=float, default=100.0)
        p.add_argument("--shape-node", dest="shape_node", default=None, help="a node whose incoming link to shape")
        p.add_argument("--shape-rate", dest="shape_rate", default="20mbit", help="tbf rate (default 20mbit)")
        args = p.parse_args(argv[1:])
        try:
            delay = (args.delay_node, args.delay_ms) if args.delay_node else None
            shape = (args.shape_node, args.shape_rate) if args.shape_node else None
            summary = capture_set(SwiftLab.attach(args.lab_dir), args.out, repeat=args.repeat, delay=delay,
                                  shape=shape)
        except UserError as e:
            print(f"bench.swift: {e}", file=sys.stderr)
            return 1
        print(json.dumps(summary["captures"], indent=1))
        return 0 if summary["ok"] else 1
    from bench.swift.run import main as sweep_main

    return sweep_main(argv[1:] if argv and argv[0] == "sweep" else argv)


if __name__ == "__main__":
    sys.exit(main())
