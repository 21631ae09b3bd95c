"""nginx keepalive tuner core (issue 4): measure, choose and safely apply ``keepalive_timeout``.

Entry points: ``promreflex tune-nginx`` / ``exporter-nginx-memory`` (:mod:`cli`), the
``retune-nginx`` controller action (:mod:`action`), ``python -m bench.nginx_tuner``.

- :mod:`config_edit`: one-line, atomic, backed-up edits of a directive found with crossplane;
- :mod:`nginx_ctl`: ``NginxControl``: ``nginx -t``, reload that waits for old workers to
  exit, and ``apply()`` = edit -> test -> reload -> health check, rolling back on failure;
- :mod:`memory`: PSS (USS fallback) summed over master and workers;
- :mod:`pareto`: t intervals, Pareto front, normalised choice rule, keep-current check,
  early stopping;
- :mod:`trial`: interleaved trial plan and a bounded Locust run in a child process
  (``locustfile.py`` is only ever imported by that child: locust patches the stdlib);
- :mod:`metrics`: ``promreflex_nginx_tuner_*``;
- :mod:`sweep`: the sweep engine (interleaved trials, rollback on rising errors, early
  stopping and its replay, the choice, CSV/JSON/PNG results) and the active ``LoadMeasurer``;
- :mod:`passive`: ``PassiveMeasurer``, a dwell under live traffic read back from Prometheus;
- :mod:`action`: ``retune-nginx`` (one tuning at a time, window, passive by default);
- :mod:`cli`: ``tune-nginx`` and the nginx memory exporter.

Seed: a paper that swept 5..100 s on one run per value and applied the smallest raw sum of
ms and KiB; its correlations (~0) show the differences were noise, hence repeats,
interleaving and a significance check here.
"""
