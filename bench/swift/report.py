"""Gather the sweep's and the injections' runs (``levels.jsonl``, ``inject.jsonl``) into
``summary.json``, ``summary.md`` and the plots under ``bench/results/swift/``.

The paper's curve (seed 004, ssbench on HDD, Figs. 3-5) is drawn as what the paper states, not
as invented data points: throughput peaks at concurrency 32 and falls after it, retries appear
above 128 and failures above 256. Our figures are drawn beside those marks.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

PAPER: dict[str, Any] = {"peak": 32, "retries_above": 128, "failures_above": 256,
         "text": "ssbench PUT on HDD: throughput rises to concurrency 32 then falls; retries above 128, failures "
                 "above 256 (client-side socket connection failures, per the paper)"}
# Ethernet + IPv4 + TCP with timestamps per 1448-byte segment: what tbf counts on the wire.
WIRE_OVERHEAD = 1514 / 1448


def _load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def size_name(size: int) -> str:
    return "1 MB" if size >= 1024 * 1024 else "1 KB" if size >= 1024 else f"{size} B"


def rate_bps(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"unknown tc rate {rate!r}")
    return float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]


def latest_levels(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last run of every (op, size, level): a re-run chunk replaces the earlier one."""
    keep: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in records:
        keep[(r["op"], r["size"], r["concurrency"])] = r
    return [keep[k] for k in sorted(keep, key=lambda k: (k[1], k[0] != "put", k[2]))]


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def attribution(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baseline vs treatment per (scenario, op): every node's (service's) processing and every
    hop's time, the change, which one changed most, and its error against the injected amount."""
    groups: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[(r["scenario"], r["op"])][r["arm"]].append(r)
    out = []
    for (scenario, op), arms in sorted(groups.items()):
        if not arms.get("baseline") or not arms.get("treatment"):
            continue
        sample = arms["treatment"][0]
        node = sample["node"]
        if scenario == "slow-node":
            field, target = "processing_by_service_ms", f"{node}/object"
            expected = float(sample["injected"]["delay_ms"])
            what = f"+{expected:.0f} ms in the object server of {node}"
        else:
            field, target = "transfer_ms", f"proxy->{node}/object"
            expected = sample["size"] * WIRE_OVERHEAD * 8 / rate_bps(sample["injected"]["tbf_rate"]) * 1e3
            what = (f"tbf {sample['injected']['tbf_rate']} into {node}: a {size_name(sample['size'])} request "
                    f"serialized at that rate takes {expected:.0f} ms on the wire")

        def means(arm: str, fld: str) -> dict[str, float]:
            keys = {k for r in arms[arm] for k in r["breakdown"].get(fld, {})}
            return {k: m for k in keys
                    if (m := _mean([r["breakdown"].get(fld, {}).get(k) for r in arms[arm]])) is not None}

        deltas: dict[str, dict[str, float]] = {}
        for fld in ("processing_by_service_ms", "transfer_ms", "hop_ms", "wait_ms"):
            base, treat = means("baseline", fld), means("treatment", fld)
            deltas[fld] = {k: round(treat[k] - base[k], 3) for k in sorted(set(base) & set(treat))}
        def seg_means(arm: str) -> dict[str, float]:
            keys = {k for r in arms[arm] for k in r["breakdown"]["segment_transit_ms"]}
            return {k: m for k in keys if (m := _mean([r["breakdown"]["segment_transit_ms"].get(k, {}).get("mean")
                                                         for r in arms[arm]])) is not None}

        seg_base, seg_treat = seg_means("baseline"), seg_means("treatment")
        seg_delta = {k: round(seg_treat[k] - seg_base[k], 4) for k in sorted(set(seg_base) & set(seg_treat))}
        lat_b = _mean([r["latency_s"]["mean"] for r in arms["baseline"]])
        lat_t = _mean([r["latency_s"]["mean"] for r in arms["treatment"]])
        d = deltas[field]
        if target not in d:
            # The target was not served in both arms (e.g. no GET happened to hit it): no verdict.
            out.append({"scenario": scenario, "op": op, "target": target, "verdict": "no data", "injected": what})
            continue
        others = {k: v for k, v in d.items() if k != target}
        # Other places where the added time could have been wrongly put: every node/service for
        # a slow node, every hop *and* every node for a slow link.
        other_kind = deltas["transfer_ms"] if scenario == "slow-node" else deltas["processing_by_service_ms"]
        if scenario == "slow-node":
            other_kind = {k: v for k, v in other_kind.items() if not k.startswith(f"proxy->{node}/object")}
        worst_other = max([*others.items(), *other_kind.items()], key=lambda kv: abs(kv[1]), default=("-", 0.0))
        largest = max(d.items(), key=lambda kv: kv[1])[0]
        err = d[target] - expected
        # Per segment (no request model at all): a slow link shows as one node pair's transit;
        # a slow server must leave every pair's transit where it was.
        seg_sorted = sorted(seg_delta.items(), key=lambda kv: -abs(kv[1]))
        link = f"proxy->{node}"
        row: dict[str, Any] = {
            "scenario": scenario, "op": op, "injected": what, "target": target, "expected_ms": round(expected, 2),
            "measured_ms": d[target], "error_ms": round(err, 2), "error_pct": round(100 * err / expected, 1),
            "largest_change": largest, "attributed_right": largest == target,
            # Clean: nothing else moved by more than a quarter of the injected amount.
            "clean": abs(worst_other[1]) <= 0.25 * expected,
            "largest_elsewhere": {"where": worst_other[0], "ms": worst_other[1]},
            "client_latency_ms": {"baseline": round(lat_b * 1e3, 2) if lat_b else None,
                                  "treatment": round(lat_t * 1e3, 2) if lat_t else None},
            "deltas_ms": deltas, "segment_transit_delta_ms": seg_delta,
            "segment_largest": {"where": seg_sorted[0][0], "ms": seg_sorted[0][1]} if seg_sorted else None,
            "segment_largest_elsewhere": next(({"where": k, "ms": v} for k, v in seg_sorted
                                               if scenario == "slow-node" or k != link), None),
            "rounds": len(arms["treatment"]),
        }
        out.append(row)
    return out


