"""The webhook receiver: every corpus payload accepted or rejected with a reason; broken and
hostile bodies get a 4xx, never a 5xx."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controllers.audit import AuditLog, read_audit
from controllers.engine import Engine
from controllers.metrics import ControllerMetrics
from controllers.server import build_app
from promreflex.config import ControllerConfig, Route
from tests.payloads import alert, payload

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "alertmanager-webhooks"

# What the receiver makes of each corpus file (decided by reading them, see docs/decisions.md):
# msteams fixtures are version 4 from Alertmanagers that did not send per-alert status yet;
# their status is derived from endsAt. The others carry no version and are rejected.
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


@pytest.fixture
async def client(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    cfg = ControllerConfig(
        audit_log=tmp_path / "audit.jsonl", state_file=tmp_path / "state.json", max_body_bytes=64 * 1024,
        token_file=token_file, alertmanager_url=None,
        routes=[Route(name="all", matchers=['alertname=~".+"'], action="log")],
    )
    registry = CollectorRegistry()
    audit = AuditLog(cfg.audit_log)
    engine = Engine(cfg, ControllerMetrics(registry, ["log"]), audit)
    app = build_app(cfg, engine, engine.metrics, registry, audit)
    async with TestClient(TestServer(app)) as c:
        c.registry, c.engine, c.audit_path = registry, engine, cfg.audit_log
        yield c
        await engine.shutdown()


AUTH = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}


def test_corpus_is_complete():
    assert CORPUS.is_dir(), f"corpus not found at {CORPUS}"
    assert sorted(p.name for p in CORPUS.glob("*.json")) == sorted(EXPECTED)


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


def _mutants(seed: int, count: int):
    """Valid payloads with one field replaced by a value of another type, deleted, or nested."""
    import random

    rng = random.Random(seed)
    oddities = [None, 0, -1, 1.5, True, "", "x" * 300, [], {}, [1, "a"], {"a": {"b": []}}, "0001-01-01T00:00:00Z"]
    for _ in range(count):
        body = payload(alert(instance="a"), alert(status="resolved", instance="b"))
        node, path = body, []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            key = rng.choice(list(node.keys())) if isinstance(node, dict) else rng.randrange(len(node))
            path.append(key)
            parent, node = node, node[key]
        if not path:
            yield rng.choice(oddities)
            continue
        if rng.random() < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice(oddities)
        yield body


async def test_no_mutation_of_a_payload_gets_a_5xx(client):
    codes = set()
    for body in _mutants(seed=7, count=300):
        resp = await client.post("/webhook", data=json.dumps(body).encode(), headers=AUTH)
        assert resp.status < 500, (resp.status, body)
        codes.add(resp.status)
        assert (await resp.json())["status"] in ("accepted", "rejected")
    assert {200, 422} <= codes  # some mutants stay valid (e.g. an annotation changed), most do not
