"""nginx keepalive tuner core (issue 4): measure, choose and safely apply ``keepalive_timeout``.

Library only; the sweep benchmark and the alert-driven action build on it.

- :mod:`config_edit`: one-line, atomic, backed-up edits of a directive found with crossplane;
- :mod:`nginx_ctl`: ``NginxControl``: ``nginx -t``, reload that waits for old workers to
  exit, and ``apply()`` = edit -> test -> reload -> health check, rolling back on failure;
- :mod:`memory`: PSS (USS fallback) summed over master and workers;
- :mod:`pareto`: t intervals, Pareto front, normalised choice rule, keep-current check,
  early stopping;
- :mod:`trial`: interleaved trial plan and a bounded Locust run in a child process
  (``locustfile.py`` is only ever imported by that child: locust patches the stdlib);
- :mod:`metrics`: ``promreflex_nginx_tuner_*``.

Seed: a paper that swept 5..100 s on one run per value and applied the smallest raw sum of
ms and KiB; its correlations (~0) show the differences were noise, hence repeats,
interleaving and a significance check here.
"""
