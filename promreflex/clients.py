"""Small async clients for the Prometheus and Alertmanager HTTP APIs.

Only what promreflex uses: instant and range queries, the active alerts of Alertmanager (the
source of truth a controller reconciles against), and posting alerts (how a controller flags a
finding). Both take an ``aiohttp.ClientSession`` so a process shares one connection pool.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any

import aiohttp

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=5)


class APIError(Exception):
    """The API answered, but not with what was asked (non-2xx, or status "error")."""


class PrometheusClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = timeout

    async def _get(self, path: str, params: dict[str, Any]) -> Any:
        async with self.session.get(f"{self.base_url}{path}", params=params, timeout=self.timeout) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200 or body.get("status") != "success":
                raise APIError(f"{path} {resp.status}: {body.get('errorType', '')} {body.get('error', body)}")
            return body["data"]

    async def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        """Instant query; returns the result list (vector samples ``{"metric": ..., "value": [t, "v"]}``)."""
        params: dict[str, Any] = {"query": expr}
        if time is not None:
            params["time"] = f"{time:.3f}"
        data = await self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = await self._get("/api/v1/query_range", params)
        return data["result"]

    async def scalar(self, expr: str, default: float | None = None) -> float | None:
        """The single value of ``expr``, or ``default`` when it returns nothing."""
        result = await self.query(expr)
        if not result:
            return default
        return float(result[0]["value"][1])


class AlertmanagerClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = timeout

    async def active_alerts(self, *, inhibited: bool = False) -> list[dict[str, Any]]:
        """Alerts that are firing now and not silenced (nor inhibited unless ``inhibited``), in
        API v2 shape. A controller converges on the default view; an analysis that needs every
        symptom (an inhibited one is still slow) asks for ``inhibited=True``.

        Alertmanager 0.25 keeps resolved alerts in ``?active=true`` answers (state "active",
        ``endsAt`` in the past) until it garbage-collects them, so those are filtered out here,
        as are entries whose ``endsAt`` cannot be read: a controller must not treat a resolved
        alert as firing."""
        params = {"active": "true", "silenced": "false", "inhibited": str(inhibited).lower(), "unprocessed": "true"}
        async with self.session.get(f"{self.base_url}/api/v2/alerts", params=params, timeout=self.timeout) as resp:
            if resp.status != 200:
                raise APIError(f"GET /api/v2/alerts: {resp.status} {await resp.text()}")
            items = await resp.json(content_type=None)
        now = datetime.now(UTC)
        return [i for i in items if isinstance(i, dict) and not _ended_or_unreadable(i.get("endsAt"), now)]

    async def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Post alerts (``labels``, ``annotations``, ``startsAt``/``endsAt`` ISO strings)."""
        async with self.session.post(f"{self.base_url}/api/v2/alerts", json=alerts, timeout=self.timeout) as resp:
            if resp.status != 200:
                raise APIError(f"POST /api/v2/alerts: {resp.status} {await resp.text()}")

    async def ready(self) -> bool:
        try:
            async with self.session.get(f"{self.base_url}/-/ready", timeout=self.timeout) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False


def alert_ended(ends_at: str | None, now: datetime | None = None) -> bool:
    """True when an alert's ``endsAt`` (RFC 3339, as Alertmanager writes it) has passed."""
    if not ends_at or ends_at.startswith("0001-"):
        return False
    return datetime.fromisoformat(ends_at.replace("Z", "+00:00")) <= (now or datetime.now(UTC))


def _ended_or_unreadable(ends_at: Any, now: datetime) -> bool:
    try:
        return alert_ended(ends_at if isinstance(ends_at, str) else None, now)
    except ValueError:
        return True


def iso(ts: datetime | None = None) -> str:
    """RFC 3339 in UTC, as Alertmanager's API wants it."""
    return (ts or datetime.now(UTC)).astimezone(UTC).isoformat().replace("+00:00", "Z")
