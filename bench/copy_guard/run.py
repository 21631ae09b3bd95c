"""The copy-guard bench (issue 16): does the guard save the shop's responses without holding the
backup back? On a real PHP shop and on the built-in shop, side by side.

Shops (``--shop``):
  wordpress  Debian's WordPress on php-fpm and MariaDB behind its own nginx, set up by
             ``bench/shop`` in a private directory; the stack guards THAT nginx
             (``stack.nginx.external``: its access log and stub_status), it starts none.
             Copy: a real ``cp`` of ``--copy-gib`` GiB adopted by PID (buffered, on the raw disk:
             on this VM such a copy takes about a core of kernel time, STACK-NOTES).
  builtin    ``bench/copy_guard/site.py`` (product pages of uncached reads, fsync'd checkouts)
             behind the stack's nginx (8 workers); the site and the copy share an emulated
             40 MB/s disk (``bench/blkio.py``; capacity ~29 req/s, near the paper's 22).
             Copy: ``promreflex copy --io direct --chunk-size 128K`` (see ``SHOPS``).
``--copier`` overrides the copy (``cp`` or ``promreflex``).

Load: Locust with the shop's own profile (paths and weights, ``controllers/copy_guard``'s
profile format; WordPress: product pages, searches, the home page and review POSTs). The
threshold and the shop's capacity are calibrated first by the same code as ``promreflex
calibrate`` (closed-loop ramp to the knee, robust statistic; capacity = the median served rate at
the knee) and published where the rules read it, with the demand floor at the threshold and the
healthy response time. Then each SCENARIO (``bench/copy_guard/scenario.py``, proportions declared
there before measuring) drives the shop OPEN loop, visitors arriving on a schedule with a
client timeout: ``flash`` (the paper's use case: normal demand at half the capacity, a crowd of
4.46x capacity over the middle third of the copy), ``overload`` (the paper's experiment: 4.46x
for the whole run) and ``moderate`` (half the capacity, never overloaded: no pause, no
throttle); ``closed`` is the first bench's closed loop at the knee. The copy starts
``--copy-delay`` s into the load.

Arms (``bench/copy_guard/arms.py``; each scenario has its own list): load only, copy without
guard, the paper's rule (pause, resume at once), ``min_pause`` 20 s, the adaptive throttle at
its shipped defaults and at other settings (the Pareto), and a quiet shop (no visitors, only our
exporters) where the copy must never be paused. Runs are compared within a scenario.

Counting (fair to every arm): every loaded run of a scenario's round offers the same load for the
same ``--load-seconds``; responses are counted over the same window in every run, from the load's
start to the end of the shortest load of the round, and that window must contain every run's
WHOLE copy (the guarded ones take longest): a guard cannot score by pushing its copy past the
measurement. A round where a copy ends after the window gets no saved share (the report says
which; rerun with a longer load). Per arm: responses served (and failed) in the window, lost
responses saved ``(served_arm - served_noguard) / (served_loadonly - served_noguard)``, the copy's
duration and its slowdown vs the unguarded copy of the same round, pauses (the controller's
share of the copy at 0) and time held (share below 1), time below the threshold.

    uv run python -m bench.copy_guard --shop wordpress --lock /tmp/promreflex-heavy.lock
    uv run python -m bench.copy_guard --shop builtin --lock /tmp/promreflex-heavy.lock

``--lock`` holds the machine's heavy-job lock for chunks of runs of at most ``--lock-minutes``
(default 9) and lets other heavy jobs go between chunks; the shop and the stack idle meanwhile.

Writes ``summary.json``, ``summary.md``, ``pareto.png``, ``timeline.png`` (small, committed) and
``results.json`` (every run's timeline, not committed) under ``--out``
(default ``bench/results/copy_guard/<shop>``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from bench.blkio import EmulatedDisk
from bench.conditions import ChunkedLock, HostSampler, describe, parse_deadline
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
from bench.copy_guard.arms import ARMS, BASELINE, UNGUARDED, plan, route_for
from bench.copy_guard.copies import GB, GuardSampler, drop_cache, make_copy, remove_destination
from bench.copy_guard.pool import Pooled
from bench.copy_guard.pool import pool as pool_rounds
from bench.copy_guard.scenario import CLIENT_TIMEOUT_S, CROWD_SHARE, SCENARIOS, crowd_window, max_outstanding, oracle_hold
from bench.copy_guard.site import ensure_data_file, site_component
from bench.unwind import interrupt_once
from promreflex.config import Ports, load_config
from promreflex.proc import free_port, wait_until
from promreflex.stack import Stack

SITE = "shop"
ALERTS = "CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"
PAPER = {"saved_share": 0.623, "slowdown": 129 / 92 - 1}
TARGET = {"saved_share": 0.80, "slowdown": 0.40, "quiet_pauses": 0}
# copy_solo_seconds: the unguarded copy's length at the shop's normal demand (the flash crowd's
# timing, scenario.py), measured by a smoke run of this bench before the measured run.
# builtin: the emulated disk (blkio v1 throttle) serves its queued requests in turn, so a copy's
# 1 MiB requests against the site's 64 KiB reads took ~80% of it and a shop at half its capacity
# collapsed under an unthrottled copy (smoke run, 19:00 UTC). A disk scheduler interleaves a
# sequential stream with random reads more fairly; with 128 KiB copy requests and 8 site workers
# (8 x 64 KiB of the site's per 128 KiB of the copy) the site keeps most of the disk while the
# copy runs, so it serves its normal demand (half its capacity) with the copy at full speed, as
# the flash scenario requires, and the copy still costs it responses when it is saturated.
SHOPS: dict[str, dict[str, Any]] = {
    "wordpress": {"copier": "cp", "copy_gib": 3.0, "disk_mbps": 0.0, "copy_solo_seconds": 15.0, "workers": 4},
    "builtin": {"copier": "promreflex", "copy_gib": 0.5, "disk_mbps": 40.0, "copy_solo_seconds": 15.0, "workers": 8}}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _prom_value(prom: str, expr: str) -> float | None:
    try:
        with urllib.request.urlopen(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}),  # noqa: S310
                                    timeout=2) as resp:
            res = json.load(resp)["data"]["result"]
        return float(res[0]["value"][1]) if res else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The bench's verdicts: a moderate or quiet shop per run; a crowd's saved share on the rounds
    pooled (sum saved / sum lost, the copy's mean delay, the 90% interval over rounds)."""
    lines = []
    for sc in dict.fromkeys(row["scenario"] for row in rows if row["scenario"] in SCENARIOS):
        scr = [row for row in rows if row["scenario"] == sc]
        if sc == "moderate":
            for m in scr:
                if m["pauses"] is None:
                    continue
                ok = m["pauses"] == 0 and not m["held_seconds"]
                lines.append(f"moderate shop ({m['arm']}): {m['pauses']} pause(s), held {m['held_seconds']}s: "
                             f"{'met' if ok else 'NOT met'} (target: no pause, no throttle)")
            continue
        for o in (row for row in scr if row["saved_share"] is not None and row["copy_slower"] is not None
                  and ARMS[row["arm"]].oracle):
            lines.append(f"{sc}: the oracle (the bench held the copy {o['held_seconds']}s, the crowd and its drain) "
                         f"saved {o['saved_share']:.0%} at {o['copy_slower']:+.0%} (round {o['round']}): a yardstick, "
                         "not a guard")
        # Judged on the rounds pooled (bench.copy_guard.pool): one round's share rests on a few dozen
        # lost responses (it read 521% on 19), so a run is not "met" by its best round, nor by few rounds.
        guards = [p for p in pool_rounds([{"rows": scr}], sc)
                  if p.arm != "no-guard" and (p.counted or p.uncounted) and not ARMS[p.arm].oracle]

        def said(p: Pooled, why: str) -> str:
            iv = p.interval()
            n = len(p.counted) + p.uncounted
            return (f"{p.arm} ({n} round{'s' if n > 1 else ''}: saved {p.saved} of {p.lost} lost"
                    + (f", {p.share:.0%}" if p.share is not None else "")
                    + (f", approx. 90% interval over rounds {iv[0]:.0%} .. {iv[1]:.0%}" if iv else "")
                    + (f", copy {p.mean_slower:+.0%}" if p.mean_slower is not None else "") + f"; {why})")
        judged = [(p, *p.judge(TARGET)) for p in guards]
        meets = [said(p, why) for p, verdict, why in judged if verdict == "met"]
        others = [("undecided: " if verdict == "undecided" else "") + said(p, why) for p, verdict, why in judged
                  if verdict != "met"]
        if meets:
            lines.append(f"{sc}: target met by: " + ", ".join(meets) + ("; " + ", ".join(others) if others else ""))
        elif judged:
            lines.append(f"{sc}: target (saved >= {TARGET['saved_share']:.0%} with the copy at most "
                         f"{TARGET['slowdown']:+.0%}) NOT met by any arm: " + ", ".join(others))
    quiet = [row for row in rows if row["arm"] == "quiet"]
    if quiet:
        q = quiet[0]
        ok = (q["pauses"] or 0) == 0 and not q["guard_pauses_total"]
        lines.append(f"quiet shop: {q['pauses']} pause(s), held {q['held_seconds']}s, guard pauses counter "
                     f"{q['guard_pauses_total']}: {'met' if ok else 'NOT met'} (target 0)")
    return lines


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.work: Path = args.workdir / args.shop
        self.out: Path = args.out
        self.registry_dir = self.work / "copies"
        self.ports = {p: free_port() for p in Ports.model_fields}
        self.disk: EmulatedDisk | None = None
        self.results: list[RunResult] = []
        self.timelines: dict[tuple[str, int, str], tuple[dict[int, list[int]], float]] = {}
        self.windows: dict[tuple[str, int], Window] = {}
        self.capacity = 0.0  # the calibrated knee's median served rate: the scenarios' unit
        self.arm: str | None = None
        self.threshold = 0.0
        self.users = args.users
        self.calibration: dict[str, Any] | None = None
        self.lock = ChunkedLock(args.lock, args.lock_minutes * 60, log=log)
        self.shop: Any = None
        self.site_port = free_port()
        self.profile: tuple[list[Any], dict[str, list[Any]]] | None = None
        self.rebuilt = ""
        self.skipped: list[str] = []  # runs or scenarios left out to end before --deadline
        self.solo_measured: float | None = None  # --copy-solo-seconds 0: the unguarded copy's measured length

    # ------------------------------------------------------------------ setup
    def stack_config(self, routes: list[dict[str, Any]]) -> Stack:
        over: dict[str, Any] = {"stack.state_dir": str(self.work / "stack"), "stack.ports": self.ports,
                                "controller.reconcile_interval": "1s", "controller.routes": routes}
        extra = []
        if self.a.shop == "wordpress":
            over["stack.nginx"] = {"external": True, "url": self.shop.url + "/", "stub_status_url": self.shop.stub_status_url,
                                   "access_log": str(self.shop.access_log)}
        else:
            over["stack.upstream"] = f"127.0.0.1:{self.site_port}"
            extra.append(site_component(self.site_port, self.work / "site", data_size_mib=self.a.site_data_mib,
                                        reads_per_page=self.a.reads_per_page, workers=self.a.workers,
                                        cgroup=self.disk.dir if self.disk else None))
        return Stack(load_config(None, over), extra_components=extra)

    def set_arm(self, name: str) -> None:
        """Restart only the controller with the arm's route (configs re-rendered)."""
        routes = route_for(ARMS[name], str(self.registry_dir))
        key = json.dumps(routes, sort_keys=True)
        if key == self.arm:
            return
        stack = self.stack_config(routes)
        stack.render()
        stack.stop_component("controller")
        stack.start_component("controller", progress=lambda *_: None)
        self.arm = key
        log(f"  controller restarted: {json.dumps(routes[0]['params']) if routes else 'no copy-guard route'}")

    def target(self) -> str:
        return self.stack.site_url

    def prepare(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)  # nginx workers read the shop's files
        self.out.mkdir(parents=True, exist_ok=True)
        self.src = self.work / "source.bin"
        t = time.monotonic()
        if ensure_data_file(self.src, int(self.a.copy_gib * GB) // 4096 * 4096, chunk=64 << 20, repeat=True):
            log(f"wrote the copy's source ({self.a.copy_gib:g} GiB) in {time.monotonic() - t:.0f}s")
        self.dst = self.work / "backup" / "source.bin"
        self.dst.parent.mkdir(exist_ok=True)
        if self.a.shop == "builtin" and ensure_data_file(self.work / "site" / "products.dat", self.a.site_data_mib << 20):
            log(f"wrote the site's product file ({self.a.site_data_mib} MiB)")

    def start_shop(self) -> None:
        if self.a.shop == "wordpress":
            from bench.shop.wordpress import WordPressShop

            self.shop = WordPressShop(self.work / "wordpress", fpm_children=self.a.workers, products=self.a.products,
                                      keep=self.a.keep_data).up(progress=log)
            self.profile = self.shop_profile()
        else:
            from controllers.copy_guard.calibrate import builtin_shop

            self.profile = (builtin_shop(self.a.checkout_share), {})

    def shop_profile(self) -> tuple[list[Any], dict[str, list[Any]]]:
        from bench.shop.wordpress import PROFILE
        from controllers.copy_guard.calibrate import Request

        reqs = []
        for r in PROFILE:
            body = None
            if r.get("form"):
                body = "&".join(f"{k}={v}" for k, v in r["form"].items()).replace("{n}", "{uniq}").replace(" ", "+")
            reqs.append(Request(r["method"], r["path"], float(r["weight"]), body))
        return reqs, {"post": self.shop.post_ids, "word": self.shop.words}

    def load(self, seconds: float, scenario: str = "closed") -> Any:
        from controllers.copy_guard.calibrate import ShopLoad

        assert self.profile is not None
        reqs, variables = self.profile
        schedule = SCENARIOS[scenario].schedule(self.capacity, self.a.copy_delay, self.a.copy_solo_seconds,
                                                 self.a.crowd_share)
        return ShopLoad(self.target(), self.a.rate, self.users, seconds, profile=reqs, variables=variables,
                        request_timeout=CLIENT_TIMEOUT_S if schedule else self.a.request_timeout,
                        schedule=schedule, max_outstanding=max_outstanding(self.capacity))

    # ------------------------------------------------------------------ calibration
    def calibrate(self) -> None:
        from controllers.copy_guard.calibrate import calibrate, floor_for, publish, refusal

        a = self.a
        assert self.profile is not None
        reqs, variables = self.profile
        if a.shop_warmup > 0:  # a shop just set up is cold (opcache, buffer pool): warm it before it is measured
            users, self.users = self.users, a.users or 8
            run = self.load(a.shop_warmup).start().wait()
            self.users = users
            log(f"warm-up: {a.shop_warmup:g}s at {a.users or 8} users, served {run.ok} ({run.ok / a.shop_warmup:.0f} req/s), "
                f"{run.failed} failed (not counted)")
        log(f"calibrating {self.target()}: ramp to the knee (unless --users), {a.cal_runs} x {a.cal_seconds:g}s, "
            "robust threshold, no copy")
        cal = calibrate(self.target(), site=SITE, rate=a.rate, users=a.users, duration_s=a.cal_seconds, runs=a.cal_runs,
                        warmup_s=a.warmup, profile=reqs, variables=variables, step_s=a.ramp_step, max_users=a.max_users,
                        request_timeout=a.request_timeout, progress=lambda s: log("  " + s.strip()))
        assert cal.threshold is not None
        cal.floor = floor_for(cal.threshold)
        why = refusal(cal.threshold, cal.floor)
        if why:
            raise RuntimeError(f"calibration refused: {why}")
        self.threshold, self.users = float(cal.threshold), int(cal.users)
        self.capacity = cal.overall().median
        self.calibration = cal.to_json()
        publish(cal, self.stack.textfile_dir)
        prom = self.stack.url("prometheus")
        wait_until(lambda: _prom_value(prom, f'site:promreflex_copy_guard_threshold:rps{{site="{SITE}"}}') is not None,
                   timeout=30, what="threshold visible in Prometheus")
        rt = "unknown" if cal.response_s is None else f"{cal.response_s * 1000:.0f} ms"
        log(f"threshold {self.threshold:.1f} req/s, demand floor {cal.floor:.1f}, healthy response time {rt}, capacity "
            f"(median served at the knee) {self.capacity:.1f} req/s, {self.users} users: {cal.describe()}")
        for name in self.a.scenarios if self.a.copy_solo_seconds > 0 else ():
            log("  scenario " + self.describe_scenario(name))

    def describe_scenario(self, name: str) -> str:
        a = self.a
        return SCENARIOS[name].describe(self.capacity, a.copy_delay, a.copy_solo_seconds, a.crowd_share)

    def measure_copy_solo(self) -> None:
        """``--copy-solo-seconds 0``: time the flash crowd on THIS run's unguarded copy at the
        shop's normal demand (the moderate scenario's load, no guard, a ``--solo-load-seconds``
        load), measured after calibrating and before any arm; reported as scenario ``solo``."""
        a = self.a
        seconds, a.load_seconds = a.load_seconds, a.solo_load_seconds
        try:
            self.lock.before(self.expected_seconds(UNGUARDED))
            self.settle()
            r = self.one_run(0, UNGUARDED, "moderate")
        finally:
            a.load_seconds = seconds
        self.timelines[("solo", 0, r.name)] = self.timelines.pop(("moderate", 0, r.name))
        r.scenario = "solo"
        self.results.append(r)
        if r.copy_seconds is None:
            raise RuntimeError("the solo copy did not finish: cannot time the flash crowd")
        a.copy_solo_seconds = self.solo_measured = round(r.copy_seconds, 1)
        log(f"unguarded copy at normal demand: {a.copy_solo_seconds:g}s (times the flash crowd)")
        for name in a.scenarios:
            log("  scenario " + self.describe_scenario(name))

    # ------------------------------------------------------------------ one run
    def one_run(self, rnd: int, name: str, scenario: str = "closed") -> RunResult:
        arm, a = ARMS[name], self.a
        self.set_arm(name)
        prom = self.stack.url("prometheus")
        r = RunResult(name, rnd, arm.load, arm.copy, "none" if not arm.guarded else name, scenario=scenario)
        seconds = a.load_seconds if arm.load else 0.0
        how = "open loop" if scenario in SCENARIOS and SCENARIOS[scenario].open_loop else f"{self.users} users"
        log(f"run {scenario}/{name} (round {rnd + 1}): {arm.label}; load {f'{seconds:g}s, {how}' if arm.load else 'none'}, "
            f"copy {f'{a.copier} {a.copy_gib:g} GiB' if arm.copy else 'none'}")
        if self.shop is not None:  # the reviews the last run posted are deleted: every run meets the same shop
            log(f"  shop reset: {self.shop.reset()} review(s) of the last run deleted")
        drop_cache(self.src)
        remove_destination(self.dst)
        load = self.load(seconds, scenario) if arm.load else None
        copy = None
        guard = GuardSampler(self.stack.url("controller") + "/metrics", SITE).start()
        host = HostSampler().start()
        t0 = time.time()
        oracle_held: list[tuple[float, float]] = []
        copy_at = t0 + (a.copy_delay if arm.load else 0.0)
        deadline = t0 + (seconds if arm.load else 0) + a.copy_timeout
        try:
            if load is not None:
                load.start()
                # Open loop: the schedule's 0 s (after Locust's start-up) is the run's 0 s, the copy's too.
                t0 = r.load_start = load.epoch or t0
                copy_at = t0 + a.copy_delay
                deadline = t0 + seconds + a.copy_timeout
            if a.deadline is not None:
                deadline = min(deadline, a.deadline)
            next_progress = t0 + 10
            # The oracle arm: the bench stops the copy for exactly the crowd and its drain.
            hold = oracle_hold(a.copy_delay, a.copy_solo_seconds, self.capacity, a.crowd_share) \
                if arm.oracle and scenario == "flash" else None
            held_since: float | None = None
            while True:
                now = time.time()
                if arm.copy and copy is None and now >= copy_at:
                    self.registry_dir.mkdir(exist_ok=True)
                    copy = make_copy(a.copier, self.src, self.dst, self.registry_dir, SITE, self.out / "copy.log",
                                     self.disk.dir if self.disk else None, io=a.io, chunk=a.copy_chunk).start()
                    r.copy_start = copy.started
                if hold is not None and copy is not None:
                    if held_since is None and t0 + hold[0] <= now < t0 + hold[1] and copy.hold(True):
                        held_since = now
                    elif held_since is not None and now >= t0 + hold[1]:
                        copy.hold(False)
                        oracle_held.append((held_since, now))
                        hold = None
                load_on = load is not None and load.running()
                copy_on = arm.copy and (copy is None or copy.running())
                if not load_on and not copy_on:
                    break
                if now > deadline:
                    log("  deadline reached: stopping the run")
                    break
                if now >= next_progress:
                    next_progress += 10
                    rps = _prom_value(prom, f'site:promreflex_http_requests_served:rate1s{{site="{SITE}"}}')
                    share = guard.share[-1][1] if guard.share else 1.0
                    done = copy.progress[-1][1] / max(1, self.src.stat().st_size) if copy and copy.progress else 0.0
                    log(f"  t={now - t0:5.0f}s served {rps if rps is not None else float('nan'):6.1f} req/s  copy "
                        f"{'ended ' if copy is not None and not copy.running() else ''}{100 * done:5.1f}% share {share:.2f}  "
                        f"CPU busy {psutil.cpu_percent(interval=None):3.0f}% load {os.getloadavg()[0]:.1f}")
                time.sleep(0.1)
            if copy is not None:
                r.copy_seconds = copy.wait(timeout=max(0.1, deadline - time.time()))
                r.copy_end = copy.ended if r.copy_seconds is not None else None
                if r.copy_seconds is None:
                    r.note = f"copy did not finish within {a.copy_timeout:g}s after the load (killed)"
            if load is not None:
                run = load.wait()
                last = (max(run.bins) + 1) * run.bin_s if run.bins else time.time()
                r.served, r.failed, r.load_end = run.ok, run.failed, last - 1.0  # last second partial
                r.per_second = {k: v for k, v in per_second(run.bins, run.bin_s).items() if k < int(last - run.bin_s)}
                r.failed_per_second = {k: v for k, v in per_second(run.bins, run.bin_s, 1).items()
                                       if k < int(last - run.bin_s)}
                self.timelines[(scenario, rnd, name)] = (run.bins, run.bin_s)
        finally:
            if load is not None:
                load.kill()
            if copy is not None:
                copy.kill()
                copy.cleanup()
            r.host = host.stop()
            r.guard_counters = guard.stop()
        end = r.copy_end or time.time()
        timeline = [(t, s) for t, s in guard.share if r.copy_start is None or r.copy_start <= t <= end]
        r.pause_intervals = intervals([(t, s <= 0.0) for t, s in timeline])
        r.held_intervals = intervals([(t, s < 0.999) for t, s in timeline])
        r.pauses = len(r.pause_intervals)
        r.paused_seconds = sum(b - x for x, b in r.pause_intervals)
        r.held_seconds = sum(b - x for x, b in r.held_intervals)
        r.mean_share = statistics.mean(s for _, s in timeline) if timeline else None
        if arm.oracle:  # no controller: the bench's own stop is the pause
            r.pause_intervals = r.held_intervals = oracle_held
            r.pauses, r.mean_share = len(oracle_held), None
            r.paused_seconds = r.held_seconds = sum(b - x for x, b in oracle_held)
            timeline = [p for x, b in oracle_held for p in ((x, 1.0), (x, 0.0), (b, 0.0), (b, 1.0))]
        r.share_timeline = timeline
        ct = f"{r.copy_seconds:.1f}s" if r.copy_seconds is not None else "-"
        log(f"  -> served {r.served}, failed {r.failed}, copy {ct}, pauses {r.pauses} ({r.paused_seconds:.1f}s), held "
            f"{r.held_seconds:.1f}s, guard {json.dumps({k: round(v) for k, v in (r.guard_counters or {}).items()})}; "
            f"{describe(r.host)}")
        return r

    def expected_seconds(self, name: str) -> float:
        arm = ARMS[name]
        return (self.a.load_seconds if arm.load else self.a.quiet_seconds) + 15

    def settle(self) -> None:
        """Between runs: no copy-guard alert active, the shop idle for a moment."""
        prom = self.stack.url("prometheus")
        try:
            wait_until(lambda: _prom_value(prom, f'count(ALERTS{{alertname=~"{ALERTS}"}})') is None,
                       timeout=30, interval=0.5, what="copy-guard alerts to resolve")
        except Exception as e:  # noqa: BLE001 - report and go on
            log(f"  (settle: {e})")
        # An open-loop run leaves requests queued at the shop whose visitors gave up: the next run
        # must not meet that backlog.
        try:
            wait_until(lambda: (_prom_value(prom, f'site:nginx_requests_in_flight:count{{site="{SITE}"}}') or 0) < 1,
                       timeout=60, interval=0.5, what="the shop's backlog to drain")
        except Exception as e:  # noqa: BLE001 - report and go on
            log(f"  (settle: {e})")
        time.sleep(2)

    # ------------------------------------------------------------------ counting
    def count_in_windows(self) -> None:
        by_round: dict[tuple[str, int], list[RunResult]] = {}
        for r in self.results:
            if r.load:
                by_round.setdefault((r.scenario, r.round), []).append(r)
        for key, runs in by_round.items():
            rnd = key[1]
            w = self.windows[key] = common_window(runs)
            for r in runs:
                bins, bin_s = self.timelines[(r.scenario, rnd, r.name)]
                end = r.load_start + w.seconds
                if (self.rebuilt and r.window_s is not None and abs(r.window_s - w.seconds) < 1e-6
                        and r.served_window is not None and r.failed_window is not None):
                    continue  # a rebuilt report keeps the run's own counts (from finer bins than the 1 s it saved)
                r.window_s = w.seconds
                r.served_window = served_between(bins, bin_s, r.load_start, end)
                r.failed_window = served_between(bins, bin_s, r.load_start, end, column=1)
                rate = rolling_rate(bins, bin_s, r.load_start + self.a.warmup, end)
                r.seconds_below = seconds_below(rate, self.threshold, bin_s)
                if r.pause_intervals:
                    r.reaction_s = reaction_times(rate, self.threshold, [p for p, _ in r.pause_intervals if p <= end], bin_s)
            named = {r.name: r for r in runs}
            lo, cp = named.get(BASELINE), named.get(UNGUARDED)
            for r in runs:
                if cp is not None and r.copy_seconds is not None and cp.copy_seconds and r.name != UNGUARDED:
                    r.copy_slower = slowdown(r.copy_seconds, cp.copy_seconds)
                if lo is None or cp is None or r.name in (BASELINE, UNGUARDED) or not r.copy:
                    continue
                assert lo.served_window is not None and cp.served_window is not None and r.served_window is not None
                r.lost_responses = lo.served_window - cp.served_window
                r.saved_responses = r.served_window - cp.served_window
                # A comparison counts only over a window holding the whole copy of both runs compared
                # (this arm's and the unguarded one); an arm whose copy outlived it gets no share.
                late = [n for n in (r.name, UNGUARDED) if n in w.late]
                if not late:
                    r.saved_share = saved_share(lo.served_window, cp.served_window, r.served_window)
                else:
                    said = (f"round {rnd + 1}: the copy of {' and '.join(late)} ended after the {w.seconds:.0f}s window; "
                            "share not reported")
                    if said not in r.note:  # (a rebuilt report reads the note the run wrote)
                        r.note = (r.note + "; " if r.note else "") + said

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        a = self.a
        # The first interrupt (Ctrl-C or SIGTERM) stops the bench and reports what was measured; a
        # second one (uv forwards the signal a timeout sent its whole group) must not cut the
        # clean-up short: it would leave a copy or the stack running (bench/unwind.py).
        interrupt_once(term_interrupts=True)
        if a.disk_mbps > 0 and not EmulatedDisk.available():
            log("no cgroup v1 blkio hierarchy (or not root): run with --disk-mbps 0")
            return 2
        try:
            # writing the copy's source (GiBs) is heavy I/O too: under the lock
            self.lock.before(a.shop_warmup + a.cal_runs * a.cal_seconds + 12 * a.ramp_step + 90)  # (6 ramp steps, each maybe measured twice)
            self.prepare()
            if a.disk_mbps > 0:
                self.disk = EmulatedDisk(self.work, a.disk_mbps).create()
                log(f"emulated disk: {a.disk_mbps:g} MB/s on {self.disk.device}, shared by the site and the copy")
            self.start_shop()
            self.stack = self.stack_config([])
            log(f"starting the stack (state {self.work / 'stack'})")
            self.stack.up(progress=log)
            prom = self.stack.url("prometheus")
            wait_until(lambda: _prom_value(prom, 'up{job="accesslog"} == 1'), timeout=60, what="access-log exporter scraped")
            self.calibrate()
            if a.copy_solo_seconds <= 0:
                self.measure_copy_solo()
            runs = [(sc, rnd, name) for sc in a.scenarios
                    for rnd, name in plan(self.arms_of(sc), a.rounds, a.reverse, quiet=False)]
            runs += [] if a.no_quiet else [("quiet", 0, "quiet")]
            runs = self.fit_deadline(runs)
            try:
                for sc, rnd, name in runs:
                    if a.deadline is not None and time.time() + self.expected_seconds(name) > a.deadline:
                        self.skipped.append(f"{sc}/{name} (deadline)")
                        log(f"skipping {sc}/{name}: it would end after the deadline")
                        continue
                    self.lock.before(self.expected_seconds(name))
                    self.settle()
                    r = (self.one_run(rnd, name, sc) if ARMS[name].load else self.quiet_run())
                    self.results.append(r)
                    self.write_progress()
            except KeyboardInterrupt:  # e.g. the slot's hard stop: report what was measured
                done = {(r.scenario, r.name) for r in self.results}
                self.skipped.append("interrupted: " + ", ".join(f"{sc}/{n}" for sc, _, n in runs if (sc, n) not in done))
                log("interrupted: reporting the runs measured so far")
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            self.lock.release()
            self.teardown()
        self.report()
        # 3: some copy ended after its round's window (no saved share); the demo (--quick) shows the note either way
        return 0 if self.a.quick or all(w.contains_every_copy for w in self.windows.values()) else 3

    def report_from(self, path: Path) -> int:
        """Rebuild the report from an earlier ``results.json`` (a bench that was stopped before its
        report): the runs as recorded, the Locust timelines at 1 s resolution (its per-second counts)."""
        data = json.loads(path.read_text())
        cal = data.get("calibration") or {}
        self.calibration, self.threshold, self.users = cal, float(cal.get("threshold") or 0.0), int(cal.get("users") or 0)
        self.capacity = float((cal.get("overall") or {}).get("median") or 0.0)
        fields = set(RunResult.__dataclass_fields__)
        for raw in data["runs"]:
            r = RunResult(**{k: v for k, v in raw.items() if k in fields})
            for key in ("per_second", "failed_per_second"):
                setattr(r, key, {int(k): v for k, v in (getattr(r, key) or {}).items()})
            for key in ("pause_intervals", "held_intervals", "share_timeline"):
                setattr(r, key, [tuple(x) for x in (getattr(r, key) or [])])
            if r.load:
                failed = r.failed_per_second or {}
                self.timelines[(r.scenario, r.round, r.name)] = ({s: [n, failed.get(s, 0)] for s, n in (r.per_second or {}).items()}, 1.0)
            self.results.append(r)
        self.rebuilt = (f"report rebuilt from {path.name} (its runs' own counts where it recorded them, else the Locust "
                        "timelines at 1 s resolution; lock time not recorded)")
        log(f"report from {path}: {len(self.results)} run(s), threshold {self.threshold:.1f}, {self.users} users")
        self.report()
        return 0

    def fit_deadline(self, runs: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
        """Without ``--deadline`` every run. With it, whole scenarios in order while they fit (a
        scenario cut short compares nothing), keeping the quiet arm's time; skipped ones are noted."""
        if self.a.deadline is None:
            return runs
        quiet = [x for x in runs if x[2] == "quiet"]
        left = self.a.deadline - time.time() - sum(self.expected_seconds(n) for *_, n in quiet)
        out: list[tuple[str, int, str]] = []
        for sc in dict.fromkeys(x[0] for x in runs if x[2] != "quiet"):
            mine = [x for x in runs if x[0] == sc and x[2] != "quiet"]
            need = sum(self.expected_seconds(n) for *_, n in mine)
            if need <= left:
                out += mine
                left -= need
            else:
                self.skipped.append(f"scenario {sc} ({len(mine)} runs, {need / 60:.1f} min; {max(left, 0) / 60:.1f} min left)")
                log(f"skipping scenario {sc}: {need / 60:.1f} min of runs, {max(left, 0) / 60:.1f} min left before the deadline")
        return out + quiet

    def arms_of(self, scenario: str) -> list[str]:
        """The scenario's arms; ``--arms`` replaces those of ``flash`` and ``closed``,
        ``--moderate-arms`` those of ``moderate``."""
        if self.a.arms is not None and scenario in ("flash", "closed"):
            return list(self.a.arms)
        if self.a.moderate_arms is not None and scenario == "moderate":
            return list(self.a.moderate_arms)
        return list(SCENARIOS[scenario].arms)

    def quiet_run(self) -> RunResult:
        """No visitors at all for a while, then the copy under the shipped route: it must never
        be paused or slowed (the exporters' own requests are not demand)."""
        log(f"quiet shop: no visitors for {self.a.quiet_idle:g}s before the copy")
        time.sleep(self.a.quiet_idle)
        return self.one_run(0, "quiet", "quiet")

    def teardown(self) -> None:
        stack = getattr(self, "stack", None)
        if stack is not None:
            stack.down(quiet=True)
        if self.shop is not None:
            self.shop.down()
        if self.disk:
            self.disk.remove()
        shutil.rmtree(self.registry_dir, ignore_errors=True)
        shutil.rmtree(self.work / "backup", ignore_errors=True)
        shutil.rmtree(self.work / "stack", ignore_errors=True)
        if not self.a.keep_data:
            shutil.rmtree(self.work, ignore_errors=True)

    def write_progress(self) -> None:
        """Every finished run, raw, so an interrupted bench leaves its measurements behind."""
        (self.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(self.a).items()},
                                                           "calibration": self.calibration,
                                                           "runs": [asdict(r) for r in self.results]}, default=str))

    # ------------------------------------------------------------------ output
    def command(self) -> str:
        defaults = vars(parse_args(["--shop", self.a.shop, *(["--quick"] if self.a.quick else [])]))

        def value(v: Any) -> str:
            return "" if v is True else " " + (",".join(v) if isinstance(v, list) else str(v))

        given = {**vars(self.a), **({"copy_solo_seconds": 0.0} if self.solo_measured else {})}
        flags = [f"--{k.replace('_', '-')}{value(v)}" for k, v in given.items()
                 if k not in ("shop", "lock", "quick", "report_from", "deadline") and v != defaults.get(k) and v is not False]
        return " ".join(["uv run python -m bench.copy_guard --shop", self.a.shop, *(["--quick"] if self.a.quick else []), *flags,
                         *(["--lock", str(self.a.lock)] if self.a.lock else [])])

    def conditions(self) -> str:
        a = self.a
        shop = (f"WordPress {self._wp_version()} (Debian), php-fpm {a.workers} workers, MariaDB, its own nginx guarded "
                f"as an external nginx; {a.products} products" if a.shop == "wordpress" else
                f"built-in shop ({a.workers} workers, {a.reads_per_page} x 64 KiB uncached reads per page, 1 in "
                f"{1 / a.checkout_share:.0f} requests an fsync'd checkout) behind the stack's nginx")
        disk = f"emulated {a.disk_mbps:g} MB/s disk shared by site and copy" if a.disk_mbps else "raw disk"
        copy = f"{'cp, adopted by PID' if a.copier == 'cp' else f'promreflex copy --io {a.io}'} of {a.copy_gib:g} GiB"
        scen = "; ".join(self.describe_scenario(n) for n in a.scenarios)
        return (f"{os.cpu_count()} cores shared with other work; {shop}; {disk}; copy {copy}, cold source, starting "
                f"+{a.copy_delay:g}s into the load; load: the shop's profile; capacity {self.capacity:.1f} req/s (median "
                f"served at the calibrated knee, {self.users} users); scenarios: {scen}; {a.load_seconds:g}s per run; "
                f"threshold {self.threshold:.1f} req/s (calibrated, robust), demand floor = threshold; "
                + (self.rebuilt or f"heavy lock held {self.lock.held_s / 60:.1f} min in {self.lock.chunks} chunk(s)"))

    @staticmethod
    def _wp_version() -> str:
        try:
            text = Path("/usr/share/wordpress/wp-includes/version.php").read_text()
            return text.split("$wp_version = '", 1)[1].split("'", 1)[0]
        except (OSError, IndexError):
            return "?"

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for r in self.results:
            rx = sorted(r.reaction_s or [])
            h = r.host or {}
            gc = r.guard_counters or {}
            out.append({
                "scenario": r.scenario, "arm": r.name, "label": ARMS[r.name].label, "round": r.round + 1,
                "window_s": _r(r.window_s, 1),
                "served": r.served_window if r.load else None, "failed": r.failed_window if r.load else None,
                "lost_responses": r.lost_responses, "saved_responses": r.saved_responses,
                "saved_share": _r(r.saved_share, 3), "copy_seconds": _r(r.copy_seconds, 1),
                # (this arm's copy or the unguarded one's ended after the window: the round has no share)
                "copy_outlived_window": any(n in self.windows[(r.scenario, r.round)].late for n in (r.name, UNGUARDED))
                if (r.scenario, r.round) in self.windows and r.copy else None,
                "copy_slower": _r(r.copy_slower, 3),
                "copy_end_s": _r(r.copy_end - (r.load_start or r.copy_start or 0.0), 1) if r.copy_end else None,
                "pauses": r.pauses if r.copy else None, "paused_seconds": _r(r.paused_seconds, 1) if r.copy else None,
                "held_seconds": _r(r.held_seconds, 1) if r.copy else None, "mean_share": _r(r.mean_share, 2),
                "guard_pauses_total": gc.get("pauses_total"), "emergency_pauses": gc.get("emergency_pauses_total"),
                "seconds_below": _r(r.seconds_below, 1) if r.load else None,
                "reaction_median_s": _r(rx[len(rx) // 2], 2) if rx else None,
                "cpu_busy_pct": h.get("cpu_busy_pct"), "cpu_steal_pct": h.get("cpu_steal_pct"),
                "cpu_iowait_pct": h.get("cpu_iowait_pct"), "load1_max": h.get("load1_max"), "note": r.note,
            })
        return out

    def report(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.count_in_windows()
        rows = self.rows()
        cond = self.conditions()
        windows: dict[str, dict[str, Any]] = {
            f"{sc} round {rnd + 1}": {"seconds": round(w.seconds, 1), "latest_copy_end_s": _r(w.latest_copy_end_s, 1),
                                      "contains_every_copy": w.contains_every_copy, "late": w.late}
            for (sc, rnd), w in self.windows.items()}
        wtext = "; ".join(f"{k}: window {v['seconds']:.1f}s from each load start, latest copy end +{v['latest_copy_end_s']}s"
                          + ("" if v["contains_every_copy"] else f" -- NOT CONTAINED: {', '.join(v['late'])}")
                          for k, v in windows.items())

        def fmt(v: Any, spec: str = "") -> str:
            return "-" if v is None else format(v, spec)

        cols = [("scenario", "scenario", "", 10), ("arm", "arm", "", 17), ("rnd", "round", "", 4), ("served", "served", "", 8), ("failed", "failed", "", 7),
                ("saved", "saved_responses", "+", 7), ("of lost", "lost_responses", "", 8), ("share", "saved_share", ".1%", 8),
                ("copy s", "copy_seconds", ".1f", 8), ("slower", "copy_slower", "+.0%", 8), ("pauses", "pauses", "", 7),
                ("paused s", "paused_seconds", ".1f", 9), ("held s", "held_seconds", ".1f", 8),
                ("share", "mean_share", ".2f", 6), ("below s", "seconds_below", ".1f", 8), ("busy%", "cpu_busy_pct", ".0f", 6),
                ("steal%", "cpu_steal_pct", ".0f", 7)]
        head = "".join(f"{t:<{w}}" if i == 0 else f"{t:>{w}}" for i, (t, _, _, w) in enumerate(cols))
        table = "\n".join([head, "-" * len(head)] + ["".join(
            f"{fmt(row[k], spec):<{w}}" if i == 0 else f"{fmt(row[k], spec):>{w}}" for i, (_, k, spec, w) in enumerate(cols))
            for row in rows])
        legend = ("served/failed: responses in the round's common window; saved: served(arm) - served(no-guard), of lost = "
                  "served(load-only) - served(no-guard); share = saved / lost; slower: copy s / no-guard copy s of the "
                  "round - 1; pauses / paused s: the controller's share of the copy at 0; held s: share below 1 (paused "
                  "or throttled); share: mean share while the copy ran; below s: seconds the served rate spent below the "
                  "threshold; busy%/steal%: CPU during the run")
        verdict = verdict_lines(rows)
        notes = [row["note"] for row in rows if row["note"]]
        if self.skipped:
            notes.append("not run, to end before the heavy slot's deadline: " + "; ".join(self.skipped))
        print("\n" + "=" * len(head))
        print(f"copy guard, {self.a.shop} shop: {cond}\n{wtext}\ncommand: {self.command()}\n")
        print(table + "\n\n" + legend)
        for n in notes:
            print("NOTE: " + n)
        for v in verdict:
            print("VERDICT: " + v)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        summary = {"shop": self.a.shop, "command": self.command(), "when": when, "conditions": cond, "windows": windows,
                   "threshold": round(self.threshold, 2), "capacity": round(self.capacity, 2), "users": self.users,
                   "scenarios": {n: self.describe_scenario(n) for n in self.a.scenarios},
                   "rows": rows, "target": TARGET, "skipped": self.skipped,
                   "copy_solo_seconds": self.a.copy_solo_seconds, "copy_solo_measured": self.solo_measured is not None,
                   "paper": PAPER, "verdict": verdict, "legend": legend,
                   "calibration": {k: (self.calibration or {}).get(k) for k in ("threshold", "method", "users", "spread",
                                                                               "floor", "response_s", "ramp", "discarded")}}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        md = ["| scenario | arm | round | served | failed | lost responses saved | copy s | copy slower | pauses | held s | "
              "mean share | s below threshold | CPU busy / steal |", "|" + "---|" * 13]
        for row in rows:
            saved = "-" if row["saved_responses"] is None else (
                f"{row['saved_responses']:+} of {row['lost_responses']}"
                + ("" if row["saved_share"] is None else f" ({row['saved_share']:.1%})"))
            md.append(f"| {row['scenario']} | {row['label']} | {row['round']} | {fmt(row['served'])} | {fmt(row['failed'])} | {saved} | "
                      f"{fmt(row['copy_seconds'], '.1f')} | {fmt(row['copy_slower'], '+.0%')} | {fmt(row['pauses'])} | "
                      f"{fmt(row['held_seconds'], '.1f')} | {fmt(row['mean_share'], '.2f')} | {fmt(row['seconds_below'], '.1f')} | "
                      f"{fmt(row['cpu_busy_pct'], '.0f')}% / {fmt(row['cpu_steal_pct'], '.0f')}% |")
        (self.out / "summary.md").write_text(
            f"Copy guard, {self.a.shop} shop, {when}. Command: `{self.command()}`\n\nConditions: {cond}.\n{wtext}.\n\n"
            + "\n".join(md) + "\n\n" + legend + ".\n" + "".join(f"\nNOTE: {n}\n" for n in notes)
            + "".join(f"\n**{v}**\n" for v in verdict))
        self.write_progress()
        from bench.copy_guard.plot import plot_pareto, plot_timelines

        main_sc = next((sc for sc in ("flash", "closed", "overload") if sc in self.a.scenarios), "closed")
        pareto = plot_pareto([row for row in rows if row["scenario"] == main_sc], self.out / "pareto.png", TARGET,
                             title=f"copy guard, {self.a.shop} shop, {main_sc} scenario, {when}: lost responses saved vs "
                                   "copy delay")
        crowds = {"flash": crowd_window(self.a.copy_delay, self.a.copy_solo_seconds, self.a.crowd_share)}
        tl = plot_timelines(self.results, self.threshold, self.out / "timeline.png", crowds=crowds,
                            title=f"{self.a.shop} shop: served RPS vs threshold {self.threshold:.1f}; copy held (share < 1) "
                                  "shaded, paused darker")
        print(f"\nwrote {self.out / 'summary.json'}, {self.out / 'summary.md'}, {pareto}, {tl} (raw: {self.out / 'results.json'})")


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.copy_guard", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shop", choices=list(SHOPS), default=None,
                    help="wordpress (default) or builtin (the default with --quick: it needs no PHP packages)")
    ap.add_argument("--quick", action="store_true",
                    help="the demo (~6 min): load only, no guard, the paper's rule and the throttle, 60 s each, a smaller "
                         "copy, one calibration run; into <out>/quick; exits 0 even when a copy outlived the window")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/copy_guard/<shop>")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/promreflex-bench-copy-guard"),
                    help="shop, copy source/destination and stack state (<workdir>/<shop>)")
    ap.add_argument("--copier", choices=["cp", "promreflex"], default=None, help="default: cp (wordpress), promreflex (builtin)")
    ap.add_argument("--io", default="direct", help="promreflex copy --io (default direct)")
    ap.add_argument("--copy-gib", type=float, default=None, help="copy size (default: wordpress 3, builtin 0.5)")
    ap.add_argument("--disk-mbps", type=float, default=None, help="emulated disk MB/s, 0 = raw (default: builtin 40, wordpress 0)")
    ap.add_argument("--workers", type=int, default=None, help="php-fpm workers / built-in site workers (default 4 / 8)")
    ap.add_argument("--copy-chunk", default="128K", help="promreflex copy --chunk-size (default 128K, see SHOPS)")
    ap.add_argument("--products", type=int, default=300, help="wordpress: product posts")
    ap.add_argument("--site-data-mib", type=int, default=1024, help="builtin: product file size")
    ap.add_argument("--reads-per-page", type=int, default=24, help="builtin: uncached reads per page")
    ap.add_argument("--checkout-share", type=float, default=0.1, help="builtin: share of fsync'd checkouts")
    ap.add_argument("--rate", type=float, default=0.0, help="offered req/s (0: closed loop, the default)")
    ap.add_argument("--users", type=int, default=None, help="Locust users (default: calibrate's ramp finds the knee)")
    ap.add_argument("--max-users", type=int, default=32)
    ap.add_argument("--ramp-step", type=float, default=8.0, help="seconds per ramp step")
    ap.add_argument("--request-timeout", type=float, default=10.0)
    ap.add_argument("--load-seconds", type=float, default=85.0, help="load per loaded run, the same in every one: long "
                    "enough for the slowest copy to end inside it")
    ap.add_argument("--copy-delay", type=float, default=5.0, help="the copy starts this long into the load")
    ap.add_argument("--copy-timeout", type=float, default=120.0, help="a copy still running this long after the load is killed")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--shop-warmup", type=float, default=20.0, help="seconds of load before calibrating (not counted)")
    ap.add_argument("--cal-runs", type=int, default=2)
    ap.add_argument("--cal-seconds", type=float, default=20.0)
    ap.add_argument("--min-pause", type=float, default=20.0, help="min_pause of the min-pause arm (default 20)")
    ap.add_argument("--arms", type=lambda v: [x for x in v.split(",") if x], default=None,
                    help=f"loaded arms of the flash and closed scenarios, comma-separated (default: the scenario's, "
                         f"scenario.py; all: {','.join(n for n, a in ARMS.items() if a.load)})")
    ap.add_argument("--moderate-arms", type=lambda v: [x for x in v.split(",") if x], default=None,
                    help="arms of the moderate scenario (default: the shipped throttle alone)")
    ap.add_argument("--scenarios", type=lambda v: [x for x in v.split(",") if x], default=["flash", "overload", "moderate"],
                    help=f"load scenarios, in order (default flash,overload,moderate; all: {','.join(SCENARIOS)})")
    ap.add_argument("--crowd-share", type=float, default=CROWD_SHARE,
                    help="flash: the crowd lasts this share of the unguarded copy (default 1/3, at most 1/3)")
    ap.add_argument("--copy-solo-seconds", type=float, default=None,
                    help="the unguarded copy's length at the shop's normal demand: times the flash crowd (scenario.py; "
                         "default per shop, from the smoke run; 0: measure it in this run first, see --solo-load-seconds)")
    ap.add_argument("--solo-load-seconds", type=float, default=30.0,
                    help="with --copy-solo-seconds 0: the load of the run that times the unguarded copy")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reverse", action="store_true", help="start with the arms in reverse order")
    ap.add_argument("--no-quiet", action="store_true", help="skip the quiet-shop arm")
    ap.add_argument("--quiet-idle", type=float, default=15.0, help="quiet arm: seconds without visitors before the copy")
    ap.add_argument("--quiet-seconds", type=float, default=60.0, help="quiet arm: expected length (for the lock chunks)")
    ap.add_argument("--keep-data", action="store_true", help="keep the shop and the copy source for the next run")
    ap.add_argument("--report-from", type=Path, default=None,
                    help="only write the report from an earlier results.json (same flags as that run)")
    ap.add_argument("--lock", type=Path, default=None, help="heavy-job lock to hold in chunks (e.g. /tmp/promreflex-heavy.lock)")
    ap.add_argument("--lock-minutes", type=float, default=9.0, help="longest chunk of runs under the lock")
    ap.add_argument("--deadline", type=parse_deadline, default=None,
                    help="wall-clock end of the heavy slot, HH:MM (UTC, today) or Unix seconds: a scenario that cannot "
                         "finish before it is skipped whole (time kept for the quiet arm), a run still going at it "
                         "is stopped, and the report is written from what was measured")
    a = ap.parse_args(argv)
    a.shop = a.shop or ("builtin" if a.quick else "wordpress")
    bad = [x for x in (a.arms or []) + (a.moderate_arms or []) if x not in ARMS or not ARMS[x].load]
    bad += [f"scenario {x}" for x in a.scenarios if x not in SCENARIOS]
    if bad:
        ap.error(f"--arms: unknown {', '.join(bad)} (choose from {', '.join(n for n, x in ARMS.items() if x.load)})")
    if a.quick:
        a.arms = a.arms or ["load-only", "no-guard", "paper", "throttle"]
        a.scenarios = ["flash"] if a.scenarios == ["flash", "overload", "moderate"] else a.scenarios
        a.load_seconds, a.cal_runs, a.cal_seconds = min(a.load_seconds, 60.0), 1, 12.0
        a.copy_gib = a.copy_gib or SHOPS[a.shop]["copy_gib"] / 2
    for key, value in SHOPS[a.shop].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.out is None:
        a.out = Path("bench/results/copy_guard") / a.shop / ("quick" if a.quick else "")
    if a.min_pause != 20.0:
        ARMS["min-pause-20s"].params["min_pause"] = f"{a.min_pause:g}s"  # type: ignore[index]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        bench = Bench(args)
        return bench.report_from(args.report_from) if args.report_from else bench.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
