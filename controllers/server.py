"""The webhook receiver: HTTP in front of the engine.

It answers at once (the engine acts asynchronously), rejects anything that is not an
Alertmanager v4 payload with a 4xx and a reason, and never answers 5xx to bad input.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from controllers.audit import AuditLog
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.models import WebhookPayload
from promreflex.clients import AlertmanagerClient, PrometheusClient
from promreflex.config import ControllerConfig
from promreflex.httpd import add_standard_routes, serving, stop_on_signals

log = logging.getLogger("promreflex.controller")

ENGINE = web.AppKey("engine", Engine)
METRICS = web.AppKey("metrics", ControllerMetrics)
REGISTRY = web.AppKey("registry", CollectorRegistry)
TOKEN = web.AppKey("token", str)
AUDIT = web.AppKey("audit", AuditLog)
MAX_BODY = web.AppKey("max_body", int)


def read_token(path: Path | None) -> str:
    if path is None:
        return ""
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def _reject(app: web.Application, status: int, reason: str, message: str, **extra: Any) -> web.Response:
    app[METRICS].rejections.labels(reason).inc()
    app[AUDIT].write("rejected", code=status, reason=reason, message=message[:500])
    return web.json_response({"status": "rejected", "reason": reason, "message": message, **extra}, status=status)


def _problems(err: ValidationError, limit: int = 20) -> list[str]:
    out = []
    for e in err.errors()[:limit]:
        loc = ".".join(str(p) for p in e["loc"]) or "(body)"
        out.append(f"{loc}: {e['msg']}")
    if len(err.errors()) > limit:
        out.append(f"... and {len(err.errors()) - limit} more")
    return out


async def webhook(request: web.Request) -> web.Response:
    app = request.app
    token = app[TOKEN]
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _reject(app, 401, "unauthorized", "a valid bearer token is required")
    ctype = request.content_type
    if ctype not in ("application/json", "application/octet-stream", "text/plain", ""):
        return _reject(app, 415, "unsupported_media_type", f"expected application/json, got {ctype}")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _reject(app, 413, "too_large", f"body larger than {app[MAX_BODY]} bytes")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return _reject(app, 400, "not_json", f"body is not JSON: {e}")
    if not isinstance(data, dict):
        return _reject(app, 422, "invalid_payload", "the payload must be a JSON object")
    if data.get("version") != "4":
        return _reject(
            app, 422, "invalid_payload",
            f"unsupported webhook version {data.get('version')!r}: only Alertmanager's version \"4\" is accepted",
        )
    try:
        payload = WebhookPayload.model_validate(data)
    except ValidationError as e:
        problems = _problems(e)
        return _reject(app, 422, "invalid_payload", "; ".join(problems), problems=problems)
    counts = app[ENGINE].handle_payload(payload)
    return web.json_response({"status": "accepted", **counts})


async def state(request: web.Request) -> web.Response:
    return web.json_response({"entries": request.app[ENGINE].snapshot()})


@web.middleware
async def count_codes(request: web.Request, handler):
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        resp = e
    if request.path == "/webhook":
        request.app[METRICS].webhook_requests.labels(str(resp.status)).inc()
    return resp


def build_app(cfg: ControllerConfig, engine: Engine, metrics_: ControllerMetrics, registry: CollectorRegistry,
              audit: AuditLog) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[count_codes])
    app[ENGINE], app[METRICS], app[REGISTRY], app[AUDIT] = engine, metrics_, registry, audit
    app[TOKEN] = read_token(cfg.token_file)
    app[MAX_BODY] = cfg.max_body_bytes
    app.router.add_post("/webhook", webhook)
    app.router.add_get("/api/v1/state", state)
    return add_standard_routes(app, registry, "promreflex controller")


async def serve(cfg: ControllerConfig, stop: asyncio.Event | None = None) -> None:
    """Run the controller until ``stop`` is set (or SIGTERM/SIGINT)."""
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
        await engine.start()
        app = build_app(cfg, engine, engine.metrics, registry, audit)
        try:
            async with serving(cfg.listen_address, app):
                log.info("controller listening on %s (%d routes, token %s)", cfg.listen_address, len(engine.routes),
                         "required" if app[TOKEN] else "not required")
                audit.write("start", listen_address=cfg.listen_address, routes=sorted(engine.routes))
                reconciler = asyncio.create_task(_reconcile_forever(engine, cfg.reconcile_interval, stop))
                try:
                    await stop.wait()
                finally:
                    reconciler.cancel()
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
