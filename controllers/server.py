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
  decode (400 ``bad_body``), a sender that closed its connection before the whole body came
  (``client_disconnected``: its own timeout or a proxy's abort, not our error). A request
  aiohttp's parser itself refuses (an encoding it cannot decode, such as ``zstd``; broken
  headers) gets the same JSON (``bad_body``, 431 ``header_too_large``, 400 ``malformed``),
  counted and audited, and one log line (:func:`parser_logger`).
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

Routes are reloaded without a restart on SIGHUP or ``POST /-/reload`` (bearer token as
``/webhook``; ``promreflex stack reload`` sends the SIGHUP): :func:`apply_routes` validates the
new file's ``controller.routes`` completely before changing anything, then swaps them in place,
keeping the state (applied alerts, dedupe memory, held copies) and the running action
instances. An invalid file changes nothing (logged, audited ``reload`` with ``result: error``,
counted in ``promreflex_controller_config_reloads_total{result="error"}``). Other keys of the
``controller`` section (listen address, token, state file, intervals) need a restart; a reload
that changes them says so. ``alertmanager_receiver`` is reloaded with the routes.

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
import re
from typing import Any, get_args

import signal
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from controllers.audit import AuditLog
from controllers.engine import Engine, bind_routes
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import AlertmanagerClient, PrometheusClient
from promreflex.config import ConfigError, ControllerConfig, split_host_port
from promreflex.errors import UserError
from promreflex.httpd import (
    BodyError,
    ParserErrorLogger,
    add_standard_routes,
    discard_small_body,
    read_body,
    read_token_file,
    serving,
    stop_on_signals,
)

log = logging.getLogger("promreflex.controller")

ENGINE = web.AppKey("engine", Engine)
METRICS = web.AppKey("metrics", ControllerMetrics)
REGISTRY = web.AppKey("registry", CollectorRegistry)
TOKEN = web.AppKey("token", str)
AUDIT = web.AppKey("audit", AuditLog)
MAX_BODY = web.AppKey("max_body", int)
RELOAD = web.AppKey("reload", object)
JSON_TYPES = ("application/json", "application/octet-stream", "text/plain", "application/x-www-form-urlencoded", "")
# Alertmanager's webhook is version "4"; Grafana's webhook contact point sends the same shape
# (groupKey, receiver, status, per-alert labels, startsAt, fingerprint, plus fields of its own,
# ignored) as version "1". A body without a version is not either (docs/decisions.md).
WEBHOOK_VERSIONS = get_args(WebhookPayload.model_fields["version"].annotation)  # the model's Literal, one list

#: Keys of the controller section a reload cannot change (they need a restart).
_RESTART_KEYS = ("listen_address", "token_file", "state_file", "audit_log", "max_body_bytes", "alertmanager_url",
                 "prometheus_url", "reconcile_interval", "dedupe_window",
                 "alertmanager_restart_grace", "reconcile_fire_after")


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


#: What a request aiohttp's parser refused gets (:class:`~promreflex.httpd.ParserErrorLogger`).
PARSER_REFUSALS = {
    "bad_body": (400, "the body's Content-Encoding or Transfer-Encoding cannot be decoded here (Alertmanager sends "
                      "plain JSON; gzip and deflate are read)"),
    "header_too_large": (431, "request line or header fields too large"),
    "malformed": (400, "not an HTTP request this server can read"),
}


