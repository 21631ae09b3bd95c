"""Alertmanager-style label matchers: ``name="value"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``.

Regular expressions are fully anchored, as in Alertmanager. A label that is absent matches as
the empty string, also as in Alertmanager.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.regex is not None
        hit = self.regex.fullmatch(actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value)}"


def parse_matcher(text: str) -> Matcher:
    """Parse one matcher; raises ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"a matcher is a string like alertname=\"X\", not {type(text).__name__}")
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a matcher (name=\"value\", name!=, name=~, name!~)")
    name, op, raw = m.groups()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{text!r}: bad quoted value: {e.msg}") from e
    elif '"' in raw:
        raise ValueError(f"{text!r}: unbalanced quotes")
    else:
        value = raw
    regex = None
    if op in ("=~", "!~"):
        try:
            regex = re.compile(value)
        except re.error as e:
            raise ValueError(f"{text!r}: bad regular expression: {e}") from e
    return Matcher(name, op, value, regex)


def parse_matchers(text: str) -> list[Matcher]:
    """One list item as Alertmanager takes it: a matcher, several separated by commas, or the
    same in braces (``{alertname="X", site=~"a|b"}``); commas inside a quoted value are the
    value's. Raises ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"a matcher is a string like alertname=\"X\", not {type(text).__name__}")
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    parts: list[str] = []
    cur: list[str] = []
    quoted = escaped = False
    for ch in body:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    if len(parts) > 1 and not parts[-1].strip():
        parts.pop()  # a trailing comma, as Alertmanager allows
    if not any(p.strip() for p in parts):
        raise ValueError(f"{text!r} holds no matcher")
    return [parse_matcher(p) for p in parts]


def matches_all(matchers: list[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
