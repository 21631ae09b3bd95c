"""Reproduce session-level queue scheduling (seed 002) on this machine, and check its targets.

Arms (:mod:`bench.admission.arms`): no control, nginx ``limit_conn``/``limit_req``, the
admission proxy with its page scheduler only, and the full scheme (page + session scheduler),
each in front of the same 7-page app (:mod:`bench.admission.app`: real CPU work in a bounded
pool of worker processes), loaded by the paper's session clients (:mod:`bench.admission.locustfile`:
think time, client timeout, retry from the first page).

Steps (each under the machine's heavy lock, ``--lock``, one client count at a time so every arm
of a count runs back to back, the arm order alternating between counts):
1. calibration: the app's throughput by concurrency (closed loops of 2, 4, 8, 16 clients with
   no think time, arm ``none``: it rises to a peak, then falls as the app's contention model
   bites, :mod:`bench.admission.contention`); capacity = the peak, in sessions/s;
   saturation = the client count whose light-load offered rate equals it:
   ``N_sat = capacity x (7 x think + session CPU)``; nginx's limits are set from it too;
2. the sweep, condition ``base`` (think 3 s, timeout 60 s): ``--multiples`` x N_sat clients,
   every arm; then the paper's variations ``timeout30`` and ``think1`` at ``--var-multiples``
   (the same client counts, as the paper's figures keep their x axis);
3. the proxy's overhead (:mod:`bench.admission.overhead`): added latency at 1,000 req/s beside
   the app alone, and its ceiling per core;
4. the report: ``summary.json``, ``summary.md``, ``sessions.png`` (completed sessions/s vs
   clients, per arm, per condition), ``failures.png`` (failed sessions by page at 1x and 4x),
   ``responses.png`` (median response time over elapsed time at 1x and 4x), ``scheduler.png``
   (admission interval, queues and page concurrency limits over time at the largest count).

The app's contention model (:mod:`bench.admission.contention`: shared cache, working sets, miss
penalty) is declared in that module, printed in every summary, and can be changed only on the
command line (``--cache-mb``, ``--miss-penalty``, ``--working-sets``; ``--cache-mb 0``: the old
fixed-cost app).

Every duration is scaled by ``--scale`` (see :mod:`bench.admission.pages`). A point is counted
over the same window in every arm (:mod:`bench.admission.counting`). Points already measured
(same scale and clients, in ``raw/``) are kept, so the sweep can be run in chunks
(``--conditions``, ``--multiples``); ``--fresh`` starts over, ``--report-only`` just rebuilds
the report.

    flock /tmp/promreflex-heavy.lock uv run --frozen python -m bench.admission      # ~25 min
    uv run --frozen python -m bench.admission --lock /tmp/promreflex-heavy.lock     # same, lets others in between counts
    uv run --frozen python -m bench.admission --demo                                # the flash crowd, ~2.5 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.admission import contention, plot
from bench.admission.app import calibrate_iters_per_ms
from bench.admission.arms import ARM_LABELS, ARMS, ArmStack, NginxLimits, proxy_config
from bench.admission.contention import CacheModel
from bench.admission.counting import Events, count, per_second, read_events, rt_timeline, window_after_start
from bench.admission.load import ClientModel, Clients, locust_argv
from bench.admission.overhead import CpuMeter, added, closed_loop, cpu_seconds, mean_conditions, open_loop
from bench.admission.pages import PAGES, PAPER_THINK_S, PAPER_TIMEOUT_S, SESSION_PAPER_MS, STATIC_PATH
from bench.admission.repeats import Step, aggregate, rep_of, schedule
from bench.conditions import ChunkedLock, HostSampler, describe, heavy_lock, parse_deadline
from bench.unwind import interrupt_once

RESULTS = Path(__file__).resolve().parents[1] / "results" / "admission"
CONDITIONS: dict[str, tuple[float, float]] = {  # name: (think, timeout) in the paper's seconds
    "base": (PAPER_THINK_S, PAPER_TIMEOUT_S),
    "timeout30": (PAPER_THINK_S, 30.0),
    "think1": (1.0, PAPER_TIMEOUT_S),
}
PER_HTTP_REQUEST_S = 0.001  # fixed cost of one request on this machine (nginx, HTTP, pool), not scaled


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Settings:
    scale: float = 0.1
    workers: int = 16
    warmup_paper_s: float = 80.0  # before the window: more than one client timeout
    window_paper_s: float = 200.0
    tail_paper_s: float = 20.0  # clients run on after the window, so its end is not cut
    conditions: tuple[str, ...] = ("base", "timeout30", "think1")
    arms: tuple[str, ...] = ARMS
    multiples: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 4.0)
    var_multiples: tuple[float, ...] = (1.0, 4.0)
    conn_per_core: int = 4
    proxy_overrides: dict[str, Any] = field(default_factory=dict)
    cache: CacheModel = field(default_factory=CacheModel)  # the app's contention model, declared
    out: Path = RESULTS
    lock: Path | None = None
    repeat: int = 1  # runs of every point (--repeat); the report uses their means
    deadline: float | None = None  # Unix seconds: no point starts that would end after it

    def s(self, paper_seconds: float) -> float:
        return paper_seconds * self.scale

    def model(self, condition: str) -> ClientModel:
        think, timeout = CONDITIONS[condition]
        return ClientModel(think_s=self.s(think), timeout_s=self.s(timeout))

    @property
    def session_cpu_s(self) -> float:
        return self.s(SESSION_PAPER_MS / 1000.0)


# ---------------------------------------------------------------- running one point

def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback we started
        return json.load(resp)


def _proxy_counters(control_url: str) -> dict[str, float]:
    """A few of the proxy's own counters, summed over labels (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"sessions_admitted", "sessions_completed", "sessions_abandoned", "sessions_rejected", "requests"}
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"{control_url}/metrics", timeout=2) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
    except OSError:
        return out
    for fam in text_string_to_metric_families(text):
        short = fam.name.removeprefix("promreflex_admission_")
        if short not in wanted:
            continue
        for sample in fam.samples:
            if not sample.name.endswith("_total"):
                continue
            key = short
            if short == "requests":
                key = f"requests_{sample.labels.get('outcome', '')}"
            elif short in ("sessions_abandoned", "sessions_rejected"):
                key = f"{short}_{sample.labels.get('page') or sample.labels.get('reason', '')}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


class StateSampler:
    """The full scheme's scheduler state over time (the paper's last figure), every ``every`` s."""

    def __init__(self, control_url: str, every: float):
        import threading

        self.url, self.every, self.rows = control_url, every, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                st = _get_json(f"{self.url}/api/v1/state", timeout=1)
            except (OSError, ValueError):
                continue
            self.rows.append({"t": time.time(), "state": st})

    def __enter__(self) -> StateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=3)


