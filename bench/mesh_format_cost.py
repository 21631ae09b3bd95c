"""What a hostile line costs the mesh exporter's Envoy format parser, by line length.

    uv run python -m bench.mesh_format_cost                                   # this tree
    uv run python -m bench.mesh_format_cost --module /tmp/envoy_format_orig.py   # another copy
    (git show HEAD~1:exporters/mesh/envoy_format.py > /tmp/envoy_format_orig.py for "before")

For each case (a format string and a way to build a line that does NOT match it) and each line
length (1, 4, 16, 64 KB by default), ``CompiledFormat.parse`` is timed (best of 3; the figure
includes the ``truncated`` check that follows a failed match). Each measurement runs in a child
process that is stopped after ``--timeout`` seconds, so a quadratic or worse parser is reported
as "> N s" instead of holding the bench for hours; once a case took longer than ``--skip-after``
seconds, its longer lines are skipped. The machine's conditions (Python, CPU count, load
average before and after) are printed with the figures: this is a shared 2-core machine.

Figures are wall-clock times and vary with the machine; what matters is how they grow with the
length: x4 per step is linear, x16 quadratic.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

DEFAULT_MODULE = Path(__file__).resolve().parent.parent / "exporters" / "mesh" / "envoy_format.py"

ISTIO_LINE = (
    '[2020-11-25T21:26:18.409Z] "GET /status/418 HTTP/1.1" 418 - via_upstream - "-" 0 135 4 4 "-" '
    '"curl/7.73.0-DEV" "84961386-6d84-929d-98bd-c5aee93b5c88" "httpbin:8000" "10.44.1.27:80" '
    "outbound|8000||httpbin.foo.svc.cluster.local 10.44.1.23:37652 10.0.45.184:8000 10.44.1.23:46520 - default"
)

# (name, format string, line of about n characters that the format does not take)
CASES: list[tuple[str, str, Callable[[int], str]]] = [
    ("text+int adjacent, digits", "%UPSTREAM_HOST%%DURATION% %UPSTREAM_CLUSTER%", lambda n: "1" * n + "x"),
    ("text+int adjacent at the end", "%UPSTREAM_HOST%%DURATION%", lambda n: "1" * n + "x"),
    ("text+flags adjacent", "%RESPONSE_CODE_DETAILS%%RESPONSE_FLAGS% %ROUTE_NAME%", lambda n: "U" * n + "1"),
    ("text+token adjacent", "%HOSTNAME%%PROTOCOL% end", lambda n: "a" * n + "!"),
    ("text+text adjacent, quoted after", '%REQ(X-A)%%REQ(X-B)% "%REQ(USER-AGENT)%" end', lambda n: "a" * n),
    ("code+flags adjacent", "%RESPONSE_CODE%%RESPONSE_FLAGS% %ROUTE_NAME%", lambda n: "1" * n + "x"),
    ("CSV, flags before ','", '%RESPONSE_CODE%,%RESPONSE_FLAGS%,%UPSTREAM_CLUSTER%,"%REQ(USER-AGENT)%"',
     lambda n: "200," + "A," * (n // 2)),
    ("three flag lists before ','", "%RESPONSE_FLAGS%,%RESPONSE_FLAGS%,%RESPONSE_FLAGS%!", lambda n: "A," * (n // 2)),
    ("tokens before '.'", "%PROTOCOL%.%PROTOCOL%.%PROTOCOL%.%PROTOCOL%!", lambda n: "a." * (n // 2)),
    ("START_TIME(%s%f)", "%START_TIME(%s%f)% %DURATION%", lambda n: "1" * n + "x"),
    ("Istio default, long path, junk", "", lambda n: ISTIO_LINE.replace("/status/418", "/" + "a" * n).replace(" 418 ", " 4x8 ")),
    ("Istio default, '- ' repeated", "", lambda n: ISTIO_LINE[:120] + "- " * (n // 2)),
]


def load(path: Path) -> ModuleType:
    """The envoy_format module at ``path`` (this tree's or an older copy), under its own name."""
    spec = importlib.util.spec_from_file_location("envoy_format_under_bench", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def measure(path: str, case: int, n: int, out: mp.Queue) -> None:
    """Child process: best of 3 parse times for one case and length; puts (seconds, outcome)."""
    ef = load(Path(path))
    _, fs, make = CASES[case]
    fmt = ef.CompiledFormat(fs) if fs else ef.ISTIO_TEXT
    line = make(n)
    best, outcome = float("inf"), ""
    for _ in range(3):
        t0 = time.perf_counter()
        try:
            fmt.parse(line)
            outcome = "parsed"
        except ef.ParseError as e:
            outcome = e.reason
        best = min(best, time.perf_counter() - t0)
    out.put((best, outcome))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", type=Path, default=DEFAULT_MODULE, help="envoy_format.py to measure")
    ap.add_argument("--sizes", default="1,4,16,64", help="line lengths in KB (1 KB = 1024 characters)")
    ap.add_argument("--timeout", type=float, default=60.0, help="stop one measurement after this many seconds")
    ap.add_argument("--skip-after", type=float, default=5.0, help="skip a case's longer lines once one took this long")
    args = ap.parse_args(argv)
    sizes = [int(float(s) * 1024) for s in args.sizes.split(",")]
    print(f"module: {args.module}")
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"each figure: best of 3 CompiledFormat.parse calls; a child stopped after {args.timeout:.0f} s")
    print()
    header = f"{'case':34} " + " ".join(f"{s // 1024:>6} KB" for s in sizes) + "   outcome"
    print(header)
    ctx = mp.get_context("fork")
    for i, (name, _, _) in enumerate(CASES):
        cells: list[str] = []
        outcome = ""
        skip = False
        for n in sizes:
            if skip:
                cells.append(f"{'skipped':>9}")
                continue
            q: mp.Queue = ctx.Queue()
            child = ctx.Process(target=measure, args=(str(args.module), i, n, q))
            child.start()
            child.join(args.timeout)
            if child.is_alive():
                child.terminate()
                child.join()
                cells.append(f">{args.timeout:.0f} s".rjust(9))
                skip = True
                continue
            seconds, outcome = q.get()
            cells.append(f"{seconds * 1000:7.2f}ms" if seconds < 10 else f"{seconds:7.1f} s")
            skip = seconds > args.skip_after
        print(f"{name:34} " + " ".join(cells) + f"   {outcome}", flush=True)
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
