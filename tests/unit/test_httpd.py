"""promreflex.httpd: what every promreflex server does with slow, idle and numerous clients,
token files, and repeated log lines. Real sockets against a real server on a free port."""

from __future__ import annotations

import asyncio
import logging
import time
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, generate_latest

from promreflex.errors import UserError
from promreflex.httpd import (
    ADDRESSES, BodyError, Limits, RateLimitFilter, _ConnectionPool, add_standard_routes, default_max_connections, on_disconnect,
    read_body, read_token_file, serving,
)
from promreflex.proc import free_port


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the server closes the connection (EOF or reset) within ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, 1024)
        except BodyError as e:
            return web.Response(status=e.status, text=str(e))
        return web.Response(body=body)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_get("/ok", ok)
    return app


async def _connections(port: int, n: int, send: bytes) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` connections that each sent ``send`` and then nothing more."""
    out = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(send)
        await writer.drain()
        out.append((reader, writer))
    return out


async def _get_ok(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_half_sent_request_is_closed_after_the_header_timeout():
    port = free_port()
    async with serving(f"127.0.0.1:{port}", _app(), Limits(header_timeout=0.5)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        await writer.drain()
        t0 = time.monotonic()
        assert await _closed_within(reader, 10), "a half-sent request kept its connection"
        took = time.monotonic() - t0
        writer.close()
        assert took >= 0.3  # the timeout, not an immediate refusal
        assert (await _get_ok(port)).startswith(b"HTTP/1.1 200")


async def test_an_idle_keep_alive_connection_outlives_the_header_timeout_but_not_the_idle_timeout():
    port = free_port()
    async with serving(f"127.0.0.1:{port}", _app(), Limits(header_timeout=0.3, idle_timeout=2.0)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # a scrape, a pause longer than the header timeout, another scrape
            writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.wait_for(reader.readexactly(2), 5)
            assert not await _closed_within(reader, 0.8)
        t0 = time.monotonic()
        assert await _closed_within(reader, 10)  # and then the idle timeout
        assert time.monotonic() - t0 >= 0.5
        writer.close()


async def test_a_slow_body_is_cut_at_the_body_timeout():
    port = free_port()
    async with serving(f"127.0.0.1:{port}", _app(), Limits(body_timeout=0.3)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # answered, then closed
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"not received within 0.3s (3 bytes arrived)" in answer


async def test_a_capped_server_closes_idle_connections_to_admit_a_real_request():
    port = free_port()
    async with serving(f"127.0.0.1:{port}", _app(), Limits(max_connections=20, header_timeout=60)):
        idle = await _connections(port, 50, b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        assert (await _get_ok(port)).startswith(b"HTTP/1.1 200")
        closed = [await _closed_within(r, 0.2) for r, _ in idle]
        # 50 + 1 connections, 20 allowed: the 31 that waited longest were closed, the newest kept.
        assert sum(closed) == 31, closed
        assert not any(closed[-19:])
        for _, w in idle:
            w.close()


def test_the_cap_stays_below_the_open_file_limit():
    assert default_max_connections(1024) == 768
    assert default_max_connections(20000) == 1024
    assert default_max_connections(100) == 36
    assert default_max_connections(10) == 16


def test_repeated_log_lines_are_rate_limited():
    f = RateLimitFilter(interval=0.2)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    passed = [f.filter(record("socket.accept() out of system resource")) for _ in range(1000)]
    assert passed.count(True) == 1
    assert f.filter(record("another message"))
    time.sleep(0.25)
    r = record("socket.accept() out of system resource")
    assert f.filter(r) and "999 similar lines suppressed" in r.getMessage()


@pytest.mark.parametrize("content, mode, words", [
    (None, 0o600, "does not exist"),
    ("", 0o600, "is empty"),
    ("\n  \n", 0o600, "is empty"),
    ("s3cret\n", 0o644, "chmod 600"),
    ("s3cret\n", 0o640, "chmod 600"),
    ("two words\n", 0o600, "one token"),
])
def test_unusable_token_files_are_one_line_user_errors(tmp_path, content, mode, words):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    with pytest.raises(UserError) as e:
        read_token_file(path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_private_token_file_is_read(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    assert read_token_file(path) == "s3cret"
    assert read_token_file(None) == ""


def _slow_app(app: web.Application) -> tuple[web.Application, asyncio.Event, list[int]]:
    """``app`` with ``GET /slow``, which holds every request until the event is set (the
    list counts the requests that entered)."""
    release = asyncio.Event()
    entered = []

    async def slow(_: web.Request) -> web.Response:
        entered.append(1)
        await release.wait()
        return web.Response(text="done")

    app.router.add_get("/slow", slow)
    return app, release, entered


async def test_when_every_connection_is_busy_a_new_one_is_refused_not_queued():
    app, release, entered = _slow_app(_app())
    port = free_port()
    async with serving(f"127.0.0.1:{port}", app, Limits(max_connections=3)):
        busy = await _connections(port, 3, b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        deadline = time.monotonic() + 10
        while len(entered) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(entered) == 3
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_within(reader, 5)  # refused at once: the busy ones are never cut
        writer.close()
        release.set()
        for r, w in busy:
            assert (await asyncio.wait_for(r.read(), 10)).endswith(b"done")
            w.close()
        assert (await _get_ok(port)).startswith(b"HTTP/1.1 200")


async def test_on_disconnect_tells_a_request_whose_connection_was_released_before_it_arrived():
    """connection_lost takes the connection out of the pool before anything else: a request whose
    client left before the pool's middleware saw it finds no connection, and was never told
    (the proxy then queued it for a client that was gone)."""
    pool = _ConnectionPool(lambda: asyncio.Protocol(), cap=4, header_timeout=5.0)
    transport = mock.Mock(spec=asyncio.Transport)
    transport.is_closing.return_value = True  # released: not in pool.open any more
    told: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        on_disconnect(request, lambda: told.append("gone"))
        await asyncio.sleep(0.05)
        return web.Response(text="done")

    await pool.middleware(make_mocked_request("GET", "/", transport=transport), handler)
    assert told == ["gone"]

    # A request served by a server without the pool (no middleware ran) is not told, as before.
    told.clear()
    await handler(make_mocked_request("GET", "/", transport=transport))
    assert told == []


async def test_on_disconnect_tells_once_when_the_client_leaves_and_not_after_it_is_taken_back():
    """What a server run without aiohttp's handler cancellation needs to drop work a gone client
    waited for: a call when the client leaves, none once taken back, a prompt one when the
    client had already left."""
    calls: list[str] = []
    entered: dict[str, asyncio.Event] = {"wait": asyncio.Event(), "late": asyncio.Event(), "kept": asyncio.Event()}
    release = asyncio.Event()

    async def wait(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        forget = on_disconnect(request, lambda: calls.append(name))
        if name == "kept":
            forget()
        entered[name].set()
        await release.wait()
        if name == "late":  # asked only after its client left
            on_disconnect(request, lambda: calls.append("late, after"))
            await asyncio.sleep(0.1)
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/{name}", wait)
    port = free_port()
    async with serving(f"127.0.0.1:{port}", app):
        conns = {}
        for name in entered:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            await asyncio.wait_for(entered[name].wait(), 10)
            conns[name] = writer
        for writer in conns.values():
            writer.close()
        deadline = time.monotonic() + 10
        while sorted(calls) != ["late", "wait"]:
            assert time.monotonic() < deadline, calls
            await asyncio.sleep(0.01)
        release.set()
        while "late, after" not in calls:
            assert time.monotonic() < deadline, calls
            await asyncio.sleep(0.01)
        assert sorted(calls) == ["late", "late, after", "wait"]  # once each; "kept" was taken back


def _closed(registry: CollectorRegistry, listener: str, reason: str) -> float | None:
    return registry.get_sample_value("promreflex_server_connections_closed_total",
                                     {"listener": listener, "reason": reason})


async def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_the_connections_a_server_closes_are_counted_in_its_metrics():
    """A slow client's close (header timeout), an idle connection closed at the cap and a new
    one refused at the cap are counted by listener and reason, created at 0, in the registry of
    the app's /metrics."""
    registry = CollectorRegistry()
    app, release, entered = _slow_app(add_standard_routes(_app(), registry))
    port = free_port()
    listener = f"127.0.0.1:{port}"
    async with serving(listener, app, Limits(max_connections=3, header_timeout=0.5)):
        assert [_closed(registry, listener, r) for r in ("header_timeout", "evicted", "refused")] == [0, 0, 0]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        await writer.drain()
        assert await _closed_within(reader, 10)
        writer.close()
        assert await _until(lambda: _closed(registry, listener, "header_timeout") == 1)
        idle = await _connections(port, 3, b"")  # three idle connections fill the cap
        busy = await _connections(port, 3, b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert await _until(lambda: len(entered) == 3)
        assert _closed(registry, listener, "evicted") == 3  # each busy one closed an idle one
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_within(reader, 5)
        writer.close()
        assert await _until(lambda: _closed(registry, listener, "refused") == 1)
        release.set()
        for r, w in busy + idle:
            await asyncio.wait_for(r.read(), 10)
            w.close()
        # the whole exposition, as Prometheus reads it
        text = generate_latest(registry).decode()
        assert f'promreflex_server_connections_closed_total{{listener="{listener}",reason="refused"}} 1.0' in text
    assert _closed(registry, listener, "refused") is None  # gone with its server


async def test_two_listeners_count_into_one_registry_and_a_server_can_start_again():
    """A process serving two listeners into one /metrics (the admission proxy: its app, and
    its control port with the metrics) gets one family with a listener label each; a server
    stopped and started again in the same process registers again without a duplicate."""
    registry = CollectorRegistry()
    a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    for _ in range(2):
        async with serving(a, _app(), Limits(header_timeout=0.3), registry=registry), \
                serving(b, add_standard_routes(web.Application(), registry)):
            assert _closed(registry, a, "header_timeout") == 0
            assert _closed(registry, b, "header_timeout") == 0
            host, port = a.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /ok HTTP/1.1\r\n")
            await writer.drain()
            assert await _closed_within(reader, 10)
            writer.close()
            assert await _until(lambda: _closed(registry, a, "header_timeout") == 1)
            assert _closed(registry, b, "header_timeout") == 0
        assert _closed(registry, a, "header_timeout") is None


async def test_two_servers_on_port_0_count_apart():
    """Two listeners given as "127.0.0.1:0" in one registry: each is counted under the address
    it was bound to (they shared one label set, and the first one's counts were lost)."""
    registry = CollectorRegistry()
    async with serving("127.0.0.1:0", add_standard_routes(web.Application(), registry)) as a, \
            serving("127.0.0.1:0", add_standard_routes(web.Application(), registry)) as b:
        ports = [app[ADDRESSES][0][1] for app in (a, b)]
        for port in ports:
            assert _closed(registry, f"127.0.0.1:{port}", "refused") == 0
        assert _closed(registry, "127.0.0.1:0", "refused") is None
