"""The keepalive tuner's own metrics (``promreflex_nginx_tuner_*``).

The ``value`` label is a candidate ``keepalive_timeout`` from the sweep grid (20 values in
the paper's 5..100 s grid); anything outside the grid is refused, so the label set stays
bounded whatever a caller passes. Per-value trial gauges hold the *latest* trial of that
value; the sweep's statistics (repeats, intervals) live in ``pareto``, not in Prometheus.
``trials_total{result}`` (ok; errors: the trial's failures rose and the last good value was
restored; load_failed; apply_failed: nginx -t/reload/health failed and was rolled back) and
``state{state}`` are created for every label value up front so ``increase()`` and ``== 1``
alerts work from the start.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

STATES = ("idle", "sweeping", "applying", "rolled_back")
TRIAL_RESULTS = ("ok", "errors", "load_failed", "apply_failed")


def value_label(value: int | float | str) -> str:
    """Canonical label text of a candidate: ``75``, ``75.0`` and ``"75"`` are all ``"75"``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(int(number)) if number.is_integer() else repr(number)


class TunerMetrics:
    """Metrics holder; pass a fresh ``CollectorRegistry()`` in tests."""

    def __init__(self, candidates: Sequence[int | float | str], registry: CollectorRegistry = REGISTRY):
        self.candidates = tuple(value_label(c) for c in candidates)
        self.trials = Counter(
            "promreflex_nginx_tuner_trials_total", "Sweep trials run, by outcome.", ["result"], registry=registry
        )
        self.trial_response_time = Gauge(
            "promreflex_nginx_tuner_trial_response_time_seconds",
            "Response time seen by the load generator in the latest trial of a candidate value.",
            ["value", "stat"], registry=registry,
        )
        self.trial_memory = Gauge(
            "promreflex_nginx_tuner_trial_memory_bytes",
            "nginx memory (PSS summed over master and workers) in the latest trial of a candidate value.",
            ["value"], registry=registry,
        )
        self.applied = Gauge(
            "promreflex_nginx_tuner_applied_keepalive_timeout_seconds",
            "keepalive_timeout currently applied by the tuner.", registry=registry,
        )
        self.state = Gauge(
            "promreflex_nginx_tuner_state", "Tuner state: 1 for the current one.", ["state"], registry=registry
        )
        for result in TRIAL_RESULTS:
            self.trials.labels(result)
        self.set_state("idle")

    def _checked(self, value: int | float | str) -> str:
        label = value_label(value)
        if label not in self.candidates:
            raise ValueError(f"value {value!r} is not in the candidate grid {self.candidates}")
        return label

    def set_state(self, state: str) -> None:
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {STATES}")
        for s in STATES:
            self.state.labels(s).set(1 if s == state else 0)

    def set_applied(self, seconds: float) -> None:
        self.applied.set(seconds)

    def record_trial(
        self,
        value: int | float | str,
        result: str,
        mean_s: float | None = None,
        p95_s: float | None = None,
        memory_bytes: int | None = None,
    ) -> None:
        """Count one trial and, when it produced numbers, publish them under its value."""
        if result not in TRIAL_RESULTS:
            raise ValueError(f"unknown trial result {result!r}; expected one of {TRIAL_RESULTS}")
        label = self._checked(value)
        self.trials.labels(result).inc()
        if mean_s is not None:
            self.trial_response_time.labels(label, "mean").set(mean_s)
        if p95_s is not None:
            self.trial_response_time.labels(label, "p95").set(p95_s)
        if memory_bytes is not None:
            self.trial_memory.labels(label).set(memory_bytes)
