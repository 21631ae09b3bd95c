"""Grafana dashboards as code: ``build.py`` generates the committed ``*.json`` files.

Regenerate with ``uv run python -m dashboards.build``; CI runs it with ``--check``. Grafana
(compose stack) provisions every ``*.json`` in this folder; ``queries.py`` extracts each panel's
PromQL so tests can parse it with promtool and run it against a live Prometheus.
"""
