"""Typed models of the Alertmanager webhook payload (version 4; Grafana's webhook contact point
sends the same shape as version 1).

Alertmanager's own shape: https://prometheus.io/docs/alerting/latest/configuration/#webhook_config
Unknown extra fields are ignored (newer Alertmanagers add some); anything missing or mistyped
that a controller relies on is a rejection that names the field.
"""

from __future__ import annotations

import re
from datetime import datetime, UTC
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

Status = Literal["firing", "resolved"]

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF
#: Alertmanager's fingerprint (and Grafana's, in its webhook): 16 lowercase hex digits.
FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's alert fingerprint: FNV-1a 64 over sorted label pairs, each part followed
    by the separator byte 0xff (prometheus/common ``labelSetToFingerprint``), as 16 hex digits.

    Payloads that carry an empty fingerprint (older senders, hand-made tests) get the one
    Alertmanager would have computed, so they deduplicate and reconcile like the real thing.
    """
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def to_utc(value: datetime) -> datetime:
    """``value`` in UTC; ValueError (a validation error, never a 500) when the conversion leaves
    the years 1-9999 (``0001-01-01T00:30:00+01:00``, ``9999-12-31T23:59:59-01:00``) and for a
    naive value."""
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a time zone (RFC 3339)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp {value.isoformat()} is out of range in UTC (years 1-9999)") from None


def _without_nulls(data: object, optional: tuple[str, ...]) -> object:
    """``null`` for an optional field means its default (Go senders serialise an empty map as
    ``null``; Alertmanager itself sends ``{}``)."""
    if isinstance(data, dict) and any(data.get(k, 0) is None for k in optional):
        return {k: v for k, v in data.items() if not (v is None and k in optional)}
    return data


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Status
    labels: dict[str, str] = Field(min_length=1)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = ""
    # Who holds the alert: "alertmanager", whose API the engine re-checks and reconciles
    # against, or "grafana" (a version 1 payload: Grafana's own alerting, absent from any
    # Alertmanager's listing, so neither re-checked nor resolved for its absence there). Set
    # from the payload's version, never from the sender's alert (WebhookPayload).
    source: Literal["alertmanager", "grafana"] = "alertmanager"
    # The sender's fingerprint when it was not one (not 16 lowercase hex digits: "../../x?y#z"):
    # replaced by the one computed from the labels (see model_post_init), kept for the audit.
    _given_fingerprint: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: object) -> object:
        return _without_nulls(data, ("annotations", "generatorURL", "fingerprint"))

    @model_validator(mode="before")
    @classmethod
    def _status_from_ends_at(cls, data: object) -> object:
        """Every Alertmanager v4 payload carries a per-alert ``status``; hand-made payloads (curl,
        scripts, some receivers' fixtures) may not. Derive it as Alertmanager itself does: an
        alert whose end is unset (absent, null) or in the future is firing, one whose end has
        passed is resolved."""
        if isinstance(data, dict) and "status" not in data and data.get("endsAt") is None:
            data = {**data, "status": "firing"}
        elif isinstance(data, dict) and "status" not in data and isinstance(data.get("endsAt"), str):
            try:
                ends = to_utc(datetime.fromisoformat(data["endsAt"].replace("Z", "+00:00")))
            except ValueError:
                return data  # the field validator reports the bad timestamp
            ended = ends.year > 1 and ends <= datetime.now(UTC)
            data = {**data, "status": "resolved" if ended else "firing"}
        return data

    @field_validator("startsAt", "endsAt", mode="before")
    @classmethod
    def _a_timestamp_is_text(cls, value: object) -> object:
        """RFC 3339 text, as every sender writes it: pydantic would take a number as Unix seconds
        (`"startsAt": 123`, 1970: 200 and "stale" where a malformed field earns its 422)."""
        if value is not None and not isinstance(value, (str, datetime)):
            raise ValueError("timestamps are RFC 3339 text")
        return value

    @field_validator("startsAt", "endsAt")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must carry a time zone (RFC 3339)")
        return to_utc(value)

    def model_post_init(self, __context: object) -> None:
        """An empty fingerprint is computed from the labels, as Alertmanager does; so is one that
        is not a fingerprint at all (16 lowercase hex digits, what Alertmanager and Grafana
        send): sender data that reaches state keys, audit lines and actions (one built a URL path
        from it) must have the one shape."""
        if not FINGERPRINT.fullmatch(self.fingerprint):
            if self.fingerprint:
                self._given_fingerprint = self.fingerprint
            object.__setattr__(self, "fingerprint", fingerprint(self.labels))

    @property
    def given_fingerprint(self) -> str | None:
        """The sender's fingerprint when it was replaced (not a fingerprint), else None."""
        return self._given_fingerprint

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def dedupe_key(self) -> tuple[str, str, str]:
        return (self.fingerprint, self.status, self.startsAt.isoformat())


class WebhookPayload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4", "1"]  # Alertmanager's; Grafana's webhook contact point (the same shape)
    groupKey: str
    truncatedAlerts: int = Field(default=0, ge=0)
    status: Status
    receiver: str
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[Alert] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: object) -> object:
        return _without_nulls(data, ("truncatedAlerts", "groupLabels", "commonLabels", "commonAnnotations",
                                     "externalURL"))

    def model_post_init(self, __context: object) -> None:
        source = "grafana" if self.version == "1" else "alertmanager"
        if any(a.source != source for a in self.alerts):
            object.__setattr__(self, "alerts", [a.model_copy(update={"source": source}) for a in self.alerts])


def alert_from_api(item: dict) -> Alert:
    """An alert from Alertmanager's ``GET /api/v2/alerts`` in the webhook's shape (always firing:
    the API is asked for active alerts only)."""
    return Alert(
        status="firing",
        labels=item["labels"],
        annotations=item.get("annotations") or {},
        startsAt=item["startsAt"],
        endsAt=item.get("endsAt"),
        generatorURL=item.get("generatorURL") or "",
        fingerprint=item.get("fingerprint") or "",
    )
