"""RPS timelines like the paper's Figure 17: one panel per run, served requests per second
against the calibrated threshold, the copy's span marked and its pauses shaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.copy_guard.analysis import RunResult


def plot_timelines(runs: Sequence[RunResult], threshold: float, path: Path, title: str = "",
                   crowds: dict[str, tuple[float, float]] | None = None) -> Path:
    """One panel per run; ``crowds``: per scenario, the flash crowd's [start, end) s from the
    load's start, shaded grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.0 * len(runs) + 0.6), sharex=True, squeeze=False)
    ymax = max([threshold * 1.3] + [max(r.per_second.values(), default=0) * 1.1 for r in runs if r.per_second])
    for ax, r in zip(axes[:, 0], runs):
        t0 = r.load_start or (r.copy_start or 0.0)
        if crowds and r.load and r.scenario in crowds:
            c0, c1 = crowds[r.scenario]
            ax.axvspan(c0, c1, color="grey", alpha=0.15, label="flash crowd")
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
        for i, (a, b) in enumerate(r.held_intervals or []):
            ax.axvspan(a - t0, b - t0, color="tab:orange", alpha=0.15, label="copy held (share < 1)" if i == 0 else None)
        for i, (a, b) in enumerate(r.pause_intervals or []):
            ax.axvspan(a - t0, b - t0, color="tab:red", alpha=0.2, label="copy paused" if i == 0 else None)
        if r.share_timeline:
            ax2 = ax.twinx()
            ax2.step([t - t0 for t, _ in r.share_timeline], [s for _, s in r.share_timeline], where="post",
                     color="tab:purple", linewidth=0.8)
            ax2.set_ylim(0, 1.05)
            ax2.set_ylabel("copy share", fontsize=7, color="tab:purple")
        if r.load:
            ax.axvline(r.load_end - t0, color="grey", linewidth=0.8, linestyle=":", label="load ends")
        if r.window_s is not None:
            ax.axvline(r.load_start + r.window_s - t0, color="black", linewidth=1.2, linestyle=":",
                       label="counting window ends")
        copy = f", copy {r.copy_seconds:.0f}s" if r.copy_seconds is not None else ""
        served = r.served_window if r.served_window is not None else r.served
        ax.set_title(f"{r.scenario}/{r.name} (round {r.round + 1}): served {served}, failed {r.failed}{copy}, "
                     f"{r.seconds_below:.1f}s below threshold", fontsize=9, loc="left")
        ax.set_ylim(0, ymax)
        ax.set_ylabel("req/s")
        ax.legend(loc="lower left", fontsize=7, ncol=6, framealpha=0.8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the load (or the copy) started")
    return _save(fig, path, title, fontsize=10, dpi=64)  # committed: kept under 200 KB for 8 panels


def plot_pareto(rows: Sequence[dict[str, Any]], path: Path, target: dict[str, float], title: str = "") -> Path:
    """Lost responses saved (share) against the copy's slowdown, one point per guarded arm and
    round; the target region (saved >= target, slowdown <= target) shaded. Throttle settings
    blue, pause rules orange."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r.get("saved_share") is not None and r.get("copy_slower") is not None]
    # arms whose copy outlived the counting window: no fair share; drawn hollow, at saved / lost
    late = [r for r in rows if r.get("saved_share") is None and r.get("copy_slower") is not None
            and r.get("saved_responses") is not None and r.get("lost_responses")]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.axvline(target["slowdown"] * 100, color="tab:green", linestyle="--", linewidth=1,
               label=f"target: saved >= {target['saved_share']:.0%}, copy <= {target['slowdown']:+.0%}")
    ax.axhline(target["saved_share"] * 100, color="tab:green", linestyle="--", linewidth=1)
    ax.axhline(0, color="grey", linewidth=0.8)
    for r in pts + late:
        throttle = str(r["arm"]).startswith("throttle")
        fair = r in pts
        x = r["copy_slower"] * 100
        y = (r["saved_share"] if fair else r["saved_responses"] / r["lost_responses"]) * 100
        color = "tab:blue" if throttle else "tab:orange"
        ax.scatter([x], [y], s=36, zorder=3, color=color if fair else "none", edgecolors=color)
        ax.annotate(f"{r['arm']} (r{r['round']})" + ("" if fair else ": copy outlived the window"), (x, y),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    front = _front([(r["copy_slower"] * 100, r["saved_share"] * 100) for r in pts if str(r["arm"]).startswith("throttle")])
    if len(front) > 1:
        ax.plot(*zip(*front), color="tab:blue", linewidth=1, alpha=0.6, label="throttle settings: Pareto front")
    ax.set_xlabel("copy slower than unguarded (%)")
    ax.set_ylabel("lost responses saved (%)")
    shown = pts + late
    if shown:
        ys = [(r["saved_share"] if r in pts else r["saved_responses"] / r["lost_responses"]) * 100 for r in shown]
        xs = [r["copy_slower"] * 100 for r in shown]
        ax.set_ylim(min(-10, min(ys) - 10), max(110, max(ys) + 10))
        ax.set_xlim(min(-10, min(xs) - 10), max(60, max(xs) + 40))
    else:
        ax.text(0.5, 0.5, "no arm with a saved share (see summary.md)", transform=ax.transAxes, ha="center")
    x0, y1 = ax.get_xlim()[0], ax.get_ylim()[1]
    ax.fill_between([x0, target["slowdown"] * 100], target["saved_share"] * 100, y1, color="tab:green", alpha=0.08)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _save(fig, path, title, fontsize=9, dpi=80)


def _front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both (less delay, more saved), by delay."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not out or y > out[-1][1]:
            out.append((x, y))
    return out


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
