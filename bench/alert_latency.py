"""Alert-to-action latency on the real local stack, idle and with both cores saturated.

For each setting, a stack is started on free loopback ports and the self-test gauge
(node_exporter textfile) is flipped N times, each flip at a random phase of the scrape cycle.
Latency = the log action's own timestamp minus the moment the gauge file was written: scrape,
rule evaluation, Alertmanager, webhook and action together. The settings run one after the
other in one process and are printed side by side with the conditions they ran under (CPU busy
and steal, load average, CPU used by the control plane and by the load).

Settings (``--settings``, comma-separated; default all):

  fast        scrape/eval 200 ms, group_interval 200 ms, resend-delay 1 s (promreflex default)
  1s          scrape/eval 1 s, group_interval 1 s, resend-delay 1 s
  saturated   fast, and the shop of ``bench/copy_guard/site.py`` behind the stack's nginx,
              driven by Locust (``--load-procs`` processes, each ``--load-rate`` req/s offered,
              loopback only, bounded in time) until both cores are busy; everything at the same
              priority
  weighted    the same load, the control plane (Prometheus, Alertmanager, controller,
              exporters) started at ``nice --control-plane-nice`` (default -10): what the README
              recommends for hosts that get overloaded; the shop, its nginx and Locust stay at 0

    uv run python -m bench.alert_latency --lock /tmp/promreflex-heavy.lock [--flips 20]

(``--lock``: hold the machine's heavy-job lock for each setting, not in between.)

Writes ``results.json`` (every flip), ``summary.json`` and ``summary.md`` (the table and its
conditions) and ``latency.png`` under ``--out`` (default ``bench/results/alert_latency``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.conditions import HostSampler, describe, heavy_lock
from promreflex.config import Ports, load_config
from promreflex.proc import free_port, http_ok, wait_until
from promreflex.stack import Stack, write_selftest_switch

PORTS = tuple(Ports.model_fields)
CONTROL_PLANE = ("prometheus", "alertmanager", "controller", "node_exporter", "nginx_exporter", "accesslog_exporter")
SHOP = ("shop_site", "nginx")  # the load's side: the site, the nginx in front of it (and Locust)
COMMAND = "uv run python -m bench.alert_latency"


@dataclass(frozen=True)
class Setting:
    key: str
    name: str
    interval: str  # scrape and rule evaluation
    group_interval: str
    resend: str
    shop_load: bool = False
    weighted: bool = False  # control plane at a higher CPU weight (negative nice) than the load


SETTINGS = {s.key: s for s in (
    Setting("fast", "fast (default): scrape/eval 200 ms, group_interval 200 ms, resend-delay 1 s",
            "200ms", "200ms", "1s"),
    Setting("1s", "1 s intervals: scrape/eval 1 s, group_interval 1 s, resend-delay 1 s", "1s", "1s", "1s"),
    Setting("saturated", "fast, both cores saturated by the shop, same priority", "200ms", "200ms", "1s",
            shop_load=True),
    Setting("weighted", "fast, both cores saturated by the shop, control plane at nice {nice}", "200ms", "200ms",
            "1s", shop_load=True, weighted=True),
)}


def action_times(path: Path, transition: str) -> list[float]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [r["ts"] for r in map(json.loads, lines) if r["transition"] == transition]


@contextmanager
def niceness(value: int) -> Iterator[None]:
    """Run the block at ``value`` (children started in it inherit it), then go back."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, value)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def renice_tree(pid: int, value: int) -> int:
    """Set the nice value of a process, its descendants and every thread of each (Linux nice is
    per thread); returns the number of threads changed."""
    n = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            for t in p.threads():
                os.setpriority(os.PRIO_PROCESS, t.id, value)
                n += 1
        except (psutil.Error, OSError):
            continue
    return n


class ShopLoad:
    """The shop behind the stack's nginx, loaded by Locust processes for a bounded time."""

    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.port = free_port()
        self.data_dir = args.workdir / "site"
        self.loads: list[Any] = []
        self.totals: dict[str, int | None] = {"ok": None, "failed": None}
        self.rps: float | None = None

    def component(self) -> Any:
        from bench.copy_guard.site import ensure_data_file, site_component

        if ensure_data_file(self.data_dir / "products.dat", self.a.site_data_mib << 20):
            print(f"  wrote the shop's product file ({self.a.site_data_mib} MiB) in {self.data_dir}")
        return site_component(self.port, self.data_dir, data_size_mib=self.a.site_data_mib,
                              reads_per_page=self.a.reads_per_page, workers=self.a.site_workers)

    def start(self, target: str, duration_s: float) -> None:
        from controllers.copy_guard.calibrate import ShopLoad as Locust

        for _ in range(self.a.load_procs):
            self.loads.append(Locust(target, self.a.load_rate, self.a.load_users, duration_s, margin_s=60).start())

    def pids(self) -> list[int]:
        return [ld.proc.pid for ld in self.loads if ld.running()]

    def stop(self) -> None:
        """SIGTERM: Locust quits cleanly and writes its totals."""
        ok = failed = 0
        seconds = 0.0
        for ld in self.loads:
            if ld.running():
                os.kill(ld.proc.pid, signal.SIGTERM)
            try:
                run = ld.wait()
            except Exception as e:  # noqa: BLE001 - the totals are a condition, not the figure
                print(f"  (load totals unavailable: {e})")
                ld.kill()
                return
            ok, failed = ok + run.ok, failed + run.failed
            seconds = max(seconds, run.ended - run.started)
        self.totals = {"ok": ok, "failed": failed}
        self.rps = ok / seconds if seconds else None


