"""``promreflex rca eval DATASET``: run a folder of fault cases, print AC@1, AC@3, Avg@5.

A case is any folder below DATASET (DATASET included) that holds a case in RCAEval's layout
(``normal.csv`` + ``anomalous.csv``, or one of :data:`~controllers.rca.tabular.TABLE_FILES`:
RE1's ``data.csv``, RE2/RE3's ``simple_metrics.csv``/``metrics.csv``) or MicroRCA's
(``*_mpg.csv``). DATASET may be a system's folder (``RE1-TT``) or a benchmark's root holding
systems (``RE1``, folders ``<system>/<service>_<fault>/<repetition>/``).

The truth is read from the ``<service>-<fault>`` or ``<service>_<fault>`` folder that holds the
case: the case folder's parent when the case folder is a repetition number (``carts-cpu/3``,
``checkoutservice_delay/1``), else the case folder itself. Its service is the longest service
present in the case's data that the folder name starts with, followed by ``-`` or ``_``, so
service and fault names may hold ``-`` and ``_`` themselves (``ts-order-service_network-delay``,
``carts_db_cpu``); the rest is the fault kind. When no service of the data fits, the name is
split at its last ``-``/``_`` and the case's line says that this truth is not a service in the
data (the case counts as a miss). The truth is used for scoring only: the analysis never sees
the path. A MicroRCA folder's truth is its files' prefix (``service_cpu_carts_mpg.csv``: carts,
cpu), which names the fault in MicroRCA's published data, when it ends with a service of the
data. Every case runs with the same settings.

A case that cannot be read (or whose folder name has no ``<service>-<fault>`` form) does not
stop the run: it is listed as an error with its path and the reason, and left out of the
figures (their case counts say how many were scored). ``rca eval`` exits with 2 only when no
case at all could be read.

AC@k is the share of cases whose true service is among the first k of the ranking; Avg@k is
the mean of AC@1..AC@k (BARO, RCAEval). The published figures printed beside ours are from
the BARO paper (Pham, Ha, Zhang, FSE 2024), Table 3, Sock Shop, Avg@5: they are for the
same system and fault kinds, on their own runs of it, not on these exact files.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from controllers.rca.engine import analyse
from controllers.rca.models import AnalysisConfig
from controllers.rca.offline import OfflineDataError, OfflineOptions, load_dir, microrca_config
from controllers.rca.tabular import TABLE_FILES, TableOptions, is_table_case, load_case, table_file

#: Avg@5 on Sock Shop, BARO paper (FSE 2024) Table 3, by fault kind.
ANCHORS: dict[str, dict[str, float]] = {
    "BARO": {"cpu": 0.97, "mem": 0.98},
    "N-Sigma": {"cpu": 0.98, "mem": 0.98},
    "RCD": {"cpu": 0.62, "mem": 0.46},
}
#: Fallback when no service of the data prefixes the folder name: split at the last - or _.
_TRUTH = re.compile(r"^(?P<service>.+)[-_](?P<fault>[^-_]+)$")


@dataclass(frozen=True)
class CaseResult:
    case: str
    service: str
    fault: str
    rank: int | None  # 1-based rank of the true service; None: not ranked at all
    top: list[str]
    margin: float | None = None  # the true service's score over the best other score
    note: str | None = None  # said on the case's line (the truth is not a service in the data)


@dataclass(frozen=True)
class CaseError:
    """A case that could not be read: left out of the figures."""

    case: str
    path: str
    reason: str


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
    """Every case folder under ``root``, linked folders followed (a dataset kept on another disk
    and linked into a benchmark root: ``rglob`` does not follow links, "no cases"); a folder
    reached twice by links (or a link loop) is read once."""
    return [p for p in _folders(root) if _is_case(p)]


def _folders(root: Path) -> list[Path]:
    """``root`` and every folder below it, sorted, links followed, each real folder once."""
    dirs, seen = [root], {root.resolve()}
    # The folders themselves first (their names carry the labels), then what links add.
    for follow in (False, True):
        for top, subdirs, _ in os.walk(root, followlinks=follow):
            for name in sorted(subdirs):
                d = Path(top) / name
                real = d.resolve()
                if real in seen:
                    if follow and d.is_symlink():
                        subdirs.remove(name)  # a link to a folder walked already: not again (nor a loop)
                    continue
                if not follow and d.is_symlink():
                    continue  # (the second pass)
                seen.add(real)
                dirs.append(d)
    return sorted(dirs)


def _is_case(p: Path) -> bool:
    return (p / "anomalous.csv").is_file() or table_file(p) is not None or any(p.glob("*_mpg.csv"))


#: Files that look like a case's data (any case of letters, compressed or not).
_DATA_FILE = re.compile(r"\.(csv|tsv)(\.(gz|bz2|xz|zst|zip))?$", re.IGNORECASE)


def find_unread(root: Path, cases: Sequence[Path], folders: Sequence[Path] | None = None) -> list[tuple[Path, str]]:
    """Folders under ``root`` that hold data files but are no case and hold none (a lone
    ``normal.csv``, ``Anomalous.csv``, ``data.csv.gz``), with what they hold: ``rca eval`` lists
    them as not read, so a figure over 27 cases of 30 says so."""
    real_cases = {c.resolve() for c in cases}
    holds_case = {p for c in real_cases for p in c.parents}
    out: list[tuple[Path, str]] = []
    for d in _folders(root) if folders is None else folders:  # (the walk find_cases made, when given)
        real = d.resolve()
        if real in real_cases or real in holds_case or any(p in real_cases for p in real.parents):
            continue
        if any(d.is_relative_to(o) for o, _ in out):
            continue  # inside a folder listed already
        data = sorted(f.name for f in d.iterdir() if f.is_file() and _DATA_FILE.search(f.name))
        if data:
            out.append((d, ", ".join(data[:6]) + (", ..." if len(data) > 6 else "")))
    return out


def truth_folder(case: Path) -> str:
    """The name of the ``<service>_<fault>`` folder holding ``case`` (see the module docstring);
    a relative path (``./3``, ``../3``, ``.``) is made absolute first, links kept."""
    case = Path(os.path.abspath(case))
    return case.parent.name if case.name.isdigit() else case.name


#: MicroRCA's file prefix, ``<fault type>_<service>`` (``service_cpu_carts``, ``svc_latency_orders``,
#: ``service_memory_user``, elastisys/MicroRCA): the fault type's leading word is dropped.
_MICRORCA_FAULT = re.compile(r"^(?:service|svc)_(?P<fault>[a-z]+)$", re.IGNORECASE)


def microrca_truth(case: Path, services: Sequence[str]) -> tuple[str, str] | None:
    """(service, fault) from the prefix of a MicroRCA folder's ``*_mpg.csv``, which names the
    injected fault in the published data; None when the prefix names no service of the data."""
    graphs = sorted(case.glob("*_mpg.csv"))
    if len(graphs) != 1:
        return None
    prefix = graphs[0].stem[: -len("_mpg")]
    fits = [s for s in services if prefix.endswith("_" + s) and len(prefix) > len(s) + 1]
    if not fits:
        return None
    service = max(fits, key=len)
    kind = prefix[: -len(service) - 1]
    m = _MICRORCA_FAULT.match(kind)
    return service, (m["fault"] if m else kind).lower()


#: A pod of a service: a StatefulSet ordinal (``-0``), a Deployment's ``-<hash>-<5>`` or a bare
#: ``-<5>`` suffix, in Kubernetes' alphabet for them (no vowels, no 0, 1, 3: so ``carts-redis``
#: or ``user-cache`` is a service of its own, not a pod of ``carts`` or ``user``).
_K8S = "[bcdfghjklmnpqrstvwxz2456789]"
_POD_SUFFIX = rf"-(\d+|{_K8S}{{6,10}}-{_K8S}{{5}}|{_K8S}{{5}})"


def pods_of(service: str, services: Sequence[str]) -> list[str]:
    """The services of the data that are pods of ``service`` (``cartservice-0``)."""
    pattern = re.compile(re.escape(service) + _POD_SUFFIX)
    return sorted(s for s in services if pattern.fullmatch(s))


def truth_of(case: Path, services: Sequence[str] = ()) -> tuple[str, str, str | None]:
    """(service, fault, note): the truth of ``case`` among ``services`` (those in its data);
    the note is set when no service of the data fits the folder name. A MicroRCA folder's truth
    is its file prefix's (:func:`microrca_truth`) when that names a service of the data."""
    if (named := microrca_truth(case, services)) is not None:
        return named[0], named[1], None
    name = truth_folder(case)
    # A repetition folder need not be all digits (``carts-cpu/run3``): when the case folder's
    # own name names no service of the data, its parent's may.
    absolute = Path(os.path.abspath(case))
    names = [name] if name != absolute.name or not absolute.parent.name else [name, absolute.parent.name]
    for candidate in names:
        fits = [s for s in services if len(candidate) > len(s) + 1 and candidate.startswith(s)
                and candidate[len(s)] in "-_"]
        if fits:
            service = max(fits, key=len)
            return service, candidate[len(service) + 1:].lower(), None
    m = next((m for m in map(_TRUTH.match, names) if m is not None), None)
    if m is None:
        raise OfflineDataError(f"{case}: cannot read <service>-<fault> from the folder name {name!r}")
    return m["service"], m["fault"].lower(), f"truth {m['service']!r} is not a service in the data"