def run_clients(stack: ArmStack, stages: str, run_for: float, model: ClientModel, workdir: Path,
                name: str, stagger: bool, arrival_rate: float) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """Clients against ``stack`` for ``run_for`` s; (event file, host conditions, proxy state samples)."""
    events = workdir / f"{name}.jsonl"
    events.unlink(missing_ok=True)
    clients = Clients(locust_argv(stack.url, stages, run_for, model, events, arrival_rate, stagger),
                      workdir / f"{name}.locust.log", run_for)
    groups = stack.pid_sources()
    groups["clients"] = lambda: [clients.pid]
    states: list[dict[str, Any]] = []
    with HostSampler(groups=groups) as host:
        clients.start()
        try:
            if stack.has_proxy:
                with StateSampler(stack.control_url, max(0.1, model.think_s)) as sampler:
                    clients.wait()
                states = sampler.rows
            else:
                clients.wait()
        finally:
            clients.kill()
    return events, host.summary(), states


def run_point(st: Settings, cal: dict[str, Any], condition: str, arm: str, clients: int, multiple: float,
              rep: int = 0) -> dict[str, Any]:
    model = st.model(condition)
    warmup, window = st.s(st.warmup_paper_s), st.s(st.window_paper_s)
    stack = ArmStack(arm, st.scale, st.workers, cal["iters_per_ms"], limits=nginx_limits(cal, st),
                     proxy_overrides=st.proxy_overrides, cache=st.cache).start()
    raw = st.out / "raw" / "events"
    raw.mkdir(parents=True, exist_ok=True)
    name = f"{condition}-{arm}-{clients}" + (f"-r{rep}" if rep else "")
    try:
        events, host, states = run_clients(stack, f"0:{clients}", warmup + window + st.s(st.tail_paper_s), model,
                                           raw, name, stagger=True, arrival_rate=max(20.0, clients / 2.0))
        app_stats = _get_json(f"{stack.app_url}/stats")
        proxy = _proxy_counters(stack.control_url) if stack.has_proxy else {}
    finally:
        stack.stop()
        stack.cleanup()
    ev = read_events(events)
    counted = count(ev, window_after_start(ev, warmup, window))
    t0 = ev.started or 0.0
    row = {"condition": condition, "arm": arm, "clients": clients, "multiple": multiple, "rep": rep, **counted,
           "rt_timeline": rt_timeline(ev, t0, t0 + warmup + window + st.s(st.tail_paper_s), 1.0),
           **app_shares(app_stats),
           "proxy": proxy, "host": host, "bad_lines": ev.bad_lines}
    if states:
        (st.out / "raw" / f"state-{name}.json").write_text(json.dumps(states))
    return row


def app_shares(app_stats: dict[str, Any]) -> dict[str, float]:
    """From the app's /stats: the share of its base page work served to clients already gone
    (wasted), and the share of its CPU that cache misses cost (contention)."""
    pages = app_stats["pages"]
    wasted_ms = sum(p["wasted_ms"] for p in pages.values())
    base_ms = sum(p["served"] * app_stats["cost_ms"][k] for k, p in pages.items())
    extra_ms = sum(p.get("extra_ms", 0.0) for p in pages.values())
    return {"app_wasted_cpu_share": wasted_ms / max(1e-9, base_ms),
            "app_contention_share": extra_ms / max(1e-9, base_ms + extra_ms)}


def progress(row: dict[str, Any]) -> str:
    fp = row["failed_by_page"]
    start, mid = fp.get("1", 0), row["abandoned"]
    p99 = row["rt_ok_p99_s"]
    h = row["host"]
    run = f" run {row['rep'] + 1}" if row.get("rep") else ""
    return (f"{row['condition']:<9} {row['clients']:>4} clients ({row['multiple']:g}x){run} {row['arm']:<11} "
            f"completed {row['completed_per_s']:6.2f}/s  failed start {start:>4} mid {mid:>4}  "
            f"p50 {fmt_s(row['rt_ok_p50_s'])} p99 {fmt_s(p99)}  wasted {row['wasted_share']:.0%}  "
            f"misses {row.get('app_contention_share') or 0:.0%} of app CPU  "
            f"CPU busy {h.get('cpu_busy_pct') or 0:.0f}% steal {h.get('cpu_steal_pct') or 0:.0f}%")


def fmt_s(v: float | None) -> str:
    if v is None:
        return "   -  "
    return f"{v * 1000:5.0f}ms" if v < 1 else f"{v:5.1f}s "


# ---------------------------------------------------------------- calibration

def nginx_limits(cal: dict[str, Any], st: Settings) -> NginxLimits:
    rate = max(1, round(cal["capacity_sessions_per_s"] * len(PAGES)))
    return NginxLimits(rate_per_s=rate, burst=rate, conn=st.conn_per_core * cal["cores"])


CAL_LEVELS = (2, 4, 8, 16)  # closed-loop clients (= requests in the app) of the calibration


