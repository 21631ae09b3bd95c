"""The keepalive sweep: apply each candidate, measure it, repeat interleaved, choose, apply the choice.

One engine, two ways to measure (both return a :class:`Measurement`):

- :class:`LoadMeasurer` (active, for a test bench or a staging proxy): a bounded Locust run of
  thinking clients (``trial.run_load``), with nginx's memory (PSS summed over master and
  workers, :mod:`memory`; USS where smaps_rollup is missing: the method is recorded) sampled
  every ``sample_interval`` during the run, and, when a ``stub_status`` URL is given, the idle
  keepalive connections nginx holds ("Waiting") and the connections it accepted per request
  (each one a handshake). Those two columns are the trade-off made visible: a longer
  ``keepalive_timeout`` holds more idle connections (memory) and accepts fewer new ones
  (handshakes, response time).
- :class:`~controllers.nginx_tuner.passive.PassiveMeasurer` (production): no synthetic
  load; each candidate is held for a dwell time under live traffic and read back from
  Prometheus.

The sweep (:class:`Sweep`):

1. reads the current value (the caller passes the value in force for the tuned scope: its
   own, else inherited from ``http``, else nginx's 75 s, so the "current" trial re-applies
   what was running); it is always measured too (added to the grid when absent), since the
   keep-current rule compares against it;
2. runs ``trial.trial_plan`` (every candidate once per round, rounds in a Williams order);
   each trial = ``apply`` (edit, ``nginx -t``, reload, wait for the old workers to be gone,
   health check; rolled back by ``NginxControl`` on any failure) then ``measure``;
3. a trial whose error ratio exceeds ``max_error_ratio`` (or a passive dwell aborted for
   rising errors) restores the last good value at once (the value nginx ran before the
   sweep, which served without errors) and the candidate is dropped from later rounds, as is
   a candidate whose apply failed (nginx already rolled back to the previous file), whose
   apply raised, or whose edit is redefined in a nested server/location (``shadowed_by``:
   the traffic would not get it, so measuring it would measure the override);
4. with ``early_stop``, after each round from ``min_repeats`` on: candidates whose intervals
   lie entirely above another candidate's on both objectives are dropped (``pareto.prune``),
   and the sweep stops when the decision (value to apply, keep or change) has been the same
   for ``patience`` consecutive rounds. :func:`replay` runs the same rule over a full grid's
   records, so "runs to decision" and "same decision?" are compared on the same data;
5. chooses with ``pareto.choose`` (front, normalised sum rule, keep-current significance
   check) and applies the chosen value, which is the current one when it is kept.

With a journal (:class:`Journal`, ``NginxControl`` is one), the file as it was before the
first trial is recorded durably first, and the sweep puts it back (text as it was, not only
the value) and makes it live on every way it can end without its choice applied: an error of
any kind, a cancellation, nginx not returning to health after a trial, no decision, a kept
current value; the journal is removed only once the choice is live. Without one, the last good
value is applied again instead (what ``restore`` means then).

Nothing here imports locust; ``run_load`` starts it in a child process.
"""

from __future__ import annotations

import asyncio
import csv
import math
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from controllers.nginx_tuner.memory import Method, group_memory, nginx_memory
from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.config_edit import ConfigEditError
from controllers.nginx_tuner.nginx_ctl import NOT_RUNNING, ApplyResult, NginxControl, NginxError
from controllers.nginx_tuner.pareto import Choice, Point, Rule, choose, prune
from controllers.nginx_tuner.trial import LoadError, Trial, run_load, stop_loads, trial_plan
from promreflex.fsutil import atomic_write_json, atomic_write_text

PAPER_GRID = tuple(range(5, 101, 5))
DEFAULTS = {"nginx built-in": 75.0, "Debian nginx.conf": 65.0, "paper's choice": 60.0}