def run_setting(s: Setting, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    actions = workdir / "actions.jsonl"
    shop = ShopLoad(args) if s.shop_load else None
    overrides: dict[str, Any] = {
        "stack.state_dir": str(workdir / "state"),
        "stack.ports": {p: free_port() for p in PORTS},
        "stack.fast_interval": s.interval,
        "stack.group_interval": s.group_interval,
        "stack.resend_delay": s.resend,
        "controller.reconcile_interval": "30s",
        "controller.routes": [{"name": "bench", "matchers": ['alertname="PromreflexSelftest"'], "action": "log",
                               "params": {"message": "bench", "path": str(actions)}}],
    }
    if shop is not None:
        overrides["stack.upstream"] = f"127.0.0.1:{shop.port}"
    stack = Stack(load_config(None, overrides), extra_components=[shop.component()] if shop else None)
    name = s.name.format(nice=args.control_plane_nice)
    print(f"\n== {name}")
    nice = args.control_plane_nice if s.weighted else 0
    with niceness(nice):
        stack.up(progress=lambda line: print(line))
    if nice:
        running = stack.running()
        threads = sum(renice_tree(running[c], 0) for c in SHOP if c in running)
        print(f"  control plane started at nice {nice}; the shop and its nginx set back to 0 ({threads} threads)")
    fire: list[float] = []
    resolve: list[float] = []
    rng = random.Random(42)
    running = stack.running()
    groups = {"control plane": lambda: [running[c] for c in CONTROL_PLANE if c in running]}
    if shop is not None:
        groups["load"] = lambda: [running[c] for c in SHOP if c in running] + shop.pids()
    sampler = HostSampler(groups=groups)
    try:
        q = f"{stack.url('prometheus')}/api/v1/query?query=up%7Bjob%3D%22selftest%22%7D%3D%3D1"
        wait_until(lambda: http_ok(q) and _has_result(q), timeout=60, what="selftest target up")
        if shop is not None:
            shop.start(stack.url("nginx") + "/", duration_s=args.flips * 8 + 60)
            time.sleep(args.load_warmup)
            busy = psutil.cpu_percent(interval=2.0)
            print(f"  load running: {args.load_procs} Locust process(es) x {args.load_rate:g} req/s offered, "
                  f"{args.load_users} users each; CPU busy {busy:.0f}% over 2 s")
        sampler.start()
        for i in range(args.flips):
            for on, bucket, transition in ((True, fire, "fire"), (False, resolve, "resolve")):
                seen = len(action_times(actions, transition))
                # A real threshold crossing falls at a random phase of the scrape and evaluation
                # cycles; without this pause every flip would start right after an evaluation.
                time.sleep(rng.uniform(0.05, 1.05))
                t0 = time.time()
                write_selftest_switch(stack.textfile_dir, on)
                wait_until(lambda: len(action_times(actions, transition)) > seen, timeout=60, interval=0.005,
                           what=f"{transition} action")
                bucket.append(action_times(actions, transition)[-1] - t0)
            print(f"  flip {i + 1:>2}/{args.flips}: fire {fire[-1]*1000:6.0f} ms   resolve {resolve[-1]*1000:6.0f} ms",
                  flush=True)
    finally:
        host = sampler.stop() if sampler.started else None
        if shop is not None:
            shop.stop()
        stack.down(quiet=True)
    if host:
        print(f"  conditions: {describe(host)}")
    return {"key": s.key, "setting": name, "interval": s.interval, "group_interval": s.group_interval,
            "resend_delay": s.resend, "control_plane_nice": nice,
            "load": None if shop is None else {
                "locust_processes": args.load_procs, "offered_rps_each": args.load_rate, "users_each": args.load_users,
                "site_workers": args.site_workers, "reads_per_page": args.reads_per_page,
                "served": shop.totals["ok"], "failed": shop.totals["failed"],
                "served_rps": None if shop.rps is None else round(shop.rps, 1)},
            "host": host, "fire": fire, "resolve": resolve}


def _has_result(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
        return bool(json.load(resp)["data"]["result"])


def summary(values: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(values, n=10)
    return {"median": statistics.median(values), "p10": qs[0], "p90": qs[-1], "min": min(values), "max": max(values)}


def conditions_line(r: dict[str, Any]) -> str:
    parts = [f"scrape/eval {r['interval']}, group_interval {r['group_interval']}, resend-delay {r['resend_delay']}"]
    if r["load"]:
        ld = r["load"]
        parts.append(f"load: {ld['locust_processes']} Locust x {ld['offered_rps_each']:g} req/s offered "
                     f"({ld['users_each']} users each), served {ld['served_rps']} req/s, failed {ld['failed']}")
    if r["control_plane_nice"]:
        parts.append(f"control plane at nice {r['control_plane_nice']}, load at 0")
    if r["host"]:
        parts.append(describe(r["host"]))
    return "; ".join(parts)


def markdown(results: list[dict[str, Any]], flips: int, when: str, command: str) -> str:
    lines = [f"Alert-to-action latency (gauge written -> log action ran), {flips} flips per setting, {when}.",
             f"Command: `{command}`", "",
             "| setting | transition | median | p10 | p90 | max |", "|---|---|---|---|---|---|"]
    for r in results:
        for i, transition in enumerate(("fire", "resolve")):
            s = r[f"{transition}_summary"]
            lines.append(f"| {r['setting'] if i == 0 else ''} | {transition} | "
                         + " | ".join(f"{s[k] * 1000:.0f} ms" for k in ("median", "p10", "p90", "max")) + " |")
    lines += ["", "Conditions:"] + [f"- {r['key']}: {conditions_line(r)}" for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.alert_latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flips", type=int, default=20)
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    ap.add_argument("--out", type=Path, default=Path("bench/results/alert_latency"))
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/promreflex-bench-alert-latency"),
                    help="the shop's product file (kept for the next run)")
    ap.add_argument("--load-procs", type=int, default=2, help="Locust processes driving the shop (saturated runs)")
    ap.add_argument("--load-rate", type=float, default=1000.0, help="requests per second each Locust offers")
    ap.add_argument("--load-users", type=int, default=50)
    ap.add_argument("--load-warmup", type=float, default=5.0, help="seconds of load before the first flip")
    ap.add_argument("--site-workers", type=int, default=8)
    ap.add_argument("--reads-per-page", type=int, default=2, help="uncached 64 KiB reads per product page")
    ap.add_argument("--site-data-mib", type=int, default=256)
    ap.add_argument("--lock", type=Path, default=None, help="flock this file for each setting (shared machines)")
    ap.add_argument("--control-plane-nice", type=int, default=-10, help="nice value of the control plane (weighted)")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.settings.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SETTINGS]
    if unknown or not keys:
        ap.error(f"unknown setting(s) {unknown}; choose from {', '.join(SETTINGS)}")
    if any(SETTINGS[k].weighted for k in keys) and args.control_plane_nice < 0 and os.geteuid() != 0:
        ap.error("a negative --control-plane-nice needs root (CAP_SYS_NICE); use --settings without 'weighted'")
    if args.flips < 2:
        ap.error("--flips must be >= 2")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for key in keys:
        with tempfile.TemporaryDirectory(prefix="promreflex-bench-") as tmp, heavy_lock(args.lock):
            results.append(run_setting(SETTINGS[key], args, Path(tmp)))

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in results:
        for transition in ("fire", "resolve"):
            r[f"{transition}_summary"] = summary(r[transition])
    command = " ".join([COMMAND, *sys.argv[1:]])
    md = markdown(results, args.flips, when, command)
    print("\n" + md)
    by_key = {r["key"]: r for r in results}
    for a, b in (("1s", "fast"), ("saturated", "fast"), ("weighted", "fast"), ("saturated", "weighted")):
        if a in by_key and b in by_key:
            for transition in ("fire", "resolve"):
                ratio = by_key[a][f"{transition}_summary"]["median"] / by_key[b][f"{transition}_summary"]["median"]
                print(f"median {transition}: {a} / {b} = {ratio:.2f}x")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    brief = [{k: v for k, v in r.items() if k not in ("fire", "resolve")} for r in results]
    (args.out / "summary.json").write_text(json.dumps({
        "command": command, "when": when, "flips": args.flips, "args": {k: str(v) for k, v in vars(args).items()},
        "settings": brief}, indent=1))
    (args.out / "summary.md").write_text(md)
    _plot(results, args.out / "latency.png")
    print(f"wrote {args.out / 'results.json'}, {args.out / 'summary.json'}, {args.out / 'summary.md'}, "
          f"{args.out / 'latency.png'}")
    return 0


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.2 * len(results) + 2, 4.2))
    data, labels = [], []
    for r in results:
        for transition in ("fire", "resolve"):
            data.append([v * 1000 for v in r[transition]])
            labels.append(f"{r['key']}\n{transition}")
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("gauge written -> action ran (ms)")
    ax.axhline(1000, color="tab:red", linestyle="--", linewidth=1, label="target: median under 1 s")
    ax.legend(loc="upper left")
    ax.set_title("promreflex alert-to-action latency (local stack)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
