"""The admission proxy after a stranger's review (2026-11-27): how it reads a path (dot segments,
encoded slashes, backslashes, parameters: nothing skips admission by its spelling), header bytes
that are not UTF-8, what it adds and drops on the way (X-Forwarded-Proto, Proxy-*, a
Content-Type the app did not send), what it refuses and counts (WebSocket, transfer codings,
HTTP/0.9, targets no route takes, the control listener's 404), Expect: 100-continue from a
visitor the waiting room turns away, and the command line (keygen's folder, flag errors, --help,
the stop)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from controllers.admission.proxy import AdmissionProxy
from promreflex.httpd import ADDRESSES, serving
from tests.unit.test_admission_proxy import COOKIE, Rig, client, rig, section, until

MARK = "X-Raw-Upstream"


async def exchange(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """``data`` sent as is on a new connection; everything received until the proxy closes it
    (the requests here say ``Connection: close``, or are refused with a close)."""
    u = URL(url)
    reader, writer = await asyncio.open_connection(u.host, u.port)
    try:
        writer.write(data)
        await writer.drain()
        out = b""
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
        return out
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def head_of(answer: bytes) -> list[bytes]:
    return answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")


def get(path: str, *headers: bytes) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n".encode()
            + b"".join(h + b"\r\n" for h in headers) + b"\r\n")


async def hold_waiting_room(r: Rig) -> None:
    async with client() as c, c.put(f"{r.control}/api/v1/holds/review",
                                    json={"mode": "waiting_room", "lease": 120}) as resp:
        assert resp.status == 200


async def new_session_cookie(r: Rig) -> str:
    async with client() as c, c.get(f"{r.url}/login") as resp:
        assert resp.status == 200
        return next(v for v in resp.headers.getall("Set-Cookie") if v.startswith(COOKIE)).split(";")[0]


# ---------------------------------------------------------------- H1: a path is read as the app may read it
SPELLINGS_OF_LOGIN = [
    "/static/../login", "/static/%2e%2e/login", "/static/%2E./login", "/static/.%2e/login", "/static/..%2flogin",
    "/static/..%2Flogin", "/static/x/..%2F..%2Flogin", "/static//../login", "/static/./../login",
    "/static/x\\..\\..\\login", "/static/x/..%5c..%5clogin", "/static/..;/login", "/static/..;x=1/login",
]


@pytest.mark.parametrize("path", SPELLINGS_OF_LOGIN)
async def test_a_dot_segment_does_not_make_a_page_exempt(path: str) -> None:
    """With waiting-room mode on, a new visitor gets the waiting room for /login however it is
    spelled: an app that resolves dot segments (or decodes %2F, or takes \\ for /, or strips
    ;parameters) would serve /login for these, without a session."""
    async with rig() as r:
        await hold_waiting_room(r)
        answer = await exchange(r.url, get(path))
        assert status_of(answer) == 503, (path, answer[:200])
        assert b"Waiting room" in answer
        assert r.value("promreflex_admission_sessions_rejected_total", reason="waiting_room_mode") == 1


async def test_a_path_exempt_under_every_reading_stays_exempt_and_goes_to_the_app_as_sent() -> None:
    async with rig() as r:
        await hold_waiting_room(r)
        for path in ("/static/app.css", "/static/img/../app.css", "/static/a%2Fb.css", "/static/./x.css"):
            answer = await exchange(r.url, get(path))
            assert status_of(answer) == 200, (path, answer[:200])
            assert f'"path": "{path}"'.encode() in answer  # the target as the client sent it
        assert r.value("promreflex_admission_sessions_rejected_total", reason="waiting_room_mode") == 0


@pytest.mark.parametrize("path", ["/../login", "/static/../../login", "/%2e%2e/login", "/static/..%2F..%2Flogin",
                                  "/static/x/../../../etc/passwd", "/static\\..\\..\\login", "/static/#/../../login"])
async def test_a_target_that_climbs_above_the_root_or_has_a_fragment_is_refused_and_counted(path: str) -> None:
    """nginx answers 400 to a path that climbs above the root; a fragment is no part of a
    request target (an app that does not cut it would resolve what follows it)."""
    async with rig() as r:
        answer = await exchange(r.url, get(path))
        assert status_of(answer) == 400, (path, answer[:200])
        assert r.value("promreflex_admission_request_rejections_total", reason="bad_target") == 1
        assert r.value("promreflex_admission_sessions_admitted_total") == 0


async def test_a_dot_segment_moves_no_request_into_another_page_class() -> None:
    async with rig() as r:
        cookie = await new_session_cookie(r)
        for path in ("/login/../slow?s=0", "/login/%2e%2e/slow?s=0", "/login//../slow?s=0"):
            answer = await exchange(r.url, get(path, f"Cookie: {cookie}".encode()))
            assert status_of(answer) == 200, (path, answer[:200])
        assert r.value("promreflex_admission_requests_total", page="slow", outcome="served") == 3
        assert r.value("promreflex_admission_requests_total", page="login", outcome="served") == 1  # (the first)


def test_routes_follow_the_normalised_path_and_the_memory_knows_each_spelling() -> None:
    proxy = AdmissionProxy(section("http://127.0.0.1:1"))
    login, other = proxy.pages["login"], proxy.pages[proxy.cfg.default_page]
    assert proxy.route("/static/x.css") is None
    for path in SPELLINGS_OF_LOGIN:
        # the page class is the normalised path's (nginx's reading: "\\" and ";" are no separators
        # there), and no spelling is exempt
        page = login if "\\" not in path and "%5c" not in path and ";" not in path else other
        assert proxy.route(path) is page, path
        assert proxy.route(path) is page, path  # (from the memory)
    assert proxy.route("/static/%2e%2e/elsewhere") is other
    assert proxy.route("//login") is login  # empty segments merged, as nginx does
    assert proxy.route("//static/x.css") is other  # an app that keeps the empty segment: not /static/
    assert proxy.route("/login%2Fx") is login and proxy.route("/static/a%2Fb.css") is None
    assert proxy.route("/caf%C3%A9/..") is other
    climbs = proxy.route("/../login")
    assert climbs is not None and climbs not in proxy.pages.values()
    # a long ambiguous path is read the normalised way only (its readings cost time in proportion
    # to its length): never exempt, and refused when that reading climbs
    assert proxy.route("/static/" + "x/" * 300 + "..%2F" * 300) is other
    assert proxy.route("/static/" + "x/" * 300 + "..%2F" * 302) is climbs
    assert proxy.route("/static/" + "x/" * 300 + "y.css") is None  # long, nothing ambiguous: exempt


# ---------------------------------------------------------------- M1, L2: header bytes, Content-Type
@contextlib.asynccontextmanager
async def raw_upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    """An app written on sockets: records each request's head as received, and answers with
    header bytes that are not UTF-8 and no Content-Type; ``/big`` with a body above what the
    proxy reads whole (it streams), ``/chunked`` chunked."""
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
                if m:
                    await reader.readexactly(int(m.group(1)))
                path = head.split(b" ", 2)[1]
                common = (b"X-Resp: caf\xe9\r\nContent-Disposition: attachment; filename=\"r\xe9sum\xe9.pdf\"\r\n"
                          b"X-Utf8: caf\xc3\xa9\r\n")
                if path == b"/big":
                    body = b"b" * 100_000
                    writer.write(b"HTTP/1.1 200 Gr\xfcn\r\n" + common + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                elif path == b"/chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\n" + common + b"Transfer-Encoding: chunked\r\n\r\n"
                                 b"3\r\nabc\r\n0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\n" + common + b"Content-Length: 3\r\n\r\nok\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heads
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def raw_rig() -> AsyncIterator[tuple[Rig, list[bytes]]]:
    async with raw_upstream() as (port, heads):
        proxy = AdmissionProxy(section(f"http://127.0.0.1:{port}"))
        await proxy.start()
        try:
            async with serving("127.0.0.1:0", proxy.app(), **proxy.server_kwargs()) as papp, \
                    serving("127.0.0.1:0", proxy.control_app()) as capp:
                yield (Rig(proxy, f"http://127.0.0.1:{papp[ADDRESSES][0][1]}",
                           f"http://127.0.0.1:{capp[ADDRESSES][0][1]}"), heads)
        finally:
            await proxy.close()


@pytest.mark.parametrize("path", ["/static/x", "/login", "/big", "/chunked"])
async def test_header_bytes_that_are_not_utf8_pass_byte_for_byte_both_ways(path: str) -> None:
    """RFC 9110 5.5: obs-text is opaque data. aiohttp decodes such bytes as surrogate escapes
    and its writer dropped them: ``caf\\xe9`` reached the app as ``caf``, and the client too."""
    async with raw_rig() as (r, heads):
        answer = await exchange(r.url, get(path, b"X-Name: caf\xe9", b"X-Utf8: caf\xc3\xa9",
                                           b'Content-Disposition: attachment; filename="r\xe9sum\xe9.pdf"'))
        head = head_of(answer)
        assert status_of(answer) == 200, answer[:300]
        assert b"X-Resp: caf\xe9" in head and b'Content-Disposition: attachment; filename="r\xe9sum\xe9.pdf"' in head
        assert b"X-Utf8: caf\xc3\xa9" in head
        if path == "/big":
            assert head[0] == b"HTTP/1.1 200 Gr\xfcn"
        sent = heads[-1].split(b"\r\n")
        assert b"X-Name: caf\xe9" in sent and b"X-Utf8: caf\xc3\xa9" in sent
        assert b'Content-Disposition: attachment; filename="r\xe9sum\xe9.pdf"' in sent
        # and the proxy's own heads are as before: ASCII, its cookie on a new session's answer
        if path != "/static/x":
            assert any(line.startswith(f"Set-Cookie: {COOKIE}=v1.".encode()) for line in head)


@pytest.mark.parametrize("path", ["/static/x", "/login", "/big", "/chunked"])
async def test_an_answer_without_content_type_gets_none(path: str) -> None:
    """aiohttp labels a body without a type application/octet-stream, which makes a browser
    download what it would have shown (RFC 9110 8.3 leaves an untyped body to the recipient)."""
    async with raw_rig() as (r, _):
        answer = await exchange(r.url, get(path))
        assert status_of(answer) == 200
        assert not [line for line in head_of(answer) if line.lower().startswith(b"content-type")], answer[:300]


# ---------------------------------------------------------------- M2: X-Forwarded-Proto
async def test_x_forwarded_proto_passes_as_nginx_set_it_and_is_never_made_up() -> None:
    async with rig() as r, client() as c:
        async with c.get(f"{r.url}/login", headers={"X-Forwarded-Proto": "https"}) as resp:
            sent = [(k.lower(), v) for k, v in (await resp.json())["headers"]]
        assert [v for k, v in sent if k == "x-forwarded-proto"] == ["https"]
        async with c.get(f"{r.url}/static/x") as resp:
            sent = [(k.lower(), v) for k, v in (await resp.json())["headers"]]
        assert "x-forwarded-proto" not in dict(sent)  # the proxy does not know the visitor's scheme


# ---------------------------------------------------------------- M3: upgrades
@pytest.mark.parametrize("path", ["/login/ws", "/static/ws"])
async def test_a_websocket_gets_a_clear_counted_501_and_no_session(path: str) -> None:
    async with rig() as r, client() as c:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await c.ws_connect(f"{r.url}{path}")
        assert err.value.status == 501
        assert r.value("promreflex_admission_request_rejections_total", reason="upgrade") == 1
        assert r.value("promreflex_admission_sessions_admitted_total") == 0
        # an h2c upgrade (curl --http2 on http://) is ignored, as a server may (RFC 9110 7.8)
        async with c.get(f"{r.url}/login", headers={"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c",
                                                    "HTTP2-Settings": "AAMAAABkAAQAoAAAAAIAAAAA"}) as resp:
            assert resp.status == 200
            sent = {k.lower() for k, _ in (await resp.json())["headers"]}
        assert "upgrade" not in sent and "http2-settings" not in sent


# ---------------------------------------------------------------- L3: Proxy-*
async def test_proxy_and_every_proxy_dash_header_are_dropped() -> None:
    async with rig() as r, client() as c:
        for path in ("/login", "/static/x"):
            async with c.get(f"{r.url}{path}", headers={"Proxy": "http://evil.example:1", "Proxy-Foo": "bar",
                                                        "Proxy-Authorization": "Basic eDp5", "Proxyish": "kept",
                                                        "X-Proxy": "kept"}) as resp:
                sent = {k.lower(): v for k, v in (await resp.json())["headers"]}
            assert not [k for k in sent if k == "proxy" or k.startswith("proxy-")], sent
            assert sent["proxyish"] == "kept" and sent["x-proxy"] == "kept"


# ---------------------------------------------------------------- L5: counted
async def test_exempt_requests_are_counted_by_outcome() -> None:
    async with rig() as r, client() as c:
        for _ in range(3):
            async with c.get(f"{r.url}/static/x") as resp:
                assert resp.status == 200
        assert r.value("promreflex_admission_exempt_requests_total", outcome="served") == 3


@pytest.mark.parametrize("outcome", ["client_gone", "upstream_error"])
async def test_exempt_requests_that_fail_are_counted(outcome: str) -> None:
    async with rig() as r, client() as c:
        if outcome == "upstream_error":
            r.proxy.upstream = "http://127.0.0.1:1"
            async with c.get(f"{r.url}/static/x") as resp:
                assert resp.status == 502
        else:
            with pytest.raises(asyncio.TimeoutError):
                await c.get(f"{r.url}/static/x?s=5", timeout=aiohttp.ClientTimeout(total=0.3))
        await until(lambda: r.value("promreflex_admission_exempt_requests_total", outcome=outcome) == 1)
        assert r.value("promreflex_admission_exempt_requests_total", outcome="served") == 0


@pytest.mark.parametrize("request_line", [b"OPTIONS * HTTP/1.1", b"CONNECT evil.example:443 HTTP/1.1"])
async def test_a_target_no_route_takes_is_refused_as_bad_target(request_line: bytes) -> None:
    async with rig() as r:
        answer = await exchange(r.url, request_line + b"\r\nHost: shop.example\r\nConnection: close\r\n\r\n")
        assert status_of(answer) == 400, answer[:200]
        assert r.value("promreflex_admission_request_rejections_total", reason="bad_target") == 1


async def test_the_control_listeners_404_is_counted() -> None:
    async with rig() as r, client() as c:
        async with c.get(f"{r.control}/api/v1/nothing") as resp:
            assert resp.status == 404
        assert r.value("promreflex_admission_control_requests_total", result="not_found") == 1
        async with c.post(f"{r.control}/api/v1/state") as resp:
            assert resp.status == 405
        assert r.value("promreflex_admission_control_requests_total", result="bad_request") == 1


# ---------------------------------------------------------------- L6: protocol edges
async def test_http_0_9_and_transfer_codings_other_than_chunked_are_refused_and_counted() -> None:
    async with rig() as r:
        answer = await exchange(r.url, b"GET /login\r\n\r\n")
        assert status_of(answer) == 400
        assert r.value("promreflex_admission_request_rejections_total", reason="malformed") == 1
        answer = await exchange(r.url, b"POST /login/raw HTTP/1.1\r\nHost: s\r\nConnection: close\r\n"
                                       b"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        assert status_of(answer) == 501
        assert r.value("promreflex_admission_request_rejections_total", reason="transfer_coding") == 1
        assert r.value("promreflex_admission_sessions_admitted_total") == 0
        answer = await exchange(r.url, b"POST /login/raw HTTP/1.1\r\nHost: s\r\nConnection: close\r\n"
                                       b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        assert status_of(answer) == 200 and b'"length": 3' in answer


@pytest.mark.parametrize("case", ["line beyond the parser's limit", "too many headers", "control character",
                                  "not HTTP"])
async def test_what_aiohttps_parser_refuses_is_answered_without_quoting_the_request(case: str) -> None:
    """aiohttp's own error page quoted the offending line (here an HttpOnly cookie of the app);
    more than its 128 headers got 400 although nginx passes them: 431 (RFC 6585)."""
    secret = b"app_sid=SECRET-HTTPONLY"
    head = b"GET /login HTTP/1.1\r\nHost: s\r\nConnection: close\r\n"
    data, status, reason = {
        "line beyond the parser's limit": (head + b"Cookie: " + secret + b"; b=" + b"a" * 40_000 + b"\r\n\r\n",
                                           431, "header_too_large"),
        "too many headers": (head + b"Cookie: " + secret + b"\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
                             + b"\r\n", 431, "header_too_large"),
        "control character": (head + b"Cookie: " + secret + b"\x01\r\n\r\n", 400, "malformed"),
        "not HTTP": (secret + b" /login HTTP/1.1\r\n\r\n", 400, "malformed"),  # (aiohttp: "Invalid method")
    }[case]
    async with rig() as r:
        answer = await exchange(r.url, data)
        assert status_of(answer) == status, answer[:300]
        assert b"SECRET" not in answer and b"app_sid" not in answer, answer[:300]
        await until(lambda: r.value("promreflex_admission_request_rejections_total", reason=reason) == 1)
        async with client() as c, c.get(f"{r.url}/login") as resp:  # and it keeps serving
            assert resp.status == 200


# ---------------------------------------------------------------- L7: Expect
async def test_expect_100_continue_from_a_visitor_turned_away_gets_the_503_before_any_body() -> None:
    async with rig() as r:
        await hold_waiting_room(r)
        u = URL(r.url)
        reader, writer = await asyncio.open_connection(u.host, u.port)
        try:
            writer.write(b"POST /login HTTP/1.1\r\nHost: s\r\nContent-Length: 20000000\r\nExpect: 100-continue\r\n\r\n")
            await writer.drain()
            first = await asyncio.wait_for(reader.readline(), 10)
        finally:
            writer.close()
        assert first.startswith(b"HTTP/1.1 503"), first
        assert r.value("promreflex_admission_sessions_rejected_total", reason="waiting_room_mode") == 1


async def test_expect_100_continue_is_answered_once_the_visitor_is_let_in() -> None:
    async with rig() as r:
        cookie = await new_session_cookie(r)
        for path, headers in (("/login/raw", b""), ("/login/raw", f"Cookie: {cookie}\r\n".encode()),
                              ("/static/x", b"")):
            u = URL(r.url)
            reader, writer = await asyncio.open_connection(u.host, u.port)
            try:
                writer.write(f"POST {path} HTTP/1.1\r\nHost: s\r\nConnection: close\r\nContent-Length: 5\r\n"
                             "Expect: 100-continue\r\n".encode() + headers + b"\r\n")
                await writer.drain()
                first = await asyncio.wait_for(reader.readline(), 10)
                assert first == b"HTTP/1.1 100 Continue\r\n", (path, first)
                writer.write(b"hello")
                rest = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            assert rest.split(b"\r\n", 2)[1].startswith(b"HTTP/1.1 200"), rest[:200]


async def test_expect_100_continue_counts_against_the_sessions_max_in_flight_from_its_admission() -> None:
    """A review of the fix above: the max_in_flight check came before the body and the count after
    it, so with Expect one session got every request in (4 of 4 with max_in_flight 1)."""
    async with rig(session__max_in_flight=1) as r:
        cookie = await new_session_cookie(r)
        u = URL(r.url)
        conns = [await asyncio.open_connection(u.host, u.port) for _ in range(4)]
        try:
            for _, writer in conns:  # every head before any body: all four pass the check at once
                writer.write(f"POST /slow?s=1 HTTP/1.1\r\nHost: s\r\nConnection: close\r\nCookie: {cookie}\r\n"
                             "Content-Length: 3\r\nExpect: 100-continue\r\n\r\n".encode())
                await writer.drain()
            firsts = [await asyncio.wait_for(reader.readline(), 10) for reader, _ in conns]
        finally:
            for _, writer in conns:
                writer.close()
        assert sorted(line.split(b" ", 2)[1] for line in firsts) == [b"100", b"429", b"429", b"429"], firsts


# ---------------------------------------------------------------- L8: the command line
def test_keygen_creates_the_key_files_folder_0700(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from controllers.admission.cli import cmd_keygen

    key_file = tmp_path / "etc" / "promreflex" / "admission-keys"
    assert cmd_keygen(argparse.Namespace(key_file=key_file)) == 0
    assert stat.S_IMODE(os.stat(key_file.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert "created folder" in capsys.readouterr().out
    assert cmd_keygen(argparse.Namespace(key_file=key_file)) == 0  # a second key, the folder as it is
    assert len(key_file.read_text().splitlines()) == 2


def test_a_flags_error_is_not_blamed_on_the_defaults() -> None:
    from controllers.admission.config import load_section
    from promreflex.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_section(None, {"control.listen_address": "0.0.0.0:18829"})
    assert "(defaults)" not in str(err.value)
    assert "command-line" in err.value.source and "command line" in err.value.problems[0]


def test_help_text_has_no_rst_markup() -> None:
    from controllers.admission.cli import register

    parser = argparse.ArgumentParser(prog="promreflex")
    register(parser.add_subparsers(dest="command"))
    sub = parser._subparsers._group_actions[0].choices["admission"]  # type: ignore[union-attr]
    assert "``" not in sub.format_help()


async def test_a_stop_says_how_many_requests_it_waits_for_and_how_long(caplog: pytest.LogCaptureFixture) -> None:
    from controllers.admission.cli import serve
    from promreflex.proc import free_port
    from tests.unit.test_admission_proxy import upstream_app

    async with serving("127.0.0.1:0", upstream_app()) as up:
        listen, control = free_port(), free_port()
        cfg = section(f"http://127.0.0.1:{up[ADDRESSES][0][1]}", listen_address=f"127.0.0.1:{listen}",
                      control__listen_address=f"127.0.0.1:{control}")
        ready, stop = asyncio.Event(), asyncio.Event()
        with caplog.at_level(logging.INFO, logger="promreflex.admission"):
            task = asyncio.create_task(serve(cfg, ready, stop))
            await asyncio.wait_for(ready.wait(), 30)
            async with client() as c:
                slow = asyncio.ensure_future(c.get(f"http://127.0.0.1:{listen}/slow?s=1"))
                deadline = time.monotonic() + 10
                while True:
                    async with c.get(f"http://127.0.0.1:{control}/api/v1/state") as resp:
                        if (await resp.json())["pages"]["slow"]["in_flight"] == 1:
                            break
                    assert time.monotonic() < deadline, "the request never reached the app"
                    await asyncio.sleep(0.02)
                stop.set()
                resp = await slow
                assert resp.status == 200
                resp.release()
            assert await asyncio.wait_for(task, 30) == 0
    assert re.search(r"stopping: .*waiting for 1 request\(s\) in progress.*at most 60s", caplog.text), caplog.text
    assert "admission proxy stopped" in caplog.text


async def test_a_stop_answers_new_sessions_still_queued_at_once() -> None:
    """A restart during a crowd: the proxy closed its port at SIGTERM but waited up to
    max_queue_wait for the new sessions still queued, so every admitted session's request met a
    closed port meanwhile (a review: 29 s of 502s). They are answered at once now: a waiting-room
    page saying the shop restarts, to retry in 2 s (the next process takes them)."""
    from controllers.admission.cli import serve
    from promreflex.proc import free_port
    from tests.unit.test_admission_proxy import upstream_app

    async with serving("127.0.0.1:0", upstream_app()) as up:
        listen, control = free_port(), free_port()
        cfg = section(f"http://127.0.0.1:{up[ADDRESSES][0][1]}", listen_address=f"127.0.0.1:{listen}",
                      control__listen_address=f"127.0.0.1:{control}",
                      session_scheduler={"initial_interval": 30, "min_interval": 30, "max_interval": 60},
                      session__max_queue_wait=25)
        ready, stop = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(cfg, ready, stop))
        await asyncio.wait_for(ready.wait(), 30)
        sessions = [client() for _ in range(3)]
        try:
            waiting = [asyncio.ensure_future(c.get(f"http://127.0.0.1:{listen}/browse")) for c in sessions]
            async with client() as probe:
                deadline = time.monotonic() + 20
                while True:
                    async with probe.get(f"http://127.0.0.1:{control}/api/v1/state") as resp:
                        if (await resp.json())["sessions"]["queue"] >= 2:
                            break
                    assert time.monotonic() < deadline, "the sessions never queued"
                    await asyncio.sleep(0.02)
            stop.set()
            answers = []
            for w in waiting:
                resp = await w
                answers.append((resp.status, resp.headers.get("Retry-After"), await resp.text()))
        finally:
            for c in sessions:
                await c.close()
        assert await asyncio.wait_for(task, 30) == 0
    queued = [a for a in answers if a[0] == 503]
    assert len(queued) >= 2 and all(a[1] == "2" and "restarting" in a[2] for a in queued), answers


async def test_a_cookie_of_the_previous_process_is_readmitted_also_from_the_same_second() -> None:
    """After a restart a valid cookie of the process before is tracked again. A cookie issued in
    the second the new process started (a crash and restart within it, or the old process still
    draining) was refused as ended and the visitor sent back to the queue (a review)."""
    from controllers.admission.cookies import KeyRing

    ring = KeyRing.ephemeral()
    async with rig(ring=ring) as first, client() as c:
        async with c.get(f"{first.url}/browse") as resp:
            assert resp.status == 200
        cookies = {m.key: m.value for m in c.cookie_jar}
    async with rig(ring=ring) as second, client() as c2:
        ticket = second.proxy.codec.verify(cookies[COOKIE], time.time())
        second.proxy.sessions.started = float(ticket.issued) + 0.5  # started in the second the cookie was issued
        c2.cookie_jar.update_cookies(cookies, URL(second.url))
        async with c2.get(f"{second.url}/browse") as resp:
            assert resp.status == 200
            assert COOKIE not in {m.key for m in resp.cookies.values()}  # kept, not replaced
        assert second.value("promreflex_admission_sessions_readmitted_total") == 1
        assert second.value("promreflex_admission_cookie_rejections_total", reason="ended") == 0


async def test_the_session_cookie_can_be_scoped_to_the_shops_path() -> None:
    """Two shops under sub-paths of one host, each behind its own proxy: both set the same name
    at Path=/, so a visit to one ended the session at the other (a review). Name and path are
    configurable."""
    async with rig(session__cookie_name="shopA_session", session__cookie_path="/shopA/") as r, client() as c:
        async with c.get(f"{r.url}/browse") as resp:
            cookie = next(v for v in resp.headers.getall("Set-Cookie") if v.startswith("shopA_session="))
        assert "; Path=/shopA/;" in cookie
    with pytest.raises(Exception, match="cookie_path"):
        section("http://127.0.0.1:1", session__cookie_path="shopA; Domain=evil")


async def test_an_http10_client_asking_for_keep_alive_gets_a_streamed_answer_that_ends() -> None:
    """HTTP/1.0 has no chunked encoding: an answer of no length ends with the connection. A
    client sending Connection: keep-alive waited 60 s for an end never sent (a review)."""
    async with rig() as r:
        url = URL(r.url)
        async with client() as c, c.get(f"{r.url}/login") as first:  # a session (the app's pages need one)
            cookies = "; ".join(f"{m.key}={m.value}" for m in c.cookie_jar)
            assert first.status == 200
        reader, writer = await asyncio.open_connection(url.host, url.port)
        try:
            writer.write(f"GET /stream HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nCookie: {cookies}\r\n\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(-1), 20)  # to the end of the connection
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], head[:80]
        assert b"chunked" not in head.lower()
        assert body == b"".join(bytes([65 + i]) * 10_000 for i in range(20))


async def test_a_previous_process_session_not_readmitted_for_lack_of_room_is_not_counted_as_ended() -> None:
    """A readmission refused because ``max_sessions`` is reached was counted as ``ended``, which
    the runbook reads as cookies replayed after a logout (a review's suspicion, J)."""
    from controllers.admission.cookies import KeyRing

    ring = KeyRing.ephemeral()
    async with rig(ring=ring) as first, client() as c:
        async with c.get(f"{first.url}/browse") as resp:
            assert resp.status == 200
        cookies = {m.key: m.value for m in c.cookie_jar}
    async with rig(ring=ring, session__max_sessions=1) as second, client() as other, client() as c2:
        async with other.get(f"{second.url}/browse") as resp:  # the one session room taken
            assert resp.status == 200
        c2.cookie_jar.update_cookies(cookies, URL(second.url))
        async with c2.get(f"{second.url}/browse") as resp:
            await resp.read()
        assert second.value("promreflex_admission_sessions_readmitted_total") == 0
        assert second.value("promreflex_admission_cookie_rejections_total", reason="not_readmitted") == 1
        assert second.value("promreflex_admission_cookie_rejections_total", reason="ended") == 0


async def test_holds_survive_a_restart_with_a_holds_file(tmp_path: Path) -> None:
    """A restart dropped every hold: one set by hand for good, the controller's until its next
    renewal; the door opened in the middle of an incident (a stranger's review, Q F2)."""
    holds = tmp_path / "state" / "holds.json"
    async with rig(control__holds_file=str(holds)) as first, client() as c:
        async with c.put(f"{first.control}/api/v1/holds/flash", json={"mode": "waiting_room", "lease": 600}) as resp:
            assert resp.status == 200
        async with c.put(f"{first.control}/api/v1/holds/short", json={"mode": "session_cap", "session_cap": 5,
                                                                       "lease": 0.2}) as resp:
            assert resp.status == 200
    await asyncio.sleep(0.3)  # the short lease ends while no proxy runs
    async with rig(control__holds_file=str(holds)) as second, client() as c:
        assert set(second.proxy.holds.holds) == {"flash"}
        assert 590 < second.proxy.holds.holds["flash"].expires - second.proxy.clock() <= 600
        async with c.get(f"{second.url}/login") as resp:
            assert resp.status == 503 and "lets no new visitors in" in await resp.text()
        async with c.delete(f"{second.control}/api/v1/holds/flash") as resp:
            assert resp.status == 200
    async with rig(control__holds_file=str(holds)) as third:
        assert third.proxy.holds.holds == {}
    holds.write_text("{not json")
    async with rig(control__holds_file=str(holds)) as fourth:  # said in the log, started without
        assert fourth.proxy.holds.holds == {}


@pytest.mark.parametrize("budget", [0, 300_000])
async def test_request_bodies_held_in_memory_are_bounded_across_requests(monkeypatch, budget: int) -> None:
    """Each queued request read up to 1 MiB of its body first: 500 cookieless 1 MB POSTs in the
    session queue took 550 MB (a stranger's review, Q F8). Past MAX_BUFFERED_TOTAL a request
    streams its body once let in; every body still reaches the app whole."""
    import hashlib

    from controllers.admission import proxy as proxy_module

    monkeypatch.setattr(proxy_module, "MAX_BUFFERED_TOTAL", budget)
    bodies = [os.urandom(400_000) for _ in range(4)]
    peak = 0
    async with rig() as r, client() as c:
        async def post(body: bytes) -> dict:
            async with c.post(f"{r.url}/login/raw", data=body) as resp:
                assert resp.status == 200
                return await resp.json()

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, r.proxy.buffered)
                await asyncio.sleep(0.001)

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            got = await asyncio.gather(*(post(b) for b in bodies))
        finally:
            watcher.cancel()
        assert [g["sha256"] for g in got] == [hashlib.sha256(b).hexdigest() for b in bodies]
        assert r.proxy.buffered == 0
    assert peak <= budget + 4 * 256 * 1024  # the budget, plus at most a first chunk per request beyond it
