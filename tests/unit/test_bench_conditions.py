"""bench/conditions.py: the conditions the benches print beside their figures (psutil)."""

from __future__ import annotations

import os
import time

from bench.conditions import HostSampler, describe


def burn(cpu_seconds: float) -> None:
    """Use this much CPU time (process time, not wall time: the machine may be busy)."""
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass


def test_group_cpu_counts_only_what_was_used_while_sampling() -> None:
    burn(0.4)  # before the sampler starts: must not be counted
    s = HostSampler(interval=0.05, groups={"me": lambda: [os.getpid()]}).start()
    burn(0.3)
    summary = s.stop()
    me = summary["groups"]["me"]
    assert 0.25 <= me["cpu_seconds"] < 0.4 + 0.25
    assert me["processes"] == 1
    assert summary["cores"] == os.cpu_count()
    assert summary["cpu_busy_pct"] is not None and 0 <= summary["cpu_busy_pct"] <= 100
    assert summary["load1_max"] >= summary["load1_start"] >= 0


def test_a_pid_source_that_fails_samples_nothing() -> None:
    def gone() -> list[int]:
        raise RuntimeError("stack is down")

    s = HostSampler(interval=0.05, groups={"gone": gone, "none": lambda: [2**22 + 12345]}).start()
    summary = s.stop()
    assert summary["groups"]["gone"]["cpu_seconds"] == 0 and summary["groups"]["none"]["processes"] == 0
    text = describe(summary)
    assert text.startswith(f"{os.cpu_count()} cores, CPU busy ") and "CPU used by gone 0.00 cores" in text
