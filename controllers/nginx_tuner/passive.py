"""Passive measurement for production: hold a candidate under live traffic, read Prometheus.

No synthetic load. After ``apply`` made a candidate live (and its old workers are gone), the
measurer waits ``settle`` (so the window starts after the reload, and the recording of the
previous candidate's requests has been scraped away), then holds the candidate for ``dwell``
and reads, over exactly that window (``[dwell]`` ranges evaluated at its end):

- mean response time: ``increase(_sum) / increase(_count)`` of the access-log exporter's
  ``promreflex_http_request_duration_seconds{site=...}``;
- p95: ``histogram_quantile(0.95, ...)`` of the same histogram's buckets (so only as fine as
  its buckets: a coarse estimate between bucket bounds, which is why the choice uses the mean);
- requests and errors: the same ``_count`` and ``promreflex_http_requests_total{status_class="5xx"}``;
- memory: the average over the window of ``memory_query`` (default: the tuner's own
  ``promreflex_nginx_memory_bytes``, PSS summed over master and workers, published by
  ``promreflex exporter-nginx-memory``; any process-exporter expression works too).

Errors rising during the dwell: every ``check_interval`` the 5xx ratio since the dwell began
is read; above ``max_error_ratio`` (with at least ``min_requests`` requests) the dwell ends at
once with ``aborted`` set, and the sweep restores the last good value.

Too little traffic (fewer than ``min_requests`` requests in the dwell) is a failed
measurement (``LoadError``), never a silently noisy point.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controllers.nginx_tuner.sweep import Measurement
import aiohttp

from controllers.nginx_tuner.trial import LoadError
from promreflex.clients import APIError, PrometheusClient

#: What a query to Prometheus can raise: it answered with an error, it is unreachable or
#: restarting, it timed out, or a proxy before it answered with something that is not its JSON.
QUERY_ERRORS = (APIError, aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError)

DEFAULT_MEMORY_QUERY = "sum(promreflex_nginx_memory_bytes)"


def _label_value(text: str) -> str:
    """A PromQL string literal for a label value (the site name is data, never syntax)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass
class PassiveMeasurer:
    prometheus: PrometheusClient
    site: str = "shop"
    dwell_s: float = 300.0
    settle_s: float = 15.0
    memory_query: str = DEFAULT_MEMORY_QUERY
    max_error_ratio: float = 0.01
    min_requests: int = 20
    check_interval: float = 5.0
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
    clock: Callable[[], float] = time.time

    def queries(self, window_s: float) -> dict[str, str]:
        sel = f"site={_label_value(self.site)}"
        w = f"{max(1, math.ceil(window_s))}s"
        h = "promreflex_http_request_duration_seconds"
        return {
            "requests": f"sum(increase({h}_count{{{sel}}}[{w}]))",
            "mean": f"sum(increase({h}_sum{{{sel}}}[{w}])) / sum(increase({h}_count{{{sel}}}[{w}]))",
            "p95": f"histogram_quantile(0.95, sum by (le) (increase({h}_bucket{{{sel}}}[{w}])))",
            "errors": f'sum(increase(promreflex_http_requests_total{{{sel}, status_class="5xx"}}[{w}])) or vector(0)',
            "memory": f"avg_over_time(({self.memory_query})[{w}:1s])",
        }

    async def _value(self, expr: str, at: float | None = None) -> float | None:
        res = await self.prometheus.query(expr, time=at)
        if not res:
            return None
        v = float(res[0]["value"][1])
        return v if math.isfinite(v) else None

    async def preflight(self) -> None:
        """Before the sweep changes anything: Prometheus answers, and the series a trial reads
        have data now (the site's requests over the last dwell, the memory query). Raises
        :class:`LoadError` saying which: a wrong ``site``, a Prometheus that is not there, would
        otherwise be found only after a first trial held production on a candidate for a dwell."""
        q = self.queries(self.dwell_s)
        try:
            reqs = await self._value(q["requests"])
            mem = await self._value(q["memory"])
        except QUERY_ERRORS as e:
            raise LoadError(f"Prometheus query failed: {type(e).__name__}: {e}") from e
        if reqs is None:
            raise LoadError(f"no requests of site {self.site!r} in Prometheus over the last {self.dwell_s:.0f}s "
                            f"(promreflex_http_request_duration_seconds_count{{site={_label_value(self.site)}}}): check --passive.site")
        if mem is None:
            raise LoadError(f"no memory series from {self.memory_query!r} over the last {self.dwell_s:.0f}s")

    async def __call__(self, value: float) -> Measurement:
        await self.sleep(self.settle_s)
        start = self.clock()
        end = start + self.dwell_s
        aborted = ""
        while True:
            now = self.clock()
            if now >= end:
                break
            await self.sleep(min(self.check_interval, end - now))
            elapsed = self.clock() - start
            if elapsed < self.check_interval:
                continue
            q = self.queries(elapsed)
            try:
                reqs = await self._value(q["requests"]) or 0.0
                errs = await self._value(q["errors"]) or 0.0
            except QUERY_ERRORS:  # a check missed; the dwell goes on, the final read decides
                continue
            if reqs >= self.min_requests and errs / reqs > self.max_error_ratio:
                aborted = f"5xx ratio {errs / reqs:.2%} > {self.max_error_ratio:.2%} after {elapsed:.0f}s of the dwell"
                break
        window = max(1.0, self.clock() - start)
        at = start + window
        q = self.queries(window)
        try:
            reqs = await self._value(q["requests"], at) or 0.0
            errs = await self._value(q["errors"], at) or 0.0
            mean = await self._value(q["mean"], at)
            p95 = await self._value(q["p95"], at)
            mem = await self._value(q["memory"], at)
        except QUERY_ERRORS as e:
            raise LoadError(f"Prometheus query failed: {type(e).__name__}: {e}") from e
        if aborted:
            return Measurement(mean or math.nan, p95 or math.nan, mem or math.nan, "prometheus", round(reqs), round(errs), aborted=aborted)
        if reqs < self.min_requests or mean is None:
            raise LoadError(f"only {reqs:.0f} requests for site {self.site!r} in the {window:.0f}s dwell (need {self.min_requests})")
        if mem is None:
            raise LoadError(f"no memory series from {self.memory_query!r} in the dwell")
        return Measurement(mean, p95 if p95 is not None else math.nan, mem, "prometheus", round(reqs), round(errs))
