"""Locust profile for the copy guard: the user's own requests, paced or closed-loop.

Run only in a child process (``controllers.copy_guard.calibrate.ShopLoad`` does): importing
locust monkey-patches the standard library with gevent.

- ``--profile-file FILE``: JSON ``{"base_path": "/shop", "requests": [{"method": "GET",
  "path": "/product/{id}", "weight": 9, "body": null}, ...], "vars": {"post": [12, 15]}}``: each
  request is drawn with its weight; in its path and body ``{id}`` and ``{n}`` become a random
  integer below ``--product-count``, ``{uniq}`` a string unique to the request, and ``{NAME}`` a
  random element of ``vars[NAME]``; ``base_path`` (the path of ``--target``) is put in front
  of every path, except that of a request with ``"site_absolute": true`` (replayed from the
  access log, or the ``--target`` URL itself), sent as it is, placeholders and all. A body is sent
  with its ``"content_type"`` (default form-urlencoded); with ``"body_base64": true`` it is
  base64 of the bytes to send. Redirects are not followed (a 302 is an answer, as in the access log).
  Without it: the built-in shop's profile
  (``bench/copy_guard/site.py``): ``--checkout-share`` of ``POST /checkout``, the rest
  ``GET /product/<id>``.
- ``--shop-rate R`` requests per second in total, spread over the ``-u`` users: each user paces
  itself to one request every ``users / R`` seconds with a random phase. ``0``: no pacing, each
  user sends its next request as soon as the previous one returned (closed loop: the site is
  saturated by ``-u`` concurrent requests and the served rate is its capacity).
- ``--shop-schedule "0:14,10:126,15:14"``: OPEN loop instead (one user, ``-u 1``): requests
  arrive at the scheduled rate whatever the site does, ``T:R`` = from T seconds after the start
  R requests per second (evenly spaced, so every run of a benchmark offers the same arrivals),
  each in its own greenlet, at most ``--max-outstanding`` at once (an arrival beyond that fails
  at once as ``Dropped``, like a server whose accept queue is full). A visitor arrives when they
  arrive, not when the last page came back: a flash crowd does not slow down because the shop does.
  ``--schedule-epoch E``: the schedule's 0 s is Unix time E (the caller's clock: Locust takes a
  second or two to start, and the caller times other things, a copy, from the same 0).
- ``--request-timeout S``: a request unanswered after S seconds fails (and shows in the
  timeline's errors): the visitor gave up.
- ``--parent-pid P``: quit when P is no longer our parent (the calibration died without being
  able to stop us; Linux also delivers SIGKILL through PR_SET_PDEATHSIG, set by the parent).
- ``--timeline-out FILE``: at exit, JSON ``{"bin_s": 0.1, "bins": {"<unix time // 0.1>": [ok,
  failed]}, "totals": {"ok": n, "failed": n}, "errors": {"<kind>": n}, "latency_ms": {"p50": ..,
  "p95": .., "max": .., "n": ..}}``: completions counted by completion time in 100 ms bins (the
  per-second served RPS the calibration needs, and the finer timeline the benchmark measures
  reaction times with; Locust's CSV history is rounded and comes up short).

Requests carry ``User-Agent: promreflex-calibrate``, so a replay of the access log
(``promreflex calibrate --replay``) leaves the calibration's own requests out.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import re
import time
from collections import Counter, defaultdict
from typing import Any

import gevent
from locust import FastHttpUser, events, task

BIN_S = 0.1
USER_AGENT = "promreflex-calibrate"
_RESERVOIR = 20000
_bins: dict[int, list[int]] = defaultdict(lambda: [0, 0])
_errors: Counter[str] = Counter()
_latencies: list[float] = []
_latency_n = 0


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:  # noqa: ANN001 - locust's argparse wrapper
    parser.add_argument("--shop-rate", type=float, default=0.0, help="total request rate to offer per second (0: closed loop)")
    parser.add_argument("--checkout-share", type=float, default=0.1, help="built-in shop profile: share of POST /checkout")
    parser.add_argument("--product-count", type=int, default=10000, help="{id} is drawn from 0..N-1")
    parser.add_argument("--profile-file", type=str, default="", help="the requests to send (JSON, see the module doc)")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds before a request fails")
    parser.add_argument("--shop-schedule", type=str, default="", help="open loop: 'T:R,...' rate R from T s on")
    parser.add_argument("--max-outstanding", type=int, default=256, help="open loop: most requests out at once")
    parser.add_argument("--schedule-epoch", type=float, default=0.0,
                        help="open loop: Unix time of the schedule's 0 s (0: when the user starts)")
    parser.add_argument("--parent-pid", type=int, default=0, help="quit when this process is no longer our parent")
    parser.add_argument("--timeline-out", type=str, default="", help="write per-second completions (JSON) here at exit")


@events.request.add_listener
def _count(request_type, name, response_time, response_length, exception=None, **_kw) -> None:  # noqa: ANN001
    global _latency_n
    _bins[int(time.time() / BIN_S)][1 if exception else 0] += 1
    if exception is not None:
        _errors[f"{type(exception).__name__}: {str(exception)[:80]}"] += 1
    _latency_n += 1
    if len(_latencies) < _RESERVOIR:
        _latencies.append(float(response_time))
    else:  # reservoir sampling keeps a uniform sample of every response time
        j = random.randrange(_latency_n)
        if j < _RESERVOIR:
            _latencies[j] = float(response_time)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


@events.quitting.add_listener
def _write_timeline(environment, **_kw) -> None:  # noqa: ANN001
    path = environment.parsed_options.timeline_out if environment.parsed_options else ""
    if not path:
        return
    ok = sum(v[0] for v in _bins.values())
    failed = sum(v[1] for v in _bins.values())
    lat = sorted(_latencies)
    with open(path, "w") as f:
        json.dump({"bin_s": BIN_S, "bins": {str(k): v for k, v in sorted(_bins.items())},
                   "totals": {"ok": ok, "failed": failed}, "errors": dict(_errors.most_common(5)),
                   "latency_ms": {"n": _latency_n, "p50": _pct(lat, 0.5), "p95": _pct(lat, 0.95),
                                  "max": lat[-1] if lat else 0.0}}, f)


@events.init.add_listener
def _watch_parent(environment, **_kw) -> None:  # noqa: ANN001
    opts = environment.parsed_options
    if opts:  # FastHttpUser reads its timeouts when a user is created, after init
        Shopper.network_timeout = Shopper.connection_timeout = opts.request_timeout
        if opts.shop_schedule:  # open loop: one connection per outstanding request, no queue in the client
            Shopper.concurrency = max(1, opts.max_outstanding)
    if not opts or not opts.parent_pid:
        return

    def watch() -> None:
        while True:
            if os.getppid() != opts.parent_pid and environment.runner is not None:
                environment.runner.quit()
                return
            gevent.sleep(0.5)

    gevent.spawn(watch)


def load_profile(opts: Any) -> tuple[str, list[dict[str, Any]], dict[str, list[str]]]:
    """(base path, requests, variables) from ``--profile-file``, or the built-in shop's profile."""
    if opts.profile_file:
        with open(opts.profile_file) as f:
            data = json.load(f)
        variables = {str(k): [str(v) for v in vs] for k, vs in (data.get("vars") or {}).items() if vs}
        return str(data.get("base_path", "")).rstrip("/"), list(data["requests"]), variables
    share = min(max(opts.checkout_share, 0.0), 1.0)
    return "", [{"method": "GET", "path": "/product/{id}", "weight": 1.0 - share, "body": None},
                {"method": "POST", "path": "/checkout", "weight": share, "body": "cart=1&qty=1"}], {}


