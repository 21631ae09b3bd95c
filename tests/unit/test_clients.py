"""The API clients against a tiny fake server speaking the real APIs' shapes."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from promreflex.clients import AlertmanagerClient, APIError, PrometheusClient, QueryError, alert_ended


def test_alert_ended():
    assert not alert_ended("0001-01-01T00:00:00Z")
    assert not alert_ended(None)
    assert not alert_ended("2999-01-01T00:00:00.000Z")
    assert alert_ended("2020-01-01T00:00:00.123Z")


@pytest.fixture
async def server():
    async def alerts(request):
        assert request.query["active"] == "true" and request.query["silenced"] == "false"
        return web.json_response([
            {"labels": {"alertname": "Firing"}, "endsAt": "2999-01-01T00:00:00.000Z", "fingerprint": "a"},
            # Alertmanager 0.25 still lists a resolved alert as "active" until it is collected.
            {"labels": {"alertname": "Resolved"}, "endsAt": "2020-01-01T00:00:00.000Z", "fingerprint": "b"},
        ])

    async def query(request):
        if request.query["query"] == "bad(":
            return web.json_response({"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400)
        if request.query["query"] == "scalar(1)":
            return web.json_response({"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}})
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"job": "x"}, "value": [1, "42"]}]}})

    app = web.Application()
    app.router.add_get("/api/v2/alerts", alerts)
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as srv:
        yield str(srv.make_url(""))


async def test_active_alerts_leave_out_ended_ones(server):
    async with aiohttp.ClientSession() as s:
        got = await AlertmanagerClient(server, s).active_alerts()
    assert [a["labels"]["alertname"] for a in got] == ["Firing"]


async def test_prometheus_query_scalar_and_errors(server):
    async with aiohttp.ClientSession() as s:
        prom = PrometheusClient(server, s)
        assert await prom.scalar("up") == 42.0
        assert (await prom.query("scalar(1)"))[0]["value"] == [1, "1"]
        with pytest.raises(APIError, match="bad_data"):
            await prom.query("bad(")


def test_alert_ended_survives_timestamps_at_the_edge_of_the_calendar():
    assert not alert_ended("9999-12-31T23:59:59-01:00")  # beyond year 9999 in UTC: not ended
    assert not alert_ended("0001-01-01T00:30:00+01:00")  # the zero time of another zone


async def test_a_cluster_client_fails_over_to_a_live_peer_and_posts_to_every_peer(server):
    """A cluster's peers: reads fail over from a dead peer and stick to the one that answered;
    posts go to every peer (peers do not gossip alerts) and succeed when one took them."""
    from promreflex.proc import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    posted: list[str] = []

    async def take(request):
        posted.append(request.host)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/api/v2/alerts", take)
    async with TestServer(app) as other, aiohttp.ClientSession() as s:
        am = AlertmanagerClient([dead, server], s)
        got = await am.active_alerts()
        assert [a["labels"]["alertname"] for a in got] == ["Firing"]
        assert am.base_url == server.rstrip("/")  # the live peer is asked first from now on
        await AlertmanagerClient([dead, str(other.make_url(""))], s).post_alerts([{"labels": {"alertname": "X"}}])
        assert len(posted) == 1
        with pytest.raises(APIError, match="no Alertmanager peer answered"):
            await AlertmanagerClient([dead, f"http://127.0.0.1:{free_port()}"], s).active_alerts()
        assert await AlertmanagerClient([dead, server], s).ready() is False  # the fake has no /-/ready


async def test_a_prometheus_pair_client_fails_over_and_an_error_page_is_an_error(server):
    """Both replicas of a Prometheus pair (controller.prometheus_url a list): a query goes on to
    the next replica when one is down or a proxy in front of it answers with an HTML error page,
    and sticks to the one that answered; one server alone keeps its own errors, and an answer
    that is not Prometheus' JSON is an APIError, not a JSON decoding traceback."""
    from promreflex.proc import free_port

    dead = f"http://127.0.0.1:{free_port()}"

    async def bad_gateway(_):
        return web.Response(status=502, text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/api/v1/query", bad_gateway)
    async with TestServer(app) as proxy, aiohttp.ClientSession() as s:
        page = str(proxy.make_url("")).rstrip("/")
        prom = PrometheusClient([dead, page, server], s)
        assert await prom.scalar("up") == 42.0
        assert prom.base_url == server.rstrip("/")  # asked first from now on
        assert await prom.scalar("up") == 42.0
        with pytest.raises(APIError, match="not a Prometheus answer"):
            await PrometheusClient(page, s).query("up")
        with pytest.raises(APIError, match="no Prometheus answered"):
            await PrometheusClient([dead, page], s).query("up")
        with pytest.raises(aiohttp.ClientError):  # one server: its own error, as before
            await PrometheusClient(dead, s).query("up")
        # A PromQL error is the query's, not the replica's: said as it is, the next one not asked.
        pair = PrometheusClient([server, page], s)
        with pytest.raises(QueryError, match="bad_data"):
            await pair.query("bad(")
        assert pair.base_url == server.rstrip("/")


async def test_a_failed_request_is_told_in_a_few_words():
    """Log lines say why in a few words, not aiohttp's multi-hundred-character reprs."""
    from promreflex.clients import why
    from promreflex.proc import free_port

    async with aiohttp.ClientSession() as s:
        try:
            await AlertmanagerClient(f"http://127.0.0.1:{free_port()}", s).active_alerts()
        except APIError as e:
            message = str(e)
    assert "cannot connect: " in message and len(message) < 160, message
    assert why(TimeoutError()) == "timed out"
    assert why(ValueError("bad")) == "ValueError: bad"