@dataclass(frozen=True)
class Measurement:
    """What one trial measured; times in seconds, memory in bytes."""

    mean_s: float
    p95_s: float
    memory_bytes: float
    memory_method: str  # "pss" | "uss" | "prometheus"
    requests: int
    failures: int
    idle_connections: float | None = None  # mean of nginx's "Waiting" during the trial
    accepts_per_request: float | None = None  # new connections (handshakes) per request
    aborted: str = ""  # non-empty: errors rose during the trial and it was cut short

    @property
    def error_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


@dataclass
class TrialRecord:
    index: int
    round: int
    value: float
    result: str  # ok | errors | load_failed | apply_failed
    started: float
    seconds: float
    mean_s: float | None = None
    p95_s: float | None = None
    memory_bytes: float | None = None
    memory_method: str = ""
    requests: int = 0
    failures: int = 0
    idle_connections: float | None = None
    accepts_per_request: float | None = None
    message: str = ""

    CSV_FIELDS = (
        "index", "round", "value", "result", "started", "seconds", "mean_s", "p95_s", "memory_bytes",
        "memory_method", "requests", "failures", "idle_connections", "accepts_per_request", "message",
    )


class Measure(Protocol):
    def __call__(self, value: float) -> Awaitable[Measurement]: ...


class Journal(Protocol):
    """The pre-sweep file, kept durably (``NginxControl``: ``<backup dir>/sweep.json``)."""

    def begin_sweep(self) -> str: ...

    def restore_original(self, keep: bool = False) -> str: ...

    def end_sweep(self) -> None: ...


@dataclass(frozen=True)
class SweepSettings:
    candidates: tuple[float, ...] = tuple(float(v) for v in PAPER_GRID)
    repeats: int = 3
    seed: int = 0
    confidence: float = 0.95
    rule: Rule = "sum"
    max_error_ratio: float = 0.01
    early_stop: bool = False
    min_repeats: int = 3
    patience: int = 2

    def __post_init__(self) -> None:
        if len(self.candidates) < 2 or len(set(self.candidates)) != len(self.candidates):
            raise ValueError("need at least two distinct candidate values")
        if any(not (0 < v <= 3600) or not float(v).is_integer() for v in self.candidates):
            raise ValueError("candidates must be whole seconds in 1..3600")
        if self.repeats < 1 or self.min_repeats < 2 or self.patience < 1:
            raise ValueError("repeats >= 1, min_repeats >= 2 and patience >= 1 are required")
        if not 0.0 <= self.max_error_ratio < 1.0:
            raise ValueError("max_error_ratio must be in [0, 1)")


