"""Lines/s of the access-log exporter on the 10k-line Apache corpus, side by side in one run:
parse only; parse + count; with routes; follow a file + parse + count + save state; nginx_timed.

    uv run python bench/accesslog_throughput.py
"""

import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prometheus_client import CollectorRegistry
from exporters.accesslog.config import AccessLogConfig
from exporters.accesslog.exporter import AccessLogExporter
from exporters.accesslog.parse import build_parser

REPO = Path(__file__).resolve().parents[1]
SRC = (
    next(p for p in [REPO.parent / "shared" / "corpus", Path("/work/shared/corpus")] if p.is_dir())
    / "web-access-logs"
    / "apache"
    / "elastic-examples_apache_logs.log"
)
lines = SRC.read_text(errors="replace").splitlines()
REPS = 20


def best(f, n=5):
    return min(f() for _ in range(n))


def parse_only():
    p = build_parser("apache_combined")
    t = time.perf_counter()
    for _ in range(REPS):
        for ln in lines:
            p.parse(ln)
    return time.perf_counter() - t


def parse_count(fmt, routes):
    d = Path(tempfile.mkdtemp())
    log = d / "a.log"
    log.touch()
    src = {"site": "a", "path": str(log), "format": fmt}
    if routes:
        src["routes"] = [{"name": "images", "prefix": "/images"}, {"name": "blog", "regex": "/blog/.*"}]
    exp = AccessLogExporter(AccessLogConfig.model_validate({"logs": [src]}), registry=CollectorRegistry())
    site = exp.sites[0]
    t = time.perf_counter()
    for _ in range(REPS):
        site.handle(lines)
    dt = time.perf_counter() - t
    exp.close()
    shutil.rmtree(d)
    return dt


def follow_count():
    d = Path(tempfile.mkdtemp())
    log = d / "a.log"
    with open(log, "wb") as f:
        data = SRC.read_bytes()
        for _ in range(REPS):
            f.write(data)
    exp = AccessLogExporter(
        AccessLogConfig.model_validate(
            {
                "logs": [{"site": "a", "path": str(log), "format": "apache_combined"}],
                "from_start": True,
                "state_dir": str(d / "st"),
            }
        ),
        registry=CollectorRegistry(),
    )
    t = time.perf_counter()
    n = 0
    while True:
        k = exp.poll()
        n += k
        if k == 0:
            break
    dt = time.perf_counter() - t
    exp.close()
    shutil.rmtree(d)
    assert n == REPS * len(lines), n
    return dt


N = REPS * len(lines)
print(
    f"{N} lines per run (corpus x {REPS}), best of 5; python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
)
print(f"parse only (apache_combined):         {N / best(parse_only):>10,.0f} lines/s")
print(
    f"parse + count (apache_combined):      {N / best(lambda: parse_count('apache_combined', False)):>10,.0f} lines/s"
)
print(f"parse + count + routes:               {N / best(lambda: parse_count('apache_combined', True)):>10,.0f} lines/s")
print(f"follow file + parse + count + state:  {N / best(follow_count):>10,.0f} lines/s")
timed = [ln + ' rt=0.012 urt="0.010"' for ln in lines]


def timed_count():
    d = Path(tempfile.mkdtemp())
    log = d / "a.log"
    log.touch()
    exp = AccessLogExporter(
        AccessLogConfig.model_validate({"logs": [{"site": "a", "path": str(log), "format": "nginx_timed"}]}),
        registry=CollectorRegistry(),
    )
    site = exp.sites[0]
    t = time.perf_counter()
    for _ in range(REPS):
        site.handle(timed)
    dt = time.perf_counter() - t
    exp.close()
    shutil.rmtree(d)
    return dt


print(f"parse + count, nginx_timed (2 histograms): {N / best(timed_count):>10,.0f} lines/s")
