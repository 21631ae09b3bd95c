"""``promreflex copy-guard doctor`` with your own Prometheus and Alertmanager (a stranger's review,
/tmp/review-guard: M1, L1, L2): exporters Prometheus no longer scrapes, the calibrate command it
suggests, and the stack it does not need. A loopback Prometheus written here answers the
queries and the targets API."""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controllers.copy_guard import doctor
from tests.unit.test_copy_guard_doctor import Quiet, serving, target

Answer = Callable[[str], list[tuple[dict[str, str], float]]]


@contextmanager
def fake_prometheus(answer: Answer, active_jobs: list[str] | None, health: str = "up") -> Iterator[str]:
    """A Prometheus whose /api/v1/query answers ``answer(expr)`` and whose /api/v1/targets lists
    one active target per job of ``active_jobs`` (None: no targets API, 404)."""

    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/api/v1/query":
                expr = urllib.parse.parse_qs(url.query)["query"][0]
                result = [{"metric": lb, "value": [time.time(), str(v)]} for lb, v in answer(expr)]
                body: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
            elif url.path == "/api/v1/targets" and active_jobs is not None:
                body = {"status": "success", "data": {"droppedTargets": [], "activeTargets": [
                    {"labels": {"job": j, "instance": f"127.0.0.1:{9100 + i}"}, "health": health, "scrapeInterval": "15s",
                     "lastScrape": "2026-11-27T17:07:18.123456789Z"} for i, j in enumerate(active_jobs)]}}
            else:
                self.send_error(404)
                return
            self.reply(json.dumps(body).encode())

    with serving(Handler) as address:
        yield f"http://{address}"


NGINX = {"job": "nginx", "instance": "127.0.0.1:19213"}
ACCESSLOG = {"job": "accesslog", "instance": "127.0.0.1:19281"}


def scraped_until(age_s: float) -> Answer:
    """Both exporters' series present, `up` 1 and nginx_up 1 (as Prometheus answers for 5 minutes
    after their jobs left scrape_configs), their newest samples ``age_s`` old."""

    def answer(expr: str) -> list[tuple[dict[str, str], float]]:
        if expr == "vector(1)":
            return [({}, 1.0)]
        if "time() - max by (job, instance) (timestamp(" in expr:
            return [(NGINX if "nginx_http" in expr else ACCESSLOG, age_s)]
        if expr.startswith("group by (job, instance)"):
            return [(NGINX if "nginx_http" in expr else ACCESSLOG, 1.0)]
        if expr.startswith(("up{", "nginx_up{")):
            return [(NGINX if "nginx" in expr else ACCESSLOG, 1.0)]
        return []

    return answer


def test_exporters_whose_jobs_left_scrape_configs_fail_naming_the_job(tmp_path: Path) -> None:
    """M1: both scrape jobs removed from prometheus.yml and Prometheus reloaded: their last samples,
    `up` 1 included, stay in instant queries for 5 minutes, and the doctor said "scraped" and
    "every link works" while the guard was blind."""
    with fake_prometheus(scraped_until(20.0), ["node", "prometheus", "promreflex-controller"]) as prom:
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    for link, job in (("nginx exporter", "nginx"), ("accesslog exporter", "accesslog")):
        assert checks[link].status == doctor.FAIL, checks[link]
        assert f"does not scrape job {job} now" in checks[link].detail
        assert "not among its active targets" in checks[link].detail and "20 s old" in checks[link].detail
        assert "scrape_configs" in checks[link].detail and "reload Prometheus" in checks[link].detail
    # scraped again: OK
    with fake_prometheus(scraped_until(3.0), ["nginx", "accesslog", "node"]) as prom:
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    assert checks["nginx exporter"].status == doctor.OK and "scraped: nginx/127.0.0.1:19213" in checks["nginx exporter"].detail
    assert checks["accesslog exporter"].status == doctor.OK


