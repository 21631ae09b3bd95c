"""The access-log exporter against mtail, side by side in one run, in lines per CPU-second.

    flock /tmp/promreflex-heavy.lock uv run python -m bench.accesslog      # ~2 min on 2 cores

One nginx log of 1,000,000 lines made from the corpus's real lines (``bench/accesslog/generate.py``:
fresh timestamps, re-drawn numeric path segments, `` rt=... urt="..."``; about 260 MB, written to
a temporary directory and removed afterwards) is read to its end by each of:

* ``mtail --one_shot`` with ``bench/accesslog/nginx_timed.mtail``: requests by status class,
  response bytes, unmatched lines, and the two latency histograms (same buckets as ours);
* the exporter end to end, counters only: ``python -m exporters.accesslog --backfill --log
  bench=LOG:nginx_combined`` (the timing fields are ignored trailing text);
* the exporter end to end with its two histograms: the same with ``:nginx_timed``;
* a bare Python loop of ``re.match`` with the ``nginx_timed`` regex over the file's lines: the
  floor for a pure-Python parser.

Each is a child process; its CPU time (user + system, from ``os.wait4``) includes start-up.
The runs are interleaved (one of each per round, the order rotated), ``--repeats`` rounds (3),
and the median is reported; every run's counts are checked (each tool must see every line).
mtail comes from Debian (``apt-get install -y --no-install-recommends mtail``); the bench
installs it itself when it runs as root with apt-get, and otherwise says how.
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
import tempfile
import time
from pathlib import Path

from bench.conditions import run_child
from bench.accesslog.generate import generate

REPO = Path(__file__).resolve().parents[2]
MTAIL_PROG = Path(__file__).with_name("nginx_timed.mtail")
RESULTS = REPO / "bench" / "results" / "accesslog" / "summary.json"

BARE_LOOP = """
import re, sys
match = re.compile({pattern!r}).match
n = 0
with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
    for line in f:
        if match(line.rstrip("\\n")):
            n += 1
