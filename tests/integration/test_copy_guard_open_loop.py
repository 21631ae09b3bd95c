"""The open-loop load of the copy-guard bench (issue 16): Locust with ``--shop-schedule``
offers requests at the scheduled rate whatever the site does. Against a fast site the served
rate follows the schedule step; against a site that never answers in time the arrivals do not
slow down: each request fails at the client timeout, and arrivals beyond ``max_outstanding``
fail at once (dropped), so the visitors' demand is the schedule's, not the site's pace."""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from controllers.copy_guard import calibrate
from controllers.copy_guard.calibrate import Request, ShopLoad
from promreflex.proc import free_port

pytestmark = pytest.mark.integration


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.startswith("/slow"):
            time.sleep(4)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture
def site() -> Iterator[str]:
    srv = _Server(("127.0.0.1", free_port()), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


def test_open_loop_follows_the_schedule_from_its_epoch(site: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Locust takes 1-3 s to start, more on a loaded machine; arrivals it missed would all go out
    # at once into one second. The lead is the product's knob for that: 10 s here, not 4.
    monkeypatch.setattr(calibrate, "OPEN_LOOP_LEAD_S", 10.0)
    load = ShopLoad(site, 0, 1, 4, profile=[Request("GET", "/p/{id}", 1.0, None)], schedule=[(0.0, 10.0), (2.0, 30.0)],
                    request_timeout=2).start()
    run = load.wait()
    assert load.epoch == pytest.approx(load.started + 10.0)
    per = run.per_second()
    first = min(per)
    assert first >= int(load.epoch) - 1  # nothing before the schedule's 0 s
    # 10 req/s over [0, 2) s, 30 req/s over [2, 4) s of the schedule: whole seconds inside each step
    slow = [per.get(int(load.epoch) + k, 0) for k in (1,)]
    fast = [per.get(int(load.epoch) + k, 0) for k in (3,)]
    # (completions per second: a stall of a few hundred ms at a second's edge moves a few across
    # it; these bands still keep the two steps apart)
    assert all(7 <= n <= 13 for n in slow), per
    assert all(23 <= n <= 37 for n in fast), per
    assert run.failed == 0


def test_a_site_that_never_answers_in_time_does_not_slow_the_arrivals(site: str) -> None:
    run = ShopLoad(site, 0, 1, 3, profile=[Request("GET", "/slow", 1.0, None)], schedule=[(0.0, 20.0)],
                   request_timeout=1, max_outstanding=10).start().wait()
    # 20 req/s for 3 s: ~60 arrivals, none served; at most 10 out at once, each out for 1 s (the
    # timeout), so about half fail as timeouts and the rest are dropped at once.
    assert run.ok == 0
    assert 45 <= run.failed <= 75, (run.failed, run.errors)
    assert any(k.startswith("Dropped") for k in run.errors), run.errors
    assert any("timed out" in k or "Timeout" in k for k in run.errors), run.errors
