"""The ``admission`` action against a real proxy's control endpoint (in process): fire tightens,
resolve undoes, both idempotent; the hold is renewed while held, survives a controller restart
through the state file, and expires on the proxy when nobody renews it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from controllers.actions.base import ActionContext
from controllers.admission.action import STATE_NAME, AdmissionAction, AdmissionParams
from controllers.models import Alert
from tests.payloads import alert
from tests.unit.test_admission_proxy import rig


def ctx(params: AdmissionParams, name: str = "FlashSale", status: str = "firing") -> ActionContext:
    return ActionContext(route="flash-sale", alert=Alert.model_validate(alert(name, status=status, shop="main")),
                         params=params)


async def started(params: AdmissionParams) -> AdmissionAction:
    action = AdmissionAction()
    action.route_params = [params]
    await action.start({})
    return action


async def until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def errors(action: AdmissionAction) -> dict[str, float]:
    counter = action._m()[1]
    return {op: counter.labels(op)._value.get() for op in ("hold", "renew", "release")}


def test_params_are_checked():
    with pytest.raises(ValidationError, match="needs session_cap"):
        AdmissionParams(mode="session_cap")
    with pytest.raises(ValidationError, match="beyond loopback"):
        AdmissionParams(mode="waiting_room", control_url="http://10.0.0.5:9188")
    with pytest.raises(ValidationError):
        AdmissionParams(mode="waiting_room", control_url="http://127.0.0.1:9188/x?y")
    AdmissionParams(mode="waiting_room", control_url="http://10.0.0.5:9188", token_file=Path("/etc/t"))


async def test_fire_tightens_resolve_undoes_idempotently(tmp_path: Path):
    async with rig() as r:
        params = AdmissionParams(control_url=r.control, mode="session_cap", session_cap=3, lease=30,
                                 state_dir=tmp_path)
        action = await started(params)
        try:
            c = ctx(params)
            msg = await action.fire(c)
            assert "session cap 3" in msg
            await action.fire(c)  # again (a re-run after a crash): same hold
            assert r.proxy.holds.session_cap() == 3 and len(r.proxy.holds.holds) == 1
            assert (tmp_path / STATE_NAME).exists()
            await action.resolve(c)
            await action.resolve(c)
            assert r.proxy.holds.session_cap() is None and not r.proxy.holds.holds
        finally:
            await action.shutdown()


async def test_hold_is_renewed_while_held_and_expires_when_the_controller_is_gone(tmp_path: Path):
    async with rig() as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", lease=2, state_dir=tmp_path)
        action = await started(params)
        await action.fire(ctx(params))
        await asyncio.sleep(4.5)  # more than two leases: renewed
        assert r.proxy.holds.waiting_room()
        # The controller dies (no shutdown, no resolve): the proxy relaxes by itself.
        assert action._renewer is not None
        action._renewer.cancel()
        await until(lambda: not r.proxy.holds.holds, timeout=10)
        assert r.value("promreflex_admission_holds_expired_total") == 1
        if action._own_session is not None:
            await action._own_session.close()
        # A restarted controller re-asserts what the state file says is held.
        again = await started(params)
        try:
            assert r.proxy.holds.waiting_room()
        finally:
            await again.shutdown()
        assert not r.proxy.holds.holds  # shutdown drops it; the file keeps it for the next start
        assert "flash-sale" in (tmp_path / STATE_NAME).read_text()


async def test_the_state_file_holds_the_hold_before_the_proxy_is_told(tmp_path: Path):
    """A controller SIGKILLed after the proxy took the hold must find it in its file at restart
    (a clean-clone CI run killed it between the two when the file was written after the PUT)."""
    async with rig() as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", lease=30, state_dir=tmp_path)
        action = await started(params)
        seen: list[str] = []
        call = action._call

        async def call_and_look(method, p, holder, body=None):
            if method == "PUT":
                seen.append((tmp_path / STATE_NAME).read_text())
            await call(method, p, holder, body)

        action._call = call_and_look  # type: ignore[method-assign]
        try:
            await action.fire(ctx(params))
            assert seen and "flash-sale" in seen[0]
        finally:
            await action.shutdown()
    # A fire the proxy refused (401: no token) leaves the file as it was.
    async with rig(token="t0ken") as r:
        refused = AdmissionParams(control_url=r.control, mode="waiting_room", state_dir=tmp_path / "other")
        action = await started(refused)
        try:
            with pytest.raises(Exception, match="401"):
                await action.fire(ctx(refused))
            assert "flash-sale" not in (tmp_path / "other" / STATE_NAME).read_text() and not action.held
        finally:
            await action.shutdown()


async def test_unreachable_proxy_fire_fails_resolve_succeeds(tmp_path: Path):
    params = AdmissionParams(control_url="http://127.0.0.1:1", mode="waiting_room", state_dir=tmp_path)
    action = await started(params)
    try:
        with pytest.raises(Exception, match="127.0.0.1:1"):
            await action.fire(ctx(params))
        assert errors(action) == {"hold": 1.0, "renew": 0.0, "release": 0.0}
        assert "expires within" in await action.resolve(ctx(params, status="resolved"))
        assert errors(action) == {"hold": 1.0, "renew": 0.0, "release": 1.0}
    finally:
        await action.shutdown()


async def test_token_is_sent(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    async with rig(token="t0ken") as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", token_file=token, state_dir=tmp_path)
        action = await started(params)
        try:
            await action.fire(ctx(params))
            assert r.proxy.holds.waiting_room()
        finally:
            await action.shutdown()
        wrong = AdmissionParams(control_url=r.control, mode="waiting_room", state_dir=tmp_path)
        action = await started(wrong)
        try:
            with pytest.raises(Exception, match="401"):
                await action.fire(ctx(wrong))
            # a refusal is an error as much as an unreachable proxy (it was not counted)
            assert errors(action)["hold"] == 1.0
        finally:
            await action.shutdown()


async def test_a_refused_hold_reports_the_proxy_not_a_failed_restore(tmp_path: Path):
    """Restoring the state file after a refused PUT may fail too (a full disk): the error the
    controller records is the proxy's, not the file's."""
    async with rig(token="t0ken") as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", state_dir=tmp_path)  # no token: 401
        action = await started(params)
        save, calls = action._save, []

        def save_then_fail(state_dir):
            calls.append(1)
            if len(calls) > 1:
                raise OSError(28, "No space left on device")
            save(state_dir)

        action._save = save_then_fail  # type: ignore[method-assign]
        try:
            with pytest.raises(Exception, match="401"):
                await action.fire(ctx(params))
            assert len(calls) == 2 and not action.held
        finally:
            await action.shutdown()


async def test_a_hold_fired_while_the_proxy_is_down_is_set_when_it_is_back(tmp_path: Path):
    """The alert fired while the proxy restarted (up to a minute in a crowd): the fire failed,
    the hold was dropped, and after the engine's retries nothing set it for the whole episode
    (a review). It is kept now, and the renewer sets it once the proxy answers."""
    from promreflex.proc import free_port

    port = free_port()
    params = AdmissionParams(control_url=f"http://127.0.0.1:{port}", mode="waiting_room", lease=1.5,
                             state_dir=tmp_path)
    action = await started(params)
    try:
        with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
            await action.fire(ctx(params))
        assert action.held and errors(action)["hold"] == 1.0
        async with rig(control_address=f"127.0.0.1:{port}") as r:
            await until(lambda: r.proxy.holds.waiting_room(), timeout=15)
            await action.resolve(ctx(params, status="resolved"))
            assert not r.proxy.holds.waiting_room() and not action.held
    finally:
        await action.shutdown()


async def test_a_rotated_token_is_used_without_a_restart(tmp_path: Path):
    """The runbook's fix for a 401 (the route's token_file must hold the proxy's token) did not
    work until the controller restarted: the action kept the first token it read (a review).
    And a token rotated in a file both name is taken by both at once: re-read on one side
    only, every call got 401 until the other restarted (a review of that fix)."""
    from promreflex.httpd import LiveToken

    token = tmp_path / "token"
    token.write_text("old-token\n")
    token.chmod(0o600)
    async with rig(token="new-token") as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", token_file=token, state_dir=tmp_path)
        action = await started(params)
        try:
            with pytest.raises(Exception, match="401"):
                await action.fire(ctx(params))
            token.write_text("new-token\n")
            await action.fire(ctx(params))
            assert r.proxy.holds.waiting_room()
        finally:
            await action.shutdown()
    shared = tmp_path / "shared-token"
    shared.write_text("first\n")
    shared.chmod(0o600)
    async with rig(token=LiveToken(shared)) as r:
        params = AdmissionParams(control_url=r.control, mode="waiting_room", token_file=shared,
                                 state_dir=tmp_path / "s")
        action = await started(params)
        try:
            await action.fire(ctx(params))
            shared.write_text("second-token\n")  # rotated in place: both read it again
            assert await action.renew_all() == 1
            shared.chmod(0o644)  # a file that turns bad: the proxy keeps the token read before
            assert r.proxy._authorized(type("R", (), {"headers": {"Authorization": "Bearer second-token"}})())
        finally:
            await action.shutdown()
