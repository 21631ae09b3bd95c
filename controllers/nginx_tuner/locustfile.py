"""Locust load profile for the keepalive sweep: many clients that THINK between requests.

Run only in a child process (``trial.run_load`` does): importing locust monkey-patches the
standard library with gevent.

Why this shape: the paper ran 10 users without think time, so every connection was busy
all the time and ``keepalive_timeout`` never came into play (an idle timer that never
expires). What the setting really trades is visible only with idle gaps:
- each simulated user keeps ONE keepalive connection (``concurrency = 1``) and waits a
  random think time (``--think-min``..``--think-max`` seconds, uniform) between requests;
- when the think time is shorter than ``keepalive_timeout`` the connection is reused: the
  idle connection costs nginx memory (and a connection slot) while the user thinks;
- when it is longer, nginx has closed the connection and the next request pays a new TCP
  handshake (and a TLS one on a real site): a response-time cost.
So the think-time range against the candidate grid decides what the sweep can detect; use
many users (hundreds) so idle connections add up to a measurable amount of memory.

Extra command-line options (Locust's own parser, so ``--help`` lists them):
``--think-min``, ``--think-max`` (seconds) and ``--target-path`` (default ``/``; a comma list
such as ``/index.html,/index.css`` is one page view: its paths fetched back to back on the same
connection, then the think time).
"""

from __future__ import annotations

import random

from locust import FastHttpUser, events, task


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:  # noqa: ANN001 - locust's argparse wrapper
    parser.add_argument("--think-min", type=float, default=1.0, help="shortest think time between requests, seconds")
    parser.add_argument("--think-max", type=float, default=5.0, help="longest think time between requests, seconds")
    parser.add_argument("--target-path", type=str, default="/", help="path(s) of one page view, comma-separated")


class ThinkingClient(FastHttpUser):
    """A browser-like client: one persistent connection, a pause to read between pages."""

    concurrency = 1  # one keepalive connection per user, like one browser tab
    connection_timeout = 10.0
    network_timeout = 10.0

    def wait_time(self) -> float:
        opts = self.environment.parsed_options
        lo, hi = opts.think_min, opts.think_max
        return random.uniform(min(lo, hi), max(lo, hi))

    @task
    def page(self) -> None:
        for path in self.environment.parsed_options.target_path.split(","):
            self.client.get(path, name=path)
