"""``promreflex admission proxy`` (the admission proxy in front of an app) and
``promreflex admission keygen`` (create or rotate the cookie signing keys).

:func:`register` adds them to a CLI's subcommands; ``python -m controllers.admission`` runs the
same commands without the capability being installed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from promreflex.logs import setup as setup_logging
from controllers.admission.config import AdmissionSection, load_section
from controllers.admission.cookies import append_key
from promreflex.errors import UserError
from promreflex.httpd import Limits, LiveToken, serving, stop_on_signals

log = logging.getLogger("promreflex.admission")


def _raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    want = min(want, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 65536


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The proxy's event loop (``admission.event_loop``): uvloop's, or None for asyncio's own
    (also when uvloop is not installed: said once, then the proxy runs as before). uvloop does the
    loop's polling, timers and socket I/O in C (libuv), the part of a proxied request that is
    neither aiohttp's nor the proxy's: measured in docs/measured/admission.md."""
    if choice != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("admission.event_loop is uvloop but uvloop is not installed: running on asyncio's loop")
        return None
    return uvloop.new_event_loop


async def serve(cfg: AdmissionSection, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
    from controllers.admission.proxy import SHUTDOWN_TIMEOUT, AdmissionProxy, load_ring

    ring = load_ring(cfg.session.key_file)
    token = LiveToken(cfg.control.token_file, "admission control.token_file")  # (read again when it changes)
    proxy = AdmissionProxy(cfg, ring, token=token)
    nofile = _raise_nofile()
    # Requests wait in queues holding their connection: leave room for every queue to fill.
    limits = Limits(max_connections=max(1024, min(nofile - 256, 16384)))
    stop = stop_on_signals(stop)
    loop = asyncio.get_running_loop()
    def reload() -> None:
        # Always handled: SIGHUP is what `systemctl reload` and logrotate send, and its default
        # action ended a proxy without a key file (every queued and in-flight request cut).
        if cfg.session.key_file is None:
            log.info("SIGHUP: no session.key_file to reload (signing with this run's ephemeral key)")
            return
        try:
            proxy.reload_keys(load_ring(cfg.session.key_file))
            log.info("session keys reloaded from %s", cfg.session.key_file)
        except UserError as e:
            log.error("keeping the old keys: %s", e)
    try:
        loop.add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError):
        pass
    await proxy.start()
    # Fewer, later collections: the proxy allocates per request and keeps little; a full
    # collection of a big heap in the middle of a request is the p99's worst enemy.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    try:
        async with serving(cfg.listen_address, proxy.app(), limits, registry=proxy.registry, **proxy.server_kwargs()), \
                serving(cfg.control.listen_address, proxy.control_app()):
            log.info("admission proxy on http://%s -> %s; control and /metrics on http://%s; event loop %s",
                     cfg.listen_address, cfg.upstream, cfg.control.listen_address, type(loop).__module__.split(".")[0])
            if ready is not None:
                ready.set()
            await stop.wait()
            proxy.drop_lingering()  # before the server waits for its handlers
            log.info("stopping: no new connections; waiting for %d request(s) in progress (queued, at the app or "
                     "streaming), at most %gs, then they are cut", proxy.in_progress, SHUTDOWN_TIMEOUT)
    except OSError as e:
        raise UserError(f"admission proxy: cannot listen: {e.strerror or e}") from None
    finally:
        await proxy.close()
    log.info("admission proxy stopped")
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, key in (("upstream", "upstream"), ("listen_address", "listen_address"),
                      ("control_listen_address", "control.listen_address"), ("key_file", "session.key_file"),
                      ("control_token_file", "control.token_file")):
        value = getattr(args, flag)
        if value is not None:
            out[key] = str(value)
    if args.no_session_scheduler:
        out["session_scheduler.enabled"] = False
    if args.no_page_scheduler:
        out["page_scheduler.enabled"] = False
    if args.no_uvloop:
        out["event_loop"] = "asyncio"
    return out


def cmd_proxy(args: argparse.Namespace) -> int:
    cfg = load_section(args.config_file, _overrides(args))
    setup_logging(args.log_level)
    try:
        with asyncio.Runner(loop_factory=loop_factory(cfg.event_loop)) as runner:
            return runner.run(serve(cfg))
    except KeyboardInterrupt:
        return 130


def cmd_keygen(args: argparse.Namespace) -> int:
    folder = Path(args.key_file).parent
    if not folder.exists():  # (README: /etc/promreflex/admission-keys, a folder that is not there yet)
        try:
            folder.mkdir(mode=0o700, parents=True)
        except OSError as e:
            raise UserError(f"cannot create the key file's folder {folder}: {e.strerror or e}") from None
        print(f"created folder {folder} (mode 0700)")
    try:
        kid = append_key(args.key_file)
    except OSError as e:
        raise UserError(f"cannot write key file {args.key_file}: {e.strerror or e}") from None
    print(f"appended key {kid} to {args.key_file} (it signs from the next start or SIGHUP; the older keys "
          "still verify: remove them after session.max_age)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("admission", help="session admission proxy (page and session schedulers)",
                              description=__doc__.split("\n\n")[0].replace("``", ""))  # (no RST in --help)
    sub = p.add_subparsers(dest="admission_command", required=True)
    px = sub.add_parser("proxy", help="run the admission proxy in front of an app (nginx -> proxy -> app)")
    px.add_argument("--config.file", dest="config_file", type=Path, default=None,
                    help="YAML file; its admission: section is read (defaults without it)")
    px.add_argument("--upstream", default=None, help="the app, http://HOST:PORT (admission.upstream)")
    px.add_argument("--web.listen-address", dest="listen_address", default=None,
                    help="where nginx sends the traffic (admission.listen_address, default 127.0.0.1:8088)")
    px.add_argument("--control.listen-address", dest="control_listen_address", default=None,
                    help="/metrics and the control API (admission.control.listen_address, default 127.0.0.1:9188)")
    px.add_argument("--control.token-file", dest="control_token_file", type=Path, default=None,
                    help="bearer token for the control API (required beyond loopback)")
    px.add_argument("--key-file", dest="key_file", type=Path, default=None,
                    help="cookie signing keys, one per line, mode 0600 (admission.session.key_file)")
    px.add_argument("--no-session-scheduler", action="store_true", help="admit every new session at once")
    px.add_argument("--no-page-scheduler", action="store_true", help="no concurrency limit per page class")
    px.add_argument("--no-uvloop", action="store_true",
                    help="run on asyncio's own event loop instead of uvloop (admission.event_loop: asyncio)")
    px.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])
    px.set_defaults(func=cmd_proxy)
    kg = sub.add_parser("keygen", help="append a new signing key to the key file (created 0600, its folder 0700)")
    kg.add_argument("--key-file", dest="key_file", type=Path, required=True)
    kg.set_defaults(func=cmd_keygen)
    return p
