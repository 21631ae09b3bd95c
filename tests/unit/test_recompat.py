"""Possessive quantifiers and atomic groups emulated where the interpreter gets them wrong
(promreflex.recompat: Debian 12's Python 3.11.2, gh-100061)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from promreflex import recompat

REPO = Path(__file__).resolve().parents[2]

# (pattern as the parsers write it, an alphabet to try every string of, up to this length)
CASES = [
    (r"a*+a", "ab", 5),
    (r"(?:ab|a)*+b", "ab", 6),
    (r"(?>ab|a)c", "abc", 5),
    (r"[^ \n]*+(?= \[)|[^ \n]*+(?: (?!\[\d{2}/)[^ \n]*+)*+", "a [1/", 6),
    (r'(?: (?!u=)\w+=(?:"[^"]*"|[^\s,]*(?:(?:, | : )[^\s,]*)*+))*+ u="(?P<u>[^"]*)"', 'u=", :a', 7),
    (r"\d++x|\d{1,2}+y", "1xy", 5),
    (r"(?P<a>[a-b]?+)b(?P=a)", "ab", 5),
    (r"[*+?]{2,}+\+", "*+?", 5),
    (r"(?i:A)++\x41", "aA", 5),
    (r"(?#a(b)a*+b", "ab", 5),  # a comment ends at its first ')' (a review)
]


def test_rewrite_leaves_no_possessive_or_atomic_construct_and_keeps_classes_and_escapes() -> None:
    out = recompat.rewrite(r"[*+]\++(?>x)a{2}+b*c{,3}?")
    assert "(?>" not in out and not re.search(r"(?<![\\\[])[*+?}]\+", out.replace("[*+]", ""))
    assert out.startswith(r"[*+]") and r"\+" in out and "c{,3}?" in out


@pytest.mark.parametrize(("pattern", "alphabet", "longest"), CASES, ids=[c[0] for c in CASES])
def test_the_emulation_matches_what_the_interpreter_matches(pattern: str, alphabet: str, longest: int) -> None:
    """Every string of a small alphabet: the same match (span and named groups) as the pattern
    itself, on an interpreter that is right about it (this one, when NATIVE_OK)."""
    if not recompat.NATIVE_OK:  # (said in the run's summary; the parsers' tests run emulated here anyway)
        pytest.skip(f"Python {sys.version.split()[0]} matches possessive patterns wrongly: no reference here")
    native, emulated = re.compile(pattern), re.compile(recompat.rewrite(pattern))
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            line = "".join(chars)
            want, got = native.match(line), emulated.match(line)
            assert (want and (want.span(), want.groupdict())) == (got and (got.span(), recompat.groupdict(got))), line


def test_compile_keeps_the_source_for_patterns_built_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMREFLEX_RE_EMULATE", "1")
    rx = recompat.compile(r"a*+(?P<b>b)")
    assert recompat.source(rx) == r"a*+(?P<b>b)" and "*+" not in rx.pattern
    assert recompat.groupdict(rx.match("aab")) == {"b": "b"}  # type: ignore[arg-type]
    monkeypatch.delenv("PROMREFLEX_RE_EMULATE")
    # as written where the interpreter is right; emulated on an older 3.11
    assert (recompat.compile(r"a*+b").pattern == r"a*+b") is recompat.NATIVE_OK


def test_the_log_parsers_read_every_fixture_with_the_emulation() -> None:
    """The parsers' own tests with the rewrite forced: what Debian 12's Python 3.11.2 runs (there
    the access-log exporter had rejected every line of the promreflex format as no_match)."""
    env = {**os.environ, "PROMREFLEX_RE_EMULATE": "1"}
    run = subprocess.run(  # noqa: S603 - our own test modules
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_accesslog_parse.py",
         "tests/unit/test_mesh_format.py", "tests/unit/test_copy_guard_calibrate_replay.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
