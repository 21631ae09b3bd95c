"""The bench's figures, like the paper's: completed sessions/s vs clients per arm (one panel per
condition), failed sessions by page at 1x and 4x saturation, response time over elapsed time at
1x and 4x, the schedulers' behaviour over time (admission interval, page-queue length,
concurrency limits), and the demo's timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.admission.arms import ARM_LABELS, ARMS
from bench.admission.pages import PAGE_GROUPS

COLORS = {"none": "#d62728", "nginx-limit": "#ff7f0e", "page": "#1f77b4", "full": "#2ca02c"}
DPI = 100


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write(out: Path, summary: dict[str, Any]) -> list[str]:
    """sessions.png and failures.png from a summary; returns the files written."""
    points = summary.get("points") or {}
    if not points:
        return []
    plt = _plt()
    written = []
    conds = list(points)
    fig, axes = plt.subplots(1, len(conds), figsize=(4.6 * len(conds), 3.8), squeeze=False)
    for ax, cond in zip(axes[0], conds, strict=True):
        rows = points[cond]
        c = summary["conditions"][cond]
        for arm in ARMS:
            rs = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["clients"])
            if rs:
                ax.plot([r["clients"] for r in rs], [r["completed_per_s"] for r in rs], "o-", color=COLORS[arm],
                        label=ARM_LABELS[arm])
                spread = [r for r in rs if (r.get("completed") or {}).get("n", 1) > 1]
                if spread:  # repeated points: the mean's line, the runs' range as a bar
                    ax.errorbar([r["clients"] for r in spread], [r["completed_per_s"] for r in spread],
                                yerr=[[r["completed_per_s"] - r["completed"]["min"] for r in spread],
                                      [r["completed"]["max"] - r["completed_per_s"] for r in spread]],
                                fmt="none", ecolor=COLORS[arm], capsize=3, lw=0.9)
        n_sat = (summary.get("calibration") or {}).get("n_sat")
        if n_sat:
            ax.axvline(n_sat, color="grey", lw=0.8, ls=":")
        ax.set_title(f"think {c['paper_think_s']:g} s, timeout {c['paper_timeout_s']:g} s", fontsize=10)
        ax.set_xlabel("clients")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"completed sessions/s (time x {summary['scale']:g})")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sessions.png", dpi=DPI)
    plt.close(fig)
    written.append("sessions.png")

    base = points.get("base") or []
    mults = sorted({r["multiple"] for r in base})
    show = [m for m in (1.0, max(mults, default=1.0)) if m in mults]
    if show:
        fig, axes = plt.subplots(1, len(show), figsize=(5.2 * len(show), 3.6), squeeze=False)
        groups = [g for g, _ in PAGE_GROUPS]
        for ax, m in zip(axes[0], show, strict=True):
            rows = [r for r in base if r["multiple"] == m]
            top = max((r["failed_by_group"][g] for r in rows for g in groups), default=0)
            ax.set_ylim(0, max(1.0, top * 1.1))
            width = 0.8 / max(1, len(ARMS))
            for i, arm in enumerate(ARMS):
                r = next((r for r in rows if r["arm"] == arm), None)
                if r is None:
                    continue
                vals = [r["failed_by_group"][g] for g in groups]
                ax.bar([k + i * width for k in range(len(groups))], vals, width, color=COLORS[arm], label=ARM_LABELS[arm])
            clients = rows[0]["clients"] if rows else 0
            ax.set_title(f"{clients} clients ({m:g}x saturation)", fontsize=10)
            ax.set_xticks([k + width * (len(ARMS) - 1) / 2 for k in range(len(groups))], [f"page {g}" for g in groups])
            ax.set_ylabel("failed sessions in the window")
            ax.grid(alpha=0.3, axis="y")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "failures.png", dpi=DPI)
        plt.close(fig)
        written.append("failures.png")
        written += responses(out, summary, base, show)
    top = max(mults, default=None)
    if top is not None:
        clients = next(r["clients"] for r in base if r["multiple"] == top)
        written += scheduler(out, out / "raw", clients, top)
    return written


def responses(out: Path, summary: dict[str, Any], base: list[dict[str, Any]], show: list[float]) -> list[str]:
    """Median response time per second over the run, per arm, at 1x and 4x (the paper's
    "response time at 125 / 400 clients"); the counting window shaded, the timeout dotted."""
    rows = [r for r in base if r["multiple"] in show and r.get("rt_timeline")]
    if not rows:
        return []
    plt = _plt()
    fig, axes = plt.subplots(1, len(show), figsize=(5.2 * len(show), 3.6), squeeze=False)
    w = summary["window"]
    timeout = summary["conditions"]["base"]["timeout_s"]
    for ax, m in zip(axes[0], show, strict=True):
        for arm in ARMS:
            r = next((r for r in rows if r["multiple"] == m and r["arm"] == arm), None)
            if r is None:
                continue
            tl = [p for p in r["rt_timeline"] if p["p50_s"] is not None]
            ax.plot([p["t"] for p in tl], [p["p50_s"] for p in tl], color=COLORS[arm], lw=1.2, label=ARM_LABELS[arm])
        ax.axvspan(w["warmup_s"], w["warmup_s"] + w["seconds"], color="grey", alpha=0.1)
        ax.axhline(timeout, color="grey", ls=":", lw=0.8)
        clients = next((r["clients"] for r in rows if r["multiple"] == m), 0)
        ax.set_title(f"{clients} clients ({m:g}x saturation)", fontsize=10)
        ax.set_xlabel("elapsed seconds (window shaded)")
        ax.set_ylabel("median response time per second, s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "responses.png", dpi=DPI)
    plt.close(fig)
    return ["responses.png"]


def scheduler(out: Path, raw: Path, clients: int, multiple: float) -> list[str]:
    """The proxy's state over time at the largest count (the paper's last figure): the session
    scheduler's admission interval and the total page-queue length (full scheme), and the
    page scheduler's concurrency limits (full scheme, and page scheduler only when sampled)."""
    arms = [(arm, raw / f"state-base-{arm}-{clients}.json") for arm in ("full", "page")]
    series = {}
    for arm, path in arms:
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if rows:
            series[arm] = rows
    if "full" not in series:
        return []
    plt = _plt()
    fig, axes = plt.subplots(1, 1 + len(series), figsize=(5.2 * (1 + len(series)), 3.6), squeeze=False)
    rows = series["full"]
    t0 = rows[0]["t"]
    t = [r["t"] - t0 for r in rows]
    ax = axes[0][0]
    ax.plot(t, [r["state"]["sessions"]["interval_seconds"] * 1000 for r in rows], color="#2ca02c", label="admission interval, ms")
    ax.set_yscale("log")
    ax.set_ylabel("admission interval, ms (log)")
    ax2 = ax.twinx()
    ax2.plot(t, [sum(p["queue"] for p in r["state"]["pages"].values()) for r in rows], color="#9467bd", lw=0.9,
             label="page queues, total")
    ax2.plot(t, [r["state"]["sessions"]["queue"] for r in rows], color="#8c564b", lw=0.9, ls="--", label="session queue")
    ax2.set_ylabel("requests / sessions waiting")
    ax.set_title(f"session scheduler, {clients} clients ({multiple:g}x)", fontsize=10)
    ax.set_xlabel("elapsed seconds")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [str(h.get_label()) for h in lines], fontsize=7, loc="upper left")
    for ax, (arm, rows) in zip(axes[0][1:], series.items(), strict=True):
        t0 = rows[0]["t"]
        pages = [p for p in rows[0]["state"]["pages"] if p != "other"]
        for name in pages:
            ax.plot([r["t"] - t0 for r in rows], [r["state"]["pages"][name]["limit"] for r in rows], lw=1.0, label=name)
        ax.set_title(f"page concurrency limits: {ARM_LABELS[arm]}", fontsize=10)
        ax.set_xlabel("elapsed seconds")
        ax.set_ylabel("limit")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scheduler.png", dpi=DPI)
    plt.close(fig)
    return ["scheduler.png"]


def demo(out: Path, summary: dict[str, Any]) -> str:
    plt = _plt()
    results = summary["results"]
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.6 * len(results)), sharex=True, squeeze=False)
    for ax, (arm, r) in zip(axes[:, 0], results.items(), strict=True):
        tl = r["timeline"]
        t = [row["t"] for row in tl]
        ax.plot(t, [row["completed"] for row in tl], color="#2ca02c", label="completed/s")
        ax.plot(t, [row["failed_start"] for row in tl], color="#1f77b4", label="failed at page 1 /s")
        ax.plot(t, [row["failed_mid"] for row in tl], color="#d62728", label="failed mid-session /s")
        ax.axvline(summary["before_s"], color="grey", ls=":")
        ax.set_title(ARM_LABELS[arm], fontsize=10)
        ax.set_ylabel("sessions/s")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel(f"seconds (flash crowd of {summary['crowd']} clients at the dotted line)")
    fig.tight_layout()
    path = out / "demo.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return str(path)
