"""The webhook receiver: HTTP in front of the engine.

It answers once the notification's effect is recorded (the engine acts asynchronously),
rejects anything that is not an Alertmanager v4 payload with a 4xx and a reason, and never
answers 5xx to bad input. What it does with hostile or broken input:

- Bad bodies are classified, counted in ``promreflex_controller_payload_rejections_total`` by
  reason and written to the audit log as ``rejected``: invalid UTF-8, JSON nested deeper than
  the parser's recursion limit or an integer of more than 4,300 digits (400 ``not_json``), a
  timestamp that leaves the representable range when converted to UTC, or anything else the
  model refuses (422 ``invalid_payload``), a body above ``max_body_bytes`` (413 ``too_large``,
  refused from ``Content-Length`` before a byte is read, and counted after decompression), a
  body not received within 10 s (408 ``timeout``), a body whose ``Content-Encoding`` does not
  decode (400 ``bad_body``).
- The bearer token (``token_file``) is required on ``/webhook`` *and* ``/api/v1/state``; a
  missing, wrong or undecodable (non-UTF-8) ``Authorization`` header is a 401
  ``unauthorized``, answered before the body is read, and the connection is then closed.
- Anything else that goes wrong while handling ``/webhook`` is our bug or our environment (a
  full disk), not the sender's: it is answered 500 ``internal_error``, counted in
  ``promreflex_controller_webhook_requests_total{code="500"}``, audited as ``error`` and
  logged with its traceback. 500 rather than 4xx on purpose: Alertmanager retries a 5xx and
  drops a 4xx, so a notification that met a transient failure of ours is delivered again.
- Slow and idle clients, the connection cap and the no-draining rule: see
  :mod:`promreflex.httpd` (header and body timeouts of 10 s, at most 1,024 connections and
  always below the open-file limit, the longest idle connection closed to admit a new one).

Start-up problems a user can fix (a busy port, a missing, empty, group- or world-readable
token file, an action's own checks) raise :class:`~promreflex.errors.UserError` with one line
that says what to do: :func:`preflight` checks the files (``check-config`` calls it too) and
:func:`serve` turns a failed bind into such an error.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from controllers.audit import AuditLog
from controllers.engine import Engine, bind_routes
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import AlertmanagerClient, PrometheusClient
from promreflex.config import ControllerConfig, split_host_port
from promreflex.errors import UserError
from promreflex.httpd import (
    BodyError, add_standard_routes, discard_small_body, read_body, read_token_file, serving, stop_on_signals,
)

log = logging.getLogger("promreflex.controller")

ENGINE = web.AppKey("engine", Engine)
METRICS = web.AppKey("metrics", ControllerMetrics)
REGISTRY = web.AppKey("registry", CollectorRegistry)
TOKEN = web.AppKey("token", str)
AUDIT = web.AppKey("audit", AuditLog)
MAX_BODY = web.AppKey("max_body", int)


def preflight(cfg: ControllerConfig) -> None:
    """Check what the controller needs from its environment before it starts; raise
    :class:`UserError` naming the first problem. ``serve`` calls it; so does ``check-config``
    (a configuration whose token file is missing is not OK). It does not bind the port: a
    check of a running controller's configuration must not fail because it runs."""
    read_token_file(cfg.token_file)
    for bound in bind_routes(cfg):
        check = getattr(bound.action, "preflight", None)
        if callable(check):
            check(bound.params)


def _reject(app: web.Application, status: int, reason: str, message: str, close: bool = False,
            **extra: Any) -> web.Response:
    app[METRICS].rejections.labels(reason).inc()
    app[AUDIT].write("rejected", code=status, reason=reason, message=message[:500])
    resp = web.json_response({"status": "rejected", "reason": reason, "message": message, **extra}, status=status)
    if close:
        resp.force_close()
    return resp


def _problems(err: ValidationError, limit: int = 20) -> list[str]:
    out = []
    for e in err.errors()[:limit]:
        loc = ".".join(str(p) for p in e["loc"]) or "(body)"
        out.append(f"{loc}: {e['msg']}")
    if len(err.errors()) > limit:
        out.append(f"... and {len(err.errors()) - limit} more")
    return out


def authorized(request: web.Request) -> bool:
    """True when no token is configured or the request carries it. A header that is not valid
    UTF-8 (aiohttp hands it over with surrogates) is simply not the token."""
    token = request.app[TOKEN]
    if not token:
        return True
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, f"Bearer {token}".encode())


async def _refuse(request: web.Request, status: int, reason: str, message: str) -> web.Response:
    """Refuse before the body was read: read a small body away (so the client sees the
    answer), leave a large one unread and close the connection after the answer."""
    await discard_small_body(request)
    return _reject(request.app, status, reason, message, close=not request.content.is_eof())


