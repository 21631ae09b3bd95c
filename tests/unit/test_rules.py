"""The rule files as a whole: every alert is complete and links to a real runbook section, every
rules file has its promtool test beside it, and promtool passes them (checks and tests).

The per-rule behaviour is in rules/tests/*.test.yml (promtool); this file checks what promtool
does not: that a `runbook_url` is an address a person can open and that it names a section that
exists in docs/runbook.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from promreflex.config import REPO_ROOT

RULES = REPO_ROOT / "rules"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
#: Where every alert's runbook_url points: docs/runbook.md as a page on the project's repository.
RUNBOOK_URL = "https://github.com/promreflex/promreflex/blob/main/docs/runbook.md"
RULE_FILES = sorted(RULES.glob("*.yml"))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_anchors(text: str) -> set[str]:
    return {github_anchor(m.group(1)) for m in re.finditer(r"(?m)^#{1,6}\s+(.+?)\s*#*\s*$", text)}


def alerts(path: Path) -> list[dict[str, Any]]:
    groups = (yaml.safe_load(path.read_text()) or {}).get("groups", [])
    return [rule for group in groups for rule in group.get("rules", []) if "alert" in rule]


def test_github_anchor_matches_githubs_rules() -> None:
    assert github_anchor("CopyGuardSiteOverloaded") == "copyguardsiteoverloaded"
    assert github_anchor("Copy guard: operating copies") == "copy-guard-operating-copies"
    assert github_anchor("nginx keepalive tuner: operating it") == "nginx-keepalive-tuner-operating-it"


def test_there_are_rule_files() -> None:
    assert len(RULE_FILES) >= 5


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_is_complete_and_links_to_a_runbook_section(path: Path) -> None:
    anchors = runbook_anchors(RUNBOOK.read_text())
    for rule in alerts(path):
        where = f"{path.name}: {rule['alert']}"
        assert rule.get("labels", {}).get("severity"), f"{where} has no severity"
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), where
        url = annotations.get("runbook_url", "")
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_URL, f"{where}: runbook_url {url!r} is not {RUNBOOK_URL}#<section>"
        assert anchor in anchors, f"{where}: docs/runbook.md has no section #{anchor}"


def test_the_check_catches_a_repository_path_and_a_missing_section(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rules.yml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "A", "expr": "vector(1)", "labels": {"severity": "info"},
         "annotations": {"summary": "s", "description": "d", "runbook_url": "docs/runbook.md#watchdog"}},
    ]}]}))
    with pytest.raises(AssertionError, match="is not https://"):
        test_every_alert_is_complete_and_links_to_a_runbook_section(bad)
    bad.write_text(bad.read_text().replace("docs/runbook.md#watchdog", RUNBOOK_URL + "#no-such-section"))
    with pytest.raises(AssertionError, match="no section #no-such-section"):
        test_every_alert_is_complete_and_links_to_a_runbook_section(bad)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_rules_file_has_a_promtool_test(path: Path) -> None:
    concern = path.name.removesuffix(".rules.yml")
    tests = sorted((RULES / "tests").glob(f"{concern}*.test.yml"))
    tests = [t for t in tests if re.fullmatch(rf"{re.escape(concern)}(-\d+m?s)?\.test\.yml", t.name)]
    assert tests, f"rules/tests/{concern}.test.yml is missing"
    for test in tests:
        assert f"../{path.name}" in yaml.safe_load(test.read_text())["rule_files"], test.name

