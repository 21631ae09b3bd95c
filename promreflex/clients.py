"""Small async clients for the Prometheus and Alertmanager HTTP APIs.

Only what promreflex uses: instant and range queries, the active alerts of Alertmanager (the
source of truth a controller reconciles against), and posting alerts (how a controller flags a
finding). Both take an ``aiohttp.ClientSession`` so a process shares one connection pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any, TypeVar

import aiohttp

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=5)
T = TypeVar("T")


class APIError(Exception):
    """The API answered, but not with what was asked (non-2xx, or status "error")."""


class QueryError(APIError):
    """The server refused the request itself (a PromQL error, 400 or 422): any replica would, so
    it is not asked of the next one."""


class _Servers:
    """One server, or several that answer the same (a Prometheus pair, an Alertmanager
    cluster's peers): reads go to the last one that answered and fail over to the next."""

    what = "server"

    def __init__(self, base_url: str | Sequence[str], session: aiohttp.ClientSession,
                 timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError(f"{type(self).__name__} needs at least one URL")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.session = session
        self.timeout = timeout

    @property
    def base_url(self) -> str:
        """The server reads go to first (the last one that answered)."""
        return self.base_urls[0]

    async def _each_peer(self, call: Callable[[str], Awaitable[T]]) -> T:
        """``call(url)`` on the servers in turn until one succeeds; that one is tried first next time."""
        errors: list[str] = []
        for i, url in enumerate(list(self.base_urls)):
            try:
                result = await call(url)
            except QueryError:
                raise
            except (TimeoutError, aiohttp.ClientError, APIError) as e:
                errors.append(f"{url}: {why(e)}")
                continue
            if i:
                self.base_urls.insert(0, self.base_urls.pop(i))
            return result
        if len(errors) == 1:
            raise APIError(errors[0])
        raise APIError(f"no {self.what} answered: " + "; ".join(errors))


class PrometheusClient(_Servers):
    """One Prometheus, or the replicas of a pair (``base_url`` a list): a query goes to the
    replica that answered last and to the next one when it fails (down, an error page of a
    proxy in front of it). A replica that restarted answers with what it has scraped since;
    its history comes back only from its disk."""

    what = "Prometheus"

    async def _get(self, path: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        """``timeout``: per server (a caller with a deadline gives each replica a share of it, so a
        replica that hangs leaves time for the next)."""
        limit = aiohttp.ClientTimeout(total=timeout) if timeout is not None else self.timeout
        if len(self.base_urls) == 1:  # one server: its own errors, as they come
            return await self._get_from(self.base_urls[0], path, params, limit)
        return await self._each_peer(lambda url: self._get_from(url, path, params, limit))

    async def _get_from(self, url: str, path: str, params: dict[str, Any], timeout: aiohttp.ClientTimeout) -> Any:
        async with self.session.get(f"{url}{path}", params=params, timeout=timeout) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                raise APIError(f"{path} {resp.status}: not a Prometheus answer (not JSON)") from None
            if not isinstance(body, dict) or resp.status != 200 or body.get("status") != "success":
                detail = f"{body.get('errorType', '')} {body.get('error', body)}" if isinstance(body, dict) else body
                refused = resp.status in (400, 422) and isinstance(body, dict) and body.get("status") == "error"
                raise (QueryError if refused else APIError)(f"{path} {resp.status}: {detail}")
            return body["data"]

    async def query(self, expr: str, time: float | None = None, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Instant query; returns the result list (vector samples ``{"metric": ..., "value": [t, "v"]}``).
        ``timeout``: seconds per replica (default: the client's)."""
        params: dict[str, Any] = {"query": expr}
        if time is not None:
            params["time"] = f"{time:.3f}"
        data = await self._get("/api/v1/query", params, timeout)
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


@dataclass
class PeerAlerts:
    """One Alertmanager peer's answer to :meth:`AlertmanagerClient.alerts_by_peer`."""

    url: str
    alerts: list[dict[str, Any]] | None  # None: the peer did not answer (``error`` says why)
    # When that Alertmanager process started (``GET /api/v2/status``: ``uptime``), read after
    # its alerts; None when it could not be read.
    started: datetime | None = None
    error: str = ""
    # The peer's cluster name (``GET /api/v2/status``: ``cluster.name``, a new one each start),
    # when readable; and whether the status read before the alerts and the one after disagree
    # (``mixed``): then the URL reached two Alertmanagers (a load balancer, a Kubernetes
    # Service) and its list is not one peer's.
    name: str | None = None
    mixed: bool = False
    # Its status could not be read (a 503, a timeout) although its alerts could: its age is
    # unknown, so its silence proves nothing (a restarted peer answering 503 to /status resolved
    # what still fired: a review).
    status_unread: bool = False


class AlertmanagerClient(_Servers):
    """One Alertmanager, or the peers of a cluster (``base_url`` a list).

    A cluster's peers hold the same alerts (every Prometheus sends to every peer) but do not
    gossip them to each other, only silences and the notification log. So reads go to one peer,
    the last one that answered, and fail over to the next when it is down; ``post_alerts`` goes
    to every peer, as Prometheus does, and succeeds when one took it. A peer that restarted
    lists no alert until Prometheus re-sends them (its resend delay, 1 m by default, plus an
    evaluation): a caller that must tell "ended" from "not re-sent yet" reads every peer with
    :meth:`alerts_by_peer`, which says when each one started.
    """

    what = "Alertmanager peer"

    async def active_alerts(self, *, inhibited: bool = False, silenced: bool = False) -> list[dict[str, Any]]:
        """Alerts that are firing now, not silenced unless ``silenced``, not inhibited unless
        ``inhibited``, in API v2 shape. A controller converges on the default view; an analysis
        that needs every symptom asks for ``inhibited=True`` (an inhibited one is still slow),
        and an incident that must not end because its root's alert was silenced, for both.

        Alertmanager 0.25 keeps resolved alerts in ``?active=true`` answers (state "active",
        ``endsAt`` in the past) until it garbage-collects them, so those are filtered out here,
        as are entries whose ``endsAt`` cannot be read: a controller must not treat a resolved
        alert as firing."""
        return await self._each_peer(lambda url: self._alerts(url, inhibited, silenced))

    async def _alerts(self, url: str, inhibited: bool, silenced: bool = False) -> list[dict[str, Any]]:
        params = {"active": "true", "silenced": str(silenced).lower(), "inhibited": str(inhibited).lower(),
                  "unprocessed": "true"}
        async with self.session.get(f"{url}/api/v2/alerts", params=params, timeout=self.timeout) as resp:
            if resp.status != 200:
                raise APIError(f"GET /api/v2/alerts: {resp.status} {await resp.text()}")
            try:
                items = await resp.json(content_type=None)
            except ValueError as e:
                raise APIError(f"GET /api/v2/alerts: not JSON ({e})") from None
        if not isinstance(items, list):
            raise APIError(f"GET /api/v2/alerts: not a list but {type(items).__name__}")
        now = datetime.now(UTC)
        return [i for i in items if isinstance(i, dict) and not _ended_or_unreadable(i.get("endsAt"), now)]

    async def _status(self, url: str) -> tuple[datetime | None, str | None]:
        """(when it started: ``uptime``, a timestamp despite its name; its cluster name) from
        ``GET /api/v2/status``; None for what cannot be read."""
        try:
            async with self.session.get(f"{url}/api/v2/status", timeout=self.timeout) as resp:
                if resp.status != 200:
                    return None, None
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None, None
        if not isinstance(body, dict):
            return None, None
        cluster = body.get("cluster")
        name = cluster.get("name") if isinstance(cluster, dict) else None
        name = name if isinstance(name, str) and name else None
        uptime = body.get("uptime")
        if not isinstance(uptime, str):
            return None, name
        try:
            started = datetime.fromisoformat(uptime.replace("Z", "+00:00"))
        except ValueError:
            return None, name
        return (started.astimezone(UTC) if started.tzinfo else None), name

    async def alerts_by_peer(self, *, inhibited: bool = False, silenced: bool = False) -> list[PeerAlerts]:
        """Every peer's active alerts (as :meth:`active_alerts` filters them), all peers read at
        once, each with the time that peer started and its name (read before and after its
        alerts: a peer that restarts between the reads looks young, never old and empty, and a
        URL that answers as two Alertmanagers is ``mixed``). Raises :class:`APIError` only
        when no peer answered. Peers do not gossip alerts: an alert is absent from the cluster
        only when no peer lists it, and a peer that started moments ago lists nothing yet."""

        async def one(url: str) -> PeerAlerts:
            before = await self._status(url)
            try:
                alerts = await self._alerts(url, inhibited, silenced)
            except (TimeoutError, aiohttp.ClientError, APIError) as e:
                return PeerAlerts(url, None, error=why(e))
            started, name = after = await self._status(url)
            mixed = None not in (*before, *after) and before != after
            return PeerAlerts(url, alerts, started, name=name, mixed=mixed, status_unread=started is None)

        views = list(await asyncio.gather(*(one(url) for url in self.base_urls)))
        if all(v.alerts is None for v in views):
            errors = [f"{v.url}: {v.error}" for v in views]
            raise APIError(errors[0] if len(errors) == 1 else "no Alertmanager peer answered: " + "; ".join(errors))
        return views

    async def receivers(self) -> list[str]:
        """The receivers Alertmanager's configuration names (``GET /api/v2/receivers``)."""

        async def get(url: str) -> list[str]:
            async with self.session.get(f"{url}/api/v2/receivers", timeout=self.timeout) as resp:
                if resp.status != 200:
                    raise APIError(f"GET /api/v2/receivers: {resp.status} {await resp.text()}")
                body = await resp.json(content_type=None)
            return [r["name"] for r in body if isinstance(r, dict) and isinstance(r.get("name"), str)] \
                if isinstance(body, list) else []

        return await self._each_peer(get)

    async def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Post alerts (``labels``, ``annotations``, ``startsAt``/``endsAt`` ISO strings) to every
        peer; raises only when none took them."""
        errors: list[str] = []
        for url in self.base_urls:
            try:
                async with self.session.post(f"{url}/api/v2/alerts", json=alerts, timeout=self.timeout) as resp:
                    if resp.status != 200:
                        raise APIError(f"POST /api/v2/alerts: {resp.status} {await resp.text()}")
            except (TimeoutError, aiohttp.ClientError, APIError) as e:
                errors.append(f"{url}: {why(e)}")
        if len(errors) == len(self.base_urls):
            raise APIError(errors[0] if len(errors) == 1 else "no Alertmanager peer took the alerts: " + "; ".join(errors))

    async def ready(self) -> bool:
        """True when any peer is ready."""
        for url in self.base_urls:
            try:
                async with self.session.get(f"{url}/-/ready", timeout=self.timeout) as resp:
                    if resp.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                continue
        return False


def why(e: BaseException) -> str:
    """A failed request in a few words, for a log line (aiohttp's reprs run to hundreds of
    characters): ``cannot connect: Connection refused``, ``timed out``, or the error's text."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect: {e.os_error.strerror or e.os_error}"
    if isinstance(e, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.ClientResponseError):
        return f"HTTP {e.status} {e.message}"
    text = str(e)
    return text if text and isinstance(e, APIError) else f"{type(e).__name__}: {text}" if text else type(e).__name__


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