def _level_row(r: dict[str, Any]) -> dict[str, Any]:
    if "missing" not in r and r.get("op") == "get" and "http 404" in r.get("errors", {}):
        # A run from before the client counted 404s apart: the GET of an object whose PUT failed.
        r = {**r, "errors": {k: v for k, v in r["errors"].items() if k != "http 404"},
             "missing": r["errors"]["http 404"], "failures": r["failures"] - r["errors"]["http 404"]}
    if "error" in r:
        return {"op": r["op"], "size": r["size"], "concurrency": r["concurrency"], "requested": r["requested"],
                "error": r["error"]}
    b = r["breakdown"]
    return {"op": r["op"], "size": r["size"], "concurrency": r["concurrency"], "requested": r["requested"],
            "attempted": r["attempted"], "completed": r["completed"], "failures": r["failures"],
            "missing": r.get("missing", 0),
            "retries": r["retries"], "errors": r["errors"], "throughput": r["throughput"], "wall_s": r["wall_s"],
            "latency_ms": {k: round(v * 1e3, 2) if v is not None else None for k, v in r["latency_s"].items()},
            "processing_ms": b["processing_ms"], "processing_by_service_ms": b["processing_by_service_ms"],
            "phases_ms": b["phases_ms"], "matching": b["matching"], "joins": b["joins"],
            "retransmissions": b["retransmissions"], "resets": b["resets"],
            "connection_failures": b["connection_failures"],
            "segments": sum(b["segments"].values()), "analysis_cpu_s": b.get("analysis_cpu_s"),
            "cpu_busy_pct": r["conditions"].get("cpu_busy_pct"), "client_cpu_s": r.get("client_cpu_s"),
            "cores_used": {g: v.get("cores") for g, v in (r["conditions"].get("groups") or {}).items()}}