@dataclass
class SweepResult:
    settings: SweepSettings
    current: float | None
    records: list[TrialRecord]
    points: list[Point]
    choice: Choice | None
    runs_used: int
    runs_planned: int
    dropped: dict[float, str] = field(default_factory=dict)  # value -> why it left the sweep
    stopped_after_round: int | None = None  # early stop: last round run (0-based)
    final: str = ""  # what happened to the chosen value
    final_ok: bool = True
    load_average: tuple[float, float, float] | None = None

    def to_json(self) -> dict[str, Any]:
        c = self.choice
        return {
            "settings": {**asdict(self.settings), "candidates": list(self.settings.candidates)},
            "current": self.current,
            "choice": None if c is None else {
                "value": c.value, "best": c.best, "front": list(c.front), "kept_current": c.kept_current,
                "reason": c.reason, "scores": {str(k): v for k, v in c.scores.items()},
            },
            "points": [
                {"value": p.value, "n": p.rt.n,
                 "rt_mean_s": p.rt.mean, "rt_low_s": _finite(p.rt.low), "rt_high_s": _finite(p.rt.high),
                 "mem_mean_bytes": p.mem.mean, "mem_low_bytes": _finite(p.mem.low), "mem_high_bytes": _finite(p.mem.high),
                 **summary_extras(self.records, p.value)}
                for p in self.points
            ],
            "runs_used": self.runs_used,
            "runs_planned": self.runs_planned,
            "dropped": {str(k): v for k, v in self.dropped.items()},
            "stopped_after_round": self.stopped_after_round,
            "final": self.final,
            "final_ok": self.final_ok,
            "load_average": self.load_average,
            "trials": [asdict(r) for r in self.records],
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def summary_extras(records: Sequence[TrialRecord], value: float) -> dict[str, float | None]:
    """Means of the explanatory columns (p95, idle connections, handshakes/request) of a value's ok trials."""
    ok = [r for r in records if r.value == value and r.result == "ok"]

    def mean(attr: str) -> float | None:
        xs = [getattr(r, attr) for r in ok if getattr(r, attr) is not None]
        return statistics.fmean(xs) if xs else None

    return {"p95_mean_s": mean("p95_s"), "idle_connections": mean("idle_connections"), "accepts_per_request": mean("accepts_per_request")}


def points_of(records: Sequence[TrialRecord], confidence: float = 0.95) -> list[Point]:
    """One point per value from its ok trials (values without an ok trial are left out)."""
    by: dict[float, list[TrialRecord]] = {}
    for r in records:
        if r.result == "ok" and r.mean_s is not None and r.memory_bytes is not None:
            by.setdefault(r.value, []).append(r)
    return [
        Point.from_samples(v, [r.mean_s for r in rs], [r.memory_bytes for r in rs], confidence)  # type: ignore[misc]
        for v, rs in sorted(by.items())
    ]


def decide(records: Sequence[TrialRecord], current: float | None, settings: SweepSettings) -> tuple[list[Point], Choice | None]:
    points = points_of(records, settings.confidence)
    if not points:
        return points, None
    return points, choose(points, current, settings.rule)


class EarlyStop:
    """The early-stopping rule, shared by the live sweep and :func:`replay`."""

    def __init__(self, settings: SweepSettings, current: float | None):
        self.s = settings
        self.current = current
        self.history: list[tuple[float, bool]] = []

    def after_round(self, records: Sequence[TrialRecord], active: set[float], round_: int) -> tuple[dict[float, float], bool]:
        """(values to drop -> the value that CI-dominates each, stop now?) after round ``round_`` (0-based)."""
        if round_ + 1 < self.s.min_repeats:
            return {}, False
        points = [p for p in points_of(records, self.s.confidence) if p.value in active]
        drop = {v: by for v, by in prune(points).items() if v != self.current}
        _, choice = decide([r for r in records if r.value in active - set(drop)], self.current, self.s)
        if choice is None:
            return drop, False
        self.history.append((choice.value, choice.kept_current))
        stable = len(self.history) >= self.s.patience and len(set(self.history[-self.s.patience :])) == 1
        return drop, stable


def replay(records: Sequence[TrialRecord], plan: Sequence[Trial], current: float | None, settings: SweepSettings) -> tuple[Choice | None, int, dict[float, float]]:
    """What early stopping would have decided from a full grid's records, and with how many runs.

    Walks the plan round by round, keeping only the trials early stopping would have run.
    Returns (choice, load runs used, dropped values).
    """
    by_index = {r.index: r for r in records}
    rule = EarlyStop(settings, current)
    active = set(settings.candidates)
    kept: list[TrialRecord] = []
    dropped: dict[float, float] = {}
    rounds = sorted({t.round for t in plan})
    for rnd in rounds:
        for t in plan:
            if t.round == rnd and t.value in active and t.index in by_index:
                kept.append(by_index[t.index])
                if by_index[t.index].result != "ok":
                    active.discard(t.value)
        drop, stop = rule.after_round(kept, active, rnd)
        dropped.update(drop)
        active -= set(drop)
        if stop:
            break
    _, choice = decide([r for r in kept if r.value in active], current, settings)
    return choice, len(kept), dropped


class Sweep:
    """Runs a sweep: ``apply(value) -> ApplyResult`` (blocking, run in a thread) and ``measure``."""

    def __init__(
        self,
        settings: SweepSettings,
        apply: Callable[[int], ApplyResult],
        measure: Measure,
        current: float | None,
        *,
        metrics: TunerMetrics | None = None,
        progress: Callable[[str], None] = print,
        journal: Journal | None = None,
    ):
        cands = tuple(settings.candidates)
        if current is not None and not float(current).is_integer():
            raise ValueError(f"the current keepalive_timeout {current}s is not whole seconds; set it to whole seconds first")
        if current is not None and current not in cands:
            cands = (*cands, current)
            settings = SweepSettings(**{**asdict(settings), "candidates": cands})
        self.settings = settings
        self.apply = apply
        self.measure = measure
        self.current = current
        self.metrics = metrics
        self.progress = progress
        self.journal = journal
        self.plan = trial_plan(settings.candidates, settings.repeats, settings.seed)
        self.stop_requested = False

    def _state(self, state: str) -> None:
        if self.metrics is not None:
            self.metrics.set_state(state)

    def _count(self, value: float, result: str, m: Measurement | None = None) -> None:
        if self.metrics is None:
            return
        if m is None:
            self.metrics.record_trial(value, result)
        else:
            self.metrics.record_trial(value, result, m.mean_s, m.p95_s, int(m.memory_bytes))

    async def _apply(self, value: float) -> ApplyResult:
        return await asyncio.to_thread(self.apply, int(value))

    async def _restore_last_good(self, going_on: bool = False) -> str:
        """``going_on``: the sweep continues after this (a trial's errors): the journal stays, so
        the next trials' edits are still undone however the sweep ends (it was removed here, and
        a sweep ended on a trial's value while saying "restored")."""
        if self.journal is not None:
            try:
                return "restored: " + await asyncio.to_thread(self.journal.restore_original, going_on)
            except Exception as e:  # noqa: BLE001 - said, and the journal stays for the next try
                return f"could NOT restore the pre-sweep config: {e}"
        if self.current is None:
            return "no last good value known; left as is"
        res = await self._apply(self.current)
        return f"restored {self.current:g}: {res.stage} {res.message}" if res.ok else f"could NOT restore {self.current:g}: {res.message}"

    async def run(self) -> SweepResult:
        s = self.settings
        records: list[TrialRecord] = []
        dropped: dict[float, str] = {}
        active = set(s.candidates)
        early = EarlyStop(s, self.current)
        stopped_after: int | None = None
        n_rounds = max(t.round for t in self.plan) + 1
        broken = False
        preflight = getattr(self.measure, "preflight", None)
        if preflight is not None:  # (raises LoadError, before anything is changed, when nothing could be measured)
            await preflight()
        if self.journal is not None:  # (raises, before anything is planned or changed, when no value could be applied)
            recovered = await asyncio.to_thread(self.journal.begin_sweep)
            if recovered:
                self.progress(f"an interrupted sweep's original was recovered first: {recovered}")
        self.progress(
            f"sweep: {len(s.candidates)} candidates x {s.repeats} repeats = {len(self.plan)} trials planned"
            f"{' (early stopping on)' if s.early_stop else ''}; current value {self.current}"
        )
        self._state("sweeping")
        try:
            for rnd in range(n_rounds):
                for t in (t for t in self.plan if t.round == rnd):
                    if t.value not in active or self.stop_requested:
                        continue
                    rec = await self._trial(t)
                    records.append(rec)
                    self._state("sweeping")
                    self.progress(_progress_line(rec, len(records), len(self.plan)))
                    if rec.result != "ok":
                        active.discard(t.value)
                        dropped[t.value] = f"{rec.result}: {rec.message}"
                        if rec.result == "apply_failed" and "NOT serving" in rec.message:
                            broken = True
                            break
                if broken or self.stop_requested:
                    break
                if s.early_stop:
                    drop, stop = early.after_round(records, active, rnd)
                    for v, by in drop.items():
                        dropped[v] = f"pruned after round {rnd + 1}: {by:g} is significantly better on both objectives"
                        self.progress(f"  early stop: dropping {v:g} ({dropped[v]})")
                    active -= set(drop)
                    if stop:
                        stopped_after = rnd
                        self.progress(f"  early stop: decision unchanged for {s.patience} rounds; stopping after round {rnd + 1}")
                        break
            # The choice is made among the candidates still in the sweep; the table and plot show
            # every candidate that was measured (pruned ones too). Without a measurement of the
            # current value there is nothing to test a change against: keep it.
            current_lost = self.current is not None and self.current in dropped and not dropped[self.current].startswith("pruned")
            # Nor when no other value was measured (every one failed to apply or to load: an
            # unwritable config, a load generator that cannot run): keeping the current value
            # would then be no decision, not a result of the sweep.
            alone = self.current is not None and len(s.candidates) > 1 and not any(
                r.value != self.current and r.result in ("ok", "errors") for r in records)
            _, choice = (None, None) if current_lost or alone else decide([r for r in records if r.value in active], self.current, s)
            points = points_of(records, s.confidence)
            result = SweepResult(s, self.current, records, points, choice, len(records), len(self.plan), dropped, stopped_after)
            if broken:
                restored = await self._restore_last_good()
                result.final, result.final_ok = f"sweep stopped: nginx did not return to health after a trial; {restored}", False
            elif choice is None:
                why = ("the current value's own trial failed, no decision" if current_lost else
                       "no value but the current one could be measured, no decision" if alone else "nothing was measured")
                restored = await self._restore_last_good()
                result.final, result.final_ok = f"{why}; {restored}", False
            elif choice.kept_current and self.journal is not None:
                restored = await self._restore_last_good()  # the file as it was, text and all
                # (back on disk but nginx not running: not a good end, nothing serves the value)
                result.final_ok = restored.startswith("restored") and not restored.endswith(NOT_RUNNING)
                result.final = f"kept {choice.value:g}: {restored}"
            else:
                res = await self._apply(choice.value)
                result.final_ok = res.ok
                verb = "kept" if choice.kept_current else "applied"
                result.final = f"{verb} {choice.value:g}: {res.message}" if res.ok else f"applying {choice.value:g} failed: {res.message}"
                if not res.ok:
                    result.final += f"; {await self._restore_last_good()}"
                elif self.journal is not None:
                    await asyncio.to_thread(self.journal.end_sweep)
            return result
        except BaseException as e:
            # Stopping mid-sweep (cancelled) or anything unexpected (Prometheus gone, a disk
            # error, a measurement that raised): never leave a candidate behind.
            why = "cancelled" if isinstance(e, asyncio.CancelledError) else f"failed ({e!r})"
            self.progress(f"sweep {why}; restoring the pre-sweep config")
            self.progress(await self._restore_last_good())
            raise
        finally:
            self._state("idle")

    async def _trial(self, t: Trial) -> TrialRecord:
        started = time.time()
        t0 = time.monotonic()
        rec = TrialRecord(t.index, t.round, t.value, "ok", started, 0.0)
        try:
            res = await self._apply(t.value)
        except (ConfigEditError, NginxError) as e:  # (NginxControl.apply says so itself; another apply may raise)
            res = ApplyResult(False, f"{t.value:g}", "precheck", f"not applied: {e}")
        if res.ok and res.edit is not None and res.edit.shadowed_by:
            # the value was written, but a server/location below sets its own: what is measured
            # is not this candidate (the pre-sweep config comes back when the sweep ends).
            # (NginxControl refuses such an edit before writing; this stays for other ``apply``s.)
            where = ", ".join(f"{loc.file}:{loc.line}" for loc in res.edit.shadowed_by)
            res.ok, res.message = False, f"{res.message}, but it is redefined at {where}: the traffic does not get it"
        if not res.ok:
            rec.result = "apply_failed"
            rec.message = f"{res.stage}: {res.message}" + ("" if res.serving_last_good else " (NOT serving the last good config)")
            self._count(t.value, "apply_failed")
        else:
            try:
                m = await self.measure(t.value)
            except LoadError as e:
                rec.result, rec.message = "load_failed", str(e)
                self._count(t.value, "load_failed")
            else:
                for k in ("mean_s", "p95_s", "memory_bytes", "memory_method", "requests", "failures", "idle_connections", "accepts_per_request"):
                    setattr(rec, k, getattr(m, k))
                if m.aborted or m.error_ratio > self.settings.max_error_ratio:
                    why = m.aborted or f"error ratio {m.error_ratio:.2%} > {self.settings.max_error_ratio:.2%}"
                    rec.result = "errors"
                    rec.message = f"{why}; {await self._restore_last_good(going_on=True)}"
                    self._count(t.value, "errors")
                else:
                    self._count(t.value, "ok", m)
        rec.seconds = time.monotonic() - t0
        return rec


def _progress_line(r: TrialRecord, done: int, planned: int) -> str:
    head = f"[{done:3d}/{planned}] round {r.round + 1} keepalive_timeout={r.value:g}s"
    if r.result != "ok":
        return f"{head}: {r.result.upper()} {r.message}"
    extra = ""
    if r.idle_connections is not None:
        extra += f" idle={r.idle_connections:.0f}"
    if r.accepts_per_request is not None:
        extra += f" new-conn/req={r.accepts_per_request:.2f}"
    mean_s, p95_s, memory_bytes = r.mean_s or 0.0, r.p95_s or 0.0, r.memory_bytes or 0.0  # all set when ok
    return (f"{head}: mean {mean_s * 1000:.2f} ms p95 {p95_s * 1000:.1f} ms mem {memory_bytes / 1024:.0f} KiB "
            f"({r.memory_method}) reqs {r.requests} fail {r.failures}{extra} [{r.seconds:.0f}s]")


# ------------------------------------------------------------------------------ active


_STUB = re.compile(r"Active connections:\s*(\d+).*?(\d+)\s+(\d+)\s+(\d+).*?Reading:\s*(\d+)\s+Writing:\s*(\d+)\s+Waiting:\s*(\d+)", re.S)


def parse_stub_status(text: str) -> dict[str, int]:
    """nginx ``stub_status`` page -> active, accepts, handled, requests, reading, writing, waiting."""
    m = _STUB.search(text)
    if m is None:
        raise ValueError("not an nginx stub_status page")
    keys = ("active", "accepts", "handled", "requests", "reading", "writing", "waiting")
    return dict(zip(keys, map(int, m.groups())))


def read_stub_status(url: str, timeout: float = 2.0) -> dict[str, int]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - operator-given URL
        return parse_stub_status(resp.read().decode(errors="replace"))


def stub_figures(stubs: Sequence[dict[str, int]]) -> tuple[float | None, float | None]:
    """(mean idle keepalive connections, new connections per request) from stub_status readings.

    Each reading is itself one new connection and one request, so those are subtracted.
    """
    if not stubs:
        return None, None
    waiting = statistics.fmean(s["waiting"] for s in stubs)
    if len(stubs) < 2:
        return waiting, None
    first, last, reads = stubs[0], stubs[-1], len(stubs) - 1
    reqs = last["requests"] - first["requests"] - reads
    if reqs <= 0:
        return waiting, None
    return waiting, max(0, last["accepts"] - first["accepts"] - reads) / reqs


class LoadMeasurer:
    """Active measurement: Locust thinking clients + sampled nginx memory (+ stub_status)."""

    def __init__(
        self,
        ctl: NginxControl,
        url: str,
        *,
        users: int = 300,
        spawn_rate: float = 30,
        duration_s: float = 20,
        think_min: float = 0.5,
        think_max: float = 8.0,
        stub_status_url: str | None = None,
        sample_interval: float = 0.5,
        paths: Sequence[str] | None = None,
        memory_scope: str = "all",
        memory_method: Method | None = None,
    ):
        if memory_scope not in ("all", "workers"):
            raise ValueError("memory_scope must be 'all' (master + workers) or 'workers'")
        self.paths = tuple(paths) if paths else None
        self.memory_scope = memory_scope
        self.memory_method = memory_method
        self.ctl, self.url, self.users, self.spawn_rate = ctl, url, users, spawn_rate
        self.duration_s, self.think_min, self.think_max = duration_s, think_min, think_max
        self.stub_status_url = stub_status_url
        self.sample_interval = sample_interval

    def _memory(self):  # noqa: ANN202
        if self.memory_scope == "workers":
            return group_memory(self.ctl.workers(), method=self.memory_method)
        return nginx_memory(self.ctl.master_pid(), method=self.memory_method)

    def _measure(self, value: float) -> Measurement:
        stop = threading.Event()
        mem: list[float] = []
        stubs: list[dict[str, int]] = []
        methods: set[str] = set()
        # Users arrive over a ramp of users/spawn_rate seconds (a smooth arrival: a herd of
        # simultaneous first requests would set the worker's heap peak, and glibc keeps it).
        # Locust resets its statistics when the ramp ends, so ``duration_s`` is the measured
        # window after it. Memory and stub_status are sampled from a third into that window on
        # (Locust's own start-up delays the ramp by a second or two), once the idle population
        # has built up; handshakes per request are counted between the first and last reading.
        ramp = self.users / self.spawn_rate if self.spawn_rate > 0 else 0.0

        def sampler() -> None:
            t0 = time.monotonic()
            while not stop.wait(self.sample_interval):
                elapsed = time.monotonic() - t0
                try:
                    if elapsed < ramp + self.duration_s / 3:
                        continue
                    if self.stub_status_url:
                        stubs.append(read_stub_status(self.stub_status_url))
                    reading = self._memory()
                    mem.append(reading.total_bytes)
                    methods.add(reading.method)
                except (OSError, ValueError, ProcessLookupError):
                    continue

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        try:
            load = run_load(self.url, self.users, self.spawn_rate, ramp + self.duration_s, self.think_min, self.think_max, paths=self.paths)
        finally:
            stop.set()
            th.join(timeout=10)
        if not mem:
            reading = self._memory()
            mem, methods = [reading.total_bytes], {reading.method}
        if self.memory_scope == "workers":
            methods = {f"{m} workers" for m in methods}
        return Measurement(
            load.mean_ms / 1000, load.p95_ms / 1000, statistics.fmean(mem), "+".join(sorted(methods)),
            load.requests, load.failures, *stub_figures(stubs),
        )

    async def __call__(self, value: float) -> Measurement:
        try:
            return await asyncio.to_thread(self._measure, value)
        except asyncio.CancelledError:  # (Ctrl-C, SIGTERM): end the load the thread waits for
            stop_loads()
            raise


# ------------------------------------------------------------------------------ output


def write_results(result: SweepResult, out_dir: Path, name: str = "sweep", title: str = "") -> dict[str, Path]:
    """``<name>.json``, ``<name>-trials.csv`` and ``<name>-pareto.png`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json", "csv": out_dir / f"{name}-trials.csv", "png": out_dir / f"{name}-pareto.png"}
    atomic_write_json(paths["json"], result.to_json())
    rows = [{k: getattr(r, k) for k in TrialRecord.CSV_FIELDS} for r in result.records]
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=TrialRecord.CSV_FIELDS)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(paths["csv"], buf.getvalue())
    if result.points:
        plot_pareto(result, paths["png"], title)
    else:
        del paths["png"]
    return paths


def plot_pareto(result: SweepResult, path: Path, title: str = "") -> None:
    """Memory vs mean response time, one point per candidate with its intervals; front highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result.points
    front = set(result.choice.front) if result.choice else set()
    fig, ax = plt.subplots(figsize=(8, 6), dpi=110)
    for p in pts:
        on = p.value in front
        xerr = None if not math.isfinite(p.rt.low) else [[(p.rt.mean - p.rt.low) * 1000], [(p.rt.high - p.rt.mean) * 1000]]
        yerr = None if not math.isfinite(p.mem.low) else [[(p.mem.mean - p.mem.low) / 1024], [(p.mem.high - p.mem.mean) / 1024]]
        ax.errorbar(p.rt.mean * 1000, p.mem.mean / 1024, xerr=xerr, yerr=yerr, fmt="o",
                    color="tab:red" if on else "tab:blue", ecolor="lightgray", elinewidth=1, capsize=2,
                    markersize=8 if on else 5, zorder=3 if on else 2)
        ax.annotate(f"{p.value:g}", (p.rt.mean * 1000, p.mem.mean / 1024), textcoords="offset points", xytext=(5, 4), fontsize=8)
    fp = sorted((p for p in pts if p.value in front), key=lambda p: p.rt.mean)
    if len(fp) > 1:
        ax.plot([p.rt.mean * 1000 for p in fp], [p.mem.mean / 1024 for p in fp], "--", color="tab:red", lw=1, zorder=1)
    if result.choice:
        c = next((p for p in pts if p.value == result.choice.value), None)
        if c is not None:
            ax.scatter([c.rt.mean * 1000], [c.mem.mean / 1024], s=260, facecolors="none", edgecolors="black", lw=1.5, zorder=4,
                       label=f"applied: {c.value:g} s" + (" (kept current)" if result.choice.kept_current else ""))
    ax.scatter([], [], color="tab:red", label="Pareto front (means)")
    ax.scatter([], [], color="tab:blue", label="dominated")
    ax.set_xlabel("mean response time (ms)")
    method = next((r.memory_method for r in result.records if r.memory_method), "pss")
    scope = "workers" if "workers" in method else "master + workers"
    ax.set_ylabel(f"nginx memory, {method.split()[0].upper()} summed over {scope} (KiB)")
    ax.set_title(title or "keepalive_timeout candidates (labels: seconds; bars: 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summary_table(result: SweepResult) -> str:
    """Plain-text table of the candidates, the front and the decision."""
    front = set(result.choice.front) if result.choice else set()
    lines = [
        f"{'value':>6} {'n':>2} {'mean ms':>8} {'95% CI':>17} {'p95 ms':>7} {'memory KiB':>10} {'95% CI':>19} "
        f"{'idle':>6} {'new/req':>7} {'score':>6}  front",
    ]
    for p in result.points:
        ex = summary_extras(result.records, p.value)
        ci_rt = f"[{p.rt.low * 1000:.2f}, {p.rt.high * 1000:.2f}]" if math.isfinite(p.rt.low) else "n/a"
        ci_m = f"[{p.mem.low / 1024:.0f}, {p.mem.high / 1024:.0f}]" if math.isfinite(p.mem.low) else "n/a"
        score = result.choice.scores.get(p.value, math.nan) if result.choice else math.nan
        idle = f"{ex['idle_connections']:.0f}" if ex["idle_connections"] is not None else "-"
        apr = f"{ex['accepts_per_request']:.2f}" if ex["accepts_per_request"] is not None else "-"
        p95 = f"{ex['p95_mean_s'] * 1000:.1f}" if ex["p95_mean_s"] is not None else "-"
        mark = ("*" if p.value in front else "") + (" <- chosen" if result.choice and p.value == result.choice.value else "") + (
            " (current)" if p.value == result.current else "")
        lines.append(f"{p.value:>6g} {p.rt.n:>2} {p.rt.mean * 1000:>8.2f} {ci_rt:>17} {p95:>7} {p.mem.mean / 1024:>10.0f} {ci_m:>19} "
                     f"{idle:>6} {apr:>7} {score:>6.3f}  {mark}")
    if result.dropped:
        lines.append("dropped: " + "; ".join(f"{v:g} ({why})" for v, why in sorted(result.dropped.items())))
    if result.choice:
        lines.append(f"front: {', '.join(f'{v:g}' for v in result.choice.front)}; rule pick: {result.choice.best:g}")
        lines.append(f"decision: {result.choice.reason}")
    lines.append(f"load runs: {result.runs_used} of {result.runs_planned} planned; {result.final}")
    return "\n".join(lines)
