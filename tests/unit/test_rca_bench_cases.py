"""The live bench's case grammar, its two-faults reading, the gap between cases and the lines' calibration."""

from __future__ import annotations

import pytest

from bench.rca.__main__ import faults_table
from bench.rca.cases import (
    EDGE_DELAY_S, CaseResult, CaseRunner, Spec, calibration_slices, line_for, next_case_fits, parse_case, slice_max_query,
    typical_max, warmup_for,
)


def test_case_grammar():
    assert parse_case("user:cpu") == Spec("cpu", ("user",), faults=(("user", "cpu"),))
    assert parse_case(" carts-db:disk+shipping:cpu ") == Spec(
        "two", ("carts-db", "shipping"), faults=(("carts-db", "disk"), ("shipping", "cpu")))
    assert parse_case("orders->shipping") == Spec("edge", ("shipping",), edges=(("orders", "shipping", EDGE_DELAY_S),))
    for bad in ("user", "user:fire", "->x", "a:cpu+b"):
        with pytest.raises(ValueError):
            parse_case(bad)


def _two(ranking: list[str], flagged: bool = True) -> CaseResult:
    return CaseResult("a+b", "two", 0.0, truths=["a", "b"], flagged=flagged, ranking=ranking, time_to_flag_s=20.0)


def test_two_faults_count_for_ac1_with_either_cause_and_both_within_two_is_reported():
    both, one, late = _two(["b", "a", "x"]), _two(["a", "x", "b"]), _two(["x", "a", "b"])
    assert [r.outcome().rank for r in (both, one, late)] == [1, 1, 2]
    assert [r.all_within for r in (both, one, late)] == [2, 3, 3]
    assert _two(["a", "x"]).all_within is None and _two(["a", "b"], flagged=False).all_within is None
    cases = [{**r.__dict__, "rank": r.outcome().rank, "all_within": r.all_within} for r in (both, one, late)]
    table = faults_table({"cases": cases})
    assert "two faults at once: the first named is one of the causes in 2/3 (counted in AC@1); " \
           "both causes among the first two named in 1/3" in table


def test_the_gap_between_cases_keeps_the_previous_fault_out_of_the_next_baseline(tmp_path):
    shipped = CaseRunner(tmp_path, window="1m", for_="15s")
    # the fault shows for 60 s after it ends; the analysis runs >= 17 s into the next fault
    # and reads 12 + 60 s back: 60 + 72 - 17 + 3
    assert shipped.clean_gap_s() == 118
    assert CaseRunner(tmp_path, window="10s", for_="5s").clean_gap_s() == 78


def test_runs_in_chunks_combine_into_one_summary(tmp_path):
    import json

    from bench.rca.__main__ import combine

    def run(rate: float, cases: list[CaseResult]) -> dict:
        return {"command": f"python -m bench.rca --rate {rate:g}",
                "conditions": {"loadavg_start": [1.0], "loadavg_end": [2.0], "wall_s": 480.0},
                "faults": {"mode": "loop", "rate": rate, "window": "1m", "for": "15s", "lines_s": {},
                           "not_run": ["cpu on carts"] if rate == 6.0 else [],
                           "cases": [{**c.__dict__, "rank": c.outcome().rank, "all_within": c.all_within} for c in cases]}}

    hit = CaseResult("user", "cpu", 0.0, truths=["user"], label="cpu on user", flagged=True,
                     ranking=["user", "x"], root_causes=["user"], time_to_flag_s=19.0)
    miss = CaseResult("payment", "disk", 0.0, truths=["payment"], label="disk on payment", flagged=False)
    paths = []
    for i, (rate, cases) in enumerate([(3.0, [_two(["b", "a"])]), (6.0, [hit, miss])]):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(run(rate, cases)))
    js, md = combine(paths, tmp_path / "out")
    summary = json.loads(js.read_text())
    assert summary["summary"]["ac1"] == pytest.approx(2 / 3) and summary["summary"]["flagged"] == 2
    assert [(c["run"], c["rate"], c["rank"]) for c in summary["cases"]] == [(0, 3.0, 1), (1, 6.0, 1), (1, 6.0, None)]
    text = md.read_text()
    assert "| 2 | 6 | disk on payment | - | not flagged | - |  |" in text
    assert "- run 2: `python -m bench.rca --rate 6`" in text and (tmp_path / "out" / "cases.png").is_file()
    # hit and miss are one-fault cases, but at 6 orders/s: not the load the analysis was designed at
    assert "designed on (one fault, 3 orders/s)" not in text
    assert "not designed on (two faults, slow edges, other loads): 3 cases, AC@1 0.67" in text
    assert summary["split"]["not_designed_on"]["cases"] == 3
    assert "; not run (time budget): cpu on carts" in text and summary["runs"][1]["not_run"] == ["cpu on carts"]
    assert "not run" not in text.split("- run 1:")[1].split("\n")[0]


def test_one_stall_in_the_warm_up_does_not_set_a_line():
    """Issue 12, "memory on front-end" never flagged: one slow minute of the warm-up set
    front-end's line to 1 s. The line is twice the median of disjoint windows' maxima, so one
    window's stall (or the load's start) leaves it where the typical maximum puts it."""
    assert line_for(typical_max([0.1, 0.1, 0.12])) == 0.25
    assert line_for(typical_max([1.0, 0.1, 0.12])) == 0.25  # the load's start, or one stall
    assert line_for(typical_max([0.4, 0.4, 1.0])) == 1.0  # a service slow all the time keeps its headroom
    assert typical_max([0.04, 0.06]) == pytest.approx(0.05)
    nan = float("nan")  # a window in which the service received nothing
    assert typical_max([nan, 0.04, nan]) == 0.04 and typical_max([nan]) is None and line_for(None) == 0.05


def test_the_calibration_reads_windows_of_the_rules_length_from_the_histogram():
    """The alert compares a window's maximum with the line, so the warm-up is read as windows
    of the rules' length (three of them), from the raw histogram, not from the rules' sliding
    max_1m series (whose samples each hold a stall for a whole window)."""
    assert warmup_for(60) == 180 and warmup_for(10) == 60
    assert calibration_slices(180, 60) == [0, 60, 120] and calibration_slices(60, 10) == [0, 10, 20, 30, 40, 50]
    assert calibration_slices(40, 60) == [0]
    q0, q60 = slice_max_query(0, 60), slice_max_query(60, 60)
    for q in (q0, q60):
        assert "max_1m" not in q and "promreflex_mesh_request_duration_seconds_bucket[60s]" in q
        assert q.startswith("histogram_quantile(1, sum by (service, le) (")
    assert "offset" not in q0 and "[60s] offset 60s)" in q60
    assert "[10s] offset 20s)" in slice_max_query(20, 10)


def test_a_case_starts_only_when_it_is_expected_to_end_within_the_budget():
    """A chunk under the shared lock keeps to its slot: the next case is taken to last as long
    as the longest so far (a guess before the first)."""
    assert next_case_fits(300, [], 900, guess_s=150)
    assert not next_case_fits(800, [], 900, guess_s=150)
    assert next_case_fits(700, [140, 150], 900, guess_s=999)
    assert not next_case_fits(700, [140, 210], 900, guess_s=0)


def test_designed_on_cases_are_one_fault_at_the_designed_load():
    from bench.rca.__main__ import designed_on

    assert designed_on({"kind": "cpu", "rate": 3.0}) and designed_on({"kind": "disk"})
    assert not designed_on({"kind": "cpu", "rate": 6.0})
    assert not designed_on({"kind": "two", "rate": 3.0}) and not designed_on({"kind": "edge", "rate": 3.0})
