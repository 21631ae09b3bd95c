"""`promreflex rca offline` and `rca explain` through their argparse registration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from controllers.rca.cli import DEFAULT_REPORT, register
from promreflex.cli import main

CHAIN = Path(__file__).resolve().parent.parent / "fixtures" / "rca" / "chain"


def test_register_adds_rca_with_two_subcommands():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rca", "offline", "D", "--threshold", "500ms", "--json"])
    assert (args.path, args.threshold, args.json) == ("D", 0.5, True)
    args = parser.parse_args(["rca", "explain"])
    assert args.report == str(DEFAULT_REPORT) == ".promreflex/rca/latest.json"
    with pytest.raises(SystemExit):
        parser.parse_args(["rca", "offline", "D", "--threshold", "-1"])


def test_offline_prints_table_and_explanation(capsys):
    assert main(["rca", "offline", str(CHAIN)]) == 0
    out = capsys.readouterr().out
    first_row = out.splitlines()[1].split()
    assert first_row[:3] == ["1", "stock", "root_cause"]
    assert "-> root cause stock" in out


def test_offline_json_then_explain_the_saved_report(capsys, tmp_path):
    report = tmp_path / "rca" / "latest.json"
    assert main(["rca", "offline", str(CHAIN), "--json", "--save", str(report)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["root_causes"] == ["stock"] and printed["kind"] == "promreflex.rca.finding"
    assert main(["rca", "explain", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "so orders is a symptom (orders -> stock)" in out and "-> root cause stock" in out


def test_explain_without_or_with_a_bad_report(capsys, tmp_path):
    assert main(["rca", "explain", "--report", str(tmp_path / "none.json")]) == 1
    assert "no report at" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"status": "success"}')
    assert main(["rca", "explain", "--report", str(bad)]) == 2
    assert "is not an RCA report" in capsys.readouterr().err


def test_offline_on_a_folder_without_data_is_exit_2(capsys, tmp_path):
    assert main(["rca", "offline", str(tmp_path)]) == 2
    assert "expected one *_mpg.csv" in capsys.readouterr().err
