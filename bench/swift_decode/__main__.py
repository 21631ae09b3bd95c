"""The capture decoder against tshark, side by side in one run, in packets per CPU-second.

    flock /tmp/promreflex-heavy.lock uv run --frozen python -m bench.swift_decode          # ~3 min
    ... python -m bench.swift_decode --captures DIR    # an existing set: DIR/*.pcap + DIR/roles.json

The capture set: real Swift traffic. Without ``--captures`` the bench builds one with the lab
(``exporters.swift.lab``: client, proxy, 3 storage nodes in network namespaces, one tcpdump per
node, nanosecond stamps, snaplen 2048): a sequential PUT + GET round trip of objects of 1 B,
1 KiB and 64 KiB (``--objects`` per size) through the proxy, 3 replicas; then the lab is torn
down. The captures are kept under ``bench/results/swift_decode/raw/`` (git-ignored).

Each tool reads every capture of the set (N packets in all), each run a child process whose
CPU time (user + system, ``os.wait4``) includes its start-up:

* ``tshark``: ``tshark -n -r FILE -T fields -e frame.time_epoch -e ip.src -e ip.dst -e
  tcp.srcport -e tcp.dstport -e tcp.seq_raw -e tcp.ack_raw -e tcp.flags -e tcp.len``, once per
  file, the CPU of all files summed (what the issue measured: ~34k packets per CPU-second);
* ``tshark-lean``: the same with TCP sequence analysis and relative sequence numbers off
  (``-o tcp.analyze_sequence_numbers:FALSE -o tcp.relative_sequence_numbers:FALSE``): tshark's
  fastest honest setting for these fields, so the ratio is not inflated by work we skip;
* ``ours-match``: ``python -m bench.swift_decode.ours match``: decode every capture (the same
  fields) **and** match every segment across the captures (4-tuple, seq, ack, flags, length),
  with retransmission and offload handling;
* ``ours-full``: ``... ours full``: the whole analysis (``exporters.swift.analyze.analyze``:
  matching, clocks, HTTP exchanges, joins, node processing, phases, TCP events).

Before timing, the decoded fields are checked against tshark's (packet count, TCP packets, sum
of payload lengths, sum of raw sequence numbers per file). Runs are interleaved (one of each per
round, order rotated), ``--repeats`` rounds (3), medians reported; ours also reports the CPU of
its work alone (without the interpreter and numpy start-up, ``time.process_time``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.conditions import HostSampler, describe, run_child

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "swift_decode"
FIELDS = ("frame.time_epoch", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.seq_raw", "tcp.ack_raw",
          "tcp.flags", "tcp.len")
LEAN = ("-o", "tcp.analyze_sequence_numbers:FALSE", "-o", "tcp.relative_sequence_numbers:FALSE")


def tshark_argv(path: Path, lean: bool) -> list[str]:
    tshark = shutil.which("tshark") or "/usr/bin/tshark"
    argv = [tshark, "-n", "-r", str(path), "-T", "fields", "-E", "separator=,"]
    for f in FIELDS:
        argv += ["-e", f]
    return argv + (list(LEAN) if lean else [])


def _child(argv: list[str], stdout: Any = subprocess.DEVNULL) -> tuple[float, int, bytes]:
    """Run ``argv``; its CPU seconds (user + system, from wait4), exit status and stdout."""
    child = run_child(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=stdout)
    return child.cpu_s, child.returncode, child.stdout


def make_captures(dest: Path, objects: int) -> Path:
    """Build the lab, capture a round-trip workload, tear the lab down; the capture set's dir."""
    from exporters.swift.lab import AUTH_KEY, AUTH_USER, LabConfig, SwiftLab

    lab = SwiftLab(LabConfig(lab_dir=RESULTS / "raw" / "lab", subnet="10.200.61.0/24"))
    print("  building the Swift lab (namespaces, rings, servers) ...", flush=True)
    try:
        lab.up(verify=True)
        paths = lab.start_captures("decode")
        print(f"  capturing a PUT+GET workload ({objects} objects per size: 1 B, 1 KiB, 64 KiB) ...", flush=True)
        lab.run_in_client(["-m", "exporters.swift.lab_client", "--auth", lab.auth_url, "--user", AUTH_USER,
                           "--key", AUTH_KEY, "roundtrip", "--container", "decode", "--sizes", "1,1024,65536",
                           "--repeat", str(objects)], timeout=900, what="the capture workload")
        lab.stop_captures()
        dest.mkdir(parents=True, exist_ok=True)
        for node, p in paths.items():
            shutil.copyfile(p, dest / f"{node}.pcap")
        shutil.copyfile(lab.dir / "roles.json", dest / "roles.json")
    finally:
        print("  tearing the lab down ...", flush=True)
        lab.down()
    return dest


