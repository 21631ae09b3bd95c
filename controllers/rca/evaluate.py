"""``promreflex rca eval DATASET``: run a folder of fault cases, print AC@1, AC@3, Avg@5.

A case is any folder below DATASET that holds a case in RCAEval's layout (``normal.csv`` +
``anomalous.csv``, or ``data.csv``) or MicroRCA's (``*_mpg.csv``). The truth is read from the
case's first folder under DATASET, ``<service>-<fault>`` or ``<service>_<fault>`` (RCD's and
RCAEval's naming: ``carts-cpu/3``, ``checkoutservice_delay/1``), and used for scoring only:
the analysis never sees the path. Every case runs with the same settings.

AC@k is the share of cases whose true service is among the first k of the ranking; Avg@k is
the mean of AC@1..AC@k (BARO, RCAEval). The published figures printed beside ours are from
the BARO paper (Pham, Ha, Zhang, FSE 2024), Table 3, Sock Shop, Avg@5: they are for the
same system and fault kinds, on their own runs of it, not on these exact files.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from controllers.rca.engine import analyse
from controllers.rca.models import AnalysisConfig
from controllers.rca.offline import OfflineDataError, load_dir
from controllers.rca.tabular import TableOptions, is_table_case, load_case

#: Avg@5 on Sock Shop, BARO paper (FSE 2024) Table 3, by fault kind.
ANCHORS: dict[str, dict[str, float]] = {
    "BARO": {"cpu": 0.97, "mem": 0.98},
    "N-Sigma": {"cpu": 0.98, "mem": 0.98},
    "RCD": {"cpu": 0.62, "mem": 0.46},
}
_TRUTH = re.compile(r"^(?P<service>.+?)[-_](?P<fault>[A-Za-z0-9]+)$")


@dataclass(frozen=True)
class CaseResult:
    case: str
    service: str
    fault: str
    rank: int | None  # 1-based rank of the true service; None: not ranked at all
    top: list[str]
    margin: float | None = None  # the true service's score over the best other score


def ac_at(ranks: Sequence[int | None], k: int) -> float:
    """Share of cases whose truth is among the first ``k`` (an unranked case is a miss)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    if not ranks:
        return float("nan")
    return sum(1 for r in ranks if r is not None and r <= k) / len(ranks)


def avg_at(ranks: Sequence[int | None], k: int) -> float:
    return sum(ac_at(ranks, j) for j in range(1, k + 1)) / k


def find_cases(root: Path) -> list[Path]:
    found = []
    for p in sorted([root, *(d for d in root.rglob("*") if d.is_dir())]):
        if (p / "anomalous.csv").is_file() or (p / "data.csv").is_file() or any(p.glob("*_mpg.csv")):
            found.append(p)
    return found


def truth_of(case: Path, root: Path) -> tuple[str, str]:
    rel = case.relative_to(root).parts
    name = rel[0] if rel else case.name
    m = _TRUTH.match(name)
    if m is None:
        raise OfflineDataError(f"{case}: cannot read <service>-<fault> from {name!r}")
    return m["service"], m["fault"].lower()


def run(
    root: str | Path,
    *,
    graph: list[tuple[str, str]] | None = None,
    options: TableOptions | None = None,
    config: AnalysisConfig | None = None,
    use_split: bool = True,
) -> list[CaseResult]:
    root = Path(root)
    cases = find_cases(root)
    if not cases:
        raise OfflineDataError(f"{root}: no cases (folders with anomalous.csv + normal.csv, data.csv or *_mpg.csv)")
    out = []
    for case in cases:
        service, fault = truth_of(case, root)
        data = (
            load_case(case, graph=graph, options=options, use_split=use_split) if is_table_case(case)
            else load_dir(case)
        )
        finding = analyse(data, config)
        mine = next((v.score for v in finding.ranking if v.service == service), None)
        other = max((v.score for v in finding.ranking if v.service != service), default=0.0)
        out.append(CaseResult(
            case=str(case.relative_to(root)) or case.name, service=service, fault=fault,
            rank=finding.rank_of(service), top=finding.top(5),
            margin=None if mine is None else mine / max(other, 1e-9),
        ))
    return out


def summary(results: list[CaseResult]) -> dict[str, object]:
    by_fault: dict[str, list[int | None]] = defaultdict(list)
    for r in results:
        by_fault[r.fault].append(r.rank)
    by_fault["overall"] = [r.rank for r in results]
    rows = {
        fault: {"cases": len(ranks), "ac1": ac_at(ranks, 1), "ac3": ac_at(ranks, 3), "avg5": avg_at(ranks, 5),
                "published_avg5": {name: a[fault] for name, a in ANCHORS.items() if fault in a}}
        for fault, ranks in by_fault.items()
    }
    return {"figures": rows, "cases": [asdict(r) for r in results],
            "published": "BARO paper (Pham, Ha, Zhang, FSE 2024), Table 3, Sock Shop, Avg@5"}


def table(s: dict[str, object]) -> str:
    figures: dict[str, dict[str, object]] = s["figures"]  # type: ignore[assignment]
    names = list(ANCHORS)
    head = ["fault", "cases", "AC@1", "AC@3", "Avg@5", *(f"{n} Avg@5" for n in names)]
    lines = [head]
    for fault, row in figures.items():
        pub: dict[str, float] = row["published_avg5"]  # type: ignore[assignment]
        lines.append([
            fault, str(row["cases"]), f"{row['ac1']:.2f}", f"{row['ac3']:.2f}", f"{row['avg5']:.2f}",
            *(f"{pub[n]:.2f}" if n in pub else "-" for n in names),
        ])
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)


def plot(results: list[CaseResult], path: str | Path, title: str = "") -> None:
    """One bar per case: the true service's rank (1 is best; an unranked case is drawn at 0
    in red), grouped by fault kind; below, how far its score stands above the best other
    service's (above 1: named first, and by how much)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(results, key=lambda r: (r.fault, r.case))
    ranks = [r.rank or 0 for r in ordered]
    colours = ["tab:green" if r.rank == 1 else "tab:orange" if r.rank else "tab:red" for r in ordered]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(max(6.0, 0.28 * len(ordered)), 5.0), dpi=100, sharex=True)
    ax.bar(range(len(ordered)), ranks, color=colours)
    ax.set_ylabel("rank of the\ntrue root cause")
    ax.set_ylim(0, max([5, *ranks]) + 0.5)
    ax.set_title(title or "rca eval: rank of the injected service per case", fontsize=9)
    ax2.bar(range(len(ordered)), [r.margin or 0.0 for r in ordered], color=colours)
    ax2.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax2.set_yscale("log")
    ax2.set_ylabel("its score / best\nother score")
    ax2.set_xticks(range(len(ordered)), [r.case for r in ordered], rotation=90, fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(s: dict[str, object], results: list[CaseResult], out: str | Path, title: str = "") -> tuple[Path, Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    js, png = folder / "summary.json", folder / "ranks.png"
    js.write_text(json.dumps(s, indent=2) + "\n")
    plot(results, png, title)
    return js, png
