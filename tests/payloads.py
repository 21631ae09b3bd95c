"""Hand-made Alertmanager webhook payloads for tests (the shape Alertmanager 0.25 sends)."""

from __future__ import annotations

import copy
from typing import Any

from controllers.models import fingerprint

ZERO = "0001-01-01T00:00:00Z"


def alert(name: str = "PromreflexSelftest", status: str = "firing", starts: str = "2026-11-23T10:00:00Z",
          ends: str | None = None, **labels: str) -> dict[str, Any]:
    lab = {"alertname": name, "severity": "info", **labels}
    return {
        "status": status,
        "labels": lab,
        "annotations": {"summary": "test"},
        "startsAt": starts,
        "endsAt": ends or (ZERO if status == "firing" else "2026-11-23T10:05:00Z"),
        "generatorURL": "http://127.0.0.1:9090/graph",
        "fingerprint": fingerprint(lab),
    }


def payload(*alerts: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    alerts = alerts or (alert(),)
    st = status or ("firing" if any(a["status"] == "firing" for a in alerts) else "resolved")
    return {
        "version": "4",
        "groupKey": '{}:{alertname="%s"}' % alerts[0]["labels"]["alertname"],
        "truncatedAlerts": 0,
        "status": st,
        "receiver": "promreflex",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [copy.deepcopy(a) for a in alerts],
    }


def api_alert(a: dict[str, Any]) -> dict[str, Any]:
    """The same alert as Alertmanager's GET /api/v2/alerts shows it."""
    return {
        "labels": a["labels"], "annotations": a["annotations"], "startsAt": a["startsAt"],
        "endsAt": "2099-01-01T00:00:00Z", "generatorURL": a["generatorURL"], "fingerprint": a["fingerprint"],
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": []}, "receivers": [{"name": "promreflex"}],
        "updatedAt": a["startsAt"],
    }


class FakeAlertmanager:
    """Stands in for AlertmanagerClient in unit tests: holds the 'active' alerts."""

    def __init__(self) -> None:
        self.active: list[dict[str, Any]] = []
        self.fail = False
        self.calls = 0

    async def active_alerts(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.fail:
            raise ConnectionError("alertmanager unreachable")
        return [api_alert(a) for a in self.active]
