"""The webhook receiver: every corpus payload accepted or rejected with a reason; broken and
hostile bodies get a 4xx, never a 5xx, and are counted and audited."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.server import build_app
from promreflex.config import ControllerConfig, Route
from promreflex.httpd import LIMITS, Limits
from tests.corpus import corpus, needs_corpus
from tests.payloads import alert, payload

CORPUS = corpus("alertmanager-webhooks")

# What the receiver makes of each corpus file (decided by reading them, see docs/decisions.md):
# msteams fixtures are hand-made version-4 payloads without per-alert status (no real
# Alertmanager sends those); their status is derived from endsAt, as for curl and scripts. The others carry no version and are rejected.
EXPECTED = {
    "am_executor_alert_payload.json": (422, "unsupported webhook version None"),
    "msteams_12_alerts.json": (200, 12),
    "msteams_disable_grouping.json": (200, 2),
    "msteams_label.json": (200, 1),
    "msteams_large_prom_post_request.json": (200, 19),
    "msteams_prom_post_request.json": (200, 1),
    "msteams_too_large.json": (200, 5),
    "msteams_without_common_summary.json": (200, 1),
    "notifmgr_alert-auditing.json": (422, "unsupported webhook version None"),
    "notifmgr_alert.json": (422, "unsupported webhook version None"),
    "notifmgr_alert15.json": (422, "unsupported webhook version None"),
    "notifmgr_alert3.json": (422, "unsupported webhook version None"),
    "notifmgr_alert6.json": (422, "unsupported webhook version None"),
    "notifmgr_alerts-without-namespace.json": (422, "unsupported webhook version None"),
}


async def _client(tmp_path, token: str | None = "s3cret", limits: Limits | None = None):
    token_file = None
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.json", max_body_bytes=256 * 1024,
        token_file=token_file, alertmanager_url=None,
        routes=[Route(name="all", matchers=['alertname=~".+"'], action="log")],
    )
    registry = CollectorRegistry()
    audit = AuditLog(cfg.audit_log)
    engine = Engine(cfg, ControllerMetrics(registry, ["log"]), audit)
    app = build_app(cfg, engine, engine.metrics, registry, audit)
    if limits is not None:
        app[LIMITS] = limits
    c = TestClient(ServedAsInProduction(app))
    await c.start_server()
    c.registry, c.engine, c.audit_path = registry, engine, cfg.audit_log
    return c


class ServedAsInProduction(TestServer):
    """aiohttp's TestServer cancels a handler whose client went away (``handler_cancellation``
    True); the controller's server (promreflex.httpd.serving) leaves it running, so a body cut
    mid-way is an error the handler sees, as in production."""

    async def _make_runner(self, **kwargs):
        from aiohttp.web_runner import AppRunner

        return AppRunner(self.app, **{**kwargs, "handler_cancellation": False})


@pytest.fixture
async def client(tmp_path):
    c = await _client(tmp_path)
    yield c
    await c.close()
    await c.engine.shutdown()


async def raw_request(port: int, head: bytes, body: bytes = b"", wait: float = 10.0) -> bytes:
    """Send bytes as they are (headers no HTTP client would send) and return the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), wait)
    finally:
        writer.close()


def rejections(c, reason: str) -> float | None:
    return c.registry.get_sample_value("promreflex_controller_payload_rejections_total", {"reason": reason})


AUTH = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}


@needs_corpus
def test_corpus_is_complete():
    assert CORPUS.is_dir(), f"corpus not found at {CORPUS}"
    assert sorted(p.name for p in CORPUS.glob("*.json")) == sorted(EXPECTED)


@needs_corpus
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_corpus_payload(client, name):
    code, detail = EXPECTED[name]
    resp = await client.post("/webhook", data=(CORPUS / name).read_bytes(), headers=AUTH)
    body = await resp.json()
    assert resp.status == code, body
    if code == 200:
        assert body["accepted"] + body["duplicate"] + body["stale"] == detail
    else:
        assert body["reason"] == "invalid_payload" and detail in body["message"]


@pytest.mark.parametrize("ends", ["absent", None, "9999-01-01T00:00:00Z", "2020-01-01T00:00:00Z"])
async def test_a_hand_made_alert_without_status_gets_the_status_alertmanager_would_derive(client, ends):
    a = _no_status()
    if ends == "absent":
        del a["endsAt"]
    else:
        a["endsAt"] = ends
    resp = await client.post("/webhook", json={**payload(), "alerts": [a]}, headers=AUTH)
    assert resp.status == 200, await resp.text()
    await client.engine.drain()
    fired = [r for r in read_audit(client.audit_path) if r["event"] == "decision" and r["transition"] == "fire"]
    assert len(fired) == (0 if ends == "2020-01-01T00:00:00Z" else 1)


