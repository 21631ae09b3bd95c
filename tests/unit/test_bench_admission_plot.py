"""The admission bench's figures render from a summary (and the proxy's sampled state)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.admission import plot
from bench.admission.arms import ARMS
from bench.admission.counting import parse_events, rt_timeline

PNG = b"\x89PNG"


def _row(arm: str, clients: int, multiple: float, rate: float) -> dict:
    return {"arm": arm, "clients": clients, "multiple": multiple, "completed_per_s": rate,
            "failed_by_group": {"1": 1, "2-4": 2, "5": 3, "6-7": 0},
            "rt_timeline": [{"t": float(t), "ok": 5, "p50_s": 0.1 * t if t % 3 else None, "timeouts": 0} for t in range(10)]}


def test_every_figure_is_written(tmp_path: Path) -> None:
    base = [_row(a, n, m, 10.0 / m) for a in ARMS for n, m in ((10, 1.0), (40, 4.0))]
    summary = {"scale": 0.1, "points": {"base": base, "think1": base[:2]},
               "conditions": {"base": {"paper_think_s": 3, "paper_timeout_s": 60, "timeout_s": 6.0},
                              "think1": {"paper_think_s": 1, "paper_timeout_s": 60, "timeout_s": 6.0}},
               "window": {"warmup_s": 2.0, "seconds": 5.0}, "calibration": {"n_sat": 10}}
    raw = tmp_path / "raw"
    raw.mkdir()
    state = [{"t": 100.0 + i, "state": {"pages": {"search": {"limit": 2 + i % 2, "queue": i}, "other": {"limit": 4, "queue": 0}},
                                        "sessions": {"interval_seconds": 0.01 * (i + 1), "queue": 3}}} for i in range(5)]
    (raw / "state-base-full-40.json").write_text(json.dumps(state))
    (raw / "state-base-page-40.json").write_text(json.dumps(state))
    written = plot.write(tmp_path, summary)
    assert written == ["sessions.png", "failures.png", "responses.png", "scheduler.png"]
    for name in written:
        assert (tmp_path / name).read_bytes()[:4] == PNG


def test_without_the_proxy_state_there_is_no_scheduler_figure(tmp_path: Path) -> None:
    summary = {"scale": 0.1, "points": {"base": [_row("none", 10, 1.0, 5.0)]},
               "conditions": {"base": {"paper_think_s": 3, "paper_timeout_s": 60, "timeout_s": 6.0}},
               "window": {"warmup_s": 2.0, "seconds": 5.0}}
    assert "scheduler.png" not in plot.write(tmp_path, summary)


def test_response_time_timeline_bins_answers_and_counts_timeouts() -> None:
    def req(t0: float, t1: float, r: str) -> str:
        return json.dumps({"k": "req", "u": 1, "s": 1, "n": 1, "t0": t0, "t1": t1, "st": 200, "r": r})

    ev = parse_events([req(0.0, 0.5, "ok"), req(0.2, 0.9, "ok"), req(0.0, 1.5, "ok"), req(0.0, 1.6, "timeout"),
                       req(0.0, 9.0, "ok")])
    tl = rt_timeline(ev, 0.0, 3.0)
    assert [p["ok"] for p in tl] == [2, 1, 0]
    assert tl[0]["p50_s"] == 0.5 and tl[1]["p50_s"] == 1.5 and tl[2]["p50_s"] is None
    assert [p["timeouts"] for p in tl] == [0, 1, 0]
