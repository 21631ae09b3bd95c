"""The arms of the copy-guard bench: what each run does, and the route it gives the controller.

Every guarded arm is the shipped route (``controllers/copy_guard/manifest.py``) with its own
params; the shipped arms keep the shipped matchers (since the fifth bench the two overload alerts
and CopyGuardSiteCrowded), the others match CopyGuardSiteOverloaded and
CopyGuardSiteOverloadPredicted, plus CopyGuardSiteCrowded for the crowd arms (``route_for``):

- ``paper``: ``mode: pause``, resume as soon as the alert resolves (the paper's rule);
- ``min-pause-20s``: ``mode: pause``, each pause held at least 20 s (the old README's advice);
- ``throttle``: the shipped defaults (``mode: adaptive``, AIMD on the copy's share of its speed;
  since the fifth bench with the crowd alert and ``crowd: pause``); ``throttle-overload``: the
  route shipped before (the two overload alerts, no crowd setting);
- ``throttle-*``: the same throttle at other settings, for the Pareto of saved vs copy delay
  (``throttle-asked``: the floor compares the visitors asking, as the alerts do, not the demand
  that counts requests in flight, i.e. pages the copy made slow);
- ``paper-crowd`` / ``throttle-crowd``: the route also matches ``CopyGuardSiteCrowded`` (visitors
  arriving faster than 1.5x the threshold, or a crowd's backlog still waiting: the rules'
  ``site:promreflex_copy_guard_crowd:bool``): the paper's rule then pauses from the crowd's
  first scrape until its queue drained; the throttle (``crowd: pause``) likewise, and runs the
  copy free at once after it if the shop is asked for less than its floor;
  ``throttle-crowd-hold``: the throttle with ``crowd: hold`` (no probing up while it lasts);
- ``oracle``: no guard; the bench itself stops the copy (SIGSTOP to its process group) from the
  flash crowd's arrival until its backlog drained (``scenario.oracle_hold``, known to the bench in
  advance, no reaction time) and lets it go on then: the best a guard that pauses for the crowd
  can do, and on a CPU-bound copy the least delay it costs (a yardstick, not a product);
- ``quiet``: no visitors at all, only our exporters, the shipped route: the copy must never be
  paused or slowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    load: bool
    copy: bool
    params: dict[str, Any] | None = None  # None: no copy-guard route (no guard)
    shipped: bool = False  # the shipped route's params as they are (plus registry_dir)
    throttle: bool = field(default=False)  # a point of the Pareto
    crowd: bool = False  # the route also matches CopyGuardSiteCrowded
    oracle: bool = False  # the bench pauses the copy exactly for the flash crowd and its drain

    @property
    def guarded(self) -> bool:
        return self.params is not None or self.shipped


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("load-only", "load only (no copy)", True, False),
    Arm("no-guard", "copy, no guard", True, True),
    Arm("paper", "paper's rule: pause, resume at once", True, True, {"mode": "pause", "min_pause": "0s"}),
    Arm("min-pause-20s", "pause, min_pause 20 s", True, True, {"mode": "pause", "min_pause": "20s"}),
    Arm("throttle", "throttle, shipped defaults", True, True, {}, shipped=True, throttle=True),
    # The shipped route until issue 16's fifth bench (results before 2026-11-27 call it "throttle"):
    # the two overload alerts only, no crowd setting.
    Arm("throttle-overload", "throttle, overload alerts only (shipped until the fifth bench)", True, True,
        {"mode": "adaptive"}, throttle=True),
    Arm("throttle-gentle", "throttle: increase 0.05, min_share 0.05", True, True,
        {"mode": "adaptive", "increase": 0.05, "decrease": 0.5, "min_share": 0.05}, throttle=True),
    Arm("throttle-fast", "throttle: increase 0.2, decrease 0.7, min_share 0.2", True, True,
        {"mode": "adaptive", "increase": 0.2, "decrease": 0.7, "min_share": 0.2}, throttle=True),
    Arm("throttle-asked", "throttle: demand = visitors asking (in flight not counted)", True, True,
        {"mode": "adaptive", "demand_signal": "asked"}, throttle=True),
    Arm("throttle-nopause", "throttle, never pause (severe 0, emergency_after 0)", True, True,
        {"mode": "adaptive", "severe": 0, "emergency_after": "0s"}, throttle=True),
    Arm("throttle-hard", "throttle: decrease 0.3", True, True,
        {"mode": "adaptive", "decrease": 0.3, "increase": 0.1}, throttle=True),
    Arm("paper-crowd", "paper's rule + crowd alert (pause from the crowd's arrival until its queue drained)",
        True, True, {"mode": "pause", "min_pause": "0s"}, crowd=True),
    Arm("throttle-crowd", "throttle + crowd alert, crowd: pause", True, True,
        {"mode": "adaptive", "crowd": "pause"}, throttle=True, crowd=True),
    Arm("throttle-crowd-hold", "throttle + crowd alert, crowd: hold (no probing up)", True, True,
        {"mode": "adaptive", "crowd": "hold"}, throttle=True, crowd=True),
    Arm("oracle", "oracle: the bench pauses the copy from the crowd's arrival until its backlog drained",
        True, True, oracle=True),
    Arm("quiet", "quiet shop (no visitors), shipped route", False, True, {}, shipped=True),
)}
#: The loaded arms a full run measures, in order (a round alternates the direction).
DEFAULT_LOADED = ["load-only", "no-guard", "paper", "min-pause-20s", "throttle", "throttle-gentle",
                  "throttle-nopause"]
BASELINE, UNGUARDED = "load-only", "no-guard"
#: The arms' matchers: the two overload alerts, and those with the crowd alert (the shipped
#: route's since the fifth bench; arms without ``crowd`` keep the overload alerts only).
OVERLOAD_MATCHER = 'alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted"'
CROWD_MATCHER = 'alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"'


def shipped_route() -> dict[str, Any]:
    """The copy guard's route as the manifest ships it."""
    from controllers.copy_guard.manifest import CAPABILITY

    route = next(r for r in CAPABILITY.routes if r.get("action") == "copy-guard")
    return {**route, "params": dict(route.get("params", {}))}


def route_for(arm: Arm, registry_dir: str) -> list[dict[str, Any]]:
    """The controller's routes for an arm: none, or the shipped route with the arm's params."""
    if not arm.guarded:
        return []
    base = shipped_route()
    params = dict(base["params"]) if arm.shipped else {k: v for k, v in base["params"].items() if k == "max_pause"}
    params.update(arm.params or {})
    params["registry_dir"] = registry_dir
    matchers = list(base["matchers"]) if arm.shipped else [CROWD_MATCHER if arm.crowd else OVERLOAD_MATCHER]
    return [{**base, "name": f"copy-guard-{arm.name}", "matchers": matchers, "params": params}]


def plan(arms: list[str], rounds: int, reverse_first: bool = False, quiet: bool = True) -> list[tuple[int, str]]:
    """The loaded arms, alternating direction by round (baselines drift on this machine), then the
    quiet arm once."""
    out: list[tuple[int, str]] = []
    for r in range(rounds):
        order = arms if (r + reverse_first) % 2 == 0 else list(reversed(arms))
        out += [(r, a) for a in order]
    return out + ([(0, "quiet")] if quiet else [])
