"""``promreflex calibrate``: measure what the healthy shop serves at saturation, under the
user's own requests, and publish the copy guard's threshold where the rules read it.

What is sent (the load profile is yours):

- ``--request "METHOD PATH [WEIGHT [BODY]]"`` (repeat): e.g. ``--request "GET /product/{id} 9"
  --request "POST /checkout 1 cart=1&qty=1"``; ``{id}`` is a random integer below
  ``--product-count``. Paths are taken under the path of ``--target``
  (``--target http://shop:8080/store/`` + ``GET /cart`` requests ``/store/cart``). The BODY is
  the rest of the line after the weight, exactly as given (quotes, spaces and backslashes
  kept); one that is a JSON object or array is sent as ``application/json``
  (``--request 'POST /api/cart 1 {"sku": "A1", "qty": 2}'``), any other as
  ``application/x-www-form-urlencoded``.
- ``--replay ACCESS_LOG``: the GET/HEAD requests your visitors made (answered 2xx/3xx), weighted
  by how often they were made (the ``--replay-top`` most frequent). Their paths are sent as the
  log has them (an absolute URI ``GET http://host/p`` as ``/p``; nginx's ``\\x22`` and Apache's
  ``\\"`` escapes undone), site-absolute: NOT under the path of ``--target`` (a log line ``GET /store/p1``
  with ``--target http://shop:8080/store/`` requests ``/store/p1``), and a ``{id}`` in them is
  no placeholder. Left out: our own traffic
  (``/stub_status``, ``/metrics`` and the paths under them, not ``/metrics-dashboard``;
  Prometheus and the nginx exporter's user agents by their product token, not ``PrometheusFanBot``;
  a previous calibration's ``promreflex-calibrate``; found whatever fields follow the user agent).
  POST bodies are not in an access log: add them with ``--request``. A line longer than 64 KiB is
  skipped (counted); a gzip-compressed log is refused (decompress it first). Formats read: nginx's
  and Apache's combined-like lines (``"METHOD /path HTTP/x" STATUS ...``, with or without the
  referer and user agent, any fields after them: the promreflex format, nginx_combined,
  nginx_timed, apache_combined, apache_common, apache_vhost_combined, by the access-log exporter's
  own patterns) and JSON lines (``log_format ... escape=json``) with a ``request`` (or
  ``request_method`` and ``request_uri``) and a ``status`` field; any other with
  ``--replay-log-format 'LOG_FORMAT'``, the nginx ``log_format`` string it is written with
  (compiled by the exporter's parser, exporters/accesslog/parse.py).
- ``--profile FILE`` (YAML or JSON): ``requests: [{method, path, weight, body}]`` and
  ``vars: {post: [12, 15, 31], word: [shoe, bag]}``: ``{post}`` in a path or body is a random
  element of its list, ``{uniq}`` a unique string (a comment that is not a duplicate). Paths are
  under the path of ``--target``, as with ``--request``. A text body is sent as with
  ``--request``; a mapping or list as JSON; ``!!binary`` as its bytes
  (``application/octet-stream``).
- None of these: ``GET`` of the ``--target`` URL itself, its path and query as given
  (``--target http://shop/page.html`` requests ``/page.html``).
Only the ratios of the weights matter; weights whose sum overflows are refused.
Redirects are not followed: a 302 counts as served, as in the access log.

How hard (start light, ramp; defaults that do not time a PHP shop out): unless ``--users`` is
given, a ramp of short steps (``--step-duration``, default 10 s) at 1, 2, 4, ... users, each
user sending its next request as soon as the previous one returned, up to ``--max-users``. It
stops at the knee: when doubling the users added less than 10% served (the site is saturated:
more users would only queue; if they served less than the step before, the site collapsed past
its knee and the step before is used; such a step is measured twice first, the better counting,
as one step slowed by other work on a shared host would end the ramp too early), when any request failed or timed out (``--request-timeout``,
default 10 s), or when the 95th percentile of response times passed a third of that timeout.
The runs then use the users of the knee; a ramp that reached ``--max-users`` still growing says
so (the threshold is then what those users get, not the shop's capacity). ``--rate R`` paces the users to R requests per second
in total instead (the paper: 100 req/s).

The threshold (``--method``):

- ``robust`` (default): the MEDIAN OVER THE RUNS of each run's 5th percentile of per-second
  served RPS (after each run's ``--warmup`` and its partial last second). The paper took the
  lowest second of all runs: one slow second (a busy shared host) dragged its threshold to 4 req/s
  and a stalled run to 0. A run's p5 ignores its worst seconds; the median over runs ignores a
  bad run. Its spread is printed with it: the range of the per-run p5s and their median
  absolute deviation (MAD); above 20% of the threshold a warning says the runs disagree.
- ``min``: the lowest per-second served RPS of all runs (the paper's rule).
- ``quantile --quantile Q``: the Q-quantile of every second of every run together.

A run is discarded, with a message saying why, when more than ``--max-failed`` (default 1%) of
its requests failed (timeouts, 499s, 5xx: the site was pushed past healthy saturation), when
it stalled (a second after the warm-up with nothing served), when Locust did not finish, or
when it served nothing. Fewer than ``--min-runs`` valid runs (default: more than half): nothing
is published, exit 1.

Refused, nothing published (exit 1): a threshold the idle shop or our own traffic could cross.
The demand floor published with it (a site serving less than its threshold is overloaded only
while visitors ask for at least the floor; under it the shop keeps up with them and copies are
never paused) is ``--floor-ratio`` (1.0: the threshold itself) of the threshold but never below ``--min-floor``
(default 2 req/s: the stub_status requests of two nginx exporters scraped every second, should
a Prometheus count them); a threshold below twice that floor is refused. With a Prometheus
(the stack's, or ``--prometheus.url``), the shop's demand during the minute before the load and
the nginx exporters' own request rate are measured first, and a floor at or below either is
refused too (the rules take each exporter's own requests off for the Prometheus that scrapes
it; a second Prometheus scraping the same exporter adds its own, which only this check keeps
out. The stack scrapes its nginx exporter every 200 ms: 5 req/s, so it refuses floors of 5
req/s and less). The demand is read over what that Prometheus' rates cover: the rules' windows
follow the scrape interval (1 s and 3 s at the stack's 200 ms, 1 m at 15 s, 2 m at 30 s), read
from it with their evaluation interval. A shop busy already is refused BEFORE any load when its
demand reaches a floor known then (``--demand-floor``, or the floor of the threshold published
for the site), else after the ramp (or the first run with ``--users``) when it reaches the floor
of what the shop served there. A previous calibration's load (ended, interrupted, or killed
with SIGKILL: while it loads, calibrate touches its record every second) is left out: calibrate
waits until it has left the rates (their window and an evaluation) and reads the time after
that only (15 s at the stack, about 1.5 min at a 15 s scrape); another calibration loading the
same shop at the same time is refused.

The healthy response time is published too (``promreflex_copy_guard_response_time_seconds``): the
median over the valid runs of each run's 95th percentile. The rules divide the requests nginx has
in flight by it (Little's law): the rate at which the visitors now waiting would ask if each of
them waited no longer than a healthy shop's slow request, the demand of visitors who wait instead
of arriving (closed-loop overload, a stall). Not the mean: requests in flight cannot tell a closed
loop (N users always waiting) from an open one served more slowly, and with the mean a
moderately busy shop whose copy made its pages 1.4 times slower was "overloaded" (bench smoke run
on WordPress, issue 16); the 95th percentile leaves that slack, and a backlog that grows (the
shop is truly not keeping up) still crosses it within a second or two. Even so the alerts count
it only in a stall (nothing completes): with the 95th percentile, pages twice as slow still read
as overload on WordPress at half its capacity (second bench); the throttle of an open episode
counts it always (rules/copy-guard.rules.yml, "Two demand figures").

Every run and the threshold are printed as a table; ``--out FILE`` keeps them as JSON.
``calibrate`` cleans up after itself: its Locust child is in a process group of its own, killed
on SIGINT, SIGTERM, SIGHUP and SIGQUIT, and it dies with the calibration (PR_SET_PDEATHSIG) if
that is SIGKILLed.

Published with :func:`controllers.copy_guard.threshold.write_threshold` as
``promreflex_copy_guard_rps_threshold{site}`` and ``promreflex_copy_guard_demand_floor_rps{site}``
in ``<textfile dir>/promreflex_copy_guard_threshold.prom`` (node_exporter's textfile collector;
the stack's by default).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

from promreflex import fsutil
from promreflex.config import parse_duration
from promreflex.proc import die_with_parent

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DEFAULT_QUERY = 'site:promreflex_http_requests_served:rate1s{{site="{site}"}}'
#: The lowest demand floor: two nginx exporters scraped every second make 2 req/s of stub_status
#: requests; a floor at or below that could be opened by our own traffic alone.
MIN_FLOOR_RPS = 2.0
FLOOR_RATIO = 1.0
SPREAD_WARN = 0.2
#: A new threshold this far from the one published before it is worth a word: the same shop's
#: thresholds came out 39.5 and 28 req/s (-29%) two hours apart on a shared two-core host, with
#: other work on its cores during the second (issue 16's bench).
DRIFT_WARN = 0.25
#: Our own requests, never replayed: paths and user agents (the locustfile's is promreflex-calibrate).
OWN_PATHS = ("/stub_status", "/metrics", "/-/", "/nginx_status")
OWN_AGENTS = ("Prometheus", "NGINX-Prometheus-Exporter", "nginx-prometheus-exporter", "promreflex", "Blackbox")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class CalibrationError(Exception):
    """The load could not be run, or produced nothing a threshold can be trusted from."""


# ---------------------------------------------------------------------------- statistics
def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (type 7, like numpy's default) of ``values``; q in [0, 1]."""
    if not values:
        raise ValueError("no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    n: int
    min: float
    p5: float
    median: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            raise ValueError("no values")
        return cls(len(values), min(values), quantile(values, 0.05), quantile(values, 0.5), max(values),
                   sum(values) / len(values))


def per_second_series(per_second: Mapping[int, int], warmup_s: float = 0.0) -> list[float]:
    """Served responses in each whole second from the first completion + ``warmup_s`` up to,
    not including, the last second seen (partial: the run stopped inside it). Seconds with no
    completion inside that span count as 0 (a stalled site serves nothing)."""
    if not per_second:
        return []
    first, last = min(per_second), max(per_second)
    start = first + math.ceil(warmup_s)
    return [float(per_second.get(s, 0)) for s in range(start, last)]


@dataclass(frozen=True)
class Spread:
    """How far the runs agree: the range and the median absolute deviation of the per-run
    statistic the threshold is the median of (robust), or of every second (min, quantile)."""

    low: float
    high: float
    mad: float
    over: str  # "runs" or "seconds"

    def relative(self, threshold: float) -> float:
        return (self.high - self.low) / 2 / threshold if threshold > 0 else math.inf


def derive_threshold(runs: Sequence[Sequence[float]], method: str = "robust", q: float = 0.05) -> float:
    """The threshold from every run's per-second served RPS (see the module doc): ``robust``
    (median of the runs' ``q``-quantiles), ``min`` (the paper) or ``quantile`` (pooled)."""
    values = [v for run in runs for v in run]
    if not values:
        raise CalibrationError("no per-second values to derive a threshold from")
    if method == "robust":
        return quantile([quantile(r, q) for r in runs if r], 0.5)
    if method == "min":
        return min(values)
    if method == "quantile":
        return quantile(values, q)
    raise ValueError(f"unknown method {method!r} (robust, min or quantile)")


def spread_of(runs: Sequence[Sequence[float]], method: str = "robust", q: float = 0.05) -> Spread:
    if method == "robust":
        stats = [quantile(r, q) for r in runs if r]
        over = "runs"
    else:
        stats = [v for r in runs for v in r]
        over = "seconds"
    if not stats:
        raise CalibrationError("no values")
    med = quantile(stats, 0.5)
    return Spread(min(stats), max(stats), quantile([abs(s - med) for s in stats], 0.5), over)


def saturation_warning(offered_rps: float, dist: Distribution) -> str | None:
    """A warning when the site kept up with a paced load (then the threshold measures the
    load, not the site's capacity)."""
    if offered_rps > 0 and dist.median >= 0.95 * offered_rps:
        return (f"the site served {dist.median:.1f} req/s of the {offered_rps:.0f} offered (median): it kept up, "
                "so this measures the load, not the site's capacity; raise --rate, or leave it out (closed loop)")
    return None


def floor_for(threshold: float, ratio: float = FLOOR_RATIO, min_floor: float = MIN_FLOOR_RPS,
              explicit: float | None = None) -> float:
    """The demand floor published with ``threshold``: ``explicit``, or ``ratio`` of it, never
    below ``min_floor`` (ValueError for an explicit floor below it)."""
    if explicit is not None:
        if explicit < min_floor:
            raise ValueError(f"--demand-floor {explicit:g} is below the lowest sane floor {min_floor:g} req/s "
                             "(our own traffic could reach it; lower --min-floor only if you know why)")
        return explicit
    return max(ratio * threshold, min_floor)


#: What the shop's demand before the load is, by default (the local stack's short rates): ``span``.
SPAN = "its busiest second in the minute before the load"


def _busy(idle_demand: float, floor: float, span: str, what: str = "the floor") -> str:
    return (f"the shop's demand peaked at {idle_demand:.2f} req/s ({span}), at or above "
            f"{what} {floor:.2f} req/s: at that traffic (bots, probes, or visitors) its copies would be paused")


def refusal(threshold: float, floor: float, min_floor: float = MIN_FLOOR_RPS, idle_demand: float | None = None,
            own_rps: float | None = None, span: str = SPAN) -> str | None:
    """Why ``threshold`` (with ``floor``) must not be published, or None. ``span``: what the
    idle demand is (:class:`Baseline`)."""
    if not math.isfinite(threshold) or threshold <= 0:
        return f"the threshold is {threshold:g} req/s: the shop served nothing in some second of every run"
    if threshold < 2 * min_floor:
        return (f"the threshold {threshold:.2f} req/s is below twice the lowest demand floor ({2 * min_floor:g} req/s): "
                "an idle shop's own traffic (exporter scrapes, probes, bots) is of that order, the guard could not tell "
                "a quiet shop from a suffering one")
    if idle_demand is not None and floor <= idle_demand:
        # A floor above the idle demand needs a threshold of at least twice it (the check above).
        if threshold >= 2 * idle_demand:
            fix = "raise --min-floor above it"
        elif idle_demand >= threshold:
            fix = (f"that is at or above the threshold {threshold:.2f} req/s itself: the shop was as busy before the "
                   "load as the load measured it at saturation; calibrate when the shop is quieter")
        else:
            fix = "that is more than half the threshold: calibrate when the shop is quieter"
        return f"{_busy(idle_demand, floor, span)}; {fix}"
    if own_rps is not None and floor <= own_rps:
        return (f"the nginx exporters' own stub_status requests make {own_rps:.2f} req/s, at or above the floor "
                f"{floor:.2f} req/s; raise --min-floor above it")
    return None


def refusal_before_load(idle_demand: float | None, *, span: str = SPAN,
                        explicit_floor: float | None = None, published: tuple[float, str] | None = None,
                        floor_ratio: float = FLOOR_RATIO, min_floor: float = MIN_FLOOR_RPS,
                        own_rps: float | None = None) -> str | None:
    """Why the shop must not be loaded at all (None: load it): the floors that can be known
    before the load, ``explicit_floor`` (``--demand-floor``) and the one of the threshold
    ``published`` for the site ((req/s, where)), are at or below the shop's ``idle_demand``
    (a shop busy already: at that traffic its copies would be paused whatever the load measures,
    and its visitors take part of what the load would measure), or an explicit floor at or below
    the exporters' own requests. The floor of the threshold this load would measure is checked
    after the ramp (:func:`estimate_refusal`) and at the end (:func:`refusal`)."""
    if explicit_floor is not None:
        if idle_demand is not None and explicit_floor <= idle_demand:
            return f"{_busy(idle_demand, explicit_floor, span, 'the --demand-floor')}; calibrate when the shop is quieter"
        if own_rps is not None and explicit_floor <= own_rps:
            return (f"the nginx exporters' own stub_status requests make {own_rps:.2f} req/s, at or above the "
                    f"--demand-floor {explicit_floor:.2f} req/s; give a higher one")
        return None
    if idle_demand is None or published is None or idle_demand < min_floor:
        return None
    rps, where = published
    floor = floor_for(rps, floor_ratio, min_floor)
    if floor > idle_demand:
        return None
    return (f"{_busy(idle_demand, floor, span)} (the floor of the threshold published for the site, {rps:.2f} req/s "
            f"{where}); the shop is busy already: its visitors would take part of what the load measures. Calibrate when the "
            "shop is quieter (if that threshold is wrong, e.g. measured while the host was busy, and the shop serves "
            "far more: remove it first, or give --demand-floor)")


def estimate_refusal(estimate: float, idle_demand: float | None, *, how: str, span: str = SPAN,
                     floor_ratio: float = FLOOR_RATIO, min_floor: float = MIN_FLOOR_RPS,
                     explicit_floor: float | None = None) -> str | None:
    """Why to stop before the runs: even ``estimate`` (what the shop served so far, ``how``;
    above the threshold the runs will give, their 5th percentile) gives a floor at or below the
    shop's ``idle_demand``, so the runs would be refused at their end (:func:`refusal`)."""
    if idle_demand is None or not math.isfinite(estimate):
        return None
    floor = floor_for(estimate, floor_ratio, min_floor, explicit_floor)
    if floor > idle_demand:
        return None
    return (f"{_busy(idle_demand, floor, span)} (the floor of the {estimate:.2f} req/s the shop served {how}, more "
            "than the threshold the runs would measure); the shop is busy already: calibrate when it is quieter")


# ---------------------------------------------------------------------------- profile
@dataclass(frozen=True)
class Request:
    """One request of the load. ``path`` is under the path of ``--target`` (``--request``,
    ``--profile``) unless ``site_absolute``: then it is sent as it is, without placeholders
    (a path replayed from the access log, as the shop saw it; the ``--target`` URL itself).
    ``body``: text (``{NAME}`` placeholders filled; sent as JSON when it is a JSON object or
    array, else form-urlencoded), or bytes (sent as they are)."""

    method: str
    path: str
    weight: float = 1.0
    body: str | bytes | None = None
    site_absolute: bool = False


_FORM = "application/x-www-form-urlencoded"


def content_type(body: str | bytes) -> str:
    """The Content-Type a body is sent with: bytes as they are, a JSON object or array as JSON,
    any other text form-urlencoded."""
    if isinstance(body, bytes):
        return "application/octet-stream"
    if body.lstrip()[:1] in ("{", "["):
        try:
            json.loads(body)
        except ValueError:
            return _FORM
        return "application/json"
    return _FORM


def _checked(text: str, method: str, path: str, weight: str | None, body: str | bytes | None) -> Request:
    if method.upper() not in METHODS or not path.startswith("/"):
        raise ValueError(f"{text!r} is not \"METHOD /PATH [WEIGHT [BODY]]\" (METHOD one of {', '.join(METHODS)})")
    try:
        w = float(weight) if weight is not None else 1.0
    except ValueError:
        raise ValueError(f"{text!r}: the weight {weight!r} is not a number") from None
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"{text!r}: the weight must be > 0")
    return Request(method.upper(), path, w, body)


