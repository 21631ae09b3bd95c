"""Run the RCA experiments on the simulated mesh.

    uv run python -m bench.rca [--quick] [--experiment basic|faults|all] [--mode loop|direct]

Run full measurements under the shared lock:
    flock /tmp/promreflex-heavy.lock uv run python -m bench.rca --experiment all
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.rca import basic
from bench.rca.cases import (
    ANCHORS, HELD_OUT_CASES, NEW_HELD_OUT_CASES, VOLUME_IOPS, CaseResult, CaseRunner, Spec, all_cases, parse_case,
    warmup_for,
)
from bench.rca.faults import FAULT_KINDS
from bench.rca.scoring import CaseOutcome, summarise
from bench.rca.topology import CORE_SERVICES, SERVICES
from bench.unwind import interrupt_once
from promreflex.config import parse_duration

QUICK_CASES: list[tuple[str, str] | Spec] = [("carts-db", "cpu"), ("carts", "latency"), ("payment", "memory"), ("catalogue", "disk")]


def conditions() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "loadavg_start": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def outcome_of(case: dict[str, Any]) -> CaseOutcome:
    """A results-JSON case as scored: the better-ranked of its causes (two faults at once)."""
    fields = {k: case[k] for k in ("service", "kind", "started", "flagged", "time_to_flag_s", "ranking") if k in case}
    return CaseResult(**fields, truths=case.get("truths") or [case["service"]]).outcome()


KIND_ORDER = [*FAULT_KINDS, "two", "edge"]


def faults_table(result: dict[str, Any]) -> str:
    outcomes = [outcome_of(c) for c in result["cases"]]
    s = summarise(outcomes)
    kinds = sorted({c["kind"] for c in result["cases"]}, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 99)
    lines = [f"{'fault':<9}{'cases':>6}{'AC@1':>7}{'AC@3':>7}{'Avg@5':>7}{'flagged':>9}{'median':>8}{'max':>8}"]

    def row(name: str, sub: list[CaseOutcome]) -> str:
        t = summarise(sub)
        def secs(x: float) -> str:
            return f"{x:>7.1f}s" if x == x else f"{'-':>8}"  # nan: nothing flagged

        return (f"{name:<9}{len(sub):>6}{t['ac1']:>7.2f}{t['ac3']:>7.2f}{t['avg5']:>7.2f}{t['flagged']:>6}/{len(sub):<2}"
                f"{secs(t['median_s'])}{secs(t['max_s'])}")

    for k in kinds:
        lines.append(row(k, [o for o, c in zip(outcomes, result["cases"], strict=True) if c["kind"] == k]))
    lines.append(row("all", outcomes))
    two = [c for c in result["cases"] if len(c.get("truths") or [c["service"]]) > 1]
    if two:
        both = sum(1 for c in two if (c.get("all_within") or 99) <= 2)
        lines.append(f"two faults at once: the first named is one of the causes in "
                     f"{sum(1 for c in two if c.get('rank') == 1)}/{len(two)} (counted in AC@1); "
                     f"both causes among the first two named in {both}/{len(two)}")
    lines.append(f"targets: AC@1 >= 0.90 ({'met' if s['ac1'] >= 0.9 else 'NOT met'}), flagged within 60 s "
                 f"({'met' if s['flagged'] == s['cases'] and s['max_s'] <= 60 else 'NOT met'})")
    lines += [f"anchor: {name}: {value}" for name, value in ANCHORS]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    labels = [f"{c['kind']}\n{c['service']}" for c in cases]
    colors = {"cpu": "tab:red", "memory": "tab:purple", "latency": "tab:blue", "disk": "tab:brown",
              "two": "tab:olive", "edge": "tab:cyan"}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, len(cases) * 0.42), 6.5), sharex=True)
    x = range(len(cases))
    ax1.bar(x, [c["time_to_flag_s"] or 0 for c in cases], color=[colors[c["kind"]] for c in cases])
    for i, c in enumerate(cases):
        if not c["flagged"]:
            ax1.text(i, 1, "not\nflagged", ha="center", fontsize=6)
    ax1.axhline(60, color="black", linestyle="--", linewidth=1, label="target: 60 s")
    ax1.set_ylabel("fault start -> flag (s)")
    ax1.legend(loc="upper right")
    worst = max([len(c["ranking"]) for c in cases] + [3])
    for i, c in enumerate(cases):
        r = c["rank"]
        if r is None:
            ax2.scatter([i], [worst + 1], marker="x", color="tab:gray")
        else:
            ax2.scatter([i], [r], s=60, color="tab:green" if r == 1 else ("tab:orange" if r <= 3 else "tab:red"))
    ax2.axhline(3.5, color="black", linestyle=":", linewidth=1)
    ax2.set_ylim(worst + 1.5, 0.5)
    ax2.set_yticks(list(range(1, worst + 2)), [*map(str, range(1, worst + 1)), "none"])
    ax2.set_ylabel("rank of the true cause\n(1 = named first)")
    ax2.set_xticks(list(x), labels, rotation=90, fontsize=7)
    s = summarise([outcome_of(c) for c in cases])
    fig.suptitle(f"RCA on the simulated Sock Shop ({result['mode']} mode): AC@1 {s['ac1']:.2f}, AC@3 {s['ac3']:.2f}, "
                 f"time to flag median {s['median_s']:.1f} s, max {s['max_s']:.1f} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DESIGNED_RATE = 3.0  # the load the 32 service x fault cases were designed at


def designed_on(case: dict[str, Any]) -> bool:
    """Whether a case is one the analysis was designed on: one fault of one kind in one service
    (``all_cases()``) at the designed load; two faults at once, a slow edge or another load are
    not."""
    return case["kind"] in FAULT_KINDS and float(case.get("rate", DESIGNED_RATE)) == DESIGNED_RATE


def split_lines(cases: list[dict[str, Any]]) -> list[str]:
    """AC@1 / AC@3 / Avg@5 of the designed-on cases and of the others, one line each."""
    lines = []
    for name, sub in (("designed on (one fault, 3 orders/s)", [c for c in cases if designed_on(c)]),
                      ("not designed on (two faults, slow edges, other loads)", [c for c in cases if not designed_on(c)])):
        if sub:
            s = summarise([outcome_of(c) for c in sub])
            lines.append(f"{name}: {len(sub)} cases, AC@1 {s['ac1']:.2f}, AC@3 {s['ac3']:.2f}, Avg@5 {s['avg5']:.2f}, "
                         f"flagged {s['flagged']}/{len(sub)}")
    return lines


def combine(results: list[Path], out: Path) -> tuple[Path, Path]:
    """One summary over several runs' results JSONs (chunks of one measurement, each run
    under the lock for less than ten minutes): ``summary.json`` (every case, the runs'
    commands and conditions) and ``summary.md`` (the table, and a row per case)."""
    runs = [json.loads(p.read_text()) for p in results]
    cases = [{**c, "run": i, "rate": r["faults"]["rate"]} for i, r in enumerate(runs) for c in r["faults"]["cases"]]
    merged = {"mode": runs[0]["faults"]["mode"], "cases": cases}
    table = "\n".join([faults_table(merged), *split_lines(cases)])
    split = {name: summarise([outcome_of(c) for c in cases if designed_on(c) == want])
             for name, want in (("designed_on", True), ("not_designed_on", False))}
    summary = {"runs": [{"file": str(p), "command": r["command"], "conditions": r["conditions"],
                         "rate": r["faults"]["rate"], "window": r["faults"]["window"], "for": r["faults"]["for"],
                         "lines_s": r["faults"]["lines_s"], "not_run": r["faults"].get("not_run", [])}
                        for p, r in zip(results, runs, strict=True)],
               "summary": summarise([outcome_of(c) for c in cases]), "split": split, "table": table,
               "cases": [{k: c.get(k) for k in ("run", "rate", "label", "kind", "truths", "flagged", "time_to_flag_s",
                                                "gauge_time_s", "report_time_s", "rank", "all_within", "root_causes",
                                                "note")} | {"top5": c["ranking"][:5]} for c in cases]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    rows = ["| run | orders/s | case | flagged (first = named first) | time to flag | rank | both causes within |",
            "|---|---|---|---|---|---|---|"]
    for c in cases:
        flag = f"{c['time_to_flag_s']:.1f} s" if c["flagged"] else "not flagged"
        both = str(c.get("all_within") or "-") if len(c.get("truths") or []) > 1 else ""
        rows.append(f"| {c['run'] + 1} | {c['rate']:g} | {c['label']} | {', '.join(c['root_causes']) or '-'} | {flag} "
                    f"| {c['rank'] or '-'} | {both} |")
    cond = [f"- run {i + 1}: `{r['command']}`; load average {r['conditions']['loadavg_start'][0]:.2f} at start, "
            f"{r['conditions']['loadavg_end'][0]:.2f} at end; {r['conditions']['wall_s']:.0f} s"
            + (f"; not run (time budget): {', '.join(r['faults']['not_run'])}" if r["faults"].get("not_run") else "")
            for i, r in enumerate(runs)]
    (out / "summary.md").write_text("\n".join(["```", table, "```", "", *rows, "", *cond]) + "\n")
    plot(merged, out / "cases.png")
    return out / "summary.json", out / "summary.md"


def default_mode() -> str:
    try:
        import controllers.rca.action  # noqa: F401
    except ImportError:
        return "direct"
    return "loop"


def replot(results: Path) -> Path:
    """Redraw the plot of a results JSON (``--replot FILE``)."""
    data = json.loads(results.read_text())
    png = results.with_name(results.stem.replace("results-", "cases-") + ".png")
    plot(data["faults"], png)
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 round-trip levels, 4 fault cases (about 3 minutes)")
    ap.add_argument("--experiment", choices=("basic", "faults", "held-out", "new-held-out", "faults+held-out", "all"),
                    default="all",
                    help="held-out / new-held-out: cases the RCA was not designed on (two faults at once, a slow edge)")
    ap.add_argument("--cases", default="",
                    help="run exactly these cases (comma-separated): svc:kind, svc:kind+svc:kind (two at once), "
                         "caller->callee (a slow link); replaces --experiment's cases")
    ap.add_argument("--mode", choices=("loop", "direct"), default=None,
                    help="loop: the controller's rca action flags (default when it exists); direct: analyse here")
    ap.add_argument("--services", default=",".join(CORE_SERVICES), help="comma-separated services to fault")
    ap.add_argument("--kinds", default=",".join(FAULT_KINDS), help="comma-separated fault kinds")
    ap.add_argument("--window", default="1m", help="the mesh rules' 1m windows become this (default: as shipped)")
    ap.add_argument("--for", dest="for_", default="15s",
                    help="ServiceResponseTimeHigh's for: becomes this (default: as shipped; 10s/5s compress a run 4x)")
    ap.add_argument("--rate", type=float, default=3.0, help="orders per second during the fault cases")
    ap.add_argument("--volume-iops", type=float, default=VOLUME_IOPS,
                    help="each service's volume allows this many I/O operations a second (0: the raw disk)")
    ap.add_argument("--budget", default="",
                    help="time budget of the run (e.g. 15m): a case is started only if it is expected to end within "
                         "it (as long as the longest so far); the cases left are listed as not run")
    ap.add_argument("--out", type=Path, default=Path("bench/results/rca"))
    ap.add_argument("--replot", type=Path, metavar="RESULTS_JSON", help="only redraw the plot of an earlier run")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="RESULTS_JSON",
                    help="only write one summary (summary.json/md, cases.png in --out) over several runs' results")
    args = ap.parse_args(argv)
    # Stopped with SIGTERM, or SIGINT even when started in the background (which ignores it),
    # the run still stops its mesh, stack and load and removes its cgroups (the finally blocks).
    interrupt_once()
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows through `| tee` and redirections
    if args.replot:
        print(f"wrote {replot(args.replot)}")
        return 0
    if args.combine:
        paths = combine(args.combine, args.out)
        print(Path(paths[1]).read_text())
        print(f"wrote {paths[0]} and {paths[1]}")
        return 0
    services = [s for s in args.services.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [s for s in services if s not in SERVICES] + [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        ap.error(f"unknown service(s)/kind(s): {', '.join(bad)}")
    try:
        picked = [parse_case(c) for c in args.cases.split(",") if c.strip()]
    except ValueError as e:
        ap.error(str(e))
    bad += [s for spec in picked for s in spec.truth + tuple(a for a, _, _ in spec.edges) if s not in SERVICES]
    if bad:
        ap.error(f"unknown service(s): {', '.join(bad)}")
    mode = args.mode or default_mode()
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"command": "python -m bench.rca " + " ".join(argv if argv is not None else sys.argv[1:]),
                           "conditions": conditions()}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="promreflex-rca-") as tmp:
        work = Path(tmp)
        if not picked and args.experiment in ("basic", "all"):
            levels = (1, 5, 15) if args.quick else basic.ROUNDTRIPS
            out["basic"] = basic.run_basic(work, duration_s=8 if args.quick else 20, roundtrips=levels)
            print("\nBasic experiment (paper: orders max +1395 ms from 1 to 15 round trips; carts-db CPU 25.7 % -> 84.1 %)")
            print(basic.table(out["basic"]))
        if picked or args.experiment in ("faults", "held-out", "new-held-out", "faults+held-out", "all"):
            cases: list[tuple[str, str] | Spec] = list(picked)
            if not picked and args.experiment in ("faults", "faults+held-out", "all"):
                cases += QUICK_CASES if args.quick else all_cases(services, kinds)
            if not picked and args.experiment in ("held-out", "faults+held-out", "all"):
                cases += HELD_OUT_CASES
            if not picked and args.experiment == "new-held-out":
                cases += NEW_HELD_OUT_CASES
            runner = CaseRunner(work / "cases", mode=mode, window=args.window, for_=args.for_, rate=args.rate,
                                volume_iops=args.volume_iops)
            window_s = parse_duration(args.window)
            out["faults"] = runner.run(cases, warmup_s=40 if args.quick else warmup_for(window_s), max_wait_s=60 + window_s / 2,
                                       recovery_s=45 + 2 * window_s,
                                       budget_s=parse_duration(args.budget) if args.budget else None)
            flag = "flag = the MeshRootCause alert in Alertmanager" if mode == "loop" else "flag = the report"
            print(f"\nFault cases ({mode} mode: {'controller rca action' if mode == 'loop' else 'analyse_prometheus here'}; "
                  f"{flag}; "
                  f"rules windows {args.window}, for {args.for_}; {args.rate:g} orders/s; volumes: {out['faults']['volumes']})")
            print(faults_table(out["faults"]))
    out["conditions"]["loadavg_end"] = os.getloadavg()
    out["conditions"]["wall_s"] = time.monotonic() - t_start
    name = "cases" if picked else (f"quick-{args.experiment}" if args.quick else args.experiment)
    if args.window != "1m" or args.for_ != "15s":
        name += f"-w{args.window}-for{args.for_}"
    path = args.out / f"results-{name}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nload average at start {out['conditions']['loadavg_start'][0]:.2f}, at end {out['conditions']['loadavg_end'][0]:.2f}; "
          f"{out['conditions']['cores']} cores; wall {out['conditions']['wall_s']:.0f} s")
    if "faults" in out:
        plot(out["faults"], args.out / f"cases-{name}.png")
        print(f"wrote {path} and {args.out / f'cases-{name}.png'}")
    else:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
