"""One ``promreflex copy`` process: the :class:`~controllers.copy_guard.copier.Copier` in the
main thread, its ``/metrics`` and control endpoint in a server thread (an asyncio loop serving
through :mod:`promreflex.httpd`, so it has the same header and body timeouts, connection cap
and no-draining rule as every promreflex server), and its registry entry.

Control endpoint (``--web.listen-address``, default an ephemeral loopback port):

    GET  /metrics                       progress and state (Prometheus text format)
    GET  /status                        the same as JSON
    GET  /-/ready
    POST /pause?lease=SECONDS           pause until resumed or the lease runs out (renew by
                                        pausing again)
    POST /throttle?bytes_per_second=N&lease=SECONDS
    POST /throttle?share=S&lease=SECONDS  run S (0 < S <= 1) of the copy's own speed (the
                                        adaptive throttle of the copy-guard action)
    POST /resume

Control commands need ``Authorization: Bearer <token>`` when a token file is given (mode 0600:
a group- or world-readable one is refused), and a token file is required to listen beyond
loopback (like the controller). The registry entry names the control URL only, never the token
or its file: the copy-guard route sends the token of its own ``control_token_file`` (give it
the same token), and calls a non-loopback URL only when its ``control_hosts`` names the host.
Exit status: 0 done, 1 failed (also: the journal beside DST cannot be read or written), 3
stopped (resumable: run the same command again), 2 unusable arguments; as rsync: 23 done, but
some files or folders could not be read (each named in an error line), 24 done, but some source
files vanished before they were copied (each named in a warning line; 23 wins over 24).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from controllers.copy_guard.copier import COMMANDS, Control, CopyCollector, Copier, CopyError, JournalError, Stopped
from controllers.copy_guard.registry import Entry, Registry, new_id, process_start
from promreflex.config import is_loopback, split_host_port
from promreflex.errors import UserError
from promreflex.httpd import (
    ADDRESSES, BodyError, LiveToken, add_standard_routes, discard_small_body, read_body, serving,
)

log = logging.getLogger("promreflex.copy")

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
EXIT_PARTIAL, EXIT_VANISHED = 23, 24  # rsync's codes: some files not read / some source files vanished
MAX_BODY = 4096


@dataclass
class CopyService:
    copier: Copier
    control: Control
    site: str
    copy_id: str
    token: str | LiveToken = ""  # (a LiveToken: read again when its file changes)
    registry: Registry | None = None
    listen: str = "127.0.0.1:0"

    def __post_init__(self) -> None:
        self.requests = {(c, r): 0 for c in COMMANDS for r in ("ok", "error", "unauthorized")}
        self.metrics = CollectorRegistry()
        self.metrics.register(CopyCollector(lambda: self.copier, self.control, self.site, self.copy_id, self.requests))
        self.entry: Entry | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ HTTP
    def status(self) -> dict[str, Any]:
        p = self.copier.progress
        ctl = self.control.snapshot()
        return {"id": self.copy_id, "site": self.site, "src": str(self.copier.src), "dst": str(self.copier.dst),
                "state": p.state if p.state in ("done", "failed") else ctl["mode"], "done_bytes": p.done_bytes,
                "total_bytes": p.total_bytes, "done_files": p.done_files, "total_files": p.total_files,
                "io": self.copier.io_effective, "lease_left": round(ctl["lease_left"], 3), "rate": ctl["rate"],
                "share": ctl["share"], "share_wait_seconds": round(ctl["share_wait_seconds"], 3),
                "work_seconds": round(ctl["work_seconds"], 3),
                "paused_seconds": round(ctl["paused_seconds"], 3), "pauses": ctl["pauses"],
                "lease_expiries": ctl["lease_expiries"], "error": p.error,
                "not_copied": {"special": len(self.copier.plan.skipped), "unreadable": len(p.unreadable),
                               "vanished": len(p.vanished)}, "kept_changing": len(p.kept_changing)}

    def command(self, name: str, query: dict[str, str], auth: str) -> tuple[int, dict[str, Any]]:
        if name not in COMMANDS:
            return 404, {"error": f"unknown command {name!r} (pause, resume, throttle)"}
        if not self.authorized(auth):
            self.requests[(name, "unauthorized")] += 1
            return 401, {"error": "a bearer token is required"}
        try:
            lease = float(query["lease"]) if "lease" in query else None
            if name == "pause":
                self.control.pause(lease)
            elif name == "throttle":
                if ("share" in query) == ("bytes_per_second" in query):
                    raise ValueError("throttle takes either share (0 < share <= 1) or bytes_per_second")
                if "share" in query:
                    self.control.throttle(share=float(query["share"]), lease=lease)
                else:
                    self.control.throttle(float(query["bytes_per_second"]), lease)
            else:
                self.control.resume()
        except (ValueError, IndexError) as e:
            self.requests[(name, "error")] += 1
            return 400, {"error": str(e)}
        self.requests[(name, "ok")] += 1
        return 200, self.status()

    def authorized(self, auth: str) -> bool:
        token = self.token.value if isinstance(self.token, LiveToken) else self.token
        return not token or hmac.compare_digest(auth.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode())

    def app(self) -> web.Application:
        async def status(_: web.Request) -> web.Response:
            return web.json_response(self.status())

        async def command(request: web.Request) -> web.Response:
            name = request.match_info["command"]
            auth = request.headers.get("Authorization", "")
            if name not in COMMANDS or not self.authorized(auth):
                code, body = self.command(name, dict(request.query), auth)
                await discard_small_body(request)
                resp = web.json_response(body, status=code)
                if not request.content.is_eof():
                    resp.force_close()
                return resp
            try:
                await read_body(request, MAX_BODY)  # nothing is expected; read it within the limits
            except BodyError as e:
                resp = web.json_response({"error": str(e)}, status=e.status)
                resp.force_close()
                return resp
            code, body = self.command(name, dict(request.query), auth)
            return web.json_response(body, status=code)

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/status", status)
        app.router.add_post("/{command}", command)
        return add_standard_routes(app, self.metrics, "promreflex copy")

    def start_server(self) -> str:
        """Serve the control endpoint in a thread; return its URL (``http://HOST:PORT``)."""
        host, _ = split_host_port(self.listen)
        if not is_loopback(host) and not (self.token.value if isinstance(self.token, LiveToken) else self.token):
            raise ValueError(f"{self.listen} is beyond loopback: give --web.token-file")
        started = threading.Event()
        result: dict[str, Any] = {}

        async def main() -> None:
            self._stop = asyncio.Event()
            app = self.app()
            try:
                async with serving(self.listen, app):
                    h, p = app[ADDRESSES][0][:2]
                    result["url"] = f"http://{'[' + h + ']' if ':' in h else h}:{p}"
                    started.set()
                    await self._stop.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the starting thread
                result["error"] = e
                started.set()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="copy-http", daemon=True)
        self._thread.start()
        started.wait()
        if "error" in result:
            raise result["error"]
        return str(result["url"])

    def stop_server(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already ended
                pass
        if thread is not None:
            thread.join(timeout=10)

    # ------------------------------------------------------------------ run
    def run(self, linger: float = 0.0) -> int:
        url = self.start_server()
        if self.registry is not None:
            self.entry = Entry(id=self.copy_id, kind="copier", pid=os.getpid(), pid_start=process_start(os.getpid()),
                               site=self.site, src=str(self.copier.src), dst=str(self.copier.dst), control_url=url)
            self.registry.add(self.entry)
        p = self.copier.progress
        log.info("copy %s: %s -> %s, %d files, %d bytes (%d already done), io=%s, control %s",
                 self.copy_id, self.copier.src, self.copier.dst, p.total_files, p.total_bytes, p.resumed_from,
                 self.copier.io, url)
        try:
            self.copier.run()
            code = EXIT_PARTIAL if p.unreadable else EXIT_VANISHED if p.vanished else EXIT_DONE
            log.info("copy %s done: %d bytes, paused %.1fs", self.copy_id, p.done_bytes,
                     self.control.snapshot()["paused_seconds"])
            skipped = self.copier.plan.skipped
            if skipped:
                log.warning("copy %s: %d special files (sockets, FIFOs, devices) or leftover part files not copied",
                            self.copy_id, len(skipped))
            if p.kept_changing:
                log.warning("copy %s: %d files kept changing and were copied as they were (not a consistent "
                            "snapshot): %s", self.copy_id, len(p.kept_changing), ", ".join(p.kept_changing[:10]))
            if p.vanished:
                log.warning("copy %s: %d source files vanished before they were copied (exit %d): %s",
                            self.copy_id, len(p.vanished), code, ", ".join(p.vanished[:10]))
            if p.unreadable:
                log.error("copy %s: some files could not be copied (exit %d): %s", self.copy_id, code,
                          "; ".join(p.unreadable[:10]))
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
    try:
        token = LiveToken(token_file, "--web.token-file")
    except UserError as e:
        print(f"copy: {e}", file=sys.stderr)
        return EXIT_USAGE
    control = Control(rate_limit=rate_limit, max_lease=max_lease)
    try:
        copier = Copier(src, dst, control=control, chunk_size=chunk_size, io=io,
                        checkpoint_bytes=checkpoint_bytes, fresh=fresh)
    except JournalError as e:  # (not the arguments: the place beside DST)
        print(f"copy: {e}", file=sys.stderr)
        return EXIT_FAILED
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
        return service.run(linger=linger)
    except (OSError, ValueError, UserError) as e:
        print(f"copy: {e}", file=sys.stderr)
        return EXIT_USAGE