def parse_request(text: str) -> Request:
    """``"GET /product/{id} 9"``, ``"POST /checkout 1 cart=1&qty=1"``, ``"/about"`` (GET, weight 1).
    The body is the rest of the text after the weight, exactly as given (spaces, quotes and
    backslashes kept: ``POST /api/cart 1 {"sku": "A1"}``)."""
    first = text.split(None, 1)
    if first and first[0].upper() not in METHODS and first[0].startswith("/"):
        parts = ["GET", *text.split(None, 2)]
    else:
        parts = text.split(None, 3)
    if len(parts) < 2:
        raise ValueError(f"{text!r} is not \"METHOD /PATH [WEIGHT [BODY]]\" (METHOD one of {', '.join(METHODS)})")
    return _checked(text, parts[0], parts[1], parts[2] if len(parts) > 2 else None, parts[3] if len(parts) > 3 else None)


_LOG_REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<path>/\S*|[A-Za-z][\w+.-]*://\S*) HTTP/[0-9.]+" (?P<status>\d{3}) ')
#: A ``$request`` value: ``METHOD TARGET [HTTP/x]`` (HTTP/0.9 has no version).
_REQUEST_LINE = re.compile(r"(?P<method>[A-Z]+) (?P<path>/\S*|[A-Za-z][\w+.-]*://\S*)(?: HTTP/[0-9.]+)?")
_ABSOLUTE_URI = re.compile(r"[A-Za-z][\w+.-]*://[^/?#\s]*")
#: nginx's ``\xHH``, ``escape=json``'s ``\u00HH`` (a control character), Apache's and JSON's ``\"``, ``\\``.
_LOG_ESCAPE = re.compile(rb'\\x([0-9A-Fa-f]{2})|\\u00([0-9A-Fa-f]{2})|\\(["\\])')
#: Kept as they are when a replayed path is re-encoded: printable ASCII but the space, " and \.
_URL_SAFE = "".join(chr(c) for c in range(33, 127) if chr(c) not in '"\\')
_AGENT_TOKEN = re.compile(r"[A-Za-z][\w.-]*")
#: In a field that is not known to be the user agent, only a token where a user agent's product
#: starts counts (the field's start, after a space, "(" or ";"): not ``?utm=prometheus`` in a referer.
_AGENT_START_TOKEN = re.compile(r"(?:^|(?<=[\s(;]))[A-Za-z][\w.-]*")
_QUOTED_FIELD = re.compile(r'"((?:[^"\\]|\\.)*)"')


def log_path(target: str, escaped: bool = True) -> str:
    """The path to send for a request line's target: an absolute URI (``http://host/p?q``) as
    its path and query; with ``escaped`` (text as a log line has it) nginx's ``\\xHH``, JSON's
    ``\\u00HH`` and Apache's ``\\"`` escapes undone; the bytes percent-encoded when they are not
    printable ASCII (a JSON log's values are decoded already: ``escaped=False``)."""
    m = _ABSOLUTE_URI.match(target)
    if m:
        target = target[m.end():]
        target = target if target.startswith("/") else "/" + target
    if all(c in _URL_SAFE for c in target):
        return target
    raw = target.encode("utf-8", "surrogateescape")
    if escaped:
        raw = _LOG_ESCAPE.sub(lambda e: bytes([int(e.group(1) or e.group(2), 16)]) if e.group(3) is None
                              else e.group(3), raw)
    return urllib.parse.quote(raw, safe=_URL_SAFE)