print(n)
"""


def ensure_mtail() -> str:
    found = shutil.which("mtail")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("mtail not found: apt-get install -y --no-install-recommends mtail", flush=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "mtail"], check=True,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("mtail")
    if not found:
        raise SystemExit("mtail is needed: apt-get install -y --no-install-recommends mtail (Debian/Ubuntu), "
                         "or put an mtail binary on PATH")
    return found


def run(argv: list[str], out: Path, env: dict[str, str], cwd: Path = REPO) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process, start-up included."""
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        child = run_child(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    if child.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({child.returncode}): {out.with_suffix('.err').read_text()[-2000:]}")
    return child.cpu_s, child.wall_s


def _metric(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{") or ln.startswith(name + " "))


def check_counts(tool: str, out: Path, n_lines: int) -> None:
    text = out.read_text()
    got: float
    lines: float
    if tool == "bare_re_match":
        got = int(text.strip())
        lines = got
    elif tool == "mtail":
        got = _metric(text, "promreflex_http_requests_total")
        lines = got + _metric(text, "promreflex_accesslog_parse_errors_total")
    else:
        got = _metric(text, "promreflex_http_requests_total")
        lines = _metric(text, "promreflex_accesslog_lines_total")
    if lines != n_lines or got != n_lines:
        raise SystemExit(f"{tool}: saw {lines} lines, counted {got} requests; expected {n_lines} of each")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS, help="summary JSON (default: the committed one)")
    a = p.parse_args()

    mtail = ensure_mtail()
    mtail_version = subprocess.run([mtail, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    sys.path.insert(0, str(REPO))
    from exporters.accesslog.parse import build_parser

    pattern = build_parser("nginx_timed").regex.pattern
    with tempfile.TemporaryDirectory(prefix="promreflex-bench-accesslog-") as tmp:
        d = Path(tmp)
        log = d / "access.log"  # alone in its directory: the backfill finds no rotated sibling
        progs = d / "progs"
        progs.mkdir()
        shutil.copy(MTAIL_PROG, progs)
        t0 = time.perf_counter()
        gen = generate(log, a.lines)
        print(f"generated {gen['lines']} lines, {gen['bytes'] / 1e6:.0f} MB from {gen['corpus_lines']} corpus lines "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        (d / "bare.py").write_text(BARE_LOOP.format(pattern=pattern))
        exporter = [sys.executable, "-m", "exporters.accesslog", "--backfill", "--state.dir", str(d / "state")]
        tools = {
            "mtail": [mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(progs),
                      "--logs", str(log), "--logtostderr"],
            "exporter_counters": [*exporter, "--log", f"bench={log}:nginx_combined"],
            "exporter_histograms": [*exporter, "--log", f"bench={log}:nginx_timed"],
            "bare_re_match": [sys.executable, str(d / "bare.py"), str(log)],
        }
        # Python children start as an installed exporter does: with its bytecode cached (here in
        # the temporary directory, so nothing is written into the checkout), warmed by one run
        # on a one-line log. Without a cache, every start compiles pydantic & co. (~0.3 CPU s more).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(d / "pycache")
        tiny = d / "warm" / "access.log"
        tiny.parent.mkdir()
        with open(log) as f:
            tiny.write_text(f.readline())
        for tool in ("exporter_histograms", "bare_re_match"):
            run([str(tiny) if x == str(log) else x.replace(str(log), str(tiny)) for x in tools[tool]],
                d / f"warm-{tool}.out", env)
        startup, _ = run([*exporter, "--log", f"bench={tiny}:nginx_timed"], d / "startup.out", env)
        cpu: dict[str, list[float]] = {t: [] for t in tools}
        wall: dict[str, list[float]] = {t: [] for t in tools}
        load_start = os.getloadavg()[0]
        names = list(tools)
        for r in range(a.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for tool in order:
                out = d / f"{tool}-{r}.out"
                c, w = run(tools[tool], out, env)
                check_counts(tool, out, a.lines)
                cpu[tool].append(c)
                wall[tool].append(w)
                print(f"round {r + 1}: {tool:20s} {c:6.2f} CPU s  {w:6.2f} wall s  {a.lines / c:>9,.0f} lines/CPU-s",
                      flush=True)
        load_end = os.getloadavg()[0]

    med = {t: statistics.median(v) for t, v in cpu.items()}
    rate = {t: round(a.lines / med[t]) for t in tools}
    ratio = {t: round(rate[t] / rate["mtail"], 2) for t in tools}
    summary = {
        "command": "flock /tmp/promreflex-heavy.lock uv run python -m bench.accesslog",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "lines": a.lines,
        "bytes": gen["bytes"],
        "repeats": a.repeats,
        "statistic": "median CPU seconds (user + system of the child, start-up included)",
        "lines_per_cpu_second": rate,
        "vs_mtail": ratio,
        "cpu_seconds": {t: [round(x, 3) for x in v] for t, v in cpu.items()},
        "wall_seconds_median": {t: round(statistics.median(v), 2) for t, v in wall.items()},
        "exporter_startup_cpu_seconds": round(startup, 3),
        "conditions": {
            "python": platform.python_version(),
            "mtail": mtail_version,
            "cpus": os.cpu_count(),
            "load_average_start_end": [round(load_start, 2), round(load_end, 2)],
            "machine": platform.machine(),
        },
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=2) + "\n")
    labels = {
        "mtail": "mtail one-shot, counters + 2 latency histograms",
        "exporter_counters": "exporter end to end, counters only (`nginx_combined`)",
        "exporter_histograms": "exporter end to end, with its 2 histograms (`nginx_timed`)",
        "bare_re_match": "bare Python `re.match` loop",
    }
    print(f"\n{a.lines:,} lines ({gen['bytes'] / 1e6:.0f} MB), median of {a.repeats}, CPU seconds incl. start-up; "
          f"load {load_start:.1f} -> {load_end:.1f}\n")
    print("| | lines per CPU-second | vs mtail |\n|---|---|---|")
    for t in tools:
        print(f"| {labels[t]} | {rate[t] / 1000:,.0f}k | {ratio[t]:.2f}x |")
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
