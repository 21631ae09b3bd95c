"""Possessive quantifiers and atomic groups that work on every Python 3.11.

The log parsers bound their backtracking with possessive quantifiers (``X*+``, ``X++``, ``X?+``,
``X{m,n}+``) and atomic groups (``(?>X)``), new in Python 3.11. Before 3.11.5 CPython matched
some of them wrongly (gh-100061, fixed by gh-108004; a reviewer found other rarer cases still
wrong in 3.11.7, none of them in the patterns built here): on Debian 12's own Python, 3.11.2, which
``requires-python`` accepts and uv picks when it is the only one, the access-log exporter
rejected every line of the promreflex log format as ``no_match`` (a stranger's review), and the
Envoy format reader split fields wrongly.

:func:`compile` compiles a pattern as written where the interpreter is right, and otherwise
rewrites each possessive or atomic construct into the classic emulation, a look-ahead that
captures and a back-reference to the capture: ``(?>X)`` becomes ``(?:(?=(?P<_atomicN>X))(?P=_atomicN))``
(the look-ahead finds the match ``X`` prefers and is never backtracked into; the reference then
consumes exactly that text). The same matches, the same named groups (more of them: the
``_atomicN`` ones, which nothing reads), slower (3-20x on long hostile lines, still linear). ``PROMREFLEX_RE_EMULATE=1`` forces the rewrite
(the tests run the parsers so on a fixed Python too: tests/unit/test_recompat.py). Patterns built
from others read the text they were written as with :func:`source`.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import weakref

#: The interpreter matches possessive quantifiers and atomic groups correctly.
NATIVE_OK = sys.version_info >= (3, 11, 5)
_names = itertools.count()
_QUANT_BRACES = re.compile(r"\{(\d*)(,\d*)?\}")


def emulate() -> bool:
    """Whether :func:`compile` rewrites (an old interpreter, or forced by the environment)."""
    return not NATIVE_OK or os.environ.get("PROMREFLEX_RE_EMULATE", "") == "1"


#: The pattern as written, of each pattern compiled emulated (:func:`source`).
_SOURCES: weakref.WeakKeyDictionary[re.Pattern[str], str] = weakref.WeakKeyDictionary()


def compile(pattern: str, flags: int = 0) -> re.Pattern[str]:  # noqa: A001 - re.compile's name, on purpose
    """``re.compile(pattern, flags)``, with :func:`rewrite` where the interpreter needs it."""
    if not emulate():
        return re.compile(pattern, flags)
    rx = re.compile(rewrite(pattern), flags)
    _SOURCES[rx] = pattern
    return rx


def source(rx: re.Pattern[str]) -> str:
    """The pattern ``rx`` was compiled from by :func:`compile`, as written (``rx.pattern`` holds
    the rewrite where it was emulated): for building other patterns from it."""
    return _SOURCES.get(rx, rx.pattern)


def groupdict(m: re.Match[str]) -> dict[str, str | None]:
    """``m.groupdict()`` without the emulation's own groups."""
    return {k: v for k, v in m.groupdict().items() if not k.startswith(PREFIX)}


PREFIX = "_atomic"


def _atomic(body: str) -> str:
    name = f"{PREFIX}{next(_names)}"
    return f"(?:(?=(?P<{name}>{body}))(?P={name}))"


def _escape_end(p: str, i: int) -> int:
    """The end of the escape starting at ``p[i] == '\\\\'``."""
    c = p[i + 1] if i + 1 < len(p) else ""
    if c == "x":
        return i + 4
    if c == "u":
        return i + 6
    if c == "U":
        return i + 10
    if c == "N" and i + 2 < len(p) and p[i + 2] == "{":
        return p.index("}", i) + 1
    if c.isdigit():  # a back-reference (up to 2 digits) or an octal escape (up to 3)
        j = i + 1
        while j < len(p) and j < i + 4 and p[j].isdigit():
            j += 1
        return j
    return i + 2


def _class_end(p: str, i: int) -> int:
    """The end of the character class starting at ``p[i] == '['``."""
    j = i + 1
    if j < len(p) and p[j] == "^":
        j += 1
    if j < len(p) and p[j] == "]":  # a leading ] is literal
        j += 1
    while j < len(p):
        if p[j] == "\\":
            j = _escape_end(p, j)
        elif p[j] == "]":
            return j + 1
        else:
            j += 1
    raise re.error("unterminated character set", p, i)


def _group_end(p: str, i: int) -> int:
    """The end of the group starting at ``p[i] == '('`` (its closing parenthesis + 1); a
    comment ``(?#...)`` ends at its first ``)``, whatever it holds."""
    if p.startswith("(?#", i):
        return p.index(")", i) + 1
    depth, j = 0, i
    while j < len(p):
        c = p[j]
        if c == "\\":
            j = _escape_end(p, j)
            continue
        if c == "[":
            j = _class_end(p, j)
            continue
        if c == "(" and p.startswith("(?#", j):
            j = p.index(")", j) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise re.error("missing ), unterminated subpattern", p, i)


def _quantifier_end(p: str, i: int) -> int:
    """The end of the quantifier at ``p[i]`` (``i`` when there is none)."""
    if i >= len(p):
        return i
    if p[i] in "*+?":
        return i + 1
    if p[i] == "{":
        m = _QUANT_BRACES.match(p, i)
        if m and (m.group(1) or m.group(2)):
            return m.end()
    return i


def rewrite(p: str) -> str:
    """``p`` with every possessive quantifier and atomic group emulated (see the module doc)."""
    out: list[str] = []
    i = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            end = _escape_end(p, i)
            atom = p[i:end]
        elif c == "[":
            end = _class_end(p, i)
            atom = p[i:end]
        elif c == "(":
            end = _group_end(p, i)
            inner = p[i + 1:end - 1]
            if inner.startswith("?>"):
                atom = _atomic(rewrite(inner[2:]))
            elif inner.startswith("?P<"):
                close = inner.index(">")
                atom = "(" + inner[:close + 1] + rewrite(inner[close + 1:]) + ")"
            elif inner.startswith(("?P=", "?#")) or re.match(r"\?[aiLmsux-]+\)?$", inner):
                atom = p[i:end]  # a back-reference, a comment, flags: no pattern inside
            elif inner.startswith(("?:", "?=", "?!", "?<=", "?<!")):
                head = 3 if inner.startswith(("?<=", "?<!")) else 2
                atom = "(" + inner[:head] + rewrite(inner[head:]) + ")"
            elif inner.startswith("?("):  # a conditional (?(name)yes|no): its parts
                cond_end = inner.index(")") + 1
                atom = "(" + inner[:cond_end] + rewrite(inner[cond_end:]) + ")"
            elif inner.startswith("?"):  # scoped flags (?i:...)
                colon = inner.index(":")
                atom = "(" + inner[:colon + 1] + rewrite(inner[colon + 1:]) + ")"
            else:
                atom = "(" + rewrite(inner) + ")"
        else:  # one character (``|``, ``^`` and ``$`` are never followed by a quantifier)
            end = i + 1
            atom = c
        q_end = _quantifier_end(p, end)
        if q_end > end and q_end < len(p) and p[q_end] == "+":  # possessive
            out.append(_atomic(atom + p[end:q_end]))
            i = q_end + 1
        elif q_end > end and q_end < len(p) and p[q_end] == "?":  # lazy
            out.append(atom + p[end:q_end + 1])
            i = q_end + 1
        else:
            out.append(atom + p[end:q_end])
            i = q_end
    return "".join(out)
