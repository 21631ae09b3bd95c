"""Every panel query of every committed dashboard runs against the live stack's Prometheus
without error and returns data, with Grafana's variables as Grafana would send them for the
provisioned data source (``$__rate_interval``: 4 x its 1 s scrape interval, dashboards/queries.py).
Stat panels show a value even on a stack without their capability: 0 where 0 is meant, never
"No data"."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.queries import panels_without_data

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
# Dashboards whose series need more than the default stack; the named test runs their panel
# queries on a stack that has it.
OWN_STACK = {
    "copy_guard.json": "test_copy_guard_loop.py",  # a copy-guard route, a threshold, a running copy
    "mesh.json": "test_rca_mesh.py",  # the mesh exporter
    "nginx_tuner.json": "test_nginx_tuner_e2e.py",  # a retune route and the nginx memory exporter
    "swift.json": "../integration/test_swift_lab_prometheus.py",  # the Swift lab and the capture exporter
    "admission.json": "../integration/test_admission_loop.py",  # the admission proxy in front of an app
}
ALL = sorted((HERE.parents[1] / "dashboards").glob("*.json"))
DASHBOARDS = [p for p in ALL if p.name not in OWN_STACK]


def test_there_are_dashboards():
    assert DASHBOARDS


@pytest.mark.parametrize("name, test_file", sorted(OWN_STACK.items()))
def test_dashboards_on_their_own_stack_are_checked_there(name, test_file):
    text = (HERE / test_file).read_text()
    assert name in text and "panels_without_data" in text, f"{test_file} must run every panel query of {name}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_query_returns_data(live_stack, path):
    empty = panels_without_data(path, live_stack.query, timeout=30)
    assert not empty, "panels with no data:\n" + "\n".join(empty)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_stat_panels_show_a_value_without_their_capability(live_stack, path):
    """The default stack has no copy guard, tuner or mesh: their counts and states are 0 there."""
    empty = panels_without_data(path, live_stack.query, timeout=10, panel_types=frozenset({"stat"}))
    assert not empty, 'stat panels showing "No data" where 0 is meant:\n' + "\n".join(empty)