def calibrate(st: Settings, levels: tuple[int, ...] = CAL_LEVELS, stage_s: float = 5.0,
              settle_s: float = 1.5) -> dict[str, Any]:
    """The app's throughput by concurrency (one closed loop of ``levels`` clients after the
    other, no think time, ``stage_s`` each, counted after ``settle_s``), its peak = the
    capacity in sessions/s, and the saturating client count."""
    import psutil

    ipm = calibrate_iters_per_ms()
    stack = ArmStack("none", st.scale, st.workers, ipm, cache=st.cache).start()
    work = st.out / "raw" / "events"
    work.mkdir(parents=True, exist_ok=True)
    model = ClientModel(think_s=0.0, timeout_s=60.0)
    stages = ",".join(f"{i * stage_s:g}:{n}" for i, n in enumerate(levels))
    try:
        events, host, _ = run_clients(stack, stages, stage_s * len(levels), model, work, "calibration",
                                      stagger=False, arrival_rate=100.0)
    finally:
        stack.stop()
        stack.cleanup()
    curve = by_concurrency(read_events(events), levels, stage_s, settle_s)
    capacity = max(r["sessions_per_s"] for r in curve)
    base = st.model("base")
    cycle = base.cycle_s(st.session_cpu_s + len(PAGES) * PER_HTTP_REQUEST_S)
    return {"iters_per_ms": round(ipm, 2), "capacity_sessions_per_s": round(capacity, 2),
            "capacity_requests_per_s": round(capacity * len(PAGES), 1), "cycle_s": round(cycle, 3),
            "n_sat": max(1, round(capacity * cycle)), "cores": psutil.cpu_count() or 2, "host": host,
            "by_concurrency": curve, "cache": st.cache.as_dict(),
            "scale": st.scale, "workers": st.workers, "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def by_concurrency(ev: Events, levels: tuple[int, ...], stage_s: float, settle_s: float) -> list[dict[str, Any]]:
    """Throughput of each stage of the calibration (``levels[i]`` clients from ``i x stage_s``),
    counted after ``settle_s``: answered requests/s, and sessions/s = that / pages per session."""
    curve = []
    for i, n in enumerate(levels):
        c = count(ev, window_after_start(ev, i * stage_s + settle_s, stage_s - settle_s))
        curve.append({"clients": n, "sessions_per_s": round(c["ok_per_s"] / len(PAGES), 2),
                      "requests_per_s": round(c["ok_per_s"], 1), "rt_p50_s": c["rt_ok_p50_s"]})
    return curve


def curve_text(cal: dict[str, Any]) -> str:
    """``2: 24.1, 4: 25.7, 8: 12.0, 16: 7.5`` (clients in the app: sessions/s)."""
    return ", ".join(f"{r['clients']}: {r['sessions_per_s']:g}" for r in cal.get("by_concurrency") or [])


# ---------------------------------------------------------------- the sweep

def _raw_path(st: Settings, name: str) -> Path:
    return st.out / "raw" / f"{name}.json"


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def client_counts(cal: dict[str, Any], multiples: tuple[float, ...]) -> list[tuple[float, int]]:
    return [(m, max(1, round(m * cal["n_sat"]))) for m in multiples]


def point_seconds(st: Settings) -> float:
    """Wall time of one point: the clients' run plus about 4 s to start and stop the processes."""
    return st.s(st.warmup_paper_s + st.window_paper_s + st.tail_paper_s) + 4.0


def plan(st: Settings, with_overhead: bool) -> list[tuple[str, float]]:
    """The order of the steps, most telling first (the lock may not come back soon): the base
    condition's first three counts (1x, 4x, 2x by default), each variation's first count, the
    overhead, then the rest."""
    base = [("base", m) for m in st.multiples] if "base" in st.conditions else []
    var = [[(c, m) for m in st.var_multiples] for c in st.conditions if c != "base"]
    first = base[:3] + [v[0] for v in var if v]
    rest = base[3:] + [x for v in var for x in v[1:]]
    return first + ([("overhead", 0.0)] if with_overhead else []) + rest


def sweep(st: Settings, cal: dict[str, Any] | None, lock: ChunkedLock, steps: list[Step]) -> list[str]:
    """Run ``steps`` (:func:`bench.admission.repeats.schedule`); returns the steps left out
    because they would have ended after ``st.deadline``."""
    announced: set[str] = set()
    skipped: list[str] = []
    for condition, m, rep, flip in steps:
        if condition == "overhead":
            if not fits(st, OVERHEAD_S):
                skipped.append("overhead")
                continue
            lock.need(OVERHEAD_S)
            log("overhead: 1,000 req/s direct vs through the proxy (four paths), then the proxy's ceiling"
                + (f" (run {rep + 1})" if rep else ""))
            if rep == 0:  # a new series of runs: none of an older one's stays in the report
                for old in (st.out / "raw").glob("overhead-r*.json"):
                    old.unlink()
            ov = overhead(st)
            _raw_path(st, "overhead" + (f"-r{rep}" if rep else "")).write_text(json.dumps(ov, indent=1))
            continue
        assert cal is not None
        path = _raw_path(st, condition)
        rows: list[dict[str, Any]] = [r for r in (load_json(path) or [])  # same app, same time scale
                                      if r.get("scale") == st.scale and r.get("cache") == st.cache.as_dict()]
        n = client_counts(cal, (m,))[0][1]
        model = st.model(condition)
        if condition not in announced:
            announced.add(condition)
            log(f"condition {condition}: think {model.think_s:g}s, timeout {model.timeout_s:g}s (paper "
                f"{CONDITIONS[condition][0]:g}s/{CONDITIONS[condition][1]:g}s x scale {st.scale:g})")
        done = {(r["arm"], r["clients"], rep_of(r)) for r in rows}
        arms = [a for a in (tuple(reversed(st.arms)) if flip else st.arms) if (a, n, rep) not in done]
        if not arms:
            continue
        if not fits(st, point_seconds(st) * len(arms)):
            skipped.append(f"{condition} {m:g}x run {rep + 1}")
            log(f"skipping {condition} {m:g}x run {rep + 1}: it would end after the deadline")
            continue
        lock.need(point_seconds(st) * len(arms))
        for arm in arms:
            row = run_point(st, cal, condition, arm, n, m, rep)
            row["scale"], row["cache"] = st.scale, st.cache.as_dict()
            rows = [r for r in rows if (r["arm"], r["clients"], rep_of(r)) != (arm, n, rep)] + [row]
            path.write_text(json.dumps(rows, indent=1))
            log(progress(row))
    return skipped


OVERHEAD_S = 150.0  # wall time of the overhead step, about


def fits(st: Settings, seconds: float, now: float | None = None) -> bool:
    """Whether a step of ``seconds`` ends before ``st.deadline`` (always, without one)."""
    return st.deadline is None or (time.time() if now is None else now) + seconds <= st.deadline


# ---------------------------------------------------------------- overhead

#: The overhead's third path: the session page through a second proxy whose page limits start
#: (and stay) above any burst of this load, so the row shows the proxy's own cost per request
#: apart from the page scheduler's queueing at its (deliberately low) initial limit.
UNBOUND = {"page_scheduler.initial_limit": 64}


def event_loop_of(proxy_log: Path) -> str:
    """The event loop a proxy runs on, from its start line (``... event loop uvloop``): what
    it really used, the fallback to asyncio included."""
    try:
        m = re.search(r"event loop (\S+)", proxy_log.read_text(errors="replace"))
    except OSError:
        return "unknown"
    return m.group(1) if m else "unknown"


def page_waits(control_url: str, page: str) -> dict[str, float]:
    """How many requests of ``page`` the proxy counted in its page-queue wait histogram, and how
    many of them waited more than 1 ms (prometheus_client's parser)."""
    try:
        with urllib.request.urlopen(f"{control_url}/metrics", timeout=2) as resp:  # noqa: S310 - loopback
            return waits_in(resp.read().decode(), page)
    except OSError:
        return {"requests": 0.0, "waited_over_1ms": 0.0}


def waits_in(text: str, page: str) -> dict[str, float]:
    """:func:`page_waits` from a /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"requests": 0.0, "waited_over_1ms": 0.0}
    for fam in text_string_to_metric_families(text):
        if fam.name != "promreflex_admission_page_queue_wait_seconds":
            continue
        for sample in fam.samples:
            if sample.labels.get("page") != page:
                continue
            if sample.name.endswith("_count"):
                out["requests"] = sample.value
            elif sample.name.endswith("_bucket") and float(sample.labels.get("le", "nan")) == 0.001:
                out["waited_over_1ms"] = -sample.value  # the count is added below
    out["waited_over_1ms"] += out["requests"]
    return out


def overhead(st: Settings, rate: float = 1000.0, block_s: float = 5.0, rounds: int = 3,
             ceiling_s: float = 5.0) -> dict[str, Any]:
    """Added latency at ``rate`` req/s (proxy vs app alone, alternating blocks) and the ceiling.

    Four paths: ``static`` (exempt), ``page`` (a session page through the proxy with its shipped
    defaults), ``page_unbound`` (the same page through a second proxy whose page limit starts
    at 64, :data:`UNBOUND`): the difference between the two is the page scheduler queueing
    bursts at its initial limit of 4, not the cost of the proxy's code; and ``page_inline``
    (the session page answered without the app's process pool, see
    :mod:`bench.admission.overhead`)."""
    started = time.strftime("%H:%M:%S", time.gmtime())
    stack = ArmStack("full", st.scale, st.workers, 1.0, with_nginx=False, app_scale=0.0, cache=CacheModel(budget_mb=0),
                     proxy_overrides={"page_scheduler.timeout": 10.0, **st.proxy_overrides}).start()
    results: dict[str, dict[str, Any]] = {}
    waits: dict[str, dict[str, float]] = {}
    try:
        unbound_port, unbound_control = stack.add_proxy("proxy-unbound", UNBOUND)
        loop_name = event_loop_of(stack.workdir / "proxy.log")
        paths = {"static": (STATIC_PATH, None, stack.proxy_port), "page": (PAGES[1].path, PAGES[0].path, stack.proxy_port),
                 "page_unbound": (PAGES[1].path, PAGES[0].path, unbound_port),
                 "page_inline": (PAGES[1].path + "?inline=1", PAGES[0].path, stack.proxy_port)}
        controls = {"page": stack.control_url, "page_unbound": f"http://127.0.0.1:{unbound_control}"}
        pids = stack.pids()
        proxy_pid_of = {stack.proxy_port: pids["proxy"][0], unbound_port: pids["proxy-unbound"][0]}
        conditions: dict[str, list[dict[str, Any]]] = {}
        with HostSampler(groups=stack.pid_sources()) as host:
            for path, login, proxy_port in paths.values():  # warm every path
                for port in (stack.app_port, proxy_port):
                    asyncio.run(open_loop("127.0.0.1", port, path, rate, 1.0, login=login if port == proxy_port else None))
            waits_before = {name: page_waits(url, PAGES[1].name) for name, url in controls.items()}
            pooled: dict[tuple[str, str], list[float]] = {}
            for r in range(rounds):
                for name, (path, login, proxy_port) in paths.items():
                    order = [("direct", stack.app_port), ("proxy", proxy_port)]
                    for via, port in (order if r % 2 == 0 else order[::-1]):
                        procs = {"generator": os.getpid(), "app": pids["app"][0]}
                        if via == "proxy":
                            procs["proxy"] = proxy_pid_of[proxy_port]
                        with CpuMeter(procs, alone={"generator"}) as meter:
                            res = asyncio.run(open_loop("127.0.0.1", port, path, rate, block_s,
                                                        login=login if via == "proxy" else None))
                        pooled.setdefault((name, via), []).extend(res.latencies)
                        key = f"{name}/{via}"
                        acc = results.setdefault(key, {"sent": 0, "errors": 0, "seconds": 0.0})
                        acc["sent"] += res.sent
                        acc["errors"] += res.errors
                        acc["seconds"] += res.seconds
                        conditions.setdefault(key, []).append({"cores": meter.cores, "busy_pct": meter.busy_pct,
                                                               "runq_ms_per_s": meter.runq_ms_per_s})
                        log(f"overhead round {r + 1}/{rounds} {key}: {res.summary()}; CPU cores "
                            + ", ".join(f"{k} {v:.2f}" for k, v in meter.cores.items()) + f", host busy {meter.busy_pct:.0f}%"
                            + "; waiting for a CPU (ms/s) " + ", ".join(f"{k} {v:.0f}" for k, v in meter.runq_ms_per_s.items()))
            from bench.admission.counting import percentile

            for name, url in controls.items():
                after = page_waits(url, PAGES[1].name)
                waits[name] = {k: after[k] - waits_before[name][k] for k in after}
                waits[name]["waited_share"] = round(waits[name]["waited_over_1ms"] / max(1.0, waits[name]["requests"]), 4)
            for (name, via), lat in pooled.items():
                acc = results[f"{name}/{via}"]
                acc["ok"] = len(lat)
                acc["rate"] = round(len(lat) / acc["seconds"], 1) if acc["seconds"] else 0.0
                acc["p50_ms"] = _ms(percentile(lat, 50))
                acc["p99_ms"] = _ms(percentile(lat, 99))
                acc["conditions"] = mean_conditions(conditions.get(f"{name}/{via}", []))
            ceiling = {}
            proxy_pid = stack.pids()["proxy"][0]
            for name, (path, login, _) in paths.items():
                if name == "page_unbound":  # the same proxy code as page
                    continue
                before = cpu_seconds(proxy_pid)
                res = asyncio.run(closed_loop("127.0.0.1", stack.proxy_port, path, ceiling_s, conns=64, login=login))
                used = cpu_seconds(proxy_pid) - before
                s = res.summary()
                ceiling[name] = {**s, "proxy_cpu_s": round(used, 2), "proxy_cores": round(used / res.seconds, 2),
                                 "per_core": round(len(res.latencies) / used) if used > 0 else None}
                log(f"ceiling {name}: {s['rate']:.0f} req/s with the proxy using {used / res.seconds:.2f} cores "
                    f"-> {ceiling[name]['per_core']} req/s per core")
    finally:
        stack.stop()
        stack.cleanup()
    return {"rate": rate, "block_s": block_s, "rounds": rounds, "paths": {k: v[0] for k, v in paths.items()},
            "started_utc": started, "ended_utc": time.strftime("%H:%M:%S", time.gmtime()),
            "event_loop": loop_name, "runs": results, "page_queue_waits": waits, "unbound_overrides": UNBOUND,
            "added": {name: added(results[f"{name}/direct"], results[f"{name}/proxy"]) for name in paths},
            "ceiling": ceiling, "host": host.summary()}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


# ---------------------------------------------------------------- the report

def targets(base_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, from the base condition: at the largest count (4x), the full scheme
    keeps >= 90 % of its peak completed sessions/s (and of the best arm's peak), and fails
    sessions only at their first page. With repeated points every figure is the mean of the
    runs (:func:`bench.admission.repeats.aggregate`), the peak is the highest mean, the ratios'
    spread is each run at the top count over that peak, and a mid-session failure in any run
    counts."""
    out: dict[str, Any] = {}
    if not base_rows:
        return out
    means = aggregate(base_rows)
    top = max(r["multiple"] for r in means)
    best_peak = max(r["completed_per_s"] for r in means)
    for arm in ARMS:
        rows = [r for r in means if r["arm"] == arm]
        at_top = [r for r in rows if r["multiple"] == top]
        if not rows or not at_top:
            continue
        peak_row = max(rows, key=lambda r: r["completed_per_s"])
        peak = peak_row["completed_per_s"]
        t = at_top[0]
        c = t["completed"]
        out[arm] = {"multiple": top, "clients": t["clients"], "completed_per_s": round(t["completed_per_s"], 2),
                    "runs": c["n"], "sd_per_s": round(c["sd"], 2), "min_per_s": round(c["min"], 2),
                    "max_per_s": round(c["max"], 2),
                    "peak_per_s": round(peak, 2), "peak_multiple": peak_row["multiple"],
                    "of_own_peak": round(t["completed_per_s"] / peak, 3) if peak else None,
                    "of_own_peak_runs": [round(v / peak, 3) for v in t["runs"]] if peak else None,
                    "of_best_peak": round(t["completed_per_s"] / best_peak, 3) if best_peak else None,
                    "failed_start": round(t["failed_by_page"].get("1", 0), 1), "failed_mid": round(t["abandoned"], 1),
                    "failed_mid_max": t["abandoned_max"]}
    full = out.get("full")
    if full:
        out["verdict"] = {"keeps_90pct_of_own_peak": bool(full["of_own_peak"] and full["of_own_peak"] >= 0.9),
                          "keeps_90pct_of_best_peak": bool(full["of_best_peak"] and full["of_best_peak"] >= 0.9),
                          "failures_only_at_start": full["failed_mid_max"] == 0}
    return out


def compact(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("condition", "arm", "clients", "multiple", "window_s", "completed", "completed_per_s", "failed",
            "failed_by_page", "failed_by_group", "failed_by_reason", "abandoned", "ok_per_s", "wasted_share",
            "app_wasted_cpu_share", "app_contention_share", "rt_ok_p50_s", "rt_ok_p90_s", "rt_ok_p99_s",
            "rt_all_p99_s", "rt_by_page", "session_p50_s", "proxy", "rt_timeline")
    out = {k: _rounded(row.get(k)) for k in keep if not (k == "rt_timeline" and rep_of(row))}  # (figures: run 1's)
    out["rep"] = rep_of(row)
    h = row.get("host") or {}
    out["cpu_busy_pct"], out["cpu_steal_pct"] = h.get("cpu_busy_pct"), h.get("cpu_steal_pct")
    out["cores_used"] = {g: v["cores"] for g, v in (h.get("groups") or {}).items()}
    return out


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


def report(st: Settings, command: str, skipped: list[str] | None = None) -> dict[str, Any]:
    cal = load_json(_raw_path(st, "calibration"))
    rows = {c: sorted((r for r in load_json(_raw_path(st, c)) or []  # this app and time scale only
                       if r.get("scale") == st.scale and r.get("cache") == st.cache.as_dict()),
                      key=lambda r: (r["clients"], ARMS.index(r["arm"])))
            for c in CONDITIONS}
    ov = load_json(_raw_path(st, "overhead"))
    more = sorted(st.out.glob("raw/overhead-r*.json"), key=lambda p: int(p.stem.rsplit("-r", 1)[1]))
    ov_runs = [ov, *(load_json(p) for p in more)] if ov else []
    summary: dict[str, Any] = {
        "command": command,
        "scale": st.scale,
        "conditions": {c: {"paper_think_s": t, "paper_timeout_s": to, "think_s": round(t * st.scale, 3),
                           "timeout_s": round(to * st.scale, 3)} for c, (t, to) in CONDITIONS.items()},
        "window": {"warmup_s": st.s(st.warmup_paper_s), "seconds": st.s(st.window_paper_s),
                   "paper_warmup_s": st.warmup_paper_s, "paper_seconds": st.window_paper_s},
        "app": {"workers": st.workers, "pages_cpu_ms": {p.name: p.paper_ms * st.scale for p in PAGES},
                "contention": st.cache.as_dict(), "contention_text": st.cache.describe()},
        "calibration": {k: v for k, v in (cal or {}).items() if k != "host"},
        "nginx_limits": asdict(nginx_limits(cal, st)) if cal else None,
        # the keys the arms run with (ports differ per run: placeholders; upstream port 0 is refused)
        "proxy_config": proxy_config(0, 1, 0, st.scale, True, st.proxy_overrides)["admission"],
        "points": {c: [compact(r) for r in rs] for c, rs in rows.items() if rs},
        "repeat": max((len(r["runs"]) for rs in rows.values() for r in aggregate(rs)), default=0),
        "means": {c: [_rounded({k: v for k, v in r.items() if k != "rt_timeline"}) for r in aggregate(rs)]
                  for c, rs in rows.items() if rs},
        "targets": targets(rows["base"]),
        "skipped": skipped or [],
        "overhead": ov,
        "overhead_runs": ov_runs[1:],
        "hosts": {c: _hosts([r.get("host") or {} for r in rs]) for c, rs in rows.items() if rs},
    }
    st.out.mkdir(parents=True, exist_ok=True)
    (st.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    # the figures from the means (one run per point: the run itself), timelines from the first run
    pngs = plot.write(st.out, {**summary, "points": {c: aggregate(rs) for c, rs in rows.items() if rs}})
    md = markdown(summary, pngs)
    (st.out / "summary.md").write_text(md)
    print(md)
    return summary


def bench_keys(section: dict[str, Any], prefix: str = "") -> str:
    """The dotted keys (and values) a proxy configuration sets beyond the listeners, upstream and
    page classes: what the bench chose rather than the proxy's defaults."""
    skip = {"listen_address", "upstream", "exempt", "pages", "control"}
    out = []
    for k, v in section.items():
        if not prefix and k in skip:
            continue
        if isinstance(v, dict):
            out.append(bench_keys(v, f"{prefix}{k}."))
        else:
            out.append(f"`{prefix}{k}` {v}")
    return ", ".join(x for x in out if x)


def _hosts(hs: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(k: str) -> float | None:
        vals = [h[k] for h in hs if h.get(k) is not None]
        return round(sum(vals) / len(vals), 1) if vals else None

    return {"points": len(hs), "cpu_busy_pct": mean("cpu_busy_pct"), "cpu_steal_pct": mean("cpu_steal_pct"),
            "load1_max": max((h.get("load1_max") or 0 for h in hs), default=None)}


def markdown(s: dict[str, Any], pngs: list[str]) -> str:
    lines = ["# Session admission bench (seed 002)", "", f"Command: `{s['command']}`", ""]
    cal = s.get("calibration") or {}
    lines += [f"Time scale {s['scale']:g}: every duration is the paper's x {s['scale']:g} (page CPU, think time, "
              f"client timeout, warm-up {s['window']['warmup_s']:g} s and window {s['window']['seconds']:g} s = "
              f"paper {s['window']['paper_warmup_s']:g} s / {s['window']['paper_seconds']:g} s); sessions/s are "
              f"1/{s['scale']:g} of the unscaled figure.", ""]
    if cal:
        lines += [f"App: {s['app']['workers']} worker processes, page CPU ms {s['app']['pages_cpu_ms']}; capacity "
                  f"{cal['capacity_sessions_per_s']} sessions/s ({cal['capacity_requests_per_s']} req/s); saturation "
                  f"N_sat = {cal['n_sat']} clients (capacity x light-load cycle {cal['cycle_s']} s). "
                  f"nginx limits: {s['nginx_limits']}.", "",
                  f"Contention model (declared before the runs, `bench/admission/contention.py`): "
                  f"{s['app'].get('contention_text', '-')}. Measured sessions/s by requests executing in the app "
                  f"(closed loop, no think time): {curve_text(cal) or '-'}.", ""]
    px = s.get("proxy_config")
    if px:
        from controllers.admission.config import AdmissionSection

        eff = AdmissionSection.model_validate(px)
        lines += [f"Proxy (arms page and full): `session.client_timeout` {eff.session.client_timeout:g} s, "
                  f"`session.max_queue_wait` {eff.session.max_queue_wait:g} s, `session_scheduler.page_wait_target` "
                  f"{eff.session_scheduler.page_wait_target:g} s. Keys the bench sets (every other key is the "
                  f"proxy's default): {bench_keys(px)}.", ""]
    repeated = any((r.get("completed") or {}).get("n", 1) > 1 for rs in (s.get("means") or {}).values() for r in rs)
    for cond, rows in (s.get("means") or s["points"]).items():
        c = s["conditions"][cond]
        arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
        lines += [f"## {cond}: think {c['paper_think_s']:g} s, timeout {c['paper_timeout_s']:g} s "
                  f"(scaled: {c['think_s']:g} s / {c['timeout_s']:g} s)", "",
                  ("Completed sessions/s, mean of the runs ±sd (min-max of the runs; failed at page 1 / failed at "
                   "pages 2-7 per run, means; p99 response time of answered requests, mean):" if repeated else
                   "Completed sessions/s (failed at page 1 / failed at pages 2-7, in the window; p99 response time of "
                   "answered requests):"), "",
                  "| clients | " + " | ".join(ARM_LABELS[a] for a in arms) + " |",
                  "|---|" + "---|" * len(arms)]
        for n in sorted({r["clients"] for r in rows}):
            cells = []
            mult = next(r["multiple"] for r in rows if r["clients"] == n)
            for a in arms:
                r = next((r for r in rows if r["clients"] == n and r["arm"] == a), None)
                cells.append("-" if r is None else point_cell(r))
            lines.append(f"| {n} ({mult:g}x) | " + " | ".join(cells) + " |")
        host = s["hosts"].get(cond) or {}
        lines += ["", f"Conditions: CPU busy {host.get('cpu_busy_pct')}% (steal {host.get('cpu_steal_pct')}%) "
                  f"on average over {host.get('points')} points, load average max {host.get('load1_max')}.", ""]
    t = s.get("targets") or {}
    if t:
        lines += ["## Targets (base condition, largest client count)", "",
                  *(["Means of the runs: completed/s ±sd (min-max), the peak is the highest mean (at the multiple "
                     "shown), of own peak per run in brackets; failures are means per run (worst run).", ""]
                    if repeated else []),
                  "| arm | clients | completed/s | its peak | of own peak | of best arm's peak | failed at start | failed mid-session |",
                  "|---|---|---|---|---|---|---|---|"]
        for a in ARMS:
            if a in t:
                r = t[a]
                if repeated:
                    lines.append(f"| {ARM_LABELS[a]} | {r['clients']} ({r['multiple']:g}x) | {r['completed_per_s']} "
                                 f"±{r['sd_per_s']} ({r['min_per_s']}-{r['max_per_s']}, {r['runs']} runs) | "
                                 f"{r['peak_per_s']} ({r['peak_multiple']:g}x) | {r['of_own_peak']:.0%} ("
                                 + ", ".join(f"{v:.0%}" for v in r["of_own_peak_runs"] or []) + ") | "
                                 f"{r['of_best_peak']:.0%} | {r['failed_start']:g} | {r['failed_mid']:g} "
                                 f"({r['failed_mid_max']}) |")
                else:
                    lines.append(f"| {ARM_LABELS[a]} | {r['clients']} ({r['multiple']:g}x) | {r['completed_per_s']} | "
                                 f"{r['peak_per_s']} | {r['of_own_peak']:.0%} | {r['of_best_peak']:.0%} | "
                                 f"{r['failed_start']:g} | {r['failed_mid']:g} |")
        v = t.get("verdict")
        if v:
            lines += ["", f"Full scheme keeps >= 90 % of its own peak: **{'yes' if v['keeps_90pct_of_own_peak'] else 'no'}**; "
                      f"of the best arm's peak: **{'yes' if v['keeps_90pct_of_best_peak'] else 'no'}**; failures only "
                      f"at session start: **{'yes' if v['failures_only_at_start'] else 'no'}**.", ""]
    if s.get("skipped"):
        lines += ["Not run (they would have ended after `--deadline`): " + ", ".join(s["skipped"]) + ".", ""]
    ov = s.get("overhead")
    if ov:
        runs = [ov, *(s.get("overhead_runs") or [])]
        lines += [f"## Proxy overhead at {ov['rate']:g} req/s (open loop, {ov['rounds']} alternating rounds of "
                  f"{ov['block_s']:g} s per path and side" + (f"; {len(runs)} runs" if len(runs) > 1 else "") + ")", ""]
        if len(runs) > 1:
            lines += overhead_runs_md(runs)
        for k, run in enumerate(runs):
            if len(runs) > 1:
                lines += [f"### Run {k + 1} ({run.get('started_utc', '?')}-{run.get('ended_utc', '?')} UTC)", ""]
            lines += overhead_md(run)
    if pngs:
        lines += ["Plots: " + ", ".join(f"`{p}`" for p in pngs), ""]
    return "\n".join(lines) + "\n"


def overhead_md(ov: dict[str, Any]) -> list[str]:
    """The markdown of one run of the overhead step: the table, its conditions, the page waits."""
    lines: list[str] = []
    lines += [*([f"The proxies' event loop: {ov['event_loop']}.", ""] if ov.get("event_loop") else []),
              "| path | direct p50 | direct p99 | proxy p50 | proxy p99 | added p50 | added p99 | ceiling req/s per proxy core |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ov["paths"]:
        d, p, a = ov["runs"][f"{name}/direct"], ov["runs"][f"{name}/proxy"], ov["added"][name]
        ceil = ov["ceiling"].get(name)
        lines.append(f"| {name} (`{ov['paths'][name]}`) | {d['p50_ms']} ms | {d['p99_ms']} ms | {p['p50_ms']} ms | "
                     f"{p['p99_ms']} ms | {a['p50_ms']} ms | {a['p99_ms']} ms | "
                     + (f"{ceil.get('per_core')} ({ceil.get('rate')} req/s at {ceil.get('proxy_cores')} cores) |"
                        if ceil else "- |"))
    if any((ov["runs"].get(f"{n}/direct") or {}).get("conditions") for n in ov["paths"]):
        lines += ["", "Conditions of the blocks (CPU used during the blocks, in cores, mean per block; the host's "
                  "busy share of all its cores, mean and worst block): the generator, the app (with its worker "
                  "processes) and the proxy share the machine, so a side whose processes need all of it queues "
                  "in the kernel, not in the proxy.", "",
                  "| path | side | generator | app | proxy | host busy | waiting for a CPU, ms/s: generator / app / proxy |",
                  "|---|---|---|---|---|---|---|"]
        for name in ov["paths"]:
            for via in ("direct", "proxy"):
                c = ov["runs"][f"{name}/{via}"].get("conditions") or {}
                cores, runq = c.get("cores") or {}, c.get("runq_ms_per_s") or {}
                lines.append(f"| {name} | {via} | {cores.get('generator', '-')} | {cores.get('app', '-')} | "
                             f"{cores.get('proxy', '-')} | {c.get('busy_pct', '-')} % (max {c.get('busy_pct_max', '-')} %) | "
                             + " / ".join(str(runq.get(k, "-")) for k in ("generator", "app", "proxy")) + " |")
    waits = ov.get("page_queue_waits") or {}
    if waits:
        lines += ["", "Session pages that waited more than 1 ms in their page queue: " + "; ".join(
            f"{name} {w['waited_over_1ms']:.0f} of {w['requests']:.0f} ({w['waited_share']:.1%})"
            for name, w in waits.items()) + f". `page_unbound` runs with {ov.get('unbound_overrides')} (the "
            "page limit above any burst of this load), `page` with the default initial limit of 4: the "
            "difference between the two rows is what holding bursts in the page queue costs."]
    if "page_inline" in ov["paths"]:
        lines += ["", "`page_inline`: the same session page, the app answering it in its main process instead of "
                  "through its worker pool (the app does no page work here): the proxy's own cost on a session "
                  "page. `page` adds what the pool's hop (the app's loop, its executor thread, a worker process "
                  "and back) pays for sharing the cores with one more busy process: see the waits for a CPU above."]
    lines += ["", f"Conditions: {describe(ov['host'])}.", ""]
    return lines


def overhead_runs_md(runs: list[dict[str, Any]]) -> list[str]:
    """Added p50 / p99 per path in each run of the overhead step, and each run's ceilings: the
    spread between runs beside any single figure."""
    names = list(runs[0]["paths"])
    lines = ["Added latency (proxy minus direct, ms) p50 / p99 in each run, and the ceiling (req/s per proxy core):",
             "", "| path | " + " | ".join(f"run {k + 1} ({r.get('started_utc', '?')})" for k, r in enumerate(runs))
             + " | ceilings |", "|---|" + "---|" * len(runs) + "---|"]
    for name in names:
        cells = []
        for r in runs:
            a = (r.get("added") or {}).get(name) or {}
            cells.append(f"{a['p50_ms']:+.3f} / {a['p99_ms']:+.3f}" if a.get("p50_ms") is not None
                         and a.get("p99_ms") is not None else "-")
        ceils = [str(((r.get("ceiling") or {}).get(name) or {}).get("per_core", "-")) for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + (", ".join(ceils) if any(c != "-" for c in ceils) else "-")
                     + " |")
    return [*lines, ""]


def point_cell(r: dict[str, Any]) -> str:
    """One point of the markdown table (a row of :func:`bench.admission.repeats.aggregate`):
    ``**22.20** (152/0; 2.9s)`` for one run, ``**22.40** ±0.80 (21.60-23.20, 3 runs; 150/0; 2.9s)``
    for several."""
    c = r.get("completed") or {"n": 1}
    p99 = fmt_s(r.get("rt_ok_p99_s")).strip()
    fails = f"{r['failed_by_page']['1']:.0f}/{r['abandoned']:.0f}"
    if c["n"] == 1:
        return f"**{r['completed_per_s']:.2f}** ({fails}; {p99})"
    return (f"**{r['completed_per_s']:.2f}** ±{c['sd']:.2f} ({c['min']:.2f}-{c['max']:.2f}, {c['n']} runs; "
            f"{fails}; {p99})")


# ---------------------------------------------------------------- the demo

def demo(st: Settings, before_paper_s: float = 100.0, crowd_paper_s: float = 400.0) -> dict[str, Any]:
    """A flash crowd with and without the scheme: 0.5x saturation, then 4x, on arms none and full
    (about 2.5 minutes: a short calibration at the app's knee, then 50 s per arm)."""
    out = st.out / "quick"
    out.mkdir(parents=True, exist_ok=True)
    with heavy_lock(st.lock):
        log(f"app contention model: {st.cache.describe()}")
        log("calibrating the app's capacity (8 s: 4 clients with no think time, below the knee)")
        cal = calibrate(st, levels=(4,), stage_s=8.0, settle_s=2.0)
        log(f"capacity {cal['capacity_sessions_per_s']} sessions/s -> saturation at {cal['n_sat']} clients")
        light, crowd = max(1, round(0.5 * cal["n_sat"])), max(2, round(4 * cal["n_sat"]))
        before, during = st.s(before_paper_s), st.s(crowd_paper_s)
        model = st.model("base")
        results: dict[str, Any] = {}
        for arm in ("none", "full"):
            log(f"arm {arm}: {light} clients for {before:g} s, then a flash crowd of {crowd} for {during:g} s")
            stack = ArmStack(arm, st.scale, st.workers, cal["iters_per_ms"], proxy_overrides=st.proxy_overrides,
                             cache=st.cache).start()
            try:
                events, host, _ = run_clients(stack, f"0:{light},{before:g}:{crowd}", before + during, model, out,
                                              f"demo-{arm}", stagger=False, arrival_rate=float(crowd))
                shares = app_shares(_get_json(f"{stack.app_url}/stats"))
            finally:
                stack.stop()
                stack.cleanup()
            ev = read_events(events)
            t0 = ev.started or 0.0
            crowd_w = window_after_start(ev, before + model.timeout_s, during - model.timeout_s)
            results[arm] = {"before": count(ev, window_after_start(ev, 1.0, before - 1.0)),
                            "crowd": count(ev, crowd_w), "timeline": per_second(ev, t0, t0 + before + during, 2.0),
                            "host": host, **shares}
            r = results[arm]["crowd"]
            log(f"  {arm}: before {results[arm]['before']['completed_per_s']:.2f}/s, during the crowd "
                f"{r['completed_per_s']:.2f}/s, failed at start {r['failed_by_page']['1']}, mid-session {r['abandoned']}")
    summary = {"calibration": cal, "light": light, "crowd": crowd, "before_s": before, "crowd_s": during,
               "scale": st.scale, "results": results}
    (out / "demo.json").write_text(json.dumps(summary, indent=1))
    png = plot.demo(out, summary)
    table = ["", f"App: {st.cache.describe()}.",
             f"Flash crowd: {light} clients (0.5x saturation), then {crowd} (4x) at t={before:g} s; think "
             f"{model.think_s:g} s, timeout {model.timeout_s:g} s (the paper's 3 s / 60 s x scale {st.scale:g}); "
             f"crowd counted from one timeout after it starts.", "",
             "| arm | completed/s before | completed/s in the crowd | of before | failed at page 1 | failed at pages 2-7 "
             "| wasted requests | app CPU on misses | p99 response |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, r in results.items():
        c = r["crowd"]
        b = r["before"]["completed_per_s"]
        table.append(f"| {ARM_LABELS[arm]} | {b:.2f} | {c['completed_per_s']:.2f} | "
                     f"{c['completed_per_s'] / b if b else 0:.0%} | {c['failed_by_page']['1']} | {c['abandoned']} | "
                     f"{c['wasted_share']:.0%} | {r['app_contention_share']:.0%} | {fmt_s(c['rt_ok_p99_s']).strip()} |")
    table += ["", "Conditions: " + "; ".join(f"{arm}: {describe(r['host'])}" for arm, r in results.items()),
              f"Timeline plot: {png}", ""]
    print("\n".join(table), flush=True)
    return summary


# ---------------------------------------------------------------- CLI

def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__.split("\n")[0])
    ap.add_argument("--demo", action="store_true", help="the flash crowd with and without the scheme (~3 min)")
    ap.add_argument("--scale", type=float, default=0.1, help="time scale of every duration (default 0.1)")
    ap.add_argument("--workers", type=int, default=16, help="the app's worker processes")
    ap.add_argument("--conditions", default="base,timeout30,think1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--multiples", default="0.5,1,2,3,4", help="client counts for base, x saturation")
    ap.add_argument("--var-multiples", default="1,4", help="client counts for the variations, x saturation")
    ap.add_argument("--window", type=float, default=None,
                    help="counting window, paper seconds (x scale; default 200, with --report-only the measured one)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="warm-up before the window, paper seconds (x scale; default 80, with --report-only the measured one)")
    contention.add_arguments(ap)
    ap.add_argument("--proxy-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the proxy's admission: section (dotted, YAML value)")
    ap.add_argument("--overhead", choices=["yes", "no", "only"], default="yes")
    ap.add_argument("--recalibrate", action="store_true", help="measure the capacity again (else reuse raw/calibration.json)")
    ap.add_argument("--fresh", action="store_true", help="forget the points already measured")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--lock", type=Path, default=None, help="heavy-job lock taken per client count (flock)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of every point, interleaved (repetition after repetition of the plan); the report "
                         "and the targets use their means, with the spread beside them")
    ap.add_argument("--deadline", type=parse_deadline, default=None, metavar="HH:MM",
                    help="UTC (or Unix seconds): no step starts that would end after it (the report says which)")
    args = ap.parse_args(argv)
    import yaml

    # a SIGTERM (timeout, flock's caller) unwinds like Ctrl-C, so every started process is stopped
    interrupt_once()

    overrides = {}
    for item in args.proxy_set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--proxy-set {item!r}: need KEY=VALUE")
        overrides[key] = yaml.safe_load(value)
    conditions = tuple(c for c in args.conditions.split(",") if c)
    arms = tuple(a for a in args.arms.split(",") if a)
    bad = [c for c in conditions if c not in CONDITIONS] + [a for a in arms if a not in ARMS]
    if bad:
        ap.error(f"unknown condition or arm: {', '.join(bad)} (conditions {', '.join(CONDITIONS)}; arms {', '.join(ARMS)})")
    if not 0.01 <= args.scale <= 1.0:
        ap.error("--scale must be in [0.01, 1]")
    if not 1 <= args.repeat <= 20:
        ap.error("--repeat must be 1..20")
    cache = contention.from_arguments(ap, args)
    ran = (load_json(args.out / "raw" / "command.json") or {}) if args.report_only else {}
    warmup = args.warmup if args.warmup is not None else ran.get("warmup_paper_s", Settings.warmup_paper_s)
    window = args.window if args.window is not None else ran.get("window_paper_s", Settings.window_paper_s)
    st = Settings(scale=args.scale, workers=args.workers, warmup_paper_s=warmup, window_paper_s=window,
                  conditions=conditions, arms=arms, multiples=_floats(args.multiples),
                  var_multiples=_floats(args.var_multiples), proxy_overrides=overrides, cache=cache, out=args.out,
                  lock=args.lock, repeat=args.repeat, deadline=args.deadline)
    given = sys.argv[1:] if argv is None else argv
    command = "uv run --frozen python -m bench.admission" + (" " + " ".join(given) if given else "")
    if args.demo:
        demo(st)
        return 0
    (st.out / "raw").mkdir(parents=True, exist_ok=True)
    if args.fresh:
        for c in CONDITIONS:
            _raw_path(st, c).unlink(missing_ok=True)
    skipped: list[str] = []
    measured = {"command": command, "warmup_paper_s": st.warmup_paper_s, "window_paper_s": st.window_paper_s}
    if args.report_only:  # the command that measured the points, when known
        command, skipped = ran.get("command", command), ran.get("skipped", [])
    else:
        _raw_path(st, "command").write_text(json.dumps(measured))
        with ChunkedLock(st.lock, max_s=690.0, log=log) as lock:  # chunks <= 11.5 min
            cal = None
            if args.overhead != "only":
                cal = load_json(_raw_path(st, "calibration"))
                if (args.recalibrate or args.fresh or not cal or cal.get("scale") != st.scale
                        or cal.get("workers") != st.workers or cal.get("cache") != st.cache.as_dict()):
                    lock.need(30.0 + point_seconds(st) * len(st.arms))  # and the first client count after it
                    log(f"calibrating the app's throughput by concurrency {CAL_LEVELS} (20 s, no think time); "
                        f"app contention model: {st.cache.describe()}")
                    cal = calibrate(st)
                    _raw_path(st, "calibration").write_text(json.dumps(cal, indent=1))
                log(f"sessions/s by requests in the app: {curve_text(cal)}")
                log(f"capacity {cal['capacity_sessions_per_s']} sessions/s ({cal['capacity_requests_per_s']} req/s), "
                    f"saturation N_sat = {cal['n_sat']} clients; {describe(cal['host'])}")
                steps = schedule(plan(st, args.overhead == "yes"), st.repeat)
            else:  # --repeat N: the overhead step N times, each run reported
                steps = schedule([("overhead", 0.0)], st.repeat, first_only=())
            log("plan: " + ", ".join(c if c == "overhead" else f"{c} {m:g}x" + (f" (run {r + 1})" if st.repeat > 1 else "")
                                     for c, m, r, _ in steps))
            skipped = sweep(st, cal, lock, steps)
            _raw_path(st, "command").write_text(json.dumps({**measured, "skipped": skipped}))
    report(st, command, skipped)
    return 0
