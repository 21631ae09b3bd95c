"""The adaptive throttle: how fast a site's copies may run while the site is near its line.

One :class:`Throttle` per site episode holds a *share* ``s`` of the copies' full speed
(1 = free, 0 = paused). The copy-guard action feeds it the site's signal from Prometheus
(:class:`Signal`: the served rate, the calibrated threshold, demand and the demand floor, and
the time and window of the served sample) and applies the share it returns to every copy of the
site (``promreflex copy`` paces itself at ``s`` of its speed; adopted processes are frozen
``1 - s`` of every duty period, see ``freeze.py`` and ``watchdog.py``).

The rule is AIMD (additive increase, multiplicative decrease), as TCP's congestion control:
- below the line (served < threshold while demand >= floor: the alert's own condition):
  ``s *= decrease`` (0.5), down to ``min_share``;
- the shop keeps up with its visitors: ``s += increase`` (0.1), up to 1. That is: comfortably
  above the line (served >= threshold * (1 + band)); or served >= threshold with demand no
  more than served * (1 + band) (it serves what it is asked); or demand under the floor
  (moderately busy: asked for less than a healthy shop serves, it loses nothing; the copy's
  business is not to wait for it);
- quiet (demand < ``QUIET_RATIO`` (0.5) * floor: plenty of headroom, e.g. the load ended):
  ``s = 1`` at once;
- otherwise (served within the band while visitors ask for more than it serves): hold.
Why "keeps up with demand" and not only "served >= threshold * (1 + band)": the calibrated
threshold is a low quantile of a healthy shop's served rate, often a few percent under its
usual rate (issue 16's bench: 67.6 for ~70), so a loaded healthy shop sits inside a 5% band for
good and the copy never got its speed back (held at 0.1-0.3 for 80 s, +573..614%). Demand says
whether there is anything left to serve: a shop that serves what it is asked gains nothing from
a slower copy.
Which demand: ``Settings.demand_signal`` "demand" (the default) compares the rules' demand, which
counts requests in flight (a crowd's backlog keeps the copy slow until it is served, but so do
pages the copy itself made slow: on WordPress at half its capacity 6 requests in flight read as
76 req/s against a floor of 71.5); "asked" compares what visitors ask (arrivals, completions: the
alerts' own gate), so a shop that keeps up with its arrivals gets its copy back.
A crowd (``Settings.crowd``, issue 16's third bench; the rules' ``site:promreflex_copy_guard_crowd:bool``:
visitors arriving faster than 1.5x the threshold, or requests waiting that a crowd left behind):
"ignore" (the default) judges as above; "hold" never probes upward while it lasts (below the
line still halves the share): a crowd's queue drains with the served rate back above the line,
and a copy climbing back then made the queued visitors wait past their patience; "pause" pauses
the copies while it lasts (an emergency pause, reason "crowd") and, the crowd and its queue gone,
gives them back the share they had before it (1 when the crowd opened the episode), not
``min_share``: the crowd, not the copy's speed, made the shop suffer, and a copy that climbed
back from ``min_share`` by a tenth a decision doubled its length in the queue model
(tests/unit/test_copy_guard_throttle.py). If that share is too much, the line says so and AIMD
backs off as usual.
With "hold" or "pause" the throttle judges on what visitors ask (as ``demand_signal: asked``):
the crowd flag holds the copy through a crowd's backlog, which is what the in-flight term of
the rules' demand was for, and a crowd's pause counted in flight as demand ended only once
fewer than threshold x healthy response time (10 on WordPress) waited: on a shop whose normal
demand sits under its threshold (served < threshold always) the copy stayed paused 19.8 s where
the paper's rule with the crowd alert let it go after 13.8 s (third bench, WordPress).
Why AIMD: the guard does not know how much of the copy the shop can afford (it depends on the
copy's I/O mode, the disk, the shop's cache, the load), the signal is noisy and lagged, and the
only feedback is one bit (below or not) plus a magnitude. AIMD needs no model of the plant:
it backs off fast when the shop suffers (each decision halves the copy's share, so a copy that
hurts is down to 1/8 within three decisions) and probes slowly upward (a tenth per decision),
so it settles near the largest share the shop affords instead of flipping between paused and
free. Decisions are paced by the signal: one per served sample that FULLY reflects the last
change (sample time >= last change + the rate's window: 1 s at the local stack's 200 ms
scrapes, 1 min at 15 s), so a change is never judged on data from before it, and the loop is
as fast as the signal allows and no faster. A plain proportional controller was rejected: its
gain depends on the unknown copy-to-shop coupling and it oscillates when that gain is wrong.

The pause is kept for emergencies: a severe deficit (served < ``severe`` * threshold: the shop
lost half its throughput) or still below the line at ``min_share`` for ``emergency_after``.
After an emergency pause, the copies restart at ``min_share`` once the site is above its line
(and the pause lasted ``min_pause``); a pause that reaches ``max_pause`` ends (counted as
forced) and no emergency pause follows in that episode.

Without a usable signal (Prometheus unreachable, no served series for the site, or a served
sample older than 4 windows and 10 s: the rules stopped) the throttle falls back to the alert bit: an alert holding the episode means below, none means above, one
decision per ``fallback_period``.

Sample times are Prometheus's clock, decisions the controller's: both on one host here; a
remote Prometheus whose clock is off by more than a window makes decisions early or late.

Pure logic, no I/O and no clock of its own: tests drive it with a model of the shop and of
Prometheus (scrapes, rate windows) at 200 ms and 15 s scrapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["below", "severe", "hold", "above", "light", "quiet", "crowd"]
FALLBACK_PERIOD = 2.0
STALE_AFTER = 10.0  # a served sample older than this (and 4 windows) is no signal: rules stopped
QUIET_RATIO = 0.5  # demand under this share of the floor: quiet, the copy runs free at once
EMERGENCY_REASONS = ("severe", "floor", "crowd")
KEEPS_UP: tuple[Verdict, ...] = ("hold", "above", "light", "quiet")  # a pause may end on these


@dataclass(frozen=True)
class Settings:
    decrease: float = 0.5  # multiplicative decrease factor, in (0, 1)
    increase: float = 0.1  # additive increase per decision, in (0, 1]
    min_share: float = 0.1  # lowest share before an emergency pause
    band: float = 0.05  # hold while threshold <= served < threshold * (1 + band)
    severe: float = 0.5  # served < severe * threshold: emergency pause (0: never)
    emergency_after: float = 10.0  # below at min_share this long: emergency pause (0: never)
    period: float | None = None  # least seconds between decisions; None: the signal's window
    min_pause: float = 0.0  # an emergency pause lasts at least this long
    max_pause: float = 120.0  # and at most this long
    # Which demand the floor and the band compare: "demand" (requests in flight count: a backlog,
    # or pages the copy made slow) or "asked" (visitors arriving, the alerts' own gate).
    demand_signal: Literal["demand", "asked"] = "demand"
    # What a crowd (Signal.crowd) does: nothing more ("ignore"), no probing up ("hold"), or a
    # pause while it lasts ("pause"; module doc).
    crowd: Literal["ignore", "hold", "pause"] = "ignore"


@dataclass(frozen=True)
class Signal:
    """One reading of a site's signal. ``at`` is the served sample's timestamp (Prometheus's
    clock, Unix seconds), ``window`` the seconds its rate spans (the rules' ladder)."""

    served: float | None
    threshold: float | None
    demand: float | None = None
    floor: float | None = None
    at: float = 0.0
    window: float = 1.0
    asked: float | None = None  # visitors arriving (rules: site:promreflex_copy_guard_asked:rps)
    crowd: float | None = None  # 1: a crowd arrives or its backlog waits (site:promreflex_copy_guard_crowd:bool)
    # Seconds between the rules' evaluations (samples of the served rate in the last minute):
    # Prometheus' own evaluation_interval where the rules run in a shop's Prometheus (30 s, 1 m)
    # beside 200 ms scrape jobs; 0 when unknown.
    evaluation: float = 0.0

    def fresh(self, now: float) -> bool:
        """Recent enough to decide on (older: the rules lag, a replica behind the other). Two
        evaluation intervals count as fresh: at a 30 s evaluation a sample was "stale" 10 s after
        it was taken, and the throttle fell back to the alert's bit for the other 20 s, cutting
        the copies of a shop that had gone quiet to 10 % (a stranger's review, R6)."""
        return now - self.at <= max(4 * self.window, STALE_AFTER, 2 * self.evaluation)

    def usable(self) -> bool:
        return (self.served is not None and self.threshold is not None and math.isfinite(self.served)
                and math.isfinite(self.threshold) and self.threshold > 0)


def judge(sig: Signal, s: Settings) -> Verdict:
    """Where the site stands against its line (call only for a usable signal; module doc)."""
    assert sig.served is not None and sig.threshold is not None
    # With a crowd setting the crowd flag holds the copy through a backlog, the reason the
    # in-flight term is in the demand: the rest is judged on what visitors ask (module doc).
    asked = s.demand_signal == "asked" or s.crowd != "ignore"
    demand = sig.asked if asked and sig.asked is not None else sig.demand
    if s.crowd != "ignore" and sig.crowd is not None and sig.crowd > 0:
        if s.crowd == "pause":
            return "crowd"
        if sig.served < s.severe * sig.threshold:
            return "severe"
        return "below" if sig.served < sig.threshold else "hold"  # never probe up while a crowd waits
    if demand is not None and sig.floor is not None:
        if demand < QUIET_RATIO * sig.floor:
            return "quiet"  # a quiet site is slow because nobody shops: the copy may run
        if demand < sig.floor:
            return "light"  # asked for less than a healthy shop serves: it keeps up, nothing to save
    if sig.served < s.severe * sig.threshold:
        return "severe"
    if sig.served < sig.threshold:
        return "below"
    if sig.served >= sig.threshold * (1 + s.band):
        return "above"
    if demand is not None and demand <= sig.served * (1 + s.band):
        return "above"  # within the band but serving what it is asked: probe
    return "hold"


@dataclass
class Throttle:
    """The share of one site's copies, and why it is what it is."""

    settings: Settings
    share: float = 1.0
    changed_at: float = 0.0  # controller clock (Unix s) of the last change
    paused_since: float | None = None
    below_min_since: float | None = None
    last_sample: float = 0.0  # timestamp of the last served sample a decision used
    last_decision: float = 0.0
    no_emergency: bool = False  # a pause reached max_pause: no emergency pause again this episode
    decreases: int = 0
    increases: int = 0
    emergencies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EMERGENCY_REASONS, 0))
    forced: int = 0
    last_verdict: str = ""
    paused_by: str = ""  # the reason of the current (or last) emergency pause
    before_crowd: float | None = None  # the share a crowd's pause interrupted
    verdicts: dict[str, int] = field(default_factory=dict)  # decisions, by what the signal said

    @property
    def paused(self) -> bool:
        return self.share <= 0.0

    @property
    def free(self) -> bool:
        return self.share >= 1.0

    # ------------------------------------------------------------------ decisions
    def open(self, now: float, sig: Signal | None) -> None:
        """The episode begins (an alert says the site has been below its line for a while): the
        first decision is taken at once, without waiting for a fresh sample. The alert outweighs
        a sample that says the site keeps up, but not one that says it is quiet (nobody to
        protect: demand under half the floor): at a 30 s scrape an alert fires about 1.5 min
        after its cause, and an episode opened after the visitors had gone halved the copies for
        a whole rate window (a stranger's review)."""
        if sig is not None and sig.usable():
            verdict = judge(sig, self.settings)
            self.last_sample = sig.at
        else:
            verdict = "below"
        fresh = sig is not None and sig.fresh(now)
        self._apply(now, "below" if verdict in KEEPS_UP and not (verdict == "quiet" and fresh) else verdict)

    def step(self, now: float, sig: Signal | None, alert_below: bool) -> bool:
        """One look at the signal; returns True when the share changed."""
        s = self.settings
        if self.paused and now - self._paused_at(now) >= s.max_pause:
            self.forced += 1
            self.no_emergency = True
            self._set(now, s.min_share)
            self.last_verdict = "max_pause"
            self.verdicts["max_pause"] = self.verdicts.get("max_pause", 0) + 1
            return True
        if sig is not None and sig.usable() and sig.fresh(now):
            settle = s.period if s.period is not None else sig.window
            if sig.at <= self.last_sample or sig.at < self.changed_at + settle:
                return False  # no new sample, or one that still holds data from before the change
            self.last_sample = sig.at
            verdict = judge(sig, s)
        else:
            settle = max(s.period or 0.0, FALLBACK_PERIOD)
            if now < max(self.changed_at, self.last_decision) + settle:
                return False
            verdict = "below" if alert_below else "above"
        self.last_decision = now
        before = self.share
        self._apply(now, verdict)
        return self.share != before

    def counts(self) -> dict[str, int]:
        """Every count, flat (``decreases``, ``increases``, ``emergency:<reason>``, ``verdict:<v>``)."""
        return {"decreases": self.decreases, "increases": self.increases,
                **{f"emergency:{k}": v for k, v in self.emergencies.items()},
                **{f"verdict:{k}": v for k, v in self.verdicts.items()}}

    def _apply(self, now: float, verdict: str) -> None:
        s = self.settings
        self.last_verdict = verdict
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        if self.paused:
            if verdict in KEEPS_UP and now - self._paused_at(now) >= s.min_pause:
                # After a crowd's pause: the share from before the crowd (module doc).
                after_crowd = self.before_crowd if self.paused_by == "crowd" else None
                self._set(now, 1.0 if verdict == "quiet" else after_crowd or s.min_share)
            return
        if verdict == "severe" and s.severe > 0 and not self.no_emergency:
            self._pause(now, "severe")
            return
        if verdict == "crowd":
            if not self.no_emergency:
                self._pause(now, "crowd")
                return
            verdict = "below"  # a pause reached max_pause in this episode: throttle instead
        if verdict in ("below", "severe"):
            if self.share > s.min_share + 1e-9:
                self.decreases += 1
                self._set(now, max(s.min_share, self.share * s.decrease))
                if self.share <= s.min_share + 1e-9:
                    self.below_min_since = now
            elif self.below_min_since is None:
                self.below_min_since = now
            elif (s.emergency_after > 0 and not self.no_emergency
                  and now - self.below_min_since >= s.emergency_after):
                self._pause(now, "floor")
            return
        self.below_min_since = None
        if verdict in ("above", "light", "quiet") and not self.free:
            self.increases += 1
            # A quiet site (demand under its floor) has nobody to protect: the copy runs free.
            self._set(now, 1.0 if verdict == "quiet" else min(1.0, self.share + s.increase))

    def _paused_at(self, now: float) -> float:
        return now if self.paused_since is None else self.paused_since

    def _pause(self, now: float, reason: str) -> None:
        self.before_crowd = max(self.share, self.settings.min_share) if reason == "crowd" else None
        self.emergencies[reason] += 1
        self.paused_by = reason
        self.paused_since = now
        self.below_min_since = None
        self._set(now, 0.0)

    def _set(self, now: float, share: float) -> None:
        self.share = round(share, 6)
        self.changed_at = now
        if share > 0:
            self.paused_since = None

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        return {"share": self.share, "changed_at": self.changed_at, "paused_since": self.paused_since,
                "no_emergency": self.no_emergency}

    @classmethod
    def from_json(cls, settings: Settings, data: Any) -> Throttle:
        t = cls(settings)
        if isinstance(data, dict):
            share = data.get("share")
            if isinstance(share, (int, float)) and 0 <= share <= 1:
                t.share = float(share)
            t.changed_at = float(data.get("changed_at") or 0.0)
            ps = data.get("paused_since")
            t.paused_since = float(ps) if isinstance(ps, (int, float)) and t.paused else (0.0 if t.paused else None)
            t.no_emergency = bool(data.get("no_emergency", False))
        return t