def own_agent(agent: str, anywhere: bool = True) -> bool:
    """A user agent with a product token of OWN_AGENTS (``Prometheus/2.45``, ``promreflex-calibrate``;
    not ``PrometheusFanBot``). ``anywhere=False`` for a field that may not be the user agent:
    only tokens where a product starts count."""
    own = [a.lower() for a in OWN_AGENTS]
    for token in (_AGENT_TOKEN if anywhere else _AGENT_START_TOKEN).findall(agent):
        t = token.lower()
        if any(t == a or t.startswith(a + "-") for a in own):
            return True
    return False


def own_traffic(path: str, agent: str) -> bool:
    """Our own requests (never replayed): a path of OWN_PATHS or under it (``/metrics``,
    ``/metrics/x``, ``/metrics?x``, not ``/metrics-dashboard``), or a user agent with a product
    token of OWN_AGENTS (:func:`own_agent`)."""
    bare = path.split("?", 1)[0]
    for p in OWN_PATHS:
        p = p.rstrip("/")
        if bare == p or bare.startswith(p + "/"):
            return True
    return own_agent(agent)


#: What ``--replay`` reads; said when a log gives nothing.
REPLAY_FORMATS = (
    "--replay reads nginx's and Apache's combined-like lines (\"METHOD /path HTTP/x\" STATUS ..., with or without "
    "the referer and user agent, and any fields after them: the promreflex format of README step 1, nginx's "
    "combined, Apache's combined, common and vhost_combined) and JSON lines (log_format escape=json) with a "
    "\"request\" (or \"request_method\" and \"request_uri\") and a \"status\" field; for another format give its "
    "nginx log_format string with --replay-log-format '...' (as in nginx.conf), or replay the promreflex log of "
    "README step 1 (stack.nginx.access_log)")


@dataclass(frozen=True)
class LogEntry:
    """What ``--replay`` reads of one access-log line. ``agent`` None: the line has no field
    known to be the user agent; ``fields`` are then its other text fields, searched for our
    own agents (:func:`own_agent`, ``anywhere=False``)."""

    method: str
    path: str  # as it is sent (escapes undone, absolute URI as its path)
    status: int
    agent: str | None
    fields: tuple[str, ...] = ()

    @property
    def own(self) -> bool:
        if own_traffic(self.path, self.agent or ""):
            return True
        return self.agent is None and any(own_agent(f, anywhere=False) for f in self.fields)


_JSON_AGENT_KEYS = ("http_user_agent", "user_agent", "useragent", "agent", "ua")
_JSON_REQUEST_KEYS = ("request", "request_method", "method", "request_uri", "uri", "document_uri", "path")


def _entry(values: Mapping[str, Any], escaped: bool, agent_keys: Sequence[str] = ("http_user_agent",),
           fields: Sequence[str] = ()) -> LogEntry | None:
    """A :class:`LogEntry` from a line's named values (the variables of a log_format, or a JSON
    object's keys), or None when they hold no request and status."""
    request = values.get("request")
    if isinstance(request, str):
        m = _REQUEST_LINE.fullmatch(request)
        if not m:
            return None
        method, target = m.group("method"), m.group("path")
    else:
        method = values.get("request_method") or values.get("method")
        target = next((v for k in ("request_uri", "uri", "document_uri", "path")
                       if isinstance(v := values.get(k), str) and v), None)
        if not isinstance(method, str) or not re.fullmatch(r"[A-Z]+", method) or target is None:
            return None
        if not (target.startswith("/") or _ABSOLUTE_URI.match(target)):
            return None
    status = str(values.get("status", ""))
    if len(status) != 3 or not status.isdigit():
        return None
    agent = next((v for k in agent_keys if isinstance(v := values.get(k), str)), None)
    return LogEntry(method, log_path(target, escaped), int(status), agent, tuple(fields) if agent is None else ())


def _json_entry(line: str) -> LogEntry | None:
    """A JSON line (nginx ``log_format ... escape=json``): keys matched whatever their case and
    ``-``/``_``; the user agent under one of _JSON_AGENT_KEYS."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    values = {str(k).lower().replace("-", "_"): v for k, v in doc.items()}
    others = [v for k, v in values.items() if isinstance(v, str) and k not in _JSON_REQUEST_KEYS]
    return _entry(values, False, _JSON_AGENT_KEYS, others)


def _log_format_text(text: str) -> str:
    """A log_format as given: its string, or pasted from nginx.conf (``escape=json '{...' '...}'``,
    the quoted pieces joined as nginx joins them)."""
    text = re.sub(r"^\s*escape=\w+\s+", "", text.strip())
    pieces = re.findall(r"'([^']*)'", text)
    return "".join(pieces) if pieces and text.startswith("'") else text


def replay_parser(log_format: str | None = None) -> Callable[[str], LogEntry | None]:
    """The line reader of ``--replay``: with ``log_format`` (nginx's ``log_format`` string) that
    format, compiled by the access-log exporter's own parser (exporters/accesslog/parse.py);
    without, every format of :data:`REPLAY_FORMATS`: the exporter's Apache-combined pattern (a
    combined line whose referer and user agent may be absent, any fields after them: nginx's
    combined and the promreflex format too) and its vhost_combined, JSON lines, and at last any
    line holding a quoted ``"METHOD /path HTTP/x" STATUS`` (its user agent then unknown: every
    quoted field after it is searched for ours). CalibrationError for a log_format that cannot
    be compiled or has no request and status."""
    from exporters.accesslog.parse import (
        LogFormatError,
        apache_combined_pattern,
        apache_vhost_pattern,
        compile_log_format,
    )
    from promreflex import recompat

    if log_format is not None:
        fmt = _log_format_text(log_format)
        try:
            regex, names = compile_log_format(fmt)
        except LogFormatError as e:
            raise CalibrationError(f"--replay-log-format {fmt!r}: {e}") from None
        has_target = "request" in names or ("request_method" in names
                                            and bool({"request_uri", "uri", "document_uri"} & set(names)))
        if "status" not in names or not has_target:
            raise CalibrationError(f"--replay-log-format {fmt!r} needs $status and $request (or $request_method and "
                                   "$request_uri): what was asked, and how it was answered")
        agent_keys = ("http_user_agent",) if "http_user_agent" in names else ()


        def custom(line: str) -> LogEntry | None:
            m = regex.match(line.rstrip("\r\n"))
            if m is None:
                return None
            values = recompat.groupdict(m)
            others = [] if agent_keys else [v for k, v in values.items() if v and k not in _JSON_REQUEST_KEYS]
            return _entry(values, True, agent_keys, others)

        return custom

    patterns = (apache_combined_pattern(), apache_vhost_pattern())

    def auto(line: str) -> LogEntry | None:
        text = line.rstrip("\r\n")
        if text.lstrip().startswith("{"):
            entry = _json_entry(text)
            if entry is not None:
                return entry
        for pattern in patterns:
            m = pattern.match(text)
            if m is not None:
                entry = _entry(recompat.groupdict(m), True)
                if entry is not None:
                    return entry
        m = _LOG_REQUEST.search(text)
        if m is None:
            return None
        rest = text[m.end():]
        return LogEntry(m.group("method"), log_path(m.group("path")), int(m.group("status")), None,
                        tuple(_QUOTED_FIELD.findall(rest)))

    return auto


def replay_profile(lines: Sequence[str] | Any, top: int = 500,
                   log_format: str | None = None) -> tuple[list[Request], dict[str, int]]:
    """The GET/HEAD requests an access log's visitors made (2xx/3xx), weighted by count, the
    ``top`` most frequent; and what was left out, by reason (:func:`replay_parser` reads the
    lines)."""
    parse = replay_parser(log_format)
    counts: Counter[tuple[str, str]] = Counter()
    skipped: Counter[str] = Counter()
    for line in lines:
        entry = parse(line)
        if entry is None:
            skipped["not a request line"] += 1
        elif entry.own:
            skipped["our own traffic"] += 1
        elif entry.method not in ("GET", "HEAD"):
            skipped[f"{entry.method} (no body in the log)"] += 1
        elif not 200 <= entry.status < 400:
            skipped[f"status {entry.status // 100}xx"] += 1
        else:
            counts[(entry.method, entry.path)] += 1
    return [Request(m, p, float(n)) for (m, p), n in counts.most_common(top)], dict(skipped)


def profile_json(requests: Sequence[Request], base_path: str,
                 variables: Mapping[str, Sequence[Any]] | None = None) -> dict[str, Any]:
    """The locustfile's ``--profile-file`` (its module doc): ``base_path`` goes in front of every
    path but the ``site_absolute`` ones; a body has its ``content_type``, bytes in base64."""
    out = []
    for r in requests:
        doc: dict[str, Any] = {"method": r.method, "path": r.path, "weight": r.weight, "body": r.body,
                               "site_absolute": r.site_absolute}
        if r.body is not None:
            doc["content_type"] = content_type(r.body)
            if isinstance(r.body, bytes):
                doc["body"], doc["body_base64"] = base64.b64encode(r.body).decode("ascii"), True
        out.append(doc)
    return {"base_path": base_path.rstrip("/"), "requests": out,
            "vars": {k: [str(v) for v in vs] for k, vs in (variables or {}).items()}}


def read_profile(path: Path) -> tuple[list[Request], dict[str, list[str]]]:
    """A profile file (YAML or JSON): ``requests: [{method, path, weight, body}]`` and optional
    ``vars: {NAME: [values]}`` for ``{NAME}`` placeholders."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"--profile {path} is not UTF-8 text: {e}") from e
    except OSError as e:
        raise ValueError(f"cannot read --profile {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"--profile {path} is not YAML/JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list) or not data["requests"]:
        raise ValueError(f"--profile {path}: needs a non-empty `requests:` list")
    requests = []
    for i, r in enumerate(data["requests"]):
        if not isinstance(r, dict) or set(r) - {"method", "path", "weight", "body"}:
            raise ValueError(f"--profile {path}: requests[{i}] must be a mapping of method, path, weight, body")
        method, rpath, weight = str(r.get("method", "GET")), str(r.get("path", "")), str(r.get("weight", 1))
        try:
            requests.append(_checked(f"{method} {rpath} {weight}", method, rpath, weight, _profile_body(r.get("body"))))
        except ValueError as e:
            raise ValueError(f"--profile {path}: requests[{i}]: {e}") from None
    variables = data.get("vars") or {}
    if not isinstance(variables, dict) or not all(isinstance(v, list) and v for v in variables.values()):
        raise ValueError(f"--profile {path}: `vars:` maps names to non-empty lists")
    return requests, {str(k): [str(x) for x in v] for k, v in variables.items()}


def _profile_body(body: Any) -> str | bytes | None:
    """A profile's ``body``: text as it is, a mapping or list as JSON, ``!!binary`` as bytes."""
    if body is None or isinstance(body, (str, bytes)):
        return body
    if isinstance(body, (dict, list)):
        return json.dumps(body, default=str)
    if isinstance(body, (int, float)) and not isinstance(body, bool):
        return str(body)
    raise ValueError(f"the body {body!r} is not text, a mapping or list (sent as JSON) or !!binary (quote it)")


