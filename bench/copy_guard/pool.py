"""Pool several rounds of the copy-guard bench (each its own ``summary.json``) into one table.

One round's "lost responses saved" rests on a few dozen responses (the built-in shop's flash
crowd loses 31-42): the same arm read 57% and 106% in two rounds. Each round is fair on its
own (one calibration, one common window holding every copy, arms in one order), so rounds are
pooled per arm as ``sum(saved) / sum(lost)`` over the rounds in which the arm ran, never by
mixing runs of different rounds; the copy's delay is the mean of the rounds' ``copy slower``
(also of a round whose copy outlived the window: it has no share, and an arm with such a round
does not meet the target).
The verdict is the bench's target on the pooled figures, and the table keeps every round's own
share next to it, so the spread stays in sight. Beside the pooled share: an approximate 90%
interval from the rounds themselves (the rounds resampled with replacement, 10,000 times, seeded:
the same input gives the same interval), the pooled share of each resample. A percentile bootstrap
over a few rounds is narrower than its name (over 2 rounds it is the two rounds' range), so an arm
meets the target only with at least MIN_ROUNDS counted rounds AND the interval's low end at or
above the target's share (and the copy's mean delay within its bound, and no round whose copy
outlived the window); a pooled share at or above the target that is not decided so is reported as
undecided, with why. A round's loss is a few dozen responses, and two load-only rounds of one shop
differ by as many. A round whose copy cost nothing (lost <= 0) has no share to pool: it is listed,
not counted, and it is not a copy that outlived the window.

    uv run python -m bench.copy_guard.pool bench/results/copy_guard/builtin-crowd \\
        bench/results/copy_guard/builtin-crowd/round2 bench/results/copy_guard/builtin-crowd/round3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.conditions import write_result
from bench.copy_guard.arms import ARMS

#: Counted rounds an arm needs before its interval may decide that it meets the target.
MIN_ROUNDS = 5


@dataclass
class Pooled:
    arm: str
    label: str
    shares: list[float | None] = field(default_factory=list)  # per round, None: not counted
    saved: int = 0
    lost: int = 0
    slower: list[float] = field(default_factory=list)
    uncounted: int = 0  # rounds whose copy outlived the window (no share)
    no_loss: int = 0  # rounds in which the copy cost nothing (lost <= 0: no share to pool)
    counted: list[tuple[int, int]] = field(default_factory=list)  # (saved, lost) of each counted round

    @property
    def share(self) -> float | None:
        return self.saved / self.lost if self.lost > 0 else None

    def interval(self, level: float = 0.9, resamples: int = 10_000) -> tuple[float, float] | None:
        """The pooled share's ``level`` interval over rounds resampled with replacement (seeded);
        None with fewer than 2 counted rounds. Approximate: over few rounds narrower than ``level``
        (see the module's note). A resample whose rounds lost nothing in sum is skipped."""
        if len(self.counted) < 2:
            return None
        rng = random.Random(0)
        n = len(self.counted)
        shares = []
        for _ in range(resamples):
            pick = [self.counted[rng.randrange(n)] for _ in range(n)]
            lost = sum(lo for _, lo in pick)
            if lost > 0:
                shares.append(sum(sv for sv, _ in pick) / lost)
        if not shares:
            return None
        shares.sort()
        tail = (1 - level) / 2
        return shares[int(tail * (len(shares) - 1))], shares[int((1 - tail) * (len(shares) - 1))]

    @property
    def mean_slower(self) -> float | None:
        return statistics.mean(self.slower) if self.slower else None

    def judge(self, target: dict[str, float]) -> tuple[str, str]:
        """("met" | "undecided" | "not met", why) against the bench's target (see the module)."""
        goal, bound = target.get("saved_share", 0.8), target.get("slowdown", 0.4)
        if self.uncounted:
            return "not met", f"{self.uncounted} round(s) whose copy outlived the window"
        if self.share is None:
            return "not met", "no round with responses to save"
        if self.mean_slower is not None and self.mean_slower > bound:
            return "not met", f"the copy {self.mean_slower:+.0%} on mean, over {bound:+.0%}"
        if self.share < goal:
            return "not met", f"pooled {self.share:.0%}, under {goal:.0%}"
        if len(self.counted) < MIN_ROUNDS:
            return "undecided", f"{len(self.counted)} counted round(s), {MIN_ROUNDS} needed to decide"
        iv = self.interval()
        if iv is None or iv[0] < goal:
            return "undecided", f"the 90% interval reaches down to {iv[0]:.0%}" if iv else "no interval"
        return "met", f"{len(self.counted)} rounds, 90% interval {iv[0]:.0%} .. {iv[1]:.0%}"


def load(dirs: list[Path], scenario: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The summaries of ``dirs`` (a directory or its summary.json), and their common target."""
    sums, target = [], None
    for d in dirs:
        path = d / "summary.json" if d.is_dir() else d
        try:
            s = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"pool: cannot read {path}: {e}") from None
        if not any(r.get("scenario") == scenario for r in s.get("rows", [])):
            raise SystemExit(f"pool: {path} has no {scenario!r} runs")
        if target is not None and s.get("target") != target:
            raise SystemExit(f"pool: {path} has another target ({s.get('target')} vs {target})")
        target = s.get("target")
        sums.append(s)
    return sums, target or {}


def rounds_of(sums: list[dict[str, Any]], scenario: str) -> list[tuple[int, int]]:
    """Every round, in order: (summary index, the round's number in it). A summary of a run with
    ``--rounds N`` holds N rounds, each a round of its own here."""
    out: list[tuple[int, int]] = []
    for i, s in enumerate(sums):
        for rnd in sorted({int(r.get("round", 1)) for r in s["rows"] if r.get("scenario") == scenario}):
            out.append((i, rnd))
    return out


def pool(sums: list[dict[str, Any]], scenario: str) -> list[Pooled]:
    """Per arm, in the order first met: each round's share (:func:`rounds_of`), and the pooled one."""
    out: dict[str, Pooled] = {}
    rounds = rounds_of(sums, scenario)
    for k, (i, rnd) in enumerate(rounds):
        for r in sums[i]["rows"]:
            if (r.get("scenario") != scenario or int(r.get("round", 1)) != rnd
                    or r.get("lost_responses") is None):
                continue
            p = out.setdefault(r["arm"], Pooled(r["arm"], r["label"]))
            p.shares += [None] * (k - len(p.shares))
            p.shares.append(r.get("saved_share"))
            if r.get("saved_share") is not None:  # counted: the round's window held its copy
                p.saved += r["saved_responses"]
                p.lost += r["lost_responses"]
                p.counted.append((r["saved_responses"], r["lost_responses"]))
            elif r.get("copy_outlived_window", r["lost_responses"] > 0):  # (older summaries: no such field)
                p.uncounted += 1  # its copy outlived the window: no share, and the arm cannot meet the target
            else:
                p.no_loss += 1  # the copy cost nothing this round: nothing to save, nothing to pool
            if r.get("copy_slower") is not None:  # the copy's delay counts in every round
                p.slower.append(r["copy_slower"])
    for p in out.values():
        p.shares += [None] * (len(rounds) - len(p.shares))
    return list(out.values())


def render(dirs: list[Path], sums: list[dict[str, Any]], rows: list[Pooled], target: dict[str, float],
           scenario: str) -> str:
    def pct(v: float | None, sign: bool = False) -> str:
        return "-" if v is None else (f"{v:+.0%}" if sign else f"{v:.0%}")

    rounds = rounds_of(sums, scenario)
    heads = [f"round {k + 1}" for k in range(len(rounds))]

    def which(i: int) -> str:
        mine = [k + 1 for k, (j, _) in enumerate(rounds) if j == i]
        return (f"round {mine[0]}" if len(mine) == 1 else f"rounds {mine[0]}-{mine[-1]}") if mine else "no round"
    lines = [f"Pooled {scenario} rounds of the copy-guard bench ({sums[0].get('shop')} shop): "
             + ", ".join(f"{which(i)} = `{d}` ({s.get('when', '?')})" for i, (d, s) in enumerate(zip(dirs, sums))),
             "",
             "| arm | " + " | ".join(heads)
             + " | pooled saved (sum saved / sum lost) | approx. 90% interval (rounds resampled) | copy slower, mean |",
             "|---|" + "---|" * len(heads) + "---|---|---|"]
    for p in rows:
        if p.arm == "no-guard" or not (p.counted or p.uncounted):
            continue
        iv = p.interval()
        lines.append(f"| {p.label} | " + " | ".join(pct(s) for s in p.shares)
                     + f" | {p.saved} of {p.lost} (**{pct(p.share)}**) | "
                     + ("-" if iv is None else f"{pct(iv[0])} .. {pct(iv[1])}") + f" | {pct(p.mean_slower, True)} |")
    lines.append("")
    judged = [(p, *p.judge(target)) for p in rows
              if p.arm != "no-guard" and (p.counted or p.uncounted) and not (p.arm in ARMS and ARMS[p.arm].oracle)]
    meets = [(p, why) for p, verdict, why in judged if verdict == "met"]
    goal = f"saved >= {target.get('saved_share', 0.8):.0%} with the copy at most {target.get('slowdown', 0.4):+.0%}"
    lines.append(f"**{scenario}, pooled over {len(rounds)} rounds: target ({goal}) "
                 + ("met by: " + ", ".join(f"{p.arm} ({pct(p.share)} at {pct(p.mean_slower, True)}; {why})" for p, why in meets)
                    if meets else "NOT met by any arm") + "**")
    lines.append("")
    lines += [f"- {p.arm}: {verdict} ({why})" for p, verdict, why in judged if verdict != "met"]
    lines += [f"- {p.arm}: {p.no_loss} round(s) in which the copy cost nothing (not pooled)" for p in rows
              if p.no_loss and p.arm != "no-guard"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.copy_guard.pool", description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", nargs="+", type=Path, help="result directories (or summary.json files), one per round")
    ap.add_argument("--scenario", default="flash")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    a = ap.parse_args(argv)
    sums, target = load(a.rounds, a.scenario)
    text = render(a.rounds, sums, pool(sums, a.scenario), target, a.scenario)
    sys.stdout.write(text)
    return write_result(a.out, text) if a.out is not None else 0  # (a new directory is the usual case)


if __name__ == "__main__":
    raise SystemExit(main())