def check_fields(files: list[Path]) -> dict[str, Any]:
    """Our decode and tshark's, compared per file: packets, TCP packets, payload bytes, seq sum."""
    from exporters.swift.pcap import read_capture

    out = {}
    for f in files:
        _, rc, text = _child(tshark_argv(f, lean=True), stdout=None)
        if rc != 0:
            raise SystemExit(f"tshark failed on {f}")
        rows = [line.split(",") for line in text.decode().splitlines()]
        tcp = [r for r in rows if r[3]]
        ref = {"packets": len(rows), "tcp": len(tcp), "payload": sum(int(r[8] or 0) for r in tcp),
               "seq_sum": sum(int(r[5]) for r in tcp)}
        segs, stats = read_capture(f)
        ours = {"packets": stats.packets, "tcp": len(segs), "payload": int(segs.plen.sum()),
                "seq_sum": int(segs.seq.astype("int64").sum())}
        if ours != ref:
            raise SystemExit(f"decode differs from tshark on {f.name}: ours {ours}, tshark {ref}")
        out[f.name] = ref
    return out


def run(captures: Path, repeats: int, made_here: bool = True) -> dict[str, Any]:
    files = sorted(captures.glob("*.pcap"))
    if not files:
        raise SystemExit(f"no *.pcap in {captures}")
    print(f"checking our decode against tshark's on {len(files)} captures ...", flush=True)
    check = check_fields(files)
    packets = sum(v["packets"] for v in check.values())
    roles = captures / "roles.json"
    ours = [sys.executable, "-m", "bench.swift_decode.ours", "--roles", str(roles), *map(str, files)]
    tools: dict[str, Any] = {
        "tshark": lambda: [tshark_argv(f, lean=False) for f in files],
        "tshark-lean": lambda: [tshark_argv(f, lean=True) for f in files],
        "ours-match": lambda: [[*ours[:3], "match", *ours[3:]]],
        "ours-full": lambda: [[*ours[:3], "full", *ours[3:]]],
    }
    cpu: dict[str, list[float]] = {k: [] for k in tools}
    inner: dict[str, list[float]] = {k: [] for k in tools if k.startswith("ours")}
    names = list(tools)
    with HostSampler() as host:
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                total = 0.0
                for argv in tools[name]():
                    secs, rc, out = _child(argv, stdout=None if name.startswith("ours") else subprocess.DEVNULL)
                    if rc != 0:
                        raise SystemExit(f"{name} failed (exit {rc})")
                    total += secs
                    if name.startswith("ours"):
                        res = json.loads(out.decode().strip().splitlines()[-1])
                        if res["packets"] != packets:
                            raise SystemExit(f"{name} read {res['packets']} packets, tshark {packets}")
                        inner[name].append(res["cpu_seconds"])
                cpu[name].append(total)
                print(f"  round {r + 1}/{repeats}: {name:<12} {total:7.3f} CPU-s  "
                      f"{packets / total:>10,.0f} packets/CPU-s", flush=True)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    med_inner = {k: statistics.median(v) for k, v in inner.items()}
    rate = {k: packets / v for k, v in med.items()}
    summary = {
        "what": "capture decode (+ cross-capture match) vs tshark -T fields, packets per CPU-second",
        "command": "flock /tmp/promreflex-heavy.lock uv run --frozen python -m bench.swift_decode"
                   + ("" if made_here else f" --captures {captures.relative_to(REPO) if captures.is_relative_to(REPO) else captures}"),
        "captures_made_by": "this bench (lab: client, proxy, 3 storage nodes; sequential PUT+GET of 1 B, 1 KiB, 64 KiB)"
                            if made_here else "an earlier run of this bench (the same lab workload)",
        "captures": {f.name: check[f.name]["packets"] for f in files},
        "packets": packets,
        "repeats": repeats,
        "cpu_seconds_median": {k: round(v, 3) for k, v in med.items()},
        "packets_per_cpu_second": {k: round(v) for k, v in rate.items()},
        "ours_work_only_cpu_seconds": {k: round(v, 3) for k, v in med_inner.items()},
        "ours_work_only_packets_per_cpu_second": {k: round(packets / v) for k, v in med_inner.items()},
        "ratio_vs_tshark": {k: round(rate[k] / rate["tshark"], 1) for k in ("ours-match", "ours-full")},
        "ratio_vs_tshark_lean": {k: round(rate[k] / rate["tshark-lean"], 1) for k in ("ours-match", "ours-full")},
        "fields_checked": "per file: packets, TCP packets, payload bytes, sum of raw sequence numbers equal to tshark's",
        "conditions": host.summary(),
        "machine": {"python": platform.python_version(), "cores": os.cpu_count()},
        "tshark_version": subprocess.run([tshark_argv(files[0], False)[0], "--version"], capture_output=True,
                                         text=True).stdout.splitlines()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return summary


def write(summary: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    rows = ["| tool | CPU s (median) | packets / CPU-s | vs tshark | vs tshark-lean |", "|---|---|---|---|---|"]
    for k, secs in summary["cpu_seconds_median"].items():
        rate = summary["packets_per_cpu_second"][k]
        r1 = summary["ratio_vs_tshark"].get(k, "")
        r2 = summary["ratio_vs_tshark_lean"].get(k, "")
        rows.append(f"| {k} | {secs} | {rate:,} | {r1}{'x' if r1 else ''} | {r2}{'x' if r2 else ''} |")
    md = [f"# Swift capture decode vs tshark ({summary['date']})", "",
          f"{summary['packets']:,} packets in {len(summary['captures'])} captures "
          f"({', '.join(f'{k} {v:,}' for k, v in summary['captures'].items())}), "
          f"median of {summary['repeats']} interleaved rounds, whole-process CPU (start-up included).", "",
          *rows, "",
          f"Captures made by {summary.get('captures_made_by', 'this bench')}; our decoded fields equal "
          "tshark's in every file (packets, TCP packets, payload bytes, sum of raw sequence numbers).", "",
          "Our work alone (no interpreter/numpy start-up): "
          + ", ".join(f"{k} {v:,} packets/CPU-s" for k, v in summary["ours_work_only_packets_per_cpu_second"].items()),
          "", f"Conditions: {describe(summary['conditions'])}. {summary['tshark_version']}", "",
          f"Command: `{summary['command']}`", ""]
    (out / "summary.md").write_text("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        names = list(summary["packets_per_cpu_second"])
        vals = [summary["packets_per_cpu_second"][k] / 1000 for k in names]
        ax.barh(names, vals, color=["0.6", "0.45", "tab:blue", "tab:cyan"])
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:,.0f}k", va="center", fontsize=8)
        ax.set_xlabel("thousand packets per CPU-second (higher is better)")
        ax.set_title(f"{summary['packets']:,} packets of Swift traffic, 5 captures", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "speed.png", dpi=100)
        plt.close(fig)
    except ImportError:  # pragma: no cover - matplotlib is a runtime dependency
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.swift_decode", description=__doc__.splitlines()[0])
    p.add_argument("--captures", type=Path, default=None, help="an existing capture set (DIR/*.pcap, DIR/roles.json)")
    p.add_argument("--objects", type=int, default=400, help="objects per size when the bench makes the captures")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    captures = args.captures or make_captures(RESULTS / "raw" / "captures", args.objects)
    summary = run(captures, args.repeats, made_here=args.captures is None)
    write(summary, args.out)
    print()
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