async def test_valid_payload_is_accepted_and_acted_on(client):
    resp = await client.post("/webhook", json=payload(alert()), headers=AUTH)
    assert resp.status == 200 and (await resp.json())["accepted"] == 1
    await client.engine.drain()
    decisions = [r for r in read_audit(client.audit_path) if r["event"] == "decision"]
    assert [(d["action"], d["transition"], d["result"]) for d in decisions] == [("log", "fire", "ok")]


@pytest.mark.parametrize(
    "body, code, reason, words",
    [
        (b'{"version": "4", "status": "fir', 400, "not_json", "not JSON"),
        (b"\xff\xfe\x00garbage", 400, "not_json", "not JSON"),
        (b"[]", 422, "invalid_payload", "JSON object"),
        (json.dumps({**payload(), "status": 5}).encode(), 422, "invalid_payload", "status"),
        (json.dumps({**payload(), "alerts": []}).encode(), 422, "invalid_payload", "alerts"),
        (json.dumps({**payload(), "alerts": "x"}).encode(), 422, "invalid_payload", "alerts"),
        (json.dumps(payload(alert(starts="yesterday"))).encode(), 422, "invalid_payload", "startsAt"),
        (json.dumps(payload(alert(starts="2026-11-23T10:00:00"))).encode(), 422, "invalid_payload", "time zone"),
        # a number was taken as Unix seconds (1970: 200 and "stale"; a stranger's review)
        (json.dumps(payload(alert(starts=123))).encode(), 422, "invalid_payload", "RFC 3339 text"),
        (json.dumps({**payload(), "alerts": [{**alert(), "endsAt": 1.5e9}]}).encode(), 422, "invalid_payload", "endsAt"),
        (json.dumps({**payload(), "alerts": [{**alert(), "labels": {"a": 1}}]}).encode(), 422, "invalid_payload", "labels"),
        (json.dumps({**payload(), "version": "3"}).encode(), 422, "invalid_payload", "version '3'"),
    ],
)
async def test_broken_payloads_get_a_4xx_with_a_reason(client, body, code, reason, words):
    resp = await client.post("/webhook", data=body, headers=AUTH)
    got = await resp.json()
    assert resp.status == code, got
    assert got["reason"] == reason and words in got["message"]
    assert client.registry.get_sample_value("promreflex_controller_payload_rejections_total", {"reason": reason}) == 1
    assert client.engine.entries == {}


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b'{"version": "4", "truncatedAlerts": ' + b"9" * 5000 + b"}"


def _no_status(**fields):
    a = {**alert(), **fields}
    del a["status"]
    return a


@pytest.mark.parametrize(
    "body, code, reason, words",
    [
        (DEEP, 400, "not_json", "nested too deeply"),
        (b'{"version": "4", "alerts": ' + DEEP + b"}", 400, "not_json", "nested too deeply"),
        (HUGE_INT, 400, "not_json", "4300"),
        (json.dumps(payload(alert(starts="0001-01-01T00:30:00+01:00"))).encode(), 422, "invalid_payload", "startsAt"),
        (json.dumps(payload(alert(ends="9999-12-31T23:59:59-01:00"))).encode(), 422, "invalid_payload", "endsAt"),
        (json.dumps({**payload(), "alerts": [_no_status(endsAt="9999-12-31T23:59:59-01:00")]}).encode(), 422,
         "invalid_payload", "endsAt"),
        (json.dumps({**payload(), "version": [[["4"]]]}).encode(), 422, "invalid_payload", "version list"),
        (json.dumps({**payload(), "version": 4}).encode(), 422, "invalid_payload", "a JSON number"),
        (b'{"version": ' + b"9" * 400 + b"}", 422, "invalid_payload", "unsupported webhook version int"),
        (b'{"version": NaN}', 400, "not_json", "NaN is not a JSON number"),
        (json.dumps(payload()).encode().replace(b'"truncatedAlerts": 0', b'"truncatedAlerts": -Infinity'), 400,
         "not_json", "-Infinity is not a JSON number"),
    ],
    ids=["deep", "deep-inside", "huge-int", "starts-before-year-1", "ends-after-9999", "derived-status-overflow",
         "version-list", "version-number", "version-huge", "nan", "infinity"],
)
async def test_hostile_bodies_are_classified_counted_and_audited(client, body, code, reason, words):
    resp = await client.post("/webhook", data=body, headers=AUTH)
    got = await resp.json()
    assert resp.status == code, got
    assert got["reason"] == reason and words in got["message"], got
    assert rejections(client, reason) == 1
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": str(code)}) == 1
    audited = [r for r in read_audit(client.audit_path) if r["event"] == "rejected"]
    assert [(r["code"], r["reason"]) for r in audited] == [(code, reason)]
    assert client.engine.entries == {}


