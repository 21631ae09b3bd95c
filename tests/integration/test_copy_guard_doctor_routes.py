"""``copy-guard doctor`` tests where each copy-guard alert goes with the labels it really carries,
against a real Alertmanager: its rule's labels as Prometheus loaded them and Prometheus'
``external_labels`` (a stranger's review, R2 and R7: a route on ``monitor="shop-prod"``, or on
``severity="info"``, above the promreflex sub-route took the alerts while the doctor said every
link works)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from controllers.copy_guard import doctor
from promreflex.proc import free_port
from tests.alertmanager_process import running_alertmanager
from tests.unit.test_copy_guard_doctor import Quiet, serving

pytestmark = pytest.mark.integration
RULES = yaml.safe_load((Path(__file__).resolve().parents[2] / "rules" / "copy-guard.rules.yml").read_text())


@contextmanager
def prometheus_api(external: dict[str, str], relabel: list[dict] | None = None) -> Iterator[str]:
    """The two answers the doctor reads here, from the shipped rules file, ``external`` and
    ``relabel``; its URL while the block runs."""
    rules = [{"name": r["alert"], "labels": r.get("labels", {}), "type": "alerting"}
             for g in RULES["groups"] for r in g["rules"] if "alert" in r]
    answers = {
        "/api/v1/rules": {"status": "success", "data": {"groups": [{"name": "copy-guard.alerts", "rules": rules}]}},
        "/api/v1/status/config": {"status": "success", "data": {"yaml": yaml.safe_dump(
            {"global": {"external_labels": external}, "alerting": {"alert_relabel_configs": relabel or []}})}},
    }

    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            answer = answers.get(self.path.split("?")[0])
            if answer is None:
                self.send_error(404)
                return
            self.reply(json.dumps(answer).encode())

    with serving(Handler) as address:
        yield f"http://{address}"


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A real Alertmanager whose own routes come first: one on an external label, one on
    severity info, both without `continue`, then the promreflex sub-route (as the snippet)."""
    controller = f"http://127.0.0.1:{free_port()}"
    config = {
        "route": {"receiver": "ops", "routes": [
            {"receiver": "ops", "matchers": ['monitor="shop-prod"', 'severity="warning"']},
            {"receiver": "ops", "matchers": ['severity="info"']},
            {"receiver": "ops", "matchers": ['env="prod"']},
            {"receiver": "promreflex", "continue": True,
             "matchers": ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"']},
        ]},
        "receivers": [{"name": "ops"}, {"name": "promreflex", "webhook_configs": [{"url": f"{controller}/webhook"}]}],
    }
    with running_alertmanager(tmp_path, config) as url:
        yield url, controller, tmp_path


def route_checks(tmp: Path, prom: str, am: str, controller: str) -> dict[str, doctor.Check]:
    """The doctor's route checks against these addresses, by alert name."""
    t = doctor.Target(site="shop", site_url="http://127.0.0.1:9/", stub_status_url="http://127.0.0.1:9/s",
                      access_log=tmp / "a.log", prometheus_url=prom, alertmanager_url=am,
                      controller_url=controller, token_file=None, registry_dir=None, min_floor=2.0)
    return {c.detail.split("{")[0]: c for c in doctor.check_alertmanager(t) if c.link == "route"}


def test_each_alert_is_tested_with_its_rules_labels_and_prometheus_external_labels(alertmanager) -> None:
    am, controller, tmp = alertmanager
    with prometheus_api({"monitor": "shop-prod"}) as prom:
        routes = route_checks(tmp, prom, am, controller)
    # Overloaded is a warning: the external label's route takes it; Predicted and Crowded are
    # info: the severity route takes them. Every one is a FAIL that names the fix.
    assert {name: c.status for name, c in routes.items()} == {
        "CopyGuardSiteOverloaded": doctor.FAIL, "CopyGuardSiteOverloadPredicted": doctor.FAIL,
        "CopyGuardSiteCrowded": doctor.FAIL}, routes
    assert "monitor=shop-prod" in routes["CopyGuardSiteOverloaded"].detail
    assert "severity=info" in routes["CopyGuardSiteOverloadPredicted"].detail
    assert all("a route above the promreflex sub-route catches it" in c.detail for c in routes.values())


def test_labels_alert_relabel_configs_set_are_in_the_route_test(alertmanager) -> None:
    """Prometheus applies alerting.alert_relabel_configs after the external labels: a constant
    `env: prod` sent every copy-guard alert to a route on env="prod" while the doctor said OK
    (a review of the external-labels fix)."""
    am, controller, tmp = alertmanager
    with prometheus_api({"replica": "a"}, [{"target_label": "env", "replacement": "prod"},
                                            {"action": "labeldrop", "regex": "replica"}]) as prom:
        routes = route_checks(tmp, prom, am, controller)
    overloaded = routes["CopyGuardSiteOverloaded"]
    assert overloaded.status == doctor.FAIL and "env=prod" in overloaded.detail and "replica" not in overloaded.detail
