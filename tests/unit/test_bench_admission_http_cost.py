"""bench/admission/http_cost.py: every arm serves or fetches real answers and reports a cost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.admission.http_cost import ARMS, main


def test_every_arm_measures_real_requests(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--requests", "64", "--rounds", "1", "--out", str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    summary = (tmp_path / "new" / "summary.md").read_text()
    assert "Command: `uv run --frozen python -m bench.admission.http_cost --requests 64" in summary
    assert summary.endswith(out[out.index("| arm |"):])
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9.]+) us \(", out, re.M))
    assert set(rows) == set(ARMS)
    assert all(float(v) > 0 for v in rows.values())


def test_bad_arguments_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        main(["--requests", "3"])
    assert e.value.code == 2