def _fmt(v: Any, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def compact(rows: list[dict[str, Any]], levels: tuple[int, ...] = (1, 4, 32, 128, 256)) -> str:
    """The sweep in one row per (size, op): req/s at a few levels, the peak, retries and
    failures, and the proxy's vs the busiest storage node's processing at 1, 32 and 256."""
    head = ("| size | op | " + " | ".join(f"req/s @{c}" for c in levels) + " | peak (at) | retries | failures "
            "| proxy ms @1/32/256 | busiest storage node ms @1/32/256 |")
    out = [head, "|" + "---|" * (len(levels) + 7)]
    for size in sorted({r["size"] for r in rows}):
        for op in ("put", "get"):
            rs = {r["concurrency"]: r for r in rows if r["size"] == size and r["op"] == op and "error" not in r}
            if not rs:
                continue
            peak = max(rs.values(), key=lambda r: r["throughput"])

            def ms(c: int, storage: bool) -> str:
                p = rs.get(c, {}).get("processing_ms", {})
                vals = [v for k, v in p.items() if (k != "proxy") == storage and v is not None]
                return f"{max(vals):.0f}" if vals else "-"

            out.append(f"| {size_name(size)} | {op.upper()} | "
                       + " | ".join(f"{rs[c]['throughput']:.0f}" if c in rs else "-" for c in levels)
                       + f" | {peak['throughput']:.0f} ({peak['concurrency']}) | {sum(r['retries'] for r in rs.values())}"
                       f" | {sum(r['failures'] for r in rs.values())} | {ms(1, False)}/{ms(32, False)}/{ms(256, False)}"
                       f" | {ms(1, True)}/{ms(32, True)}/{ms(256, True)} |")
    return "\n".join(out) + "\n"


def _seg(a: dict[str, Any]) -> str:
    top, other = a.get("segment_largest"), a.get("segment_largest_elsewhere")
    if not top:
        return "-"
    text = f"{top['where']} {top['ms']:+.3f} ms"
    if other and other["where"] != top["where"]:
        text += f" (next: {other['where']} {other['ms']:+.3f})"
    return text


def _waits(a: dict[str, Any], top: int = 3) -> str:
    """The largest changes of the services' waits (receive: their request's body; fanout: their
    calls), where the injected time should show up when it is not the service's own."""
    w = sorted(a.get("deltas_ms", {}).get("wait_ms", {}).items(), key=lambda kv: -abs(kv[1]))[:top]
    return ", ".join(f"{k} {v:+.1f}" for k, v in w) or "-"


def markdown(rows: list[dict[str, Any]], attr: list[dict[str, Any]], nodes: list[str]) -> str:
    lines = ["# Swift bench (seed 004): sweep and injections", "",
             f"Paper: {PAPER['text']}.", ""]
    if rows:
        lines += ["## Sweep", "",
                  "| op | size | conc. | done/tried | req/s | retries | failures (missing) | p50 ms | p99 ms | "
                  + " | ".join(f"{n} ms" for n in nodes) + " | CPU busy % |",
                  "|" + "---|" * (9 + len(nodes) + 1)]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['op'].upper()} | {size_name(r['size'])} | {r['concurrency']} | did not run: "
                             f"{r['error'][:90]} |" + " |" * (8 + len(nodes)))
                continue
            lat = r["latency_ms"]
            lines.append(f"| {r['op'].upper()} | {size_name(r['size'])} | {r['concurrency']} | {r['completed']}/"
                         f"{r['attempted']} | {r['throughput']:.1f} | {r['retries']} | {r['failures']}"
                         f"{' (' + str(r['missing']) + ')' if r.get('missing') else ''} | "
                         f"{_fmt(lat['p50'])} | {_fmt(lat['p99'])} | "
                         + " | ".join(_fmt(r["processing_ms"].get(n), 2) for n in nodes)
                         + f" | {_fmt(r['cpu_busy_pct'], 0)} |")
        lines += ["", "Node columns: the capture exporter's mean processing per request served by that node "
                  "(all its services), from fresh captures of that run: the node's own time, request in -> "
                  "response out minus its waits (its request's body still arriving, e.g. after a 100 Continue; "
                  "its calls to other nodes). Missing: GETs of objects whose PUT "
                  "failed at that level (404), not counted as failures."]
    if attr:
        lines += ["", "## Injections: does the exporter put the added time in the right place?", "",
                  "| scenario | op | injected | target | expected ms | measured ms | error | largest change | "
                  "largest elsewhere | segment transit: largest change | waits: largest changes | "
                  "client latency ms (base -> inj.) |",
                  "|" + "---|" * 12]
        for a in attr:
            if a.get("verdict") == "no data":
                lines.append(f"| {a['scenario']} | {a['op'].upper()} | {a['injected']} | {a['target']} | - | - | - | "
                             "no data | - | - | - | - |")
                continue
            cl = a["client_latency_ms"]
            lines.append(f"| {a['scenario']} | {a['op'].upper()} | {a['injected']} | {a['target']} | "
                         f"{a['expected_ms']:.1f} | {a['measured_ms']:.1f} | {a['error_ms']:+.1f} ms "
                         f"({a['error_pct']:+.0f}%) | {a['largest_change']} "
                         f"({'right' if a['attributed_right'] else 'WRONG'}"
                         f"{'' if a.get('clean', True) else ', not clean'}) | {a['largest_elsewhere']['where']} "
                         f"{a['largest_elsewhere']['ms']:+.1f} | {_seg(a)} | {_waits(a)} | {_fmt(cl['baseline'])} -> "
                         f"{_fmt(cl['treatment'])} |")
    return "\n".join(lines) + "\n"


