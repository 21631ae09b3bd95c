"""bench.admission.handler_cost: the proxy's own code per request, in a child process per tree."""

from __future__ import annotations

from pathlib import Path

from bench.admission.arms import proxy_config
from bench.admission.handler_cost import main, measure


def test_measure_runs_the_proxy_of_a_tree_on_both_paths() -> None:
    section = proxy_config(0, 1, 0, 0.1, session_scheduler=True)["admission"]
    got = measure(Path(__file__).resolve().parents[2], section, requests=200, repeat=1)
    assert set(got) == {"static", "page"}
    assert 0 < got["static"] < got["page"]  # the session page does more than an exempt path


def test_main_prints_the_best_of_each_tree(capsys) -> None:
    root = Path(__file__).resolve().parents[2]
    assert main(["--after", str(root), "--rounds", "1", "--requests", "100", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "round 1 after: static" in out and "(the page adds" in out
