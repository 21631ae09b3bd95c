"""The live bench's case grammar, its two-faults reading and the gap between cases."""

from __future__ import annotations

import pytest

from bench.rca.__main__ import faults_table
from bench.rca.cases import EDGE_DELAY_S, CaseResult, CaseRunner, Spec, parse_case


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