def builtin_shop(checkout_share: float = 0.1) -> list[Request]:
    """The built-in shop's profile (``bench/copy_guard/site.py``): product pages and checkouts."""
    return [Request("GET", "/product/{id}", 1.0 - checkout_share),
            Request("POST", "/checkout", checkout_share, "cart=1&qty=1")]


# ---------------------------------------------------------------------------- load
@dataclass
class LoadRun:
    """One finished Locust run: completions ``[ok, failed]`` per time bin (``bin_s`` seconds,
    keyed by ``int(unix time / bin_s)``)."""

    ok: int
    failed: int
    bins: dict[int, list[int]]
    bin_s: float
    started: float
    ended: float
    errors: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)

    def per_second(self, column: int = 0) -> dict[int, int]:
        """Completions per whole unix second (column 0: served, 1: failed)."""
        out: dict[int, int] = {}
        for b, v in self.bins.items():
            s = math.floor(b * self.bin_s + 1e-9)
            out[s] = out.get(s, 0) + v[column]
        return out

    def served(self) -> dict[int, int]:
        return self.per_second(0)

    @property
    def failed_share(self) -> float:
        return self.failed / (self.ok + self.failed) if self.ok + self.failed else 0.0


def split_target(target: str) -> tuple[str, str]:
    """``http://h:8080/store/`` -> (``http://h:8080``, ``/store/``)."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {target!r}")
    path = parts.path or "/"
    return f"{parts.scheme}://{parts.netloc}", path + (f"?{parts.query}" if parts.query else "")


def locust_argv(target: str, rate: float, users: int, duration_s: float, timeline: Path, *,
                checkout_share: float = 0.1, locustfile: Path = LOCUSTFILE, profile_file: Path | None = None,
                request_timeout: float = 10.0, product_count: int = 10000,
                schedule: Sequence[tuple[float, float]] | None = None, max_outstanding: int = 256) -> list[str]:
    """``rate`` 0: closed loop (each user goes again as soon as answered). ``schedule``: open
    loop instead, ``[(from_s, rate), ...]`` (``rate`` and ``users`` are then ignored; see the
    locustfile's ``--shop-schedule``)."""
    if schedule:
        if schedule[0][0] != 0 or any(r < 0 for _, r in schedule) or max_outstanding < 1:
            raise ValueError("a schedule starts at 0 s with rates >= 0, and max_outstanding >= 1")
        rate, users = 0.0, 1
    host, _ = split_target(target)
    if rate < 0 or users < 1 or duration_s <= 0:
        raise ValueError("rate must be >= 0, duration > 0 and users >= 1")
    if not 0.0 <= checkout_share <= 1.0:
        raise ValueError("checkout share must be within [0, 1]")
    argv = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless",
        "--host", host, "-u", str(users), "-r", str(users),
        "-t", f"{max(1, math.ceil(duration_s))}s", "--shop-rate", str(rate),
        "--checkout-share", str(checkout_share), "--timeline-out", str(timeline),
        "--request-timeout", str(request_timeout), "--parent-pid", str(os.getpid()),
        "--product-count", str(max(1, product_count)),
        "--skip-log", "--only-summary", "--exit-code-on-error", "0", "--stop-timeout", "0", "--loglevel", "ERROR",
    ]
    if profile_file is not None:
        argv += ["--profile-file", str(profile_file)]
    if schedule:
        argv += ["--shop-schedule", ",".join(f"{t:g}:{r:g}" for t, r in schedule), "--max-outstanding", str(max_outstanding)]
    return argv


#: Open loop: the schedule starts this long after Locust is started (it takes 1-3 s to come up).
OPEN_LOOP_LEAD_S = 4.0

#: Loads running now: a signal handler kills them (see :func:`cleanup_on_signals`).
_LIVE: set[ShopLoad] = set()
LOADS_STARTED = 0  # loads this process started (calibrate notes its last one: LAST_LOAD)


class ShopLoad:
    """A bounded Locust run in a child process (own process group); ``start`` then ``wait``.

    ``profile`` is the requests to send (default: the built-in shop's, with ``checkout_share``),
    under the path of ``target`` (but the ``site_absolute`` ones)."""

    def __init__(self, target: str, rate: float, users: int, duration_s: float, *, checkout_share: float = 0.1,
                 locustfile: Path = LOCUSTFILE, margin_s: float = 30.0, profile: Sequence[Request] | None = None,
                 request_timeout: float = 10.0, product_count: int = 10000,
                 variables: Mapping[str, Sequence[Any]] | None = None,
                 schedule: Sequence[tuple[float, float]] | None = None, max_outstanding: int = 256):
        self.duration_s = duration_s
        self.margin_s = margin_s + request_timeout
        self._dir = tempfile.mkdtemp(prefix="promreflex-calibrate-")
        self.timeline = Path(self._dir) / "timeline.json"
        profile_file = None
        if profile is not None:
            profile_file = Path(self._dir) / "profile.json"
            _, base = split_target(target)
            profile_file.write_text(json.dumps(profile_json(profile, base.split("?")[0], variables)))
        self.open_loop = bool(schedule)
        self.epoch = 0.0  # open loop: Unix time of the schedule's 0 s (set by start)
        run_s = duration_s + OPEN_LOOP_LEAD_S if schedule else duration_s
        self.argv = locust_argv(target, rate, users, run_s, self.timeline, checkout_share=checkout_share,
                                locustfile=locustfile, profile_file=profile_file, request_timeout=request_timeout,
                                product_count=product_count, schedule=schedule, max_outstanding=max_outstanding)
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> ShopLoad:
        global LOADS_STARTED
        LOADS_STARTED += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.started = time.time()
        if self.open_loop:  # the schedule's 0 s: late enough for Locust to be up (it takes 1-3 s)
            self.epoch = self.started + OPEN_LOOP_LEAD_S
            self.argv += ["--schedule-epoch", f"{self.epoch:.3f}"]
        # PR_SET_PDEATHSIG fires when the forking THREAD ends: only from the main thread (a
        # benchmark may start loads from a worker thread that ends before the load does).
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # noqa: S603
                                     stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True,
                                     preexec_fn=die_with_parent if main else None)  # noqa: PLW1509 - prctl only
        _LIVE.add(self)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the whole Locust process group (idempotent) and remove the temporary files."""
        # Only while the leader runs: once reaped, its PID (the group id) may belong to someone else.
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        _LIVE.discard(self)
        shutil.rmtree(self._dir, ignore_errors=True)

    def wait(self) -> LoadRun:
        assert self.proc is not None, "start() first"
        remaining = self.started + self.duration_s + self.margin_s - time.time()
        try:
            _, err = self.proc.communicate(timeout=max(1.0, remaining))
        except subprocess.TimeoutExpired:
            self.kill()
            raise CalibrationError(f"locust did not finish within {self.duration_s + self.margin_s:.0f}s; killed") from None
        except BaseException:
            self.kill()  # a signal, Ctrl-C: never leave the child behind
            raise
        try:
            data = json.loads(self.timeline.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CalibrationError(f"locust exited {self.proc.returncode} without a timeline ({e}); "
                                   f"stderr: {(err or '').strip()[-2000:]}") from e
        finally:
            self.kill()  # removes the files
        bins = {int(k): [int(v[0]), int(v[1])] for k, v in data["bins"].items()}
        return LoadRun(int(data["totals"]["ok"]), int(data["totals"]["failed"]), bins, float(data["bin_s"]),
                       self.started, time.time(), dict(data.get("errors", {})), dict(data.get("latency_ms", {})))


def run_shop_load(target: str, rate: float, users: int, duration_s: float, **kw: Any) -> LoadRun:
    """Run the load against ``target`` for ``duration_s`` seconds and return its timeline."""
    return ShopLoad(target, rate, users, duration_s, **kw).start().wait()


def cleanup_on_signals(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)) -> None:
    """On any of ``signals``: kill every running load's process group, then exit 128 + signal."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        for load in list(_LIVE):
            load.kill()
        print(f"\ncalibrate: stopped by signal {signum}; locust stopped, nothing published", file=sys.stderr)
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, handler)


# ---------------------------------------------------------------------------- Prometheus
def _prometheus_get(base_url: str, api: str, params: dict[str, str], timeout: float = 10.0) -> Any:
    url = f"{base_url.rstrip('/')}/api/v1/{api}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the user's Prometheus URL
        body = json.load(resp)
    if body.get("status") != "success":
        raise CalibrationError(f"Prometheus refused {params.get('query')!r}: {body.get('error')}")
    return body["data"]


def prometheus_instant(base_url: str, query: str, timeout: float = 10.0) -> list[tuple[dict[str, str], float]]:
    """``query``'s samples now: (labels, value) pairs."""
    data = _prometheus_get(base_url, "query", {"query": query}, timeout)
    if data.get("resultType") == "scalar":
        return [({}, float(data["result"][1]))]
    return [(r["metric"], float(r["value"][1])) for r in data["result"]]


def prometheus_series(base_url: str, query: str, start: float, end: float, step_s: float = 1.0,
                      timeout: float = 10.0) -> list[float]:
    """Values of ``query`` (one series) at ``step_s`` steps over [start, end], via query_range."""
    data = _prometheus_get(base_url, "query_range", {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                     "step": f"{step_s}"}, timeout)
    result = data["result"]
    if len(result) != 1:
        raise CalibrationError(f"{query!r} returned {len(result)} series over the run, need exactly 1")
    return [float(v) for _, v in result[0]["values"] if math.isfinite(float(v))]


#: The nginx exporters' own stub_status requests per second (one per scrape; see the rules):
#: per exporter, 1 / its scrape interval, the median over the last minute read every second (the
#: subquery's step is explicit: without one it is the server's evaluation interval, 1 m on a
#: default Prometheus, which leaves one reading). One
#: interval alone (`irate / idelta` now) read 3.3 or 10 instead of 5 whenever a 200 ms scrape
#: started 100 ms late (tests/unit/test_copy_guard_calibrate.py, on promtool). irate and idelta
#: read the last two samples of a 5m window: a 1m one held one sample at a 60 s scrape; only
#: while the exporter is alive (``and``: a removed one's last samples stay in the window).
OWN_RPS_QUERY = ("sum(quantile_over_time(0.5, (irate(nginx_http_requests_total[5m])"
                 " / clamp_min(idelta(nginx_http_requests_total[5m]), 1) and nginx_http_requests_total)[1m:1s]))")
IDLE_QUERY = ('max(max_over_time(site:promreflex_http_requests:rate1s{{site="{site}"}}[{window}]) '
              'or max_over_time(sum(instance:nginx_http_requests_visitors:rate3s{{site=~"{site}|"}})[{window}:1s]))')
