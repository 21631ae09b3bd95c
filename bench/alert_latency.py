"""Alert-to-action latency on the real local stack.

For each interval setting, a stack is started on free loopback ports and the self-test gauge
(node_exporter textfile) is flipped N times. Latency = the log action's own timestamp minus
the moment the gauge file was written: scrape, rule evaluation, Alertmanager, webhook and
action together. Both settings run in the same process, one after the other, and the ratio
is printed with the conditions.

    uv run python -m bench.alert_latency [--flips 20] [--out bench/results/alert_latency]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from promreflex.config import Ports, load_config
from promreflex.proc import free_port, wait_until
from promreflex.stack import Stack, write_selftest_switch

PORTS = tuple(Ports.model_fields)

SETTINGS = {
    # name: (scrape/eval interval, Alertmanager group_interval, Prometheus resend delay)
    "fast (promreflex default)": ("200ms", "200ms", "1s"),
    "1s intervals": ("1s", "1s", "1s"),
}


def action_times(path: Path, transition: str) -> list[float]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [r["ts"] for r in map(json.loads, lines) if r["transition"] == transition]


def run_setting(name: str, interval: str, group_interval: str, resend: str, flips: int, workdir: Path) -> dict:
    actions = workdir / "actions.jsonl"
    cfg = load_config(None, {
        "stack.state_dir": str(workdir / "state"),
        "stack.ports": {p: free_port() for p in PORTS},
        "stack.fast_interval": interval,
        "stack.group_interval": group_interval,
        "stack.resend_delay": resend,
        "controller.reconcile_interval": "30s",
        "controller.routes": [{"name": "bench", "matchers": ['alertname="PromreflexSelftest"'], "action": "log",
                               "params": {"message": "bench", "path": str(actions)}}],
    })
    stack = Stack(cfg)
    print(f"\n== {name}: scrape/eval {interval}, group_interval {group_interval}, resend-delay {resend}")
    stack.up(progress=lambda line: print(line))
    fire, resolve = [], []
    rng = random.Random(42)
    try:
        q = f"{stack.url('prometheus')}/api/v1/query?query=up%7Bjob%3D%22selftest%22%7D%3D%3D1"
        from promreflex.proc import http_ok

        wait_until(lambda: http_ok(q) and _has_result(q), timeout=60, what="selftest target up")
        for i in range(flips):
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
            print(f"  flip {i + 1:>2}/{flips}: fire {fire[-1]*1000:6.0f} ms   resolve {resolve[-1]*1000:6.0f} ms", flush=True)
    finally:
        stack.down(quiet=True)
    return {"setting": name, "interval": interval, "group_interval": group_interval, "resend_delay": resend,
            "fire": fire, "resolve": resolve}


def _has_result(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
        return bool(json.load(resp)["data"]["result"])


def summary(values: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(values, n=10)
    return {"median": statistics.median(values), "p10": qs[0], "p90": qs[-1], "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flips", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("bench/results/alert_latency"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (interval, gi, resend) in SETTINGS.items():
        with tempfile.TemporaryDirectory(prefix="promreflex-bench-") as tmp:
            results.append(run_setting(name, interval, gi, resend, args.flips, Path(tmp)))

    load1 = os.getloadavg()[0]
    print(f"\nAlert-to-action latency, {args.flips} flips each (gauge written -> log action ran), "
          f"{os.cpu_count()} cores, load average {load1:.2f}")
    header = f"{'setting':<28}{'transition':<11}{'median':>9}{'p10':>9}{'p90':>9}{'min':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        for transition in ("fire", "resolve"):
            s = summary(r[transition])
            r[f"{transition}_summary"] = s
            print(f"{r['setting']:<28}{transition:<11}" + "".join(f"{s[k]*1000:8.0f}ms" for k in ("median", "p10", "p90", "min", "max")))
    fast, slow = results[0], results[1]
    for transition in ("fire", "resolve"):
        for stat in ("median", "p90"):
            ratio = slow[f"{transition}_summary"][stat] / fast[f"{transition}_summary"][stat]
            print(f"{stat} {transition} latency: {slow['setting']} / {fast['setting']} = {ratio:.2f}x")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    _plot(results, args.out / "latency.png")
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'latency.png'}")
    return 0


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    data, labels = [], []
    for r in results:
        for transition in ("fire", "resolve"):
            data.append([v * 1000 for v in r[transition]])
            labels.append(f"{r['setting']}\n{transition}")
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("gauge written -> action ran (ms)")
    ax.axhline(1000, color="tab:red", linestyle="--", linewidth=1, label="target: median under 1 s")
    ax.legend(loc="upper left")
    ax.set_title("promreflex alert-to-action latency (local stack)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
