"""Reproduce the copy-guard paper (seed 000) on this machine, and try to beat it.

Setup: the real local stack (Prometheus, Alertmanager, node_exporter, nginx proxying to the
shop-like site of ``bench/copy_guard/site.py``, the access-log exporter, the controller), a
large copy onto the same disk with ``promreflex copy`` (O_DIRECT), Locust shoppers at a fixed
offered rate. The site and the copy share an emulated slower disk (``--disk-mbps``, see
``bench/blkio.py``: this VM's own disk copies at ~1 GB/s, so a copy of a few GB would be over in
seconds). The threshold is calibrated first with ``promreflex calibrate``'s code and published
where the rules read it.

Runs (``--runs``; each round alternates the order, since baselines drift 5-10 % here):
  load-only            the site under load, no copy
  load+copy            the copy starts ``--copy-delay`` s into the load, nothing guards it
  load+copy+guard-nohold  route CopyGuardSiteOverloaded -> copy-guard, resume as soon as it
                       resolves (the paper's rule)
  load+copy+guard      the same, each pause held at least ``--min-pause``
  load+copy+predictive route CopyGuardSiteOverloadPredicted as well
  quiet+copy+guard     no load at all, both routes: the copy must never pause

The counting window. Every loaded run of a round offers the same load for the same
``--load-seconds``, long enough that every copy of the round (the guarded ones included, which
take longest) ends while the load still runs; responses are counted over the same window in
every run: from the load's start to the end of the shortest load of the round. A guard cannot
score by pushing its copy past the end of the measurement: each run does the whole copy and
serves the shop for the same time. If a copy of a round does end after the window, the round is
flagged and its saved shares are not reported (rerun with a longer ``--load-seconds``; the
report says how long the latest copy took).

Per run: responses served and failed within the window (Locust's 100 ms completion bins), the
lost responses the guard saved ``served_guard - served_copy`` and their share of what the copy
cost ``(served_guard - served_copy) / (served_loadonly - served_copy)`` within the round, the
copy's duration (process start to exit), the time the served rate (completions over the last
second, at 100 ms steps, as the rule's rate1s) spent below the threshold, the time below the
threshold when each pause took hold (reaction), and the machine's CPU (busy, steal, iowait) and
load average during the run (psutil; other work shares these cores).

    uv run python -m bench.copy_guard --lock /tmp/promreflex-heavy.lock [--quick]

(``--lock`` takes the machine's heavy-job lock for each run and lets other heavy jobs go
between runs; ``flock LOCK uv run ...`` around the whole bench works too.)

Writes ``summary.json``, ``summary.md`` (table and conditions), ``timeline.png`` and
``summary.png`` (small, committed) and ``results.json``/``results.csv`` (every run's timeline:
raw, not committed) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from bench.blkio import EmulatedDisk
from bench.conditions import HostSampler, describe, heavy_lock
from bench.copy_guard.analysis import (
    RunResult,
    Window,
    common_window,
    intervals,
    per_second,
    reaction_times,
    rolling_rate,
    saved_share,
    seconds_below,
    served_between,
    slowdown,
)
from bench.copy_guard.site import ensure_data_file, site_component
from controllers.copy_guard.calibrate import ShopLoad, calibrate
from promreflex.config import Ports, load_config
from promreflex.proc import free_port, terminate, wait_until
from promreflex.stack import Stack

SITE = "shop"
ALERT_REACTIVE = "CopyGuardSiteOverloaded"
ALERT_PREDICTED = "CopyGuardSiteOverloadPredicted"
PAPER = {"saved_share": 0.623, "copy_unguarded_s": 92.0, "copy_guarded_s": 129.0, "slowdown": 129 / 92 - 1,
         "below_before_pause_s": 14.0, "served": {"load-only": 5065, "load+copy": 4874, "load+copy+guard": 4993}}
MODES = {  # name: (load, copy, guard, hold: keep each pause at least --min-pause seconds)
    "load-only": (True, False, "none", False),
    "load+copy": (True, True, "none", False),
    "load+copy+guard-nohold": (True, True, "reactive", False),  # the paper's rule: resume as soon as above
    "load+copy+guard": (True, True, "reactive", True),
    "load+copy+predictive": (True, True, "predictive", True),
    "quiet+copy+guard": (False, True, "predictive", True),
}
LOADED = ["load-only", "load+copy", "load+copy+guard-nohold", "load+copy+guard", "load+copy+predictive"]
GUARDED = ("load+copy+guard-nohold", "load+copy+guard", "load+copy+predictive")
GB = 1 << 30


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_order(rounds: int, reverse_first: bool = False, loaded: list[str] | None = None,
              quiet: bool = True) -> list[tuple[int, str]]:
    """Loaded runs (``loaded``, default all), alternating direction by round (``reverse_first``:
    starting reversed, so two single-round invocations together cover both orders); the quiet run last."""
    arms = list(loaded or LOADED)
    plan = []
    for r in range(rounds):
        plan += [(r, m) for m in (arms if (r + reverse_first) % 2 == 0 else list(reversed(arms)))]
    return plan + ([(0, "quiet+copy+guard")] if quiet else [])


def _get_json(url: str, timeout: float = 1.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
        return json.load(resp)


def _prom_value(prom: str, expr: str) -> float | None:
    try:
        body = _get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=2)
        res = body["data"]["result"]
        return float(res[0]["value"][1]) if res else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


class CopyProcess:
    """One ``promreflex copy`` in a child process, in the emulated disk, sampled at 10 Hz."""

    def __init__(self, src: Path, dst: Path, registry_dir: Path, disk: EmulatedDisk | None, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "promreflex", "copy", str(src), str(dst), "--site", SITE,
                     "--registry.dir", str(registry_dir), "--web.listen-address", f"127.0.0.1:{self.port}",
                     "--io", "direct", "--fresh"]
        self.dst, self.disk, self.log_path = dst, disk, log_path
        self.samples: list[tuple[float, str, int]] = []  # (t, state, done_bytes)
        self.status: dict[str, Any] = {}
        self.exited_at: float | None = None
        self._stop = threading.Event()

    def start(self) -> CopyProcess:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in finish()
        self.started = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,  # noqa: S603
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if self.disk:
            self.disk.add(self.proc.pid)
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            try:
                st = _get_json(f"{self.url}/status", timeout=0.5)
                self.status = st
                self.samples.append((time.time(), st["state"], int(st["done_bytes"])))
            except (OSError, ValueError, KeyError):
                pass
            self._stop.wait(0.1)
        if self.proc.poll() is not None:
            # the exit time, to 0.1 s: wait() is only called when the load has ended, which can be
            # long after the copy did
            self.exited_at = time.time()

    def wait(self, timeout: float) -> float | None:
        """Seconds from start to exit (None if it had to be killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
            self.thread.join(timeout=2)
            self.ended = self.exited_at or time.time()
        except subprocess.TimeoutExpired:
            terminate(self.proc.pid, grace=5)
            self.ended = time.time()
            code = None
        self._stop.set()
        self.thread.join(timeout=2)
        self.log.close()
        if code != 0:
            log(f"  copy exited {code}; see {self.log_path}")
            return None
        return self.ended - self.started

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def paused_intervals(self) -> list[tuple[float, float]]:
        return intervals([(t, state == "paused") for t, state, _ in self.samples])

    def done_at(self, when: float) -> int:
        done = 0
        for t, _, b in self.samples:
            if t <= when:
                done = b
        return done

    def cleanup(self) -> None:
        for p in (self.dst, self.dst.parent / f".{self.dst.name}.promreflex-copy.json",
                  self.dst.parent / f".{self.dst.name}.promreflex-part"):
            p.unlink(missing_ok=True)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.work = args.workdir
        self.out = args.out
        self.registry_dir = self.work / "copies"
        self.site_port = free_port()
        self.ports = {p: free_port() for p in Ports.model_fields}
        self.disk: EmulatedDisk | None = None
        self.results: list[RunResult] = []
        self.timelines: dict[tuple[int, str], tuple[dict[int, list[int]], float]] = {}  # (round, run): Locust bins
        self.windows: dict[int, Window] = {}
        self.guard: tuple[str, bool] = ("none", False)
        self.threshold = 0.0

    # ------------------------------------------------------------------ setup
    def routes(self, guard: str, hold: bool = False) -> list[dict[str, Any]]:
        params = {"registry_dir": str(self.registry_dir), "min_pause": f"{self.a.min_pause if hold else 0:g}s"}
        routes = []
        if guard in ("reactive", "predictive"):
            routes.append({"name": "copy-guard", "matchers": [f'alertname="{ALERT_REACTIVE}"'], "action": "copy-guard",
                           "params": params})
        if guard == "predictive":
            routes.append({"name": "copy-guard-predicted", "matchers": [f'alertname="{ALERT_PREDICTED}"'],
                           "action": "copy-guard", "params": params})
        return routes

    def make_stack(self, guard: str, hold: bool = False) -> Stack:
        cfg = load_config(None, {
            "stack.state_dir": str(self.work / "stack"),
            "stack.ports": self.ports,
            "stack.upstream": f"127.0.0.1:{self.site_port}",
            "controller.reconcile_interval": "1s",
            "controller.routes": self.routes(guard, hold),
        })
        site = site_component(self.site_port, self.work / "site", data_size_mib=self.a.site_data_mib,
                              reads_per_page=self.a.reads_per_page, workers=self.a.workers,
                              cgroup=self.disk.dir if self.disk else None)
        return Stack(cfg, extra_components=[site])

    def set_guard(self, guard: str, hold: bool) -> None:
        """Restart only the controller with the routes of this run (configs re-rendered)."""
        if (guard, hold) == self.guard:
            return
        stack = self.make_stack(guard, hold)
        stack.render()
        stack.stop_component("controller")
        stack.start_component("controller", progress=lambda *_: None)
        self.guard = (guard, hold)
        log(f"  controller restarted with routes: {[r['name'] for r in self.routes(guard)] or 'none'}"
            + (f", min_pause {self.a.min_pause:g}s" if guard != "none" and hold else ""))

    def prepare_data(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        if ensure_data_file(self.work / "site" / "products.dat", self.a.site_data_mib << 20, progress=log):
            log(f"wrote the site's product file ({self.a.site_data_mib} MiB) in {time.monotonic() - t:.0f}s")
        t = time.monotonic()
        self.src = self.work / "source.bin"
        if ensure_data_file(self.src, int(self.a.copy_gib * GB) // 4096 * 4096, progress=log):
            log(f"wrote the copy's source ({self.a.copy_gib:g} GiB) in {time.monotonic() - t:.0f}s")
        else:
            log(f"reusing {self.src} ({self.a.copy_gib:g} GiB)")
        self.dst = self.work / "backup" / "source.bin"
        self.dst.parent.mkdir(exist_ok=True)

    # ------------------------------------------------------------------ runs
    def one_run(self, rnd: int, name: str) -> RunResult:
        load_on, copy_on, guard, hold = MODES[name]
        self.set_guard(guard, hold)
        a, prom = self.a, self.stack.url("prometheus")
        r = RunResult(name, rnd, load_on, copy_on, guard)
        log(f"run {name} (round {rnd + 1}): load {'%gs at %g req/s' % (a.load_seconds, a.rate) if load_on else 'none'}, "
            f"copy {'%g GiB at +%gs' % (a.copy_gib, a.copy_delay if load_on else 0) if copy_on else 'none'}, guard {guard}")
        load = ShopLoad(self.stack.url("nginx") + "/", a.rate, a.users, a.load_seconds, checkout_share=a.checkout_share)
        copy: CopyProcess | None = None
        t0 = time.time()
        host = HostSampler().start()
        psutil.cpu_percent(interval=None)
        try:
            if load_on:
                load.start()
                r.load_start = t0
            copy_at = t0 + (a.copy_delay if load_on else 0.0)
            next_progress = t0 + 10
            while (load_on and load.running()) or (copy_on and copy is None):
                now = time.time()
                if copy_on and copy is None and now >= copy_at:
                    self.registry_dir.mkdir(exist_ok=True)
                    copy = CopyProcess(self.src, self.dst, self.registry_dir, self.disk, self.out / "copy.log").start()
                    r.copy_start = copy.started
                if now >= next_progress:
                    next_progress += 10
                    rps = _prom_value(prom, f'site:promreflex_http_requests_served:rate1s{{site="{SITE}"}}')
                    st = copy.status if copy else {}
                    if copy is not None and copy.proc.poll() is not None:
                        st = {**st, "state": "ended", "done_bytes": st.get("total_bytes", 1)}
                    done = f"{100 * st.get('done_bytes', 0) / max(1, st.get('total_bytes', 1)):5.1f}%" if st else "  -  "
                    log(f"  t={now - t0:5.0f}s served {rps if rps is not None else float('nan'):6.1f} req/s  "
                        f"copy {done} {st.get('state', '-'):<9} pauses {st.get('pauses', 0):<3} "
                        f"CPU busy {psutil.cpu_percent(interval=None):3.0f}% load {os.getloadavg()[0]:.1f}")
                time.sleep(0.1)
            if load_on:
                if copy is not None and copy.proc.poll() is None:
                    log(f"  the copy is still running at the end of the load ({copy.status.get('state', '?')}): "
                        "this round's window will not contain it; use a longer --load-seconds")
                run = load.wait()
                # the load's window ends with its last completion; its last second is partial
                # (users stop mid-request), so it is left out like calibrate leaves it out
                last = (max(run.bins) + 1) * run.bin_s if run.bins else time.time()
                r.served, r.failed, r.load_end = run.ok, run.failed, last - 1.0
                r.per_second = {k: v for k, v in per_second(run.bins, run.bin_s).items() if k < int(last - run.bin_s)}
                r.failed_per_second = {k: v for k, v in per_second(run.bins, run.bin_s, 1).items() if k < int(last - run.bin_s)}
                self.timelines[(rnd, name)] = (run.bins, run.bin_s)
            if copy is not None:
                limit = a.copy_gib * GB / (a.disk_mbps * 1e6 * 0.3 if a.disk_mbps else 100e6) + 120
                r.copy_seconds = copy.wait(timeout=limit)
                r.copy_end = copy.ended
                r.pause_intervals = copy.paused_intervals()
                r.pauses = len(r.pause_intervals)
                r.paused_seconds = sum(b - a_ for a_, b in r.pause_intervals)
                if load_on:
                    r.copy_done_under_load_bytes = copy.done_at(r.load_end)
        finally:
            load.kill()
            if copy is not None:
                copy.kill()
                copy.cleanup()
            r.host = host.stop()
        copy_txt = f"{r.copy_seconds:.1f}s" if r.copy_seconds is not None else "-"
        end_txt = f" (ended at +{r.copy_end - t0:.1f}s)" if r.copy_end is not None and load_on else ""
        log(f"  -> served {r.served}, failed {r.failed} over {r.load_end - r.load_start:.1f}s of load, copy {copy_txt}"
            f"{end_txt}, pauses {r.pauses} ({r.paused_seconds:.1f}s); {describe(r.host)}")
        return r

    def count_in_windows(self) -> None:
        """Per round: the common window, and each loaded run's served responses, time below the
        threshold and reaction times within it."""
        by_round: dict[int, list[RunResult]] = {}
        for r in self.results:
            if r.load:
                by_round.setdefault(r.round, []).append(r)
        for rnd, runs in by_round.items():
            w = self.windows[rnd] = common_window(runs)
            for r in runs:
                bins, bin_s = self.timelines[(rnd, r.name)]
                end = r.load_start + w.seconds
                r.window_s = w.seconds
                r.served_window = served_between(bins, bin_s, r.load_start, end)
                r.failed_window = served_between(bins, bin_s, r.load_start, end, column=1)
                rate = rolling_rate(bins, bin_s, r.load_start + self.a.warmup, end)
                r.seconds_below = seconds_below(rate, self.threshold, bin_s)
                if r.pause_intervals:
                    starts = [p0 for p0, _ in r.pause_intervals if p0 <= end]
                    r.reaction_s = reaction_times(rate, self.threshold, starts, bin_s)
            named = {r.name: r for r in runs}
            lo, cp = named.get("load-only"), named.get("load+copy")
            if lo is None or cp is None or lo.served_window is None or cp.served_window is None:
                continue
            for name in GUARDED:
                g = named.get(name)
                if g is None or g.served_window is None:
                    continue
                g.lost_responses = lo.served_window - cp.served_window
                g.saved_responses = g.served_window - cp.served_window
                if w.contains_every_copy:
                    g.saved_share = saved_share(lo.served_window, cp.served_window, g.served_window)
                else:
                    g.note = f"round {rnd + 1}: copies of {', '.join(w.late)} ended after the window; share not reported"

    def settle(self) -> None:
        """Between runs: wait until no copy-guard alert is active and the site is idle."""
        prom = self.stack.url("prometheus")
        try:
            wait_until(lambda: _prom_value(prom, f'count(ALERTS{{alertname=~"{ALERT_REACTIVE}|{ALERT_PREDICTED}"}})') is None,
                       timeout=30, interval=0.5, what="copy-guard alerts to resolve")
        except Exception as e:  # noqa: BLE001 - report and go on
            log(f"  (settle: {e})")
        time.sleep(2)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        a = self.a
        self.prepare_data()
        if a.disk_mbps > 0:
            if not EmulatedDisk.available():
                log("no cgroup v1 blkio hierarchy (or not root): run with --disk-mbps 0 to use the raw disk")
                return 2
            self.disk = EmulatedDisk(self.work, a.disk_mbps).create()
            log(f"emulated disk: blkio throttle {a.disk_mbps:g} MB/s read and write on {self.disk.device}, "
                f"shared by the site and the copy ({self.disk.dir})")
        try:
            self.stack = self.make_stack("none")
        except BaseException:  # a configuration error: do not leave the blkio group behind
            if self.disk:
                self.disk.remove()
            raise
        log(f"starting the stack (state {self.work / 'stack'})")
        try:
            self.stack.up(progress=lambda line: log(line))
            prom = self.stack.url("prometheus")
            wait_until(lambda: _prom_value(prom, 'up{job="accesslog"} == 1'), timeout=60, what="access-log exporter scraped")
            with heavy_lock(a.lock):
                self.calibrate()
            plan = run_order(a.rounds, a.reverse, a.runs, quiet=not a.no_quiet)
            log(f"plan: {', '.join(f'{n}#{r + 1}' for r, n in plan)}")
            for rnd, name in plan:
                with heavy_lock(a.lock):
                    self.settle()
                    self.results.append(self.one_run(rnd, name))
        finally:
            self.stack.down(quiet=True)
            if self.disk:
                self.disk.remove()
            shutil.rmtree(self.registry_dir, ignore_errors=True)
            shutil.rmtree(self.dst.parent, ignore_errors=True)
            if not a.keep_data:
                self.src.unlink(missing_ok=True)
                shutil.rmtree(self.work / "site", ignore_errors=True)
            shutil.rmtree(self.work / "stack", ignore_errors=True)
        self.report()
        # 3: some copy ended after its round's window (no saved share). The demo (--quick) shows
        # the table and the note either way.
        return 0 if self.a.quick or all(w.contains_every_copy for w in self.windows.values()) else 3

    def calibrate(self) -> None:
        a = self.a
        log(f"calibrating: {a.cal_runs} run(s) x {a.cal_seconds:g}s at {a.rate:g} req/s, no copy "
            f"(paper: 5 x 5 min at 100 req/s)")
        cal = calibrate(self.stack.url("nginx") + "/", site=SITE, rate=a.rate, users=a.users, duration_s=a.cal_seconds,
                        runs=a.cal_runs, warmup_s=a.warmup, method="min", checkout_share=a.checkout_share,
                        progress=lambda s: log("  " + s.strip()))
        from controllers.copy_guard.calibrate import publish

        if cal.threshold is None:
            raise RuntimeError("calibration derived no threshold")
        self.threshold = float(cal.threshold)
        self.calibration = cal.to_json()
        publish(cal, self.stack.textfile_dir)
        prom = self.stack.url("prometheus")
        wait_until(lambda: _prom_value(prom, f'site:promreflex_copy_guard_threshold:rps{{site="{SITE}"}}') is not None,
                   timeout=30, what="threshold visible in Prometheus")
        o = cal.overall()
        log(f"threshold {self.threshold:.1f} req/s (lowest per-second served RPS; median {o.median:.1f}, p5 {o.p5:.1f})")

    # ------------------------------------------------------------------ output
    def command(self) -> str:
        """The command that reproduces this run (the flags that differ from the defaults)."""
        defaults = vars(parse_args(["--quick"] if self.a.quick else []))
        def value(v: Any) -> str:
            return "" if v is True else " " + (",".join(v) if isinstance(v, list) else str(v))

        flags = [f"--{k.replace('_', '-')}{value(v)}" for k, v in vars(self.a).items()
                 if v != defaults.get(k) and v is not False]
        return " ".join(["uv run python -m bench.copy_guard",
                         *(["--quick"] if self.a.quick else []), *flags])

    def conditions(self) -> str:
        a = self.a
        load1, load5, _ = os.getloadavg()
        return (f"{os.cpu_count()} cores, load average {load1:.2f} (1m) {load5:.2f} (5m) at the end; disk "
                f"{'emulated %g MB/s (blkio throttle, site + copy share it)' % a.disk_mbps if a.disk_mbps else 'raw'} "
                f"on {self.work}; copy {a.copy_gib:g} GiB O_DIRECT; site {a.workers} workers, {a.reads_per_page} x 64 KiB "
                f"uncached reads per page, 1 in {1 / a.checkout_share:.0f} requests an fsync'd checkout; "
                f"load {a.rate:g} req/s offered by {a.users} users for {a.load_seconds:g}s, copy at +{a.copy_delay:g}s; "
                f"threshold {self.threshold:.1f} req/s; guarded runs: min_pause {a.min_pause:g}s except guard-nohold")

    def rows(self) -> list[dict[str, Any]]:
        """One row per run: the figures the table, summary.json and the plots share."""
        unguarded = [r.copy_seconds for r in self.results if r.name == "load+copy" and r.copy_seconds]
        base = statistics.mean(unguarded) if unguarded else None
        out = []
        for r in self.results:
            rx = sorted(r.reaction_s or [])
            h = r.host or {}
            out.append({
                "run": r.name, "round": r.round + 1, "window_s": _r(r.window_s, 1),
                "served": r.served_window if r.load else None, "failed": r.failed_window if r.load else None,
                "lost_responses": r.lost_responses, "saved_responses": r.saved_responses,
                "saved_share": _r(r.saved_share, 3),
                "copy_seconds": _r(r.copy_seconds, 1),
                "copy_slower": _r(slowdown(r.copy_seconds, base), 3) if r.guard != "none" and r.load else None,
                "copy_end_s": _r(r.copy_end - (r.load_start or r.copy_start or 0.0), 1) if r.copy_end else None,
                "pauses": r.pauses if r.copy else None, "paused_seconds": _r(r.paused_seconds, 1) if r.copy else None,
                "seconds_below": _r(r.seconds_below, 1) if r.load else None,
                "reaction_median_s": _r(rx[len(rx) // 2], 2) if rx else None, "reaction_max_s": _r(rx[-1], 2) if rx else None,
                "cpu_busy_pct": h.get("cpu_busy_pct"), "cpu_steal_pct": h.get("cpu_steal_pct"),
                "cpu_iowait_pct": h.get("cpu_iowait_pct"), "load1_max": h.get("load1_max"), "note": r.note,
            })
        return out

    def report(self) -> None:
        a = self.a
        self.out.mkdir(parents=True, exist_ok=True)
        self.count_in_windows()
        rows = self.rows()
        cond = self.conditions()
        windows: dict[int, dict[str, Any]] = {rnd + 1: {"seconds": round(w.seconds, 1), "latest_copy_end_s": _r(w.latest_copy_end_s, 1),
                             "contains_every_copy": w.contains_every_copy, "late": w.late}
                   for rnd, w in self.windows.items()}
        wtext = "; ".join(f"round {k}: window {v['seconds']:.1f}s from each load start, latest copy end "
                          f"+{v['latest_copy_end_s']}s" + ("" if v["contains_every_copy"] else
                                                          f" -- NOT CONTAINED: {', '.join(v['late'])}")
                          for k, v in windows.items())

        def fmt(v: Any, spec: str = "") -> str:
            return "-" if v is None else format(v, spec)

        cols = [("run", "run", "", 24), ("rnd", "round", "", 4), ("served", "served", "", 8), ("failed", "failed", "", 7),
                ("saved", "saved_responses", "+", 7), ("of lost", "lost_responses", "", 8),
                ("share", "saved_share", ".1%", 7), ("copy s", "copy_seconds", ".1f", 8),
                ("ends +s", "copy_end_s", ".1f", 8), ("slower", "copy_slower", "+.0%", 7), ("pauses", "pauses", "", 7),
                ("paused s", "paused_seconds", ".1f", 9), ("below s", "seconds_below", ".1f", 8),
                ("react s", "reaction_median_s", ".1f", 8), ("busy%", "cpu_busy_pct", ".0f", 6),
                ("steal%", "cpu_steal_pct", ".0f", 7), ("load", "load1_max", ".1f", 6)]
        head = "".join(f"{t:<{w}}" if i == 0 else f"{t:>{w}}" for i, (t, _, _, w) in enumerate(cols))
        lines = [head, "-" * len(head)]
        for row in rows:
            lines.append("".join(f"{fmt(row[k], spec):<{w}}" if i == 0 else f"{fmt(row[k], spec):>{w}}"
                                 for i, (_, k, spec, w) in enumerate(cols)))
        table = "\n".join(lines)
        notes = [row["note"] for row in rows if row["note"]]
        legend = ("served/failed: responses within the round's common window; saved: served(guard) - served(load+copy), "
                  "of lost = served(load-only) - served(load+copy); share = saved / lost; ends +s: copy end from the "
                  "load start; slower: copy s / mean unguarded copy s - 1; react s: median seconds below the threshold "
                  "when a pause took hold; busy%/steal%/load: CPU and max 1-min load average during the run")
        print("\n" + "=" * len(head))
        print(f"copy guard, reproduced: {cond}\n{wtext}\ncommand: {self.command()}\n")
        print(table)
        print("\n" + legend)
        for n in notes:
            print("NOTE: " + n)
        print(f"paper: saved {PAPER['saved_share']:.1%}; copy {PAPER['copy_unguarded_s']:.0f}s -> "
              f"{PAPER['copy_guarded_s']:.0f}s ({PAPER['slowdown']:+.0%}); {PAPER['below_before_pause_s']:.0f}s below the "
              "threshold before the pause.")
        quiet = [r for r in self.results if r.name == "quiet+copy+guard"]
        if quiet:
            print(f"quiet site: {sum(q.pauses for q in quiet)} pause(s) of the copy (target 0)")
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        summary = {"command": self.command(), "when": when, "conditions": cond, "windows": windows,
                   "threshold": round(self.threshold, 2), "rows": rows, "paper": PAPER, "legend": legend}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        md = ["| run | round | served | failed | lost responses saved | copy s | copy ends at | pauses | s below threshold "
              "| reaction median s | CPU busy / steal | load (max) |", "|" + "---|" * 12]
        for row in rows:
            saved = "-" if row["saved_responses"] is None else (
                f"{row['saved_responses']:+} of {row['lost_responses']}"
                + ("" if row["saved_share"] is None else f" ({row['saved_share']:.1%})"))
            md.append(f"| {row['run']} | {row['round']} | {fmt(row['served'])} | {fmt(row['failed'])} | {saved} | "
                      f"{fmt(row['copy_seconds'], '.1f')} | {fmt(row['copy_end_s'], '.1f')} | {fmt(row['pauses'])} | "
                      f"{fmt(row['seconds_below'], '.1f')} | {fmt(row['reaction_median_s'], '.1f')} | "
                      f"{fmt(row['cpu_busy_pct'], '.0f')}% / {fmt(row['cpu_steal_pct'], '.0f')}% | "
                      f"{fmt(row['load1_max'], '.1f')} |")
        (self.out / "summary.md").write_text(f"Copy guard, {when}. Command: `{self.command()}`\n\nConditions: {cond}.\n"
                                             f"{wtext}.\n\n" + "\n".join(md) + "\n\n" + legend + ".\n"
                                             + "".join(f"\nNOTE: {n}" for n in notes))
        payload = {**summary, "args": {k: str(v) for k, v in vars(a).items()},
                   "calibration": getattr(self, "calibration", None), "runs": [asdict(r) for r in self.results]}
        (self.out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
        with open(self.out / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["run"])
            w.writeheader()
            w.writerows(rows)
        from bench.copy_guard.plot import plot_summary, plot_timelines

        png = plot_timelines(self.results, self.threshold, self.out / "timeline.png",
                             title=f"copy guard on this machine: served RPS vs threshold {self.threshold:.1f}, pauses "
                                   "shaded, counting window to the dotted line")
        bars = plot_summary(rows, self.out / "summary.png", title=f"copy guard, {when}: {self.command()}")
        print(f"\nwrote {self.out / 'summary.json'}, {self.out / 'summary.md'}, {png}, {bars} "
              f"(raw: {self.out / 'results.json'}, {self.out / 'results.csv'})")


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.copy_guard", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="short version (~8 min): 0.25 GiB, 150 s of load, three loaded runs, one calibration run; "
                         "exits 0 even when a copy outlived the window (the report says so)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/copy_guard"))
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/promreflex-bench-copy-guard"),
                    help="data, copy and stack state (same disk as the copy's destination)")
    ap.add_argument("--disk-mbps", type=float, default=100.0, help="emulated disk speed, MB/s; 0 = the raw disk")
    ap.add_argument("--copy-gib", type=float, default=None, help="copy size (default 0.5, quick 0.25)")
    ap.add_argument("--site-data-mib", type=int, default=1024)
    ap.add_argument("--reads-per-page", type=int, default=24)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=100.0, help="offered requests per second (paper: 100)")
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--checkout-share", type=float, default=0.1)
    ap.add_argument("--load-seconds", type=float, default=None, help="load per run, the same in every loaded run: long enough for the slowest (guarded) copy to end "
                         "inside it (default 180, quick 150)")
    ap.add_argument("--copy-delay", type=float, default=None, help="copy starts this long into the load (default 8, quick 5)")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--cal-runs", type=int, default=None, help="calibration runs (default 3, quick 1; paper 5)")
    ap.add_argument("--cal-seconds", type=float, default=None, help="calibration run length (default 15, quick 12; paper 300)")
    ap.add_argument("--min-pause", type=float, default=20.0,
                    help="copy-guard min_pause for the guarded runs except guard-nohold (default 20s)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the loaded runs, alternating order")
    ap.add_argument("--reverse", action="store_true", help="start with the loaded runs in reverse order")
    ap.add_argument("--keep-data", action="store_true", help="keep the source and site files for the next run")
    ap.add_argument("--runs", type=lambda v: [x for x in v.split(",") if x], default=None,
                    help=f"comma-separated loaded runs (default all: {','.join(LOADED)}); saved shares need "
                         "load-only and load+copy")
    ap.add_argument("--no-quiet", action="store_true", help="skip the quiet-site run")
    ap.add_argument("--lock", type=Path, default=None,
                    help="take this flock for the calibration and for each run (not in between), e.g. "
                         "/tmp/promreflex-heavy.lock on a shared machine")
    a = ap.parse_args(argv)
    if a.runs is not None and (not a.runs or set(a.runs) - set(LOADED)):
        ap.error(f"--runs: choose from {', '.join(LOADED)}")
    quick = a.quick
    for name, full, short in (("copy_gib", 0.5, 0.25), ("load_seconds", 180.0, 150.0), ("copy_delay", 8.0, 5.0),
                              ("cal_runs", 3, 1), ("cal_seconds", 15.0, 12.0),
                              ("runs", LOADED, ["load-only", "load+copy", "load+copy+predictive"])):
        if getattr(a, name) is None:
            setattr(a, name, short if quick else full)
    if a.quick and a.out == Path("bench/results/copy_guard"):
        a.out = Path("bench/results/copy_guard/quick")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return Bench(args).run()
