"""A loopback /metrics for tests that run a real Prometheus against made-up exporters: it answers
``body`` (a string, or a function called at each scrape) and can be told to fail scrapes the way
a real exporter does (503: Prometheus records up 0 and staleness markers for its series)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable


class MetricsServer:
    """Serves ``body`` on 127.0.0.1 (``addr``: HOST:PORT); ``fail_next`` scrapes from now on
    answer 503, or every one while ``dead``; ``failed`` counts the 503s. ``shutdown()`` stops it."""

    def __init__(self, body: str | Callable[[], str]) -> None:
        self.body = body if callable(body) else (lambda: body)
        self.fail_next = 0
        self.dead = False
        self.failed = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if owner.dead or owner.fail_next > 0:
                    owner.fail_next = max(0, owner.fail_next - 1)
                    owner.failed += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = owner.body().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.addr = f"127.0.0.1:{self._server.server_address[1]}"

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
