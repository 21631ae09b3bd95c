"""Generate rules/tests/<concern>-{15s,30s,60s}.test.yml: every rules file at the scrape and
evaluation intervals real users run (15, 30 and 60 s), for every recording rule and alert.

Why generated: one scenario a rule (healthy, then a fault from T0 to T1, then healthy again) is
written once and rendered at each interval, so the three files cannot drift apart.

How the files model a real Prometheus (and not promtool's lucky case):

- Scrapes are OFFSET from evaluations by half an interval (samples at (k + 1/2) x S, rules
  evaluated at k x S). promtool evaluates exactly on the samples' timestamps, and Prometheus 2's
  range selectors are closed ([t - w, t]), so there a 1m window holds 2 samples at a 60 s scrape
  and rate() works; in a real server scrapes and evaluations have independent offsets and a 1m
  window holds 1 sample (Prometheus 3's left-open windows: always). Input series are given at
  S/2 with every other value missing (`_`).
- One scrape during each fault FAILS, as Prometheus records it: a staleness marker for every
  series of the target (what it writes for a target that is gone, too) and `up` 0. In a range
  it is a sample missing: a window that holds only the 2 samples rate() needs then empties for
  an evaluation, and an alert's `for` starts over (the 30 s flicker). In an instant selector the
  series is gone for that evaluation: every gauge the rules read (thresholds, memory, the
  dependency graph, timestamps, switches) is therefore read with `last_over_time(x[2m])` (its
  last sample within two scrapes at 60 s).

Each alert is checked at every evaluation from the first that must fire to the last (state
"firing" without a gap), absent one evaluation before and absent again after the fault (resolve
time). Each recording rule is checked at every evaluation of a steady stretch that contains a
missed scrape.

Usage: ``scripts/uv run --frozen python -m tests.rules_intervals`` (writes the files);
``--check`` exits 1 when the committed files differ (tests/unit/test_rules_intervals.py).
``--probe`` prints, per alert and interval, the evaluations at which it fires (a promtool run
with every step expected empty: the failures are the firing steps), to fill ``FIRES`` below.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from promreflex.config import REPO_ROOT

RULES_TESTS = REPO_ROOT / "rules" / "tests"
INTERVALS = (15, 30, 60)
T0 = 15 * 60  # the fault starts (every window up to 10m is full and quiet before)
T1 = 35 * 60  # the fault ends
HORIZON = 42 * 60  # every alert has resolved by 40m
MISSED = T0 + 8 * 60  # the first scrape at or after this time is missed (during the fault)

Value = Callable[[float], "float | None"]


def counter(*pieces: tuple[float, float]) -> Value:
    """A counter from 0 whose rate is ``r`` per second from time ``t`` on, for each ``(t, r)``."""
    def value(t: float) -> float:
        total, pieces_ = 0.0, sorted(pieces)
        for i, (start, rate) in enumerate(pieces_):
            end = pieces_[i + 1][0] if i + 1 < len(pieces_) else float("inf")
            if t > start:
                total += rate * (min(t, end) - start)
        return total
    return value


def steps(*pieces: tuple[float, float]) -> Value:
    """A gauge that is ``v`` from time ``t`` on, for each ``(t, v)``."""
    def value(t: float) -> float:
        return [v for start, v in sorted(pieces) if t >= start][-1]
    return value


def fault(healthy: float, bad: float) -> Value:
    return steps((0, healthy), (T0, bad), (T1, healthy))


def fault_rate(healthy: float, bad: float) -> Value:
    return counter((0, healthy), (T0, bad), (T1, healthy))


def one_event() -> Value:
    """A counter created at 0 that counts one event at T0."""
    return steps((0, 0), (T0, 1))


def histogram(name: str, labels: str, bounds: list[str], healthy: str, bad: str, rate: float) -> dict[str, Value]:
    """Buckets, _count and _sum of a histogram observing ``rate`` per second, all in the bucket
    ``healthy`` (an `le`) before and after the fault and in ``bad`` during it."""
    def in_bucket(le: str, which: str) -> float:
        return rate if (le == "+Inf" or float(le) >= float(which)) else 0.0

    series: dict[str, Value] = {}
    for le in bounds:
        series[f'{name}_bucket{{{labels}, le="{le}"}}'] = fault_rate(in_bucket(le, healthy), in_bucket(le, bad))
    series[f"{name}_count{{{labels}}}"] = fault_rate(rate, rate)
    series[f"{name}_sum{{{labels}}}"] = fault_rate(rate * float(healthy) / 2, rate * float(bad) / 2)
    return series


@dataclass
class Alert:
    name: str
    series: dict[str, Value]
    # Per interval: (first evaluation firing, first evaluation absent again), seconds.
    fires: dict[int, tuple[int, int]] = field(default_factory=dict)
    labels: str = ""  # the firing ALERTS series' labels, as promtool prints them
    note: str = ""


@dataclass
class Recorded:
    series: dict[str, Value]
    # record name -> number of series expected at every evaluation from 6m to 20m
    counts: dict[str, int]


@dataclass
class Concern:
    name: str
    groups: list[str]
    recorded: Recorded | None
    alerts: list[Alert]


def fmt(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def tokens(value: Value, interval: int, horizon: int, missed: bool, name: str = "", failed: bool = True) -> str:
    """Values at S/2 resolution: samples at (k + 1/2) x S, `_` between; at the missed scrape what
    Prometheus writes for a FAILED one: a staleness marker for every series the target exposes,
    and `up` 0 (a series of Prometheus' own, written at every scrape); with ``failed`` False, a
    late one (the sample absent)."""
    out = []
    half = interval / 2
    missed_at = (MISSED // interval + 0.5) * interval  # the first sample at or after MISSED
    for i in range(int(horizon / half) + 1):
        t = i * half
        if missed and failed and t == missed_at:
            out.append("0" if name.split("{")[0] == "up" else "stale")
            continue
        if missed and t == missed_at:
            out.append("_")
            continue
        v = None if i % 2 == 0 else value(t)
        out.append("_" if v is None else fmt(v))
    # compress runs of `_`
    text, run = [], 0
    for tok in out:
        if tok == "_":
            run += 1
            continue
        if run:
            text.append("_" if run == 1 else f"_x{run}")
            run = 0
        text.append(tok)
    if run:
        text.append("_" if run == 1 else f"_x{run}")
    return " ".join(text)


def duration(seconds: float) -> str:
    s = int(seconds)
    m, s = divmod(s, 60)
    return (f"{m}m" if m else "") + (f"{s}s" if s or not m else "")


AL = 'job="accesslog", instance="a:1", site="shop"'
ADM = 'job="admission", instance="p:1"'
CTL = 'job="controller", instance="c:1"'
MX = 'job="mesh", instance="m:1", workload="shop"'
NG = 'job="nginx", instance="n:1"'
SW = 'job="swift", instance="s:1"'
MESH_BOUNDS = ["0.1", "0.25", "0.5", "1", "3", "5", "+Inf"]


def concerns() -> list[Concern]:
    nginx_traffic = {
        f"nginx_http_requests_total{{{NG}}}": counter((0, 2 + 1 / 60)),
        f"nginx_up{{{NG}}}": steps((0, 1)),
    }
    return [
        Concern("accesslog", ["accesslog.rules", "accesslog.alerts"], Recorded(
            {f"promreflex_accesslog_lines_total{{{AL}}}": counter((0, 1)),
             f'promreflex_accesslog_parse_errors_total{{{AL}, reason="format"}}': counter((0, 0.1)),
             **nginx_traffic},
            {"site:promreflex_accesslog_parse_errors:ratio_rate5m": 1,
             "job:nginx_http_requests_without_probes:rate5m": 1}), [
            Alert("PromreflexAccessLogMostlyRejected", {
                f"promreflex_accesslog_lines_total{{{AL}}}": counter((0, 1)),
                f'promreflex_accesslog_parse_errors_total{{{AL}, reason="format"}}': fault_rate(0, 0.8)}),
            Alert("PromreflexAccessLogNotGrowing", {
                f"promreflex_accesslog_lines_total{{{AL}}}": fault_rate(1, 0),
                f'promreflex_accesslog_parse_errors_total{{{AL}, reason="format"}}': counter((0, 0)),
                **nginx_traffic}),
        ]),
        Concern("admission", ["admission.rules", "admission.alerts"], Recorded(
            {f'promreflex_admission_page_queue_length{{{ADM}, page="browse"}}': steps((0, 3)),
             f"promreflex_admission_sessions_completed_total{{{ADM}}}": counter((0, 1)),
             f'promreflex_admission_sessions_abandoned_total{{{ADM}, page="browse"}}': counter((0, 0.5)),
             f'promreflex_admission_sessions_rejected_total{{{ADM}, reason="queue_full"}}': counter((0, 0.2))},
            {"instance:promreflex_admission_page_queue_length:avg1m": 1,
             "instance:promreflex_admission_sessions_completed:rate2m": 1,
             "instance:promreflex_admission_sessions_abandoned:rate2m": 1,
             "instance:promreflex_admission_sessions_abandoned:ratio_rate2m": 1,
             "instance:promreflex_admission_sessions_abandoned:ratio_calm": 1,
             "instance:promreflex_admission_sessions_abandoned:ratio_usual": 1,
             "instance:promreflex_admission_waiting_room_answers:rate2m": 1}), [
            Alert("AdmissionBacklog", {
                f'promreflex_admission_page_queue_length{{{ADM}, page="browse"}}': fault(2, 50),
                f"promreflex_admission_session_queue_threshold{{{ADM}}}": steps((0, 10))}),
            Alert("AdmissionSessionsAbandoned", {
                f"promreflex_admission_sessions_completed_total{{{ADM}}}": counter((0, 1)),
                f'promreflex_admission_sessions_abandoned_total{{{ADM}, page="browse"}}': fault_rate(0.1, 3),
                f"promreflex_admission_abandon_ratio_threshold{{{ADM}}}": steps((0, 0.5))}),
            Alert("AdmissionWaitingRoomActive", {
                f"promreflex_admission_waiting_room_mode{{{ADM}}}": steps((0, 0)),
                f'promreflex_admission_sessions_rejected_total{{{ADM}, reason="queue_full"}}': fault_rate(0, 1)}),
            Alert("AdmissionHoldExpired", {
                f"promreflex_admission_holds_expired_total{{{ADM}}}": one_event()}),
        ]),
        Concern("controller", ["controller.rules", "controller.alerts"], Recorded(
            {f'promreflex_controller_notifications_total{{{CTL}, status="firing", result="accepted"}}': counter((0, 1)),
             f'promreflex_controller_actions_total{{{CTL}, action="log", transition="fire", result="ok"}}': counter((0, 0.5)),
             **{f'promreflex_controller_action_duration_seconds_bucket{{{CTL}, action="log", le="{le}"}}':
                counter((0, 0.5)) for le in ("0.01", "+Inf")}},
            {"status_result:promreflex_controller_notifications:rate1m": 1,
             "action_result:promreflex_controller_actions:rate1m": 1,
             "action:promreflex_controller_action_duration_seconds:p95_5m": 1}), [
            # Reconciles every 15 s (the default) until T0, then stops; again from T1.
            Alert("PromreflexControllerReconcileStale", {
                f"promreflex_controller_last_reconcile_timestamp_seconds{{{CTL}}}":
                    lambda t: (t // 15) * 15 if (t < T0 or t >= T1) else T0}),
            Alert("PromreflexControllerActionErrors", {
                f'promreflex_controller_actions_total{{{CTL}, action="log", transition="fire", result="error"}}': one_event()}),
            Alert("PromreflexControllerRejectingPayloads", {
                f'promreflex_controller_payload_rejections_total{{{CTL}, reason="token"}}': one_event()}),
            Alert("PromreflexControllerTransitionFailing", {
                f'promreflex_controller_transitions_failing{{{CTL}, route="r", action="log"}}': fault(0, 1)}),
        ]),
        Concern("mesh-exporter", ["mesh-exporter.rules", "mesh-exporter.alerts"], Recorded(
            {f"promreflex_mesh_lines_total{{{MX}}}": counter((0, 2)),
             f'promreflex_mesh_parse_errors_total{{{MX}, reason="format"}}': counter((0, 0.1)),
             f'promreflex_mesh_parse_errors_total{{{MX}, reason="empty"}}': counter((0, 0.1))},
            {"workload:promreflex_mesh_parse_errors:ratio_rate5m": 1}), [
            Alert("PromreflexMeshLogMostlyRejected", {
                f"promreflex_mesh_lines_total{{{MX}}}": counter((0, 2)),
                f'promreflex_mesh_parse_errors_total{{{MX}, reason="format"}}': fault_rate(0, 1.8),
                f'promreflex_mesh_parse_errors_total{{{MX}, reason="empty"}}': counter((0, 0))}),
            Alert("PromreflexMeshLabelBudgetExceeded", {
                'promreflex_mesh_label_overflow_total{job="mesh", instance="m:1", label="source"}':
                    one_event()}),
        ]),
        Concern("mesh", ["mesh.rules", "mesh.alerts"], Recorded(
            {**histogram("promreflex_mesh_request_duration_seconds", 'job="mesh", instance="m:1", source="b", destination="c"',
                         MESH_BOUNDS, "0.1", "0.1", 10),
             'promreflex_mesh_requests_total{job="mesh", instance="m:1", source="b", destination="c", code_class="2xx"}':
                 counter((0, 9)),
             'promreflex_mesh_requests_total{job="mesh", instance="m:1", source="b", destination="c", code_class="5xx"}':
                 counter((0, 1)),
             'promreflex_mesh_edge_info{job="mesh", instance="m:1", source="b", destination="c"}': steps((0, 1))},
            {"service_le:promreflex_mesh_request_duration_seconds_bucket:rate1m": len(MESH_BOUNDS),
             "service:promreflex_mesh_requests:rate1m": 1,
             "service:promreflex_mesh_request_duration_seconds:max_1m": 1,
             "service:promreflex_mesh_request_duration_seconds:p99_1m": 1,
             "service:promreflex_mesh_response_time_threshold_seconds:effective": 1,
             "source_destination:promreflex_mesh_requests:rate1m": 1,
             "source_destination:promreflex_mesh_request_errors:ratio_rate1m": 1,
             "source_destination:promreflex_mesh_request_duration_seconds:p99_1m": 1,
             "source_destination:promreflex_mesh_edge_info:max": 1,
             "mesh:promreflex_mesh_response_time_threshold_seconds:default": 1}), [
            # c answers in 100 ms, then in 4 s (bucket le=5) during the fault: above the 3 s line.
            Alert("ServiceResponseTimeHigh", histogram(
                "promreflex_mesh_request_duration_seconds", 'source="b", destination="c"', MESH_BOUNDS, "0.1", "5", 10)),
        ]),
        Concern("nginx", ["nginx.rules", "nginx.alerts"], Recorded(
            {**histogram("promreflex_http_request_duration_seconds", AL, ["0.25", "0.5", "1", "+Inf"], "0.25", "0.25", 2),
             f'promreflex_nginx_memory_bytes{{{NG}, method="pss"}}': steps((0, 5242880))},
            {"site:promreflex_http_request_duration_seconds:mean1m": 1,
             "site:promreflex_http_request_duration_seconds:p95_1m": 1,
             "instance:promreflex_nginx_memory_bytes:sum": 1,
             "threshold:promreflex_nginx_response_time_p95_seconds:max": 1,
             "threshold:promreflex_nginx_memory_bytes:max": 1}), [
            # 2 requests/s within 250 ms, then within 1 s during the fault (p95 above 0.5 s).
            Alert("NginxResponseTimeHigh", histogram(
                "promreflex_http_request_duration_seconds", AL, ["0.25", "0.5", "1", "+Inf"], "0.25", "1", 2)),
            Alert("NginxMemoryHigh", {
                f'promreflex_nginx_memory_bytes{{{NG}, method="pss"}}': fault(5242880, 300 * 1048576)}),
        ]),
        Concern("stack", ["stack.rules", "stack.alerts"], Recorded(
            {f"up{{{NG}}}": steps((0, 1))}, {"job:up:ratio": 1}), [
            Alert("Watchdog", {}),
            # Alertmanager repeats Watchdog every minute until T0, then nothing reaches the controller.
            Alert("PromreflexWatchdogNotReceived", {
                f"promreflex_controller_last_notification_timestamp_seconds{{{CTL}}}":
                    lambda t: (t // 60) * 60 if (t < T0 or t >= T1) else (T0 // 60) * 60}),
            # The controller takes a webhook request every 20 s; during the fault it answers a third 500.
            Alert("PromreflexWebhookDeliveryFailing", {
                f'promreflex_controller_webhook_requests_total{{{CTL}, code="200"}}': fault_rate(0.05, 0.05 * 2 / 3),
                f'promreflex_controller_webhook_requests_total{{{CTL}, code="500"}}': fault_rate(0, 0.05 / 3)}),
            Alert("PromreflexTargetDown", {f"up{{{NG}}}": fault(1, 0)}),
            Alert("NginxDown", {f"nginx_up{{{NG}}}": fault(1, 0)}),
            Alert("PromreflexSelftest", {'promreflex_selftest_switch{job="selftest", instance="t:1"}': fault(0, 1)}),
        ]),
        Concern("swift", ["swift.rules", "swift.alerts"], Recorded(
            {**histogram("promreflex_swift_node_processing_seconds", f'{SW}, node="n1", role="object"',
                         ["0.1", "0.25", "0.5", "1", "+Inf"], "0.1", "0.1", 1),
             **histogram("promreflex_swift_hop_transit_seconds", f'{SW}, src_role="proxy", dst_role="object"',
                         ["0.001", "0.005", "0.01", "+Inf"], "0.001", "0.001", 1),
             **histogram("promreflex_swift_phase_seconds", f'{SW}, phase="backend"',
                         ["0.01", "0.1", "+Inf"], "0.01", "0.01", 1),
             f'promreflex_swift_retransmissions_total{{{SW}, src_role="proxy", dst_role="object"}}': counter((0, 0.01)),
             f'promreflex_swift_joins_total{{{SW}, result="trans_id"}}': counter((0, 1)),
             f'promreflex_swift_joins_total{{{SW}, result="ambiguous"}}': counter((0, 0.1)),
             f"promreflex_swift_node_processing_threshold_seconds{{{SW}}}": steps((0, 0.25)),
             f"promreflex_swift_hop_transit_threshold_seconds{{{SW}}}": steps((0, 0.005))},
            {"node_role:promreflex_swift_node_processing_seconds:p99_rate5m": 1,
             "node_role:promreflex_swift_node_processing_seconds:mean_rate5m": 1,
             "node_role:promreflex_swift_node_processing:increase5m": 1,
             "hop:promreflex_swift_hop_transit_seconds:p99_rate5m": 1,
             "hop:promreflex_swift_hop_transit:increase5m": 1,
             "phase:promreflex_swift_phase_seconds:p99_rate5m": 1,
             "hop:promreflex_swift_retransmissions:ratio_rate5m": 1,
             "swift:promreflex_swift_joins_ambiguous:ratio_rate5m": 1,
             "swift:promreflex_swift_node_processing_threshold:seconds": 1,
             "swift:promreflex_swift_hop_transit_threshold:seconds": 1}), [
            Alert("SwiftNodeSlow", {
                **histogram("promreflex_swift_node_processing_seconds", f'{SW}, node="n1", role="object"',
                            ["0.1", "0.25", "0.5", "1", "+Inf"], "0.1", "1", 1),
                f"promreflex_swift_node_processing_threshold_seconds{{{SW}}}": steps((0, 0.25))}),
            Alert("SwiftHopSlow", {
                **histogram("promreflex_swift_hop_transit_seconds", f'{SW}, src_role="proxy", dst_role="object"',
                            ["0.001", "0.005", "0.01", "+Inf"], "0.001", "0.01", 1),
                f"promreflex_swift_hop_transit_threshold_seconds{{{SW}}}": steps((0, 0.005))}),
            Alert("SwiftRetransmissionsHigh", {
                f'promreflex_swift_hop_transit_seconds_count{{{SW}, src_role="proxy", dst_role="object"}}': counter((0, 1)),
                f'promreflex_swift_retransmissions_total{{{SW}, src_role="proxy", dst_role="object"}}': fault_rate(0, 0.05)}),
            Alert("SwiftConnectionFailures", {
                f'promreflex_swift_connection_failures_total{{{SW}, role="object"}}': one_event()}),
            Alert("PromreflexSwiftCapturesMostlyRejected", {
                f'promreflex_swift_packets_total{{{SW}, node="n1"}}': counter((0, 10)),
                f'promreflex_swift_packets_rejected_total{{{SW}, node="n1", reason="snaplen"}}': fault_rate(0, 8)}),
        ]),
    ]


#: (concern, alert) -> {interval: (first evaluation firing, first evaluation absent again)}, in
#: seconds, as measured with ``--probe`` on the rules as they are and checked against the
#: windows and `for` (README, "Scrape and evaluation intervals"). None: fires from the start.
FIRES: dict[tuple[str, str], dict[int, tuple[int, int] | None]] = {
    ("accesslog", "PromreflexAccessLogMostlyRejected"): {15: (1215, 2220), 30: (1230, 2220), 60: (1260, 2220)},
    ("accesslog", "PromreflexAccessLogNotGrowing"): {15: (1500, 2115), 30: (1500, 2130), 60: (1500, 2160)},
    ("admission", "AdmissionBacklog"): {15: (1035, 2160), 30: (1050, 2220), 60: (1080, 2400)},
    ("admission", "AdmissionSessionsAbandoned"): {15: (1080, 2175), 30: (1080, 2190), 60: (1200, 2280)},
    ("admission", "AdmissionWaitingRoomActive"): {15: (975, 2220), 30: (990, 2220), 60: (1020, 2400)},
    ("admission", "AdmissionHoldExpired"): {15: (915, 1500), 30: (930, 1500), 60: (960, 1500)},
    ("controller", "PromreflexControllerReconcileStale"): {15: (1095, 2115), 30: (1110, 2130), 60: (1140, 2160)},
    ("controller", "PromreflexControllerActionErrors"): {15: (945, 1200), 30: (960, 1200), 60: (1020, 1200)},
    ("controller", "PromreflexControllerRejectingPayloads"): {15: (945, 1200), 30: (960, 1200), 60: (1020, 1200)},
    ("controller", "PromreflexControllerTransitionFailing"): {15: (975, 2115), 30: (990, 2130), 60: (1020, 2160)},
    ("mesh-exporter", "PromreflexMeshLogMostlyRejected"): {15: (1200, 2235), 30: (1200, 2250), 60: (1200, 2280)},
    ("mesh-exporter", "PromreflexMeshLabelBudgetExceeded"): {15: (915, 1500), 30: (930, 1500), 60: (960, 1500)},
    ("mesh", "ServiceResponseTimeHigh"): {15: (930, 2160), 30: (960, 2220), 60: (1020, 2400)},
    ("nginx", "NginxResponseTimeHigh"): {15: (1215, 2160), 30: (1230, 2220), 60: (1260, 2400)},
    ("nginx", "NginxMemoryHigh"): {15: (1515, 2115), 30: (1530, 2130), 60: (1560, 2160)},
    ("stack", "Watchdog"): {15: None, 30: None, 60: None},
    ("stack", "PromreflexWatchdogNotReceived"): {15: (1215, 2115), 30: (1230, 2130), 60: (1260, 2160)},
    # a 5 m rate: fires 5 m after the failures start and stops when they left the window
    ("stack", "PromreflexWebhookDeliveryFailing"): {15: (1230, 2385), 30: (1230, 2400), 60: (1260, 2400)},
    ("stack", "PromreflexTargetDown"): {15: (930, 2115), 30: (960, 2130), 60: (1020, 2160)},
    ("stack", "NginxDown"): {15: (930, 2115), 30: (960, 2130), 60: (1020, 2160)},
    ("stack", "PromreflexSelftest"): {15: (915, 2115), 30: (930, 2130), 60: (960, 2160)},
    ("swift", "SwiftNodeSlow"): {15: (1035, 2400), 30: (1050, 2400), 60: (1080, 2400)},
    ("swift", "SwiftHopSlow"): {15: (1035, 2400), 30: (1050, 2400), 60: (1080, 2400)},
    ("swift", "SwiftRetransmissionsHigh"): {15: (1275, 2340), 30: (1290, 2340), 60: (1320, 2340)},
    ("swift", "SwiftConnectionFailures"): {15: (915, 1500), 30: (930, 1500), 60: (960, 1500)},
    ("swift", "PromreflexSwiftCapturesMostlyRejected"): {15: (1215, 2220), 30: (1230, 2220), 60: (1260, 2220)},
}

HEADER = """\
# GENERATED by `scripts/uv run --frozen python -m tests.rules_intervals` (tests/rules_intervals.py):
# edit the scenarios there, not this file. rules/{name}.rules.yml at a {s} s scrape and rule
# evaluation interval, modelled as a real Prometheus sees it: samples half an interval after the
# evaluations (samples at (k + 1/2) x {s} s, hence the input interval {half} and every other value
# `_`), and one scrape failed during each fault (the first at or after {missed}: staleness
# markers, `up` 0). Each alert: a
# fault from {t0} to {t1}; the alert must be absent one evaluation before it first fires, firing at
# EVERY evaluation from then on until the fault's effect ends (no flicker, no `for` started over),
# and absent again after. Each recording rule: a value at every evaluation from 6m to 30m.
"""


_JOB_INSTANCE = re.compile(r'\bjob="([^"]*)".*?\binstance="([^"]*)"|\binstance="([^"]*)".*?\bjob="([^"]*)"')


def _targets(series: dict[str, Value]) -> dict[str, Value]:
    """``series`` and the `up` of every target (job, instance) they name that has none: Prometheus
    writes it at every scrape (1, and 0 for the failed one), and the rules tell a failed scrape
    from a target that went away by it."""
    out = dict(series)
    def target(name: str) -> tuple[str, str] | None:
        m = _JOB_INSTANCE.search(name)
        if m is None:
            return None
        return (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(4), m.group(3))

    have = {target(name) for name in series if name.startswith("up{")}
    for name in series:
        t = target(name)
        if t is not None and t not in have:
            have.add(t)
            out[f'up{{job="{t[0]}", instance="{t[1]}"}}'] = lambda _t: 1.0
    return out


def _series(series: dict[str, Value], s: int, missed: bool = True) -> list[dict[str, str]]:
    return [{"series": name, "values": tokens(value, s, HORIZON, missed, name)} for name, value in _targets(series).items()]


def _value(expr: str, t: float, n: int | None) -> dict[str, object]:
    """``expr`` at ``t`` is the single value ``n`` (None: no series at all)."""
    return {"expr": expr, "eval_time": duration(t),
            "exp_samples": [] if not n else [{"labels": "{}", "value": n}]}


def render(concern: Concern, s: int, probe: bool = False) -> str:
    half = f"{s * 500}ms" if s % 2 else f"{s // 2}s"
    tests: list[dict[str, object]] = []
    if concern.recorded and not probe:
        # Over 6m..30m (both included), at every evaluation: as many steps with a value as there
        # are evaluations, and never fewer series than expected.
        stretch, steps_ = f"[{duration(24 * 60)}:{s}s]", 24 * 60 // s + 1
        checks = []
        for rec, n in concern.recorded.counts.items():
            checks.append(_value(f"count_over_time(count({rec}){stretch})", 30 * 60, steps_))
            checks.append(_value(f"min_over_time(count({rec}){stretch})", 30 * 60, n))
        tests.append({"name": f"{s} s: every recording rule has a value at every evaluation, across a failed scrape",
                      "interval": half, "input_series": _series(concern.recorded.series, s),
                      "promql_expr_test": checks})
    for alert in concern.alerts:
        firing = f'count(ALERTS{{alertname="{alert.name}", alertstate="firing"}})'
        anystate = f'ALERTS{{alertname="{alert.name}"}}'
        if probe:
            checks = [_value(firing, t, None) for t in range(0, HORIZON + 1, s)]
            name = f"{s} s: {alert.name}"
        else:
            span = FIRES[(concern.name, alert.name)][s]
            if span is None:
                checks = [_value(f"count_over_time({firing}[{duration(HORIZON)}:{s}s])", HORIZON, HORIZON // s + 1)]
                name = f"{s} s: {alert.name} fires at every evaluation"
            else:
                first, gone = span
                last = gone - s
                # count_over_time over a subquery at every evaluation first..last: all firing.
                checks = [_value(anystate, T0, None), _value(firing, first - s, None),
                          _value(f"count_over_time({firing}[{duration(last - first)}:{s}s])", last,
                                 (last - first) // s + 1),
                          _value(anystate, gone, None), _value(anystate, HORIZON, None)]
                name = (f"{s} s: {alert.name}: fault {duration(T0)}-{duration(T1)}, firing from {duration(first)} "
                        f"({duration(first - T0)} after) at every evaluation, resolved at {duration(gone)} "
                        f"({duration(gone - T1)} after its end)")
        tests.append({"name": name, "interval": half, "input_series": _series(alert.series, s),
                      "promql_expr_test": checks})
    doc = {"rule_files": [f"../{concern.name}.rules.yml"], "evaluation_interval": f"{s}s",
           "group_eval_order": concern.groups, "tests": tests}
    header = HEADER.format(name=concern.name, s=s, half=half, missed=duration(MISSED), t0=duration(T0), t1=duration(T1))
    return header + yaml.safe_dump(doc, sort_keys=False, width=100_000)


def path(concern: Concern, s: int) -> Path:
    return RULES_TESTS / f"{concern.name}-{s}s.test.yml"


_FAILED = re.compile(r'expr: "count\(ALERTS\{alertname=\\"(\w+)\\", alertstate=\\"firing\\"\}\)", time: (\S+),')


def _seconds(text: str) -> int:
    total = 0
    for n, unit in re.findall(r"(\d+)(h|m|s)", text):
        total += int(n) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def probe(rules_dir: Path) -> dict[tuple[str, str], dict[int, list[int]]]:
    """Per alert and interval, the evaluations at which it is firing (rules from ``rules_dir``)."""
    found: dict[tuple[str, str], dict[int, list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tests = Path(tmp) / "tests"
        tests.mkdir()
        for concern in concerns():
            (Path(tmp) / f"{concern.name}.rules.yml").write_text((rules_dir / f"{concern.name}.rules.yml").read_text())
            for s in INTERVALS:
                f = tests / f"{concern.name}-{s}s.test.yml"
                f.write_text(render(concern, s, probe=True))
                run = subprocess.run(["promtool", "test", "rules", str(f)], capture_output=True, text=True)
                out = run.stdout + run.stderr
                for alert in concern.alerts:
                    found.setdefault((concern.name, alert.name), {})[s] = []
                for m in _FAILED.finditer(out):
                    found[(concern.name, m.group(1))][s].append(_seconds(m.group(2)))
    return found


def spans(times: list[int], s: int) -> str:
    if not times:
        return "never"
    runs, start = [], times[0]
    for a, b in zip(times, times[1:] + [None]):
        if b != a + s:
            runs.append(f"{duration(start)}..{duration(a)}")
            if b is not None:
                start = b
    return ", ".join(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.rules_intervals", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    parser.add_argument("--probe", type=Path, nargs="?", const=REPO_ROOT / "rules", metavar="RULES_DIR",
                        help="print when each alert fires, with the rules of RULES_DIR (default rules/)")
    args = parser.parse_args(argv)
    if args.probe:
        for (name, alert), by_s in probe(args.probe).items():
            print(f"{name:14} {alert:40} " + " | ".join(f"{s}s: {spans(t, s)}" for s, t in by_s.items()))
        return 0
    stale = []
    for concern in concerns():
        for s in INTERVALS:
            text = render(concern, s)
            if args.check:
                if not path(concern, s).is_file() or path(concern, s).read_text() != text:
                    stale.append(path(concern, s).name)
            else:
                path(concern, s).write_text(text)
    if stale:
        print("stale: " + ", ".join(stale) + "; run: scripts/uv run --frozen python -m tests.rules_intervals",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
