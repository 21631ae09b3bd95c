"""Session clients for the admission bench: the paper's client model, run by Locust headless.

Run only in a child process (:mod:`bench.admission.load` starts it): importing locust
monkey-patches the standard library with gevent.

Each user is one browser: one keep-alive connection and its own cookie jar. It runs the
session chain of :data:`bench.admission.pages.PAGES` in order; after every page it thinks
``--think`` seconds (constant, as in the paper; also after the last page, before its next
session). A request that gets no answer within ``--client-timeout`` seconds (the paper's
client timeout) or any answer but 200 (a 503 from nginx's limits, the proxy's waiting room, a
5xx) fails the session at that page: the user drops the connection, forgets its cookies,
thinks, and retries the whole session from the first page (the paper's retry-from-start). It
ignores Retry-After, the same for every arm.

Users arrive by ``--stages`` (``"0:50,20:200"``: 50 users from t=0 s, 200 from t=20 s), each
stage spawned at ``--arrival-rate`` users/s; with ``--stagger`` each new user first waits a
uniform random part of one light-load session cycle (7 x think), so a sweep point reaches its
steady state sooner; without it (the flash crowd) every new user starts at once. The run
stops at ``--run-for`` seconds.

Every request and every session end is one JSON line in ``--events`` (epoch seconds), counted
by :mod:`bench.admission.counting`:
``{"k":"req","u":user,"s":session,"n":page number,"t0":start,"t1":end,"st":status,"r":result}``
``{"k":"ses","u":user,"s":session,"t0":start,"t1":end,"r":"completed"|"failed","n":page,"why":reason}``
plus ``{"k":"stage","t":epoch,"users":n}`` when a stage begins.
"""

from __future__ import annotations

import json
import random
import time
from itertools import count
from typing import IO, Any

import gevent
from locust import FastHttpUser, LoadTestShape, events, task

from bench.admission.load import parse_stages
from bench.admission.pages import PAGES

_OUT: IO[str] | None = None
_IDS = count(1)


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:  # noqa: ANN001 - locust's argparse wrapper
    parser.add_argument("--think", type=float, default=0.3, help="think time after every page, seconds")
    parser.add_argument("--client-timeout", type=float, default=6.0, help="a request unanswered this long fails")
    parser.add_argument("--events", type=str, default="", help="JSON-lines file of requests and sessions")
    parser.add_argument("--stages", type=str, default="0:10", help="start:users,... (seconds from the start)")
    parser.add_argument("--run-for", type=float, default=30.0, help="seconds until the clients stop")
    parser.add_argument("--arrival-rate", type=float, default=100.0, help="users started per second")
    parser.add_argument("--stagger", action="store_true", help="each new user first waits a random part of a cycle")


def _emit(record: dict[str, Any]) -> None:
    if _OUT is not None:
        _OUT.write(json.dumps(record, separators=(",", ":")) + "\n")


@events.init.add_listener
def _init(environment, **_: Any) -> None:  # noqa: ANN001
    global _OUT
    opts = environment.parsed_options
    if opts is None:
        return
    SessionClient.network_timeout = opts.client_timeout
    SessionClient.connection_timeout = opts.client_timeout
    if opts.events:
        _OUT = open(opts.events, "a", buffering=1 << 16)  # noqa: SIM115 - closed at quitting


@events.quitting.add_listener
def _quit(**_: Any) -> None:
    if _OUT is not None:
        _OUT.flush()
        _OUT.close()


class Stages(LoadTestShape):
    """Users per ``--stages``, until ``--run-for``."""

    _stages: list[tuple[float, int]] | None = None
    _announced = -1

    def tick(self) -> tuple[int, float] | None:
        assert self.runner is not None
        opts: Any = self.runner.environment.parsed_options
        if self._stages is None:
            self._stages = parse_stages(opts.stages)
        t = self.get_run_time()
        if t >= opts.run_for:
            return None
        i = max(k for k, (start, _) in enumerate(self._stages) if start <= t)
        if i != self._announced:
            self._announced = i
            _emit({"k": "stage", "t": time.time(), "users": self._stages[i][1]})
        return self._stages[i][1], opts.arrival_rate


class SessionClient(FastHttpUser):
    """One browser running the paper's session chain, retrying from the start on failure."""

    concurrency = 1  # one keep-alive connection, like one browser tab
    network_timeout = 6.0
    connection_timeout = 6.0
    max_retries = 0
    wait_time = staticmethod(lambda: 0.0)  # the think times are inside the session

    def on_start(self) -> None:
        self.uid = next(_IDS)
        opts = self.environment.parsed_options
        if opts.stagger:
            gevent.sleep(random.uniform(0, len(PAGES) * opts.think))

    def _get(self, path: str, name: str, timeout: float) -> tuple[int, str]:
        """(status, result) with result ok | timeout | refused (503) | http (other status) | conn."""
        with self.client.get(path, name=name, catch_response=True) as resp:
            status = int(resp.status_code or 0)
            if status == 200:
                resp.success()
                return status, "ok"
            resp.failure(f"status {status}")
            if status == 0:
                err = repr(resp.error).lower()
                return 0, "timeout" if ("timeout" in err or "timed out" in err) else "conn"
            return status, "refused" if status == 503 else "http"

    @task
    def session(self) -> None:
        opts = self.environment.parsed_options
        sid = next(_IDS)
        self.client.cookiejar.clear()
        started = time.time()
        for page in PAGES:
            t0 = time.time()
            status, result = self._get(page.path, page.name, opts.client_timeout)
            t1 = time.time()
            if result == "ok" and t1 - t0 > opts.client_timeout:
                result = "timeout"  # answered, but after the user had given up
            _emit({"k": "req", "u": self.uid, "s": sid, "n": page.number, "t0": t0, "t1": t1, "st": status, "r": result})
            if result != "ok":
                _emit({"k": "ses", "u": self.uid, "s": sid, "t0": started, "t1": t1, "r": "failed",
                       "n": page.number, "why": result})
                self._drop_connection()
                gevent.sleep(opts.think)
                return
            if page.logout:
                _emit({"k": "ses", "u": self.uid, "s": sid, "t0": started, "t1": t1, "r": "completed", "n": page.number})
            gevent.sleep(opts.think)

    def _drop_connection(self) -> None:
        """A user who gives up (or sees an error page) starts over on a fresh connection."""
        try:
            self.client.client.close()
        except Exception:  # noqa: BLE001, S110 - already closed is fine
            pass