def test_without_a_targets_api_the_age_of_the_newest_sample_tells(tmp_path: Path) -> None:
    """A Prometheus behind a proxy that does not pass /api/v1/targets: series whose newest sample
    is minutes old are not scraped any more (every supported scrape interval is a minute or less)."""
    with fake_prometheus(scraped_until(200.0), None) as prom:
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    assert checks["nginx exporter"].status == doctor.FAIL and "has not scraped nginx/127.0.0.1:19213 for 3 min" in \
        checks["nginx exporter"].detail
    with fake_prometheus(scraped_until(20.0), None) as prom:
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    assert checks["nginx exporter"].status == doctor.OK


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    doctor.add_doctor_parser(parser.add_subparsers())
    return parser.parse_args(["doctor", *argv])


OWN = ("--nginx.url", "http://127.0.0.1:18580/", "--nginx.stub-status-url", "http://127.0.0.1:18580/nginx_status",
       "--nginx.access-log", "/tmp/review-guard/nginx/logs/promreflex-shop.log", "--prometheus.url",
       "http://127.0.0.1:19290", "--alertmanager.url", "http://127.0.0.1:19293", "--controller.url",
       "http://127.0.0.1:19295")


def _no_threshold(monkeypatch: Any) -> None:
    monkeypatch.setattr(doctor, "_one", lambda _prom, _q: None)
    monkeypatch.setattr(doctor, "prom_query", lambda *_a, **_k: [])


def test_the_calibrate_command_carries_the_addresses_the_doctor_was_given(tmp_path: Path, monkeypatch: Any) -> None:
    """L1: with every address given by flag, the threshold's fix was `promreflex calibrate --site
    shop`: run as printed it calibrated http://127.0.0.1:8080/ (the local stack's default) against
    the stack's Prometheus, and would have published into the stack's textfile directory."""
    monkeypatch.chdir(tmp_path)
    _no_threshold(monkeypatch)
    t = doctor.target_from(_args(*OWN, "--textfile.dir", "/var/lib/node/textfile", "--site", "my-shop"))
    fail = doctor.check_threshold(t)[0]
    assert fail.status == doctor.FAIL
    assert ("`promreflex calibrate --site my-shop --target http://127.0.0.1:18580/ --prometheus.url "
            "http://127.0.0.1:19290 --textfile.dir /var/lib/node/textfile`") in fail.detail
    # without --textfile.dir the doctor does not know it: a placeholder, said as such (not the stack's)
    fail = doctor.check_threshold(doctor.target_from(_args(*OWN)))[0]
    assert "--target http://127.0.0.1:18580/ --prometheus.url http://127.0.0.1:19290 --textfile.dir DIR`" in fail.detail
    assert "DIR: the directory your node_exporter's --collector.textfile.directory serves" in fail.detail
    # the stack's configuration (its Prometheus, its textfile directory): the flags that find it again
    cfg = tmp_path / "p.yml"
    cfg.write_text(f"stack:\n  state_dir: {tmp_path / 'state'}\n")
    fail = doctor.check_threshold(doctor.target_from(_args("--config.file", str(cfg))))[0]
    assert f"`promreflex calibrate --site shop --config.file {cfg} --target " in fail.detail
    assert "--textfile.dir" not in fail.detail


def test_no_stack_warning_when_every_address_is_given_by_flag(tmp_path: Path, monkeypatch: Any) -> None:
    """L2: every address by flag (README: the no-stack setup) still got `WARN stack no stack runs
    ... start it with promreflex stack up`, the opposite of what that setup needs."""
    monkeypatch.chdir(tmp_path)
    t = doctor.target_from(_args(*OWN))
    assert not t.extra.get("stack_note"), t.extra.get("stack_note")
    head = doctor.header(t)
    assert "no stack runs there" not in head and "every address was given by flag" in head
    # some addresses from the stack's configuration, no stack running: said, naming them
    partial = doctor.target_from(_args(*OWN[:6]))
    note = partial.extra.get("stack_note") or ""
    assert "no stack runs from" in note and "prometheus, alertmanager, controller" in note and "nginx," not in note
    # a Prometheus given by flag that does not answer: no advice to start the stack's
    fail = doctor.check_prometheus(doctor.target_from(_args(*OWN[:6], "--prometheus.url", "http://127.0.0.1:9")))[0]
    assert fail.status == doctor.FAIL and "stack up" not in fail.detail and "--prometheus.url its address" in fail.detail


