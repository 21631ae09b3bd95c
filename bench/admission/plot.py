"""The bench's figures, like the paper's: completed sessions/s vs clients per arm (one panel per
condition), failed sessions by page at 1x and 4x saturation, and the demo's timeline."""

from __future__ import annotations

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
    return written


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