NON_UTF8 = b"Authorization: Bearer s3cr\xff\xfet\r\n"


@pytest.mark.parametrize("token, code", [("s3cret", 401), (None, 200)], ids=["token", "no-token"])
async def test_a_non_utf8_authorization_header_is_a_401_or_ignored_without_a_token(tmp_path, token, code):
    c = await _client(tmp_path, token=token)
    try:
        body = json.dumps(payload()).encode()
        head = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + NON_UTF8
                + f"Content-Length: {len(body)}\r\n\r\n".encode())
        answer = await raw_request(c.server.port, head, body)
        assert answer.startswith(f"HTTP/1.1 {code}".encode()), answer
        assert rejections(c, "unauthorized") == (1 if code == 401 else 0)
        assert (b'"accepted": 1' in answer) == (code == 200)
    finally:
        await c.close()
        await c.engine.shutdown()


def _encoded(encoding: bytes, body: bytes) -> bytes:
    return (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret\r\n"
            b"Content-Encoding: " + encoding + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


@pytest.mark.parametrize("raw, code, reason", [
    (_encoded(b"gzip", b"not gzip"), 400, "bad_body"),
    (_encoded(b"deflate", zlib.compress(b"[" * 10_000_000)), 413, "too_large"),  # 10 MB once inflated
], ids=["bad-gzip", "deflate-bomb"])
async def test_bodies_that_do_not_decode_are_classified(client, raw, code, reason):
    answer = await raw_request(client.server.port, raw)
    assert answer.startswith(f"HTTP/1.1 {code}".encode()), answer
    assert rejections(client, reason) == 1


async def test_a_content_length_above_the_limit_is_refused_before_reading(client):
    head = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret"
            b"\r\nContent-Length: 10485760\r\n\r\n")
    answer = await raw_request(client.server.port, head)  # no body sent at all
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"Content-Length 10485760 is above the limit" in answer and b"Connection: close" in answer
    assert rejections(client, "too_large") == 1


async def test_a_body_that_does_not_arrive_in_time_is_a_408(tmp_path):
    c = await _client(tmp_path, limits=Limits(body_timeout=0.3))
    try:
        head = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer s3cret\r\nContent-Length: 100\r\n\r\n")
        answer = await raw_request(c.server.port, head, b'{"version"')
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert rejections(c, "timeout") == 1
    finally:
        await c.close()
        await c.engine.shutdown()


async def test_a_sender_that_leaves_mid_body_is_a_counted_rejection_not_our_500(client):
    """Alertmanager's own webhook timeout, or a proxy that aborts the upload: it was counted as a
    500, audited internal_error and logged with a traceback."""
    head = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer s3cret\r\nContent-Length: 100\r\n\r\n")
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
        writer.write(head + b'{"version": "4", "alerts"')
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    deadline = asyncio.get_running_loop().time() + 20
    while rejections(client, "client_disconnected") != 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert rejections(client, "client_disconnected") == 2
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": "500"}) in (None, 0)
    assert "internal_error" not in client.audit_path.read_text()