def test_a_configured_pair_and_cluster_are_checked_at_their_first_server(tmp_path: Path, monkeypatch: Any) -> None:
    """controller.prometheus_url and alertmanager_url as lists (a Prometheus pair, an
    Alertmanager cluster: README, "HA delivery"): the doctor checks the first of each, as the
    controller reads it first; it checked the list's text ("['http://...']") as one URL."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "p.yml"
    cfg.write_text("controller:\n"
                   "  prometheus_url: [http://prom-a.example:9090, http://prom-b.example:9090]\n"
                   "  alertmanager_url: [http://am-0.example:9093, http://am-1.example:9093]\n")
    t = doctor.target_from(_args("--config.file", str(cfg)))
    assert (t.prometheus_url, t.alertmanager_url) == ("http://prom-a.example:9090", "http://am-0.example:9093")


def test_every_alertmanager_peer_and_prometheus_replica_of_the_controller_is_checked(tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """A stranger's cluster: peer 3 reloaded with a configuration that no longer routed the
    copy-guard alerts to promreflex, and the doctor (which read only the first of each list)
    said every link works."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "p.yml"
    cfg.write_text("controller:\n  prometheus_url: [http://127.0.0.1:9, http://127.0.0.1:7]\n"
                   "  alertmanager_url: [http://127.0.0.1:9, http://127.0.0.1:8, http://127.0.0.1:6]\n")
    t = doctor.target_from(_args("--config.file", str(cfg)))
    assert t.other_alertmanagers == ["http://127.0.0.1:8", "http://127.0.0.1:6"]
    assert t.other_prometheus == ["http://127.0.0.1:7"]
    assert "Alertmanager http://127.0.0.1:9, http://127.0.0.1:8, http://127.0.0.1:6" in doctor.header(t)
    peers = doctor._others(t, "other_alertmanagers", "alertmanager_url", doctor.check_alertmanager)
    assert [c.status for c in peers] == [doctor.FAIL, doctor.FAIL]
    assert peers[0].detail.startswith("http://127.0.0.1:8: ") and peers[1].detail.startswith("http://127.0.0.1:6: ")
    replicas = doctor._others(t, "other_prometheus", "prometheus_url", lambda o: [doctor.check_rules(o)])
    assert len(replicas) == 1 and replicas[0].status == doctor.FAIL and "127.0.0.1:7" in replicas[0].detail
    # given by flag, one server is checked, as asked
    assert doctor.target_from(_args(*OWN)).other_alertmanagers == []


def test_exporters_just_added_and_not_scraped_yet_are_a_warning_to_wait(tmp_path: Path) -> None:
    """R9: right after adding the jobs to a shop's own Prometheus (30 s scrape), before their first
    scrape, the doctor told a stranger to run the exporters that were running."""
    def nothing_yet(expr: str) -> list[tuple[dict[str, str], float]]:
        return [({}, 1.0)] if expr == "vector(1)" else []

    with fake_prometheus(nothing_yet, ["nginx", "accesslog"], health="unknown") as prom:
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    for link, job in (("nginx exporter", "nginx"), ("accesslog exporter", "accesslog")):
        assert checks[link].status == doctor.WARN, checks[link]
        assert f"job {job} (127.0.0.1:" in checks[link].detail and "not scraped yet (every 15s)" in checks[link].detail
    with fake_prometheus(nothing_yet, ["node"]) as prom:  # not among the targets at all: run it and add it
        checks = {c.link: c for c in doctor.check_prometheus(target("http://127.0.0.1:9", tmp_path / "a.log",
                                                                    prometheus_url=prom), settle_s=0)}
    assert checks["nginx exporter"].status == doctor.FAIL and "add it to scrape_configs" in checks["nginx exporter"].detail
