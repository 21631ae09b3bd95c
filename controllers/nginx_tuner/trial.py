"""The trial plan (which value to run when) and one bounded Locust run.

Interleaving: baselines on this machine drift by 5-10 % over minutes (CPU steal, other
tenants; see STACK-NOTES), and the paper's effects were smaller than that. A sweep that runs
5, 5, 5, 10, 10, 10, ... turns drift into a fake trend over the grid. :func:`trial_plan`
runs every candidate once per round, and orders the rounds by the rows of a Williams
design (a Latin square in which each value also follows every other value equally often),
over a seeded shuffle of the candidates: no value is always first or last in a round, and
the plan is reproducible from its seed. For an odd number of candidates the balanced
design needs the mirrored rows too, so rounds n..2n-1 are the rows reversed.

Load: :func:`run_load` runs ``controllers/nginx_tuner/locustfile.py`` headless in a child
process (``python -m locust`` from the same interpreter, i.e. what ``uv run locust`` runs,
without needing uv at run time), because importing locust patches the standard library
with gevent. Totals come from ``--json`` (STACK-NOTES: ``--csv`` totals come up short). The
child is bounded: Locust's ``--run-time`` plus a margin, after which its whole process group
is killed and :class:`LoadError` raised. By default statistics are reset when spawning
completes (``--reset-stats``) so the ramp does not blur the comparison.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from promreflex.proc import die_with_parent

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


@dataclass(frozen=True)
class Trial:
    index: int  # position in the whole plan
    round: int  # repeat number, 0-based
    position: int  # position within its round
    value: float


def williams_rows(n: int) -> list[list[int]]:
    """Rows of a Williams design for n treatments (n rows if n is even, 2n if odd)."""
    if n < 1:
        raise ValueError("need at least one candidate")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2 == 1:
        rows += [list(reversed(row)) for row in rows]
    return rows


def trial_plan(candidates: Sequence[float], repeats: int, seed: int = 0) -> list[Trial]:
    """Interleaved order: every candidate once per round, rounds from a seeded Williams design."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if len(set(candidates)) != len(candidates):
        raise ValueError("duplicate candidate values")
    shuffled = list(candidates)
    random.Random(seed).shuffle(shuffled)
    rows = williams_rows(len(shuffled))
    plan: list[Trial] = []
    for r in range(repeats):
        for pos, idx in enumerate(rows[r % len(rows)]):
            plan.append(Trial(len(plan), r, pos, shuffled[idx]))
    return plan


@dataclass(frozen=True)
class LoadResult:
    mean_ms: float
    p95_ms: float
    requests: int
    failures: int


class LoadError(Exception):
    """The load generator failed, timed out or produced no requests."""


def percentile_ms(histogram: Mapping[float, int], fraction: float) -> float:
    """Nearest-rank percentile of Locust's rounded-milliseconds histogram ``{ms: count}``."""
    total = sum(histogram.values())
    if total <= 0:
        return math.nan
    rank = max(1, math.ceil(fraction * total))
    seen = 0
    for rt in sorted(histogram):
        seen += histogram[rt]
        if seen >= rank:
            return rt
    return max(histogram)


def summarise(stats: list[dict]) -> LoadResult:
    """Fold Locust's ``--json`` entries into one :class:`LoadResult`."""
    requests = sum(int(e["num_requests"]) for e in stats)
    failures = sum(int(e["num_failures"]) for e in stats)
    if requests == 0:
        raise LoadError("the load run completed no requests")
    total_ms = sum(float(e["total_response_time"]) for e in stats)
    hist: dict[float, int] = {}
    for e in stats:
        for k, count in e.get("response_times", {}).items():
            hist[float(k)] = hist.get(float(k), 0) + int(count)
    return LoadResult(total_ms / requests, percentile_ms(hist, 0.95), requests, failures)


def locust_argv(
    url: str, users: int, spawn_rate: float, duration_s: float, think_min: float, think_max: float,
    reset_stats: bool = True, paths: Sequence[str] | None = None,
) -> list[str]:
    """``paths``: one page view fetches these in order on the same connection (default: the URL's path)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if paths is not None and (not paths or any(not p.startswith("/") or "," in p or p != p.strip() for p in paths)):
        raise ValueError(f"paths must be absolute, without commas or spaces: {paths!r}")
    argv = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--host", f"{parts.scheme}://{parts.netloc}", "--target-path", ",".join(paths) if paths else (parts.path or "/"),
        "-u", str(int(users)), "-r", str(spawn_rate), "-t", f"{max(1, math.ceil(duration_s))}s",
        "--think-min", str(think_min), "--think-max", str(think_max),
        "--json", "--skip-log", "--exit-code-on-error", "0", "--stop-timeout", "0",
    ]
    if reset_stats:
        argv.append("--reset-stats")
    return argv


#: Loads running now (each in its own process group), for :func:`stop_loads`.
_RUNNING: set[subprocess.Popen[str]] = set()
_RUNNING_LOCK = threading.Lock()


def stop_loads() -> None:
    """Kill every load :func:`run_load` is waiting for (a cancelled sweep: the thread waiting
    for its Locust would otherwise hold the process for the rest of the load's run time)."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_load(
    url: str,
    users: int,
    spawn_rate: float,
    duration_s: float,
    think_min: float,
    think_max: float,
    *,
    reset_stats: bool = True,
    margin_s: float = 30.0,
    paths: Sequence[str] | None = None,
) -> LoadResult:
    """Run the thinking-client profile against ``url`` for ``duration_s`` seconds in a child process."""
    argv = locust_argv(url, users, spawn_rate, duration_s, think_min, think_max, reset_stats, paths)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Its own process group (a timeout kills the group), and it dies with this thread, which
    # waits for it below, so a SIGKILLed tuner or controller leaves no load running.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,  # noqa: S603
                            env=env, start_new_session=True, preexec_fn=die_with_parent)  # noqa: PLW1509 - prctl only
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=duration_s + margin_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise LoadError(f"locust did not finish within {duration_s + margin_s:.0f}s; killed") from None
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    if proc.returncode != 0:
        raise LoadError(f"locust exited {proc.returncode}: {err.strip()[-2000:]}")
    try:
        stats = json.loads(out)
    except json.JSONDecodeError as e:
        raise LoadError(f"locust printed no JSON stats ({e}); stderr: {err.strip()[-2000:]}") from e
    return summarise(stats)