def _finish(fig: Any, path: Path, title: str, handles: list[Any], labels: list[str], ncol: int,
            rect: tuple[float, float, float, float]) -> Path:
    import matplotlib.pyplot as plt

    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(rows: list[dict[str, Any]], attr: list[dict[str, Any]], nodes: list[str], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    sizes = sorted({r["size"] for r in rows})
    if sizes:
        fig, axes = plt.subplots(1, len(sizes), figsize=(max(9.0, 5.2 * len(sizes)), 4.2), squeeze=False)
        twins = []
        for ax, size in zip(axes[0], sizes, strict=True):
            ax2 = ax.twinx()
            twins.append(ax2)
            for op, style in (("put", "o-"), ("get", "s--")):
                rs = sorted((r for r in rows if r["size"] == size and r["op"] == op), key=lambda r: r["concurrency"])
                if not rs:
                    continue
                xs = [r["concurrency"] for r in rs]
                ax.plot(xs, [r["throughput"] for r in rs], style, label=f"{op.upper()} req/s (here)")
                ax2.bar([x * (0.9 if op == "put" else 1.1) for x in xs], [r["retries"] for r in rs],
                        width=[x * 0.15 for x in xs], alpha=0.4, label=f"{op.upper()} retries")
                ax2.plot(xs, [r["failures"] for r in rs], "x:", color="red" if op == "put" else "darkred",
                         label=f"{op.upper()} failures")
            ax.axvline(PAPER["peak"], color="grey", ls="-.", lw=1, label="paper: peak at 32 (HDD)")
            ax.axvspan(PAPER["retries_above"], PAPER["failures_above"], color="orange", alpha=0.08,
                       label="paper: retries >128")
            ax.axvspan(PAPER["failures_above"], PAPER["failures_above"] * 1.4, color="red", alpha=0.08,
                       label="paper: failures >256")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.set_ylabel("completed requests / s")
            ax2.set_ylabel("retries, failures (count)")
            ax.set_title(f"{size_name(size)} objects")
            ax.set_ylim(bottom=0)
            ax2.set_ylim(bottom=0, top=max(5, *(r["retries"] + r["failures"] for r in rows if r["size"] == size)))
        handles, labels = [], []
        for a in (axes[0][0], twins[0]):  # the first panel and its twin: every series once
            h, lab = a.get_legend_handles_labels()
            handles += h
            labels += lab
        made.append(_finish(fig, out / "throughput.png", "Swift in namespaces: throughput vs concurrency, beside "
                            "the paper's shape (seed 004)", handles, labels, 5, (0, 0.1, 1, 0.95)))

        fig, axes = plt.subplots(2, len(sizes), figsize=(max(9.0, 5.2 * len(sizes)), 7.5), squeeze=False)
        for j, size in enumerate(sizes):
            for i, op in enumerate(("put", "get")):
                ax = axes[i][j]
                rs = sorted((r for r in rows if r["size"] == size and r["op"] == op), key=lambda r: r["concurrency"])
                if not rs:
                    continue
                xs = [r["concurrency"] for r in rs]
                for n in nodes:
                    ax.plot(xs, [r["processing_ms"].get(n) for r in rs], "o-", ms=3, label=f"{n} processing")
                ax.plot(xs, [r["latency_ms"]["mean"] for r in rs], "k.--", label="client latency (mean)")
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_title(f"{op.upper()} {size_name(size)}: ms per request served", fontsize=10)
                ax.set_xlabel("concurrency")
        h, lab = axes[0][0].get_legend_handles_labels()
        made.append(_finish(fig, out / "breakdown.png", "Where the time goes: per-node processing from the captures "
                            "(exporter) vs client latency", h, lab, len(nodes) + 1, (0, 0.05, 1, 0.96)))
    good = [a for a in attr if a.get("verdict") != "no data"]
    if good:
        fig, axes = plt.subplots(1, len(good), figsize=(5 * len(good), 4.2), squeeze=False)
        for ax, a in zip(axes[0], good, strict=True):
            fld = "processing_by_service_ms" if a["scenario"] == "slow-node" else "transfer_ms"
            items = sorted(a["deltas_ms"][fld].items())
            ax.barh([k for k, _ in items], [v for _, v in items],
                    color=["tab:red" if k == a["target"] else "tab:blue" for k, _ in items])
            ax.axvline(a["expected_ms"], color="k", ls="--", lw=1, label=f"injected {a['expected_ms']:.0f} ms")
            ax.set_title(f"{a['scenario']} {a['op'].upper()}: change vs baseline", fontsize=10)
            ax.set_xlabel("ms" + (" (node/service processing)" if fld.startswith("processing") else
                                  " (request transfer per hop)"))
            ax.tick_params(axis="y", labelsize=7)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "injection.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def report(work: Path, out: Path) -> str:
    rows = [_level_row(r) for r in latest_levels([r for r in _load(work / "levels.jsonl") if r.get("kind") == "sweep"])]
    ran = [r for r in rows if "error" not in r]
    attr = attribution(_load(work / "inject.jsonl"))
    nodes = sorted({n for r in ran for n in r["processing_ms"]}, key=lambda n: (n != "proxy", n))
    out.mkdir(parents=True, exist_ok=True)
    summary = {"paper": PAPER, "levels": rows,
               "injections": [{k: v for k, v in a.items() if k != "deltas_ms"} |
                              {"deltas_ms": {f: {k: v for k, v in d.items()} for f, d in a.get("deltas_ms", {}).items()}}
                              for a in attr]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    md = markdown(rows, attr, nodes) + "\n## In one row per size and operation\n\n" + compact(ran)
    made = plots(ran, attr, nodes, out)
    md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made) + "\n"
    (out / "summary.md").write_text(md)
    return md