#: When this user's last calibration load ended (Unix s), or ``running PID STARTED TARGET`` while
#: one runs (its mtime the last moment a load ran: a heartbeat every HEARTBEAT_S): the next
#: baseline must not count that load. In the user's own cache directory (a predictable name in
#: /tmp could be a planted symlink).
LAST_LOAD = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "promreflex" / "calibrate-last-load"
#: The baseline looks at the minute before the load (BASELINE_S) or, after a calibration load,
#: at the time since that load left Prometheus' rates, but at least MIN_BASELINE_S -
#: BASELINE_AFTER_LOAD_S (11.5 s) long (calibrate waits for it). At the local stack (200 ms
#: scrapes, rates over 1 s and 3 s, evaluated every 200 ms) a load leaves them 3.5 s after it
#: ended; at other scrape intervals see :class:`RateWindows`.
BASELINE_S = 60.0
MIN_BASELINE_S = 15.0
BASELINE_AFTER_LOAD_S = 3.5
#: While a load runs, calibrate touches LAST_LOAD this often: a calibration killed with SIGKILL
#: (no end written) loaded the shop for the last time at most this long after the file's mtime.
HEARTBEAT_S = 1.0
#: The window of the served rate the rules use for the site (their ladder: 1 s at 200 ms
#: scrapes, 5 s at 1 s, 1 m at 15 s, 2 m at 30 s, 5 m at 60 s) and that of the nginx arrivals (3 s
#: up to a 1 s scrape, 1 m at 15 s, 2 m at 30 s, 5 m at 60 s): rules/copy-guard.rules.yml.
SERVED_WINDOW_QUERY = 'max(site:promreflex_copy_guard_rate_window:seconds{{site="{site}"}})'
ARRIVALS_WINDOW_QUERY = ('max((count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[3s]) >= 3) * 0 + 3'
                         ' or (count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[1m]) >= 4) * 0 + 60'
                         ' or (count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[2m]) >= 4) * 0 + 120'
                         ' or (count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[5m]) >= 4) * 0 + 300'
                         ' or count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[2m]) * 0 + 120'
                         ' or count_over_time(nginx_http_requests_total{{site=~"{site}|"}}[5m]) * 0 + 300)')
PUBLISHED_QUERY = 'max(site:promreflex_copy_guard_threshold:rps{{site="{site}"}})'


def _secs(s: float) -> str:
    """``3s``, ``1m``, ``1m30s``, ``200ms``."""
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60 or s % 1:
        return f"{s:g}s"
    m, rest = divmod(int(s), 60)
    return f"{m}m" + (f"{rest}s" if rest else "")


@dataclass(frozen=True)
class RateWindows:
    """How far back the demand figures of the target Prometheus reach: the longest rate window
    the rules use for the site (``window_s``) and how often they are evaluated (``evaluation_s``).
    The defaults are the local stack's (3 s arrivals, 200 ms evaluation)."""

    window_s: float = 3.0
    evaluation_s: float = 0.2
    known: bool = False  # read from the Prometheus (else the local stack's, assumed)

    @property
    def trail_s(self) -> float:
        """How long a load stays in the figures after it ended: the rate window, plus one
        evaluation (a subquery step reads the last evaluation before it), at least 0.5 s (a
        late scrape, a log line written late). 3.5 s at the stack, 75 s at a 15 s scrape."""
        return self.window_s + max(self.evaluation_s, 0.5)

    @property
    def min_window_s(self) -> float:
        """The shortest baseline: 11.5 s, and at least one evaluation of the recorded rates."""
        return max(MIN_BASELINE_S - BASELINE_AFTER_LOAD_S, self.evaluation_s + 1.0)

    @property
    def lookback_s(self) -> float:
        """How far back the recorded rates are read without an earlier load: the minute before
        the load, the rate window included (60 s at the stack; 16 s at a 15 s scrape: its
        1 m rates at the last evaluation then cover 76 s)."""
        return max(self.min_window_s, min(BASELINE_S, BASELINE_S + 5.0 - self.window_s))

    def describe(self) -> str:
        return (f"Prometheus' rates there span {_secs(self.window_s)}, evaluated every {_secs(self.evaluation_s)}"
                + ("" if self.known else " (assumed: the local stack's)"))


def read_rate_windows(prometheus_url: str, site: str, timeout: float = 5.0) -> RateWindows:
    """The :class:`RateWindows` of ``prometheus_url`` for ``site``: the rules' recorded window of
    the served rate (``site:promreflex_copy_guard_rate_window:seconds``) and the arrivals' window
    (the rules' ladder, on the nginx exporter's samples), and the copy-guard rules' evaluation
    interval (/api/v1/rules); the local stack's when it cannot tell."""
    windows: list[float] = []
    for query in (SERVED_WINDOW_QUERY, ARRIVALS_WINDOW_QUERY):
        try:
            windows += [v for _, v in prometheus_instant(prometheus_url, query.format(site=site), timeout)
                        if math.isfinite(v) and v > 0]
        except (OSError, urllib.error.URLError, CalibrationError, ValueError, KeyError, TypeError):
            continue
    evaluation = None
    try:
        groups = _prometheus_get(prometheus_url, "rules", {"type": "record"}, timeout)["groups"]
        evaluation = next((float(g["interval"]) for g in groups if g.get("name") == "copy-guard.rules"
                           and g.get("interval")), None)
    except (OSError, urllib.error.URLError, CalibrationError, ValueError, KeyError, TypeError):
        pass
    if not windows:
        return RateWindows(evaluation_s=evaluation or RateWindows.evaluation_s, known=False)
    window = max(windows)
    # without the rules' group: Prometheus evaluates about as often as it scrapes, and the
    # window holds 4 scrapes
    return RateWindows(window, evaluation if evaluation else max(0.2, window / 4), known=True)


@dataclass(frozen=True)
class LastLoad:
    """The last calibration load recorded in LAST_LOAD: ``ended`` (Unix s, at the latest), and
    ``how``: ``ended`` (the calibration said so), ``killed`` (it died during a load without
    saying so: its last heartbeat), or ``running`` (a calibration loading a shop now: ``ended``
    None)."""

    ended: float | None
    how: str
    pid: int | None = None
    target: str | None = None


def _calibrating(pid: int) -> bool:
    """Whether ``pid`` is a running calibration (its command line names calibrate)."""
    try:
        return b"calibrate" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def read_last_load(path: Path = LAST_LOAD) -> LastLoad | None:
    """The last load recorded in ``path`` (None: none, or unreadable)."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except (OSError, UnicodeDecodeError):
        return None
    parts = text.split()
    if parts[:1] == ["running"]:
        try:
            pid = int(parts[1])
        except (IndexError, ValueError):
            return None
        target = parts[3] if len(parts) > 3 else None
        if pid != os.getpid() and _calibrating(pid):
            return LastLoad(None, "running", pid, target)
        return LastLoad(mtime + HEARTBEAT_S, "killed", pid, target)
    try:
        ended = float(text.strip())
    except ValueError:
        return None
    return LastLoad(ended, "ended") if math.isfinite(ended) else None


def _origin(url: str | None) -> str | None:
    try:
        return split_target(url)[0].lower() if url else None
    except ValueError:
        return None


def running_calibration(target: str, path: Path = LAST_LOAD) -> str | None:
    """Why not to start now: another calibration is loading the same shop (its origin) at this
    moment (its load would be measured as this one's, and this one's as its); None otherwise."""
    last = read_last_load(path)
    if last is None or last.how != "running" or _origin(last.target) != _origin(target):
        return None
    return (f"another calibration (pid {last.pid}) is loading {last.target} now: two loads at once measure neither; "
            "wait for it to end")


def note_load_ended(path: Path = LAST_LOAD) -> None:
    """Remember that a calibration load just ended (or was interrupted): its requests stay in the
    demand series for a rate window (a minute at a 15 s scrape), and a retry's baseline counted
    them as the shop's own demand."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{time.time():.3f}\n")
    except OSError:
        pass


DEFAULT_SITE = "shop"


