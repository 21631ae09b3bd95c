"""Locust profile for the copy guard: shoppers arriving at a fixed total rate.

Run only in a child process (``controllers.copy_guard.calibrate.run_shop_load`` does): importing
locust monkey-patches the standard library with gevent.

- ``--shop-rate`` requests per second in total, spread over the ``-u`` users: each user paces
  itself to one request every ``users / rate`` seconds (like the paper's "100 accesses per
  second"), with a random phase so arrivals do not come in lock-step. When the site answers
  slower than the pacing, a user sends its next request as soon as the previous one returns:
  the site is then saturated and the served rate is its capacity.
- ``--checkout-share`` of the requests are ``POST /checkout`` (an fsync'd commit on the site),
  the rest ``GET /product/<random id>`` (uncached reads).
- ``--timeline-out FILE``: at exit, JSON ``{"bin_s": 0.1, "bins": {"<unix time // 0.1>": [ok,
  failed]}, "totals": {"ok": n, "failed": n}}``, completions counted by completion time in
  100 ms bins: the per-second served RPS the calibration needs, and the finer timeline the
  benchmark measures reaction times with (Locust's CSV history is rounded and comes up short).
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

import gevent
from locust import FastHttpUser, events, task

BIN_S = 0.1
_bins: dict[int, list[int]] = defaultdict(lambda: [0, 0])


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:  # noqa: ANN001 - locust's argparse wrapper
    parser.add_argument("--shop-rate", type=float, default=100.0, help="total request rate to offer, per second")
    parser.add_argument("--checkout-share", type=float, default=0.1, help="share of requests that are POST /checkout")
    parser.add_argument("--product-count", type=int, default=10000, help="product ids drawn from 0..N-1")
    parser.add_argument("--timeline-out", type=str, default="", help="write per-second completions (JSON) here at exit")


@events.request.add_listener
def _count(request_type, name, response_time, response_length, exception=None, **_kw) -> None:  # noqa: ANN001
    _bins[int(time.time() / BIN_S)][1 if exception else 0] += 1


@events.quitting.add_listener
def _write_timeline(environment, **_kw) -> None:  # noqa: ANN001
    path = environment.parsed_options.timeline_out if environment.parsed_options else ""
    if not path:
        return
    ok = sum(v[0] for v in _bins.values())
    failed = sum(v[1] for v in _bins.values())
    with open(path, "w") as f:
        json.dump({"bin_s": BIN_S, "bins": {str(k): v for k, v in sorted(_bins.items())},
                   "totals": {"ok": ok, "failed": failed}}, f)


class Shopper(FastHttpUser):
    concurrency = 1
    connection_timeout = 10.0
    network_timeout = 10.0

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        users = max(1, self.environment.runner.target_user_count or 1)
        self.period = users / max(opts.shop_rate, 1e-6)
        gevent.sleep(random.uniform(0, self.period))  # random phase
        self.next_at = time.monotonic()

    def wait_time(self) -> float:
        self.next_at += self.period
        now = time.monotonic()
        if self.next_at < now:  # fell behind (slow site): go now, do not try to catch up in a burst
            self.next_at = now
        return self.next_at - now

    @task
    def shop(self) -> None:
        opts = self.environment.parsed_options
        if random.random() < opts.checkout_share:
            self.client.post("/checkout", data="cart=1&qty=1", name="checkout",
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
        else:
            self.client.get(f"/product/{random.randrange(opts.product_count)}", name="product")
