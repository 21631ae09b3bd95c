"""``promreflex calibrate``: measure the served RPS of the loaded, healthy shop and publish the
copy guard's threshold where the rules read it.

How the threshold is derived (the paper, seed 000): drive the site with more requests than it
can serve (there: 100 requests/s, 5 runs of 5 minutes, no copy running), record the served
requests per second, and take the LOWEST value over all runs (20.2 req/s there). A saturated
healthy site serves its capacity, give or take noise; anything below the lowest value it ever
showed while healthy is then taken as a sign that something else (a copy) takes its resources.

- ``--method min`` (default, the paper's): the lowest per-second served RPS over every run,
  after dropping each run's first ``--warmup`` seconds (Locust ramping up) and its last,
  partial second. Default because no second the healthy site served during calibration counts
  as "suffering"; the alert's ``for:`` filters the rarer, briefer dips a longer healthy run
  shows below it (calibrate long: the minimum of short runs sits high). The
  per-second bins are the rule's window too (``site:promreflex_http_requests_served:rate1s``).
- ``--method quantile --quantile Q``: the Q-quantile (e.g. 0.05) of all per-second values. Safer
  against one outlier second (a stall of the calibration machine) dragging the minimum, and so
  the guard's sensitivity, down; the price is that a healthy saturated site dips below it in
  about Q of its seconds, which the alert's ``for:`` must absorb. Use it when the minimum of a
  run sits far below that run's p5 (the summary table shows both).

RPS per second comes from the load generator (completions counted by second, every run) or,
with ``--source prometheus``, from the recorded series the rules use, queried at 1 s steps over
each run (the stack must be running). The load itself is Locust in a child process (importing
locust patches the standard library with gevent), with the shop profile of
``controllers/copy_guard/locustfile.py``: ``--rate`` requests per second spread over ``--users``
paced users, ``--checkout-share`` of them fsync'd POST /checkout, the rest product pages.

The threshold is published with :func:`controllers.copy_guard.threshold.write_threshold` as
``promreflex_copy_guard_rps_threshold{site}`` in ``<textfile dir>/promreflex_copy_guard_threshold.prom``
(node_exporter's textfile collector; the stack's by default), with the demand floor below which
the site is merely quiet (default half the threshold).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from promreflex.config import parse_duration

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DEFAULT_QUERY = 'site:promreflex_http_requests_served:rate1s{{site="{site}"}}'


class CalibrationError(Exception):
    """The load could not be run or produced nothing to calibrate from."""


# ---------------------------------------------------------------------------- statistics
def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (type 7, like numpy's default) of ``values``; q in [0, 1]."""
    if not values:
        raise ValueError("no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    n: int
    min: float
    p5: float
    median: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            raise ValueError("no values")
        return cls(len(values), min(values), quantile(values, 0.05), quantile(values, 0.5), max(values),
                   sum(values) / len(values))


def per_second_series(per_second: Mapping[int, int], warmup_s: float = 0.0) -> list[float]:
    """Served responses in each whole second from the first completion + ``warmup_s`` up to,
    not including, the last second seen (partial: the run stopped inside it). Seconds with no
    completion inside that span count as 0 (a stalled site serves nothing)."""
    if not per_second:
        return []
    first, last = min(per_second), max(per_second)
    start = first + math.ceil(warmup_s)
    return [float(per_second.get(s, 0)) for s in range(start, last)]


def derive_threshold(runs: Sequence[Sequence[float]], method: str = "min", q: float = 0.05) -> float:
    """The threshold from every run's per-second served RPS: the lowest value (``min``, the
    paper) or the ``q``-quantile of all values together (``quantile``)."""
    values = [v for run in runs for v in run]
    if not values:
        raise CalibrationError("no per-second values to derive a threshold from")
    if method == "min":
        return min(values)
    if method == "quantile":
        return quantile(values, q)
    raise ValueError(f"unknown method {method!r} (min or quantile)")


def saturation_warning(offered_rps: float, dist: Distribution) -> str | None:
    """A warning when the site kept up with the offered load (then the threshold measures the
    load, not the site's capacity)."""
    if offered_rps > 0 and dist.median >= 0.95 * offered_rps:
        return (f"the site served {dist.median:.1f} req/s of the {offered_rps:.0f} offered (median): it kept up, "
                "so this measures the load, not the site's capacity; raise --rate until it saturates")
    return None


# ---------------------------------------------------------------------------- load
@dataclass
class LoadRun:
    """One finished Locust run: completions ``[ok, failed]`` per time bin (``bin_s`` seconds,
    keyed by ``int(unix time / bin_s)``)."""

    ok: int
    failed: int
    bins: dict[int, list[int]]
    bin_s: float
    started: float
    ended: float

    def per_second(self, column: int = 0) -> dict[int, int]:
        """Completions per whole unix second (column 0: served, 1: failed)."""
        out: dict[int, int] = {}
        for b, v in self.bins.items():
            s = math.floor(b * self.bin_s + 1e-9)
            out[s] = out.get(s, 0) + v[column]
        return out

    def served(self) -> dict[int, int]:
        return self.per_second(0)


def locust_argv(target: str, rate: float, users: int, duration_s: float, timeline: Path, *,
                checkout_share: float = 0.1, locustfile: Path = LOCUSTFILE) -> list[str]:
    parts = urllib.parse.urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {target!r}")
    if rate <= 0 or users < 1 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0 and users >= 1")
    if not 0.0 <= checkout_share <= 1.0:
        raise ValueError("checkout share must be within [0, 1]")
    return [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless",
        "--host", f"{parts.scheme}://{parts.netloc}", "-u", str(users), "-r", str(users),
        "-t", f"{max(1, math.ceil(duration_s))}s", "--shop-rate", str(rate),
        "--checkout-share", str(checkout_share), "--timeline-out", str(timeline),
        "--skip-log", "--only-summary", "--exit-code-on-error", "0", "--stop-timeout", "0", "--loglevel", "ERROR",
    ]


class ShopLoad:
    """A bounded Locust run of the shop profile in a child process; ``start`` then ``wait``."""

    def __init__(self, target: str, rate: float, users: int, duration_s: float, *, checkout_share: float = 0.1,
                 locustfile: Path = LOCUSTFILE, margin_s: float = 30.0):
        self.duration_s = duration_s
        self.margin_s = margin_s
        self._dir = tempfile.mkdtemp(prefix="promreflex-calibrate-")
        self.timeline = Path(self._dir) / "timeline.json"
        self.argv = locust_argv(target, rate, users, duration_s, self.timeline,
                                checkout_share=checkout_share, locustfile=locustfile)
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> ShopLoad:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.started = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # noqa: S603
                                     stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self) -> LoadRun:
        assert self.proc is not None, "start() first"
        remaining = self.started + self.duration_s + self.margin_s - time.time()
        try:
            _, err = self.proc.communicate(timeout=max(1.0, remaining))
        except subprocess.TimeoutExpired:
            self.kill()
            raise CalibrationError(f"locust did not finish within {self.duration_s + self.margin_s:.0f}s; killed") from None
        try:
            data = json.loads(self.timeline.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CalibrationError(f"locust exited {self.proc.returncode} without a timeline ({e}); "
                                   f"stderr: {err.strip()[-2000:]}") from e
        finally:
            self.timeline.unlink(missing_ok=True)
            try:
                os.rmdir(self._dir)
            except OSError:
                pass
        bins = {int(k): [int(v[0]), int(v[1])] for k, v in data["bins"].items()}
        return LoadRun(int(data["totals"]["ok"]), int(data["totals"]["failed"]), bins, float(data["bin_s"]),
                       self.started, time.time())


def run_shop_load(target: str, rate: float, users: int, duration_s: float, **kw: Any) -> LoadRun:
    """Run the shop profile against ``target`` for ``duration_s`` seconds and return its timeline."""
    return ShopLoad(target, rate, users, duration_s, **kw).start().wait()


# ---------------------------------------------------------------------------- Prometheus
def prometheus_series(base_url: str, query: str, start: float, end: float, step_s: float = 1.0,
                      timeout: float = 10.0) -> list[float]:
    """Values of ``query`` (one series) at ``step_s`` steps over [start, end], via query_range."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s}"})
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/api/v1/query_range?{params}", timeout=timeout) as resp:  # noqa: S310
        body = json.load(resp)
    if body.get("status") != "success":
        raise CalibrationError(f"Prometheus refused {query!r}: {body.get('error')}")
    result = body["data"]["result"]
    if len(result) != 1:
        raise CalibrationError(f"{query!r} returned {len(result)} series over the run, need exactly 1")
    return [float(v) for _, v in result[0]["values"] if math.isfinite(float(v))]


# ---------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    site: str
    method: str
    quantile: float
    source: str
    rate: float
    users: int
    duration_s: float
    warmup_s: float
    runs: list[list[float]] = field(default_factory=list)  # per-second served RPS of each run
    totals: list[dict[str, int]] = field(default_factory=list)
    threshold: float | None = None

    def run_distributions(self) -> list[Distribution]:
        return [Distribution.of(r) for r in self.runs]

    def overall(self) -> Distribution:
        return Distribution.of([v for r in self.runs for v in r])

    def table(self) -> str:
        head = f"{'run':<8}{'seconds':>8}{'min':>8}{'p5':>8}{'median':>8}{'max':>8}{'served':>8}{'failed':>8}"
        lines = [head, "-" * len(head)]
        for i, (d, t) in enumerate(zip(self.run_distributions(), self.totals), 1):
            lines.append(f"{i:<8}{d.n:>8}{d.min:>8.1f}{d.p5:>8.1f}{d.median:>8.1f}{d.max:>8.1f}{t['ok']:>8}{t['failed']:>8}")
        o = self.overall()
        lines.append(f"{'all':<8}{o.n:>8}{o.min:>8.1f}{o.p5:>8.1f}{o.median:>8.1f}{o.max:>8.1f}"
                     f"{sum(t['ok'] for t in self.totals):>8}{sum(t['failed'] for t in self.totals):>8}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_run": [asdict(d) for d in self.run_distributions()],
                "overall": asdict(self.overall()) if self.runs else None}


def calibrate(target: str, *, site: str = "shop", rate: float = 100.0, users: int = 100, duration_s: float = 60.0,
              runs: int = 5, warmup_s: float = 5.0, method: str = "min", q: float = 0.05, checkout_share: float = 0.1,
              source: str = "locust", prometheus_url: str | None = None, query: str | None = None,
              progress: Callable[[str], None] = print) -> Calibration:
    """Run the load ``runs`` times and derive the threshold (not published: see :func:`publish`)."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    if duration_s <= warmup_s + 1:
        raise ValueError(f"duration {duration_s}s leaves nothing after the {warmup_s}s warm-up")
    if source == "prometheus" and not prometheus_url:
        raise ValueError("--source prometheus needs --prometheus.url")
    cal = Calibration(site, method, q, source, rate, users, duration_s, warmup_s)
    for i in range(1, runs + 1):
        progress(f"calibrate run {i}/{runs}: {rate:g} req/s offered by {users} users for {duration_s:g}s ...")
        load = run_shop_load(target, rate, users, duration_s, checkout_share=checkout_share)
        if source == "prometheus":
            if prometheus_url is None:
                raise CalibrationError("--source prometheus needs a Prometheus URL")
            served = load.served()
            first = min(served) + math.ceil(warmup_s) if served else load.started + warmup_s
            last = (max(served) - 1) if served else load.ended
            values = prometheus_series(prometheus_url, query or DEFAULT_QUERY.format(site=site), first, last)
        else:
            values = per_second_series(load.served(), warmup_s)
        if not values or load.ok == 0:
            raise CalibrationError(f"run {i} served nothing after its {warmup_s:g}s warm-up "
                                   f"({load.ok} ok, {load.failed} failed): is {target} up?")
        cal.runs.append(values)
        cal.totals.append({"ok": load.ok, "failed": load.failed})
        d = Distribution.of(values)
        progress(f"  run {i}/{runs}: served {load.ok} ({load.failed} failed); per second min {d.min:.1f} "
                 f"p5 {d.p5:.1f} median {d.median:.1f} max {d.max:.1f}")
    cal.threshold = derive_threshold(cal.runs, method, q)
    return cal


def publish(cal: Calibration, textfile_dir: Path, demand_floor_rps: float | None = None) -> Path:
    from controllers.copy_guard.threshold import write_threshold

    if cal.threshold is None:
        raise CalibrationError("nothing calibrated")
    return write_threshold(textfile_dir, cal.site, cal.threshold, demand_floor_rps=demand_floor_rps)


# ---------------------------------------------------------------------------- CLI
def _seconds(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _stack_defaults(args: argparse.Namespace) -> tuple[str, Path, str]:
    """Target URL, textfile dir and Prometheus URL of the local stack the flags describe."""
    from promreflex.config import DEFAULT_CONFIG, load_config
    from promreflex.stack import Stack

    overrides = {"stack.state_dir": str(args.state_dir)} if args.state_dir else {}
    cfg = load_config(args.config_file or DEFAULT_CONFIG, overrides)
    stack = Stack(cfg)
    return stack.url("nginx") + "/", stack.textfile_dir, stack.url("prometheus")


def cmd_calibrate(args: argparse.Namespace) -> int:
    if not 0.0 <= args.quantile <= 1.0 or args.runs < 1 or args.users < 1 or args.rate <= 0:
        print("calibrate: need --quantile within [0, 1], --runs >= 1, --users >= 1, --rate > 0", file=sys.stderr)
        return 2
    target, textfile_dir, prom = _stack_defaults(args)
    target = args.target or target
    textfile_dir = args.textfile_dir or textfile_dir
    prometheus_url = args.prometheus_url or (prom if args.source == "prometheus" else None)
    print(f"calibrating site {args.site!r} at {target}: {args.runs} run(s) of {args.rate:g} req/s for "
          f"{args.duration:g}s (warm-up {args.warmup:g}s dropped), threshold = "
          + ("lowest per-second served RPS" if args.method == "min" else f"{args.quantile:g}-quantile of per-second served RPS")
          + f", source {args.source}")
    try:
        cal = calibrate(target, site=args.site, rate=args.rate, users=args.users, duration_s=args.duration,
                        runs=args.runs, warmup_s=args.warmup, method=args.method, q=args.quantile,
                        checkout_share=args.checkout_share, source=args.source, prometheus_url=prometheus_url,
                        query=args.query)
    except (CalibrationError, ValueError, OSError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    print()
    print(cal.table())
    warning = saturation_warning(args.rate, cal.overall())
    if warning:
        print(f"\nwarning: {warning}")
    print(f"\nthreshold ({args.method}{'' if args.method == 'min' else f' q={args.quantile:g}'}): {cal.threshold:.2f} req/s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(cal.to_json(), indent=2))
        print(f"wrote {args.out}")
    if args.dry_run:
        print("dry run: threshold not published")
        return 0
    try:
        path = publish(cal, textfile_dir, args.demand_floor)
    except (ValueError, OSError) as e:
        print(f"calibrate: cannot publish the threshold: {e}", file=sys.stderr)
        return 1
    print(f"published promreflex_copy_guard_rps_threshold{{site=\"{args.site}\"}} {cal.threshold:.2f} in {path}")
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate", help="measure the loaded shop's served RPS and publish the copy guard's threshold",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config.file", dest="config_file", type=Path, default=None, help="stack configuration (for the defaults below)")
    p.add_argument("--state.dir", dest="state_dir", type=Path, default=None, help="the local stack's state directory")
    p.add_argument("--target", default=None, help="site base URL (default: the local stack's nginx)")
    p.add_argument("--site", default="shop", help="site label the threshold is published for (default shop)")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second offered (paper: 100; default 100)")
    p.add_argument("--users", type=int, default=100, help="paced Locust users sharing the rate (default 100)")
    p.add_argument("--duration", type=_seconds, default=60.0, help="length of each run (paper: 5m; default 60s)")
    p.add_argument("--runs", type=int, default=5, help="number of runs (paper: 5; default 5)")
    p.add_argument("--warmup", type=_seconds, default=5.0, help="seconds dropped at the start of each run (default 5s)")
    p.add_argument("--checkout-share", type=float, default=0.1, help="share of fsync'd POST /checkout (default 0.1)")
    p.add_argument("--method", choices=["min", "quantile"], default="min",
                   help="min: lowest per-second RPS over all runs (paper; default). quantile: the --quantile of all seconds")
    p.add_argument("--quantile", type=float, default=0.05, help="for --method quantile (default 0.05)")
    p.add_argument("--source", choices=["locust", "prometheus"], default="locust",
                   help="per-second RPS from Locust's completions (default) or the rules' recorded series")
    p.add_argument("--prometheus.url", dest="prometheus_url", default=None, help="for --source prometheus (default: the stack's)")
    p.add_argument("--query", default=None, help="PromQL for --source prometheus (default: site:promreflex_http_requests_served:rate1s{site=SITE})")
    p.add_argument("--textfile.dir", dest="textfile_dir", type=Path, default=None,
                   help="node_exporter textfile directory (default: the local stack's)")
    p.add_argument("--demand-floor", type=float, default=None, help="demand floor in req/s (default: half the threshold)")
    p.add_argument("--out", type=Path, default=None, help="also write every run's values and statistics as JSON here")
    p.add_argument("--dry-run", action="store_true", help="measure and print, do not publish")
    p.set_defaults(func=cmd_calibrate)
    return p