@pytest.mark.parametrize("auth, length, code", [(b"Bearer wrong", 100, b"401"), (b"Bearer s3cret", 5_000_000, b"413")])
async def test_a_request_that_will_be_refused_is_not_invited_to_send_its_body(client, auth, length, code):
    """``Expect: 100-continue`` (curl sends it for bodies over 1 KB) got a 100 Continue before a
    401 or 413: the client uploaded the body it was about to be refused for."""
    head = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: " + auth +
            b"\r\nExpect: 100-continue\r\nContent-Length: " + str(length).encode() + b"\r\n\r\n")
    answer = await raw_request(client.server.port, head)
    assert answer.startswith(b"HTTP/1.1 " + code), answer[:60]
    assert b"100 Continue" not in answer
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": code.decode()}) == 1
    ok = (b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret"
          b"\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert (await raw_request(client.server.port, ok, wait=5)).startswith(b"HTTP/1.1 100 Continue")


async def test_state_needs_the_token(client):
    assert (await client.get("/api/v1/state")).status == 401
    assert (await client.get("/api/v1/state", headers={"Authorization": "Bearer wrong"})).status == 401
    resp = await client.get("/api/v1/state", headers=AUTH)
    assert resp.status == 200 and (await resp.json())["entries"] == []


async def test_an_internal_error_is_a_counted_audited_500(client, monkeypatch):
    async def broken(_payload):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(client.engine, "handle_payload", broken)
    resp = await client.post("/webhook", json=payload(), headers=AUTH)
    assert resp.status == 500
    assert (await resp.json())["reason"] == "internal_error"
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": "500"}) == 1
    assert [r["reason"] for r in read_audit(client.audit_path) if r["event"] == "error"] == ["internal_error"]


async def test_huge_body_is_413(client):
    big = payload(*[alert(instance=f"i{i}") for i in range(2000)])
    resp = await client.post("/webhook", data=json.dumps(big).encode(), headers=AUTH)
    assert resp.status == 413
    assert (await resp.json())["reason"] == "too_large"


async def test_wrong_media_type_is_415(client):
    resp = await client.post("/webhook", data=b"<xml/>", headers={**AUTH, "Content-Type": "application/xml"})
    assert resp.status == 415


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic czNjcmV0", "Bearer s3cret2"])
async def test_token_is_required(client, header):
    headers = {"Content-Type": "application/json"}
    if header:
        headers["Authorization"] = header
    resp = await client.post("/webhook", json=payload(), headers=headers)
    assert resp.status == 401
    assert client.engine.entries == {}
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": "401"}) == 1


async def test_metrics_and_readiness(client):
    assert (await client.get("/-/ready")).status == 200
    text = await (await client.get("/metrics")).text()
    assert 'promreflex_controller_actions_total{action="log",result="error",transition="fire"} 0.0' in text


async def test_the_replay_example_in_the_runbook_is_accepted(client):
    example = Path(__file__).resolve().parents[1] / "fixtures" / "webhook" / "selftest-firing.json"
    resp = await client.post("/webhook", data=example.read_bytes(), headers=AUTH)
    assert resp.status == 200 and (await resp.json())["accepted"] == 1


_RAW = {  # values json.dumps cannot write: spliced into the text after dumping
    "@@deep@@": DEEP.decode(),
    "@@huge-int@@": "9" * 5000,
}


def _mutants(seed: int, count: int):
    """Valid payloads (as bytes) with one field replaced by a value of another type, deleted,
    or nested, including hostile values: JSON nested 100,000 deep, an integer of 5,000 digits,
    timestamps that overflow when converted to UTC."""
    import random

    rng = random.Random(seed)
    oddities = [None, 0, -1, 1.5, True, "", "x" * 300, [], {}, [1, "a"], {"a": {"b": []}}, "0001-01-01T00:00:00Z",
                "0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59-01:00", *_RAW]
    for _ in range(count):
        body = payload(alert(instance="a"), alert(status="resolved", instance="b"))
        node, path = body, []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            key = rng.choice(list(node.keys())) if isinstance(node, dict) else rng.randrange(len(node))
            path.append(key)
            parent, node = node, node[key]
        if not path:
            out = rng.choice(oddities)
        elif rng.random() < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
            out = body
        else:
            parent[path[-1]] = rng.choice(oddities)
            out = body
        text = json.dumps(out)
        for marker, raw in _RAW.items():
            text = text.replace(json.dumps(marker), raw)
        yield text.encode()


async def test_no_mutation_of_a_payload_gets_a_5xx(client):
    codes = set()
    for body in _mutants(seed=7, count=400):
        resp = await client.post("/webhook", data=body, headers=AUTH)
        assert resp.status < 500, (resp.status, body[:300])
        codes.add(resp.status)
        assert (await resp.json())["status"] in ("accepted", "rejected")
    assert {200, 400, 422} <= codes  # some mutants stay valid (e.g. an annotation changed), most do not
    rejected = sum(v for k, v in _samples(client, "promreflex_controller_payload_rejections_total"))
    audited = [r for r in read_audit(client.audit_path) if r["event"] == "rejected"]
    assert rejected == len(audited) > 0


def _samples(c, name: str):
    for metric in c.registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                yield sample.labels, sample.value


# ------------------------------------------------------------------ what other senders send (a stranger's review)
GRAFANA = {  # Grafana's webhook contact point, its documented example (two alerts, abridged annotations)
    "receiver": "My Super Webhook", "status": "firing", "orgId": 1,
    "alerts": [
        {"status": "firing", "labels": {"alertname": "High memory usage", "team": "blue", "zone": "us-1"},
         "annotations": {"summary": "This alert was triggered for zone us-1"},
         "startsAt": "2021-10-12T09:51:03.157076+02:00", "endsAt": "0001-01-01T00:00:00Z",
         "generatorURL": "https://play.grafana.org/alerting/1afz29v7z/edit", "fingerprint": "c6eadffa33fcdf37",
         "silenceURL": "https://play.grafana.org/alerting/silence/new", "dashboardURL": "", "panelURL": "",
         "values": {"B": 44.23943737541908, "C": 1}},
        {"status": "firing", "labels": {"alertname": "High CPU usage", "team": "blue", "zone": "eu-1"},
         "annotations": {}, "startsAt": "2021-10-12T09:56:03.157076+02:00", "endsAt": "0001-01-01T00:00:00Z",
         "generatorURL": "https://play.grafana.org/alerting/d1rdpdv7k/edit", "fingerprint": "bc97ff14869b13e3",
         "silenceURL": "", "dashboardURL": "", "panelURL": "", "values": None, "valueString": "[ var='B' ]"},
    ],
    "groupLabels": {}, "commonLabels": {"team": "blue"}, "commonAnnotations": {},
    "externalURL": "https://play.grafana.org/", "version": "1", "groupKey": "{}:{}", "truncatedAlerts": 0,
    "title": "[FIRING:2]  (blue)", "state": "alerting", "message": "**Firing**",
}


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_grafanas_webhook_contact_point_is_taken(client, method):
    resp = await client.request(method, "/webhook", json=GRAFANA, headers=AUTH)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["accepted"] == 2
    await client.engine.drain()
    fired = [r for r in read_audit(client.audit_path) if r["event"] == "decision" and r["transition"] == "fire"]
    assert len(fired) == 2


@pytest.mark.parametrize("header", ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret", " Bearer s3cret "])
async def test_the_bearer_scheme_is_case_insensitive(client, header):
    """Alertmanager's http_config sends authorization.type as written (`type: bearer`)."""
    resp = await client.post("/webhook", json=payload(), headers={**AUTH, "Authorization": header})
    assert resp.status == 200, await resp.text()


async def test_null_for_an_optional_field_is_its_default(client):
    a = {**alert(), "annotations": None, "generatorURL": None, "fingerprint": None}
    body = {**payload(a), "groupLabels": None, "commonLabels": None, "commonAnnotations": None, "externalURL": None,
            "truncatedAlerts": None}
    resp = await client.post("/webhook", json=body, headers=AUTH)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["accepted"] == 1


async def test_a_lone_surrogate_is_a_400_and_its_retry_is_not_a_duplicate(client):
    """It was a 500 (the state could not be written) whose retry was answered 'duplicate': lost."""
    body = json.dumps(payload(alert())).replace('"summary": "test"', '"summary": "\\udc80"', 1)
    for _ in range(2):
        resp = await client.post("/webhook", data=body.encode(), headers=AUTH)
        assert resp.status == 400 and "surrogate" in (await resp.json())["message"]
    emoji = json.dumps(payload(alert())).replace('"summary": "test"', '"summary": "\\ud83d\\ude00"', 1)
    assert "ude00" in emoji and "udc80" in body
    resp = await client.post("/webhook", data=emoji.encode(), headers=AUTH)
    assert resp.status == 200 and (await resp.json())["accepted"] == 1


@pytest.mark.parametrize("ctype", ["application/x-www-form-urlencoded", "text/json", "application/vnd.api+json"])
async def test_json_under_other_media_types_and_a_trailing_slash(client, ctype):
    resp = await client.post("/webhook/", data=json.dumps(payload()).encode(), headers={**AUTH, "Content-Type": ctype})
    assert resp.status == 200, await resp.text()
    assert client.registry.get_sample_value("promreflex_controller_webhook_requests_total", {"code": "200"}) == 1


async def test_after_a_500_the_retry_is_taken_not_a_duplicate(client, monkeypatch):
    """Our failure (the state cannot be staged, a bug) answers 500 so Alertmanager retries; the
    retry used to be answered 200 'duplicate' and the alert was never acted on."""
    save, calls = client.engine._save, []

    def fail_once(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("disk full")
        return save(*a, **k)

    monkeypatch.setattr(client.engine, "_save", fail_once)
    assert (await client.post("/webhook", json=payload(alert()), headers=AUTH)).status == 500
    resp = await client.post("/webhook", json=payload(alert()), headers=AUTH)
    assert resp.status == 200 and (await resp.json())["accepted"] == 1
    await client.engine.drain()
    fired = [r for r in read_audit(client.audit_path) if r["event"] == "decision" and r["transition"] == "fire"]
    assert len(fired) == 1
