"""The two schedulers of Session-level Queue Scheduling (seed 002), and the session table.

Everything here is driven by an injected clock and plain calls, so the unit tests run them with a
fake clock; the proxy (``proxy.py``) wires them to asyncio futures.

**Page scheduler** (:class:`PageClass`, one per page class): at most ``limit`` requests of the
class run at once, the others wait in the class' FIFO queue. The limit is found by
progress-based regulation (:class:`Regulator`), judged over windows (at least ``window`` long,
with at least ``min_completions`` served requests) rather than per request: while the limit
binds (requests ran at the limit for half the window or more), the regulator probes one step
up (a fifth) or down (an eighth) and keeps the step only if it paid: up when the page's speed at
the new concurrency (c / mean response time at c) and its served rate both beat the old level by
``improvement`` beyond their noise (a promising raise whose samples are too few to show what
the step can bring is measured on, up to ``PROBE_WINDOWS`` windows), down when neither lost more than ``improvement`` in its window;
otherwise it steps back and holds ``hold_windows`` windows, the next probe going the other way
(hysteresis). Windows in which the limit did not bind say nothing: demand, not the limit, set
their throughput, so they move nothing (counting their completions is what once made limits
sink into the demand).

**Session scheduler** (:class:`SessionScheduler`): a request without a session waits in the
session queue; sessions are admitted one per ``interval``. The interval changes once per
control ``period``, never per admission: the admission rate follows the rate at which sessions
leave (completed or abandoned), times ``1 + gain x e`` with e the bounded error of the period's
mean total page-queue length (time-weighted, :class:`QueueIntegral`) against a setpoint under
``queue_threshold`` (and a slow-down while an admitted session's request waited longer than
``page_wait_target``); per period the interval moves at most by ``increase`` / ``decrease``.
At the equilibrium sessions come as fast as they complete, with the page queues under the
threshold. Control happens once per session: an admitted session's requests only meet the page
scheduler. Holds from the control endpoint add a session cap (admit only while fewer sessions
are active) or waiting-room mode (no new session at all).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controllers.admission.config import PageScheduler as PageConfig
from controllers.admission.config import SessionScheduler as SessionConfig

log = logging.getLogger("promreflex.admission")

Clock = Callable[[], float]


# --------------------------------------------------------------------------- page scheduler
@dataclass
class Decision:
    """One regulation step, for logs and tests."""

    limit: int
    throughput: float
    move: int  # +1, -1, 0 (a step, whatever its size)
    why: str


@dataclass
class Level:
    """Response times of requests that ran at about ``level`` concurrent requests of the class:
    ``n`` samples, their sum and sum of squares (decayed: recent windows weigh more)."""

    n: float = 0.0
    total: float = 0.0
    square: float = 0.0

    def add(self, n: float, total: float, square: float, decay: float = 1.0) -> None:
        self.n = self.n * decay + n
        self.total = self.total * decay + total
        self.square = self.square * decay + square

    def capacity(self, level: int) -> tuple[float, float]:
        """(throughput at this concurrency = level / mean response time, its relative standard
        error); (0, inf) without samples."""
        if self.n <= 0 or self.total <= 0:
            return 0.0, math.inf
        mean = self.total / self.n
        var = max(0.0, self.square / self.n - mean * mean)
        return level / mean, math.sqrt(var / self.n) / mean if self.n > 1 else math.inf


#: The limit counts as binding in a window when requests ran at the limit this share of the time.
BINDING_SHARE = 0.5
#: Memory of the long-run estimate per level: weight of the past at each new window.
LEVEL_DECAY = 0.5
#: A raise whose gain is positive, while its samples are too few to show even the most the step
#: can bring, is measured for up to this many windows (its samples pooled) before it is given up;
#: the reference is the last few binding windows at the old limit. One window of ``min_completions`` cannot show a step's gain: at
#: limit L a step of 1 brings at most 1/L, and the served rate's noise over 20 completions is
#: sqrt(2/20) = 32 %, so a page slower than ``window / min_completions`` per request, or any page
#: past a limit of about 7, never climbed (a linear app of 16 workers held at 7).
PROBE_WINDOWS = 4
BASE_WINDOWS = 4
#: A raise adds this share of the limit (at least 1), so that what it can bring (up to a fifth, a
#: quarter from 4) stays above the noise as the limit grows; a lowering takes an eighth, so the
#: limit stays in a narrow band once at the knee.
UP_STEP = 0.2


class Regulator:
    """Progress-based regulation of one page's concurrency limit (see the module docstring).

    Two measures of progress, both needed for a raise: the page's speed at a concurrency,
    X(c) = c / R(c) (Little's law), with R(c) the mean response time of the requests that ran at
    about c concurrent requests of the class (time-weighted over each request), which demand
    does not distort; and its served rate in the window, which sees what the speed alone
    misses: a page that is not the bottleneck serves no more when it may run more at once.
    A step up is a fifth of the limit, down an eighth (at least 1 each). An accepted probe is followed at once by
    another in the same direction, so the limit climbs while raises pay, comes down while
    lowering costs nothing, and settles at the knee of the throughput curve, visiting the levels
    next to it once per ``2 x (hold_windows + 1)`` windows or so.
    """

    def __init__(self, cfg: PageConfig, now: float):
        self.cfg = cfg
        self.limit = cfg.initial_limit
        self.next_dir = +1
        self.hold = 0
        self.probe: tuple[int, int] | None = None  # (direction, limit before the probe)
        self.throughput = 0.0  # served per second in the last window
        self.levels: dict[int, Level] = {}
        self.windows = 0
        self._window: dict[int, Level] = {}
        self._start = self._t = now
        self._in_flight = 0
        self._area = 0.0  # time integral of the in-flight count
        self._at_limit = 0.0  # time spent with in_flight >= limit in this window
        self._completions = 0
        self._fresh_after = now  # response times of requests started before a limit change are not a probe's
        # served (count, seconds) of the last binding windows at the current limit, and the probe's
        self._base: deque[tuple[int, float]] = deque(maxlen=BASE_WINDOWS)
        self._probe_served: list[tuple[int, float]] = []
        self._probed = Level()  # response times at the probed limit, pooled over the probe's windows

    # -- accounting (the page class calls these; O(1) each) ----------------------------
    def account(self, now: float, in_flight: int) -> None:
        """Bring the integrals up to ``now``; ``in_flight`` is the count from now on."""
        dt = now - self._t
        if dt > 0:
            self._area += self._in_flight * dt
            if self._in_flight >= self.limit:
                self._at_limit += dt
            self._t = now
        self._in_flight = in_flight

    def mark(self) -> tuple[float, float]:
        """Where a request starts: (time, in-flight integral), after ``account``."""
        return self._t, self._area

    def completed(self, mark: tuple[float, float] | None = None) -> None:
        """A served request ends (after ``account``); ``mark`` from :meth:`mark` at its start."""
        self._completions += 1
        if mark is None:
            return
        dt = self._t - mark[0]
        if dt <= 0 or mark[0] < self._fresh_after:
            return
        level = max(1, round((self._area - mark[1]) / dt))
        got = self._window.get(level)  # (not setdefault: that builds a Level per request)
        if got is None:
            got = self._window[level] = Level()
        got.add(1, dt, dt * dt)

    def _step_size(self, limit: int, direction: int) -> int:
        return max(1, math.ceil(limit * UP_STEP)) if direction > 0 else max(1, limit // 8)

    def due(self, now: float) -> bool:
        elapsed = now - self._start
        if elapsed < self.cfg.window:
            return False
        if elapsed >= 10 * self.cfg.window:
            return True
        if self.probe is not None:
            got = self._window.get(self.limit)
            return got is not None and got.n >= self.cfg.min_completions
        return self._completions >= self.cfg.min_completions

    def step(self, now: float) -> Decision | None:
        """Close the window if it is due; returns the decision taken (None: not due)."""
        self.account(now, self._in_flight)
        if not self.due(now):
            return None
        elapsed = now - self._start
        x = self._completions / elapsed
        n_done = self._completions
        self.throughput = x
        binding = self._at_limit >= BINDING_SHARE * elapsed
        window, self._window = self._window, {}
        self._start, self._completions, self._at_limit = now, 0, 0.0
        self.windows += 1
        for level, got in window.items():
            self.levels.setdefault(level, Level()).add(got.n, got.total, got.square, LEVEL_DECAY)
        if self.hold > 0:
            self.hold -= 1
        if self.probe is not None:
            return self._judge(window, x, n_done, elapsed, binding)
        if not binding:
            return Decision(self.limit, x, 0, "limit not reached: no information")
        self._base.append((n_done, elapsed))
        if self.hold > 0:
            return Decision(self.limit, x, 0, f"holding ({self.hold} more)")
        return self._start_probe(x)

    def _start_probe(self, x: float) -> Decision:
        direction = self.next_dir
        step = self._step_size(self.limit, direction)
        new = min(self.cfg.max_limit, max(self.cfg.min_limit, self.limit + direction * step))
        if new == self.limit:  # at a bound: probe the other way
            direction = -direction
            step = self._step_size(self.limit, direction)
            new = min(self.cfg.max_limit, max(self.cfg.min_limit, self.limit + direction * step))
            if new == self.limit:
                return Decision(self.limit, x, 0, "min_limit = max_limit: nothing to regulate")
        self.probe = (direction, self.limit)
        self.limit = new
        self._fresh_after = self._t
        self._probe_served, self._probed = [], Level()
        return Decision(new, x, direction, "probe " + ("up" if direction > 0 else "down"))

    def _back(self, base: int) -> None:
        """Give the probe up: the old limit, its reference kept (its windows were measured at it)."""
        self.probe = None
        self.limit = base
        self._fresh_after = self._t
        self.hold = self.cfg.hold_windows

    def _judge(self, window: dict[int, Level], x: float, n_done: int, elapsed: float, binding: bool) -> Decision:
        assert self.probe is not None
        direction, base = self.probe
        got = window.get(self.limit)
        if got is not None:
            self._probed.add(got.n, got.total, got.square)
        self._probe_served.append((n_done, elapsed))
        probed, ref = self._probed, self.levels.get(base)
        if (probed.n < max(2, self.cfg.min_completions // 2) or ref is None or not self._base or n_done == 0):
            self._back(base)  # the probe did not run (demand fell): no judgement
            return Decision(base, x, -direction, "probe not exercised: back")
        x_new, se_new = probed.capacity(self.limit)
        x_ref, se_ref = ref.capacity(base)
        gain = x_new / x_ref - 1 if x_ref > 0 else math.inf
        noise = math.sqrt(se_new ** 2 + se_ref ** 2)
        noise = 1.0 if math.isinf(noise) else noise
        # The served rate too: in a chain of pages, a page that is not the bottleneck serves
        # no more when it may run more at once (its own speed grows, at the others' expense).
        n_probe, t_probe = (sum(v) for v in zip(*self._probe_served))
        n_base, t_base = (sum(v) for v in zip(*self._base))
        x_probe, x_base = n_probe / t_probe, n_base / t_base
        served = x_probe / x_base - 1 if x_base > 0 else math.inf
        served_noise = math.sqrt(1 / max(1, n_probe) + 1 / max(1, n_base))
        imp = self.cfg.improvement
        how = f"{gain:+.0%} speed, {served:+.0%} served"
        kept = ""
        if direction > 0 and gain > imp + noise and served > imp + served_noise:
            kept = f"raise to {self.limit} paid off ({how})"
        elif direction < 0 and gain >= -imp and served >= -imp:
            kept = f"lowering to {self.limit} cost nothing ({how})"
        elif (direction > 0 and binding and len(self._probe_served) < PROBE_WINDOWS and gain > 0 and served > 0
              and self.limit / base - 1 < imp + 2 * max(noise, served_noise)):
            # Measured on only while the samples could not yet show, with a sigma to spare, the
            # most the step can bring (the page's throughput growing with its limit): once they
            # could, a gain short of the bar is the answer, and the limit goes back at once (a
            # probe past the knee costs the whole app).
            return Decision(self.limit, x, 0, f"probe at {self.limit}: {how} so far, within the noise: measured on")
        if kept:
            self.probe = None
            self.next_dir = direction
            self._base.clear()
            if not binding:
                return Decision(self.limit, x, 0, kept)
            self._base.extend(self._probe_served)  # the probe's windows are the next probe's reference: go on
            d = self._start_probe(x)
            return Decision(d.limit, x, d.move, f"{kept}; {d.why}")
        tried = self.limit
        self._back(base)
        self.next_dir = -direction
        return Decision(base, x, -direction, f"probe at {tried} did not pay ({how}): back to {base}, hold")

    def knee(self) -> int | None:
        """The smallest level whose estimated throughput is within ``improvement`` of the best
        level seen (for the state endpoint and tests); None without estimates."""
        est = {lvl: got.capacity(lvl)[0] for lvl, got in self.levels.items() if got.n >= self.cfg.min_completions}
        if not est:
            return None
        best = max(est.values())
        return min(lvl for lvl, v in est.items() if v >= best * (1 - self.cfg.improvement))


class QueueIntegral:
    """The time integral of the total page-queue length (for time-weighted means)."""

    def __init__(self, now: float):
        self.total = 0
        self.area = 0.0
        self._t = now

    def change(self, delta: int, now: float) -> None:
        self.area += self.total * (now - self._t)
        self._t = now
        self.total += delta

    def value(self, now: float) -> float:
        return self.area + self.total * (now - self._t)


class QueueFull(Exception):
    pass


Mark = tuple[float, float]


class PageClass:
    """A page class' slots and queue. ``acquire`` either takes a slot (None), or returns a future
    that is resolved when a slot is handed over; the caller removes an abandoned future with
    ``withdraw``. Once it holds a slot, the caller takes a :meth:`begin` mark and gives it back to
    :meth:`release`. With regulation off (``enabled: false``) the limit never binds."""

    def __init__(self, name: str, cfg: PageConfig, integral: QueueIntegral, clock: Clock,
                 timeout: float | None = None, logout: bool = False):
        self.name = name
        self.cfg = cfg
        self.clock = clock
        self.integral = integral
        self.timeout = timeout if timeout is not None else cfg.timeout
        self.logout = logout
        self.in_flight = 0
        self.queue: deque[asyncio.Future[None]] = deque()
        self.enqueued: deque[float] = deque()  # when each queued request arrived (same order)
        self.regulator = Regulator(cfg, clock())
        self.decisions: deque[Decision] = deque(maxlen=50)

    @property
    def limit(self) -> int:
        return self.regulator.limit if self.cfg.enabled else 1 << 30

    def oldest_wait(self, now: float) -> float:
        return now - self.enqueued[0] if self.enqueued else 0.0

    def _take(self, now: float) -> None:
        self.in_flight += 1
        self.regulator.account(now, self.in_flight)

    def acquire(self) -> asyncio.Future[None] | None:
        """None: a slot is taken. A future: wait for it. QueueFull: the queue is at capacity."""
        if self.in_flight < self.limit and not self.queue:
            self._take(self.clock())
            return None
        if len(self.queue) >= self.cfg.queue_capacity:
            raise QueueFull(self.name)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        now = self.clock()
        self.queue.append(fut)
        self.enqueued.append(now)
        self.integral.change(+1, now)
        return fut

    def begin(self) -> Mark:
        """The start of a request that holds a slot (for the regulator's response times)."""
        self.regulator.account(self.clock(), self.in_flight)
        return self.regulator.mark()

    def withdraw(self, fut: asyncio.Future[None]) -> None:
        """A waiter gave up (client gone, queue timeout). If its slot was already handed over,
        pass it on."""
        for i, f in enumerate(self.queue):
            if f is fut:
                del self.queue[i]
                del self.enqueued[i]
                self.integral.change(-1, self.clock())
                return
        if fut.done() and not fut.cancelled():
            self.release(served=False)

    def release(self, served: bool, mark: Mark | None = None) -> None:
        now = self.clock()  # one reading for the whole release (it runs once per request)
        self.in_flight -= 1
        self.regulator.account(now, self.in_flight)
        if served:
            self.regulator.completed(mark)
        self.regulate(now)
        if self.queue:
            self._grant(now)

    def regulate(self, now: float | None = None) -> Decision | None:
        if not self.cfg.enabled:
            return None
        if now is None:
            now = self.clock()
        decision = self.regulator.step(now)
        if decision is not None:
            self.decisions.append(decision)
            self._grant(now)
        return decision

    def _grant(self, now: float) -> None:
        while self.queue and self.in_flight < self.limit:
            fut = self.queue.popleft()
            self.enqueued.popleft()
            self.integral.change(-1, now)
            if fut.done():  # cancelled but not yet withdrawn
                continue
            self._take(now)
            fut.set_result(None)


# --------------------------------------------------------------------------- holds
@dataclass
class Hold:
    holder: str
    mode: str  # waiting_room | session_cap
    session_cap: int | None
    expires: float
    reason: str = ""


class Holds:
    """Tightenings set through the control endpoint, each until its lease runs out. With a
    ``path``, every change is written there (a temporary file, fsync, rename: a SIGKILL leaves
    the old or the new file, never half of one), with expiries in wall-clock time, and
    :meth:`load` takes back the unexpired ones after a restart (a restart dropped every hold:
    the door opened in the middle of an incident, a stranger's review)."""

    def __init__(self, clock: Clock, on_expire: Callable[[Hold], None] | None = None, path: Path | None = None,
                 wall: Clock = time.time):
        self.clock = clock
        self.on_expire = on_expire
        self.holds: dict[str, Hold] = {}
        self.path = path
        self.wall = wall

    def put(self, hold: Hold) -> None:
        self.holds[hold.holder] = hold
        self._save()

    def remove(self, holder: str) -> bool:
        gone = self.holds.pop(holder, None) is not None
        if gone:
            self._save()
        return gone

    def _save(self) -> None:
        if self.path is None:
            return
        shift = self.wall() - self.clock()
        data = {"holds": [{**asdict(h), "expires": h.expires + shift} for h in self.holds.values()]}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.error("cannot write the holds to %s: %s (they hold until this process ends)", self.path, e)

    def load(self) -> list[Hold]:
        """The unexpired holds of ``path`` (kept from the process before), taken back; a
        missing file is none, an unreadable one is said and ignored."""
        if self.path is None or not self.path.exists():
            return []
        try:
            raw = json.loads(self.path.read_text())
            shift = self.clock() - self.wall()
            loaded = [Hold(str(h["holder"]), str(h["mode"]), None if h.get("session_cap") is None
                           else int(h["session_cap"]), float(h["expires"]) + shift, str(h.get("reason", "")))
                      for h in raw["holds"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("cannot read the holds of %s (%s): started without them", self.path, e)
            return []
        now = self.clock()
        kept = [h for h in loaded if h.expires > now and h.mode in ("waiting_room", "session_cap")]
        for h in kept:
            self.holds[h.holder] = h
        return kept

    def prune(self) -> list[Hold]:
        now = self.clock()
        gone = [h for h in self.holds.values() if h.expires <= now]
        for h in gone:
            del self.holds[h.holder]
            if self.on_expire is not None:
                self.on_expire(h)
        return gone

    def waiting_room(self) -> bool:
        self.prune()
        return any(h.mode == "waiting_room" for h in self.holds.values())

    def session_cap(self) -> int | None:
        self.prune()
        caps = [h.session_cap for h in self.holds.values() if h.mode == "session_cap" and h.session_cap is not None]
        return min(caps) if caps else None


# --------------------------------------------------------------------------- session scheduler
@dataclass
class Waiting:
    fut: asyncio.Future[bool]  # True: admitted; False: waiting-room mode began while it waited
    since: float


#: Control periods whose admissions the waiting room's estimate averages (about 10 s at the
#: default period): longer than the interval's swings, short enough to follow a crowd.
ESTIMATE_PERIODS = 10
#: The session scheduler aims the mean total page-queue length at this share of its threshold.
SETPOINT = 0.7
#: Below this share of the threshold the page queues are nearly empty: the admission rate may
#: grow from itself, not only from the departures.
RAMP_SHARE = 0.3
#: ... and while the departures lag the admissions this much (the first session-length of a crowd).
RAMP_LAG = 0.6


@dataclass
class Period:
    """What the session scheduler saw in one control period, and what it did."""

    queue: float  # mean total page-queue length
    departures: float  # sessions ended (completed or abandoned) per second, smoothed
    admissions: float  # sessions admitted per second
    wait: float  # longest page-queue wait of an admitted session's request
    error: float
    interval: float
    why: str


class SessionScheduler:
    """The session queue and the admission interval (see the module docstring)."""

    def __init__(self, cfg: SessionConfig, capacity: int, integral: QueueIntegral, holds: Holds, clock: Clock,
                 oldest_wait: Callable[[float], float] | None = None):
        self.cfg = cfg
        self.capacity = capacity
        self.integral = integral
        self.holds = holds
        self.clock = clock
        self.oldest_wait = oldest_wait or (lambda now: 0.0)
        self.interval = cfg.initial_interval
        self.queue: deque[Waiting] = deque()
        now = clock()
        self.last_admit = now - cfg.max_interval  # the first session goes in at once
        self.departure_rate: float | None = None
        self.periods: deque[Period] = deque(maxlen=120)
        self._period_start = now
        self._area_at_start = integral.value(now)
        self._departed = 0
        self._admitted = 0
        self._max_wait = 0.0
        self._held = False  # a session waited for admission in this period (the rate bound)
        self.wake = asyncio.Event()

    def position_estimate(self, position: int) -> float:
        """Seconds until the session at ``position`` (1 = next) is admitted: over the sessions
        admitted per second in the last ESTIMATE_PERIODS control periods that held sessions back
        (the admissions it measured), else at today's interval. The interval swings by a factor
        of 8 within seconds as the scheduler regulates, and position x interval told visitors to
        come back in 59-221 s while those arriving then got in within 10 s (a stranger's review,
        Q F4)."""
        recent = [p.admissions for p in list(self.periods)[-ESTIMATE_PERIODS:]]
        rate = sum(recent) / len(recent) if len(recent) >= 3 else 0.0
        if rate > 0:
            return position / rate
        return position * max(self.interval, 0.001)

    def enqueue(self) -> Waiting:
        """Queue a new session (QueueFull when the queue is at capacity)."""
        if len(self.queue) >= self.capacity:
            raise QueueFull("session")
        w = Waiting(asyncio.get_running_loop().create_future(), self.clock())
        self.queue.append(w)
        self._held = True
        self.wake.set()
        return w

    def withdraw(self, w: Waiting) -> None:
        try:
            self.queue.remove(w)
        except ValueError:
            pass

    def session_ended(self) -> None:
        """A session completed or was abandoned (the departures the admission rate follows)."""
        self._departed += 1

    def page_waited(self, seconds: float) -> None:
        """A request of an admitted session waited this long in its page queue."""
        if seconds > self._max_wait:
            self._max_wait = seconds

    def mean_page_queue(self, now: float) -> float:
        span = now - self._period_start
        if span <= 0:
            return float(self.integral.total)
        return (self.integral.value(now) - self._area_at_start) / span

    def control(self, now: float) -> Period | None:
        """Adapt the interval once per period (None: the period is not over).

        The admission rate r = 1 / interval follows the rate D at which sessions leave
        (completed or abandoned, smoothed over two periods): r = B x (1 + gain x e). The error e
        compares Q, the period's mean total page-queue length, with the setpoint
        S = SETPOINT x threshold: 1 with empty queues, 0 at S, -1 at the threshold and beyond
        (-1/2 at most while an admitted session's request waited longer than
        ``page_wait_target``). Above the setpoint B = D: fewer sessions come than leave, so the
        active sessions and with them the page queues shrink. Below it, B is at least D and the
        initial rate; and while the queues are nearly empty (under RAMP_SHARE of the threshold),
        sessions were held back and the departures still lag the admissions (a crowd's first
        session-length), B is the admission rate itself (at most 1.25 x what came): the ramp.
        An idle shop builds up no rate that a crowd would then meet (B never exceeds what came
        by more than that). At the equilibrium sessions are admitted at the rate they complete,
        with the page queues near the setpoint, under the threshold. Per period the interval
        moves by at most ``increase`` (slower) or ``decrease`` (faster), within [min_interval,
        max_interval]: no change follows one admission, so there is nothing to oscillate with."""
        span = now - self._period_start
        if span < self.cfg.period:
            return None
        cfg = self.cfg
        q = self.mean_page_queue(now)
        d_now = self._departed / span
        self.departure_rate = d_now if self.departure_rate is None else 0.5 * (self.departure_rate + d_now)
        d = self.departure_rate
        a = self._admitted / span
        wait = max(self._max_wait, self.oldest_wait(now))
        t = cfg.queue_threshold
        sp = t * SETPOINT
        if t <= 0:
            e = 1.0 if q <= 0 else -1.0
        elif q <= sp:
            e = (sp - q) / sp  # empty queues 1, at the setpoint 0
        else:
            e = max(-1.0, (sp - q) / (t - sp))  # at the threshold -1
        why = f"page queue {q:.1f} vs setpoint {t * SETPOINT:g}"
        if wait > cfg.page_wait_target:
            e = min(e, -0.5)
            why = f"a page waited {wait:.2f}s > {cfg.page_wait_target:g}s"
        rate = 1.0 / max(self.interval, 1e-6)
        base = d
        if e >= 0:
            # Below the setpoint: never less than the initial rate. With the page queues nearly
            # empty (under RAMP_SHARE of the threshold) while admission held sessions back, grow
            # from the admission rate itself: sessions leave one session-length after they came,
            # so following departures alone would ramp up only at that pace.
            floor = 1.0 / cfg.initial_interval if cfg.initial_interval > 0 else rate
            ramp = self._held and q <= RAMP_SHARE * t and d < RAMP_LAG * a
            base = max(d, min(rate, a * 1.25) if ramp else 0.0, floor)
        target = base * (1 + cfg.gain * e)
        interval = 1.0 / target if target > 0 else math.inf
        interval = min(self.interval * cfg.increase, max(self.interval * cfg.decrease, interval))
        self.interval = min(cfg.max_interval, max(cfg.min_interval, interval))
        p = Period(q, d, a, wait, e, self.interval, why)
        self.periods.append(p)
        self._period_start = now
        self._area_at_start = self.integral.value(now)
        self._departed = self._admitted = 0
        self._max_wait = 0.0
        self._held = bool(self.queue)
        return p

    def poll(self, active: int) -> float | None:
        """Admit the sessions that are due; returns seconds until the next one may be (None: the
        queue is empty, or a session cap blocks admission until a session ends)."""
        now = self.clock()
        self.control(now)
        while self.queue and self.queue[0].fut.done():
            self.queue.popleft()
        if not self.queue:
            return None
        cap = self.holds.session_cap()
        if cap is not None and active >= cap:
            return 0.1  # a session ends at logout or idle timeout: look again soon
        due_in = self.interval - (now - self.last_admit)
        if self.cfg.enabled and due_in > 1e-6:  # (a timer a microsecond early is on time)
            return min(due_in, self.cfg.period)
        self._admit(now)
        return 0.0 if self.queue else None

    def _admit(self, now: float) -> None:
        w = self.queue.popleft()
        w.fut.set_result(True)
        self._admitted += 1
        # Keep the pace despite a late timer, but an idle spell builds up no credit.
        self.last_admit = self.last_admit + self.interval if now - self.last_admit < 2 * self.interval else now

    def flush(self) -> list[Waiting]:
        """Waiting-room mode began: everyone queued is answered at once."""
        out = list(self.queue)
        self.queue.clear()
        return out


# --------------------------------------------------------------------------- sessions
@dataclass
class SessionState:
    sid: str
    issued: float
    expires: float
    last_seen: float
    last_page: str = ""
    in_flight: int = 0


@dataclass
class Sessions:
    """The sessions this proxy admitted (server-side state: what makes a replayed cookie useless
    once its session ended). ``ended`` remembers ended session ids until their cookie expires.

    ``active`` is kept in the order of ``last_seen`` (``add`` appends, ``touch`` moves a session
    to the end), so ``idle`` reads only the sessions that timed out and those with a request in
    flight ahead of them, never every session: a scan of all of them every sweep (4 a second)
    took ~10 ms at 100,000 sessions, on the loop that serves the pages."""

    idle_timeout: float
    clock: Clock
    started: float  # wall-clock start of this process (cookies are stamped in Unix seconds)
    max_sessions: int = 100_000
    active: dict[str, SessionState] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)

    def add(self, sid: str, issued: float, expires: float, page: str) -> SessionState:
        s = SessionState(sid, issued, expires, self.clock(), page)
        self.active.pop(sid, None)  # (a re-added id goes to the end: the order is last_seen's)
        self.active[sid] = s
        return s

    def touch(self, s: SessionState) -> None:
        """A request of ``s`` ended now: its idle time starts again."""
        s.last_seen = self.clock()
        if self.active.get(s.sid) is s:
            del self.active[s.sid]
            self.active[s.sid] = s

    def end(self, sid: str) -> SessionState | None:
        s = self.active.pop(sid, None)
        if s is not None:
            self.ended[sid] = s.expires
            if len(self.ended) > 2 * self.max_sessions:  # bounded: the soonest to expire go first
                for old in sorted(self.ended, key=self.ended.__getitem__)[: self.max_sessions]:
                    del self.ended[old]
        return s

    def idle(self) -> list[SessionState]:
        """Sessions idle for longer than the idle timeout (none of their requests in flight);
        removed and returned (abandoned). Reads ``active`` from its oldest ``last_seen`` and
        stops at the first session seen within the timeout (class doc)."""
        since = self.clock() - self.idle_timeout
        out = []
        for s in self.active.values():
            if s.last_seen >= since:
                break
            if not s.in_flight:
                out.append(s)
        for s in out:
            self.end(s.sid)
        return out

    def prune_ended(self, wall_now: float) -> None:
        for sid in [sid for sid, exp in self.ended.items() if exp <= wall_now]:
            del self.ended[sid]
