"""Every panel query of every committed dashboard runs against the live stack's Prometheus
without error and returns data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.queries import panel_queries
from promreflex.proc import Timeout, wait_until

pytestmark = pytest.mark.e2e

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "dashboards").glob("*.json"))


def test_there_are_dashboards():
    assert DASHBOARDS


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_query_returns_data(live_stack, path):
    empty = []
    for title, expr in panel_queries(path):
        try:
            # Recorded series appear after the first rule evaluations; give them time.
            wait_until(lambda: live_stack.query(expr), timeout=30, interval=0.5, what=f"data for {title!r}")
        except Timeout:
            empty.append(f"{title}: {expr}")
    assert not empty, "panels with no data:\n" + "\n".join(empty)
