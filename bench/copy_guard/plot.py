"""RPS timelines like the paper's Figure 17: one panel per run, served requests per second
against the calibrated threshold, the copy's span marked and its pauses shaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.copy_guard.analysis import RunResult


def plot_timelines(runs: Sequence[RunResult], threshold: float, path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.3 * len(runs) + 0.6), sharex=True, squeeze=False)
    ymax = max([threshold * 1.3] + [max(r.per_second.values(), default=0) * 1.1 for r in runs if r.per_second])
    for ax, r in zip(axes[:, 0], runs):
        t0 = r.load_start or (r.copy_start or 0.0)
        if r.per_second:
            secs = sorted(r.per_second)
            ax.plot([s - t0 for s in secs], [r.per_second[s] for s in secs], color="tab:blue", linewidth=1.2,
                    label="served RPS (per second)")
        if r.failed_per_second and any(r.failed_per_second.values()):
            secs = sorted(r.failed_per_second)
            ax.plot([s - t0 for s in secs], [r.failed_per_second[s] for s in secs], color="tab:red", linewidth=0.8,
                    label="failed per second")
        ax.axhline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:.1f}")
        if r.copy_start is not None:
            end = r.copy_end if r.copy_end is not None else r.copy_start
            ax.axvspan(r.copy_start - t0, end - t0, ymin=0, ymax=0.04, color="tab:green", alpha=0.8, label="copy running")
        for i, (a, b) in enumerate(r.pause_intervals or []):
            ax.axvspan(a - t0, b - t0, color="tab:orange", alpha=0.25, label="copy paused" if i == 0 else None)
        if r.load:
            ax.axvline(r.load_end - t0, color="grey", linewidth=0.8, linestyle=":", label="load ends")
        copy = f", copy {r.copy_seconds:.0f}s" if r.copy_seconds is not None else ""
        ax.set_title(f"{r.name} (round {r.round + 1}): served {r.served}, failed {r.failed}{copy}, "
                     f"{r.seconds_below:.1f}s below threshold", fontsize=9, loc="left")
        ax.set_ylim(0, ymax)
        ax.set_ylabel("req/s")
        ax.legend(loc="lower left", fontsize=7, ncol=6, framealpha=0.8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the load (or the copy) started")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