def _site_key(what: str) -> str:
    """A file-name part for a site or an origin: its safe characters and a short hash (two
    spellings that differ only in unsafe characters do not share it)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", what)[:64]
    return f"{safe}-{hashlib.blake2b(what.encode('utf-8', 'surrogatepass'), digest_size=4).hexdigest()}"


def last_load_path(site: str, base: Path | None = None) -> Path:
    """The record of ``site``'s last calibration load: one per site, so a load of another shop
    ending never erases this one's "running" and a calibration never waits for another shop's
    load to leave the rates. The default site keeps the name of the single record before."""
    base = base or LAST_LOAD  # (looked up now: a test sets another)
    return base if site == DEFAULT_SITE else base.with_name(f"{base.name}.{_site_key(site)}")


class CalibrationBusy(CalibrationError):
    """Another calibration of the same site (or loading the same shop) runs now."""


class CalibrationLock:
    """One calibration per site and per shop (the target's origin) at a time: exclusive ``flock``
    locks on files beside the last-load records, taken when a calibration starts (before its
    baseline wait) and held until it ends; the kernel releases them when it dies (kill -9 too).
    A second one is refused at once (:class:`CalibrationBusy`, naming the first one's pid);
    calibrations of other sites and shops go on side by side."""

    def __init__(self, site: str, target: str, base: Path | None = None) -> None:
        base = base or LAST_LOAD
        origin = _origin(target) or target
        self.locks = [(f"site {site!r}", base.with_name(f".{base.name}.site.{_site_key(site)}.lock")),
                      (f"the shop at {origin}", base.with_name(f".{base.name}.origin.{_site_key(origin)}.lock"))]
        self.fds: list[int] = []

    def acquire(self) -> None:
        try:
            for what, path in self.locks:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                try:
                    self.fds.append(fsutil.lock_exclusive(path))
                except fsutil.LockHeld as e:
                    raise CalibrationBusy(f"another calibration (pid {e.holder}) of {what} is running now: two at "
                                          "once measure neither; wait for it to end") from None
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> CalibrationLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class LoadHeartbeat:
    """While this calibration's loads run, LAST_LOAD says ``running PID STARTED TARGET`` and its
    mtime follows (every HEARTBEAT_S): a calibration killed with SIGKILL, which writes no end,
    leaves the last moment its load ran (its Locust dies with it), and the next one leaves that
    load out of the shop's demand too. A context manager (a daemon thread)."""

    def __init__(self, target: str, path: Path = LAST_LOAD, period: float = HEARTBEAT_S) -> None:
        self.path, self.period = path, period
        self.text = f"running {os.getpid()} {time.time():.3f} {target}\n"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calibrate-heartbeat", daemon=True)
        self._beat = 0.0

    def __enter__(self) -> LoadHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                live = any(load.running() for load in list(_LIVE))
            except RuntimeError:  # the set changed while it was copied (a load starting): next time
                continue
            if live and time.monotonic() - self._beat >= self.period:
                self.beat()

    def beat(self) -> None:
        self._beat = time.monotonic()
        try:
            if self.path.read_text() == self.text:
                os.utime(self.path)
                return
        except (OSError, UnicodeDecodeError):
            pass
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.text)
        except OSError:
            pass


def _since_last_load(now: float, path: Path) -> tuple[float, LastLoad] | None:
    last = read_last_load(path)
    if last is None or last.ended is None:
        return None  # none, or one running now (another shop's: running_calibration refuses the same)
    return now - last.ended, last


def baseline_window(now: float, path: Path = LAST_LOAD, windows: RateWindows | None = None) -> tuple[float, float]:
    """(seconds to wait, window in seconds) for the baseline: the lookback of ``windows`` (the
    last minute at the stack), or only the time since calibrate's own last load left the rates
    (its end + the windows' trail), after waiting until that is at least their min_window_s."""
    w = windows or RateWindows()
    got = _since_last_load(now, path)
    if got is None:
        return 0.0, w.lookback_s
    since, _ = got
    if not 0 <= since < w.lookback_s + w.trail_s:
        return 0.0, w.lookback_s
    wait = max(0.0, w.trail_s + w.min_window_s - since)
    # The window starts a trail after the load ended: the rates at its first evaluation then hold
    # none of the load's requests. Up to the lookback.
    return wait, min(w.lookback_s, max(since, w.trail_s + w.min_window_s) - w.trail_s)


@dataclass(frozen=True)
class Baseline:
    idle_demand: float | None
    own_rps: float | None
    note: str
    span: str = SPAN  # what idle_demand is: "its busiest second over ..." (its highest 1m rate at 15 s)
    published: float | None = None  # the threshold Prometheus has for the site now


def _sleep_progress(seconds: float, sleep: Callable[[float], None], progress: Callable[[str], None],
                    step: float = 15.0) -> None:
    left = seconds
    while left > 0:
        sleep(min(step, left))
        left -= step
        if left > 0:
            progress(f"  ... {left:.0f}s left")


def measure_baseline(prometheus_url: str | None, site: str, last_load: Path = LAST_LOAD,
                     sleep: Callable[[float], None] = time.sleep, windows: RateWindows | None = None,
                     progress: Callable[[str], None] | None = None) -> Baseline:
    """The shop's demand over the last minute (or since calibrate's own last load left
    Prometheus' rates: ``windows``, the local stack's by default) and the exporters' own request
    rate, or why not."""
    if not prometheus_url:
        return Baseline(None, None, "no Prometheus given (--prometheus.url): idle demand and own traffic not checked")
    say = progress or (lambda text: print(text, flush=True))
    w = windows or RateWindows()
    now = time.time()
    wait, window = baseline_window(now, last_load, w)
    got = _since_last_load(now, last_load)
    if wait > 0 and got is not None:
        since, last = got
        what = ("ended" if last.how == "ended" else
                f"was killed (pid {last.pid}, no end written: its last heartbeat)")
        say(f"waiting {wait:.0f}s: a calibration load {what} {since:.0f}s ago, and stays in Prometheus' demand "
            f"figures for {w.trail_s:.1f}s after it ended ({w.describe()}); the shop's demand before this one is "
            f"read over the {window:.1f}s after that, not counting it")
        _sleep_progress(wait, sleep, say)
    # at the stack's short rates a second; at 15 s the recorded rates are 1 m averages
    peak = "its busiest second" if w.window_s <= 5 else f"its highest {_secs(w.window_s)} rate"
    if got is not None and 0 <= got[0] < w.lookback_s + w.trail_s:  # the window starts after that load
        span = f"{peak} over the {window:.1f}s since the last calibration load" + (
            f" left the {_secs(w.window_s)} rates" if w.window_s > 5 else "")
    elif w.window_s <= 5:
        span = f"{peak} over the last minute"
    else:
        span = f"{peak} over the last {_secs(w.lookback_s + w.window_s)} ({w.describe()})"
    try:
        idle = prometheus_instant(prometheus_url, IDLE_QUERY.format(site=site, window=f"{int(window * 1000)}ms"))
        own = prometheus_instant(prometheus_url, OWN_RPS_QUERY)
    except (OSError, urllib.error.URLError, CalibrationError, ValueError, KeyError) as e:
        return Baseline(None, None, f"Prometheus at {prometheus_url} not usable ({e}): idle demand and own traffic not checked")
    try:
        published = max((v for _, v in prometheus_instant(prometheus_url, PUBLISHED_QUERY.format(site=site))
                         if math.isfinite(v) and v > 0), default=None)
    except (OSError, urllib.error.URLError, CalibrationError, ValueError, KeyError):
        published = None
    idle_v = max((v for _, v in idle if math.isfinite(v)), default=None)
    own_v = max((v for _, v in own if math.isfinite(v)), default=None)
    return Baseline(idle_v, own_v, f"before the load (Prometheus {prometheus_url}): shop demand "
                    f"{'unknown' if idle_v is None else f'{idle_v:.2f} req/s'} at {span}, "
                    "nginx exporters' "
                    f"own requests {'unknown' if own_v is None else f'{own_v:.2f} req/s'}", span, published)


# ---------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    site: str
    method: str
    quantile: float
    source: str
    rate: float
    users: int
    duration_s: float
    warmup_s: float
    runs: list[list[float]] = field(default_factory=list)  # per-second served RPS of each VALID run
    totals: list[dict[str, int]] = field(default_factory=list)
    threshold: float | None = None
    discarded: list[str] = field(default_factory=list)
    ramp: list[dict[str, Any]] = field(default_factory=list)
    spread: Spread | None = None
    floor: float | None = None
    response_s: float | None = None  # healthy response time (module doc)
    latency_p95_ms: list[float] = field(default_factory=list)  # per valid run

    def run_distributions(self) -> list[Distribution]:
        return [Distribution.of(r) for r in self.runs]

    def overall(self) -> Distribution:
        return Distribution.of([v for r in self.runs for v in r])

    def table(self) -> str:
        head = f"{'run':<8}{'seconds':>8}{'min':>8}{'p5':>8}{'median':>8}{'max':>8}{'served':>8}{'failed':>8}"
        lines = [head, "-" * len(head)]
        for i, (d, t) in enumerate(zip(self.run_distributions(), self.totals), 1):
            lines.append(f"{i:<8}{d.n:>8}{d.min:>8.1f}{d.p5:>8.1f}{d.median:>8.1f}{d.max:>8.1f}{t['ok']:>8}{t['failed']:>8}")
        o = self.overall()
        lines.append(f"{'all':<8}{o.n:>8}{o.min:>8.1f}{o.p5:>8.1f}{o.median:>8.1f}{o.max:>8.1f}"
                     f"{sum(t['ok'] for t in self.totals):>8}{sum(t['failed'] for t in self.totals):>8}")
        return "\n".join(lines)

    def describe(self) -> str:
        """The threshold, the statistic it is, and its spread, in one line."""
        assert self.threshold is not None
        what = {"robust": f"median over {len(self.runs)} run(s) of each run's {self.quantile:g}-quantile",
                "min": "lowest second of all runs (the paper's rule)",
                "quantile": f"{self.quantile:g}-quantile of all seconds"}[self.method]
        s = self.spread
        spread = "" if s is None else (f"; spread over {s.over}: {s.low:.1f}..{s.high:.1f} req/s, MAD {s.mad:.1f}"
                                       if len(self.runs) > 1 or s.over == "seconds" else "; one run: no spread across runs")
        return f"threshold {self.threshold:.2f} req/s ({what}{spread})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_run": [asdict(d) for d in self.run_distributions()],
                "overall": asdict(self.overall()) if self.runs else None}


def check_run(load: LoadRun, values: Sequence[float], max_failed: float) -> str | None:
    """Why a run cannot be trusted (None: it can)."""
    top = ", ".join(f"{k} x{n}" for k, n in list(load.errors.items())[:2])
    if load.ok == 0 or not values:
        return f"it served nothing after the warm-up ({load.ok} ok, {load.failed} failed{'; ' + top if top else ''})"
    if load.failed_share > max_failed:
        return (f"{load.failed} of {load.ok + load.failed} requests failed ({load.failed_share:.1%} > {max_failed:.0%}: "
                f"timeouts, 499s or errors{'; ' + top if top else ''}): the site was pushed past a healthy saturation; "
                "fewer --users or a longer --request-timeout")
    stalled = sum(1 for v in values if v == 0)
    if stalled:
        return f"it stalled: {stalled} second(s) after the warm-up served nothing"
    return None


def ramp_users(target: str, profile: Sequence[Request] | None, *, max_users: int = 32, step_s: float = 10.0,
               rate: float = 0.0, progress: Callable[[str], None] = print, **load_kw: Any) -> tuple[int, list[dict[str, Any]]]:
    """Start light and double the users until the knee (module doc); returns (users, steps). A
    step that would end the ramp (it served less than 10% more than the one before, or less) is
    measured once more first, and the better of the two counts: one step slowed by other work on
    a shared host would otherwise end the ramp at a fraction of the shop's capacity."""
    steps: list[dict[str, Any]] = []
    users, chosen, saturated = 1, 0, False
    timeout_s = float(load_kw.get("request_timeout", 10.0))

    def measure(n: int, again: bool = False) -> dict[str, Any]:
        load = run_shop_load(target, rate, n, step_s, profile=profile, **load_kw)
        values = per_second_series(load.served(), min(2.0, step_s / 3))
        served = quantile(values, 0.5) if values else 0.0
        p95 = float(load.latency_ms.get("p95", 0.0))
        progress(f"  ramp: {n:>3} user(s): {served:7.1f} req/s served (median), p95 {p95:6.0f} ms, "
                 f"{load.failed} failed{' (measured again)' if again else ''}")
        return {"users": n, "served_median": served, "failed": load.failed, "ok": load.ok, "p95_ms": p95,
                "errors": load.errors}

    while users <= max_users:
        step = measure(users)
        prev = steps[-1]["served_median"] if steps else None
        if prev is not None and not (step["failed"] or step["ok"] == 0) and step["served_median"] < 1.10 * prev:
            again = measure(users, again=True)
            if not (again["failed"] or again["ok"] == 0) and again["served_median"] > step["served_median"]:
                step = again
        errors = step.pop("errors")
        steps.append(step)
        served, p95 = step["served_median"], step["p95_ms"]
        if step["failed"] or step["ok"] == 0:
            if chosen == 0:
                raise CalibrationError(f"the site failed already under {users} user(s) ({step['ok']} ok, "
                                       f"{step['failed']} failed; {', '.join(errors) or 'no answer'}): is {target} up "
                                       "and healthy?")
            progress(f"  ramp: failures at {users} users: calibrating with {chosen}")
            saturated = True
            break
        if p95 > timeout_s * 1000 / 3:
            chosen = chosen or users
            progress(f"  ramp: p95 {p95:.0f} ms is over a third of the {timeout_s:g}s timeout: calibrating with {chosen}")
            saturated = True
            break
        if prev is not None and served < prev:
            # past the knee: the site served LESS with more users (a backlog, an upstream's listen
            # queue overflowing, php-fpm thrashing): the runs at these users would measure the
            # collapse, a threshold far below what the site serves at its best
            chosen = steps[-2]["users"]
            progress(f"  ramp: {users} users served less than {chosen}: past the knee, calibrating with {chosen}")
            saturated = True
            break
        if prev is not None and served < 1.10 * prev:
            chosen = users
            progress(f"  ramp: {users} users served less than 10% more than {steps[-2]['users']}: saturated, "
                     f"calibrating with {users}")
            saturated = True
            break
        chosen = users
        users *= 2
    if not saturated and len(steps) > 1:
        progress(f"  ramp: warning: {chosen} users (--max-users {max_users}) still served "
                 f"{steps[-1]['served_median'] / max(steps[-2]['served_median'], 1e-9) - 1:+.0%} over "
                 f"{steps[-2]['users']}: the shop did not saturate, so the threshold is what {chosen} users get, "
                 "not the shop's capacity; raise --max-users to find its knee")
    return max(chosen, 1), steps