def _parse(body: bytes) -> Any:
    """The JSON of a body; ValueError (with a reason for the sender) when it is not JSON we
    can read: invalid UTF-8 or syntax, an integer beyond 4,300 digits, nesting deeper than the
    parser's recursion limit."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, integer digit limit
        raise ValueError(str(e)) from None


async def webhook(request: web.Request) -> web.Response:
    app = request.app
    if not authorized(request):
        return await _refuse(request, 401, "unauthorized", "a valid bearer token is required")
    ctype = request.content_type
    if ctype not in ("application/json", "application/octet-stream", "text/plain", ""):
        return await _refuse(request, 415, "unsupported_media_type", f"expected application/json, got {ctype}")
    try:
        body = await read_body(request, app[MAX_BODY])
    except BodyError as e:
        return _reject(app, e.status, e.reason, str(e), close=True)
    try:
        data = _parse(body)
    except ValueError as e:
        return _reject(app, 400, "not_json", f"body is not JSON: {e}")
    if not isinstance(data, dict):
        return _reject(app, 422, "invalid_payload", "the payload must be a JSON object")
    if data.get("version") != "4":
        version = data.get("version")
        shown = repr(version) if isinstance(version, (str, int, float, bool, type(None))) else type(version).__name__
        return _reject(
            app, 422, "invalid_payload",
            f"unsupported webhook version {shown[:40]}: only Alertmanager's version \"4\" is accepted",
        )
    try:
        payload = WebhookPayload.model_validate(data)
    except ValidationError as e:
        problems = _problems(e)
        return _reject(app, 422, "invalid_payload", "; ".join(problems), problems=problems)
    counts = await app[ENGINE].handle_payload(payload)
    return web.json_response({"status": "accepted", **counts})


async def state(request: web.Request) -> web.Response:
    """The engine's entries; needs the same bearer token as /webhook (it names alerts and
    routes)."""
    if not authorized(request):
        return web.json_response({"status": "rejected", "reason": "unauthorized",
                                  "message": "a valid bearer token is required"}, status=401)
    return web.json_response({"entries": request.app[ENGINE].snapshot()})


@web.middleware
async def count_codes(request: web.Request, handler):
    """Count /webhook answers by code; an unexpected error is a counted, audited, logged 500."""
    if request.path != "/webhook":
        return await handler(request)
    app = request.app
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        resp = e
    except Exception as e:  # noqa: BLE001 - our failure: 500 so Alertmanager retries; see the module docstring
        log.exception("webhook: internal error")
        app[AUDIT].write("error", code=500, reason="internal_error", message=repr(e)[:500])
        resp = web.json_response({"status": "error", "reason": "internal_error",
                                  "message": "the controller failed to handle this notification; it will be retried"},
                                 status=500)
    app[METRICS].webhook_requests.labels(str(resp.status)).inc()
    return resp


def build_app(cfg: ControllerConfig, engine: Engine, metrics_: ControllerMetrics, registry: CollectorRegistry,
              audit: AuditLog) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[count_codes])
    app[ENGINE], app[METRICS], app[REGISTRY], app[AUDIT] = engine, metrics_, registry, audit
    app[TOKEN] = read_token_file(cfg.token_file)
    app[MAX_BODY] = cfg.max_body_bytes
    app.router.add_post("/webhook", webhook)
    app.router.add_get("/api/v1/state", state)
    return add_standard_routes(app, registry, "promreflex controller")


def _bind_error(listen_address: str, err: OSError) -> UserError:
    if err.errno == errno.EADDRINUSE:
        why = "the address is already in use (another controller, or another program, listens there)"
    elif err.errno == errno.EACCES:
        why = "permission denied (a port below 1024 needs privileges)"
    elif err.errno == errno.EADDRNOTAVAIL:
        why = "no such address on this machine"
    else:
        why = err.strerror or str(err)
    return UserError(f"cannot listen on {listen_address}: {why}; set controller.listen_address "
                     "(or --web.listen-address) to a free address")


def check_bind(listen_address: str) -> None:
    """Raise :class:`UserError` when ``listen_address`` cannot be bound now."""
    import socket

    host, port = split_host_port(listen_address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"cannot listen on {listen_address}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            s.bind(addr)
        except OSError as e:
            raise _bind_error(listen_address, e) from None


async def serve(cfg: ControllerConfig, stop: asyncio.Event | None = None) -> None:
    """Run the controller until ``stop`` is set (or SIGTERM/SIGINT). Start-up problems a user
    can fix raise :class:`UserError` before anything is started."""
    preflight(cfg)
    check_bind(cfg.listen_address)
    stop = stop or stop_on_signals()
    registry = CollectorRegistry()
    audit = AuditLog(cfg.audit_log)
    async with aiohttp.ClientSession() as session:
        # Actions publish their own metrics on the controller's /metrics through "registry".
        services: dict[str, Any] = {"session": session, "registry": registry}
        if cfg.alertmanager_url:
            services["alertmanager"] = AlertmanagerClient(cfg.alertmanager_url, session)
        if cfg.prometheus_url:
            services["prometheus"] = PrometheusClient(cfg.prometheus_url, session)
        from controllers.actions.base import registry as action_registry

        engine = Engine(cfg, ControllerMetrics(registry, sorted(action_registry())), audit, services)
        try:
            await engine.start()
            app = build_app(cfg, engine, engine.metrics, registry, audit)
            try:
                async with serving(cfg.listen_address, app):
                    log.info("controller listening on %s (%d routes, token %s)", cfg.listen_address,
                             len(engine.routes), "required" if app[TOKEN] else "not required")
                    audit.write("start", listen_address=cfg.listen_address, routes=sorted(engine.routes))
                    reconciler = asyncio.create_task(_reconcile_forever(engine, cfg.reconcile_interval, stop))
                    try:
                        await stop.wait()
                    finally:
                        reconciler.cancel()
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                    raise _bind_error(cfg.listen_address, e) from None  # taken since check_bind
                raise
        finally:
            await engine.shutdown()
            audit.write("stop")
            audit.close()


async def _reconcile_forever(engine: Engine, interval: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await engine.reconcile()
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except TimeoutError:
            pass
