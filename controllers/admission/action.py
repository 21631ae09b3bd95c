"""The ``admission`` action: an alert routed to it tightens an admission proxy (a session cap, or
waiting-room mode for every new session), its resolution undoes it.

    - name: flash-sale
      matchers: ['alertname="FlashSaleStarted"']
      action: admission
      params: {control_url: "http://127.0.0.1:9188", mode: session_cap, session_cap: 200, lease: 30s}

Each firing alert is one *hold* on the proxy (``PUT /api/v1/holds/<route>.<fingerprint>``), with a
lease: the proxy drops a hold whose lease is not renewed, so a tightening never outlives a dead
controller by more than one lease. While an alert fires the action renews its hold every third
of the lease. The most restrictive hold wins on the proxy (waiting room over any cap; the lowest
cap), so several alerts and routes compose.

Guarantees (the controller's, see ``controllers/actions/base.py``): ``fire`` and ``resolve`` are
idempotent (PUT the same hold, DELETE a missing one); the holds are kept in
``<state_dir>/admission-holds.json`` so a restarted controller renews them at once (the engine
does not fire again for an alert it applied before the restart; its reconciliation runs
``resolve`` for an alert that ended meanwhile); ``shutdown`` drops the holds on the proxies (a
restart re-asserts them from the file). A ``resolve`` that cannot reach the proxy still succeeds:
the hold is no longer renewed and expires with its lease.

The control URL and token come from the route, never from alert labels.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controllers.actions.base import Action, ActionContext, register
from promreflex.config import Duration, is_loopback
from promreflex.fsutil import atomic_write_json, read_json
from promreflex.httpd import TokenFiles

log = logging.getLogger("promreflex.action.admission")

STATE_NAME = "admission-holds.json"
HTTP_TIMEOUT = 3.0


class AdmissionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    control_url: str = Field(default="http://127.0.0.1:9188", pattern=r"^http://[^/?#@]+/?$",
                             description="the proxy's control listener, http://HOST:PORT")
    mode: Literal["session_cap", "waiting_room"] = "session_cap"
    session_cap: int | None = Field(default=None, ge=0)
    lease: Duration = Field(default=30.0, ge=1, le=600)
    token_file: Path | None = None
    state_dir: Path = Path(".promreflex/admission")

    @model_validator(mode="after")
    def _check(self) -> AdmissionParams:
        if self.mode == "session_cap" and self.session_cap is None:
            raise ValueError("mode session_cap needs session_cap (the most sessions to keep active)")
        host = urllib.parse.urlsplit(self.control_url).hostname or ""
        if not is_loopback(host) and self.token_file is None:
            raise ValueError(f"control_url {self.control_url} is beyond loopback: set token_file")
        return self

    def body(self, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "lease": self.lease, "reason": reason[:200]}
        if self.mode == "session_cap":
            out["session_cap"] = self.session_cap
        return out


class ProxyError(Exception):
    pass


class ProxyUnreachable(ProxyError):
    """No answer, or a 5xx (the proxy restarting, overloaded): not a refusal of the hold."""


@register
class AdmissionAction(Action):
    name = "admission"
    Params = AdmissionParams
    concurrency = 4
    resolved_means = "drop the hold: the proxy admits new sessions as before"
    timeout = 30.0

    def __init__(self) -> None:
        super().__init__()
        self.services: dict[str, Any] = {}
        self.held: dict[str, dict[str, Any]] = {}  # holder -> {"params": AdmissionParams, "reason": str}
        self._tokens = TokenFiles()  # read again when the file changes (a rotated token)
        self._renewer: asyncio.Task[None] | None = None
        self._own_session: aiohttp.ClientSession | None = None
        self._metrics: tuple[Gauge, Counter] | None = None
        self._changed = asyncio.Event()  # a hold was added: the renewer recomputes its period

    # ------------------------------------------------------------------ engine hooks
    def target(self, ctx: ActionContext) -> str:
        params: AdmissionParams = ctx.params  # type: ignore[assignment]
        return f"admission:{params.control_url}:{ctx.route}/{ctx.alert.fingerprint}"

    def run_timeout(self, params: BaseModel) -> float:
        return self.timeout

    async def start(self, services: dict[str, Any]) -> None:
        self.services = services
        dirs = {Path(p.state_dir) for p in self.route_params if isinstance(p, AdmissionParams)}
        for d in dirs:
            data = read_json(d / STATE_NAME, default=None)
            for holder, raw in (data or {}).get("holds", {}).items() if isinstance(data, dict) else ():
                try:
                    params = AdmissionParams.model_validate(raw["params"])
                    self.held[str(holder)] = {"params": params, "reason": str(raw.get("reason", ""))}
                except (KeyError, TypeError, ValueError) as e:
                    log.warning("ignoring unreadable hold %s in %s: %r", holder, d / STATE_NAME, e)
        if self.held:
            log.info("re-asserting %d hold(s) from before the restart", len(self.held))
            await self.renew_all()
        self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def shutdown(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        for holder, h in list(self.held.items()):
            try:
                await self._call("DELETE", h["params"], holder)
            except ProxyError as e:
                self._m()[1].labels("release").inc()
                log.info("hold %s not dropped at shutdown (%s): it expires with its lease", holder, e)
        if self._own_session is not None:
            await self._own_session.close()

    async def fire(self, ctx: ActionContext) -> str:
        params: AdmissionParams = ctx.params  # type: ignore[assignment]
        holder = self.holder(ctx)
        reason = f"{ctx.alert.name} ({ctx.route})"
        # Written before the proxy is told (write-ahead): a controller killed between the two
        # restarts holding what the proxy may already hold, and re-asserts it; the other order
        # left a hold on the proxy that no state file knew of.
        before = self.held.get(holder)
        self.held[holder] = {"params": params, "reason": reason}
        self._save(params.state_dir)
        try:
            await self._call("PUT", params, holder, params.body(reason))
        except ProxyUnreachable:
            # Kept: the renewer PUTs it every lease/3 until the proxy answers. Dropped, an alert
            # that fired while the proxy restarted (up to a minute in a crowd) never tightened it
            # once the engine's retries ran out (a review). The fire still fails, counted and
            # retried by the engine; the resolve drops the hold as ever.
            self._m()[1].labels("hold").inc()
            self._changed.set()
            raise
        except ProxyError:
            self._m()[1].labels("hold").inc()  # a refusal (401, 400): the hold is not kept
            if before is None:
                self.held.pop(holder, None)
            else:
                self.held[holder] = before
            try:
                self._save(params.state_dir)
            except OSError as e:  # the proxy's refusal is the error to report; the file keeps the hold
                log.warning("could not restore %s after a refused hold: %s", params.state_dir / STATE_NAME, e)
            raise
        self._changed.set()
        what = "waiting room for new sessions" if params.mode == "waiting_room" else f"session cap {params.session_cap}"
        return f"{params.control_url}: {what} (hold {holder}, lease {params.lease:g}s)"

    async def resolve(self, ctx: ActionContext) -> str:
        params: AdmissionParams = ctx.params  # type: ignore[assignment]
        holder = self.holder(ctx)
        self.held.pop(holder, None)
        self._save(params.state_dir)
        try:
            await self._call("DELETE", params, holder)
        except ProxyError as e:
            self._m()[1].labels("release").inc()
            return f"{params.control_url} unreachable ({e}): hold {holder} is no longer renewed and expires " \
                   f"within {params.lease:g}s"
        return f"{params.control_url}: hold {holder} dropped"

    @staticmethod
    def holder(ctx: ActionContext) -> str:
        return f"{ctx.route}.{ctx.alert.fingerprint}"

    # ------------------------------------------------------------------ renewal
    async def _renew_forever(self) -> None:
        while True:
            leases = [h["params"].lease for h in self.held.values()]
            self._changed.clear()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancellation that
                # arrives as the event is set (the task then never ends).
                async with asyncio.timeout(min(leases) / 3 if leases else 60.0):
                    await self._changed.wait()
                continue  # a new hold was just PUT: renew it a third of its lease from now
            except TimeoutError:
                pass
            try:
                await self.renew_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the renewer must survive anything
                log.exception("admission hold renewal")

    async def renew_all(self) -> int:
        ok = 0
        for holder, h in list(self.held.items()):
            try:
                await self._call("PUT", h["params"], holder, h["params"].body(h["reason"]))
                ok += 1
            except ProxyError as e:
                self._m()[1].labels("renew").inc()
                log.warning("could not renew hold %s: %s", holder, e)
        self._m()[0].set(len(self.held))
        return ok

    # ------------------------------------------------------------------ helpers
    def _m(self) -> tuple[Gauge, Counter]:
        if self._metrics is None:
            registry = self.services.get("registry") or CollectorRegistry()
            errors = Counter("promreflex_admission_action_errors_total",
                             "Calls to an admission proxy's control endpoint that failed, by operation.",
                             ["operation"], registry=registry)
            for op in ("hold", "renew", "release"):
                errors.labels(op)
            self._metrics = (Gauge("promreflex_admission_action_holds", "Holds the admission action keeps renewed.",
                                   registry=registry), errors)
        return self._metrics

    def _token(self, params: AdmissionParams) -> str:
        if params.token_file is None:
            return ""
        return self._tokens.get(params.token_file, "admission token_file")

    async def _call(self, method: str, params: AdmissionParams, holder: str, body: dict[str, Any] | None = None) -> None:
        session = self.services.get("session")
        if session is None:
            if self._own_session is None:
                self._own_session = aiohttp.ClientSession()
            session = self._own_session
        url = f"{params.control_url.rstrip('/')}/api/v1/holds/{holder}"
        headers = {"Authorization": f"Bearer {self._token(params)}"} if params.token_file else {}
        try:
            async with session.request(method, url, json=body, headers=headers, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as resp:
                text = await resp.text()
                if resp.status != 200:
                    error = ProxyUnreachable if resp.status >= 500 else ProxyError
                    raise error(f"{method} {url}: {resp.status} {text[:200].strip()}")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:  # (counted by the caller, by operation)
            raise ProxyUnreachable(f"{method} {url}: {type(e).__name__}: {e}") from None
        self._m()[0].set(len(self.held))

    def _save(self, state_dir: Path) -> None:
        holds = {h: {"params": v["params"].model_dump(mode="json"), "reason": v["reason"]}
                 for h, v in self.held.items() if Path(v["params"].state_dir) == Path(state_dir)}
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(state_dir) / STATE_NAME, {"holds": holds, "updated": time.time()})
