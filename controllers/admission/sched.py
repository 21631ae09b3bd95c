"""The two schedulers of Session-level Queue Scheduling (seed 002), and the session table.

Everything here is driven by an injected clock and plain calls, so the unit tests run them with a
fake clock; the proxy (``proxy.py``) wires them to asyncio futures.

**Page scheduler** (:class:`PageClass`, one per page class): at most ``limit`` requests of the
class run at once, the others wait in the class' FIFO queue. The limit is found by
progress-based regulation (:class:`Regulator`): progress is the page's throughput (served
responses per second) measured over windows in which the limit was binding (someone had to
wait). After a raise, throughput must improve by ``improvement`` or contention has begun: the
limit goes back down and the regulator probes downwards, keeping a lower limit as long as
throughput does not fall (fewer requests at once for the same throughput: shorter response
times); when a lowering costs throughput it goes back up and holds ``hold_windows`` windows
before probing upwards again. Windows in which the limit did not bind say nothing about
contention: no move, and the next comparison starts afresh.

**Session scheduler** (:class:`SessionScheduler`): a request without a session waits in the
session queue; sessions are admitted one per ``interval``. At every admission the interval is
multiplied by ``increase`` when the mean total page-queue length since the previous admission
(time-weighted, :class:`QueueIntegral`) was above ``queue_threshold``, by ``decrease`` when it
was below (the paper: "at session start, compare the mean page-queue length with a threshold").
While below, the next session may come after the already-shrunk interval, so a long interval
recovers at the pace it grew. Control happens once per session: an admitted session's requests
only meet the page scheduler. Holds from the control endpoint add a session cap (admit only while
fewer sessions are active) or waiting-room mode (no new session at all).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controllers.admission.config import PageScheduler as PageConfig
from controllers.admission.config import SessionScheduler as SessionConfig

Clock = Callable[[], float]


# --------------------------------------------------------------------------- page scheduler
@dataclass
class Decision:
    """One regulation step, for logs and tests."""

    limit: int
    throughput: float
    move: int  # +1, -1, 0
    why: str


class Regulator:
    """Progress-based regulation of one page's concurrency limit (see the module docstring)."""

    def __init__(self, cfg: PageConfig, now: float):
        self.cfg = cfg
        self.limit = cfg.initial_limit
        self.direction = +1
        self.hold = 0
        self.prev: float | None = None  # throughput of the previous binding window
        self.throughput = 0.0
        self._start = now
        self._completions = 0
        self.binding = False

    def completed(self) -> None:
        self._completions += 1

    def waited(self) -> None:
        """A request found the limit reached: this window measures capacity, not demand."""
        self.binding = True

    def due(self, now: float) -> bool:
        elapsed = now - self._start
        return elapsed >= self.cfg.window and (self._completions >= self.cfg.min_completions
                                               or elapsed >= 10 * self.cfg.window)

    def step(self, now: float) -> Decision | None:
        """Close the window if it is due; returns the decision taken (None: not due)."""
        if not self.due(now):
            return None
        x = self._completions / (now - self._start)
        self.throughput = x
        binding = self.binding
        self._start, self._completions, self.binding = now, 0, False
        if not binding:
            self.prev = None
            return Decision(self.limit, x, 0, "limit not reached: no information")
        prev, self.prev = self.prev, x
        if self.hold > 0:
            self.hold -= 1
            return Decision(self.limit, x, 0, f"holding ({self.hold} more)")
        if prev is None or (prev == 0 and x == 0):
            return self._move(self.direction, x, "first binding window: probe")
        gain = (x - prev) / prev if prev > 0 else 1.0
        if self.direction > 0:
            if gain > self.cfg.improvement:
                return self._move(+1, x, f"raise paid off ({gain:+.0%})")
            self.direction = -1
            return self._move(-1, x, f"no progress from the raise ({gain:+.0%}): contention, back off")
        if gain >= -self.cfg.improvement:
            return self._move(-1, x, f"lowering cost nothing ({gain:+.0%}): lower")
        self.direction = +1
        self.hold = self.cfg.hold_windows
        return self._move(+1, x, f"lowering cost throughput ({gain:+.0%}): back up, hold")

    def _move(self, move: int, x: float, why: str) -> Decision:
        new = min(self.cfg.max_limit, max(self.cfg.min_limit, self.limit + move))
        if new == self.limit:  # at a bound: turn around and hold
            self.direction = -move
            self.hold = self.cfg.hold_windows
            return Decision(self.limit, x, 0, f"{why}; at the bound {new}")
        self.limit = new
        return Decision(new, x, move, why)


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


