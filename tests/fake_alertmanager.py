"""An in-process stand-in for Alertmanager's ``GET /api/v2/alerts``, for unit tests that talk to
it through the real :class:`promreflex.clients.AlertmanagerClient`.

It models what a controller's view depends on, as Alertmanager 0.25 does it:
- a silenced or inhibited alert has state ``suppressed`` and non-empty ``silencedBy`` /
  ``inhibitedBy``; ``silenced=false`` / ``inhibited=false`` leave it out;
- an ended alert (``endsAt`` in the past) is still listed with state ``active`` until garbage
  collection (:meth:`gc`): the client filters it out, not the server;
- timestamps are written with millisecond precision (notifications carry nanoseconds);
- the query parameters ``active``, ``silenced``, ``inhibited``, ``unprocessed`` filter the way
  Alertmanager's API handler does;
- each alert lists the receivers its routing sends it to (``receivers``; ``fire(...,
  receivers=[...])``), and ``GET /api/v2/receivers`` the configured ones;
- ``GET /api/v2/status`` says when the process started (``uptime``, a timestamp) and its
  cluster name (``cluster.name``, new at every start, as Alertmanager's peer ULID); a
  :meth:`restart` forgets every alert (Alertmanager keeps silences and the notification log on
  disk, alerts in memory only) and starts again: it lists nothing until Prometheus re-sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, UTC
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from promreflex.clients import AlertmanagerClient, iso


class FakeAlertmanagerAPI:
    def __init__(self, started: datetime | float | None = None) -> None:
        self.alerts: dict[str, dict[str, Any]] = {}
        self.fail = False
        self.requests = 0
        self.client: Any = None  # the AlertmanagerClient a test points at this fake
        self.receivers = ["null", "promreflex"]
        # Default: running for ages (as far as any test's clock can tell).
        self.started = _when(started) if started is not None else datetime(1970, 1, 1, tzinfo=UTC)
        self.app = web.Application()
        self.app.router.add_get("/api/v2/alerts", self._get)
        self.app.router.add_get("/api/v2/status", self._status_route)
        self.app.router.add_get("/api/v2/receivers", self._receivers)

    # ------------------------------------------------------------------ what happens in Alertmanager
    def fire(self, alert: dict[str, Any], receivers: list[str] | None = None) -> None:
        """Receive (or refresh) an alert in webhook shape (``tests.payloads.alert``), routed to
        ``receivers`` (default: the controller's, ``promreflex``)."""
        fp = alert["fingerprint"]
        old = self.alerts.get(fp, {})
        starts = datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00"))
        self.alerts[fp] = {
            "labels": alert["labels"], "annotations": alert["annotations"], "startsAt": _millis(starts),
            "endsAt": iso(datetime.now(UTC) + timedelta(minutes=5)), "generatorURL": alert["generatorURL"],
            "fingerprint": fp, "updatedAt": iso(),
            "receivers": [{"name": r} for r in (receivers or old and [r["name"] for r in old["receivers"]] or ["promreflex"])],
            "status": old.get("status") or {"state": "active", "silencedBy": [], "inhibitedBy": []},
        }
        self._restate(fp)

    def silence(self, fp: str, silence_id: str = "s1") -> None:
        self.alerts[fp]["status"]["silencedBy"] = [silence_id]
        self._restate(fp)

    def expire_silence(self, fp: str) -> None:
        self.alerts[fp]["status"]["silencedBy"] = []
        self._restate(fp)

    def inhibit(self, fp: str, by: str) -> None:
        self.alerts[fp]["status"]["inhibitedBy"] = [by]
        self._restate(fp)

    def lift_inhibition(self, fp: str) -> None:
        self.alerts[fp]["status"]["inhibitedBy"] = []
        self._restate(fp)

    def end(self, fp: str) -> None:
        """Resolved: ``endsAt`` now; still listed until :meth:`gc`."""
        self.alerts[fp]["endsAt"] = iso(datetime.now(UTC) - timedelta(seconds=1))

    def gc(self) -> None:
        now = datetime.now(UTC)
        self.alerts = {fp: a for fp, a in self.alerts.items()
                       if datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00")) > now}

    def restart(self, started: datetime | float | None = None) -> None:
        """Alertmanager keeps silences across a restart, not alerts: it lists none until
        Prometheus re-sends them. ``started``: when (a datetime or Unix time; default now)."""
        self.alerts.clear()
        self.started = _when(started) if started is not None else datetime.now(UTC)

    def _restate(self, fp: str) -> None:
        st = self.alerts[fp]["status"]
        st["state"] = "suppressed" if st["silencedBy"] or st["inhibitedBy"] else "active"

    # ------------------------------------------------------------------ the API
    async def _status_route(self, request: web.Request) -> web.Response:
        return await self._status(request)  # (through the attribute: a test may replace _status)

    async def _status(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.fail:
            return web.json_response({"error": "injected"}, status=500)
        name = f"01PEER{id(self):x}{self.started.timestamp():.3f}"
        return web.json_response({"uptime": _millis(self.started),
                                  "cluster": {"name": name, "status": "ready", "peers": []},
                                  "versionInfo": {"version": "0.25.0"}})

    async def _receivers(self, request: web.Request) -> web.Response:
        return web.json_response([{"name": r} for r in self.receivers])

    async def _get(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.fail:
            return web.json_response({"error": "injected"}, status=500)

        def flag(name: str) -> bool:
            return request.query.get(name, "true").lower() == "true"

        out = []
        for a in self.alerts.values():
            st = a["status"]
            if not flag("silenced") and st["silencedBy"]:
                continue
            if not flag("inhibited") and st["inhibitedBy"]:
                continue
            if not flag("active") and st["state"] == "active":
                continue
            if not flag("unprocessed") and st["state"] == "unprocessed":
                continue
            out.append(a)
        return web.json_response(out)


@contextlib.asynccontextmanager
async def cluster(n: int) -> AsyncIterator[tuple[list[FakeAlertmanagerAPI], AlertmanagerClient]]:
    """``n`` fake peers, and one client that has them all (the controller's configuration)."""
    peers = [FakeAlertmanagerAPI() for _ in range(n)]
    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(TestServer(p.app)) for p in peers]
        session = await stack.enter_async_context(aiohttp.ClientSession())
        client = AlertmanagerClient([str(s.make_url("")) for s in servers], session)
        for p in peers:
            p.client = client
        yield peers, client


def _when(value: datetime | float) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)


def _millis(ts: datetime) -> str:
    """Alertmanager's API timestamp format (go-openapi strfmt.DateTime): milliseconds, truncated."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
