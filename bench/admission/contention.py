"""Contention that costs work: the pages' working sets compete for one shared buffer cache.

Why. A page whose CPU cost is fixed only time-shares the cores when concurrency rises: the
app's throughput stays flat past saturation and nothing collapses. A real app's throughput
FALLS when too many requests run at once (the seed's slide: "contention brings extra work,
e.g. GC and swapping from memory contention"): the database's buffer pool, the CPU caches, the
JVM heap are shared, and past a point every request misses more and does more work for the
same page. The page scheduler's progress-based regulation exists for exactly that ("if the
page's throughput does not improve when its concurrency rises, contention has begun").

The model (explicit, its parameters declared before any run and printed with every result):
- every page request, while it executes in a worker, holds a working set (``working_set_mb``
  per page class: search scans a 24 MB slice of the catalogue index, the other pages touch a
  session row and a few product rows, 2 MB);
- the working sets of all executing requests share one cache of ``budget_mb`` (96 MB: four
  searches at once, two per core of this machine: sized for the concurrency the cores can use);
- while the executing working sets sum to ``pressure`` > budget, the share of every request's
  work that misses is ``1 - budget / pressure`` (LRU over interleaved scans of distinct data
  keeps only that share resident), and work that misses costs ``1 + miss_penalty`` times
  (penalty 4: a missing block is re-read and decoded, five times the CPU of a hit);
- so a unit of a page's work costs ``cost_factor = 1 + miss_penalty x miss`` units of REAL CPU
  (SHA-256 iterations, :func:`bench.admission.app.burn`), re-evaluated every ``chunk`` of work
  as requests start and finish (:func:`run_work`).
Below the knee (pressure <= budget) a page costs its base CPU; past it the app does more work
per page as concurrency rises, so its throughput drops. With every one of 16 workers busy on
the session mix (about 11 searches and 5 light pages executing) the cost factor is ~3.6 and
the app serves about a quarter of its peak; a client timeout then abandons sessions
mid-session while the app still finishes (wastes) their requests: the paper's collapse.
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# Declared up front (before the first run of this model), printed in every summary.
CACHE_BUDGET_MB = 96.0
MISS_PENALTY = 4.0
WORKING_SET_MB: dict[str, float] = {"login": 2.0, "browse": 2.0, "search": 24.0, "buy": 2.0, "logout": 2.0}
CHUNK_MS = 0.25  # the cost factor is re-read after every chunk of real work of this size


@dataclass(frozen=True)
class CacheModel:
    """The shared cache; ``budget_mb <= 0`` turns contention off (a page always costs its base)."""

    budget_mb: float = CACHE_BUDGET_MB
    miss_penalty: float = MISS_PENALTY
    working_set_mb: Mapping[str, float] = field(default_factory=lambda: dict(WORKING_SET_MB))

    def __post_init__(self) -> None:
        if self.miss_penalty < 0 or any(v < 0 for v in self.working_set_mb.values()):
            raise ValueError("miss_penalty and working sets must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.budget_mb > 0 and self.miss_penalty > 0

    def ws(self, page: str) -> float:
        return float(self.working_set_mb.get(page, 0.0))

    def miss(self, pressure_mb: float) -> float:
        """Share of the work that misses when the executing working sets sum to ``pressure_mb``."""
        if not self.enabled or pressure_mb <= self.budget_mb:
            return 0.0
        return 1.0 - self.budget_mb / pressure_mb

    def cost_factor(self, pressure_mb: float) -> float:
        """Real CPU per unit of a page's base work at this pressure (1 below the knee)."""
        return 1.0 + self.miss_penalty * self.miss(pressure_mb)

    def pressure(self, executing: Mapping[str, float]) -> float:
        """Working sets of ``executing`` requests (page class -> how many execute)."""
        return sum(self.ws(page) * n for page, n in executing.items())

    def throughput(self, executing: Mapping[str, float], cores: float) -> float:
        """Units of base work completed per second of wall time with these requests executing
        (each unit = 1 s of one core at cost factor 1): ``min(n, cores) / cost_factor``."""
        n = sum(executing.values())
        if n <= 0:
            return 0.0
        return min(n, cores) / self.cost_factor(self.pressure(executing))

    def argv(self) -> list[str]:
        """The app's flags for this model."""
        ws = ",".join(f"{k}={v:g}" for k, v in self.working_set_mb.items())
        return ["--cache-mb", f"{self.budget_mb:g}", "--miss-penalty", f"{self.miss_penalty:g}", "--working-sets", ws]

    def describe(self) -> str:
        if not self.enabled:
            return "no contention model (a page costs its base CPU at any concurrency)"
        ws = ", ".join(f"{k} {v:g} MB" for k, v in self.working_set_mb.items())
        return (f"shared cache {self.budget_mb:g} MB, working sets {ws}; past it the missing share "
                f"1 - cache/pressure of every page's work costs {1 + self.miss_penalty:g}x")

    def as_dict(self) -> dict[str, Any]:
        return {"budget_mb": self.budget_mb, "miss_penalty": self.miss_penalty,
                "working_set_mb": dict(self.working_set_mb), "chunk_ms": CHUNK_MS}


