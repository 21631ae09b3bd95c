"""The arithmetic of the evaluation: AC@k, Avg@k, time-to-flag summaries.

A case is one injected fault; its outcome is the ranking the RCA returned (best first) or
``None`` when nothing was flagged in time. AC@k is the share of cases whose true root cause is
among the first k services (a case with no ranking counts as a miss); Avg@k is the mean of
AC@1..AC@k, as in BARO and RCAEval.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from controllers.rca import evaluate


@dataclass(frozen=True)
class CaseOutcome:
    truth: str
    ranking: Sequence[str] | None  # None: not flagged
    time_to_flag_s: float | None = None

    @property
    def rank(self) -> int | None:
        """1-based position of the true root cause, None when absent or not flagged."""
        if self.ranking is None:
            return None
        try:
            return list(self.ranking).index(self.truth) + 1
        except ValueError:
            return None


def ac_at(outcomes: Sequence[CaseOutcome], k: int) -> float:
    return evaluate.ac_at([o.rank for o in outcomes], k)


def avg_at(outcomes: Sequence[CaseOutcome], k: int) -> float:
    return evaluate.avg_at([o.rank for o in outcomes], k)


def flag_times(outcomes: Sequence[CaseOutcome]) -> dict[str, float | int]:
    """Median and max time to flag over the flagged cases, and how many were flagged."""
    times = [o.time_to_flag_s for o in outcomes if o.ranking is not None and o.time_to_flag_s is not None]
    return {
        "flagged": len(times),
        "cases": len(outcomes),
        "median_s": statistics.median(times) if times else float("nan"),
        "max_s": max(times) if times else float("nan"),
    }


def summarise(outcomes: Sequence[CaseOutcome]) -> dict[str, float | int]:
    return {"ac1": ac_at(outcomes, 1), "ac3": ac_at(outcomes, 3), "avg5": avg_at(outcomes, 5), **flag_times(outcomes)}