_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_uniq = itertools.count()


def fill(text: str, variables: dict[str, list[str]], count: int) -> str:
    """Replace ``{id}``/``{n}``, ``{uniq}`` and ``{NAME}`` (see the module doc); others stay."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in variables:
            return random.choice(variables[name])
        if name in ("id", "n"):
            return str(random.randrange(max(1, count)))
        if name == "uniq":
            return f"{os.getpid()}-{next(_uniq)}-{random.randrange(1 << 30)}"
        return m.group(0)

    return _PLACEHOLDER.sub(one, text)


def request_path(base: str, req: dict[str, Any], variables: dict[str, list[str]], count: int) -> str:
    """The path a profile's request is sent to: a ``site_absolute`` one as it is (replayed from
    the access log, or the --target URL itself), any other filled and under ``base``."""
    if req.get("site_absolute"):
        return str(req["path"])
    return base + fill(str(req["path"]), variables, count)


def parse_schedule(text: str) -> list[tuple[float, float]]:
    """``"0:14,10:126"`` -> ``[(0.0, 14.0), (10.0, 126.0)]`` (sorted by time; ValueError if bad)."""
    steps = []
    for part in text.split(","):
        t, _, r = part.partition(":")
        steps.append((float(t), float(r)))
    if not steps or steps[0][0] != 0 or any(r < 0 for _, r in steps):
        raise ValueError(f"bad schedule {text!r}: 'T:R,...' from T=0, rates >= 0")
    return sorted(steps)


class Shopper(FastHttpUser):
    concurrency = 1

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.base, self.requests, self.variables = load_profile(opts)
        self.weights = [max(float(r.get("weight", 1.0)), 0.0) for r in self.requests]
        users = max(1, self.environment.runner.target_user_count or 1)
        self.period = users / opts.shop_rate if opts.shop_rate > 0 else 0.0
        if self.period:
            gevent.sleep(random.uniform(0, self.period))  # random phase
        self.next_at = time.monotonic()

    def wait_time(self) -> float:
        if not self.period:
            return 0.0
        self.next_at += self.period
        now = time.monotonic()
        if self.next_at < now:  # fell behind (slow site): go now, do not try to catch up in a burst
            self.next_at = now
        return self.next_at - now

    def open_loop(self, schedule: list[tuple[float, float]], max_out: int, epoch: float = 0.0) -> None:
        """Arrivals at the schedule's rate until Locust's run time ends (module doc)."""
        out = [0]
        t0 = time.monotonic() + (epoch - time.time() if epoch else 0.0)

        def one() -> None:
            try:
                self.one_request()
            finally:
                out[0] -= 1

        k, at = 0, 0.0  # the next arrival: seconds after t0
        while True:
            while k + 1 < len(schedule) and at >= schedule[k + 1][0]:
                k += 1
            rate = schedule[k][1]
            if rate <= 0:  # a pause in the schedule: jump to its next step
                if k + 1 >= len(schedule):
                    gevent.sleep(3600)
                    return
                at = schedule[k + 1][0]
                continue
            delay = t0 + at - time.monotonic()
            if delay > 0:
                gevent.sleep(delay)
            if out[0] >= max_out:
                _bins[int(time.time() / BIN_S)][1] += 1
                _errors["Dropped: too many requests outstanding"] += 1
            else:
                out[0] += 1
                gevent.spawn(one)
            at += 1.0 / rate

    @task
    def shop(self) -> None:
        opts = self.environment.parsed_options
        if opts.shop_schedule:
            self.open_loop(parse_schedule(opts.shop_schedule), max(1, opts.max_outstanding), opts.schedule_epoch)
            return
        self.one_request()

    def one_request(self) -> None:
        opts = self.environment.parsed_options
        req = random.choices(self.requests, weights=self.weights)[0]
        path = request_path(self.base, req, self.variables, opts.product_count)
        method = str(req.get("method", "GET")).upper()
        headers = {"User-Agent": USER_AGENT}
        body: Any = req.get("body")  # str or bytes: FastHttpSession sends both ("String/bytes")
        if body is not None:
            body = base64.b64decode(body) if req.get("body_base64") else fill(str(body), self.variables, opts.product_count)
            headers["Content-Type"] = str(req.get("content_type") or "application/x-www-form-urlencoded")
        self.client.request(method, path, data=body, headers=headers, name=f"{method} {req['path']}",
                            allow_redirects=False)
