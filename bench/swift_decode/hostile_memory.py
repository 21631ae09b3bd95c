"""Memory and time of ``swift-timing analyze`` on two hostile captures, side by side with an
earlier checkout if given:

    uv run --frozen python -m bench.swift_decode.hostile_memory            # ~1 min
    git worktree add /tmp/before-swift f565c69~1
    uv run --frozen python -m bench.swift_decode.hostile_memory --before /tmp/before-swift

The captures (written to a temporary folder, removed afterwards):

* ``zeros``: a pcap header (microseconds, Ethernet) and 100 MiB of zeros: 6,553,600 empty
  records, each too short for IP + TCP headers (counted as ``snaplen_headers``, never copied);
* ``acks``: 1,500,000 distinct 54-byte pure ACKs (Ethernet, IPv4, TCP; every one its own
  4-tuple and sequence number, 1 us apart): 105 MB, the most segments a byte of capture holds.

Each run is ``python -m promreflex swift-timing analyze --capture a=FILE --json /dev/null`` in a
child process (its own tree's code with ``--before``, this venv's interpreter); the child's peak
resident memory (``ru_maxrss`` from ``os.wait4``) and wall time are reported. Runs alternate
between the trees, ``--repeats`` rounds (1), medians. Results: ``--out``, a folder
(``bench/results/swift_decode/hostile-memory/``: ``summary.md`` and ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.conditions import run_child

ROOT = Path(__file__).resolve().parents[2]
ZEROS_BYTES = 100 << 20
ACKS = 1_500_000


def write_zeros(path: Path) -> int:
    with path.open("wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        block = b"\0" * (1 << 20)
        for _ in range(ZEROS_BYTES >> 20):
            f.write(block)
    return ZEROS_BYTES // 16


def write_acks(path: Path, n: int = ACKS) -> int:
    """``n`` pure ACKs from 10.0.0.1 to 10.0.0.2, each with its own source port and sequence
    number (IP checksums left 0: the decoder does not check them, nor does tcpdump write them
    right under checksum offload)."""
    eth = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    rec = struct.Struct("<IIII")
    ip = struct.Struct("!BBHHHBBH4s4s")
    tcp = struct.Struct("!HHIIBBHHH")
    src, dst = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    t0 = 1_700_000_000
    with path.open("wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        out = bytearray()
        for i in range(n):
            us = i  # 1 us apart
            out += rec.pack(t0 + us // 1_000_000, us % 1_000_000, 54, 54)
            out += eth
            out += ip.pack(0x45, 0, 40, i & 0xFFFF, 0x4000, 64, 6, 0, src, dst)
            out += tcp.pack(1024 + i % 60000, 6000, (i * 7919) & 0xFFFFFFFF, 1 + i // 60000, 5 << 4, 0x10, 512, 0, 0)
            if len(out) >= 1 << 22:
                f.write(out)
                out.clear()
        f.write(out)
    return n


def run_once(tree: Path, capture: Path) -> tuple[float, float, int]:
    """(peak RSS in MiB, wall seconds, exit code) of one analyze run from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "promreflex", "swift-timing", "analyze", "--capture", f"a={capture}", "--json", os.devnull]
    with tempfile.TemporaryFile() as errf:  # (a file, not a pipe: a chatty child cannot block on it)
        child = run_child(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=errf)
        errf.seek(0)
        err = errf.read().decode(errors="replace").strip()
    if child.returncode != 0:
        print(f"  {tree}: exit {child.returncode}: {err[-300:]}", file=sys.stderr)
    return child.maxrss_mib, child.wall_s, child.returncode


def _commit(tree: Path) -> str:
    """The tree's commit (short), with "+changes" when its files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=30).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.swift_decode.hostile_memory", description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="an earlier checkout to run beside this one")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "swift_decode" / "hostile-memory",
                   help="a folder for summary.md and summary.json")
    a = p.parse_args(argv)
    if a.before is not None and not (a.before / "exporters" / "swift").is_dir():
        p.error(f"--before {a.before}: no exporters/swift there (a checkout of this repository?)")
    trees = ([("before", a.before.resolve())] if a.before else []) + [("after", ROOT)]
    tmp = Path(tempfile.mkdtemp(prefix="promreflex-swift-mem-"))
    rows: list[dict] = []
    try:
        files = {"zeros": (tmp / "zeros.pcap", write_zeros), "acks": (tmp / "acks.pcap", write_acks)}
        for name, (path, make) in files.items():
            records = make(path)
            size = path.stat().st_size
            print(f"{name}: {records:,} records, {size / 1e6:.0f} MB", flush=True)
            runs: dict[str, list[tuple[float, float, int]]] = {label: [] for label, _ in trees}
            for r in range(a.repeats):
                order = trees if r % 2 == 0 else trees[::-1]
                for label, tree in order:
                    rss, wall, rc = run_once(tree, path)
                    runs[label].append((rss, wall, rc))
                    print(f"  round {r + 1} {label}: {rss:,.0f} MiB peak, {wall:.1f} s, exit {rc}", flush=True)
            for label, got in runs.items():
                rows.append({"capture": name, "records": records, "bytes": size, "tree": label,
                             "peak_mb": statistics.median(x[0] for x in got),
                             "wall_s": statistics.median(x[1] for x in got),
                             "exit": max(x[2] for x in got), "runs": len(got)})
            path.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commits = {label: _commit(tree) for label, tree in trees}
    load = os.getloadavg()[0]
    head = (f"swift-timing analyze on hostile captures, {when}; {platform.node() or 'host'}, {os.cpu_count()} cores, "
            f"load average {load:.1f}; medians of {a.repeats} run(s) per tree; command: "
            f"`uv run --frozen python -m bench.swift_decode.hostile_memory"
            f"{' --before ' + str(a.before) if a.before else ''}"
            f"{' --repeats ' + str(a.repeats) if a.repeats != 1 else ''}`; trees: "
            + ", ".join(f"{label} {commits[label]}" for label, _ in trees))
    lines = [head, "", "| capture | records | MB | tree | peak RSS MiB | wall s | exit |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['capture']} | {row['records']:,} | {row['bytes'] / 1e6:.0f} | {row['tree']} | "
                     f"{row['peak_mb']:,.0f} | {row['wall_s']:.1f} | {row['exit']} |")
    table = "\n".join(lines)
    print("\n" + table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.md").write_text(table + "\n")
    (a.out / "summary.json").write_text(json.dumps({"when": when, "load": load, "commits": commits, "rows": rows},
                                                     indent=1) + "\n")
    return 1 if any(row["exit"] != 0 for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