def check_reachable(target: str, timeout: float = 10.0) -> None:
    """One HEAD request to ``target`` before any load: a shop that does not answer at all
    (nothing listens, a wrong host, silent for ``timeout``) fails at once, not after a whole run
    of refused connections. Any HTTP answer passes, 405 included (the profile's own pages are
    judged by the runs)."""
    req = urllib.request.Request(target, method="HEAD",  # noqa: S310 - the user's shop
                                 headers={"User-Agent": "promreflex-calibrate"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            resp.read(1 << 16)
    except urllib.error.HTTPError:
        return  # it answers
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise CalibrationError(f"{target} does not answer ({reason}): is the shop up, and --target its address? "
                               "Nothing was loaded, nothing published") from None


def calibrate(target: str, *, site: str = "shop", rate: float = 0.0, users: int | None = None, duration_s: float = 60.0,
              runs: int = 3, warmup_s: float = 5.0, method: str = "robust", q: float = 0.05, checkout_share: float = 0.1,
              source: str = "locust", prometheus_url: str | None = None, query: str | None = None,
              profile: Sequence[Request] | None = None, max_users: int = 32, step_s: float = 10.0,
              request_timeout: float = 10.0, max_failed: float = 0.01, min_runs: int | None = None,
              product_count: int = 10000, variables: Mapping[str, Sequence[Any]] | None = None,
              progress: Callable[[str], None] = print,
              check_estimate: Callable[[float, str], str | None] | None = None) -> Calibration:
    """Ramp (unless ``users``), run the load ``runs`` times, discard the runs that cannot be
    trusted and derive the threshold with its spread (not published: see :func:`publish`).
    ``check_estimate(served, how)``: asked after the ramp (what the knee served, its median
    second) or, without a ramp, after the first valid run (its median second); a reason it
    returns stops the calibration there (CalibrationError) instead of after every run."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    if duration_s <= warmup_s + 1:
        raise ValueError(f"duration {duration_s}s leaves nothing after the {warmup_s}s warm-up")
    if source == "prometheus" and not prometheus_url:
        raise ValueError("--source prometheus needs --prometheus.url")
    min_runs = runs // 2 + 1 if min_runs is None else min_runs
    check_reachable(target, request_timeout)
    load_kw: dict[str, Any] = {"request_timeout": request_timeout, "checkout_share": checkout_share,
                               "product_count": product_count, "variables": variables}
    ramp: list[dict[str, Any]] = []
    if users is None:
        progress(f"ramp: 1, 2, 4, ... up to {max_users} users, {step_s:g}s each, until the site saturates")
        users, ramp = ramp_users(target, profile, max_users=max_users, step_s=step_s, rate=rate, progress=progress,
                                 **load_kw)
        knee = next((st["served_median"] for st in ramp if st["users"] == users), None)
        why = check_estimate(float(knee), f"at the knee of the ramp ({users} users, median second)") \
            if check_estimate and knee is not None else None
        if why:
            raise CalibrationError(f"refused after the ramp, before the runs, nothing published: {why}")
    cal = Calibration(site, method, q, source, rate, users, duration_s, warmup_s, ramp=ramp)
    offered = f"{rate:g} req/s offered by {users} users" if rate else f"{users} users, closed loop"
    for i in range(1, runs + 1):
        progress(f"calibrate run {i}/{runs}: {offered} for {duration_s:g}s ...")
        try:
            load = run_shop_load(target, rate, users, duration_s, profile=profile, **load_kw)
        except CalibrationError as e:
            cal.discarded.append(f"run {i}: {e}")
            progress(f"  run {i}/{runs} DISCARDED: {e}")
            continue
        if source == "prometheus":
            assert prometheus_url is not None
            served = load.served()
            first = min(served) + math.ceil(warmup_s) if served else load.started + warmup_s
            last = (max(served) - 1) if served else load.ended
            values = prometheus_series(prometheus_url, query or DEFAULT_QUERY.format(site=site), first, last)
        else:
            values = per_second_series(load.served(), warmup_s)
        why = check_run(load, values, max_failed)
        if why:
            cal.discarded.append(f"run {i}: {why}")
            progress(f"  run {i}/{runs} DISCARDED: {why}")
            continue
        cal.runs.append(values)
        cal.totals.append({"ok": load.ok, "failed": load.failed})
        cal.latency_p95_ms.append(float(load.latency_ms.get("p95", 0.0)))
        d = Distribution.of(values)
        progress(f"  run {i}/{runs}: served {load.ok} ({load.failed} failed); per second min {d.min:.1f} "
                 f"p5 {d.p5:.1f} median {d.median:.1f} max {d.max:.1f}; p95 {load.latency_ms.get('p95', 0):.0f} ms")
        if check_estimate and not ramp and len(cal.runs) == 1 and i < runs:
            why = check_estimate(d.median, f"in run {i} (its median second)")
            if why:
                raise CalibrationError(f"refused after run {i} of {runs}, nothing published: {why}")
    if len(cal.runs) < min_runs:
        raise CalibrationError(f"only {len(cal.runs)} of {runs} runs can be trusted (need {min_runs}); nothing published. "
                               + " ".join(cal.discarded))
    cal.threshold = derive_threshold(cal.runs, method, q)
    cal.spread = spread_of(cal.runs, method, q)
    cal.response_s = healthy_response_s(cal)
    return cal


def healthy_response_s(cal: Calibration) -> float | None:
    """The healthy response time (module doc): the median of the valid runs' 95th percentiles
    (seconds); None when unknown."""
    lat = [x for x in cal.latency_p95_ms if x > 0]
    return quantile(lat, 0.5) / 1000 if lat and cal.runs else None


def publish(cal: Calibration, textfile_dir: Path, demand_floor_rps: float | None = None) -> Path:
    from controllers.copy_guard.threshold import write_threshold

    if cal.threshold is None:
        raise CalibrationError("nothing calibrated")
    floor = demand_floor_rps if demand_floor_rps is not None else cal.floor
    return write_threshold(textfile_dir, cal.site, cal.threshold, demand_floor_rps=floor, response_s=cal.response_s)


def drift_warning(textfile_dir: Path, site: str, threshold: float) -> str | None:
    """A warning when ``threshold`` differs from the one published for ``site`` by more than
    DRIFT_WARN of it (None without one, or when the file cannot be read)."""
    from controllers.copy_guard.threshold import read_thresholds

    try:
        before = read_thresholds(textfile_dir).get(site)
    except (OSError, UnicodeDecodeError):
        return None
    if before is None or before.rps <= 0 or abs(threshold - before.rps) <= DRIFT_WARN * before.rps:
        return None
    try:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(before.when)) if before.when > 0 else "unknown"
    except (OverflowError, OSError, ValueError):  # a hand-edited stamp out of range
        when = "unknown"
    return (f"site {site!r} has a published threshold of {before.rps:.2f} req/s (from {when}); this calibration "
            f"says {threshold:.2f} ({threshold / before.rps - 1:+.0%}): the shop or its host changed since (other work "
            "on its cores, a release, its data or caches); a published threshold replaces the old one, so calibrate "
            "while the host is as busy as when its backups run")


def published_threshold(textfile_dir: Path, site: str, baseline: Baseline | None = None) -> tuple[float, str] | None:
    """The threshold published for ``site`` now, (req/s, where): in ``textfile_dir`` (where this
    calibration publishes), else the one the target Prometheus has (``baseline.published``)."""
    from controllers.copy_guard.threshold import FILENAME, read_thresholds

    try:
        mine = read_thresholds(textfile_dir).get(site)
    except (OSError, UnicodeDecodeError):
        mine = None
    if mine is not None and mine.rps > 0 and math.isfinite(mine.rps):
        return mine.rps, f"in {Path(textfile_dir) / FILENAME}"
    if baseline is not None and baseline.published is not None:
        return baseline.published, "in Prometheus"
    return None


# ---------------------------------------------------------------------------- CLI
def _seconds(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _request(text: str) -> Request:
    try:
        return parse_request(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _stack_defaults(args: argparse.Namespace) -> tuple[str, Path, str]:
    """Target URL, textfile dir and Prometheus URL of the local stack the flags describe."""
    from promreflex.config import DEFAULT_CONFIG, load_config
    from promreflex.stack import Stack

    overrides = {"stack.state_dir": str(args.state_dir)} if args.state_dir else {}
    cfg = load_config(args.config_file or DEFAULT_CONFIG, overrides)
    stack = Stack(cfg)
    return stack.site_url, stack.textfile_dir, stack.url("prometheus")


#: A longer access-log line is not one (a binary file, /dev/zero): skipped in bounded pieces.
MAX_LINE = 64 * 1024


def log_lines(f: BinaryIO, skipped: Counter[str]) -> Iterator[str]:
    """The lines of a binary file, decoded (UTF-8, bad bytes replaced); a line longer than
    :data:`MAX_LINE` is read and dropped in bounded pieces and counted in ``skipped``."""
    while line := f.readline(MAX_LINE):
        if len(line) >= MAX_LINE and not line.endswith(b"\n"):
            skipped[f"longer than {MAX_LINE // 1024} KiB"] += 1
            while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            continue
        yield line.decode("utf-8", errors="replace")


def read_replay(path: Path, top: int = 500, log_format: str | None = None) -> tuple[list[Request], dict[str, int]]:
    """:func:`replay_profile` of an access log file, its paths ``site_absolute``; CalibrationError
    for a file that cannot be one (unreadable, gzip-compressed, a device) or a ``log_format``
    that cannot be read."""
    replay_parser(log_format)  # a log_format that cannot be compiled: said before the file is read
    try:
        with open(path, "rb") as f:
            if stat.S_ISCHR(os.fstat(f.fileno()).st_mode):
                raise CalibrationError(f"--replay {path} is a device, not an access log")
            if f.peek(2)[:2] == b"\x1f\x8b":
                raise CalibrationError(f"--replay {path} is gzip-compressed: decompress it first "
                                       f"(zcat {path} > access.log)")
            long: Counter[str] = Counter()
            replayed, skipped = replay_profile(log_lines(f, long), top, log_format)
    except OSError as e:
        raise CalibrationError(f"cannot read --replay {path}: {e.strerror}") from e
    replayed = [replace(r, site_absolute=True) for r in replayed]
    return replayed, {**skipped, **long}


def build_profile(args: argparse.Namespace, target: str | None = None) -> tuple[list[Request], dict[str, list[str]], str]:
    """The requests to send from the flags, their variables, and a line saying what they are.
    Without any: GET of ``target`` (default ``args.target``) itself, its path and query."""
    requests = list(args.request or [])
    variables: dict[str, list[str]] = {}
    what = []
    if requests:
        what.append(f"{len(requests)} --request line(s)")
    if args.profile:
        from_file, variables = read_profile(args.profile)
        requests += from_file
        what.append(f"{len(from_file)} request(s) from {args.profile}")
    if args.replay:
        if args.replay_top < 1:
            raise CalibrationError(f"--replay-top {args.replay_top}: keep at least 1 path")
        log_format = getattr(args, "replay_log_format", None)
        replayed, skipped = read_replay(args.replay, args.replay_top, log_format)
        if not replayed:
            unread = skipped.get("not a request line", 0)
            hint = ""
            if unread and unread >= sum(skipped.values()) / 2:  # mostly lines it cannot read: say what it reads
                hint = (f"; {unread} line(s) not in the --replay-log-format given, which must be the log_format "
                        "nginx writes this file with" if log_format else f"; {REPLAY_FORMATS}")
            raise CalibrationError(f"--replay {args.replay}: no GET/HEAD request answered 2xx/3xx by a visitor "
                                   f"(left out: {skipped or 'nothing, no line parsed'}){hint}")
        requests += replayed
        what.append(f"{len(replayed)} path(s) replayed from {args.replay} (left out: "
                    + (", ".join(f"{k} {v}" for k, v in skipped.items()) or "none") + ")")
    if not requests:
        target = target or getattr(args, "target", None)
        requests = [Request("GET", split_target(target)[1], site_absolute=True) if target else Request("GET", "/")]
        what.append("GET of the --target URL (give --request, --profile or --replay for your shop's own mix)")
    total = sum(r.weight for r in requests)
    if not math.isfinite(total):
        raise CalibrationError(f"the weights add up to {total:g}: too large to draw requests by (give smaller weights, "
                               "only their ratios matter)")
    return requests, variables, "; ".join(what)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if (not 0.0 <= args.quantile <= 1.0 or args.runs < 1 or (args.users is not None and args.users < 1)
            or args.rate < 0 or args.max_users < 1 or not 0.0 <= args.max_failed < 1.0 or args.min_floor < 0):
        print("calibrate: need --quantile within [0, 1], --runs >= 1, --users/--max-users >= 1, --rate >= 0, "
              "--max-failed within [0, 1), --min-floor >= 0", file=sys.stderr)
        return 2
    cleanup_on_signals()
    target, textfile_dir, prom = _stack_defaults(args)
    target = args.target or target
    textfile_dir = args.textfile_dir or textfile_dir
    prometheus_url = args.prometheus_url or (None if args.textfile_dir and args.source != "prometheus" else prom)
    try:
        split_target(target)
        profile, variables, what = build_profile(args, target)
    except (ValueError, CalibrationError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    print(f"calibrating site {args.site!r} at {target}: {what}; {args.runs} run(s) of {args.duration:g}s "
          f"(warm-up {args.warmup:g}s dropped), method {args.method}, source {args.source}")
    last_load = last_load_path(args.site)
    lock = CalibrationLock(args.site, target)
    try:  # held from here (before the baseline wait) to the end: a second one is refused at once
        lock.acquire()
    except CalibrationBusy as e:
        print(f"calibrate: refused before any load, nothing loaded or published: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"calibrate: cannot take the calibration lock {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        return _cmd_calibrate_locked(args, target, textfile_dir, prometheus_url, profile, variables, last_load)
    finally:
        lock.release()


def _cmd_calibrate_locked(args: argparse.Namespace, target: str, textfile_dir: Path, prometheus_url: str | None,
                          profile: list[Request], variables: dict[str, list[str]], last_load: Path) -> int:
    other = running_calibration(target, last_load)  # (one of a promreflex before the lock)
    if other:
        print(f"calibrate: refused before any load, nothing loaded or published: {other}", file=sys.stderr)
        return 1
    try:  # an explicit floor below the lowest sane one: said before the load, not after it
        explicit = None if args.demand_floor is None else floor_for(0.0, args.floor_ratio, args.min_floor,
                                                                   args.demand_floor)
    except ValueError as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    windows = read_rate_windows(prometheus_url, args.site) if prometheus_url else None
    baseline = measure_baseline(prometheus_url, args.site, last_load, windows=windows)
    print(baseline.note)
    why = refusal_before_load(baseline.idle_demand, span=baseline.span, explicit_floor=explicit,
                              published=published_threshold(textfile_dir, args.site, baseline),
                              floor_ratio=args.floor_ratio, min_floor=args.min_floor, own_rps=baseline.own_rps)
    if why:
        print(f"calibrate: refused before any load, nothing loaded or published: {why}", file=sys.stderr)
        return 1

    def check_estimate(served: float, how: str) -> str | None:
        return estimate_refusal(served, baseline.idle_demand, how=how, span=baseline.span,
                                floor_ratio=args.floor_ratio, min_floor=args.min_floor, explicit_floor=explicit)

    loads_before = LOADS_STARTED
    try:
        with LoadHeartbeat(target, last_load):
            cal = calibrate(target, site=args.site, rate=args.rate, users=args.users, duration_s=args.duration,
                            runs=args.runs, warmup_s=args.warmup, method=args.method, q=args.quantile,
                            source=args.source, prometheus_url=prometheus_url, query=args.query, profile=profile,
                            max_users=args.max_users, step_s=args.step_duration, request_timeout=args.request_timeout,
                            max_failed=args.max_failed, min_runs=args.min_runs, product_count=args.product_count,
                            variables=variables, check_estimate=check_estimate)
        cal.floor = floor_for(cal.threshold or 0.0, args.floor_ratio, args.min_floor, args.demand_floor)
    except (CalibrationError, ValueError, OSError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    finally:  # also on a signal (cleanup_on_signals raises SystemExit) and for a dry run
        if loads_before < LOADS_STARTED:  # (not when the shop did not answer: nothing was loaded)
            note_load_ended(last_load)
    print()
    print(cal.table())
    for line in cal.discarded:
        print(f"discarded {line}")
    warning = saturation_warning(args.rate, cal.overall())
    if warning:
        print(f"\nwarning: {warning}")
    assert cal.threshold is not None and cal.spread is not None
    rt = "unknown" if cal.response_s is None else f"{cal.response_s * 1000:.0f} ms"
    print(f"\n{cal.describe()}; demand floor {cal.floor:.2f} req/s; healthy response time {rt}")
    if len(cal.runs) > 1 and cal.spread.relative(cal.threshold) > SPREAD_WARN:
        print(f"warning: the runs disagree by more than {SPREAD_WARN:.0%} of the threshold: the host was busy or the shop "
              "changed during the calibration; calibrate again at a quieter time or with more --runs")
    drift = drift_warning(textfile_dir, args.site, cal.threshold)
    if drift:
        print(f"warning: {drift}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(cal.to_json(), indent=2))
        print(f"wrote {args.out}")
    why = refusal(cal.threshold, cal.floor, args.min_floor, baseline.idle_demand, baseline.own_rps, baseline.span)
    if why:
        print(f"calibrate: refused, nothing published: {why}", file=sys.stderr)
        return 1
    if args.dry_run:
        print("dry run: threshold not published")
        return 0
    try:
        path = publish(cal, textfile_dir)
    except (ValueError, OSError) as e:
        print(f"calibrate: cannot publish the threshold: {e}", file=sys.stderr)
        return 1
    print(f"published promreflex_copy_guard_rps_threshold{{site=\"{args.site}\"}} {cal.threshold:.2f} and "
          f"promreflex_copy_guard_demand_floor_rps {cal.floor:.2f} in {path}")
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate", help="measure the loaded shop's served RPS and publish the copy guard's threshold",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config.file", dest="config_file", type=Path, default=None, help="stack configuration (for the defaults below)")
    p.add_argument("--state.dir", dest="state_dir", type=Path, default=None, help="the local stack's state directory")
    p.add_argument("--target", default=None,
                   help="the shop's URL, its path included (default: the stack's site: its nginx, or stack.nginx.url)")
    p.add_argument("--site", default=DEFAULT_SITE, help="site label the threshold is published for (default shop)")
    p.add_argument("--request", action="append", type=_request, metavar='"METHOD /PATH [WEIGHT [BODY]]"',
                   help="a request of your shop's mix (repeat); PATH is under the path of --target; {id} is a random "
                        "integer; BODY is the rest of the line as given, sent as application/json when it is a JSON "
                        "object or array, else form-urlencoded")
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="YAML/JSON: requests: [{method, path, weight, body}], vars: {NAME: [values]} for {NAME}; paths "
                        "under the path of --target; a mapping body is sent as JSON, !!binary as bytes")
    p.add_argument("--replay", type=Path, default=None, metavar="ACCESS_LOG",
                   help="replay the GET/HEAD paths your visitors requested (weighted by count), as the log has them: "
                        "site-absolute, not under the path of --target; not gzip-compressed; combined-like lines "
                        "(nginx, Apache, the promreflex format) or JSON lines with request and status fields, any "
                        "other format with --replay-log-format")
    p.add_argument("--replay-log-format", dest="replay_log_format", default=None, metavar="LOG_FORMAT",
                   help="the nginx log_format string the --replay log is written with, as in nginx.conf (e.g. "
                        "'{\"request\":\"$request\",\"status\":$status,\"ua\":\"$http_user_agent\"}'); "
                        "default: combined-like lines (nginx, Apache, the promreflex format) and JSON lines with a "
                        "\"request\" and a \"status\" field")
    p.add_argument("--replay-top", type=int, default=500, help="the most frequent paths kept by --replay (>= 1, default 500)")
    p.add_argument("--product-count", type=int, default=10000, help="{id} is drawn from 0..N-1 (default 10000)")
    p.add_argument("--users", type=int, default=None, help="concurrent users; default: ramp 1, 2, 4, ... to the knee")
    p.add_argument("--max-users", type=int, default=32, help="where the ramp stops at the latest (default 32)")
    p.add_argument("--step-duration", type=_seconds, default=10.0, help="length of each ramp step (default 10s)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="pace the users to this many requests per second in total (default 0: closed loop)")
    p.add_argument("--request-timeout", type=_seconds, default=10.0, help="a request fails after this (default 10s)")
    p.add_argument("--duration", type=_seconds, default=60.0, help="length of each run (paper: 5m; default 60s)")
    p.add_argument("--runs", type=int, default=3, help="number of runs (paper: 5; default 3)")
    p.add_argument("--min-runs", type=int, default=None, help="valid runs needed (default: more than half of --runs)")
    p.add_argument("--warmup", type=_seconds, default=5.0, help="seconds dropped at the start of each run (default 5s)")
    p.add_argument("--max-failed", type=float, default=0.01, help="a run with a larger share of failed requests is discarded (default 0.01)")
    p.add_argument("--checkout-share", type=float, default=0.1, help=argparse.SUPPRESS)  # the built-in shop profile (API)
    p.add_argument("--method", choices=["robust", "min", "quantile"], default="robust",
                   help="robust: median over runs of each run's --quantile (default); min: lowest second (paper); "
                        "quantile: the --quantile of all seconds")
    p.add_argument("--quantile", type=float, default=0.05, help="for robust and quantile (default 0.05)")
    p.add_argument("--source", choices=["locust", "prometheus"], default="locust",
                   help="per-second RPS from Locust's completions (default) or the rules' recorded series")
    p.add_argument("--prometheus.url", dest="prometheus_url", default=None,
                   help="for the idle check and --source prometheus (default: the stack's)")
    p.add_argument("--query", default=None, help="PromQL for --source prometheus (default: site:promreflex_http_requests_served:rate1s{site=SITE})")
    p.add_argument("--textfile.dir", dest="textfile_dir", type=Path, default=None,
                   help="node_exporter textfile directory (default: the local stack's)")
    p.add_argument("--demand-floor", type=float, default=None, help="demand floor in req/s (default: --floor-ratio of the threshold)")
    p.add_argument("--floor-ratio", type=float, default=FLOOR_RATIO, help=f"floor as a share of the threshold (default {FLOOR_RATIO})")
    p.add_argument("--min-floor", type=float, default=MIN_FLOOR_RPS,
                   help=f"the lowest floor, and half the lowest threshold, accepted (default {MIN_FLOOR_RPS:g} req/s)")
    p.add_argument("--out", type=Path, default=None, help="also write every run's values and statistics as JSON here")
    p.add_argument("--dry-run", action="store_true", help="measure and print, do not publish")
    p.set_defaults(func=cmd_calibrate)
    return p