class PageClass:
    """A page class' slots and queue. ``acquire`` either takes a slot (True), or returns a future
    that is resolved when a slot is handed over; the caller removes an abandoned future with
    ``withdraw``. With regulation off (``enabled: false``) the limit never binds."""

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
        self.regulator = Regulator(cfg, clock())
        self.decisions: deque[Decision] = deque(maxlen=50)

    @property
    def limit(self) -> int:
        return self.regulator.limit if self.cfg.enabled else 1 << 30

    def acquire(self) -> asyncio.Future[None] | None:
        """None: a slot is taken. A future: wait for it. QueueFull: the queue is at capacity."""
        if self.in_flight < self.limit and not self.queue:
            self.in_flight += 1
            return None
        self.regulator.waited()
        if len(self.queue) >= self.cfg.queue_capacity:
            raise QueueFull(self.name)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append(fut)
        self.integral.change(+1, self.clock())
        return fut

    def withdraw(self, fut: asyncio.Future[None]) -> None:
        """A waiter gave up (client gone, queue timeout). If its slot was already handed over,
        pass it on."""
        try:
            self.queue.remove(fut)
        except ValueError:
            if fut.done() and not fut.cancelled():
                self.release(served=False)
            return
        self.integral.change(-1, self.clock())

    def release(self, served: bool) -> None:
        if served:
            self.regulator.completed()
        self.in_flight -= 1
        self.regulate()
        self._grant()

    def regulate(self) -> Decision | None:
        if not self.cfg.enabled:
            return None
        decision = self.regulator.step(self.clock())
        if decision is not None:
            self.decisions.append(decision)
            self._grant()
        return decision

    def _grant(self) -> None:
        now = self.clock()
        while self.queue and self.in_flight < self.limit:
            fut = self.queue.popleft()
            self.integral.change(-1, now)
            if fut.done():  # cancelled but not yet withdrawn
                continue
            self.in_flight += 1
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
    """Tightenings set through the control endpoint, each until its lease runs out."""

    def __init__(self, clock: Clock, on_expire: Callable[[Hold], None] | None = None):
        self.clock = clock
        self.on_expire = on_expire
        self.holds: dict[str, Hold] = {}

    def put(self, hold: Hold) -> None:
        self.holds[hold.holder] = hold

    def remove(self, holder: str) -> bool:
        return self.holds.pop(holder, None) is not None

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


class SessionScheduler:
    """The session queue and the admission interval (see the module docstring)."""

    def __init__(self, cfg: SessionConfig, capacity: int, integral: QueueIntegral, holds: Holds, clock: Clock):
        self.cfg = cfg
        self.capacity = capacity
        self.integral = integral
        self.holds = holds
        self.clock = clock
        self.interval = cfg.initial_interval
        self.queue: deque[Waiting] = deque()
        now = clock()
        self.last_admit = now - cfg.max_interval  # the first session goes in at once
        self._mean_since = now  # the page-queue mean runs from the last admission (or the start)
        self._area_at_admit = integral.value(now)
        self.wake = asyncio.Event()

    def position_estimate(self, position: int) -> float:
        """Seconds until the session at ``position`` (1 = next) is admitted, at today's interval."""
        return position * max(self.interval, 0.001)

    def enqueue(self) -> Waiting:
        """Queue a new session (QueueFull when the queue is at capacity)."""
        if len(self.queue) >= self.capacity:
            raise QueueFull("session")
        w = Waiting(asyncio.get_running_loop().create_future(), self.clock())
        self.queue.append(w)
        self.wake.set()
        return w

    def withdraw(self, w: Waiting) -> None:
        try:
            self.queue.remove(w)
        except ValueError:
            pass

    def mean_page_queue(self, now: float) -> float:
        span = now - self._mean_since
        if span <= 0:
            return float(self.integral.total)
        return (self.integral.value(now) - self._area_at_admit) / span

    def poll(self, active: int) -> float | None:
        """Admit the sessions that are due; returns seconds until the next one may be (None: the
        queue is empty, or a session cap blocks admission until a session ends)."""
        while self.queue and self.queue[0].fut.done():
            self.queue.popleft()
        if not self.queue:
            return None
        cap = self.holds.session_cap()
        if cap is not None and active >= cap:
            return 0.1  # a session ends at logout or idle timeout: look again soon
        now = self.clock()
        below = self.mean_page_queue(now) <= self.cfg.queue_threshold
        due_in = (self.interval * (self.cfg.decrease if below else 1.0)) - (now - self.last_admit)
        if self.cfg.enabled and due_in > 0:
            return due_in
        self._admit(now, below)
        return 0.0 if self.queue else None

    def _admit(self, now: float, below: bool) -> None:
        w = self.queue.popleft()
        w.fut.set_result(True)
        if below:
            self.interval = max(self.cfg.min_interval, self.interval * self.cfg.decrease)
        else:
            self.interval = min(self.cfg.max_interval, self.interval * self.cfg.increase)
        self.last_admit = self._mean_since = now
        self._area_at_admit = self.integral.value(now)

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
    once its session ended). ``ended`` remembers ended session ids until their cookie expires."""

    idle_timeout: float
    clock: Clock
    started: float  # wall-clock start of this process (cookies are stamped in Unix seconds)
    max_sessions: int = 100_000
    active: dict[str, SessionState] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)

    def add(self, sid: str, issued: float, expires: float, page: str) -> SessionState:
        s = SessionState(sid, issued, expires, self.clock(), page)
        self.active[sid] = s
        return s

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
        removed and returned (abandoned)."""
        now = self.clock()
        out = [s for s in self.active.values() if not s.in_flight and now - s.last_seen > self.idle_timeout]
        for s in out:
            self.end(s.sid)
        return out

    def prune_ended(self, wall_now: float) -> None:
        for sid in [sid for sid, exp in self.ended.items() if exp <= wall_now]:
            del self.ended[sid]