def run(
    root: str | Path,
    *,
    graph: list[tuple[str, str]] | None = None,
    options: TableOptions | None = None,
    config: AnalysisConfig | None = None,
    use_split: bool = True,
    errors: list[CaseError] | None = None,
    microrca: OfflineOptions | None = None,
) -> list[CaseResult]:
    """Every case below ``root``, scored. With an ``errors`` list, a case that cannot be read
    (and a folder of data files that is no case, :func:`find_unread`) is appended to it and the
    run goes on; without one, the first such case raises. ``microrca``: the options for MicroRCA
    folders, analysed with the same settings as ``rca offline`` (:func:`microrca_config`)."""
    root = Path(root)
    if not root.is_dir():
        raise OfflineDataError(f"{root}: no such folder")
    folders = _folders(root)  # walked once: for the cases and for the folders that are none
    cases = [p for p in folders if _is_case(p)]
    if not cases:
        raise OfflineDataError(
            f"{root}: no cases (folders with anomalous.csv + normal.csv, {', '.join(TABLE_FILES)} or *_mpg.csv)"
        )

    def label_of(case: Path) -> str:
        return str(case.relative_to(root)) if case != root else Path(os.path.abspath(case)).name

    for folder, held in find_unread(root, cases, folders):
        reason = (f"no case here: it holds {held}, not anomalous.csv + normal.csv, {', '.join(TABLE_FILES)} "
                  "or *_mpg.csv (names are case-sensitive; unpack compressed files)")
        if errors is None:
            raise OfflineDataError(f"{folder}: {reason}")
        errors.append(CaseError(case=label_of(folder), path=str(folder), reason=reason))
    out = []
    for case in cases:
        label = label_of(case)
        table = is_table_case(case)
        try:
            data = (
                load_case(case, graph=graph, options=options, use_split=use_split) if table
                else load_dir(case, microrca)
            )
            service, fault, note = truth_of(case, list(data.services))
        except (ValueError, OSError) as e:  # OfflineDataError is a ValueError
            if errors is None:
                raise
            errors.append(CaseError(case=label, path=str(case), reason=str(e)))
            continue
        finding = analyse(data, config if table else microrca_config(microrca, config))
        truth = {service}
        if pods := pods_of(service, list(data.services)):
            # pod-level data (AIOps challenge, Nezha: cartservice-0, -1, -2): the service is
            # named by any of its pods, also where other series are the service's own
            truth = {service, *pods} if note is None else set(pods)
            note = f"truth {service!r} read as {'itself and ' if note is None else ''}its pods {', '.join(pods)}"
        ranks = [r for r in map(finding.rank_of, sorted(truth)) if r is not None]
        mine = max((v.score for v in finding.ranking if v.service in truth), default=None)
        other = max((v.score for v in finding.ranking if v.service not in truth), default=0.0)
        out.append(CaseResult(
            case=label, service=service, fault=fault,
            rank=min(ranks, default=None), top=finding.top(5),
            margin=None if mine is None else mine / max(other, 1e-9), note=note,
        ))
    return out


def summary(results: list[CaseResult], errors: Sequence[CaseError] = ()) -> dict[str, object]:
    """Figures per fault kind over the scored cases; unreadable cases (``errors``) are listed
    apart and are not in the figures."""
    by_fault: dict[str, list[int | None]] = defaultdict(list)
    for r in results:
        by_fault[r.fault].append(r.rank)
    by_fault["overall"] = [r.rank for r in results]
    rows = {
        fault: {"cases": len(ranks), "ac1": ac_at(ranks, 1), "ac3": ac_at(ranks, 3), "avg5": avg_at(ranks, 5),
                "published_avg5": {name: a[fault] for name, a in ANCHORS.items() if fault in a}}
        for fault, ranks in by_fault.items()
    }
    return {"figures": rows, "cases": [asdict(r) for r in results], "errors": [asdict(e) for e in errors],
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
