"""RPS timelines like the paper's Figure 17: one panel per run, served requests per second
against the calibrated threshold, the copy's span marked and its pauses shaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
        if r.window_s is not None:
            ax.axvline(r.load_start + r.window_s - t0, color="black", linewidth=1.2, linestyle=":",
                       label="counting window ends")
        copy = f", copy {r.copy_seconds:.0f}s" if r.copy_seconds is not None else ""
        served = r.served_window if r.served_window is not None else r.served
        ax.set_title(f"{r.name} (round {r.round + 1}): served {served}, failed {r.failed}{copy}, "
                     f"{r.seconds_below:.1f}s below threshold", fontsize=9, loc="left")
        ax.set_ylim(0, ymax)
        ax.set_ylabel("req/s")
        ax.legend(loc="lower left", fontsize=7, ncol=6, framealpha=0.8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the load (or the copy) started")
    return _save(fig, path, title, fontsize=10, dpi=80)


def _label(row: dict[str, Any]) -> str:
    """``guard-nohold`` for ``load+copy+guard-nohold``: short enough to sit under a bar."""
    run = row["run"].removeprefix("load+copy+") if row["run"] != "load+copy+guard" else "guard"
    return f"{run}\n(round {row['round']})"


def _save(fig: Any, path: Path, title: str, fontsize: int, dpi: int) -> Path:
    """Title, tight layout, write (dpi kept low: these PNGs are committed), close."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_summary(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Per loaded run: responses served in the common window, and the copy's duration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [r for r in rows if r["served"] is not None]
    labels = [_label(r) for r in loaded]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    bars = a1.bar(range(len(loaded)), [r["served"] for r in loaded], color="tab:blue")
    for b, r in zip(bars, loaded):
        txt = f"{r['served']}" + (f"\nsaved {r['saved_responses']:+}" if r["saved_responses"] is not None else "")
        if r["saved_share"] is not None:
            txt += f" ({r['saved_share']:.0%})"
        a1.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    a1.set_xticks(range(len(loaded)), labels, fontsize=7)
    window = max((r["window_s"] or 0) for r in loaded) if loaded else 0
    a1.set_ylabel(f"responses served in the window ({window:.0f} s)")
    a1.margins(y=0.2)
    copies = [r for r in rows if r["copy_seconds"] is not None]
    a2.bar(range(len(copies)), [r["copy_seconds"] for r in copies], color="tab:green")
    a2.set_xticks(range(len(copies)), [_label(r) for r in copies], fontsize=7)
    a2.set_ylabel("copy duration (s)")
    for ax in (a1, a2):
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path, title, fontsize=8, dpi=90)
