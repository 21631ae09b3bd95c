"""A large nginx log made of the corpus's real lines, for the throughput bench.

Every line is a real line of ``shared/corpus/web-access-logs`` (nginx ``combined`` and Apache
``combined``, 11,078 lines from three sites) cut to its ``combined`` part, with a fresh
timestamp (10 ms apart, in order), its numeric path segments re-drawn (so paths vary as on a
shop: ``/p/123`` -> ``/p/48213``) and the promreflex timing fields appended
(`` rt=$request_time urt="$upstream_response_time"``: log-normal around 30 ms, 20% of requests
served without an upstream, ``-``). Deterministic for a given seed.

    python -m bench.accesslog.generate OUT.log --lines 1000000
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path

from tests.corpus import ENV, corpus

COMBINED = re.compile(
    r'(?P<addr>\S+) (?P<ident>\S+) (?P<user>\S+) \[(?P<time>[^\]]*)\] "(?P<method>[A-Z]+) (?P<path>\S+)(?P<proto> [^"]*)?" '
    r'(?P<rest>\d{3} (?:\d+|-) "[^"]*" "[^"]*")'
)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def find_corpus() -> Path:
    path = corpus("web-access-logs")
    if path.is_dir():
        return path
    raise SystemExit(f"corpus not found at {path}: put it at ../shared/corpus or set {ENV}")


def corpus_lines(corpus: Path) -> list[re.Match[str]]:
    out = []
    for f in sorted(corpus.glob("*/*.log")):
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            m = COMBINED.match(line)
            if m and "\ufffd" not in line:
                out.append(m)
    return out


NUMERIC_SEGMENT = re.compile(r"(?<=/)[0-9]+(?=/|$|\?)")


def generate(out: Path, n_lines: int, *, seed: int = 1, corpus: Path | None = None) -> dict:
    """Write ``n_lines`` lines to ``out``; return what was written (lines, bytes, sources)."""
    rnd = random.Random(seed)
    source = corpus_lines(corpus or find_corpus())
    t0 = time.mktime((2025, 3, 10, 0, 0, 0, 0, 0, 0))
    written = 0
    with open(out, "w", encoding="utf-8", buffering=1 << 20) as f:
        batch = []
        for i in range(n_lines):
            m = source[rnd.randrange(len(source))]
            t = time.gmtime(t0 + i // 100)
            stamp = f"{t.tm_mday:02d}/{_MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"
            path = NUMERIC_SEGMENT.sub(lambda _: str(rnd.randrange(1, 100000)), m["path"])
            rt = min(rnd.lognormvariate(-3.5, 1.0), 30.0)
            urt = "-" if rnd.random() < 0.2 else f"{rt * 0.9:.3f}"
            batch.append(f'{m["addr"]} {m["ident"]} {m["user"]} [{stamp}] "{m["method"]} {path}{m["proto"] or ""}" '
                         f'{m["rest"]} rt={rt:.3f} urt="{urt}"\n')
            if len(batch) >= 10000:
                written += f.write("".join(batch))
                batch.clear()
        written += f.write("".join(batch))
    return {"lines": n_lines, "bytes": out.stat().st_size, "corpus_lines": len(source), "seed": seed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    print(generate(a.out, a.lines, seed=a.seed))


if __name__ == "__main__":
    main()
