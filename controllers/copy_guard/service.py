"""One ``promreflex copy`` process: the :class:`~controllers.copy_guard.copier.Copier` in the
main thread, its ``/metrics`` and control endpoint in a server thread, and its registry entry.

Control endpoint (``--web.listen-address``, default an ephemeral loopback port):

    GET  /metrics                       progress and state (Prometheus text format)
    GET  /status                        the same as JSON
    GET  /-/ready
    POST /pause?lease=SECONDS           pause until resumed or the lease runs out (renew by
                                        pausing again)
    POST /throttle?bytes_per_second=N&lease=SECONDS
    POST /resume

Control commands need ``Authorization: Bearer <token>`` when a token file is given, and a token
file is required to listen beyond loopback (like the controller). Exit status: 0 done,
1 failed, 3 stopped (resumable: run the same command again), 2 unusable arguments.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controllers.copy_guard.copier import COMMANDS, Control, CopyCollector, Copier, CopyError, Stopped
from controllers.copy_guard.registry import Entry, Registry, new_id, process_start
from promreflex.config import is_loopback, split_host_port

log = logging.getLogger("promreflex.copy")

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
MAX_BODY = 4096


@dataclass
class CopyService:
    copier: Copier
    control: Control
    site: str
    copy_id: str
    token: str = ""
    registry: Registry | None = None
    listen: str = "127.0.0.1:0"

    def __post_init__(self) -> None:
        self.requests = {(c, r): 0 for c in COMMANDS for r in ("ok", "error", "unauthorized")}
        self.metrics = CollectorRegistry()
        self.metrics.register(CopyCollector(lambda: self.copier, self.control, self.site, self.copy_id, self.requests))
        self.server: ThreadingHTTPServer | None = None
        self.entry: Entry | None = None

    # ------------------------------------------------------------------ HTTP
    def status(self) -> dict[str, Any]:
        p = self.copier.progress
        ctl = self.control.snapshot()
        return {"id": self.copy_id, "site": self.site, "src": str(self.copier.src), "dst": str(self.copier.dst),
                "state": p.state if p.state in ("done", "failed") else ctl["mode"], "done_bytes": p.done_bytes,
                "total_bytes": p.total_bytes, "done_files": p.done_files, "total_files": p.total_files,
                "io": self.copier.io_effective, "lease_left": round(ctl["lease_left"], 3), "rate": ctl["rate"],
                "paused_seconds": round(ctl["paused_seconds"], 3), "pauses": ctl["pauses"],
                "lease_expiries": ctl["lease_expiries"], "error": p.error}

    def command(self, name: str, query: dict[str, list[str]], auth: str) -> tuple[int, dict[str, Any]]:
        if name not in COMMANDS:
            return 404, {"error": f"unknown command {name!r} (pause, resume, throttle)"}
        if self.token and not hmac.compare_digest(auth, f"Bearer {self.token}"):
            self.requests[(name, "unauthorized")] += 1
            return 401, {"error": "a bearer token is required"}
        try:
            lease = float(query["lease"][0]) if "lease" in query else None
            if name == "pause":
                self.control.pause(lease)
            elif name == "throttle":
                self.control.throttle(float(query.get("bytes_per_second", [""])[0]), lease)
            else:
                self.control.resume()
        except (ValueError, IndexError) as e:
            self.requests[(name, "error")] += 1
            return 400, {"error": str(e)}
        self.requests[(name, "ok")] += 1
        return 200, self.status()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "promreflex-copy"

            def log_message(self, fmt: str, *args: Any) -> None:  # quiet
                log.debug(fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                path = urlsplit(self.path).path
                if path == "/metrics":
                    self._send(200, generate_latest(service.metrics), CONTENT_TYPE_LATEST)
                elif path == "/status":
                    self._send(200, json.dumps(service.status()).encode())
                elif path in ("/-/ready", "/-/healthy"):
                    self._send(200, b"ok\n", "text/plain")
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._send(413, b'{"error": "body too large"}')
                    return
                self.rfile.read(length)
                code, body = service.command(url.path.strip("/"), parse_qs(url.query),
                                             self.headers.get("Authorization", ""))
                self._send(code, json.dumps(body).encode())

        return Handler

    def start_server(self) -> str:
        host, port = split_host_port(self.listen)
        if not is_loopback(host) and not self.token:
            raise ValueError(f"{self.listen} is beyond loopback: give --web.token-file")
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="copy-http", daemon=True).start()
        h, p = self.server.server_address[:2]
        return f"http://{h}:{p}"

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    # ------------------------------------------------------------------ run
    def run(self, linger: float = 0.0, token_file: str | None = None) -> int:
        url = self.start_server()
        if self.registry is not None:
            self.entry = Entry(id=self.copy_id, kind="copier", pid=os.getpid(), pid_start=process_start(os.getpid()),
                               site=self.site, src=str(self.copier.src), dst=str(self.copier.dst),
                               control_url=url, token_file=token_file)
            self.registry.add(self.entry)
        p = self.copier.progress
        log.info("copy %s: %s -> %s, %d files, %d bytes (%d already done), io=%s, control %s",
                 self.copy_id, self.copier.src, self.copier.dst, p.total_files, p.total_bytes, p.resumed_from,
                 self.copier.io, url)
        try:
            self.copier.run()
            code = EXIT_DONE
            log.info("copy %s done: %d bytes, paused %.1fs", self.copy_id, p.done_bytes,
                     self.control.snapshot()["paused_seconds"])
        except Stopped:
            code = EXIT_STOPPED
            log.info("copy %s stopped at %d of %d bytes; run the same command again to continue",
                     self.copy_id, p.done_bytes, p.total_bytes)
        except CopyError as e:
            code = EXIT_FAILED
            log.error("copy %s failed: %s", self.copy_id, e)
        finally:
            if self.registry is not None:
                self.registry.remove(self.copy_id)
        if linger > 0 and code != EXIT_STOPPED:
            deadline = time.monotonic() + linger  # keep /metrics up so the last state is scraped
            while time.monotonic() < deadline and not self.control.stopping:
                time.sleep(0.05)
        self.stop_server()
        return code


def run_copy(src: str, dst: str, *, site: str = "shop", registry_dir: str | Path | None = None,
             listen: str = "127.0.0.1:0", token_file: str | None = None, chunk_size: int = 1 << 20,
             rate_limit: float = 0.0, io: str = "fadvise", checkpoint_bytes: int = 16 << 20,
             max_lease: float = 600.0, fresh: bool = False, linger: float = 0.0, copy_id: str | None = None) -> int:
    """The ``promreflex copy`` command (blocking); returns the exit status."""
    token = ""
    if token_file:
        token = Path(token_file).read_text().strip()
        if not token:
            print(f"copy: token file {token_file} is empty", file=sys.stderr)
            return EXIT_USAGE
    control = Control(rate_limit=rate_limit, max_lease=max_lease)
    try:
        copier = Copier(src, dst, control=control, chunk_size=chunk_size, io=io,
                        checkpoint_bytes=checkpoint_bytes, fresh=fresh)
    except (CopyError, ValueError) as e:
        print(f"copy: {e}", file=sys.stderr)
        return EXIT_USAGE
    service = CopyService(copier, control, site, copy_id or new_id(), token,
                          Registry(registry_dir) if registry_dir else None, listen)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping at the next chunk (resumable)", signum)
        control.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        return service.run(linger=linger, token_file=token_file)
    except (OSError, ValueError) as e:
        print(f"copy: {e}", file=sys.stderr)
        return EXIT_USAGE
