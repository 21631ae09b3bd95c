"""The real controller process against hostile clients: idle half-sent requests under a
1,024 open-file limit, an unauthenticated 200 MiB upload, a ``Content-Length`` above the
limit, and ``/api/v1/state`` without the token. Each starts ``python -m promreflex
controller`` on a free loopback port and stops it."""

from __future__ import annotations

import json
import resource
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from promreflex.proc import wait_until
from tests.controller_process import ControllerProcess
from tests.payloads import payload

TOKEN = "edge-s3cret"
CHILD_NOFILE = 1024  # the limit the issue was reported under


@dataclass
class Controller:
    proc: ControllerProcess

    @property
    def port(self) -> int:
        return self.proc.port

    @property
    def url(self) -> str:
        return self.proc.url

    def post_webhook(self, body: bytes, token: str | None = TOKEN, timeout: float = 10.0) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(f"{self.url}/webhook", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)


@contextmanager
def nofile(limit: int) -> Iterator[None]:
    """This process's soft open-file limit set to ``limit`` while the block runs (children
    started in it keep it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def controller(tmp_path) -> Iterator[Controller]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    proc = ControllerProcess(tmp_path / "controller", [{"name": "all", "matchers": ['alertname=~".+"'], "action": "log"}],
                             settings={"token_file": str(token_file), "reconcile_interval": "1h"})
    try:
        with nofile(CHILD_NOFILE):  # the controller runs under the limit of the report (1,024)
            proc.start()
        yield Controller(proc)
    finally:
        proc.stop()


@pytest.fixture
def many_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.fail(f"this test needs {want} open files, the hard limit is {hard}")
    with nofile(max(soft, want)):
        yield


def half_sent(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that each sent part of a request's headers and then nothing."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(True)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def test_idle_half_sent_requests_do_not_starve_a_real_webhook(controller, many_files):
    log_path = controller.proc.log_path
    before = log_path.stat().st_size
    idle = half_sent(controller.port, 1100)
    try:
        assert len(idle) >= 1000  # they all reached the kernel's queue or the server
        t0 = time.monotonic()

        def answered():
            code, body = controller.post_webhook(json.dumps(payload()).encode(), timeout=5)
            return code == 200 and body["accepted"] == 1

        wait_until(answered, timeout=30, interval=0.5, what="a real webhook answered while 1,100 idle connections wait")
        took = time.monotonic() - t0
        time.sleep(2)  # whatever the server logs about the idle connections, let it
        grown = log_path.stat().st_size - before
        print(f"real webhook answered after {took:.2f}s; log grew {grown} bytes")
        assert grown < 20_000, log_path.read_text()[-3000:]
    finally:
        for s in idle:
            s.close()
    assert controller.proc.alive()


def _upload(port: int, headers: bytes, total: int, deadline: float = 30.0) -> tuple[int, bytes, float]:
    """Send ``headers`` then up to ``total`` zero bytes as fast as the server takes them. Returns
    how many body bytes the kernel accepted before the server closed, what it answered, and
    how long until the connection was closed."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    s.sendall(headers)
    chunk = b"\0" * 65536
    sent = 0
    t0 = time.monotonic()
    s.settimeout(1.0)
    try:
        while sent < total and time.monotonic() - t0 < deadline:
            try:
                sent += s.send(chunk)
            except TimeoutError:
                continue  # the server stopped reading; it should close soon
            except OSError:
                break  # reset or broken pipe: closed
        answer = b""
        s.settimeout(max(1.0, deadline - (time.monotonic() - t0)))
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
        return sent, answer, time.monotonic() - t0
    finally:
        s.close()


def test_an_unauthenticated_upload_is_cut_off(controller):
    size = 200 * 1024 * 1024
    headers = (f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {size}\r\n\r\n").encode()
    sent, answer, took = _upload(controller.port, headers, size)
    print(f"unauthenticated 200 MiB upload: {sent} bytes accepted before the close, {took:.2f}s")
    assert sent < 16 * 1024 * 1024, f"the server read {sent} bytes of an unauthenticated upload"
    assert took < 20


def test_a_content_length_above_the_limit_is_refused_before_the_body(controller):
    headers = (f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {TOKEN}\r\nContent-Length: {50 * 1024 * 1024}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", controller.port))
    try:
        s.sendall(headers)  # and no body at all
        s.settimeout(15)
        answer = s.recv(4096)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"too_large" in answer


def test_state_needs_the_token(controller):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{controller.url}/api/v1/state", timeout=10)  # noqa: S310 - loopback
    assert e.value.code == 401
    req = urllib.request.Request(f"{controller.url}/api/v1/state", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        assert "entries" in json.load(resp)


@pytest.mark.parametrize("head, status, reason", [
    (b"Content-Encoding: zstd\r\n", b"400", "bad_body"),  # aiohttp cannot decode it without backports.zstd
    (b"Bad Header Without Colon\r\n", b"400", "malformed"),
])
def test_a_request_the_http_parser_refuses_is_a_counted_rejection_in_one_log_line(controller, head, status, reason):
    """A body in an encoding the server cannot decode got aiohttp's plain 400 ("Please install
    `backports.zstd`") and a traceback in the controller's log, and was counted nowhere."""
    body = b'{"version": "4"}'
    request = (b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n".encode() + head + b"\r\n" + body)
    s = socket.create_connection(("127.0.0.1", controller.port))
    try:
        s.sendall(request)
        s.settimeout(15)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    finally:
        s.close()
    assert answer.split(b" ", 2)[1] == status, answer  # (HTTP/1.0: aiohttp answers a request it could not read so)
    said = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert said["status"] == "rejected" and said["reason"] == reason, said
    assert b"backports" not in answer and b"Bad Header" not in answer  # (nothing of the request quoted back)

    def counted() -> bool:
        with urllib.request.urlopen(f"{controller.url}/metrics", timeout=10) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        return f'promreflex_controller_payload_rejections_total{{reason="{reason}"}} 1.0' in text
    wait_until(counted, timeout=15, what=f"the {reason} rejection counted")
    wait_until(lambda: f'"reason": "{reason}"' in controller.proc.audit_log.read_text()
               or f'"reason":"{reason}"' in controller.proc.audit_log.read_text(), timeout=15, what="the audit line")
    log_text = controller.proc.log_path.read_text()
    assert "Traceback" not in log_text, log_text[-3000:]
    assert "Error handling request" in log_text  # said, in one line