def parse_working_sets(text: str) -> dict[str, float]:
    """``"search=24,login=2"`` -> ``{"search": 24.0, "login": 2.0}`` (ValueError on bad input)."""
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"working set {part!r}: need PAGE=MB")
        try:
            mb = float(value)
        except ValueError:
            raise ValueError(f"working set {part!r}: MB must be a number") from None
        if not mb >= 0 or mb == float("inf"):
            raise ValueError(f"working set {part!r}: MB must be a finite number >= 0")
        out[name.strip()] = mb
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--cache-mb``, ``--miss-penalty``, ``--working-sets``, defaulting to the declared model."""
    d = CacheModel()
    ap.add_argument("--cache-mb", type=float, default=d.budget_mb,
                    help="the app's shared cache the executing working sets compete for, MB (0: no contention model)")
    ap.add_argument("--miss-penalty", type=float, default=d.miss_penalty,
                    help="extra CPU per unit of a page's work that misses the cache")
    ap.add_argument("--working-sets", default=",".join(f"{k}={v:g}" for k, v in d.working_set_mb.items()),
                    help="PAGE=MB,... working set of an executing request per page class")


def from_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> CacheModel:
    """The model of :func:`add_arguments`' flags; a bad value is the parser's usage error."""
    try:
        return CacheModel(budget_mb=args.cache_mb, miss_penalty=args.miss_penalty,
                          working_set_mb=parse_working_sets(args.working_sets))
    except ValueError as e:
        ap.error(str(e))


class Pressure(Protocol):
    def add(self, mb: float) -> None: ...

    def value(self) -> float: ...


class SharedPressure:
    """The executing working sets, summed across the app's worker processes (fork-inherited)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._v = ctx.RawValue("d", 0.0)
        self._lock = ctx.Lock()

    def add(self, mb: float) -> None:
        with self._lock:
            self._v.value = max(0.0, self._v.value + mb)

    def value(self) -> float:
        return float(self._v.value)


def run_work(iterations: int, ws_mb: float, model: CacheModel, pressure: Pressure, chunk: int,
             burn: Callable[[int], object]) -> int:
    """Do a page's ``iterations`` of base work under contention; returns the REAL iterations
    burnt (``>= iterations``; the excess is the work the misses cost). The request's working set
    counts in the pressure while it executes; the cost factor is re-read every ``chunk``."""
    chunk = max(1, chunk)
    pressure.add(ws_mb)
    try:
        progress = 0.0  # base work done, in iterations
        real = 0
        while iterations - progress > 1e-9:
            factor = model.cost_factor(pressure.value())
            k = min(chunk, max(1, round((iterations - progress) * factor)))
            burn(k)
            real += k
            progress += k / factor
        return real
    finally:
        pressure.add(-ws_mb)