def parser_logger(app: web.Application) -> ParserErrorLogger:
    """aiohttp's server logger for the controller's listener: a request its parser refuses (a
    ``Content-Encoding: zstd``, broken headers) is counted and audited as a rejection and answered
    with the controller's JSON, in one log line; it was aiohttp's plain 400 with a traceback."""
    def count(reason: str) -> None:
        status, message = PARSER_REFUSALS[reason]
        app[METRICS].rejections.labels(reason).inc()
        app[AUDIT].write("rejected", code=status, reason=reason, message=message)

    def answer(reason: str) -> web.HTTPException:
        status, message = PARSER_REFUSALS[reason]
        cls = web.HTTPRequestHeaderFieldsTooLarge if status == 431 else web.HTTPBadRequest
        exc = cls(text=json.dumps({"status": "rejected", "reason": reason, "message": message}),
                  content_type="application/json")
        exc.force_close()
        return exc
    return ParserErrorLogger(count, answer)


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
    given = request.headers.get("Authorization", "")
    # The scheme is case-insensitive (RFC 9110 11.1): Alertmanager's http_config sends
    # authorization.type as written, so `type: bearer` arrives as "bearer <token>".
    scheme, _, credentials = given.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode("utf-8", "surrogateescape"), token.encode())


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` (curl sends it for a body over 1 KB): a request that will be
    refused (no token, a Content-Length over the limit) is answered at once, not invited to send
    its body first. Answered here, before the middlewares: counted here too."""
    app = request.app
    if not authorized(request):
        resp = _reject(app, 401, "unauthorized", "a valid bearer token is required", close=True)
    elif request.content_length is not None and request.content_length > app[MAX_BODY]:
        resp = _reject(app, 413, "too_large",
                       f"Content-Length {request.content_length} is above the limit of {app[MAX_BODY]} bytes", close=True)
    else:
        await _default_expect_handler(request)  # writes the 100 Continue
        return None
    app[METRICS].webhook_requests.labels(str(resp.status)).inc()
    return resp


async def _refuse(request: web.Request, status: int, reason: str, message: str) -> web.Response:
    """Refuse before the body was read: read a small body away (so the client sees the
    answer), leave a large one unread and close the connection after the answer."""
    await discard_small_body(request)
    return _reject(request.app, status, reason, message, close=not request.content.is_eof())


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(body: bytes) -> Any:
    """The JSON of a body; ValueError (with a reason for the sender) when it is not JSON we
    can read: invalid UTF-8 or syntax, an integer beyond 4,300 digits, nesting deeper than the
    parser's recursion limit, NaN or Infinity (Python's json reads them; JSON has no such
    numbers and no Alertmanager sends them)."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, integer digit limit
        raise ValueError(str(e)) from None
    if _SURROGATE_ESCAPE.search(body):  # (a pair is an emoji; a lone one no character at all)
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ValueError("a lone UTF-16 surrogate escape (\\udc80 and the like) is not a character") from None
    return data


async def webhook(request: web.Request) -> web.Response:
    app = request.app
    if not authorized(request):
        return await _refuse(request, 401, "unauthorized", "a valid bearer token is required")
    ctype = request.content_type
    # JSON under any of the names senders give it, and curl -d's default (form-urlencoded):
    # the body must parse as JSON whatever the header says.
    if not (ctype in JSON_TYPES or ctype.endswith("+json") or ctype.endswith("/json")):
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
    if data.get("version") not in WEBHOOK_VERSIONS:
        version = data.get("version")
        shown = (repr(version) if isinstance(version, (str, float, bool, type(None))) or (
            isinstance(version, int) and abs(version) < 10**40) else type(version).__name__)
        if isinstance(version, (int, float)) and not isinstance(version, bool) and version in (1, 4):
            shown = f"{shown} (a JSON number; the version is a string)"
        return _reject(
            app, 422, "invalid_payload",
            f"unsupported webhook version {shown[:40]}: only Alertmanager's version \"4\" (and Grafana's \"1\", "
            "the same shape) is accepted",
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
    if request.path not in ("/webhook", "/webhook/"):
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


async def apply_routes(engine: Engine, cfg: ControllerConfig) -> dict[str, Any]:
    """Swap ``engine``'s routes for ``cfg.routes`` in place, keeping its state.

    Everything is checked first (actions, params, each action's preflight); on any problem
    ConfigError/UserError is raised and nothing changed. Then: routes are added, changed
    (params, matchers, cooldown, ...) or removed; actions already running keep their instance
    (their held targets, leases and metrics), a new action is started. An applied alert whose
    route was removed, or no longer matches its route's new matchers, is resolved (the action's
    ``resolve`` runs, as when the alert ends); a removed route lingers, matching nothing, until
    then. A route whose ``action`` changed, or whose params changed the target its action names
    for an applied alert (``Action.target``: a URL, a file; not a message), is *retired* for
    those alerts: they are resolved with the old binding (as ``<route>~<old action>``), and the
    new binding starts fresh, its fire after that resolve (``retired`` in the answer).
    ``transitions_failing`` is recomputed from the entries. Returns what changed."""
    bound = bind_routes(cfg)
    running = engine.known_actions  # (a removed action's instance too)
    for b in bound:
        if b.action.name in running:
            b.action = running[b.action.name]
    for b in bound:
        check = getattr(b.action, "preflight", None)
        if callable(check):
            check(b.params)
    restart = [k for k in _RESTART_KEYS if getattr(cfg, k) != getattr(engine.cfg, k)]
    summary = await engine.apply_routes(bound, cfg)
    return {**summary, "needs_restart": restart}


class Reloader:
    """Reloads the routes from ``load`` (the configuration file, read again) into ``engine``:
    one reload at a time, each counted and audited."""

    def __init__(self, engine: Engine, load: Callable[[], ControllerConfig], registry: CollectorRegistry,
                 audit: AuditLog):
        self.engine, self.load, self.audit = engine, load, audit
        self.lock = asyncio.Lock()
        self.reloads = Counter("promreflex_controller_config_reloads", "Route reloads (SIGHUP, POST /-/reload) by result.",
                               ["result"], registry=registry)
        self.last_ok = Gauge("promreflex_controller_config_last_reload_success_timestamp_seconds",
                             "When the routes were last (re)loaded successfully.", registry=registry)
        for result in ("ok", "error"):
            self.reloads.labels(result)
        self.last_ok.set_to_current_time()

    async def __call__(self) -> dict[str, Any]:
        async with self.lock:
            try:
                cfg = await asyncio.to_thread(self.load)
                summary = await apply_routes(self.engine, cfg)
            except (ConfigError, UserError, OSError, ValueError) as e:
                self.reloads.labels("error").inc()
                msg = str(e).replace("\n", " ")
                self.audit.write("reload", result="error", error=msg[:1000])
                log.error("reload failed, the running routes are kept: %s", msg)
                return {"status": "error", "message": msg}
            self.reloads.labels("ok").inc()
            self.last_ok.set_to_current_time()
            self.audit.write("reload", result="ok", **summary)
            log.info("routes reloaded: %s", summary)
            if summary["needs_restart"]:
                log.warning("changed keys that need a restart to apply: %s", ", ".join(summary["needs_restart"]))
        await self.engine.reconcile()  # alerts the new routes match, now rather than at the next tick
        return {"status": "ok", **summary}


async def reload_handler(request: web.Request) -> web.Response:
    if not authorized(request):
        return web.json_response({"status": "rejected", "reason": "unauthorized",
                                  "message": "a valid bearer token is required"}, status=401)
    reloader = request.app[RELOAD]
    if not isinstance(reloader, Reloader):
        return web.json_response({"status": "error", "message": "this controller was started without a "
                                  "configuration file to reload"}, status=409)
    result = await reloader()
    return web.json_response(result, status=200 if result["status"] == "ok" else 400)


def build_app(cfg: ControllerConfig, engine: Engine, metrics_: ControllerMetrics, registry: CollectorRegistry,
              audit: AuditLog) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[count_codes])
    app[ENGINE], app[METRICS], app[REGISTRY], app[AUDIT] = engine, metrics_, registry, audit
    app[TOKEN] = read_token_file(cfg.token_file)
    app[MAX_BODY] = cfg.max_body_bytes
    app.router.add_post("/webhook", webhook, expect_handler=_expect)
    app.router.add_post("/webhook/", webhook, expect_handler=_expect)  # (a trailing slash in the receiver's url)
    for path in ("/webhook", "/webhook/"):  # Grafana's webhook contact point may be set to PUT
        app.router.add_put(path, webhook, expect_handler=_expect)
    app.router.add_get("/api/v1/state", state)
    app.router.add_post("/-/reload", reload_handler)
    app[RELOAD] = None
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


async def serve(cfg: ControllerConfig, stop: asyncio.Event | None = None,
                load: Callable[[], ControllerConfig] | None = None) -> None:
    """Run the controller until ``stop`` is set (or SIGTERM/SIGINT). Start-up problems a user
    can fix raise :class:`UserError` before anything is started. ``load`` reads the
    configuration again: with it, SIGHUP and ``POST /-/reload`` reload the routes."""
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
        from controllers.actions.base import broken_actions
        from controllers.actions.base import registry as action_registry

        engine = Engine(cfg, ControllerMetrics(registry, sorted(action_registry())), audit, services)
        for where, why in sorted(broken_actions().items()):
            log.error("%s not loaded, its actions are unavailable (the others run): %s", where, why)
        try:
            await engine.start()
            app = build_app(cfg, engine, engine.metrics, registry, audit)
            if load is not None:
                reloader = Reloader(engine, load, registry, audit)
                app[RELOAD] = reloader
                _on_sighup(lambda: asyncio.ensure_future(reloader()))
            try:
                async with serving(cfg.listen_address, app, logger=parser_logger(app)):
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


def _on_sighup(callback: Callable[[], Any]) -> None:
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, callback)
    except (NotImplementedError, RuntimeError):  # not the main thread (tests run serve() in one)
        pass
